// The byte-level BPE tokenizer: the pre-tokenizer's pieces, merges on hand-checked
// examples, lossless round trips on arbitrary bytes, dtrain's JSON format (round
// trip and every bad file), and GPT-2's vocab.json + merges.txt on a tiny hand-made pair.
#include <doctest/doctest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "data_files.h"

using namespace dtrain;
using namespace dtrain::test;
using json = nlohmann::json;

namespace {

void write_text(const std::string& path, const std::string& s) {
  write_plain(path, Bytes(s.begin(), s.end()));
}

// A few kilobytes of English-like text with digits, punctuation and UTF-8.
std::string sample_text() {
  std::string s;
  const char* words[] = {"the", "cat", "sat", "on", "mat", "don't", "naïve", "café", "42", "1999"};
  const Philox rng(7, 0);
  for (int i = 0; i < 3000; ++i) {
    s += words[rng.u32(static_cast<uint64_t>(i)) % 10];
    s += i % 13 == 0 ? ".\n" : i % 7 == 0 ? ", " : " ";
  }
  return s;
}

Tokenizer sample_tokenizer(int64_t vocab = 400) {
  const std::string text = sample_text();
  return Tokenizer::train({text}, vocab);
}

}  // namespace

TEST_CASE("split_words: GPT-2-like pieces") {
  const auto w = split_words("Hello world's  123 foo!!\n\nbar");
  const std::vector<std::string_view> want = {"Hello", " world", "'s",   " ",  " 123",
                                              " foo",  "!!",     "\n\n", "bar"};
  CHECK(w == want);
  // Bytes >= 0x80 count as letters, so a UTF-8 word stays whole.
  CHECK(split_words(" café au") == std::vector<std::string_view>{" café", " au"});
  // A piece longer than kMaxWordBytes is cut into chunks.
  const std::string long_word(150, 'x');
  const auto chunks = split_words(long_word);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0].size() == kMaxWordBytes);
  CHECK(chunks[2].size() == 150 - 2 * kMaxWordBytes);
  CHECK(split_words("").empty());
}

// "ab ab cd cd" splits into "ab", " ab", " cd", " cd". Pair counts: (a,b) 2,
// (' ',a) 1, (' ',c) 2, (c,d) 2. Three pairs tie at 2; the smallest ids win:
// (32,99) " c" -> 256. Then " cd" is [256, d]: (a,b) 2 and (256,100) 2 tie, and
// (97,98) < (256,100): "ab" -> 257. Then (256,100) 2 -> " cd" 258. Every pair
// left occurs once, so training stops at 3 merges: vocab 256 + 3 + 6 = 265.
TEST_CASE("BPE training: hand-checked merges with the tie-break") {
  const Tokenizer t = Tokenizer::train({"ab ab cd cd"}, 1000);
  const std::vector<Merge>& m = t.spec().merges;
  REQUIRE(m.size() == 3);
  CHECK((m[0].left == 32 && m[0].right == 99 && m[0].result == 256));
  CHECK((m[1].left == 97 && m[1].right == 98 && m[1].result == 257));
  CHECK((m[2].left == 256 && m[2].right == 100 && m[2].result == 258));
  CHECK(t.vocab_size() == 265);
  CHECK(t.piece(258) == " cd");
  CHECK(t.special(Special::endoftext) == 259);
  CHECK(t.special(Special::mask) == 264);
  CHECK(t.first_special() == 259);
  CHECK(t.encode("ab cd") == std::vector<TokenId>{257, 258});
  CHECK(t.encode("abc") == std::vector<TokenId>{257, 99});
  // The vocabulary size caps the merges: 263 leaves room for one.
  CHECK(Tokenizer::train({"ab ab cd cd"}, 263).spec().merges.size() == 1);
}

// "aaaa" is one word: (a,a) counts 3 (overlapping), merge -> "aa" 256, word [256, 256]
// with (256,256) once; the word count 2 (two documents) makes it 2 -> "aaaa" 257.
TEST_CASE("BPE training: repeated symbols and document boundaries") {
  const Tokenizer t = Tokenizer::train({"aaaa", "aaaa"}, 1000);
  REQUIRE(t.spec().merges.size() == 2);
  CHECK(t.piece(256) == "aa");
  CHECK(t.piece(257) == "aaaa");
  CHECK(t.encode("aaaaaaa") == std::vector<TokenId>{257, 256, 97});
  // Words never span documents: "b" + "c" across two documents forms no pair.
  CHECK(Tokenizer::train({"xb", "cx"}, 1000).spec().merges.empty());
}

TEST_CASE("round trip: decode(encode(x)) == x for arbitrary bytes") {
  const Tokenizer t = sample_tokenizer();
  CHECK(t.spec().merges.size() > 20);  // 10 distinct words and their separators
  const Philox rng(123, 1);
  std::string random(20000, '\0');
  for (size_t i = 0; i < random.size(); ++i) random[i] = static_cast<char>(rng.u32(i) & 0xff);
  const std::vector<std::string> cases = {
      "",
      sample_text(),
      random,
      "\xff\xfe\xc3\x28\xa0\xa1\xe2\x28\xa1\xf0\x28\x8c\xbc",  // invalid UTF-8
      std::string(100000, 'a'),
      std::string(5000, ' ') + "x" + std::string(5000, '\n'),
      std::string(3000, '\xff'),
      std::string("\0cat\0dog\0", 9),
      "<|endoftext|>[MASK] the cat",
  };
  for (const std::string& s : cases) {
    const std::vector<TokenId> ids = t.encode(s);
    for (TokenId id : ids) CHECK(id < t.first_special());  // text never yields specials
    CHECK(t.decode(ids) == s);
  }
  CHECK(t.encode(" the cat").size() < 8);  // merges did compress
}

TEST_CASE("training on random bytes stays lossless") {
  const Philox rng(5, 2);
  std::string random(30000, '\0');
  for (size_t i = 0; i < random.size(); ++i) random[i] = static_cast<char>(rng.u32(i) & 0xff);
  const Tokenizer t = Tokenizer::train({random}, 600);
  CHECK(t.decode(t.encode(random)) == random);
}

TEST_CASE("decode: specials decode to their names, ids outside the vocabulary are errors") {
  const Tokenizer t = sample_tokenizer();
  CHECK(t.decode({t.special(Special::endoftext), 'h', 'i', t.special(Special::mask)}) ==
        "<|endoftext|>hi[MASK]");
  CHECK(has(error_of([&] {
              t.decode({1, static_cast<TokenId>(t.vocab_size())});
            }),
            "is outside the vocabulary"));
  CHECK(has(error_of([&] { t.decode({-1}); }), "position 0"));
}

TEST_CASE("vocab size below the bytes + specials is an error") {
  CHECK(has(error_of([] { Tokenizer::train({"abc"}, 100); }), "vocab size 100 is outside"));
}

TEST_CASE("save / load round trip gives identical encodings") {
  TempDir dir("tok-json");
  const Tokenizer t = sample_tokenizer();
  t.save(dir.file("tokenizer.json"));
  const Tokenizer u = Tokenizer::load(dir.file("tokenizer.json"));
  CHECK(u.vocab_size() == t.vocab_size());
  CHECK(u.spec().merges.size() == t.spec().merges.size());
  const std::string text = sample_text() + "\xff\xfe unseen words: zebra";
  CHECK(u.encode(text) == t.encode(text));
  CHECK(u.special(Special::mask) == t.special(Special::mask));
  const json j = json::parse(read_all(dir.file("tokenizer.json")));
  CHECK(j["format"] == "dtrain-bpe");
  CHECK(j["version"] == 1);
}

TEST_CASE("bad tokenizer.json files name the file and what is wrong") {
  TempDir dir("tok-bad");
  const Tokenizer t = Tokenizer::train({"ab ab cd cd"}, 1000);
  t.save(dir.file("good.json"));
  const json good = json::parse(read_all(dir.file("good.json")));
  const std::string path = dir.file("bad.json");
  auto load_text = [&](const std::string& text) {
    write_text(path, text);
    return error_of([&] { Tokenizer::load(path); });
  };
  auto load = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    return load_text(j.dump());
  };
  std::string e = load_text("{\"format\": ");
  CHECK(has(e, path + ": not valid JSON"));
  CHECK(has(e, "hint:"));
  CHECK(has(load_text("[1, 2]"), "expected a JSON object"));
  e = load([](json& j) { j["format"] = "gpt2"; });
  CHECK(has(e, path + ": format \"gpt2\" is not \"dtrain-bpe\""));
  CHECK(has(e, "--vocab-json"));
  CHECK(has(load([](json& j) { j["version"] = 2; }), "format version 2 is not supported"));
  CHECK(has(load([](json& j) { j.erase("merges"); }), "missing field \"merges\""));
  CHECK(has(load([](json& j) { j["byte_ids"].erase(0); }), "byte_ids: expected an array of 256"));
  CHECK(has(load([](json& j) {
              j["merges"][0] = json::array({32, 99});
            }),
            "merges[0]: expected [left, right, result]"));
  CHECK(has(load([](json& j) { j["merges"][0][1] = -3; }), "merges[0]: expected a token id"));
  // A merge of a token no earlier merge made: 258 is made by merge 2, used by merge 1.
  CHECK(has(load([](json& j) { j["merges"][1][0] = 258; }),
            "merge 1 (258 98 -> 257): token 258 is not a byte or the result of an earlier merge"));
  CHECK(has(load([](json& j) { j["merges"][1][0] = 5000; }), "token 5000 is not a byte"));
  CHECK(has(load([](json& j) {
              j["merges"][1] = json::array({32, 99, 257});  // the pair of merge 0 again
            }),
            "the pair is merged twice"));
  CHECK(has(load([](json& j) { j["merges"][2][2] = 256; }), "id 256 is already taken"));
  CHECK(has(load([](json& j) { j["special_tokens"].erase("[MASK]"); }), "\"[MASK]\" is missing"));
  CHECK(has(load([](json& j) { j["special_tokens"]["<s>"] = 3; }), "unknown special token"));
  CHECK(has(load([](json& j) { j["vocab_size"] = 300; }), "id 265 is neither a byte"));
  CHECK(has(load([](json& j) { j["vocab_size"] = 264; }), "id 264 is outside [0, 264)"));
  CHECK(has(load([](json& j) { j["byte_ids"][1] = 0; }), "byte 0x01: id 0 is already taken"));
  CHECK(has(error_of([&] { Tokenizer::load(dir.file("missing.json")); }), "file not found"));
}

// ---- GPT-2 files ------------------------------------------------------------------

namespace {

// GPT-2 numbers the 256 byte tokens in the order of their code points (the
// printable bytes first); the tiny vocabulary adds "Ġt", "he", "Ġthe" and
// <|endoftext|>, like the real one's first merges and its last id.
struct Gpt2Files {
  std::string vocab, merges;
};

Gpt2Files write_gpt2(const TempDir& dir, const std::string& merges_text,
                     const std::function<void(json&)>& edit = {}) {
  json vocab = json::object();
  std::vector<std::pair<std::string, int>> by_cp;
  for (int b = 0; b < 256; ++b) {
    const std::string key = gpt2_byte_to_unicode(static_cast<uint8_t>(b));
    by_cp.emplace_back(key, b);
  }
  // UTF-8 of code points below U+0800 sorts like the code points themselves.
  std::sort(by_cp.begin(), by_cp.end(), [](const auto& a, const auto& b) {
    return a.first.size() != b.first.size() ? a.first.size() < b.first.size() : a.first < b.first;
  });
  for (size_t i = 0; i < by_cp.size(); ++i) vocab[by_cp[i].first] = static_cast<int>(i);
  vocab["\xc4\xa0t"] = 256;  // "Ġt"
  vocab["he"] = 257;
  vocab["\xc4\xa0the"] = 258;
  vocab["<|endoftext|>"] = 259;
  if (edit) edit(vocab);
  Gpt2Files f{dir.file("vocab.json"), dir.file("merges.txt")};
  write_text(f.vocab, vocab.dump());
  write_text(f.merges, merges_text);
  return f;
}

constexpr const char* kMerges = "#version: 0.2\n\xc4\xa0 t\nh e\n\xc4\xa0t he\n";

}  // namespace

TEST_CASE("GPT-2 byte-to-unicode table: known points") {
  CHECK(gpt2_byte_to_unicode('!') == "!");
  CHECK(gpt2_byte_to_unicode(' ') == "\xc4\xa0");   // U+0120 Ġ
  CHECK(gpt2_byte_to_unicode('\n') == "\xc4\x8a");  // U+010A Ċ
  CHECK(gpt2_byte_to_unicode(0) == "\xc4\x80");     // U+0100 Ā
  CHECK(gpt2_byte_to_unicode(0xad) == "\xc5\x83");  // U+0143, the last of the 68 moved bytes
  CHECK(gpt2_byte_to_unicode(0xe9) == "\xc3\xa9");  // é maps to itself
}

TEST_CASE("GPT-2 vocab.json + merges.txt: ids, merges and appended specials") {
  TempDir dir("gpt2");
  const Gpt2Files f = write_gpt2(dir, kMerges);
  const Tokenizer t = Tokenizer::load_gpt2(f.vocab, f.merges);
  CHECK(t.vocab_size() == 265);  // 260 from the file + [PAD] [UNK] [CLS] [SEP] [MASK]
  CHECK(t.special(Special::endoftext) == 259);
  CHECK(t.special(Special::pad) == 260);
  CHECK(t.special(Special::mask) == 264);
  CHECK(t.encode(" the") == std::vector<TokenId>{258});
  const TokenId t_id = 't' - '!';  // printable ASCII starts at id 0 with '!'
  CHECK(t.encode("the") == std::vector<TokenId>{t_id, 257});
  CHECK(t.encode("!") == std::vector<TokenId>{0});
  const std::string text("the theme: \xff\0 then\n", 19);
  CHECK(t.decode(t.encode(text)) == text);
  // Saved in dtrain's format it encodes the same.
  t.save(dir.file("tokenizer.json"));
  CHECK(Tokenizer::load(dir.file("tokenizer.json")).encode(text) == t.encode(text));
}

TEST_CASE("GPT-2 files: errors name the file and line") {
  TempDir dir("gpt2-bad");
  Gpt2Files f = write_gpt2(dir, "#version: 0.2\n\xc4\xa0 t\nh x\n");
  std::string e = error_of([&] { Tokenizer::load_gpt2(f.vocab, f.merges); });
  CHECK(has(e, f.merges + ":3: token \"hx\" is not in " + f.vocab));
  f = write_gpt2(dir, "#version: 0.2\nh e extra\n");
  CHECK(has(error_of([&] { Tokenizer::load_gpt2(f.vocab, f.merges); }),
            f.merges + ":2: expected two tokens separated by one space"));
  f = write_gpt2(dir, kMerges, [](json& v) { v.erase("\xc4\xa0"); });
  CHECK(has(error_of([&] { Tokenizer::load_gpt2(f.vocab, f.merges); }), "ids must be dense"));
  f = write_gpt2(dir, kMerges, [](json& v) { v["\xc4\xa0"] = 300; });
  e = error_of([&] { Tokenizer::load_gpt2(f.vocab, f.merges); });
  CHECK(has(e, f.vocab + ": token \"\xc4\xa0\": id 300 is not in [0, 260)"));
  f = write_gpt2(dir, kMerges, [](json& v) { v["\xe2\x82\xac"] = 260; });  // € is not in the table
  CHECK(has(error_of([&] { Tokenizer::load_gpt2(f.vocab, f.merges); }),
            "outside GPT-2's byte-to-unicode table"));
  f = write_gpt2(dir, kMerges, [](json& v) {
    v["<|endoftext|>"] = 256;
    v["\xc4\xa0t"] = 259;
  });
  CHECK(has(error_of([&] { Tokenizer::load_gpt2(f.vocab, f.merges); }),
            "the special tokens must take the top"));
  CHECK(has(error_of([&] { Tokenizer::load_gpt2(f.vocab, dir.file("none.txt")); }),
            "file not found"));
}
