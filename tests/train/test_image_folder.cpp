// data.dataset: image-folder end to end: a small ResNet learns a generated folder of PPM
// images of their own sizes (random resized crops and flips, the centre-cropped
// evaluation); the run does not depend on the loader's worker count; a run split by a
// checkpoint is the uninterrupted one bit for bit; `dtrain predict` names the class
// directories and scores the test split as the trainer's evaluation did; a damaged image
// and a class count that is not the folder's exit 2 naming what to fix; data.holdout
// evaluates a folder without val/ on a share of its training images.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "harness.h"
#include "same_run.h"

using namespace dtrain::train_test;

TEST_CASE("image-folder: a ResNet learns a folder of images of their own sizes, any workers") {
  OneThread one;
  TempDir tmp("image-folder");
  const fs::path job = write_image_folder_job(tmp.path());
  const fs::path run = run_job(job, tmp.path(), "run", 1, {});
  const auto losses = read_losses(run / "metrics.jsonl");
  REQUIRE(losses.size() == 8);
  const nlohmann::json eval = last_eval(run / "metrics.jsonl");
  REQUIRE(eval.is_object());
  CHECK(eval.at("test_samples") == 12);
  CHECK(eval.at("test_accuracy").get<double>() > 0.6);  // 1/3 by chance
  CHECK(losses.back().loss < losses.front().loss);
  // Decoding and cropping on 0 or 2 loader threads give the same batches.
  require_same(run, run_job(job, tmp.path(), "inline", 1, {"--set", "data.workers=0"}));
  // Stopped at step 4 and resumed: the uninterrupted run, bit for bit.
  const fs::path split = run_job(job, tmp.path(), "split", 1, {"--set", "train.steps=4"});
  run_job(job, tmp.path(), "split", 1, {"--resume", "latest"});
  require_same(run, split);

  // ckpt inspect: the class names the checkpoint keeps, by label.
  const std::string inspect =
      inspect_checkpoint(newest_checkpoint(run / "checkpoints"), tmp.path() / "inspect.log");
  CHECK_MESSAGE(
      inspect.find("classes (label: directory): 3: 0 blue, 1 green, 2 red\n") != std::string::npos,
      inspect);

  // predict: the test split as the trainer evaluated it; files by class directory name.
  const RunResult test = run_dtrain_command(
      {"predict", job.string(), "--set", "run.output_dir=" + run.string(), "--split", "test"},
      tmp.path() / "predict-test.log");
  REQUIRE_MESSAGE(test.rc == 0, test.describe());
  char loss[32];
  std::snprintf(loss, sizeof loss, "loss %.4f", eval.at("test_loss").get<double>());
  CHECK_MESSAGE(test.log.find(loss) != std::string::npos, test.log);
  CHECK(test.log.find("0 blue") != std::string::npos);
  const RunResult files =
      run_dtrain_command({"predict", job.string(), "--set", "run.output_dir=" + run.string(),
                          "--image", (tmp.path() / "images" / "val" / "green").string()},
                         tmp.path() / "predict-files.log");
  REQUIRE_MESSAGE(files.rc == 0, files.describe());
  CHECK_MESSAGE(files.log.find("green\t") != std::string::npos, files.log);
  CHECK(files.log.find("img003.ppm") != std::string::npos);

  // The checkpoint and its export keep the class names: renamed directories do not rename
  // the predictions, and what would mislabel (the test split, a resume) is refused.
  const fs::path exported = tmp.path() / "model.safetensors";
  const RunResult exp =
      run_dtrain_command({"ckpt", "export", newest_checkpoint(run / "checkpoints").string(),
                          "--safetensors", exported.string()},
                         tmp.path() / "export.log");
  REQUIRE_MESSAGE(exp.rc == 0, exp.describe());
  fs::rename(tmp.path() / "images" / "train" / "green", tmp.path() / "images" / "train" / "aqua");
  fs::rename(tmp.path() / "images" / "val" / "green", tmp.path() / "images" / "val" / "aqua");
  for (const std::string& weights : {std::string(), exported.string()}) {
    CAPTURE(weights);
    std::vector<std::string> args = {"predict", job.string(),
                                     "--set",   "run.output_dir=" + run.string(),
                                     "--image", (tmp.path() / "images" / "val" / "aqua").string()};
    if (!weights.empty()) args.insert(args.end(), {"--checkpoint", weights});
    const RunResult renamed = run_dtrain_command(args, tmp.path() / "renamed.log");
    REQUIRE_MESSAGE(renamed.rc == 0, renamed.describe());
    CHECK_MESSAGE(renamed.log.find("green\t") != std::string::npos, renamed.log);
    CHECK(renamed.log.find("aqua\t") == std::string::npos);
  }
  const std::string renamed_classes =
      "the model was trained on 3 classes, data.path's training split has 3: class 0 is "
      "\"blue\" in the checkpoint, \"aqua\" in the folder";
  const RunResult moved = run_dtrain_command(
      {"predict", job.string(), "--set", "run.output_dir=" + run.string(), "--split", "test"},
      tmp.path() / "moved.log");
  CHECK(moved.rc == 2);
  CHECK_MESSAGE(
      moved.log.find(renamed_classes + ", so its labels would not be theirs") != std::string::npos,
      moved.log);
  const RunResult resumed = run_dtrain({job.string(), "--set", "run.output_dir=" + run.string(),
                                        "--set", "train.steps=12", "--resume", "latest"},
                                       tmp.path() / "resumed.log");
  CHECK(resumed.rc == 2);
  CHECK_MESSAGE(resumed.log.find(renamed_classes) != std::string::npos, resumed.log);
}

// A folder with train/ only: without data.holdout it is refused with the key as the way
// out; with it, a share of each class's training images is the evaluation split, which
// the training split no longer holds and `predict --split test` scores as the run did.
TEST_CASE("image-folder: data.holdout evaluates on a share of train/ when there is no val/") {
  OneThread one;
  TempDir tmp("image-folder-holdout");
  const fs::path job = write_image_folder_job(tmp.path());
  fs::remove_all(tmp.path() / "images" / "val");
  const RunResult none =
      run_dtrain({job.string(), "--set", "run.output_dir=" + (tmp.path() / "none").string()},
                 tmp.path() / "none.log");
  CHECK(none.rc == 2);
  CHECK_MESSAGE(none.log.find("has no val/ or test/ directory") != std::string::npos, none.log);
  CHECK(none.log.find("or set data.holdout") != std::string::npos);
  // data bench names where the job wrote data.path (line 4), as train does.
  const RunResult bench = run_dtrain_command({"data", "bench", job.string()}, tmp.path() / "b.log");
  CHECK(bench.rc == 2);
  CHECK_MESSAGE(bench.log.find(job.string() + ":4:") != std::string::npos, bench.log);
  CHECK(bench.log.find("has no val/ or test/ directory") != std::string::npos);
  const fs::path run =
      run_job(job, tmp.path(), "run", 1, {"--set", "data.holdout=0.25", "--set", "train.steps=4"});
  // The run's first line: "data: N train images (...), M test images (...)", N + M = 30.
  const std::string log = read_bytes(tmp.path() / "run.log");
  int trained = 0, held = 0;
  const size_t at = log.find("data: ");
  REQUIRE_MESSAGE(at != std::string::npos, log);
  REQUIRE(std::sscanf(log.c_str() + at, "data: %d train images", &trained) == 1);
  const size_t test_at = log.find(" test images", at);
  REQUIRE(test_at != std::string::npos);
  held = std::stoi(log.substr(log.rfind(", ", test_at) + 2));
  CHECK(trained + held == 30);
  CHECK(held > 0);
  CHECK(log.find("images/train's data.holdout 0.25") != std::string::npos);
  const nlohmann::json eval = last_eval(run / "metrics.jsonl");
  REQUIRE(eval.is_object());
  CHECK(eval.at("test_samples") == held);
  const RunResult test =
      run_dtrain_command({"predict", job.string(), "--set", "run.output_dir=" + run.string(),
                          "--set", "data.holdout=0.25", "--split", "test"},
                         tmp.path() / "predict.log");
  REQUIRE_MESSAGE(test.rc == 0, test.describe());
  char loss[32];
  std::snprintf(loss, sizeof loss, "loss %.4f", eval.at("test_loss").get<double>());
  CHECK_MESSAGE(test.log.find(loss) != std::string::npos, test.log);
  // Without data.holdout, predict's test split is refused naming the job's line too.
  const RunResult no_val = run_dtrain_command(
      {"predict", job.string(), "--set", "run.output_dir=" + run.string(), "--split", "test"},
      tmp.path() / "predict-no-val.log");
  CHECK(no_val.rc == 2);
  CHECK_MESSAGE(no_val.log.find(job.string() + ":4:") != std::string::npos, no_val.log);
  CHECK(no_val.log.find("has no val/ or test/ directory") != std::string::npos);
  // --json names each held-out image by its file: one of train/'s, in the directory of
  // the class it is expected to be, each once.
  const RunResult listed =
      run_dtrain_command({"predict", job.string(), "--set", "run.output_dir=" + run.string(),
                          "--set", "data.holdout=0.25", "--split", "test", "--json"},
                         tmp.path() / "predict-json.log");
  REQUIRE_MESSAGE(listed.rc == 0, listed.describe());
  const size_t json_at = listed.log.find("{\n");
  REQUIRE_MESSAGE(json_at != std::string::npos, listed.log);
  const nlohmann::json images = nlohmann::json::parse(listed.log.substr(json_at)).at("images");
  CHECK(static_cast<int>(images.size()) == held);
  std::set<std::string> named;
  for (const nlohmann::json& image : images) {
    const fs::path file = image.at("image").get<std::string>();
    CAPTURE(file);
    CHECK(fs::is_regular_file(file));
    CHECK(file.parent_path() ==
          tmp.path() / "images" / "train" / image.at("expected").get<std::string>());
    named.insert(file.string());
  }
  CHECK(named.size() == images.size());
}

TEST_CASE("image-folder: a damaged image or a wrong class count exits 2 naming it") {
  TempDir tmp("image-folder-bad");
  const fs::path job = write_image_folder_job(tmp.path());
  const RunResult classes = run_dtrain({job.string(), "--set", "model.num_classes=1000", "--set",
                                        "run.output_dir=" + (tmp.path() / "c").string()},
                                       tmp.path() / "classes.log");
  CHECK(classes.rc == 2);
  // Refused once the folder is read, at the --set that wrote it.
  CHECK_MESSAGE(classes.log.find("--set model.num_classes=1000: model.num_classes: 1000 (the "
                                 "job's, or the architecture's default where the job leaves it "
                                 "out), but") != std::string::npos,
                classes.log);
  CHECK(classes.log.find("set model.num_classes: 3") != std::string::npos);
  const fs::path bad = tmp.path() / "images" / "train" / "red" / "img004.ppm";
  std::ofstream(bad, std::ios::binary) << "P6\n40 40\n255\nshort";
  const RunResult damaged =
      run_dtrain({job.string(), "--set", "run.output_dir=" + (tmp.path() / "d").string()},
                 tmp.path() / "damaged.log");
  CHECK(damaged.rc == 2);
  CHECK_MESSAGE(damaged.log.find(bad.string()) != std::string::npos, damaged.log);
  CHECK(damaged.log.find("truncated") != std::string::npos);
  // Read in step 2 (the sampler's order for seed 3): step 1 saved.
  CHECK(damaged.log.find("step 2 could not read its training data") != std::string::npos);
  CHECK(damaged.log.find("checkpoint saved at step 1 in") != std::string::npos);
  // Every red image damaged, so step 1's batch has one: nothing to save, and no report of
  // a run that took no step.
  for (int i = 0; i < 10; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "img%03d.ppm", i);
    std::ofstream(bad.parent_path() / name, std::ios::binary) << "P6\n40 40\n255\nshort";
  }
  const RunResult first =
      run_dtrain({job.string(), "--set", "run.output_dir=" + (tmp.path() / "f").string()},
                 tmp.path() / "first.log");
  CHECK(first.rc == 2);
  CHECK_MESSAGE(first.log.find("step 1 could not read its training data") != std::string::npos,
                first.log);
  CHECK(first.log.find("no step was done") != std::string::npos);
  CHECK(first.log.find("report.html not written") == std::string::npos);
  CHECK(!fs::exists(tmp.path() / "f" / "checkpoints"));
}

TEST_CASE("dtrain data bench times the image-folder loader per worker count") {
  TempDir tmp("image-folder-bench");
  const fs::path job = write_image_folder_job(tmp.path());
  const fs::path out = tmp.path() / "bench.json";
  const RunResult r = run_dtrain_command({"data", "bench", job.string(), "--workers", "0,2",
                                          "--batches", "4", "--json", "--out", out.string()},
                                         tmp.path() / "bench.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const nlohmann::json j = nlohmann::json::parse(read_bytes(out));
  CHECK(r.log.find(j.dump(2)) != std::string::npos);  // --json printed what --out holds
  CHECK(j.at("dataset") == "image-folder");
  CHECK(j.at("batch") == 8);
  REQUIRE(j.at("results").size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& row = j.at("results")[i];
    CHECK(row.at("workers") == (i == 0 ? 0 : 2));
    CHECK(row.at("samples") == 32);
    CHECK(row.at("samples_per_s").get<double>() > 0);
    CHECK(row.at("wait_seconds").get<double>() <= row.at("seconds").get<double>());
  }
  const RunResult test =
      run_dtrain_command({"data", "bench", job.string(), "--split", "test", "--batches", "2"},
                         tmp.path() / "test.log");
  REQUIRE_MESSAGE(test.rc == 0, test.describe());
  CHECK(test.log.find("test split, 2 batches of 8") != std::string::npos);
  const RunResult bad = run_dtrain_command(
      {"data", "bench", job.string(), "--set", "model.num_classes=7"}, tmp.path() / "bad.log");
  CHECK(bad.rc == 2);
  CHECK(bad.log.find("model.num_classes: 7 (the job's") != std::string::npos);
}
