// Writer and validating reader of token shards (layout in token_shards.h). The
// checksum covers the payload only; the header fields are each checked on their own.
#include "data/token_shards.h"

#include <fmt/format.h>

#include <cstring>

#include "core/checksum.h"
#include "core/error.h"
#include "data/atomic_file.h"
#include "data/file_bytes.h"

namespace dtrain {
namespace {

constexpr char kMagic[8] = {'D', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr const char* kRetokenize =
    "the shard is damaged or not a dtrain token shard; write it again with `dtrain data tokenize`";

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

int width_for(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

}  // namespace

void write_token_shard(const std::string& path, const std::vector<TokenId>& tokens,
                       int64_t vocab_size) {
  DTRAIN_CHECK(vocab_size > 0 && vocab_size <= std::numeric_limits<int32_t>::max(), "vocab {}",
               vocab_size);
  const int width = width_for(vocab_size);
  std::string payload;
  payload.reserve(tokens.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < tokens.size(); ++i) {
    DTRAIN_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size, "token {} at {} (vocab {})", tokens[i],
                 i, vocab_size);
    put_le(payload, static_cast<uint64_t>(tokens[i]), width);
  }
  std::string header(kMagic, sizeof(kMagic));
  put_le(header, kTokenShardVersion, 4);
  put_le(header, static_cast<uint64_t>(width), 4);
  put_le(header, tokens.size(), 8);
  put_le(header, static_cast<uint64_t>(vocab_size), 4);
  put_le(header, crc32c(payload.data(), payload.size()), 4);
  write_file_atomic(path, {header, payload});
}

TokenShard read_token_shard(const std::string& path) {
  const FileBytes f = read_file_bytes(
      path, "run `dtrain data tokenize --out DIR` first; it writes DIR/train.bin and DIR/val.bin");
  const uint8_t* p = f.bytes.data();
  const size_t size = f.bytes.size();
  auto fail = [&](uint64_t at, const std::string& what) -> void {
    throw Error(fmt::format("{}: {}", f.where(at), what), kRetokenize);
  };
  if (size < kTokenShardHeader)
    fail(size,
         fmt::format("file ends inside the {}-byte header ({} bytes)", kTokenShardHeader, size));
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) fail(0, "wrong magic, expected \"DTTOKENS\"");
  const auto version = static_cast<uint32_t>(get_le(p + 8, 4));
  if (version != kTokenShardVersion)
    fail(8, fmt::format("format version {} is not supported (this dtrain reads version {})",
                        version, kTokenShardVersion));
  const auto width = static_cast<int>(get_le(p + 12, 4));
  if (width != 2 && width != 4)
    fail(12, fmt::format("bytes per token {} is neither 2 (u16) nor 4 (u32)", width));
  const uint64_t count = get_le(p + 16, 8);
  const auto vocab = static_cast<int64_t>(get_le(p + 24, 4));
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max() || width != width_for(vocab))
    fail(24, fmt::format("vocab size {} does not fit {}-byte tokens", vocab, width));
  const uint64_t payload = size - kTokenShardHeader;
  if (count > payload / static_cast<uint64_t>(width) ||
      count * static_cast<uint64_t>(width) != payload)
    fail(16,
         fmt::format("the header says {} tokens ({} bytes) but {} payload bytes follow{}", count,
                     count * static_cast<uint64_t>(width), payload,
                     count * static_cast<uint64_t>(width) > payload ? " (truncated file)" : ""));
  const auto crc = static_cast<uint32_t>(get_le(p + 28, 4));
  const uint32_t actual = crc32c(p + kTokenShardHeader, payload);
  if (crc != actual)
    fail(28, fmt::format("payload checksum 0x{:08x} does not match the header's 0x{:08x}", actual,
                         crc));
  TokenShard shard;
  shard.path = path;
  shard.vocab_size = vocab;
  shard.tokens.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t at = kTokenShardHeader + i * static_cast<uint64_t>(width);
    const uint64_t t = get_le(p + at, width);
    if (t >= static_cast<uint64_t>(vocab))
      fail(at, fmt::format("token {} (number {}) is not below the vocab size {}", t, i, vocab));
    shard.tokens[i] = static_cast<TokenId>(t);
  }
  return shard;
}

}  // namespace dtrain
