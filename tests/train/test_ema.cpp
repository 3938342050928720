// optimizer.ema end to end, on the tiny ResNet of the trainer's tests: keeping the
// average changes no bit of the training (losses, trained weights); evaluations are of
// the average and exchanging it in and out changes no bit either (a run without
// evaluations ends with the same checkpoint); a run split and resumed ends with the
// uninterrupted run's checkpoint, the average included; a checkpoint resumes with the
// average switched on or off; `dtrain predict --weights ema|model` and `ckpt export
// --weights` read the average or the weights, and predict's test-split loss is the
// trainer's evaluation of each; the estimate counts the average as the allocator
// measures it; bad settings exit 2 naming the key.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"
#include "runtime/checkpoint.h"
#include "runtime/train_state.h"
#include "same_run.h"

using namespace dtrain::train_test;
namespace runtime = dtrain::runtime;

namespace {

const std::vector<std::string> kEma = {"--set", "optimizer.ema.decay=0.8"};

std::vector<nlohmann::json> eval_lines(const fs::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("eval", false)) out.push_back(std::move(j));
  }
  return out;
}

bool has_tensor(const runtime::Checkpoint& ck, const std::string& name) {
  for (const runtime::NamedTensor& t : ck.tensors)
    if (t.name == name) return true;
  return false;
}

bool same_bytes(const dtrain::Tensor& a, const dtrain::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

nlohmann::json predict_split(const fs::path& tmp, const fs::path& job,
                             const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"predict", job.string(), "--split", "test", "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  const RunResult r = run_dtrain_command(args, tmp / "predict.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const size_t at = r.log.find("{\n");  // after any note on stderr
  REQUIRE_MESSAGE(at != std::string::npos, r.log);
  return nlohmann::json::parse(r.log.substr(at));
}

// <dir>/step-0000000N.dtckpt, which must exist.
fs::path list_step_checkpoint(const fs::path& dir, int step) {
  const std::string digits = std::to_string(step);
  const fs::path file = dir / ("step-" + std::string(8 - digits.size(), '0') + digits + ".dtckpt");
  REQUIRE_MESSAGE(fs::exists(file), file.string());
  return file;
}

double memory_item(const fs::path& run, const std::string& kind) {
  const nlohmann::json s = nlohmann::json::parse(read_bytes(run / "summary.json"));
  return s.at("memory_estimate").at("by_kind").value(kind, 0.0);
}

}  // namespace

TEST_CASE("optimizer.ema: the average is evaluated and kept, training unchanged, resumed exactly") {
  TempDir tmp("ema");
  const fs::path job = write_job(tmp.path(), "run");
  // The run at tmp/name (its console in tmp/name.log), which must succeed.
  const auto train = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.begin(),
                 {"--set", "train.eval_every=4", "--set", "train.checkpoint.every=4"});
    return run_job(job, tmp.path(), name, 1, extra);
  };
  const auto with_ema = [](std::vector<std::string> extra) {
    extra.insert(extra.begin(), kEma.begin(), kEma.end());
    return extra;
  };
  const auto final_checkpoint = [&](const std::string& name) {
    return runtime::read_any_checkpoint(newest_checkpoint(tmp.path() / name / "checkpoints"));
  };
  train("plain", {});
  train("ema", with_ema({}));
  const fs::path plain = tmp.path() / "plain", ema = tmp.path() / "ema";

  // The same training, bit for bit: the losses and the trained weights.
  CHECK(first_difference(read_losses(plain / "metrics.jsonl"), read_losses(ema / "metrics.jsonl"))
            .empty());
  const runtime::Checkpoint cp = final_checkpoint("plain"), ce = final_checkpoint("ema");
  CHECK_FALSE(has_tensor(cp, "optim.ema"));
  REQUIRE(has_tensor(ce, "optim.ema"));
  CHECK(same_bytes(cp.get("params.f32"), ce.get("params.f32")));
  CHECK_FALSE(same_bytes(ce.get("params.f32"), ce.get("optim.ema")));

  // Evaluations of the average: another loss than the weights' at the same step.
  const std::vector<nlohmann::json> ep = eval_lines(plain / "metrics.jsonl"),
                                    ee = eval_lines(ema / "metrics.jsonl");
  REQUIRE(ep.size() == 2);
  REQUIRE(ee.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(ep[i].at("weights") == "model");
    CHECK(ee[i].at("weights") == "ema");
    CHECK(ep[i].at("test_loss").get<double>() != ee[i].at("test_loss").get<double>());
  }
  const nlohmann::json summary = nlohmann::json::parse(read_bytes(ema / "summary.json"));
  CHECK(summary.at("test_weights") == "ema");
  CHECK(read_bytes(ema / "report.html").find("test loss (EMA weights)") != std::string::npos);
  CHECK(read_bytes(plain / "report.html").find("EMA weights") == std::string::npos);

  // Exchanging the average in for each evaluation and back changes no bit: a run that
  // never evaluates ends with the same checkpoint, the average included.
  train("ema-quiet", with_ema({"--set", "train.eval_every=null"}));
  CHECK(compare_checkpoints(newest_checkpoint(ema / "checkpoints"),
                            newest_checkpoint(tmp.path() / "ema-quiet" / "checkpoints")) == "");

  // Split at step 4 and resumed: the uninterrupted run's checkpoint and evaluations.
  train("split", with_ema({"--set", "train.steps=4"}));
  train("split", with_ema({"--resume", "latest"}));
  CHECK(compare_checkpoints(newest_checkpoint(ema / "checkpoints"),
                            newest_checkpoint(tmp.path() / "split" / "checkpoints")) == "");
  const std::vector<nlohmann::json> es = eval_lines(tmp.path() / "split" / "metrics.jsonl");
  REQUIRE(es.size() == 2);
  CHECK(es[1].at("test_loss").get<double>() == ee[1].at("test_loss").get<double>());

  // predict reads the average by default (auto), or the weights: each gives the
  // trainer's evaluation of it.
  const fs::path ckpt = newest_checkpoint(ema / "checkpoints");
  const double ema_loss = ee[1].at("test_loss"), model_loss = ep[1].at("test_loss");
  for (const auto& [extra, loss] :
       {std::pair{std::vector<std::string>{}, ema_loss},
        std::pair{std::vector<std::string>{"--weights", "ema"}, ema_loss},
        std::pair{std::vector<std::string>{"--weights", "model"}, model_loss}}) {
    std::vector<std::string> args = {"--checkpoint", ckpt.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const nlohmann::json p = predict_split(tmp.path(), job, args);
    CAPTURE(p.at("weights").get<std::string>());
    CHECK(std::fabs(p.at("loss").get<double>() / loss - 1) < 1e-5);
    CHECK(p.at("weights") == ckpt.string());  // the path alone: "ema" says which weights
    CHECK(p.at("ema") == (loss == ema_loss));
  }
  // ckpt inspect says which checkpoints hold an average.
  for (const auto& [run, holds] : {std::pair{ema, true}, std::pair{plain, false}}) {
    const RunResult i = run_dtrain_command(
        {"ckpt", "inspect", "--json", newest_checkpoint(run / "checkpoints").string()},
        tmp.path() / "inspect.log");
    REQUIRE_MESSAGE(i.rc == 0, i.describe());
    CHECK(nlohmann::json::parse(i.log.substr(i.log.find('{'))).at("ema") == holds);
  }
  // ckpt export --weights ema writes the average, which predicts as the checkpoint does.
  const fs::path exported = tmp.path() / "ema.safetensors";
  const RunResult x = run_dtrain_command(
      {"ckpt", "export", ckpt.string(), "--safetensors", exported.string(), "--weights", "ema"},
      tmp.path() / "export.log");
  REQUIRE_MESSAGE(x.rc == 0, x.describe());
  CHECK(x.log.find("EMA weights") != std::string::npos);
  const nlohmann::json pe = predict_split(tmp.path(), job, {"--checkpoint", exported.string()});
  CHECK(std::fabs(pe.at("loss").get<double>() / ema_loss - 1) < 1e-5);
  CHECK(pe.at("ema") == true);  // the export's metadata says what it holds
  const RunResult pm = run_dtrain_command({"predict", job.string(), "--split", "test",
                                           "--checkpoint", exported.string(), "--weights", "model"},
                                          tmp.path() / "pm.log");
  CHECK_MESSAGE(pm.rc == 2, pm.describe());
  CHECK_MESSAGE(pm.log.find("holds one set of weights") != std::string::npos, pm.log);

  // The estimate counts the average as one more f32 copy of the weights (here the size
  // of SGD's momentum), and the allocator's peak grows by as much.
  const double item = memory_item(ema, "EMA weights");
  CHECK(item > 0);
  CHECK(item == memory_item(ema, "optimizer state"));
  CHECK(summary_value(ema, "peak_host_bytes") - summary_value(plain, "peak_host_bytes") == item);

  // A checkpoint without an average resumes with one (started from the resumed
  // weights), and one with an average resumes without it (not read): the training
  // is the plain run's either way.
  fs::create_directories(tmp.path() / "on" / "checkpoints");
  fs::create_directories(tmp.path() / "off" / "checkpoints");
  const fs::path step4 = list_step_checkpoint(plain / "checkpoints", 4);
  fs::copy_file(step4, tmp.path() / "on" / "checkpoints" / step4.filename());
  fs::copy_file(plain / "metrics.jsonl", tmp.path() / "on" / "metrics.jsonl");  // cut at 4
  const fs::path step4e = list_step_checkpoint(ema / "checkpoints", 4);
  fs::copy_file(step4e, tmp.path() / "off" / "checkpoints" / step4e.filename());
  train("on", with_ema({"--resume", "latest"}));
  CHECK(read_bytes(tmp.path() / "on.log").find("holds no average of the weights") !=
        std::string::npos);
  // Its report draws the evaluation before the resume (of the weights) and the one after
  // (of the average) as two series.
  const std::string report = read_bytes(tmp.path() / "on" / "report.html");
  CHECK(report.find(">test loss<") != std::string::npos);
  CHECK(report.find(">test loss (EMA weights)<") != std::string::npos);
  train("off", {"--resume", "latest"});
  CHECK(read_bytes(tmp.path() / "off.log")
            .find("holds an average of the weights that this job does not keep") !=
        std::string::npos);
  const runtime::Checkpoint con = final_checkpoint("on"), coff = final_checkpoint("off");
  CHECK(has_tensor(con, "optim.ema"));
  CHECK_FALSE(has_tensor(coff, "optim.ema"));
  CHECK(same_bytes(con.get("params.f32"), cp.get("params.f32")));
  CHECK(same_bytes(coff.get("params.f32"), cp.get("params.f32")));
}

// The average starts as the weights as soon as they are set, not at the first applied
// step: fp16 steps skipped for overflow (a loss scale far too high) leave the weights
// as they were, and the checkpoints written meanwhile hold them as the average, never
// the zeros of a buffer not started yet.
TEST_CASE("optimizer.ema: a checkpoint before any applied step holds the weights as the average") {
  TempDir tmp("ema-start");
  const fs::path job = write_job(tmp.path(), "run");
  const RunResult r =
      run_dtrain({job.string(), "--set", "train.steps=2", "--set", "train.checkpoint.every=1",
                  "--set", "optimizer.ema.decay=0.9", "--set", "precision.dtype=fp16", "--set",
                  "precision.loss_scale.mode=dynamic", "--set", "precision.loss_scale.init=1.0e30",
                  "--set", "precision.loss_scale.max=1.0e30"},
                 tmp.path() / "run.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  REQUIRE(r.log.find("step skipped") != std::string::npos);
  for (int step : {1, 2}) {
    CAPTURE(step);
    const runtime::Checkpoint ck = runtime::read_any_checkpoint(
        list_step_checkpoint(tmp.path() / "run" / "checkpoints", step));
    REQUIRE(has_tensor(ck, "optim.ema"));
    CHECK(same_bytes(ck.get("params.f32"), ck.get("optim.ema")));
  }
}

TEST_CASE("optimizer.ema: bad settings and a missing average exit 2 naming the key or file") {
  TempDir tmp("ema-bad");
  const fs::path job = write_job(tmp.path(), "run");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--set", "optimizer.ema.decay=1"}, "optimizer.ema.decay"},
      {{"--set", "optimizer.ema.decay=0"}, "optimizer.ema.decay"},
      {{"--set", "optimizer.ema.decay=0.9", "--set", "precision.dtype=bf16", "--set",
        "precision.master_weights=false"},
       "optimizer.ema.decay"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.says);
    std::vector<std::string> args = {job.string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = run_dtrain(args, tmp.path() / "bad.log");
    CHECK_MESSAGE(r.rc == 2, r.describe());
    CHECK_MESSAGE(r.log.find(c.says) != std::string::npos, r.log);
    args.insert(args.begin(), "validate");
    const RunResult v = run_dtrain_command(args, tmp.path() / "validate.log");
    CHECK_MESSAGE(v.rc == 2, v.describe());
  }
  // --weights ema of a checkpoint that has no average.
  const RunResult t = run_dtrain({job.string(), "--set", "train.steps=2"}, tmp.path() / "t.log");
  REQUIRE_MESSAGE(t.rc == 0, t.describe());
  const RunResult p = run_dtrain_command(
      {"predict", job.string(), "--split", "test", "--weights", "ema"}, tmp.path() / "p.log");
  CHECK_MESSAGE(p.rc == 2, p.describe());
  CHECK_MESSAGE(p.log.find("holds no average of the weights") != std::string::npos, p.log);
  const RunResult w = run_dtrain_command(
      {"predict", job.string(), "--split", "test", "--weights", "average"}, tmp.path() / "w.log");
  CHECK_MESSAGE(w.rc == 2, w.describe());
  // Only the average may come or go at a resume: a checkpoint of SGD with momentum does
  // not resume without it (its momentum would be dropped), in a file as in a directory.
  const RunResult m = run_dtrain({job.string(), "--set", "train.steps=4", "--set",
                                  "optimizer.momentum=0", "--resume", "latest"},
                                 tmp.path() / "m.log");
  CHECK_MESSAGE(m.rc == 2, m.describe());
  CHECK_MESSAGE(m.log.find("optimizer state buffers (momentum) differ from this run's (none)") !=
                    std::string::npos,
                m.log);
}

// train.best with the average: the record says what the evaluations were of, and a resume
// that switches the average on starts the comparison anew (as another metric would).
TEST_CASE("optimizer.ema with train.best: the record names the weights, a switch starts anew") {
  TempDir tmp("ema-best");
  const fs::path job = write_job(tmp.path(), "run");
  const std::vector<std::string> best = {"--set", "train.eval_every=2",
                                         "--set", "train.checkpoint.every=2",
                                         "--set", "train.best={metric: loss}"};
  std::vector<std::string> first = {job.string(), "--set", "train.steps=4"};
  first.insert(first.end(), best.begin(), best.end());
  const RunResult a = run_dtrain(first, tmp.path() / "a.log");
  REQUIRE_MESSAGE(a.rc == 0, a.describe());
  const fs::path record = tmp.path() / "run" / "checkpoints" / "best.json";
  CHECK(nlohmann::json::parse(read_bytes(record)).at("weights") == "model");
  std::vector<std::string> second = {job.string(), "--set", "optimizer.ema.decay=0.8", "--resume",
                                     "latest"};
  second.insert(second.end(), best.begin(), best.end());
  const RunResult b = run_dtrain(second, tmp.path() / "b.log");
  REQUIRE_MESSAGE(b.rc == 0, b.describe());
  CHECK_MESSAGE(b.log.find("the comparison starts anew") != std::string::npos, b.log);
  const nlohmann::json r = nlohmann::json::parse(read_bytes(record));
  CHECK(r.at("weights") == "ema");
  CHECK(r.at("step").get<int64_t>() > 4);  // a best of the average's evaluations only
  const nlohmann::json s = nlohmann::json::parse(read_bytes(tmp.path() / "run" / "summary.json"));
  CHECK(s.at("best").at("weights") == "ema");
}
