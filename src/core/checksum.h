// CRC-32C (Castagnoli), the checksum of checkpoint blobs. Debian 12 ships no
// CRC-32C library (zlib's crc32 uses another polynomial), so it lives here:
// the SSE4.2 crc32 instruction when the build targets it, a table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain {

// Continues `crc` (0 for a fresh checksum) over `bytes` bytes of `data`.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace dtrain
