// `dtrain predict` end to end on one-layer BERTs of width 32 trained for a few steps on
// the generated records: a classifier's probabilities and a masked-LM's fill-mask
// against an independent forward in Python (tests/scripts/bert_reference.py, Hugging
// Face's arithmetic in float64, from `dtrain ckpt export`), the classifier's accuracy on
// its own validation texts against the trainer's evaluation, and the refusals (exit 2).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "corpus.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "harness.h"

using namespace dtrain::train_test;

namespace {

constexpr int kExitBadInput = 2;

RunResult predict(const fs::path& tmp, const std::string& log,
                  const std::vector<std::string>& args) {
  std::vector<std::string> all = {"predict"};
  all.insert(all.end(), args.begin(), args.end());
  return run_dtrain_command(all, tmp / log);
}

// `dtrain predict --json ...`: its JSON (the log holds nothing else unless it failed).
nlohmann::json predict_json(const fs::path& tmp, std::vector<std::string> args) {
  args.push_back("--json");
  const RunResult r = predict(tmp, "predict.log", args);
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const size_t at = r.log.find("{\n");
  REQUIRE_MESSAGE(at != std::string::npos, r.log);
  return nlohmann::json::parse(r.log.substr(at));
}

fs::path export_run(const fs::path& tmp, const std::string& run) {
  const fs::path model = tmp / (run + ".safetensors");
  const RunResult e =
      run_dtrain_command({"ckpt", "export", (tmp / run).string(), "--safetensors", model.string()},
                         tmp / "export.log");
  REQUIRE_MESSAGE(e.rc == 0, e.describe());
  return model;
}

// tests/scripts/bert_reference.py on an export and predict's JSON: 0 when they agree
// (its output in `log`).
int reference_check(const fs::path& model, const nlohmann::json& got, const fs::path& tmp,
                    int64_t ordinary) {
  const fs::path json = tmp / "predict.json", log = tmp / "reference.log";
  write_bytes(json, got.dump());
  const std::string cmd = std::string("python3 ") + DTRAIN_SOURCE_DIR +
                          "/tests/scripts/bert_reference.py " + model.string() + " " +
                          json.string() + " --heads 2 --ordinary " + std::to_string(ordinary) +
                          " > " + log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  if (code != 0) MESSAGE(read_bytes(log));
  return code;
}

// The validation split of a `data tokenize --labelled` directory as labelled rows: each
// text decoded from val.bin (texts follow <|endoftext|>), its class name from
// val.labels.bin and labels.json.
std::string validation_rows(const fs::path& dir) {
  const dtrain::Tokenizer tok = dtrain::Tokenizer::load((dir / "tokenizer.json").string());
  const dtrain::TokenShard val = dtrain::read_token_shard((dir / "val.bin").string());
  const dtrain::TokenShard labels = dtrain::read_token_shard((dir / "val.labels.bin").string());
  const auto names = nlohmann::json::parse(std::ifstream(dir / "labels.json")).at("classes");
  const dtrain::TokenId eot = tok.special(dtrain::Special::endoftext);
  std::vector<std::vector<dtrain::TokenId>> texts;
  for (dtrain::TokenId t : val.tokens) {
    if (t == eot) {
      texts.emplace_back();
    } else {
      REQUIRE(!texts.empty());
      texts.back().push_back(t);
    }
  }
  REQUIRE(texts.size() == labels.tokens.size());
  std::string rows;
  for (size_t i = 0; i < texts.size(); ++i) {
    rows += nlohmann::json{{"text", tok.decode(texts[i])}, {"label", names.at(labels.tokens[i])}}
                .dump() +
            "\n";
  }
  return rows;
}

}  // namespace

TEST_CASE("predict: a classifier's classes are an independent BERT's, and score as its eval") {
  TempDir tmp("predict-classify");
  const TokenDir t = tokenize_labelled(tmp.path(), 600);
  const fs::path job = classifier_job(tmp.path(), "cls", t, 60);
  const RunResult r = run_dtrain({job.string()}, tmp.path() / "train.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const fs::path model = export_run(tmp.path(), "cls");

  // Texts shorter than the 64-token rows (attention ignores the padding after them), one
  // longer (cut to 62 tokens), and one of each class, in a batch of 3 and a last of 1.
  std::string long_text;
  for (int i = 0; i < 12; ++i) long_text += "The old king sees the farmer near the house. ";
  const nlohmann::json got = predict_json(
      tmp.path(), {job.string(), "--batch", "3", "--text", "Who sees the old king?", "--text",
                   "The farmer walked to the river.", "--text", long_text, "--text", ""});
  CHECK(got.at("task") == "classify");
  CHECK(got.at("classes") == std::vector<std::string>{"questions", "statements"});
  CHECK(got.at("step") == 60);
  CHECK(got.at("forwards") == 2);
  const auto& texts = got.at("texts");
  REQUIRE(texts.size() == 4);
  CHECK(texts[0].at("label") == "questions");
  CHECK(texts[1].at("label") == "statements");
  CHECK(texts[2].at("cut") == true);
  CHECK(texts[2].at("ids").size() == 64);
  CHECK(texts[2].at("tokens").get<int64_t>() > 62);
  CHECK(texts[3].at("ids").size() == 2);  // [CLS] [SEP]
  CHECK(reference_check(model, got, tmp.path(), t.vocab - 6) == 0);

  // The validation texts as a .jsonl of labelled rows: predict's accuracy is the
  // trainer's last evaluation's, and so is the mean cross-entropy of its probabilities
  // (the same rows and weights), which a different prediction for any text would move.
  const fs::path rows = tmp.path() / "val.jsonl";
  write_bytes(rows, validation_rows(t.dir));
  const nlohmann::json scored =
      predict_json(tmp.path(), {job.string(), "--input", rows.string(), "--batch", "16"});
  const nlohmann::json eval = last_eval(tmp.path() / "cls" / "metrics.jsonl");
  CHECK(scored.at("labelled") == eval.at("test_samples"));
  CHECK(scored.at("accuracy").get<double>() ==
        doctest::Approx(eval.at("test_accuracy").get<double>()).epsilon(1e-12));
  double loss = 0.0;
  const std::vector<std::string> classes = scored.at("classes");
  for (const auto& text : scored.at("texts")) {
    const auto k = std::find(classes.begin(), classes.end(), text.at("expected")) - classes.begin();
    loss -= std::log(text.at("probabilities")[static_cast<size_t>(k)].get<double>());
  }
  loss /= static_cast<double>(scored.at("texts").size());
  CHECK(loss == doctest::Approx(eval.at("test_loss").get<double>()).epsilon(1e-5));
  MESSAGE("accuracy " << scored.at("accuracy") << ", loss " << loss << " (eval "
                      << eval.at("test_loss") << ") over " << scored.at("labelled") << " texts");
  // The console form: one line per text, and the score.
  const RunResult console =
      predict(tmp.path(), "console.log", {job.string(), "--input", rows.string()});
  REQUIRE_MESSAGE(console.rc == 0, console.describe());
  CHECK_MESSAGE(contains(console.log, "dtrain: accuracy "), console.log);
  CHECK_MESSAGE(contains(console.log, "labelled texts; per class: questions "), console.log);
}

TEST_CASE("predict: a masked-LM BERT fills [MASK]s as an independent BERT does") {
  TempDir tmp("predict-fill");
  const TokenDir t = tokenize_labelled(tmp.path(), 300);
  const fs::path job = classifier_job(tmp.path(), "mlm", t, 30);
  const RunResult r =
      run_dtrain({job.string(), "--set", "model.num_classes=null"}, tmp.path() / "train.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const fs::path model = export_run(tmp.path(), "mlm");
  const std::string mlm = "model.num_classes=null";
  // Two masks in one text; two texts of one length (one forward), one of another.
  const nlohmann::json got = predict_json(
      tmp.path(), {job.string(), "--set", mlm, "--top", "4", "--text",
                   "The old [MASK] sees the [MASK] near the house.", "--text",
                   "The old king [MASK] the farmer.", "--text", "The old king [MASK] the farmer?"});
  CHECK(got.at("task") == "fill-mask");
  CHECK(got.at("mask_id") == t.vocab - 1);
  const auto& texts = got.at("texts");
  REQUIRE(texts.size() == 3);
  CHECK(texts[0].at("masks").size() == 2);
  CHECK(texts[1].at("masks").size() == 1);
  CHECK(got.at("forwards") == 2);
  for (const auto& text : texts) {
    for (const auto& m : text.at("masks")) {
      REQUIRE(m.size() == 4);
      for (const auto& c : m) CHECK(c.at("id").get<int64_t>() < t.vocab - 6);  // no special
    }
  }
  // What the model read: <|endoftext|>, the text's tokens with the space before "[MASK]"
  // given to the mask, <|endoftext|>.
  const dtrain::Tokenizer tok = dtrain::Tokenizer::load((t.dir / "tokenizer.json").string());
  std::vector<dtrain::TokenId> want = {tok.special(dtrain::Special::endoftext)};
  tok.encode_append("The old king", want);
  want.push_back(tok.special(dtrain::Special::mask));
  tok.encode_append(" the farmer.", want);
  want.push_back(tok.special(dtrain::Special::endoftext));
  CHECK(texts[1].at("ids") == want);
  // The first token of each mask fills it; the space before "[MASK]" is the token's.
  const std::string first = texts[1].at("masks")[0][0].at("token");
  CHECK(texts[1].at("filled") == "The old king" + first + " the farmer.");
  CHECK(reference_check(model, got, tmp.path(), t.vocab - 6) == 0);
}

// A GPT-2 scores each token of a text given the ones before it; a text past the 16-token
// context in windows of 16 advancing by 8, each scoring the tokens the previous one did
// not reach. Every window is checked against the independent GPT-2 forward of
// tests/scripts/gpt2_reference.py, given the same tokens before the scored ones.
TEST_CASE("predict: a GPT-2's scores are an independent GPT-2's, window by window") {
  TempDir tmp("predict-score");
  const TokenDir t = tokenize(tmp.path(), 300);
  const fs::path job = gpt_job(tmp.path(), "gpt", t, 30);
  const RunResult r = run_dtrain({job.string()}, tmp.path() / "train.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const fs::path model = export_run(tmp.path(), "gpt");
  const std::string long_text =
      "The old king sees the farmer near the house. A horse walked in the garden. The farmer "
      "sees a horse.";
  // A text of exactly the context's 16 tokens: one window, as the trainer's evaluation
  // scores a window (each token seeing every one before it).
  const dtrain::Tokenizer tok = dtrain::Tokenizer::load((t.dir / "tokenizer.json").string());
  std::string sixteen;
  for (size_t cut = 1; cut <= long_text.size() && sixteen.empty(); ++cut) {
    if (tok.encode(long_text.substr(0, cut)).size() == static_cast<size_t>(kGptContext))
      sixteen = long_text.substr(0, cut);
  }
  REQUIRE(!sixteen.empty());
  const nlohmann::json got =
      predict_json(tmp.path(), {job.string(), "--batch", "2", "--text", "The old king sees.",
                                "--text", long_text, "--text", sixteen, "--text", ""});
  CHECK(got.at("task") == "score");
  const auto& texts = got.at("texts");
  REQUIRE(texts.size() == 4);
  CHECK(texts[3].at("tokens") == 0);
  CHECK(texts[3].at("perplexity").is_null());
  CHECK(texts[2].at("tokens") == kGptContext);
  CHECK(texts[2].at("windows") == 1);
  int64_t scored = 0;
  double sum = 0.0;
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const std::vector<int32_t> ids = texts[i].at("ids");
    const std::vector<double> logprobs = texts[i].at("logprobs");
    const auto n = static_cast<int64_t>(ids.size());
    REQUIRE(static_cast<int64_t>(logprobs.size()) == n - 1);
    CHECK(ids.front() == t.vocab - 6);  // <|endoftext|>
    int64_t windows = 0;
    for (int64_t begin = 0, first = 1; first < n; begin += kGptContext / 2, ++windows) {
      // ids[begin, end) run; the tokens at [first, end] are scored.
      const int64_t end = std::min(begin + kGptContext, n - 1);
      nlohmann::json window = {
          {"prompt_ids", std::vector<int32_t>(ids.begin() + begin, ids.begin() + first)},
          {"samples",
           {{{"ids", std::vector<int32_t>(ids.begin() + first, ids.begin() + end + 1)},
             {"logprobs",
              std::vector<double>(logprobs.begin() + first - 1, logprobs.begin() + end)}}}}};
      const fs::path json = tmp.path() / "window.json", log = tmp.path() / "window.log";
      write_bytes(json, window.dump());
      const std::string cmd = std::string("python3 ") + DTRAIN_SOURCE_DIR +
                              "/tests/scripts/gpt2_reference.py " + model.string() + " " +
                              json.string() + " --heads " + std::to_string(kGptHeads) +
                              " --context " + std::to_string(kGptContext) + " --candidates " +
                              std::to_string(t.vocab - 5) + " > " + log.string() + " 2>&1";
      const int rc = std::system(cmd.c_str());
      CHECK_MESSAGE((WIFEXITED(rc) && WEXITSTATUS(rc) == 0), read_bytes(log));
      first = end + 1;
    }
    CHECK(texts[i].at("windows") == windows);
    double text_sum = 0.0;
    for (double l : logprobs) text_sum += l;
    CHECK(texts[i].at("perplexity").get<double>() ==
          doctest::Approx(std::exp(-text_sum / static_cast<double>(n - 1))).epsilon(1e-12));
    scored += n - 1;
    sum += text_sum;
  }
  CHECK(texts[0].at("windows") == 1);
  CHECK(texts[1].at("windows").get<int64_t>() > 2);
  CHECK(got.at("scored_tokens") == scored);
  CHECK(got.at("perplexity").get<double>() ==
        doctest::Approx(std::exp(-sum / static_cast<double>(scored))).epsilon(1e-12));

  // Labelled rows: the perplexity per label too, over the same scores.
  const fs::path rows = tmp.path() / "rows.tsv";
  write_bytes(rows, "short\tThe old king sees.\nlong\t" + long_text + "\nshort\t" + sixteen + "\n");
  const nlohmann::json labelled =
      predict_json(tmp.path(), {job.string(), "--input", rows.string()});
  const auto& per_label = labelled.at("per_label");
  const int64_t short_tokens = texts[0].at("tokens").get<int64_t>() + kGptContext;
  CHECK(per_label.at("short").at("scored_tokens") == short_tokens);
  CHECK(per_label.at("long").at("perplexity").get<double>() ==
        doctest::Approx(texts[1].at("perplexity").get<double>()).epsilon(1e-12));
}

// Where the class names and the special tokens come from when the job's data is not the
// training data: a labels.json beside --tokenizer, and for a model trained on synthetic
// data the top ids of its vocabulary (where the trainer put [CLS], [SEP] and [PAD]).
TEST_CASE("predict: class names beside --tokenizer, and a synthetic-data model's special ids") {
  TempDir tmp("predict-elsewhere");
  const TokenDir t = tokenize_labelled(tmp.path(), 300);
  const fs::path job = classifier_job(tmp.path(), "cls", t, 4);
  REQUIRE(run_dtrain({job.string()}, tmp.path() / "cls.log").rc == 0);
  const fs::path moved = tmp.path() / "moved";
  fs::create_directories(moved);
  fs::copy_file(t.dir / "tokenizer.json", moved / "tokenizer.json");
  const std::vector<std::string> elsewhere = {
      job.string(),  "--text",      "Who?", "--set", "data.path=" + (tmp.path() / "gone").string(),
      "--tokenizer", moved.string()};
  CHECK(predict_json(tmp.path(), elsewhere).at("classes") == std::vector<std::string>{"0", "1"});
  fs::copy_file(t.dir / "labels.json", moved / "labels.json");
  CHECK(predict_json(tmp.path(), elsewhere).at("classes") ==
        std::vector<std::string>{"questions", "statements"});

  // Labelled rows under another name (--format), a byte-order mark before the first.
  const fs::path rows = tmp.path() / "rows.txt";
  write_bytes(rows, "\xEF\xBB\xBFquestions\tWho sees the king?\r\nstatements\tThe king sees.\r\n");
  const nlohmann::json scored =
      predict_json(tmp.path(), {job.string(), "--input", rows.string(), "--format", "tsv"});
  CHECK(scored.at("labelled") == 2);
  CHECK(scored.at("per_class").at("questions").at("labelled") == 1);
  CHECK(scored.at("texts")[0].at("text") == "Who sees the king?");
  // The same rows as a spreadsheet writes them.
  const fs::path csv = tmp.path() / "rows.csv";
  write_bytes(csv,
              "label,text\r\nquestions,\"Who sees the king?\"\r\nstatements,\"The king, "
              "he sees.\"\r\n");
  const nlohmann::json from_csv = predict_json(tmp.path(), {job.string(), "--input", csv.string()});
  CHECK(from_csv.at("labelled") == 2);
  CHECK(from_csv.at("texts")[1].at("text") == "The king, he sees.");
  const RunResult plain =
      predict(tmp.path(), "plain.log", {job.string(), "--input", rows.string()});
  REQUIRE_MESSAGE(plain.rc == 0, plain.describe());
  CHECK_MESSAGE(contains(plain.log, "looks like a labelled row (label, tab, text)"), plain.log);

  // Synthetic data, a vocabulary of 400 and the 300-token tokenizer: [CLS] is 400 - 3.
  const fs::path synthetic = tmp.path() / "synthetic.yaml";
  std::ofstream(synthetic) << "run: {output_dir: " << (tmp.path() / "synthetic").string()
                           << ", seed: 1}\n"
                           << "model: {arch: bert-tiny, layers: 1, hidden: 32, heads: 2, "
                              "seq_len: 16, vocab_size: 400, num_classes: 2}\n"
                           << "data: {dataset: synthetic, global_batch: 4}\n"
                           << "optimizer: {name: adamw, lr: 0.001}\n"
                           << "train: {steps: 2}\nlogging: {console: false}\n";
  REQUIRE(run_dtrain({synthetic.string()}, tmp.path() / "synthetic.log").rc == 0);
  const nlohmann::json got = predict_json(
      tmp.path(), {synthetic.string(), "--tokenizer", moved.string(), "--text", "Who?"});
  const auto& ids = got.at("texts")[0].at("ids");
  CHECK(ids.front() == 397);  // [CLS]
  CHECK(ids.back() == 398);   // [SEP]
}

TEST_CASE("predict refuses what it cannot use with exit 2, naming it") {
  TempDir tmp("predict-refusals");
  const TokenDir t = tokenize_labelled(tmp.path(), 300);
  const fs::path job = classifier_job(tmp.path(), "cls", t, 4);
  REQUIRE(run_dtrain({job.string()}, tmp.path() / "cls.log").rc == 0);
  const RunResult m = run_dtrain({job.string(), "--set", "model.num_classes=null", "--set",
                                  "run.output_dir=" + (tmp.path() / "mlm").string()},
                                 tmp.path() / "mlm.log");
  REQUIRE(m.rc == 0);
  const fs::path mlm_export = export_run(tmp.path(), "mlm");
  const fs::path rows = tmp.path() / "rows.tsv";
  write_bytes(rows, "questions\tWho is there?\nanswers\tNobody.\n");
  const fs::path blank = tmp.path() / "blank.txt";
  write_bytes(blank, "\n  \n");
  const fs::path masks = tmp.path() / "masks.txt";
  write_bytes(masks, "The [MASK] king.\n\nno mask here\n");
  const TokenDir other = tokenize(tmp.path(), 200);  // another corpus: another vocabulary
  const std::string j = job.string();
  const std::vector<std::string> mlm = {"--set", "model.num_classes=null", "--set",
                                        "run.output_dir=" + (tmp.path() / "mlm").string()};
  const auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  struct Case {
    const char* name;
    std::vector<std::string> args;
    const char* says;
  };
  std::string too_long;
  for (int i = 0; i < 40; ++i) too_long += "king ";
  const Case cases[] = {
      {"a ResNet",
       {std::string(DTRAIN_SOURCE_DIR) + "/configs/example-resnet.yaml", "--text", "a"},
       "an image model"},
      {"no texts", {j}, "no texts to predict"},
      {"a blank input file", {j, "--input", blank.string()}, "every line is blank"},
      {"a missing input file", {j, "--input", "/nonexistent.txt"}, "/nonexistent.txt"},
      {"a directory as input", {j, "--input", tmp.path().string()}, "a directory, not a file"},
      {"--top for a classifier", {j, "--text", "a", "--top", "3"}, "--top 3: lists the most"},
      {"a label the model does not know",
       {j, "--input", rows.string()},
       "rows.tsv:2: label \"answers\" is none of the model's classes (questions, statements)"},
      {"labelled rows for a masked-LM", with({j, "--input", rows.string()}, mlm),
       "labelled rows score a classifier"},
      {"a fill-mask text without [MASK]", with({j, "--text", "no mask"}, mlm), "has no [MASK]"},
      {"a fill-mask line without [MASK]", with({j, "--input", masks.string()}, mlm),
       "masks.txt:3 has no [MASK]"},
      {"another corpus's tokenizer",
       {j, "--text", "a", "--tokenizer", (other.dir / "tokenizer.json").string()},
       "not the vocabulary of the model's training data"},
      {"an untrained job whose model.init_from has no classifier",
       {j, "--text", "a", "--set", "run.output_dir=" + (tmp.path() / "untrained").string(), "--set",
        "model.init_from=" + mlm_export.string()},
       "yet, so predict read model.init_from"},
      {"a fill-mask text past the context", with({j, "--text", too_long + "[MASK]"}, mlm),
       "more than the model's context (model.seq_len 64)"},
      {"a classifier from a masked-LM export",
       {j, "--text", "a", "--checkpoint", mlm_export.string()},
       "the file has no bert.pooler.dense.weight"},
      {"classes that labels.json does not name",
       {j, "--text", "a", "--set", "model.num_classes=3"},
       "labels.json names 2 classes, the job's model.num_classes is 3"},
      {"--top 0", with({j, "--text", "[MASK]", "--top", "0"}, mlm), "--top"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const RunResult r = predict(tmp.path(), "refused.log", c.args);
    CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
    CHECK_MESSAGE(contains(r.log, c.says), r.log);
  }
}
