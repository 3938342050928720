// `dtrain predict` on image models (a small ResNet with batch norm, a ViT) trained a few
// steps on Fashion-MNIST: the test split's accuracy and loss are the trainer's own
// evaluation's; image files made from test images (PGM, an RGB PPM, a 2x enlarged PGM)
// get the probabilities the split gave those images; and the refusals (exit 2).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "harness.h"
#include "same_run.h"

using namespace dtrain::train_test;

namespace {

nlohmann::json predict_json(const fs::path& tmp, const std::vector<std::string>& args) {
  std::vector<std::string> all = {"predict"};
  all.insert(all.end(), args.begin(), args.end());
  all.push_back("--json");
  const RunResult r = run_dtrain_command(all, tmp / "predict.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const size_t at = r.log.find("{\n");  // after any note on stderr
  REQUIRE_MESSAGE(at != std::string::npos, r.log);
  return nlohmann::json::parse(r.log.substr(at));
}

// Test image i of Fashion-MNIST as bytes (the dataset gives x / 255).
std::vector<uint8_t> test_image(int64_t i) {
  dtrain::DataOptions o;
  o.dataset = dtrain::DatasetName::fashion_mnist;
  const auto set = dtrain::open_dataset(o, dtrain::Split::test);
  std::vector<float> x(28 * 28);
  set->read(i, x.data());
  std::vector<uint8_t> px;
  for (float v : x) px.push_back(static_cast<uint8_t>(std::lround(v * 255.0f)));
  return px;
}

void write_pnm(const fs::path& file, const char* magic, int w, int h,
               const std::vector<uint8_t>& px) {
  std::ofstream out(file, std::ios::binary);
  out << magic << "\n" << w << " " << h << "\n255\n";
  out.write(reinterpret_cast<const char*>(px.data()), static_cast<std::streamsize>(px.size()));
}

}  // namespace

TEST_CASE("an image model classifies its test split as its evaluation did, and image files") {
  TempDir tmp("predict-image");
  const fs::path resnet = write_job(tmp.path(), "resnet");  // batch norm: running statistics
  const fs::path vit = tmp.path() / "vit.yaml";
  std::ofstream(vit) << "run: {output_dir: " << (tmp.path() / "vit").string() << ", seed: 1}\n"
                     << "model: {arch: vit-tiny, image_size: 28, patch_size: 7}\n"
                     << "data: {dataset: fashion-mnist, global_batch: 32, workers: 1,\n"
                     << "       limit: {train: 200, test: 40}}\n"
                     << "optimizer: {name: adamw, lr: 1.0e-3}\n"
                     << "train: {steps: 4, log_every: 1}\n"
                     << "logging: {console: false}\n";
  for (const auto& [name, job] :
       {std::pair{std::string("resnet"), resnet}, std::pair{std::string("vit"), vit}}) {
    CAPTURE(name);
    const RunResult t = run_dtrain({job.string()}, tmp.path() / "train.log");
    REQUIRE_MESSAGE(t.rc == 0, t.describe());
    const nlohmann::json summary =
        nlohmann::json::parse(read_bytes(tmp.path() / name / "summary.json"));
    const nlohmann::json split = predict_json(tmp.path(), {job.string(), "--split", "test"});
    CHECK(split.at("task") == "classify-images");
    CHECK(split.at("classes").at(0) == "T-shirt/top");
    CHECK(split.at("labelled") == (name == "vit" ? 40 : 64));
    CHECK(split.at("accuracy").get<double>() == summary.at("test_accuracy").get<double>());
    const double loss = split.at("loss"), test_loss = summary.at("test_loss");
    MESSAGE(name, ": predict's loss ", loss, ", the evaluation's ", test_loss);
    CHECK(std::fabs(loss / test_loss - 1) < 1e-5);
    int64_t confusion = 0;
    for (const auto& row : split.at("confusion"))
      for (const auto& n : row) confusion += n.get<int64_t>();
    CHECK(confusion == split.at("labelled").get<int64_t>());

    // Test images 0-2 as files: a PGM, an RGB PPM (gray to RGB and back through BT.601
    // luma), and a PGM twice the size whose 2x2 blocks average back to the image.
    const fs::path dir = tmp.path() / (name + "-images");
    fs::create_directories(dir);
    write_pnm(dir / "a.pgm", "P5", 28, 28, test_image(0));
    std::vector<uint8_t> rgb;
    for (uint8_t v : test_image(1)) rgb.insert(rgb.end(), {v, v, v});
    write_pnm(dir / "b.ppm", "P6", 28, 28, rgb);
    const std::vector<uint8_t> small = test_image(2);
    std::vector<uint8_t> big;
    for (int y = 0; y < 56; ++y)
      for (int x = 0; x < 56; ++x) big.push_back(small[static_cast<size_t>((y / 2) * 28 + x / 2)]);
    write_pnm(dir / "c.pgm", "P5", 56, 56, big);
    std::ofstream(dir / "notes.txt") << "not an image: a directory contributes images only\n";
    const RunResult listed = run_dtrain_command({"predict", job.string(), "--image", dir.string()},
                                                tmp.path() / "listed.log");
    CHECK_MESSAGE(listed.log.find("1 entry skipped") != std::string::npos, listed.log);
    const nlohmann::json files = predict_json(tmp.path(), {job.string(), "--image", dir.string()});
    REQUIRE(files.at("images").size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      const nlohmann::json& f = files.at("images").at(i);
      const nlohmann::json& s = split.at("images").at(i);
      CHECK(f.at("label_id") == s.at("label_id"));
      const auto pf = f.at("probabilities").get<std::vector<double>>();
      const auto ps = s.at("probabilities").get<std::vector<double>>();
      REQUIRE(pf.size() == 10);
      for (size_t k = 0; k < pf.size(); ++k) CHECK(std::fabs(pf[k] - ps[k]) < 1e-5);
    }
    CHECK(files.at("images").at(2).at("width") == 56);
    CHECK(files.at("images").at(1).at("format") == "ppm");
  }

  // An unreadable file among readable ones: the others are still classified, the file
  // keeps its place with its error, and the exit is 2.
  std::ofstream(tmp.path() / "resnet-images" / "d.png") << "text, not a PNG\n";
  const RunResult mixed = run_dtrain_command(
      {"predict", resnet.string(), "--image", (tmp.path() / "resnet-images").string(), "--json"},
      tmp.path() / "mixed.log");
  CHECK_MESSAGE(mixed.rc == 2, mixed.describe());
  const nlohmann::json m = nlohmann::json::parse(mixed.log.substr(mixed.log.find("{\n")));
  REQUIRE(m.at("images").size() == 4);
  for (size_t i = 0; i < 3; ++i) CHECK(m.at("images")[i].contains("label"));
  CHECK(m.at("images")[3].at("error").get<std::string>().find("d.png: not a PNG") !=
        std::string::npos);
  const RunResult console = run_dtrain_command(
      {"predict", resnet.string(), "--image", (tmp.path() / "resnet-images").string()},
      tmp.path() / "console.log");
  CHECK(console.rc == 2);
  CHECK_MESSAGE(console.log.find("1 of 4 image(s) could not be read") != std::string::npos,
                console.log);
  CHECK(console.log.find("(its first bytes say otherwise)") != std::string::npos);

  // Refusals, each exit 2 naming what is wrong.
  const fs::path empty = tmp.path() / "empty";
  fs::create_directories(empty);
  std::ofstream(tmp.path() / "fake.png") << "text, not a PNG\n";
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--text", "a shirt"}, "an image model reads images, not --text"},
      {{}, "no images to predict"},
      {{"--image", (tmp.path() / "none.png").string()}, "none.png: cannot open it"},
      {{"--image", empty.string()}, "a directory without a .png"},
      {{"--image", (tmp.path() / "fake.png").string()}, "fake.png: not a PNG, JPEG, PGM"},
      {{"--split", "test", "--batch", "7"}, "the test split comes in batches of"},
      {{"--split", "test", "--image", empty.string()}, "a directory without"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.says);
    std::vector<std::string> args = {"predict", resnet.string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = run_dtrain_command(args, tmp.path() / "bad.log");
    CHECK_MESSAGE(r.rc == 2, r.describe());
    CHECK_MESSAGE(r.log.find(c.says) != std::string::npos, r.log);
  }
}

// model.label_smoothing: the logged training loss is the smoothed one (the first step,
// from the same weights and batch, differs from the plain run's), while the evaluation is
// plain cross-entropy: predict's test-split loss, computed from the logits alone, is
// the trainer's.
TEST_CASE("label smoothing trains on the smoothed loss and evaluates plain cross-entropy") {
  TempDir tmp("smoothing");
  const fs::path job = write_job(tmp.path(), "run");
  const std::vector<std::string> short_run = {"--set", "train.steps=4", "--set",
                                              "train.eval_every=4"};
  std::vector<std::string> smoothed = short_run;
  smoothed.insert(smoothed.end(), {"--set", "model.label_smoothing=0.2"});
  const fs::path plain = run_job(job, tmp.path(), "plain", 1, short_run);
  const fs::path smooth = run_job(job, tmp.path(), "smooth", 1, smoothed);
  const auto lp = read_losses(plain / "metrics.jsonl"), ls = read_losses(smooth / "metrics.jsonl");
  REQUIRE(!lp.empty());
  REQUIRE(!ls.empty());
  CHECK(ls.front().loss != lp.front().loss);
  const nlohmann::json summary = nlohmann::json::parse(read_bytes(smooth / "summary.json"));
  const nlohmann::json split =
      predict_json(tmp.path(), {job.string(), "--set", "model.label_smoothing=0.2", "--checkpoint",
                                (smooth / "checkpoints").string(), "--split", "test"});
  const double loss = split.at("loss"), test_loss = summary.at("test_loss");
  CHECK(std::fabs(loss / test_loss - 1) < 1e-5);
  // Out of range, also as the loss's f32 sees it: exit 2 naming the key.
  for (const char* value : {"1", "-0.1", "0.99999999"}) {
    CAPTURE(value);
    const RunResult bad =
        run_dtrain({job.string(), "--set", std::string("model.label_smoothing=") + value},
                   tmp.path() / "bad.log");
    CHECK(bad.rc == 2);
    CHECK(bad.log.find("model.label_smoothing") != std::string::npos);
  }
}
