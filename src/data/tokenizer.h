// Byte-level BPE tokenizer: training on raw bytes, encode/decode, and the two file
// formats it reads (dtrain's tokenizer.json; GPT-2's vocab.json + merges.txt).
// Every input byte has a token, so decode(encode(x)) == x for any bytes at all.
// Special tokens are never produced by encode() from text: callers insert them by id.
// No token shards and no batching here (token_shards.h, text_loader.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dtrain {

using TokenId = int32_t;

// The special tokens, in the order they take the top ids of every vocabulary:
// a trained vocabulary of N tokens is bytes 0..255 (id == byte value), merge r
// at id 256 + r, then <|endoftext|> at N-6, [PAD] N-5, [UNK] N-4, [CLS] N-3,
// [SEP] N-2, [MASK] N-1. <|endoftext|> separates documents (GPT); [MASK] is the
// masked-LM replacement; [UNK] is never needed (byte-level) but kept for BERT.
enum class Special : uint8_t { endoftext, pad, unk, cls, sep, mask };
inline constexpr std::array<std::string_view, 6> kSpecialNames = {
    "<|endoftext|>", "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
inline constexpr int kNumSpecials = 6;

// The id of special `s` in a trained vocabulary of `vocab` ids (the layout above; GPT-2's
// files keep it too): the specials in enum order on the top ids. Synthetic data, which
// has no tokenizer, uses the same layout.
inline TokenId trained_special(int64_t vocab, Special s) {
  return static_cast<TokenId>(vocab - kNumSpecials + static_cast<int64_t>(s));
}

// The smallest trainable vocabulary: the 256 bytes and the specials, no merges.
inline constexpr int64_t kMinVocab = 256 + kNumSpecials;

// The pre-tokenizer ("words-v1"), GPT-2's regex written by hand on bytes. Byte
// classes: letter = A-Z a-z and every byte >= 0x80 (so UTF-8 characters stay
// inside words), digit = 0-9, space = ' ' \t \n \v \f \r, other = the rest. Pieces:
//   - an apostrophe contraction: 's 't 'm 'd 're 've 'll (lower case);
//   - an optional single ' ' then a run of letters, or of digits, or of others;
//   - a run of spaces; when a ' ' ends it and a non-space follows, that ' '
//     goes to the next piece instead (GPT-2's \s+(?!\S)).
// A piece longer than kMaxWordBytes is cut into kMaxWordBytes-byte chunks, which
// bounds the cost of merging one word (natural words are far shorter).
inline constexpr size_t kMaxWordBytes = 64;
std::vector<std::string_view> split_words(std::string_view text);

struct Merge {
  TokenId left = 0;
  TokenId right = 0;
  TokenId result = 0;  // the token that the pair becomes
};

// How a vocabulary is laid out; the Tokenizer constructor checks every rule.
struct TokenizerSpec {
  int64_t vocab_size = 0;
  std::array<TokenId, 256> byte_ids{};  // the token of each single byte
  std::vector<Merge> merges;            // rank order: merges[0] applies first
  std::array<TokenId, kNumSpecials> special_ids{};
};

class Tokenizer {
 public:
  // Checks that every id in [0, vocab_size) is exactly one of: a byte, a merge
  // result, a special; that merges join defined non-special tokens and no pair
  // repeats; that the specials take the top ids. `source` names the file(s) in errors.
  explicit Tokenizer(TokenizerSpec spec, const std::string& source = "tokenizer");

  // Greedy BPE training on `documents` (words never cross a document boundary):
  // count the words of split_words(), then repeatedly merge the most frequent
  // adjacent pair, ties to the smallest (left, right) ids. Stops at vocab_size
  // tokens or when no pair occurs twice, so the result may be smaller.
  static Tokenizer train(const std::vector<std::string_view>& documents, int64_t vocab_size);

  std::vector<TokenId> encode(std::string_view bytes) const;
  // Appends to `out` (the form the shard writer uses).
  void encode_append(std::string_view bytes, std::vector<TokenId>& out) const;
  // Specials decode to their names; an id outside the vocabulary is an Error.
  std::string decode(const std::vector<TokenId>& ids) const;

  int64_t vocab_size() const { return spec_.vocab_size; }
  TokenId special(Special s) const { return spec_.special_ids[static_cast<size_t>(s)]; }
  // Ids below this are ordinary (bytes and merges); the specials sit at and above it.
  TokenId first_special() const { return first_special_; }
  const TokenizerSpec& spec() const { return spec_; }
  const std::string& piece(TokenId id) const { return pieces_[static_cast<size_t>(id)]; }

  // dtrain's JSON format (see tokenizer_json.cpp for the fields). save() is atomic.
  void save(const std::string& path) const;
  static Tokenizer load(const std::string& path);
  // GPT-2's files: vocab.json maps token strings (bytes through GPT-2's
  // byte-to-unicode table) to ids; merges.txt holds "#version..." then one "a b"
  // pair per line in rank order. Specials that vocab.json lacks get the ids after
  // its largest (GPT-2: <|endoftext|> 50256 from the file, [PAD] 50257 ... [MASK] 50261).
  static Tokenizer load_gpt2(const std::string& vocab_json, const std::string& merges_txt);

 private:
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;

  TokenizerSpec spec_;
  std::vector<std::string> pieces_;                // bytes of each id
  std::unordered_map<uint64_t, int32_t> rank_of_;  // (left << 32 | right) -> merge rank
  TokenId first_special_ = 0;
};

// GPT-2's bytes_to_unicode(): byte b -> one printable code point, as UTF-8.
std::string gpt2_byte_to_unicode(uint8_t b);

}  // namespace dtrain
