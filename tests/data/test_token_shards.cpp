// Token shards: write/read round trips in both widths, and every way a shard can
// be wrong ends in an Error naming the file and the byte offset. Also the text
// corpus rules (fortune records, skipped files, labelled inputs and rows) and the
// document split.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "core/checksum.h"
#include "core/error.h"
#include "data/text_corpus.h"
#include "data/token_shards.h"
#include "data_files.h"

using namespace dtrain;
using namespace dtrain::test;

namespace {

void put_le32(Bytes& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}

// Rewrites the header checksum after an edit of the payload.
void fix_crc(Bytes& b) {
  put_le32(b, 28, crc32c(b.data() + kTokenShardHeader, b.size() - kTokenShardHeader));
}

}  // namespace

TEST_CASE("token shard: round trip, u16 and u32, and the header layout") {
  TempDir dir("shard");
  const std::vector<TokenId> small = {0, 1, 65535, 300, 7};
  write_token_shard(dir.file("a.bin"), small, 65536);
  const Bytes a = read_all(dir.file("a.bin"));
  CHECK(a.size() == kTokenShardHeader + 2 * small.size());
  CHECK(std::memcmp(a.data(), "DTTOKENS", 8) == 0);
  CHECK(a[8] == 1);   // version
  CHECK(a[12] == 2);  // u16
  CHECK(a[16] == 5);  // count
  CHECK(a[26] == 1);  // vocab 65536 = 0x10000
  CHECK(a[34] == 1);  // second token, low byte first
  TokenShard s = read_token_shard(dir.file("a.bin"));
  CHECK(s.tokens == small);
  CHECK(s.vocab_size == 65536);

  const std::vector<TokenId> big = {70000, 0, 100276};
  write_token_shard(dir.file("b.bin"), big, 100277);
  CHECK(read_all(dir.file("b.bin")).size() == kTokenShardHeader + 4 * big.size());
  CHECK(read_token_shard(dir.file("b.bin")).tokens == big);

  write_token_shard(dir.file("empty.bin"), {}, 300);
  CHECK(read_token_shard(dir.file("empty.bin")).tokens.empty());
  // The writer leaves no temporary file behind.
  for (const auto& e : std::filesystem::directory_iterator(dir.str()))
    CHECK(e.path().string().find(".tmp") == std::string::npos);
}

TEST_CASE("bad token shards name the file, the byte offset and what to do") {
  TempDir dir("shard-bad");
  write_token_shard(dir.file("good.bin"), {1, 2, 3, 4}, 300);
  const Bytes good = read_all(dir.file("good.bin"));
  const std::string path = dir.file("bad.bin");
  auto read_bad = [&](const std::function<void(Bytes&)>& edit) {
    Bytes b = good;
    edit(b);
    write_plain(path, b);
    return error_of([&] { read_token_shard(path); });
  };
  std::string e = read_bad([](Bytes& b) { b[0] = 'X'; });
  CHECK(has(e, path + ": byte 0: wrong magic"));
  CHECK(has(e, "hint: the shard is damaged"));
  CHECK(has(read_bad([](Bytes& b) { b[8] = 9; }),
            "byte 8: format version 9 is not supported (this dtrain reads version 1)"));
  CHECK(has(read_bad([](Bytes& b) { b[12] = 3; }), "byte 12: bytes per token 3"));
  CHECK(has(read_bad([](Bytes& b) { b.resize(b.size() - 1); }),
            "byte 16: the header says 4 tokens (8 bytes) but 7 payload bytes follow (truncated"));
  CHECK(has(read_bad([](Bytes& b) { b.resize(20); }),
            "byte 20: file ends inside the 32-byte header"));
  CHECK(has(read_bad([](Bytes& b) {
              b.push_back(0);
              b.push_back(0);
            }),
            "the header says 4 tokens (8 bytes) but 10 payload bytes follow"));
  CHECK(has(read_bad([](Bytes& b) { b[33] ^= 1; }), "byte 28: payload checksum"));
  e = read_bad([](Bytes& b) {
    b[36] = 0x2c;  // token 2 becomes 300 + ... = 0x012c = 300, the vocab size
    b[37] = 0x01;
    fix_crc(b);
  });
  CHECK(has(e, path + ": byte 36: token 300 (number 2) is not below the vocab size 300"));
  CHECK(has(read_bad([](Bytes& b) { put_le32(b, 24, 70000); }), "byte 24: vocab size 70000"));
  CHECK(has(error_of([&] { read_token_shard(dir.file("none.bin")); }), "file not found"));
}

TEST_CASE("text corpus: fortune records, skipped files, whole-file documents") {
  TempDir dir("corpus");
  std::filesystem::create_directories(dir.file("sub"));
  write_plain(dir.file("sub/quotes"),
              Bytes{'o', 'n',  'e', '\n', '%', '\n', 't', 'w', 'o', '\n', 'x', '\n',
                    '%', '\n', ' ', '\n', '%', '\n', 't', 'h', 'r', 'e',  'e', '\n'});
  write_plain(dir.file("sub/quotes.dat"), Bytes{2, 0, 0, 0, 1});  // a strfile index
  write_plain(dir.file("sub/quotes.u8"), Bytes{'d', 'u', 'p'});
  write_plain(dir.file("blob"), Bytes{'a', 0, 'b'});  // binary: skipped
  write_plain(dir.file("plain.txt"), Bytes{'5', '0', '%', '\n', 'o', 'k'});
  const TextCorpus c = read_text_corpus({dir.str()});
  CHECK(c.files.size() == 2);
  CHECK(c.skipped.size() == 3);
  REQUIRE(c.documents() == 4);
  CHECK(c.document(0) == "50%\nok");  // plain.txt sorts before sub/
  CHECK(c.document(1) == "one\n");
  CHECK(c.document(2) == "two\nx\n");
  CHECK(c.document(3) == "three\n");  // the blank record between is dropped

  std::string e = error_of([&] { read_text_corpus({dir.file("missing")}); });
  CHECK(has(e, dir.file("missing") + ": no such file or directory"));
  e = error_of([&] { read_text_corpus({dir.file("blob")}); });
  CHECK(has(e, dir.file("blob") + ": byte 1: holds a NUL byte"));
  TempDir empty("corpus-empty");
  CHECK(has(error_of([&] { read_text_corpus({empty.str()}); }), "no text in"));
}

TEST_CASE("labelled corpus: each input is a class named by its file name") {
  TempDir dir("labelled");
  std::filesystem::create_directories(dir.file("pos"));
  write_plain(dir.file("pos/a.txt"), Bytes{'g', 'o', 'o', 'd'});
  write_plain(dir.file("pos/b.txt"), Bytes{'f', 'i', 'n', 'e'});
  write_gzip(dir.file("neg.txt.gz"), Bytes{'b', 'a', 'd', '\n', '%', '\n', 'p', 'o', 'o', 'r'});
  const LabelledCorpus c = read_labelled_corpus({dir.file("pos") + "/", dir.file("neg.txt.gz")});
  CHECK(c.names == std::vector<std::string>{"pos", "neg"});
  REQUIRE(c.corpus.documents() == 4);
  CHECK(c.labels == std::vector<int32_t>{0, 0, 1, 1});
  CHECK(c.corpus.document(1) == "fine");
  CHECK(c.corpus.document(3) == "poor");
  // Interleaving permutes the texts with their labels, the same way for the same seed.
  LabelledCorpus a = c, b = c;
  interleave_classes(a, 7);
  interleave_classes(b, 7);
  CHECK(a.labels == b.labels);
  std::multiset<std::pair<std::string, int32_t>> before, after;
  for (int64_t i = 0; i < 4; ++i) {
    before.emplace(std::string(c.corpus.document(static_cast<size_t>(i))), c.labels[i]);
    after.emplace(std::string(a.corpus.document(static_cast<size_t>(i))), a.labels[i]);
  }
  CHECK(before == after);
  bool moved = false;
  for (uint64_t seed = 0; seed < 8 && !moved; ++seed) {
    LabelledCorpus s = c;
    interleave_classes(s, seed);
    moved = s.labels != c.labels;
  }
  CHECK(moved);

  std::string e = error_of([&] { read_labelled_corpus({dir.file("pos")}); });
  CHECK(has(e, "--labelled: 1 input(s); each input is one class"));
  e = error_of([&] {
    read_labelled_corpus({dir.file("pos"), dir.file("pos/a.txt"), dir.file("pos")});
  });
  CHECK(has(e, "is read for class \"pos\" and for class \"a\""));
  std::filesystem::create_directories(dir.file("other/pos"));
  write_plain(dir.file("other/pos/c.txt"), Bytes{'o', 'k'});
  e = error_of([&] { read_labelled_corpus({dir.file("pos"), dir.file("other/pos")}); });
  CHECK(has(e, "two inputs make the class \"pos\""));
  write_plain(dir.file("n\xe9g.txt"), Bytes{'n', 'o'});  // a Latin-1 file name
  e = error_of([&] { read_labelled_corpus({dir.file("pos"), dir.file("n\xe9g.txt")}); });
  CHECK(has(e, "is not UTF-8 text"));
}

namespace {

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

// The error reading `text` as the rows file dir/name gives.
std::string refused_rows(TempDir& dir, const std::string& name, const std::string& text) {
  write_plain(dir.file(name), bytes_of(text));
  return error_of([&] { read_labelled_corpus({dir.file(name)}); });
}

}  // namespace

TEST_CASE("labelled rows: JSON Lines and TSV, classes in a fixed order, bad rows by line") {
  TempDir dir("rows");
  // String labels: classes by their bytes, whatever the rows' order; other keys ignored;
  // a blank line and CRLF endings are fine; a text may hold a tab or an escaped newline.
  write_plain(dir.file("reviews.jsonl"),
              bytes_of("{\"text\": \"so good\", \"label\": \"pos\", \"id\": 1}\r\n"
                       "{\"label\": \"neg\", \"text\": \"bad\\nworse\"}\n"
                       "\n"
                       "{\"text\": \"fine\\tok\", \"label\": \"pos\"}\n"));
  LabelledCorpus c = read_labelled_corpus({dir.file("reviews.jsonl")});
  CHECK(c.names == std::vector<std::string>{"neg", "pos"});
  CHECK(c.labels == std::vector<int32_t>{1, 0, 1});
  REQUIRE(c.corpus.documents() == 3);
  CHECK(c.corpus.document(0) == "so good");
  CHECK(c.corpus.document(1) == "bad\nworse");
  CHECK(c.corpus.document(2) == "fine\tok");
  // Whole-number labels keep their order by value (10 after 2), also gzipped.
  write_gzip(dir.file("topics.jsonl.gz"),
             bytes_of("{\"text\": \"a\", \"label\": 10}\n{\"text\": \"b\", \"label\": 2}\n"
                      "{\"text\": \"c\", \"label\": 0}\n"));
  c = read_labelled_corpus({dir.file("topics.jsonl.gz")});
  CHECK(c.names == std::vector<std::string>{"0", "2", "10"});
  CHECK(c.labels == std::vector<int32_t>{2, 1, 0});
  // TSV: the label, a tab, the rest of the line.
  write_plain(dir.file("rows.tsv"), bytes_of("spam\tbuy now\tcheap\nham\thello there\n"));
  c = read_labelled_corpus({dir.file("rows.tsv")});
  CHECK(c.names == std::vector<std::string>{"ham", "spam"});
  CHECK(c.labels == std::vector<int32_t>{1, 0});
  CHECK(c.corpus.document(0) == "buy now\tcheap");

  const auto refused = [&](const std::string& name, const std::string& text) {
    return refused_rows(dir, name, text);
  };
  std::string e = refused("bad.jsonl", "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\"}\n");
  CHECK(has(e, "bad.jsonl:2: not an object with a string \"text\" and a \"label\""));
  e = refused("float.jsonl", "{\"text\": \"a\", \"label\": 0.5}\n");
  CHECK(has(e, "float.jsonl:1: label 0.5 is neither a string nor a whole number"));
  e = refused("empty.jsonl", "{\"text\": \"a\", \"label\": 1}\n{\"text\": \" \", \"label\": 0}\n");
  CHECK(has(e, "empty.jsonl:2: the text is empty"));
  e = refused("one.tsv", "x\ta\nx\tb\n");
  CHECK(has(e, "2 row(s), all of one class"));
  e = refused("notab.tsv", "x\ta\ny b\n");
  CHECK(has(e, "notab.tsv:2: no tab between the label and the text"));
  e = refused("nolabel.tsv", "\ta\n");
  CHECK(has(e, "nolabel.tsv:1: the label is empty or not UTF-8 text"));
  // A rows file among class inputs would be read as one class's text: refused.
  e = error_of([&] { read_labelled_corpus({dir.file("rows.tsv"), dir.file("reviews.jsonl")}); });
  CHECK(has(e, "rows.tsv holds labelled rows, but 2 inputs make classes"));
}

// CSV as spreadsheets and pandas write it (RFC 4180): a header naming the columns, in
// any order among others; quoted fields holding commas, doubled quotes and line breaks;
// CRLF endings and a byte-order mark.
TEST_CASE("labelled rows: CSV with a header, quoted fields across lines, bad rows by line") {
  TempDir dir("csv");
  write_plain(dir.file("reviews.csv"), bytes_of("\xEF\xBB\xBFid,label,text\r\n"
                                                "1,pos,\"so good, really\"\r\n"
                                                "2,neg,\"she said \"\"no\"\"\nand left\"\r\n"
                                                "\r\n"
                                                "3,pos,plain\r\n"
                                                ",,\r\n"));  // a spreadsheet's trailing empty row
  LabelledCorpus c = read_labelled_corpus({dir.file("reviews.csv")});
  CHECK(c.names == std::vector<std::string>{"neg", "pos"});
  CHECK(c.labels == std::vector<int32_t>{1, 0, 1});
  REQUIRE(c.corpus.documents() == 3);
  CHECK(c.corpus.document(0) == "so good, really");
  CHECK(c.corpus.document(1) == "she said \"no\"\nand left");
  CHECK(c.corpus.document(2) == "plain");
  // Rows keep the line each starts on (after the two-line record and a blank line: 6).
  const std::vector<LabelledRow> rows = read_labelled_row_list(dir.file("reviews.csv"));
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].line == 2);
  CHECK(rows[1].line == 3);
  CHECK(rows[2].line == 6);

  const auto refused = [&](const std::string& name, const std::string& text) {
    return refused_rows(dir, name, text);
  };
  std::string e = refused("nolabel.csv", "text,class\na,x\n");
  CHECK(has(e, "nolabel.csv:1: the header (text, class) has no \"label\" column"));
  e = refused("short.csv", "text,label\na,x\nb\n");
  CHECK(has(e, "short.csv:3: 1 field(s), the header names 2"));
  e = refused("open.csv", "text,label\n\"a,x\nb,y\n");
  CHECK(has(e, "open.csv:2: a quoted field is not closed"));
  e = refused("after.csv", "text,label\n\"a\"b,x\n");
  CHECK(has(e, "after.csv:2: a character after a quoted field's closing quote"));
  e = refused("empty.csv", "text,label\na,x\n ,y\n");
  CHECK(has(e, "empty.csv:3: the text is empty"));
}

TEST_CASE("document split: deterministic, near the fraction, both sides non-empty") {
  const auto a = split_documents(10000, 3, 0.05);
  CHECK(a == split_documents(10000, 3, 0.05));
  CHECK(a != split_documents(10000, 4, 0.05));
  const auto val = std::count(a.begin(), a.end(), DocSplit::validation);
  CHECK(val > 400);
  CHECK(val < 600);
  const auto two = split_documents(2, 0, 0.01);
  CHECK(std::count(two.begin(), two.end(), DocSplit::validation) == 1);
  const auto none = split_documents(50, 0, 0.0);
  CHECK(std::count(none.begin(), none.end(), DocSplit::validation) == 0);
  const auto most = split_documents(3, 0, 0.99);
  CHECK(std::count(most.begin(), most.end(), DocSplit::train) >= 1);
}
