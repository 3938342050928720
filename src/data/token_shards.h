// Token shards: a flat file of token ids that the language-model batch sources
// read whole. Layout (little-endian, 32-byte header, then the payload):
//   0   "DTTOKENS"  magic, 8 bytes
//   8   u32 format version (1)
//   12  u32 bytes per token: 2 (u16, when vocab_size <= 65536) or 4 (u32)
//   16  u64 token count n
//   24  u32 vocab size (every token is below it)
//   28  u32 CRC-32C of the payload
//   32  n tokens
// The file is exactly 32 + n * width bytes. No tokenizing and no batching here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace dtrain {

inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeader = 32;

struct TokenShard {
  std::string path;
  int64_t vocab_size = 0;
  std::vector<TokenId> tokens;
};

// Atomic (temporary file, fsync, rename). Every token must be in [0, vocab_size).
void write_token_shard(const std::string& path, const std::vector<TokenId>& tokens,
                       int64_t vocab_size);

// Checks magic, version, width, length against the count, checksum and every
// token against the vocab size; each failure is an Error naming the file and byte.
TokenShard read_token_shard(const std::string& path);

}  // namespace dtrain
