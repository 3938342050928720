// Language-model batches: causal labels are the inputs shifted by one; masked-LM
// selects ~15% (80/10/10) and never a special; batches are a pure function of the
// position (determinism, resume), ranks see disjoint windows, evaluation is in
// order with fixed masks, and short shards and mismatched directories are errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "data/text_loader.h"
#include "data/tokenizer.h"
#include "data_files.h"

using namespace dtrain;
using namespace dtrain::test;

namespace {

constexpr TokenId kVocab = 1006;  // ordinary ids 0..999, specials 1000..1005
constexpr TokenId kFirstSpecial = 1000;
constexpr TokenId kEot = 1000;
constexpr TokenId kMaskId = 1005;

// Token i is i % 1000, except every 97th, which is <|endoftext|>.
std::shared_ptr<const TokenShard> make_shard(int64_t n) {
  auto s = std::make_shared<TokenShard>();
  s->path = "/data/train.bin";
  s->vocab_size = kVocab;
  for (int64_t i = 0; i < n; ++i) s->tokens.push_back(i % 97 == 96 ? kEot : TokenId(i % 1000));
  return s;
}

TextBatchConfig causal(int64_t t, int64_t b, uint64_t seed = 1) {
  TextBatchConfig c;
  c.task = LmTask::causal;
  c.seq_len = t;
  c.batch = b;
  c.seed = seed;
  return c;
}

TextBatchConfig masked(int64_t t, int64_t b, uint64_t seed = 1) {
  TextBatchConfig c = causal(t, b, seed);
  c.task = LmTask::masked;
  c.masking = {std::max<int64_t>(1, std::llround(0.15 * static_cast<double>(t))), kMaskId,
               kFirstSpecial};
  return c;
}

struct Rows {
  std::vector<int32_t> input, labels;
  std::vector<int64_t> windows;
  BatchInfo info;
  bool operator==(const Rows& o) const {
    return input == o.input && labels == o.labels && windows == o.windows;
  }
};

Rows take(TextBatches& tb, const TextBatchConfig& c) {
  Rows r;
  r.input.resize(static_cast<size_t>(c.batch * c.seq_len));
  r.labels.resize(r.input.size());
  r.windows.resize(static_cast<size_t>(c.batch));
  r.info = tb.next(r.input.data(), r.labels.data(), r.windows.data());
  return r;
}

}  // namespace

TEST_CASE("causal LM: labels are the inputs shifted by one, windows at stride T") {
  const auto shard = make_shard(1000);
  const TextBatchConfig c = causal(16, 4);
  TextBatches tb(shard, c);
  CHECK(tb.windows() == 999 / 16);  // 62 windows of 17 tokens at stride 16
  CHECK(tb.batches_per_epoch() == 15);
  for (int k = 0; k < 20; ++k) {
    const Rows r = take(tb, c);
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t s = tb.window_start(r.info.epoch, r.windows[static_cast<size_t>(b)]);
      CHECK(s + 17 <= 1000);
      for (int64_t t = 0; t < c.seq_len; ++t) {
        const size_t i = static_cast<size_t>(b * c.seq_len + t);
        CHECK(r.input[i] == shard->tokens[static_cast<size_t>(s + t)]);
        CHECK(r.labels[i] == shard->tokens[static_cast<size_t>(s + t + 1)]);
      }
    }
  }
  // The per-epoch offset stays inside the slack (999 - 62*16 = 7) and varies.
  std::set<int64_t> offsets;
  for (int64_t e = 0; e < 40; ++e) {
    offsets.insert(tb.window_start(e, 0));
    CHECK(tb.window_start(e, 0) <= 7);
  }
  CHECK(offsets.size() > 3);
}

TEST_CASE("an epoch visits every window once, epochs reshuffle") {
  const auto shard = make_shard(64 * 8 + 1);
  const TextBatchConfig c = causal(8, 4);
  TextBatches tb(shard, c);
  REQUIRE(tb.windows() == 64);
  std::vector<int64_t> e0, e1;
  for (int k = 0; k < 16; ++k) {
    const Rows r = take(tb, c);
    CHECK(r.info.epoch == 0);
    e0.insert(e0.end(), r.windows.begin(), r.windows.end());
  }
  for (int k = 0; k < 16; ++k) {
    const Rows r = take(tb, c);
    CHECK(r.info.epoch == 1);
    e1.insert(e1.end(), r.windows.begin(), r.windows.end());
  }
  CHECK(std::set<int64_t>(e0.begin(), e0.end()).size() == 64);
  CHECK(std::set<int64_t>(e1.begin(), e1.end()).size() == 64);
  CHECK(e0 != e1);
}

TEST_CASE("determinism and resume: a batch is a function of the position") {
  const auto shard = make_shard(5000);
  for (const TextBatchConfig& c : {causal(32, 3, 9), masked(32, 3, 9)}) {
    TextBatches a(shard, c), b(shard, c);
    std::vector<Rows> stream;
    for (int k = 0; k < 120; ++k) {  // several epochs (51 batches each)
      stream.push_back(take(a, c));
      CHECK(stream.back() == take(b, c));
    }
    // Resume from the position after batch k: the next batches are the same.
    for (int k : {0, 7, 50, 51, 100}) {
      TextBatches resumed(shard, c, stream[static_cast<size_t>(k)].info.next);
      CHECK(take(resumed, c) == stream[static_cast<size_t>(k + 1)]);
      CHECK(take(resumed, c) == stream[static_cast<size_t>(k + 2)]);
    }
    TextBatchConfig other = c;
    other.seed = 10;
    TextBatches d(shard, other);
    CHECK(!(take(d, other) == stream[0]));
  }
}

TEST_CASE("rank sharding: ranks see disjoint windows that together form the global batch") {
  const auto shard = make_shard(4000);
  TextBatchConfig c0 = causal(16, 3), c1 = causal(16, 3), single = causal(16, 6);
  c0.world = c1.world = 2;
  c1.rank = 1;
  TextBatches r0(shard, c0), r1(shard, c1), one(shard, single);
  for (int k = 0; k < 30; ++k) {
    const Rows a = take(r0, c0), b = take(r1, c1), g = take(one, single);
    std::vector<int64_t> both = a.windows;
    both.insert(both.end(), b.windows.begin(), b.windows.end());
    CHECK(std::set<int64_t>(both.begin(), both.end()).size() == 6);
    CHECK(both == g.windows);  // the same global batch as one rank taking all 6
    CHECK(a.info.next == g.info.next);
  }
}

TEST_CASE("masked LM: round(0.15 T) selected per window, 80/10/10, labels only there") {
  const auto shard = make_shard(200000);
  const TextBatchConfig c = masked(128, 8);
  TextBatches tb(shard, c);
  int64_t ordinary = 0, selected = 0, masked_n = 0, random_n = 0, kept = 0, special_sel = 0;
  for (int k = 0; k < 150; ++k) {
    const Rows r = take(tb, c);
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t s = tb.window_start(r.info.epoch, r.windows[static_cast<size_t>(b)]);
      int64_t in_window = 0, ordinary_in_window = 0;
      for (int64_t t = 0; t < c.seq_len; ++t) {
        const size_t i = static_cast<size_t>(b * c.seq_len + t);
        const TokenId orig = shard->tokens[static_cast<size_t>(s + t)];
        if (orig >= kFirstSpecial) {
          special_sel += r.labels[i] != kIgnoreLabel;
          CHECK(r.input[i] == orig);
          continue;
        }
        ++ordinary;
        ++ordinary_in_window;
        if (r.labels[i] == kIgnoreLabel) {
          CHECK(r.input[i] == orig);
          continue;
        }
        CHECK(r.labels[i] == orig);
        ++selected;
        ++in_window;
        if (r.input[i] == kMaskId) {
          ++masked_n;
        } else if (r.input[i] == orig) {
          ++kept;
        } else {
          CHECK(r.input[i] < kFirstSpecial);
          ++random_n;
        }
      }
      CHECK(in_window == std::min<int64_t>(c.masking.predictions, ordinary_in_window));
    }
  }
  CHECK(special_sel == 0);
  const double rate = static_cast<double>(selected) / static_cast<double>(ordinary);
  CHECK(rate == doctest::Approx(19.0 / 128).epsilon(0.05));  // fewer ordinary where specials are
  const auto share = [&](int64_t n) {
    return static_cast<double>(n) / static_cast<double>(selected);
  };
  CHECK(share(masked_n) == doctest::Approx(0.8).epsilon(0.03));
  CHECK(share(random_n) == doctest::Approx(0.1).epsilon(0.15));  // a random id equal to the
  CHECK(share(kept) == doctest::Approx(0.1).epsilon(0.15));      // original counts as kept
}

TEST_CASE("masked LM: a short window still gets a selected position") {
  const auto shard = make_shard(4000);
  const TextBatchConfig c = masked(4, 16);  // round(0.15 * 4) = 1
  TextBatches tb(shard, c);
  for (int k = 0; k < 20; ++k) {
    const Rows r = take(tb, c);
    for (int64_t b = 0; b < c.batch; ++b) {
      int n = 0;
      for (int64_t t = 0; t < c.seq_len; ++t)
        n += r.labels[static_cast<size_t>(b * c.seq_len + t)] != kIgnoreLabel;
      CHECK(n == 1);
    }
  }
}

TEST_CASE("evaluation: windows in order, fixed masks, padding rows ignored") {
  const auto shard = make_shard(10 * 32);  // 10 masked windows of 32
  TextBatchConfig c = masked(32, 4, 5);
  c.order = TextOrder::sequential;
  TextBatches tb(shard, c);
  CHECK(tb.batches_per_epoch() == 3);
  const Rows b0 = take(tb, c), b1 = take(tb, c), b2 = take(tb, c);
  CHECK(b0.windows == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(b2.windows == std::vector<int64_t>{8, 9, 0, 1});
  CHECK(b2.info.valid == 2);
  for (size_t i = 64; i < 128; ++i) CHECK(b2.labels[i] == kIgnoreLabel);
  CHECK(tb.window_start(3, 2) == 64);  // no offset
  // The next epoch (and another run seed) masks the same way.
  const Rows again = take(tb, c);
  CHECK(again.info.epoch == 1);
  CHECK(again == b0);
  TextBatchConfig other = c;
  other.seed = 77;
  TextBatches tb2(shard, other);
  CHECK(take(tb2, other) == b0);
  // Causal evaluation starts at token 0 too.
  TextBatchConfig ce = causal(32, 4);
  ce.order = TextOrder::sequential;
  TextBatches ct(shard, ce);
  const Rows cb = take(ct, ce);
  CHECK(cb.input[0] == 0);
  CHECK(cb.labels[0] == 1);
}

TEST_CASE("shards too short for a window or a global batch are errors naming the file") {
  const auto shard = make_shard(16);
  std::string e = error_of([&] { TextBatches(shard, causal(16, 1)); });
  CHECK(has(e, "/data/train.bin: 16 tokens, fewer than one window of 17 (sequence length 16 + 1"));
  CHECK(has(error_of([&] { TextBatches(shard, masked(16, 1)); }), "<no error>"));
  e = error_of([&] { TextBatches(make_shard(100), causal(16, 8)); });
  CHECK(
      has(e, "/data/train.bin: 100 tokens make 6 windows of 16, fewer than one global batch of 8"));
}

TEST_CASE("open_text_data loads a tokenized directory and cross-checks vocab sizes") {
  TempDir dir("text-data");
  const Tokenizer t = Tokenizer::train({"ab ab cd cd"}, 1000);
  t.save(dir.file("tokenizer.json"));
  const std::vector<TokenId> ids = t.encode("ab cd ab cd");
  write_token_shard(dir.file("train.bin"), ids, t.vocab_size());
  write_token_shard(dir.file("val.bin"), ids, t.vocab_size());
  const TextData d = open_text_data(dir.str());
  CHECK(d.train->tokens == ids);
  CHECK(d.tokenizer->vocab_size() == 265);
  write_token_shard(dir.file("val.bin"), ids, 300);
  CHECK(has(error_of([&] { open_text_data(dir.str()); }),
            dir.file("val.bin") + ": vocab size 300, but"));
}

// ---- text classification ------------------------------------------------------

namespace {

constexpr TokenId kCls = 1003, kSep = 1004, kPad = 1001;

// Text k holds ids 10k, 10k+1, ... (k % 5 + 1 of them), class k % 3.
LabelledText make_texts(int64_t n) {
  auto tokens = std::make_shared<TokenShard>();
  auto labels = std::make_shared<TokenShard>();
  tokens->path = "/data/train.bin";
  labels->path = "/data/train.labels.bin";
  tokens->vocab_size = kVocab;
  labels->vocab_size = 3;
  for (int64_t k = 0; k < n; ++k) {
    tokens->tokens.push_back(kEot);
    for (int64_t i = 0; i < k % 5 + 1; ++i) tokens->tokens.push_back(TokenId(10 * k + i));
    labels->tokens.push_back(TokenId(k % 3));
  }
  return {tokens, labels};
}

ClassifyConfig classify(int64_t t, int64_t b, int rank = 0, int world = 1) {
  ClassifyConfig c;
  c.seq_len = t;
  c.batch = b;
  c.rank = rank;
  c.world = world;
  c.seed = 5;
  c.separator = kEot;
  c.cls = kCls;
  c.sep = kSep;
  c.pad = kPad;
  return c;
}

struct ClassRows {
  std::vector<int32_t> input, labels;
  BatchInfo info;
};
ClassRows take(ClassifyBatches& cb, const ClassifyConfig& c) {
  ClassRows r;
  r.input.resize(static_cast<size_t>(c.batch * c.seq_len));
  r.labels.resize(static_cast<size_t>(c.batch));
  r.info = cb.next(r.input.data(), r.labels.data());
  return r;
}

// The text of a row ([CLS] ids [SEP] [PAD]...), or an empty vector when the row breaks
// that layout.
std::vector<int32_t> text_of(const int32_t* row, int64_t t) {
  if (row[0] != kCls) return {};
  int64_t sep = 1;
  while (sep < t && row[sep] != kSep) ++sep;
  if (sep == t) return {};
  for (int64_t i = sep + 1; i < t; ++i)
    if (row[i] != kPad) return {};
  return std::vector<int32_t>(row + 1, row + sep);
}

}  // namespace

TEST_CASE("classification rows: [CLS] text [SEP] [PAD]..., the text's class, cut at T - 2") {
  const LabelledText d = make_texts(40);
  for (const int64_t t : {8, 4}) {
    CAPTURE(t);
    const ClassifyConfig c = classify(t, 8);
    ClassifyBatches cb(d, c);
    CHECK(cb.texts() == 40);
    CHECK(cb.batches_per_epoch() == 5);
    std::set<int64_t> seen;
    for (int step = 0; step < 5; ++step) {
      const ClassRows r = take(cb, c);
      for (int64_t b = 0; b < c.batch; ++b) {
        const std::vector<int32_t> text = text_of(r.input.data() + b * t, t);
        REQUIRE(!text.empty());
        const int64_t k = text[0] / 10;  // which text this row is
        const auto len = std::min<int64_t>(k % 5 + 1, t - 2);
        REQUIRE(static_cast<int64_t>(text.size()) == len);
        for (int64_t i = 0; i < len; ++i) CHECK(text[i] == 10 * k + i);
        CHECK(r.labels[b] == k % 3);
        seen.insert(k);
      }
    }
    CHECK(seen.size() == 40);  // one epoch: every text once
  }
}

TEST_CASE("classification: ranks split each global batch, evaluation pads with ignored rows") {
  const LabelledText d = make_texts(40);
  ClassifyBatches one(d, classify(8, 4));
  ClassifyBatches r0(d, classify(8, 2, 0, 2)), r1(d, classify(8, 2, 1, 2));
  for (int step = 0; step < 12; ++step) {  // past an epoch
    const ClassRows a = take(one, classify(8, 4));
    const ClassRows b0 = take(r0, classify(8, 2, 0, 2));
    const ClassRows b1 = take(r1, classify(8, 2, 1, 2));
    std::vector<int32_t> joined = b0.input;
    joined.insert(joined.end(), b1.input.begin(), b1.input.end());
    CHECK(joined == a.input);
    CHECK(a.info.next == b1.info.next);
  }
  ClassifyConfig ev = classify(8, 16);
  ev.order = TextOrder::sequential;
  ClassifyBatches eval(d, ev);
  CHECK(eval.batches_per_epoch() == 3);
  ClassRows last;
  for (int i = 0; i < 3; ++i) last = take(eval, ev);
  CHECK(last.info.valid == 8);  // texts 32..39, then 8 padding rows
  CHECK(last.labels[7] == 39 % 3);
  CHECK(last.labels[8] == kIgnoreLabel);
  CHECK(last.labels[15] == kIgnoreLabel);
}

TEST_CASE("classification data errors name the files") {
  LabelledText d = make_texts(10);
  auto fewer = std::make_shared<TokenShard>(*d.labels);
  fewer->tokens.pop_back();
  CHECK(has(error_of([&] {
              ClassifyBatches({d.tokens, fewer}, classify(8, 2));
            }),
            "/data/train.bin: 10 texts, but /data/train.labels.bin holds 9 labels"));
  CHECK(has(error_of([&] { ClassifyBatches(d, classify(8, 16)); }),
            "/data/train.bin: 10 texts, fewer than one global batch of 16"));

  TempDir dir("text-labels");
  const Tokenizer t = Tokenizer::train({"ab ab cd cd"}, 1000);
  t.save(dir.file("tokenizer.json"));
  std::vector<TokenId> ids = {t.special(Special::endoftext)};
  for (TokenId id : t.encode("ab cd")) ids.push_back(id);
  write_token_shard(dir.file("train.bin"), ids, t.vocab_size());
  write_token_shard(dir.file("val.bin"), ids, t.vocab_size());
  write_class_names(dir.str(), {"a", "b"});
  write_token_shard(dir.file("train.labels.bin"), {1}, 2);
  write_token_shard(dir.file("val.labels.bin"), {0}, 3);
  CHECK(has(error_of([&] { open_text_data(dir.str()); }),
            dir.file("val.labels.bin") + ": 3 classes, but " + dir.str() + "/labels.json names 2"));
  write_token_shard(dir.file("val.labels.bin"), {0}, 2);
  const TextData ok = open_text_data(dir.str());
  CHECK(ok.classes == std::vector<std::string>{"a", "b"});
  CHECK(ok.train_labels->tokens == std::vector<TokenId>{1});
  std::filesystem::remove(dir.file("val.labels.bin"));
  CHECK(has(error_of([&] { open_text_data(dir.str()); }),
            dir.file("val.labels.bin") + ": missing, but " + dir.str() + "/labels.json says"));
}
