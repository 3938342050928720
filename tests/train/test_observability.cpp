// What a run leaves for a person to look at: metrics.jsonl and the TensorBoard event
// files (logging.tensorboard) hold each step once, also after a resume from an earlier
// checkpoint over a run that had gone further (and left a torn last line); the event
// files read back with TensorBoard's own reader (tests/scripts/tensorboard_check.py,
// the `tensorboard` package in the venv the ctest fixture builds at DTRAIN_TB_PYTHON)
// and agree with metrics.jsonl number for number; the per-window monitoring fields.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "harness.h"
#include "runtime/tensorboard.h"

using namespace dtrain::train_test;
namespace rt = dtrain::runtime;

namespace {

std::vector<nlohmann::json> read_lines(const fs::path& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<std::string> job_args(const fs::path& job, int steps) {
  return {job.string(),
          "--set",
          "train.steps=" + std::to_string(steps),
          "--set",
          "train.eval_every=4",
          "--set",
          "train.checkpoint={every: 4, keep: 5}",
          "--set",
          "logging.tensorboard=true"};
}

// TensorBoard's reader on run_dir; its output goes to `log`.
int tensorboard_check(const fs::path& run_dir, const fs::path& log) {
  const fs::path python = DTRAIN_TB_PYTHON;
  const std::string missing = python.string() +
                              " is missing: run this through ctest (its fixture "
                              "observability.tensorboard_setup builds the venv)";
  REQUIRE_MESSAGE(fs::exists(python), missing);
  const std::string cmd = python.string() + " " + DTRAIN_SOURCE_DIR +
                          "/tests/scripts/tensorboard_check.py " + run_dir.string() + " > " +
                          log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

}  // namespace

TEST_CASE(
    "after a resume from an earlier checkpoint each step is logged once, and TensorBoard "
    "reads the same numbers") {
  TempDir tmp("observability-resume");
  const fs::path straight_job = write_job(tmp.path(), "straight");
  const fs::path split_job = write_job(tmp.path(), "split");
  const RunResult whole = run_dtrain(job_args(straight_job, 8), tmp.path() / "w.log");
  REQUIRE_MESSAGE(whole.rc == 0, whole.describe());
  // The split run also goes to step 8, then resumes from its step-4 checkpoint, as a
  // run does after a crash past a checkpoint: steps 5-8 were logged already, and the
  // crash tore the last metrics line.
  const RunResult first = run_dtrain(job_args(split_job, 8), tmp.path() / "a.log");
  REQUIRE_MESSAGE(first.rc == 0, first.describe());
  const fs::path split = tmp.path() / "split";
  { std::ofstream(split / "metrics.jsonl", std::ios::app) << "{\"step\": 9, \"lo"; }
  std::vector<std::string> again = job_args(split_job, 8);
  again.insert(again.end(),
               {"--resume", (split / "checkpoints" / "step-00000004.dtckpt").string()});
  const RunResult second = run_dtrain(again, tmp.path() / "b.log");
  REQUIRE_MESSAGE(second.rc == 0, second.describe());

  const std::vector<nlohmann::json> want = read_lines(tmp.path() / "straight" / "metrics.jsonl");
  const std::vector<nlohmann::json> got = read_lines(split / "metrics.jsonl");
  REQUIRE(got.size() == want.size());  // 8 train lines, 2 eval lines, the summary
  CHECK(want.size() == 11);
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].value("step", -1) == want[i].value("step", -1));
    CHECK(got[i].value("loss", 0.0) == want[i].value("loss", 0.0));  // bit for bit
    CHECK(got[i].value("test_loss", 0.0) == want[i].value("test_loss", 0.0));
  }

  // Two event files (one per run segment); over both, every train step once.
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(split / "tensorboard")) files.push_back(e.path());
  CHECK(files.size() == 2);
  std::multiset<int64_t> steps;
  for (const fs::path& f : files) {
    bool intact = false;
    for (const std::string& r : rt::read_event_records(f, &intact)) steps.insert(rt::event_step(r));
    CHECK(intact);
  }
  for (int64_t s = 1; s <= 8; ++s) CHECK(steps.count(s) == (s % 4 == 0 ? 2u : 1u));  // + eval

  const int rc = tensorboard_check(split, tmp.path() / "tb.log");
  CHECK_MESSAGE(rc == 0, read_bytes(tmp.path() / "tb.log"));
}

// A train line's loss is the mean over its logging window; a checkpoint in the middle
// of a window (step 4 of the window 4-6) keeps the window's part before it, so the
// resumed run's step-6 line is the uninterrupted run's, bit for bit.
TEST_CASE("a run resumed in the middle of a logging window logs the same mean loss") {
  TempDir tmp("observability-window");
  const auto args = [&](const fs::path& job) {
    return std::vector<std::string>{job.string(),
                                    "--set",
                                    "train.steps=9",
                                    "--set",
                                    "train.log_every=3",
                                    "--set",
                                    "train.checkpoint={every: 4, keep: 5}"};
  };
  const fs::path straight_job = write_job(tmp.path(), "straight");
  const fs::path split_job = write_job(tmp.path(), "split");
  const RunResult whole = run_dtrain(args(straight_job), tmp.path() / "w.log");
  REQUIRE_MESSAGE(whole.rc == 0, whole.describe());
  const RunResult first = run_dtrain(args(split_job), tmp.path() / "a.log");
  REQUIRE_MESSAGE(first.rc == 0, first.describe());
  std::vector<std::string> again = args(split_job);
  again.insert(
      again.end(),
      {"--resume", (tmp.path() / "split" / "checkpoints" / "step-00000004.dtckpt").string()});
  const RunResult second = run_dtrain(again, tmp.path() / "b.log");
  REQUIRE_MESSAGE(second.rc == 0, second.describe());
  const auto losses = [](const fs::path& metrics) {
    std::vector<std::pair<int64_t, double>> out;
    for (const nlohmann::json& j : read_lines(metrics))
      if (j.contains("loss")) out.emplace_back(j.at("step"), j.at("loss"));
    return out;
  };
  const auto want = losses(tmp.path() / "straight" / "metrics.jsonl");
  REQUIRE(want.size() == 3);  // steps 3, 6, 9
  CHECK(losses(tmp.path() / "split" / "metrics.jsonl") == want);
}

TEST_CASE("train lines carry the process's resident memory and CPU use") {
  TempDir tmp("observability-monitor");
  const fs::path job = write_job(tmp.path());
  const RunResult r = run_dtrain({job.string(), "--set", "train.steps=3"}, tmp.path() / "r.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  int train_lines = 0;
  for (const nlohmann::json& j : read_lines(tmp.path() / "run" / "metrics.jsonl")) {
    if (!j.contains("loss")) continue;
    ++train_lines;
    CHECK(j.value("host_rss_bytes", 0.0) > 1e7);  // the binary and a model: tens of MB at least
    CHECK(j.value("host_rss_bytes", 0.0) >= j.value("peak_host_bytes", 0.0) * 0.5);
    CHECK(j.value("cpu_util", 0.0) > 0.05);
    CHECK(j.value("cpu_util", 0.0) < 64);
    CHECK_FALSE(j.contains("gpu_util_percent"));  // a CPU job
  }
  CHECK(train_lines == 3);
}

TEST_CASE("event files: framing read back, a torn tail and later steps cut on resume") {
  TempDir tmp("observability-events");
  const fs::path dir = tmp.path() / "tb";
  fs::path first;
  {
    rt::EventWriter w(dir, -1);
    for (int64_t s = 1; s <= 5; ++s) w.scalars(s, {{"train/loss", 1.0 / s}, {"train/lr", 0.1}});
    first = w.file();
  }
  bool intact = false;
  std::vector<std::string> records = rt::read_event_records(first, &intact);
  CHECK(intact);
  REQUIRE(records.size() == 6);  // file_version, then steps 1-5
  CHECK(rt::event_step(records[0]) == 0);
  CHECK(rt::event_step(records[5]) == 5);
  const std::string bytes = read_bytes(first);
  write_bytes(first, bytes + bytes.substr(0, 20));  // a torn record at the end
  rt::read_event_records(first, &intact);
  CHECK_FALSE(intact);
  {
    rt::EventWriter w(dir, 3);  // a resume from step 3
    CHECK(w.file() != first);
  }
  records = rt::read_event_records(first, &intact);
  CHECK(intact);
  CHECK(records.size() == 4);  // file_version, steps 1-3
  // A flipped payload byte fails the record's CRC.
  std::string damaged = read_bytes(first);
  damaged[damaged.size() - 6] ^= 0x40;
  write_bytes(first, damaged);
  CHECK(rt::read_event_records(first, &intact).size() == 3);
  CHECK_FALSE(intact);
}

namespace {

struct Span {
  std::string name, cat;
  double ts = 0, dur = 0;
  int tid = 0;
  nlohmann::json args;
};

std::vector<Span> spans_of(const nlohmann::json& trace) {
  std::vector<Span> out;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    out.push_back({e.at("name"), e.value("cat", ""), e.at("ts"), e.at("dur"), e.at("tid"),
                   e.value("args", nlohmann::json::object())});
  }
  return out;
}

}  // namespace

TEST_CASE("logging.profile writes a Chrome trace of exactly the chosen steps") {
  TempDir tmp("observability-profile");
  const fs::path job = write_job(tmp.path());
  const RunResult r = run_dtrain(
      {job.string(), "--set", "train.steps=5", "--set", "logging.profile={start: 2, steps: 2}"},
      tmp.path() / "r.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(r.log.find("profile: steps 2-3 written to") != std::string::npos, r.log);
  const nlohmann::json trace =
      nlohmann::json::parse(read_bytes(tmp.path() / "run" / "trace-rank-0.json"));
  const std::vector<Span> spans = spans_of(trace);
  std::vector<Span> steps;
  for (const Span& s : spans)
    if (s.cat == "step") steps.push_back(s);
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].name == "step 2");
  CHECK(steps[1].name == "step 3");
  std::map<std::string, int> per_cat;
  std::map<int, int> forward_of_node;
  double op_time = 0;
  for (const Span& s : spans) {
    CAPTURE(s.name);
    ++per_cat[s.cat];
    // Everything happened inside one of the two steps: nothing from steps 1, 4, 5.
    bool inside = false;
    for (const Span& st : steps) inside |= s.ts >= st.ts && s.ts + s.dur <= st.ts + st.dur + 1;
    CHECK(inside);
    CHECK(s.dur >= 0);
    if (s.cat == "forward" || s.cat == "backward") {
      CHECK(s.args.at("bytes").get<double>() > 0);
      CHECK(s.args.at("flops").get<double>() >= 0);
      CHECK(!s.args.at("op").get<std::string>().empty());
      op_time += s.dur;
    }
    if (s.cat == "forward") ++forward_of_node[s.args.at("node").get<int>()];
  }
  CHECK(per_cat["optimizer"] == 2);
  CHECK(per_cat["data"] == 2);
  REQUIRE(!forward_of_node.empty());
  // Every node of the graph ran forward once per step (ids 0..N-1, twice each).
  CHECK(forward_of_node.begin()->first == 0);
  CHECK(forward_of_node.rbegin()->first + 1 == static_cast<int>(forward_of_node.size()));
  for (const auto& [node, n] : forward_of_node) CHECK(n == 2);
  CHECK(per_cat["backward"] > 0);
  CHECK(per_cat["backward"] <= per_cat["forward"]);
  CHECK(op_time <= steps[0].dur + steps[1].dur);
  // A memory counter after every op.
  int counters = 0;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "C") continue;
    ++counters;
    CHECK(e.at("args").at("host_bytes").get<double>() > 0);
  }
  CHECK(counters == per_cat["forward"] + per_cat["backward"]);

  // A run that stops inside the window (here: ends at step 2 of the window 2-3) and
  // resumes traces the rest into its own file; the first file stays as it was.
  const fs::path split = write_job(tmp.path(), "split");
  const std::vector<std::string> prof = {"--set", "logging.profile={start: 2, steps: 2}"};
  std::vector<std::string> first = {split.string(), "--set", "train.steps=2"};
  first.insert(first.end(), prof.begin(), prof.end());
  REQUIRE(run_dtrain(first, tmp.path() / "s1.log").rc == 0);
  const std::string before = read_bytes(tmp.path() / "split" / "trace-rank-0.json");
  std::vector<std::string> rest = {split.string(), "--set", "train.steps=5", "--resume", "latest"};
  rest.insert(rest.end(), prof.begin(), prof.end());
  const RunResult resumed = run_dtrain(rest, tmp.path() / "s2.log");
  REQUIRE_MESSAGE(resumed.rc == 0, resumed.describe());
  CHECK_MESSAGE(resumed.log.find("profile: steps 3-3 written to") != std::string::npos,
                resumed.log);
  CHECK(read_bytes(tmp.path() / "split" / "trace-rank-0.json") == before);
  std::vector<std::string> resumed_steps;
  for (const Span& sp : spans_of(nlohmann::json::parse(
           read_bytes(tmp.path() / "split" / "trace-rank-0-from-step-3.json"))))
    if (sp.cat == "step") resumed_steps.push_back(sp.name);
  CHECK(resumed_steps == std::vector<std::string>{"step 3"});
}

TEST_CASE("dtrain bench: figures checked against fp64, JSON, --compare gates on a threshold") {
  TempDir tmp("observability-bench");
  const fs::path out = tmp.path() / "now.json";
  const std::vector<std::string> quick = {"bench",   "--only",     "layernorm",
                                          "--dtype", "fp32,bf16",  "--min-time",
                                          "0.02",    "--max-time", "0.2"};
  std::vector<std::string> args = quick;
  args.insert(args.end(), {"--out", out.string()});
  const RunResult r = run_dtrain_command(args, tmp.path() / "bench.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const nlohmann::json doc = nlohmann::json::parse(read_bytes(out));
  CHECK(doc.at("schema") == "dtrain-bench/1");
  CHECK(doc.at("machine").at("fp32_peak_gflops").get<double>() > 0);
  CHECK(doc.at("machine").at("memory_gbytes_per_s").get<double>() > 0);
  REQUIRE(doc.at("results").size() == 2);  // layer norm in fp32 and bf16
  for (const nlohmann::json& f : doc.at("results")) {
    CHECK(f.at("name") == "layernorm/bert-base");
    CHECK(f.at("runs").get<int>() >= 1);
    CHECK(f.at("seconds_p10").get<double>() <= f.at("seconds_median").get<double>());
    CHECK(f.at("seconds_median").get<double>() <= f.at("seconds_p90").get<double>());
    CHECK(f.at("gbytes_per_s").get<double>() > 0);
    CHECK(f.at("check").at("ok").get<bool>());
    CHECK(f.at("check").at("samples").get<int>() > 0);
  }

  // A baseline 10x faster than now: every figure is slower, exit 1 with the table.
  nlohmann::json fast = doc;
  for (nlohmann::json& f : fast["results"])
    f["seconds_median"] = f["seconds_median"].get<double>() / 10;
  write_bytes(tmp.path() / "fast.json", fast.dump());
  args = quick;
  args.insert(args.end(), {"--compare", (tmp.path() / "fast.json").string()});
  RunResult c = run_dtrain_command(args, tmp.path() / "c1.log");
  CHECK_MESSAGE(c.rc == 1, c.describe());
  CHECK_MESSAGE(c.log.find("slower by more than 5%") != std::string::npos, c.log);
  // 10x slower: nothing regressed.
  nlohmann::json slow = doc;
  for (nlohmann::json& f : slow["results"])
    f["seconds_median"] = f["seconds_median"].get<double>() * 10;
  write_bytes(tmp.path() / "slow.json", slow.dump());
  args = quick;
  args.insert(args.end(), {"--compare", (tmp.path() / "slow.json").string(), "--threshold", "20%"});
  c = run_dtrain_command(args, tmp.path() / "c2.log");
  CHECK_MESSAGE(c.rc == 0, c.describe());
  CHECK_MESSAGE(c.log.find("layernorm/bert-base") != std::string::npos, c.log);
  // A baseline none of whose figures was measured now compares nothing: not a pass.
  nlohmann::json other = doc;
  for (nlohmann::json& f : other["results"]) f["name"] = "elsewhere";
  write_bytes(tmp.path() / "other.json", other.dump());
  args = quick;
  args.insert(args.end(), {"--compare", (tmp.path() / "other.json").string()});
  c = run_dtrain_command(args, tmp.path() / "c3.log");
  CHECK_MESSAGE(c.rc == 2, c.describe());
  CHECK_MESSAGE(c.log.find("nothing compared") != std::string::npos, c.log);

  // Bad input is exit 2 naming what is wrong.
  write_bytes(tmp.path() / "junk.json", "{\"results\": 3}");
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"bench", "--compare", (tmp.path() / "junk.json").string()}, "not a dtrain bench file"},
      {{"bench", "--compare", (tmp.path() / "none.json").string()}, "cannot read the baseline"},
      {{"bench", "--suite", "comm"}, "--suite comm: one process"},
      {{"bench", "--suite", "comm", "--nproc", "1"}, "--nproc 1"},
      {{"bench", "--suite", "kernels", "--nproc", "2"}, "--nproc with --suite kernels"},
      {{"bench", "--suite", "comm", "--nproc", "3", "--ranks-per-node", "2"},
       "--ranks-per-node 2 does not divide"},
      {{"bench", "--suite", "comm", "--nproc", "2", "--algorithms", "auto"}, "'auto'"},
      {{"bench", "--suite", "comm", "--nproc", "2", "--min-bytes", "0"}, "--min-bytes: \"0\""},
      {{"bench", "--suite", "comm", "--nproc", "2", "--min-bytes", "1MB", "--max-bytes", "4KiB"},
       "--min-bytes 1000000 --max-bytes 4096"},
      {{"bench", "--suite", "everything"}, "--suite everything"},
      {{"bench", "--suite", "models", "--models", "gpt3"}, "--models: 'gpt3'"},
      {{"bench", "--suite", "models", "--steps", "0"}, "--steps 0"},
      {{"bench", "--dtype", "fp64"}, "--dtype"},
      {{"bench", "--threshold", "lots"}, "--threshold"}};
  for (const auto& [a, says] : bad) {
    const RunResult b = run_dtrain_command(a, tmp.path() / "bad.log");
    CHECK_MESSAGE(b.rc == 2, b.describe());
    CHECK_MESSAGE(b.log.find(says) != std::string::npos, b.log);
  }
}

TEST_CASE("dtrain bench --suite models: step time, MFU and the peak beside the estimate") {
  TempDir tmp("observability-bench-models");
  const fs::path out = tmp.path() / "models.json";
  const RunResult r = run_dtrain_command({"bench", "--suite", "models", "--models", "gpt2",
                                          "--steps", "2", "--warmup", "0", "--out", out.string()},
                                         tmp.path() / "bench.log", 600);
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const nlohmann::json doc = nlohmann::json::parse(read_bytes(out));
  REQUIRE(doc.at("results").size() == 1);
  const nlohmann::json& m = doc.at("results")[0];
  CHECK(m.at("name") == "model/gpt2");
  CHECK(m.at("runs").get<int>() == 2);
  CHECK(m.at("seconds_median").get<double>() > 0);
  CHECK(m.at("tokens_per_s").get<double>() ==
        doctest::Approx(m.at("samples_per_s").get<double>() * 64));
  CHECK(m.at("mfu").get<double>() > 0);
  CHECK(m.at("mfu").get<double>() < 1);
  // The measured peak of the real trainer beside dtrain estimate's (tested to 3% elsewhere).
  CHECK(m.at("estimate_ratio").get<double>() == doctest::Approx(1.0).epsilon(0.03));
  CHECK(m.at("roofline_seconds").get<double>() > 0);
}

namespace {

// data-series -> data-points of every polyline in the report.
std::map<std::string, std::vector<std::pair<int64_t, double>>> drawn_series(
    const std::string& html) {
  std::map<std::string, std::vector<std::pair<int64_t, double>>> out;
  const std::string tag = "<polyline data-series=\"";
  for (size_t at = html.find(tag); at != std::string::npos; at = html.find(tag, at + 1)) {
    const size_t name_end = html.find('"', at + tag.size());
    const std::string name = html.substr(at + tag.size(), name_end - at - tag.size());
    const size_t p = html.find("data-points=\"", name_end) + 13;
    std::istringstream pts(html.substr(p, html.find('"', p) - p));
    for (std::string item; pts >> item;) {
      const size_t colon = item.find(':');
      out[name].emplace_back(std::stoll(item.substr(0, colon)), std::stod(item.substr(colon + 1)));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the run report: drawn from metrics.jsonl, self-contained, rendered by Chromium") {
  TempDir tmp("observability-report");
  const fs::path job = write_job(tmp.path());
  const RunResult r =
      run_dtrain({job.string(), "--set", "train.steps=6", "--set", "train.eval_every=2"},
                 tmp.path() / "r.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const fs::path run = tmp.path() / "run";
  const std::string html = read_bytes(run / "report.html");  // every run writes one
  // Self-contained: no script, nothing fetched (the SVG namespace is a name, not a fetch).
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("src=") == std::string::npos);
  CHECK(html.find("href=") == std::string::npos);
  CHECK(html.find("url(") == std::string::npos);
  CHECK(html.find("<svg") != std::string::npos);

  // Every drawn point is metrics.jsonl's value at that step.
  const auto drawn = drawn_series(html);
  const std::vector<std::tuple<std::string, std::string, double, bool>> checks = {
      {"train loss", "loss", 1.0, false},
      {"test loss", "test_loss", 1.0, true},
      {"test accuracy", "test_accuracy", 100.0, true},
      {"lr", "lr", 1.0, false},
      {"samples/s", "samples_per_s", 1.0, false}};
  for (const auto& [series, key, scale, eval] : checks) {
    CAPTURE(series);
    REQUIRE(drawn.count(series) == 1);
    std::vector<std::pair<int64_t, double>> want;
    for (const nlohmann::json& j : read_lines(run / "metrics.jsonl")) {
      if (j.value("summary", false) || j.value("eval", false) != eval || !j.contains(key)) continue;
      want.emplace_back(j.at("step").get<int64_t>(), j.at(key).get<double>() * scale);
    }
    const auto& got = drawn.at(series);
    REQUIRE(got.size() == want.size());
    CHECK(want.size() == (eval ? 3u : 6u));  // evaluations at steps 2, 4 and the end
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].first == want[i].first);
      CHECK(got[i].second == doctest::Approx(want[i].second).epsilon(1e-8));
    }
  }

  // `dtrain report` gives the same page; a directory without metrics is exit 2.
  const RunResult again =
      run_dtrain_command({"report", run.string(), "--out", (tmp.path() / "again.html").string()},
                         tmp.path() / "report.log");
  REQUIRE_MESSAGE(again.rc == 0, again.describe());
  CHECK(read_bytes(tmp.path() / "again.html") == html);
  const RunResult bad =
      run_dtrain_command({"report", (tmp.path() / "nothing").string()}, tmp.path() / "bad.log");
  CHECK_MESSAGE(bad.rc == 2, bad.describe());
  CHECK_MESSAGE(bad.log.find("metrics.jsonl") != std::string::npos, bad.log);

  // A run still going, stopped or killed has no summary line, and a damaged file may hold
  // anything: the report draws what is there (a line, or a field, of the wrong kind is
  // left out), never aborts. Here: the first four lines, then foreign and damaged ones.
  {
    const fs::path cut = tmp.path() / "cut";
    fs::create_directories(cut);
    std::ifstream in(run / "metrics.jsonl");
    std::ofstream out(cut / "metrics.jsonl");
    std::string line;
    for (int i = 0; i < 4 && std::getline(in, line); ++i) out << line << "\n";
    out << "garbage\n{}\n[1,2]\n{\"step\":\"x\",\"loss\":1}\n{\"step\":9,\"loss\":\"y\"}\n"
        << "{\"summary\":\"yes\",\"memory_estimate\":3}\n{\"eval\":1,\"step\":9}\n";
  }
  const RunResult partial =
      run_dtrain_command({"report", (tmp.path() / "cut").string()}, tmp.path() / "cut.log");
  REQUIRE_MESSAGE(partial.rc == 0, partial.describe());
  const auto cut_drawn = drawn_series(read_bytes(tmp.path() / "cut" / "report.html"));
  REQUIRE(cut_drawn.count("train loss") == 1);
  std::vector<int64_t> cut_steps;
  for (const auto& [step, loss] : cut_drawn.at("train loss")) cut_steps.push_back(step);
  CHECK(cut_steps == std::vector<int64_t>{1, 2, 3});  // step 2's eval line was the fourth

  // The communication share of a step: comm_time_s sums the window's steps, step_time_s
  // is one step's; a line from before window_steps was written counts the steps since the
  // line before it.
  {
    const fs::path comm = tmp.path() / "comm";
    fs::create_directories(comm);
    std::ofstream(comm / "metrics.jsonl")
        << "{\"step\":10,\"loss\":1,\"step_time_s\":0.1,\"window_steps\":10,"
           "\"comm_time_s\":0.5,\"exposed_comm_s\":0.2}\n"
        << "{\"step\":30,\"loss\":1,\"step_time_s\":0.1,\"comm_time_s\":0.4,"
           "\"exposed_comm_s\":0.1}\n";
  }
  const RunResult shares =
      run_dtrain_command({"report", (tmp.path() / "comm").string()}, tmp.path() / "comm.log");
  REQUIRE_MESSAGE(shares.rc == 0, shares.describe());
  const auto comm_drawn = drawn_series(read_bytes(tmp.path() / "comm" / "report.html"));
  REQUIRE(comm_drawn.count("communication") == 1);
  const auto& share = comm_drawn.at("communication");
  REQUIRE(share.size() == 2);
  CHECK(share[0].second == doctest::Approx(50.0));  // 0.5 s over 10 steps of 0.1 s
  CHECK(share[1].second == doctest::Approx(20.0));  // 0.4 s over the 20 steps since step 10
  CHECK(comm_drawn.at("exposed")[0].second == doctest::Approx(20.0));

  // Headless Chromium draws it: a screenshot with the charts' lines in it.
  const std::string cmd = std::string(DTRAIN_SOURCE_DIR) + "/tests/scripts/report-screenshot.sh " +
                          (run / "report.html").string() + " " +
                          (tmp.path() / "shot.png").string() + " > " +
                          (tmp.path() / "shot.log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const bool drawn_ok = WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
  CHECK_MESSAGE(drawn_ok, read_bytes(tmp.path() / "shot.log"));
}
