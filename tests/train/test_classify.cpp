// BERT sequence classification end to end through the CLI: generated records split
// into questions and statements, tokenized by `dtrain data tokenize --labelled`; a
// one-layer BERT classifier learns them (its memory as estimated), resumes bit for
// bit, starts from a masked-LM run's export (model.init_from, its pooler and
// classifier from the seed), and refuses data that does not fit it with exit 2. The rows and the
// padding mask on their own: tests/data/test_text_loader.cpp, tests/models/test_transformers.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "corpus.h"
#include "harness.h"

using namespace dtrain::train_test;

TEST_CASE("a BERT classifier learns questions from statements, and resumes bit for bit") {
  TempDir tmp("classify");
  const TokenDir t = tokenize_labelled(tmp.path(), 600);
  const RunResult r =
      run_dtrain({classifier_job(tmp.path(), "learn", t, 120).string()}, tmp.path() / "learn.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const nlohmann::json eval = last_eval(tmp.path() / "learn" / "metrics.jsonl");
  REQUIRE(eval.contains("test_accuracy"));
  // Every validation text counts once (its padding rows do not); about 42% of the
  // records ask a question, so always answering "statement" scores about 0.58.
  const int64_t texts = eval.at("test_samples").get<int64_t>();
  CHECK(texts > 40);
  CHECK(texts < 90);
  MESSAGE("accuracy " << eval.at("test_accuracy").get<double>() << " over " << texts << " texts");
  CHECK(eval.at("test_accuracy").get<double>() > 0.9);
  // dtrain estimate's peak (in summary.json) is the measured one within 1%.
  const auto summary = nlohmann::json::parse(std::ifstream(tmp.path() / "learn" / "summary.json"));
  const auto estimated = summary.at("memory_estimate").at("peak_bytes").get<double>();
  const auto measured = summary.at("peak_host_bytes").get<double>();
  CHECK(std::abs(estimated - measured) <= 0.01 * measured);

  // 12 steps straight against 6, a stop, and 6 more from the checkpoint.
  const fs::path straight = classifier_job(tmp.path(), "straight", t, 12);
  const RunResult a = run_dtrain({straight.string()}, tmp.path() / "straight.log");
  REQUIRE_MESSAGE(a.rc == 0, a.describe());
  const fs::path split = classifier_job(tmp.path(), "split", t, 12);
  const RunResult b1 =
      run_dtrain({split.string(), "--set", "train.steps=6"}, tmp.path() / "b1.log");
  REQUIRE_MESSAGE(b1.rc == 0, b1.describe());
  const RunResult b2 = run_dtrain({split.string(), "--resume", "latest"}, tmp.path() / "b2.log");
  REQUIRE_MESSAGE(b2.rc == 0, b2.describe());
  const std::string diff =
      compare_checkpoints(newest_checkpoint(tmp.path() / "straight" / "checkpoints"),
                          newest_checkpoint(tmp.path() / "split" / "checkpoints"));
  CHECK_MESSAGE(diff.empty(), diff);
}

// The same records as labelled rows in one JSON Lines file, as datasets are often
// shipped: {"text": ..., "label": "question" | "statement"} per line.
TEST_CASE("a classifier learns from a .jsonl file of labelled rows") {
  TempDir tmp("classify-jsonl");
  std::string rows;
  for (const Record& r : generated_records(600)) {
    rows +=
        nlohmann::json{{"text", r.text}, {"label", r.question ? "question" : "statement"}}.dump() +
        "\n";
  }
  const fs::path file = tmp.path() / "records.jsonl";
  write_bytes(file, rows);
  TokenDir t;
  t.dir = tmp.path() / "rows";
  const RunResult tok =
      run_dtrain_command({"data", "tokenize", "--labelled", "--input", file.string(),
                          "--vocab-size", "300", "--val-fraction", "0.1", "--out", t.dir.string()},
                         tmp.path() / "tokenize.log");
  REQUIRE_MESSAGE(tok.rc == 0, tok.describe());
  CHECK(contains(tok.log, "classes: 2 (question"));
  const auto labels = nlohmann::json::parse(std::ifstream(t.dir / "labels.json"));
  CHECK(labels.at("classes") == std::vector<std::string>{"question", "statement"});
  t.vocab = 300;
  const RunResult r =
      run_dtrain({classifier_job(tmp.path(), "learn", t, 120).string()}, tmp.path() / "learn.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const nlohmann::json eval = last_eval(tmp.path() / "learn" / "metrics.jsonl");
  REQUIRE(eval.contains("test_accuracy"));
  MESSAGE("accuracy " << eval.at("test_accuracy").get<double>());
  CHECK(eval.at("test_accuracy").get<double>() > 0.9);
}

TEST_CASE("fine-tuning: a classifier starts from a masked-LM run's export") {
  TempDir tmp("classify-init");
  const TokenDir t = tokenize_labelled(tmp.path(), 300);
  // Masked-LM pretraining reads the same directory (its labels unused), then exports.
  const fs::path mlm = classifier_job(tmp.path(), "mlm", t, 4);
  const RunResult p =
      run_dtrain({mlm.string(), "--set", "model.num_classes=null"}, tmp.path() / "mlm.log");
  REQUIRE_MESSAGE(p.rc == 0, p.describe());
  const fs::path exported = tmp.path() / "mlm.safetensors";
  const RunResult ex = run_dtrain_command(
      {"ckpt", "export", (tmp.path() / "mlm").string(), "--safetensors", exported.string()},
      tmp.path() / "export.log");
  REQUIRE_MESSAGE(ex.rc == 0, ex.describe());
  // The fine-tuning data is tokenized with the pretraining run's tokenizer.
  const TokenDir tuned_data =
      tokenize_labelled(tmp.path(), 300, "tuned-tokens", t.dir / "tokenizer.json");
  CHECK(tuned_data.vocab == t.vocab);
  const fs::path job = classifier_job(tmp.path(), "tuned", tuned_data, 4);
  const RunResult r = run_dtrain({job.string(), "--set", "model.init_from=" + exported.string()},
                                 tmp.path() / "tuned.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(contains(r.log,
                         "4 head tensor(s) start from the seed (not in the file, or shaped "
                         "differently there): "
                         "bert.pooler.dense.weight, bert.pooler.dense.bias, "
                         "classifier.weight, classifier.bias"),
                r.log);
  CHECK_MESSAGE(contains(r.log,
                         "5 head tensor(s) of the file not used: "
                         "cls.predictions.transform.dense.weight"),
                r.log);
}

TEST_CASE("labelled data that does not fit the classifier is exit 2, naming key and file") {
  TempDir tmp("classify-bad");
  const TokenDir t = tokenize_labelled(tmp.path(), 200);
  const fs::path job = classifier_job(tmp.path(), "bad", t, 2);
  const RunResult three =
      run_dtrain({job.string(), "--set", "model.num_classes=3"}, tmp.path() / "three.log");
  CHECK_MESSAGE(three.rc == 2, three.describe());
  CHECK_MESSAGE(contains(three.log, "model.num_classes: 3, but " + t.dir.string() +
                                        "/labels.json names 2 classes"),
                three.log);
  CHECK_MESSAGE(contains(three.log, "set model.num_classes: 2"), three.log);
  // Unlabelled shards (a language-model corpus) for a classifier.
  const TokenDir plain = tokenize(tmp.path(), 200);
  const RunResult unlabelled = run_dtrain(
      {job.string(), "--set", "data.path=" + plain.dir.string(), "--set", "model.vocab_size=300"},
      tmp.path() / "unlabelled.log");
  CHECK_MESSAGE(unlabelled.rc == 2, unlabelled.describe());
  CHECK_MESSAGE(contains(unlabelled.log, "holds token shards without labels"), unlabelled.log);
  CHECK_MESSAGE(contains(unlabelled.log, "--labelled"), unlabelled.log);
  const RunResult short_rows =
      run_dtrain({job.string(), "--set", "model.seq_len=2"}, tmp.path() / "short.log");
  CHECK_MESSAGE(short_rows.rc == 2, short_rows.describe());
  CHECK_MESSAGE(contains(short_rows.log, "model.seq_len: 2"), short_rows.log);
  CHECK_MESSAGE(!fs::exists(tmp.path() / "bad" / "checkpoints"), "a refused run wrote checkpoints");
}

// dtrain validate opens the data (and reads model.init_from) as the trainer does: a
// mismatch that `dtrain train` would stop at is exit 2 before anything is printed, and
// --no-data skips the check.
TEST_CASE("validate opens the job's data as train does") {
  TempDir tmp("classify-validate");
  const TokenDir t = tokenize_labelled(tmp.path(), 300);
  const fs::path job = classifier_job(tmp.path(), "v", t, 4);
  const RunResult ok = run_dtrain_command({"validate", job.string()}, tmp.path() / "ok.log");
  REQUIRE_MESSAGE(ok.rc == 0, ok.describe());
  CHECK_MESSAGE(contains(ok.log, "\n# data: "), ok.log);
  CHECK_MESSAGE(contains(ok.log, "validation texts"), ok.log);
  struct Case {
    std::vector<std::string> sets;
    const char* says;
  };
  const Case cases[] = {
      {{"model.num_classes=3"}, "labels.json names 2 classes"},
      {{"data.path=" + (tmp.path() / "gone").string()}, "gone"},
      {{"data.global_batch=4096"}, "fewer than one global batch of 4096"},
      {{"data.limit.train=3"}, "cut to 3 texts by data.limit.train"},
      {{"data.limit.train=3"}, "hint: raise data.limit.train, or lower data.global_batch"},
      // 16 texts per micro-batch, 32 micro-batches per step: more than the training set.
      {{"data.global_batch=512", "data.micro_batch=16"},
       "fewer than one global batch of 512 (16 per rank x 1 ranks x 32 micro-batches)"},
      {{"model.init_from=" + (tmp.path() / "none.safetensors").string()}, "model.init_from: "},
  };
  for (const Case& c : cases) {
    CAPTURE(c.says);
    std::vector<std::string> args = {"validate", job.string()};
    for (const std::string& s : c.sets) args.insert(args.end(), {"--set", s});
    const RunResult bad = run_dtrain_command(args, tmp.path() / "bad.log");
    CHECK_MESSAGE(bad.rc == 2, bad.describe());
    CHECK_MESSAGE(contains(bad.log, c.says), bad.log);
    CHECK_MESSAGE(!contains(bad.log, "run:"), bad.log);  // no YAML printed before the error
    args.push_back("--no-data");
    const RunResult skipped = run_dtrain_command(args, tmp.path() / "skipped.log");
    CHECK_MESSAGE(skipped.rc == 0, skipped.describe());
    CHECK_MESSAGE(contains(skipped.log, "# data: not opened (--no-data)"), skipped.log);
  }
}
