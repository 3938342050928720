// `dtrain train` refusing bad input with exit code 2 and a message that names
// the culprit: damaged checkpoints (file and offset), checkpoints of another
// model or optimizer, a missing --resume path or dataset, features this build
// cannot run. Each refusal must leave the run directory as it was. Does not
// test the checkpoint reader on its own (tests/runtime/test_checkpoint.cpp).
#include <doctest/doctest.h>

#include <functional>
#include <vector>

#include "harness.h"
#include "kernels/device_info.h"

using namespace dtrain::train_test;

namespace {

constexpr int kExitBadInput = 2;

// A finished 12-step run with checkpoints at steps 4, 8 and 12.
struct SavedRun {
  TempDir tmp;
  fs::path job, run_dir, ckpts;
  explicit SavedRun(const std::string& name) : tmp(name) {
    job = write_job(tmp.path());
    run_dir = tmp.path() / "run";
    ckpts = run_dir / "checkpoints";
    const RunResult r = run_dtrain(
        {job.string(), "--set", "train.steps=12", "--set", "train.checkpoint={every: 4, keep: 3}"},
        tmp.path() / "setup.log");
    REQUIRE_MESSAGE(r.rc == 0, r.describe());
    REQUIRE(runtime_checkpoints() == 3);
  }
  size_t runtime_checkpoints() const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(ckpts)) n += e.path().extension() == ".dtckpt";
    return n;
  }
  RunResult resume(const std::vector<std::string>& extra, const std::string& log) const {
    std::vector<std::string> args = {job.string(), "--set", "train.steps=16"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_dtrain(args, tmp.path() / log);
  }
};

// Damages the newest checkpoint, resumes, and expects a refusal that names the
// file and an offset, with every file of the run directory left as it was.
void check_damage_refused(const std::string& name, const std::function<void(std::string&)>& damage,
                          const std::string& resume_arg, const std::string& expected_text) {
  SavedRun run("damage-" + name);
  const fs::path victim = run.ckpts / "step-00000012.dtckpt";
  std::string bytes = read_bytes(victim);
  damage(bytes);
  write_bytes(victim, bytes);
  const auto before = snapshot(run.run_dir);

  const RunResult r =
      run.resume({"--resume", resume_arg == "latest" ? std::string("latest") : victim.string()},
                 name + ".log");
  CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
  CHECK_MESSAGE(contains(r.log, victim.string() + ": offset "), r.log);
  CHECK_MESSAGE(contains(r.log, expected_text), r.log);
  const std::string changed = changed_files(before, snapshot(run.run_dir));
  CHECK_MESSAGE(changed == "", "the refused resume touched " << run.run_dir << ": " << changed);
}

}  // namespace

TEST_CASE("a damaged newest checkpoint is refused naming file and offset") {
  SUBCASE("truncated, --resume latest") {
    check_damage_refused(
        "truncated", [](std::string& b) { b.resize(b.size() / 2); }, "latest", "truncated");
  }
  SUBCASE("a flipped byte in a tensor blob, --resume latest") {
    check_damage_refused(
        "flipped-blob", [](std::string& b) { b[b.size() - 100] ^= 0x10; }, "latest",
        "checksum mismatch");
  }
  SUBCASE("a flipped byte in the header, --resume PATH") {
    check_damage_refused(
        "flipped-header", [](std::string& b) { b[40] ^= 0x01; }, "path",
        "header checksum mismatch");
  }
  SUBCASE("cut to ten bytes, --resume PATH") {
    check_damage_refused(
        "stub", [](std::string& b) { b.resize(10); }, "path", "not a dtrain checkpoint");
  }
}

TEST_CASE("after a damaged newest checkpoint, an older one still resumes") {
  SavedRun run("damage-recover");
  const fs::path newest = run.ckpts / "step-00000012.dtckpt";
  const fs::path pristine = run.tmp.path() / "pristine.dtckpt";
  fs::copy_file(newest, pristine);
  write_bytes(newest, read_bytes(newest).substr(0, 4096));
  const RunResult r = run_dtrain({run.job.string(), "--set", "train.steps=12", "--resume",
                                  (run.ckpts / "step-00000008.dtckpt").string()},
                                 run.tmp.path() / "recover.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  // Steps 9..12 redone from step 8 rewrite step 12 exactly as the first time.
  CHECK_MESSAGE(compare_checkpoints(pristine, newest) == "", compare_checkpoints(pristine, newest));
}

TEST_CASE("a checkpoint of another model or optimizer is refused before any step") {
  SavedRun run("other-model");
  const auto before = snapshot(run.run_dir);
  SUBCASE("model.width changed") {
    const RunResult r = run.resume({"--resume", "latest", "--set", "model.width=0.25"}, "w.log");
    CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
    CHECK_MESSAGE(contains(r.log, (run.ckpts / "step-00000012.dtckpt").string()), r.log);
    CHECK_MESSAGE(contains(r.log, "another model"), r.log);
    // It names the first entry that differs and says how to start from these weights.
    CHECK_MESSAGE(contains(r.log, "the params layout differs from this model's: its entry 0 is"),
                  r.log);
    CHECK_MESSAGE(contains(r.log, "set model.init_from"), r.log);
  }
  SUBCASE("optimizer changed") {
    const RunResult r =
        run.resume({"--resume", "latest", "--set", "optimizer={name: adamw, lr: 0.001}"}, "o.log");
    CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
    CHECK_MESSAGE(contains(r.log, "written with optimizer sgd, this job uses adamw"), r.log);
  }
  // No new metrics lines, no new checkpoint, and job.yaml still the job that ran.
  const std::string changed = changed_files(before, snapshot(run.run_dir));
  CHECK_MESSAGE(changed == "", "the refused resume touched " << run.run_dir << ": " << changed);
}

TEST_CASE("device: cuda without a usable GPU is refused with CUDA's own reason") {
  // The same assertion on every machine: CUDA's answer decides which message is due.
  TempDir tmp("cuda-device");
  const fs::path job = write_job(tmp.path());
  const fs::path out = tmp.path() / "run";
  const dtrain::kernels::CudaInfo cuda = dtrain::kernels::query_cuda();
  if (!cuda.available) {  // with a GPU, device: cuda trains (ctest train.cuda, label gpu)
    const RunResult r = run_dtrain({job.string(), "--set", "device=cuda"}, tmp.path() / "cuda.log");
    CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
    const std::string reason =
        cuda.built ? cuda.reason : std::string("this dtrain was built without CUDA");
    CHECK_MESSAGE(
        contains(r.log, "error: --set device=cuda: device: cuda:0: no CUDA device available (" +
                            reason + ")"),
        r.log);
    CHECK_MESSAGE(!fs::exists(out), out << " was created");
  }
  // An index past the last device (or no device at all) is refused the same way.
  const RunResult far =
      run_dtrain({job.string(), "--set", "device=cuda:7"}, tmp.path() / "cuda7.log");
  CHECK_MESSAGE(far.rc == kExitBadInput, far.describe());
  CHECK_MESSAGE(contains(far.log, cuda.available ? "CUDA device(s)" : "no CUDA device available"),
                far.log);
}

TEST_CASE("bad input is refused before any output is written") {
  TempDir tmp("bad-input");
  const fs::path job = write_job(tmp.path());
  const fs::path out = tmp.path() / "run";
  struct Case {
    const char* what;
    std::vector<std::string> args;
    const char* names;  // what the message must mention
  };
  std::vector<Case> cases = {
      {"missing --resume file",
       {"--resume", "/nonexistent/step-00000004.dtckpt"},
       "--resume /nonexistent/step-00000004.dtckpt"},
      {"LAMB without master weights",
       {"--set", "precision.dtype=bf16", "--set", "precision.master_weights=false", "--set",
        "optimizer.name=lamb"},
       "--set precision.master_weights=false: precision.master_weights"},
      {"ZeRO without master weights",
       {"--set", "precision.dtype=bf16", "--set", "precision.master_weights=false", "--set",
        "parallel.zero_stage=3"},
       "--set precision.master_weights=false: precision.master_weights"},
      {"missing dataset", {"--set", "data.path=/nonexistent"}, "/nonexistent"},
      {"data.limit.train below one batch",
       {"--set", "data.limit.train=3"},
       "the dataset holds 3 samples (cut by data.limit.train)"},
  };
  if (!dtrain::kernels::query_cuda().available)
    cases.push_back({"cuda", {"--set", "device=cuda"}, "--set device=cuda: device"});
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    std::vector<std::string> args = {job.string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = run_dtrain(args, tmp.path() / "bad.log");
    CHECK_MESSAGE(r.rc == kExitBadInput, r.describe());
    CHECK_MESSAGE(contains(r.log, std::string("error: ") + c.names), r.log);
    CHECK_MESSAGE(!fs::exists(out), out << " was created");
    fs::remove_all(out);
  }
}
