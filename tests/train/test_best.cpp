// train.best end to end: the best evaluation's checkpoint stays out of the rotation and
// best.json names it; `--checkpoint best` and `--resume best` read it; the run ends
// early after `patience` evaluations without a gain. The best step and the stop step
// are worked out here from the logged evaluations, not taken from the trainer. A run
// split before the stop and resumed keeps comparing with the same best: the same
// losses, stop, record and final state as the run done in one go.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"

using namespace dtrain::train_test;

namespace {

struct Eval {
  int64_t step;
  double loss, accuracy;
};

std::vector<Eval> evals(const fs::path& metrics) {
  std::vector<Eval> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("eval", false))
      out.push_back({j.at("step"), j.at("test_loss"), j.at("test_accuracy")});
  }
  return out;
}

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file);
  REQUIRE_MESSAGE(in.good(), file.string());
  return nlohmann::json::parse(in);
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string checkpoint_name(int64_t step) {
  std::string digits = std::to_string(step);
  return "step-" + std::string(8 - digits.size(), '0') + digits + ".dtckpt";
}

// The best (the first lowest loss) and the stop from the logged evaluations, by the
// rule docs/checkpoints.md states: the run ends at the `patience`-th evaluation in a
// row that is not below `min_delta` under the last evaluation that was (-1: no stop).
struct Expected {
  Eval best;
  int64_t stop = -1;
};
Expected expected(const std::vector<Eval>& ev, int patience, double min_delta) {
  Expected x{ev.at(0)};
  double reference = ev[0].loss;
  int stale = 0;
  for (size_t i = 1; i < ev.size() && x.stop < 0; ++i) {
    if (ev[i].loss < x.best.loss) x.best = ev[i];
    if (ev[i].loss < reference - min_delta) {
      reference = ev[i].loss;
      stale = 0;
    } else if (++stale == patience) {
      x.stop = ev[i].step;
    }
  }
  return x;
}

// A learning rate that trains, then overshoots: the test loss falls and then rises.
std::vector<std::string> best_args(const fs::path& job, int steps) {
  return {job.string(),
          "--set",
          "optimizer.lr=0.3",
          "--set",
          "train.steps=" + std::to_string(steps),
          "--set",
          "train.eval_every=2",
          "--set",
          "train.checkpoint={every: 10, keep: 1}",
          "--set",
          "train.best={metric: loss, patience: 4}",
          "--set",
          "data.workers=0"};
}

}  // namespace

TEST_CASE(
    "the best evaluation (train.best): its checkpoint kept, the run ended after patience "
    "evaluations without a gain, a resumed run comparing with the same best") {
  TempDir tmp("best");
  const fs::path job = write_job(tmp.path(), "straight");
  const RunResult whole = run_dtrain(best_args(job, 40), tmp.path() / "w.log");
  REQUIRE_MESSAGE(whole.rc == 0, whole.describe());
  const fs::path run = tmp.path() / "straight";

  const std::vector<Eval> ev = evals(run / "metrics.jsonl");
  REQUIRE(ev.size() >= 5);
  const Expected x = expected(ev, 4, 0.0);
  const Eval best = x.best;
  const int64_t stop = x.stop;
  REQUIRE_MESSAGE(stop > 0, "the run never stopped improving: choose a larger optimizer.lr");
  CHECK(ev.back().step == stop);  // nothing evaluated after the stop
  CHECK(read_losses(run / "metrics.jsonl").back().step == stop);  // its last window logged
  CHECK(whole.log.find("stopped early at step " + std::to_string(stop) + " of 40") !=
        std::string::npos);

  const nlohmann::json summary = read_json(run / "summary.json");
  CHECK(summary.at("steps") == stop);
  CHECK(summary.at("stopped_early") == true);
  CHECK(summary.at("best").at("step") == best.step);
  CHECK(summary.at("best").at("test_loss") == best.loss);
  const nlohmann::json record = read_json(run / "checkpoints" / "best.json");
  CHECK(record.at("step") == best.step);
  CHECK(record.at("metric") == "loss");
  CHECK(record.at("test_loss") == best.loss);
  CHECK(record.at("checkpoint") == checkpoint_name(best.step));
  // keep: 1 is the newest (the stop's), and the best beside it; the every-10 ones went.
  std::vector<std::string> want = {"best.json", checkpoint_name(best.step), checkpoint_name(stop)};
  if (best.step == stop) want.erase(want.begin() + 2);
  std::sort(want.begin(), want.end());
  CHECK(names_in(run / "checkpoints") == want);
  // The report draws the best on the loss chart and says the run stopped early.
  const std::string report = read_bytes(run / "report.html");
  CHECK(report.find("best, step " + std::to_string(best.step) + " (stopped early)") !=
        std::string::npos);
  CHECK(report.find("steps; stopped early (train.best.patience)") != std::string::npos);

  SUBCASE("--checkpoint best reads it: predict gives the best evaluation's loss") {
    const RunResult p = run_dtrain_command(
        {"predict", job.string(), "--split", "test", "--checkpoint", "best", "--json"},
        tmp.path() / "p.log");
    REQUIRE_MESSAGE(p.rc == 0, p.describe());
    const nlohmann::json out = nlohmann::json::parse(p.log.substr(p.log.find("{\n")));
    CHECK(out.at("step") == best.step);
    CHECK(out.at("loss").get<double>() == doctest::Approx(best.loss).epsilon(1e-6));
    // ckpt inspect shows what the stop's checkpoint carries of it.
    const RunResult i = run_dtrain_command(
        {"ckpt", "inspect", (run / "checkpoints" / checkpoint_name(stop)).string(), "--json"},
        tmp.path() / "i.log");
    REQUIRE_MESSAGE(i.rc == 0, i.describe());
    const nlohmann::json b = nlohmann::json::parse(i.log.substr(i.log.find('{'))).at("best_eval");
    CHECK(b.at("step") == best.step);
    CHECK(b.at("stale_evals") == 4);
    CHECK(b.at("stopped_early") == true);
    // Listing the directory marks the best.
    const RunResult l = run_dtrain_command(
        {"ckpt", "inspect", (run / "checkpoints").string(), "--json"}, tmp.path() / "l.log");
    REQUIRE_MESSAGE(l.rc == 0, l.describe());
    int marked = 0;
    const nlohmann::json listed = nlohmann::json::parse(l.log.substr(l.log.find('{')));
    for (const nlohmann::json& row : listed.at("checkpoints"))
      if (row.at("best").get<bool>()) marked += row.at("step") == best.step ? 1 : 100;
    CHECK_MESSAGE(marked == 1, l.log);
  }

  SUBCASE("a resume of the stopped run trains nothing and changes nothing") {
    const auto before = snapshot(run);
    std::vector<std::string> again = best_args(job, 40);
    again.insert(again.end(), {"--resume", "latest"});
    const RunResult r = run_dtrain(again, tmp.path() / "again.log");
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    CHECK(r.log.find("the run stopped early at step " + std::to_string(stop)) != std::string::npos);
    CHECK(changed_files(before, snapshot(run)) == "");
  }

  SUBCASE("more patience on resume trains on; another metric starts the comparison anew") {
    std::vector<std::string> more = best_args(job, 40);
    more.insert(more.end(), {"--set", "train.best.patience=100", "--resume", "latest"});
    const RunResult r = run_dtrain(more, tmp.path() / "more.log");
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    const nlohmann::json s = read_json(run / "summary.json");
    CHECK(s.at("steps") == 40);
    CHECK(s.at("stopped_early") == false);
    std::vector<std::string> other = best_args(job, 40);
    other.insert(other.end(), {"--set", "train.steps=44", "--set", "train.best.metric=accuracy",
                               "--resume", "latest"});
    const RunResult a = run_dtrain(other, tmp.path() / "other.log");
    REQUIRE_MESSAGE(a.rc == 0, a.describe());
    CHECK_MESSAGE(a.log.find("the comparison starts anew") != std::string::npos, a.log);
    CHECK(read_json(run / "summary.json").at("best").at("metric") == "accuracy");
  }

  SUBCASE("a run that ended as its patience ran out, extended, stops there as the longer run") {
    const fs::path ext_job = write_job(tmp.path(), "extended");
    const RunResult a =
        run_dtrain(best_args(ext_job, static_cast<int>(stop)), tmp.path() / "e1.log");
    REQUIRE_MESSAGE(a.rc == 0, a.describe());
    const fs::path ext = tmp.path() / "extended";
    CHECK(read_json(ext / "summary.json").at("stopped_early") == false);  // its last step
    CHECK(read_json(ext / "summary.json").at("best").at("evaluations_since_gain") == 4);
    std::vector<std::string> longer = best_args(ext_job, 40);
    longer.insert(longer.end(), {"--resume", "latest"});
    const RunResult b = run_dtrain(longer, tmp.path() / "e2.log");
    REQUIRE_MESSAGE(b.rc == 0, b.describe());
    CHECK_MESSAGE(
        b.log.find("stopped early at step " + std::to_string(stop) + " of 40") != std::string::npos,
        b.log);
    const nlohmann::json s = read_json(ext / "summary.json");
    CHECK(s.at("steps") == stop);
    CHECK(s.at("stopped_early") == true);
    CHECK(s.at("test_loss") == ev.back().loss);  // the stop's evaluation, again
    const auto expected_losses = read_losses(run / "metrics.jsonl");
    const auto extended = read_losses(ext / "metrics.jsonl");
    CHECK_MESSAGE(first_difference(expected_losses, extended) == "",
                  first_difference(expected_losses, extended));
    // The stop is in its checkpoint now: resuming again trains and writes nothing.
    const auto before = snapshot(ext);
    const RunResult c = run_dtrain(longer, tmp.path() / "e3.log");
    REQUIRE_MESSAGE(c.rc == 0, c.describe());
    CHECK_MESSAGE(
        c.log.find("the run stopped early at step " + std::to_string(stop)) != std::string::npos,
        c.log);
    CHECK(changed_files(before, snapshot(ext)) == "");
  }

  SUBCASE("min_delta: a gain must pass it, counted from the last gain that did") {
    const fs::path other_job = write_job(tmp.path(), "delta");
    std::vector<std::string> args = best_args(other_job, 40);
    args.insert(args.end(), {"--set", "train.best={metric: loss, patience: 2, min_delta: 0.05}"});
    const RunResult r = run_dtrain(args, tmp.path() / "delta.log");
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    const std::vector<Eval> dev = evals(tmp.path() / "delta" / "metrics.jsonl");
    const Expected dx = expected(dev, 2, 0.05);
    REQUIRE(dx.stop > 0);
    CHECK(dev.back().step == dx.stop);
    const nlohmann::json s = read_json(tmp.path() / "delta" / "summary.json");
    CHECK(s.at("steps") == dx.stop);
    CHECK(s.at("best").at("step") == dx.best.step);
  }

  SUBCASE("split before the stop and resumed: the same run") {
    const int64_t split = stop - 4;  // after at least one evaluation, before the stop
    REQUIRE(split >= 2);
    const fs::path split_job = write_job(tmp.path(), "split");
    const RunResult a =
        run_dtrain(best_args(split_job, static_cast<int>(split)), tmp.path() / "a.log");
    REQUIRE_MESSAGE(a.rc == 0, a.describe());
    std::vector<std::string> rest = best_args(split_job, 40);
    rest.insert(rest.end(), {"--resume", "latest"});
    const RunResult b = run_dtrain(rest, tmp.path() / "b.log");
    REQUIRE_MESSAGE(b.rc == 0, b.describe());
    const fs::path other = tmp.path() / "split";
    const auto expected = read_losses(run / "metrics.jsonl");
    const auto resumed = read_losses(other / "metrics.jsonl");
    CHECK_MESSAGE(first_difference(expected, resumed) == "", first_difference(expected, resumed));
    CHECK(read_json(other / "summary.json").at("steps") == stop);
    CHECK(read_json(other / "checkpoints" / "best.json") == record);
    CHECK(names_in(other / "checkpoints") == want);
    const std::string diff = compare_checkpoints(run / "checkpoints" / checkpoint_name(stop),
                                                 other / "checkpoints" / checkpoint_name(stop));
    CHECK_MESSAGE(diff == "", diff);
  }

  SUBCASE("--resume best goes back to it and stops at the same step again") {
    std::vector<std::string> back = best_args(job, 40);
    back.insert(back.end(), {"--resume", "best"});
    const RunResult r = run_dtrain(back, tmp.path() / "back.log");
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    CHECK_MESSAGE(r.log.find(checkpoint_name(best.step) + " at step " +
                             std::to_string(best.step)) != std::string::npos,
                  r.log);
    CHECK(read_json(run / "summary.json").at("steps") == stop);
    if (best.step != stop)  // the checkpoint of the abandoned continuation, set aside
      CHECK(fs::exists(run / "checkpoints" / "abandoned" /
                       ("from-step-" + std::to_string(best.step)) / checkpoint_name(stop)));
    CHECK(read_json(run / "checkpoints" / "best.json") == record);
  }
}

TEST_CASE(
    "the best evaluation by accuracy without keeping its checkpoint, and what train.best refuses") {
  TempDir tmp("best-accuracy");
  const fs::path job = write_job(tmp.path(), "run");
  const RunResult r =
      run_dtrain({job.string(), "--set", "train.steps=12", "--set", "train.eval_every=3", "--set",
                  "train.best={metric: accuracy, keep_checkpoint: false}"},
                 tmp.path() / "r.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const std::vector<Eval> ev = evals(tmp.path() / "run" / "metrics.jsonl");
  REQUIRE(ev.size() == 4);  // steps 3, 6, 9 and the end
  Eval best = ev[0];
  for (const Eval& e : ev)
    if (e.accuracy > best.accuracy) best = e;
  const nlohmann::json summary = read_json(tmp.path() / "run" / "summary.json");
  CHECK(summary.at("best").at("metric") == "accuracy");
  CHECK(summary.at("best").at("step") == best.step);
  CHECK(summary.at("stopped_early") == false);
  CHECK_FALSE(fs::exists(tmp.path() / "run" / "checkpoints" / "best.json"));
  CHECK(names_in(tmp.path() / "run" / "checkpoints") ==
        std::vector<std::string>{checkpoint_name(12)});

  const RunResult p = run_dtrain_command(
      {"predict", job.string(), "--split", "test", "--checkpoint", "best"}, tmp.path() / "p.log");
  CHECK(p.rc == 2);
  CHECK_MESSAGE(p.log.find("best.json") != std::string::npos, p.log);
  // A record at odds with itself, or with a step that is no step, is refused by name.
  const fs::path record = tmp.path() / "run" / "checkpoints" / "best.json";
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"{\"step\": 12, \"checkpoint\": \"step-00000009.dtckpt\"}", "disagree"},
           {"{\"step\": 12.5}", "not a best-checkpoint record"}}) {
    write_bytes(record, text);
    const RunResult odd = run_dtrain_command(
        {"predict", job.string(), "--split", "test", "--checkpoint", "best"}, tmp.path() / "o.log");
    CHECK(odd.rc == 2);
    CHECK_MESSAGE(odd.log.find(says) != std::string::npos, odd.log);
  }
  fs::remove(record);

  const RunResult no_eval = run_dtrain_command(
      {"validate", job.string(), "--set", "train.best.metric=loss"}, tmp.path() / "v1.log");
  CHECK(no_eval.rc == 2);
  CHECK_MESSAGE(no_eval.log.find("train.best.metric") != std::string::npos, no_eval.log);
  CHECK_MESSAGE(no_eval.log.find("train.eval_every") != std::string::npos, no_eval.log);
  const RunResult no_metric = run_dtrain_command(
      {"validate", job.string(), "--set", "train.best.patience=3"}, tmp.path() / "v2.log");
  CHECK(no_metric.rc == 2);
  CHECK_MESSAGE(no_metric.log.find("train.best.patience") != std::string::npos, no_metric.log);
  // An evaluation only after the last step (the job trains 8 steps) leaves nothing to compare.
  const RunResult late = run_dtrain_command(
      {"validate", job.string(), "--set", "train.best.metric=loss", "--set", "train.eval_every=8"},
      tmp.path() / "v3.log");
  CHECK(late.rc == 2);
  CHECK_MESSAGE(late.log.find("train.eval_every") != std::string::npos, late.log);
}
