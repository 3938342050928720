// CRC-32C (Castagnoli), the checksum of checkpoint blobs. Debian 12 ships no
// CRC-32C library (zlib's crc32 uses another polynomial), so it lives here:
// the SSE4.2 crc32 instruction when the build targets it, a table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dtrain {

// Continues `crc` (0 for a fresh checksum) over `bytes` bytes of `data`.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

// dtrain's 64-bit FNV-1a of a string, for names and keys (parameter init streams, the job's
// config hash, auto tables' bucket signatures). Its offset basis, 1469598103934665603, is
// the standard one with its last digit lost; it stays, since every initialisation stream
// and config hash derive from it (data.holdout's hash uses the standard basis).
inline uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace dtrain
