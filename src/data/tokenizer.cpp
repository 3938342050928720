// The pre-tokenizer, the vocabulary checks, encode/decode, and BPE training.
// Training keeps one entry per distinct word (with its count) and updates pair
// counts incrementally: merging (A, B) -> X touches only the words that hold
// (A, B), found through a pair -> words index; a lazy max-heap picks the next pair.
// File formats live in tokenizer_json.cpp.
#include "data/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <queue>

#include "core/error.h"

namespace dtrain {
namespace {

enum class ByteClass : uint8_t { letter, digit, space, other };

ByteClass class_of(char ch) {
  const auto c = static_cast<uint8_t>(ch);
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return ByteClass::letter;
  if (c >= '0' && c <= '9') return ByteClass::digit;
  if (c == ' ' || (c >= '\t' && c <= '\r')) return ByteClass::space;
  return ByteClass::other;
}

// Length of the contraction ('s 't 'm 'd 're 've 'll) starting at s[i], or 0.
size_t contraction_at(std::string_view s, size_t i) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  const char a = s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 < s.size()) {
    const std::string_view two = s.substr(i + 1, 2);
    if (two == "re" || two == "ve" || two == "ll") return 3;
  }
  return 0;
}

size_t run_end(std::string_view s, size_t i, ByteClass k) {
  while (i < s.size() && class_of(s[i]) == k) ++i;
  return i;
}

// End of the piece that starts at s[i] (see split_words in the header).
size_t piece_end(std::string_view s, size_t i) {
  if (const size_t c = contraction_at(s, i)) return i + c;
  const size_t n = s.size();
  if (s[i] == ' ' && i + 1 < n && class_of(s[i + 1]) != ByteClass::space)
    return run_end(s, i + 1, class_of(s[i + 1]));
  const ByteClass k = class_of(s[i]);
  size_t j = run_end(s, i, k);
  if (k == ByteClass::space && j < n && j - i > 1 && s[j - 1] == ' ') --j;
  return j;
}

uint64_t pair_key(TokenId a, TokenId b) {
  return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
}

[[noreturn]] void bad_vocab(const std::string& source, const std::string& what) {
  throw Error(fmt::format("{}: {}", source, what),
              "the tokenizer file is damaged or was not written by dtrain: rebuild it with "
              "`dtrain data tokenize`; GPT-2's vocab.json and merges.txt must come from the "
              "same release");
}

}  // namespace

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = piece_end(text, i);
    for (; i < end; i += std::min(kMaxWordBytes, end - i))
      out.push_back(text.substr(i, std::min(kMaxWordBytes, end - i)));
  }
  return out;
}

// Kinds of id, for the checks: each id must be exactly one.
enum class IdKind : uint8_t { none, byte, merge, special };

Tokenizer::Tokenizer(TokenizerSpec spec, const std::string& source) : spec_(std::move(spec)) {
  const int64_t n = spec_.vocab_size;
  if (n < kMinVocab || n > std::numeric_limits<int32_t>::max())
    bad_vocab(source, fmt::format("vocab_size {} is outside [{}, {}]", n, kMinVocab,
                                  std::numeric_limits<int32_t>::max()));
  std::vector<IdKind> kind(static_cast<size_t>(n), IdKind::none);
  pieces_.assign(static_cast<size_t>(n), {});
  auto claim = [&](TokenId id, IdKind k, const std::string& what) {
    if (id < 0 || id >= n)
      bad_vocab(source, fmt::format("{}: id {} is outside [0, {})", what, id, n));
    if (kind[static_cast<size_t>(id)] != IdKind::none)
      bad_vocab(source, fmt::format("{}: id {} is already taken by another token", what, id));
    kind[static_cast<size_t>(id)] = k;
  };
  for (int b = 0; b < 256; ++b) {
    claim(spec_.byte_ids[static_cast<size_t>(b)], IdKind::byte, fmt::format("byte 0x{:02x}", b));
    pieces_[static_cast<size_t>(spec_.byte_ids[static_cast<size_t>(b)])] =
        std::string(1, static_cast<char>(b));
  }
  for (size_t r = 0; r < spec_.merges.size(); ++r) {
    const Merge& m = spec_.merges[r];
    const std::string what = fmt::format("merge {} ({} {} -> {})", r, m.left, m.right, m.result);
    for (TokenId part : {m.left, m.right}) {
      const bool made = part >= 0 && part < n &&
                        (kind[static_cast<size_t>(part)] == IdKind::byte ||
                         kind[static_cast<size_t>(part)] == IdKind::merge);
      if (!made)
        bad_vocab(source, fmt::format("{}: token {} is not a byte or the result of an earlier "
                                      "merge",
                                      what, part));
    }
    if (!rank_of_.emplace(pair_key(m.left, m.right), static_cast<int32_t>(r)).second)
      bad_vocab(source, fmt::format("{}: the pair is merged twice", what));
    claim(m.result, IdKind::merge, what);
    pieces_[static_cast<size_t>(m.result)] =
        pieces_[static_cast<size_t>(m.left)] + pieces_[static_cast<size_t>(m.right)];
  }
  for (int s = 0; s < kNumSpecials; ++s) {
    const TokenId id = spec_.special_ids[static_cast<size_t>(s)];
    claim(id, IdKind::special,
          fmt::format("special token {}", kSpecialNames[static_cast<size_t>(s)]));
    pieces_[static_cast<size_t>(id)] = std::string(kSpecialNames[static_cast<size_t>(s)]);
  }
  for (int64_t id = 0; id < n; ++id) {
    if (kind[static_cast<size_t>(id)] == IdKind::none)
      bad_vocab(source, fmt::format("id {} is neither a byte, a merge result nor a special token "
                                    "(vocab_size {})",
                                    id, n));
  }
  first_special_ = static_cast<TokenId>(n - kNumSpecials);
  for (TokenId id = first_special_; id < n; ++id) {
    if (kind[static_cast<size_t>(id)] != IdKind::special)
      bad_vocab(source, fmt::format("the special tokens must take the top {} ids [{}, {}), but id "
                                    "{} is an ordinary token",
                                    kNumSpecials, first_special_, n, id));
  }
}

// GPT-2's rule: repeatedly merge every occurrence of the adjacent pair of lowest rank.
void Tokenizer::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  const size_t first = out.size();
  for (char c : word) out.push_back(spec_.byte_ids[static_cast<uint8_t>(c)]);
  for (;;) {
    const size_t len = out.size() - first;
    int32_t best = std::numeric_limits<int32_t>::max();
    for (size_t i = first; i + 1 < first + len; ++i) {
      const auto it = rank_of_.find(pair_key(out[i], out[i + 1]));
      if (it != rank_of_.end() && it->second < best) best = it->second;
    }
    if (best == std::numeric_limits<int32_t>::max()) return;
    const Merge& m = spec_.merges[static_cast<size_t>(best)];
    size_t w = first;
    for (size_t i = first; i < first + len; ++i) {
      if (i + 1 < first + len && out[i] == m.left && out[i + 1] == m.right) {
        out[w++] = m.result;
        ++i;
      } else {
        out[w++] = out[i];
      }
    }
    out.resize(w);
  }
}

void Tokenizer::encode_append(std::string_view bytes, std::vector<TokenId>& out) const {
  for (std::string_view word : split_words(bytes)) encode_word(word, out);
}

std::vector<TokenId> Tokenizer::encode(std::string_view bytes) const {
  std::vector<TokenId> out;
  out.reserve(bytes.size() / 3 + 1);
  encode_append(bytes, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= spec_.vocab_size)
      throw Error(fmt::format("decode: token {} (position {}) is outside the vocabulary [0, {})",
                              ids[i], i, spec_.vocab_size),
                  "the ids come from another tokenizer or a damaged shard");
    out += pieces_[static_cast<size_t>(ids[i])];
  }
  return out;
}

// ---- training ---------------------------------------------------------------------

namespace {

struct Word {
  std::vector<TokenId> ids;
  int64_t count = 0;
  TokenId visited = -1;  // the merge that last rewrote this word
};

struct HeapEntry {
  int64_t count;
  uint64_t pair;
  // Max-heap on count; among equal counts the smallest (left, right) comes first.
  bool operator<(const HeapEntry& o) const {
    return count != o.count ? count < o.count : pair > o.pair;
  }
};

bool holds(const std::vector<TokenId>& ids, const Merge& m) {
  for (size_t i = 0; i + 1 < ids.size(); ++i)
    if (ids[i] == m.left && ids[i + 1] == m.right) return true;
  return false;
}

class BpeTrainer {
 public:
  explicit BpeTrainer(const std::vector<std::string_view>& documents);
  // The next merge, or false when no pair occurs at least twice.
  bool step(TokenId result, Merge& merge);

 private:
  void add_pairs(int32_t w, int64_t sign, TokenId fresh, std::vector<uint64_t>* touched);
  bool pop_best(uint64_t& pair);

  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;  // pair -> words (may be stale)
  std::priority_queue<HeapEntry> heap_;
};

BpeTrainer::BpeTrainer(const std::vector<std::string_view>& documents) {
  std::unordered_map<std::string_view, int64_t> freq;
  for (std::string_view doc : documents)
    for (std::string_view w : split_words(doc)) ++freq[w];
  words_.reserve(freq.size());
  for (const auto& [text, count] : freq) {
    Word w;
    w.count = count;
    for (char c : text) w.ids.push_back(static_cast<uint8_t>(c));
    words_.push_back(std::move(w));
  }
  for (int32_t w = 0; w < static_cast<int32_t>(words_.size()); ++w) add_pairs(w, 1, -1, nullptr);
  for (const auto& [pair, count] : counts_) heap_.push({count, pair});
}

// Adds (sign = 1) or removes (-1) the adjacent pairs of word w. With `fresh`, pairs
// holding that token are indexed and reported in `touched`.
void BpeTrainer::add_pairs(int32_t w, int64_t sign, TokenId fresh, std::vector<uint64_t>* touched) {
  const Word& word = words_[static_cast<size_t>(w)];
  for (size_t i = 0; i + 1 < word.ids.size(); ++i) {
    const uint64_t key = pair_key(word.ids[i], word.ids[i + 1]);
    counts_[key] += sign * word.count;
    if (sign > 0 && (fresh < 0 || word.ids[i] == fresh || word.ids[i + 1] == fresh)) {
      where_[key].push_back(w);
      if (touched != nullptr) touched->push_back(key);
    }
  }
}

// Heap entries go stale when counts change: a popped entry whose count is above
// the pair's current one is pushed again at the current count; one below it is
// dropped (the increase pushed a fresh entry).
bool BpeTrainer::pop_best(uint64_t& pair) {
  while (!heap_.empty()) {
    const HeapEntry top = heap_.top();
    heap_.pop();
    const auto it = counts_.find(top.pair);
    const int64_t now = it == counts_.end() ? 0 : it->second;
    if (now == top.count) {
      pair = top.pair;
      return now >= 2;
    }
    if (now > 0 && now < top.count) heap_.push({now, top.pair});
  }
  return false;
}

bool BpeTrainer::step(TokenId result, Merge& merge) {
  uint64_t pair = 0;
  if (!pop_best(pair)) return false;
  merge = {static_cast<TokenId>(pair >> 32), static_cast<TokenId>(pair & 0xffffffffu), result};
  const std::vector<int32_t> holders = std::move(where_[pair]);
  where_.erase(pair);
  std::vector<uint64_t> touched;
  for (int32_t w : holders) {
    Word& word = words_[static_cast<size_t>(w)];
    if (word.visited == result || !holds(word.ids, merge)) continue;
    word.visited = result;
    add_pairs(w, -1, -1, nullptr);
    size_t out = 0;
    for (size_t i = 0; i < word.ids.size(); ++i) {
      const bool hit =
          i + 1 < word.ids.size() && word.ids[i] == merge.left && word.ids[i + 1] == merge.right;
      word.ids[out++] = hit ? result : word.ids[i];
      if (hit) ++i;
    }
    word.ids.resize(out);
    add_pairs(w, 1, result, &touched);
  }
  counts_.erase(pair);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (uint64_t key : touched) heap_.push({counts_[key], key});
  return true;
}

}  // namespace

Tokenizer Tokenizer::train(const std::vector<std::string_view>& documents, int64_t vocab_size) {
  if (vocab_size < kMinVocab || vocab_size > (int64_t{1} << 24))
    throw Error(fmt::format("vocab size {} is outside [{}, {}]", vocab_size, kMinVocab, 1 << 24),
                fmt::format("a byte-level vocabulary holds 256 byte tokens and {} specials; "
                            "typical sizes are 4096 to 65536",
                            kNumSpecials));
  TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.byte_ids[static_cast<size_t>(b)] = b;
  BpeTrainer trainer(documents);
  const int64_t max_merges = vocab_size - kMinVocab;
  Merge m;
  while (static_cast<int64_t>(spec.merges.size()) < max_merges &&
         trainer.step(static_cast<TokenId>(256 + spec.merges.size()), m))
    spec.merges.push_back(m);
  spec.vocab_size = kMinVocab + static_cast<int64_t>(spec.merges.size());
  for (int s = 0; s < kNumSpecials; ++s)
    spec.special_ids[static_cast<size_t>(s)] =
        trained_special(spec.vocab_size, static_cast<Special>(s));
  return Tokenizer(std::move(spec), "trained tokenizer");
}

}  // namespace dtrain
