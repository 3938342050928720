// Checkpoint files: round trip, atomic replacement, retention, and rejection
// of every kind of damage (truncation, flipped bits, wrong magic or version)
// with an error that names the file and the offset.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/checkpoint.h"

using namespace dtrain;
using namespace dtrain::runtime;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("dtrain-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<NamedTensor> sample_tensors() {
  Tensor w = Tensor::empty({3, 5}, DType::f32);
  for (int i = 0; i < 15; ++i) w.data<float>()[i] = 0.5f * static_cast<float>(i) - 2.0f;
  Tensor h = Tensor::empty({7}, DType::bf16);
  for (int i = 0; i < 7; ++i) h.data<bf16>()[i] = to_bf16(static_cast<float>(i));
  Tensor ids = Tensor::empty({4}, DType::i64);
  for (int i = 0; i < 4; ++i) ids.data<int64_t>()[i] = int64_t{1} << (10 * i);
  return {{"model.fc.weight", w}, {"optim.exp_avg", h}, {"data.permutation", ids}};
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

std::string error_of(const fs::path& p) {
  try {
    read_checkpoint(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("checkpoint round trip keeps names, dtypes, shapes, bits and metadata") {
  const fs::path dir = fresh_dir("roundtrip");
  const nlohmann::json meta = {{"step", 100}, {"rng", {{"seed", 7}}}, {"config_hash", "abc"}};
  const auto tensors = sample_tensors();
  const fs::path file = checkpoint_path(dir, 100);
  write_checkpoint(file, meta, tensors);
  CHECK(file.filename() == "step-00000100.dtckpt");
  const Checkpoint ck = read_checkpoint(file);
  CHECK(ck.meta == meta);
  REQUIRE(ck.tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    CHECK(ck.tensors[i].name == tensors[i].name);
    CHECK(ck.tensors[i].tensor.dtype() == tensors[i].tensor.dtype());
    CHECK(ck.tensors[i].tensor.shape() == tensors[i].tensor.shape());
    CHECK(std::memcmp(ck.tensors[i].tensor.raw(), tensors[i].tensor.raw(),
                      tensors[i].tensor.nbytes()) == 0);
  }
  CHECK_THROWS_WITH_AS(ck.get("model.conv.weight"), doctest::Contains("no tensor"), Error);
  for (const auto& e : fs::directory_iterator(dir)) {  // no temporary left behind
    CHECK(e.path().extension() == ".dtckpt");
  }
}

TEST_CASE("every truncation and every flipped byte is rejected, naming file and offset") {
  const fs::path dir = fresh_dir("damage");
  const fs::path good = checkpoint_path(dir, 1);
  write_checkpoint(good, {{"step", 1}}, sample_tensors());
  const std::string bytes = read_file(good);
  const fs::path bad = dir / "bad.dtckpt";
  for (size_t len = 0; len < bytes.size(); len += 13) {
    write_file(bad, bytes.substr(0, len));
    const std::string err = error_of(bad);
    INFO("truncated to ", len);
    CHECK(err.find(bad.string() + ": offset ") == 0);
  }
  int rejected = 0, tried = 0;
  for (size_t at = 0; at < bytes.size(); at += 7) {
    std::string damaged = bytes;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x20);
    write_file(bad, damaged);
    ++tried;
    rejected += !error_of(bad).empty();
  }
  CHECK(rejected == tried);  // checksums cover header and blobs; padding must be zero
  std::string wrong_version = bytes;
  wrong_version[8] = 9;
  write_file(bad, wrong_version);
  CHECK(error_of(bad).find("format version 9") != std::string::npos);
  write_file(bad, "DTRAINCK but not really a checkpoint at all, no trailer either");
  CHECK(error_of(bad).find("offset") != std::string::npos);
  CHECK(error_of(dir / "missing.dtckpt").find("cannot open checkpoint") != std::string::npos);
}

TEST_CASE("a blob with a flipped bit fails its own checksum, by name") {
  const fs::path dir = fresh_dir("blob");
  const fs::path file = checkpoint_path(dir, 3);
  write_checkpoint(file, {{"step", 3}}, sample_tensors());
  const Checkpoint ck = read_checkpoint(file);
  std::string bytes = read_file(file);
  const size_t last = bytes.size() - 16 - 1;  // the final byte of the last blob
  bytes[last] = static_cast<char>(bytes[last] ^ 1);
  write_file(file, bytes);
  CHECK(error_of(file).find("tensor \"data.permutation\": checksum mismatch") != std::string::npos);
}

TEST_CASE("retention keeps the newest K and the best, rewriting a step replaces it atomically") {
  const fs::path dir = fresh_dir("keep");
  for (int step : {10, 30, 20, 40, 50})
    write_checkpoint(checkpoint_path(dir, step), {{"step", step}}, {});
  // A temporary whose writer died is removed; a live writer's (the test runner's parent) stays.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const std::string dead_tmp = fmt::format("step-00000060.dtckpt.tmp{}", dead);
  const std::string live_tmp = fmt::format("step-00000070.dtckpt.tmp{}", getppid());
  const std::string dead_best = fmt::format("best.json.tmp{}", dead);
  write_file(dir / dead_tmp, "half-written");
  write_file(dir / live_tmp, "being written");
  write_file(dir / dead_best, "{\"st");
  // train.best's checkpoint (step 20) stays beside the newest 2.
  prune_checkpoints(dir, 2, {20});
  const auto left = list_checkpoints(dir);
  REQUIRE(left.size() == 3);
  CHECK(left[0].filename() == "step-00000020.dtckpt");
  CHECK(left[1].filename() == "step-00000040.dtckpt");
  CHECK(left[2].filename() == "step-00000050.dtckpt");
  prune_checkpoints(dir, 2);
  CHECK(list_checkpoints(dir).size() == 2);
  CHECK(!fs::exists(dir / dead_tmp));
  CHECK(!fs::exists(dir / dead_best));
  CHECK(fs::exists(dir / live_tmp));
  fs::remove(dir / live_tmp);
  write_checkpoint(checkpoint_path(dir, 50), {{"step", 50}, {"again", true}}, {});
  CHECK(read_checkpoint(checkpoint_path(dir, 50)).meta["again"] == true);
}

TEST_CASE("a reader streams a blob in pieces, the same bits, and catches a change since") {
  const fs::path dir = fresh_dir("pieces");
  const fs::path file = checkpoint_path(dir, 4);
  Tensor big = Tensor::empty({1000}, DType::f32);
  for (int i = 0; i < 1000; ++i) big.data<float>()[i] = 0.25f * static_cast<float>(i) - 7.0f;
  std::vector<NamedTensor> tensors = sample_tensors();
  tensors.push_back({"params.f32", big});
  write_checkpoint(file, {{"step", 4}}, tensors);
  const CheckpointReader r(file);  // verified whole
  CHECK(r.meta().at("step") == 4);
  CHECK(r.blob("params.f32").shape == Shape{1000});
  CHECK(r.has("optim.exp_avg"));
  CHECK_FALSE(r.has("params.bf16"));
  for (const int64_t piece : {int64_t{64}, int64_t{999}, int64_t{1000}, int64_t{4096}}) {
    CAPTURE(piece);
    std::vector<float> got;
    int64_t next = 0, calls = 0;
    r.pieces("params.f32", piece, [&](int64_t lo, const Tensor& t) {
      CHECK(lo == next);
      CHECK(t.numel() <= piece);
      got.insert(got.end(), t.data<float>(), t.data<float>() + t.numel());
      next += t.numel();
      ++calls;
    });
    CHECK(calls == (1000 + piece - 1) / piece);
    REQUIRE(got.size() == 1000);
    CHECK(std::memcmp(got.data(), big.raw(), big.nbytes()) == 0);
  }
  const Tensor whole = r.read("optim.exp_avg");
  CHECK(std::memcmp(whole.raw(), tensors[1].tensor.raw(), whole.nbytes()) == 0);
  // The file changes in place after the reader verified it: the blob's checksum, summed
  // again over the pieces, no longer matches, and the error says why.
  std::string bytes = read_file(file);
  const size_t at = r.blob("params.f32").offset + 4 * 500;
  bytes[at] = static_cast<char>(bytes[at] ^ 1);
  {
    std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(bytes[at]);
  }
  std::string err;
  try {
    r.pieces("params.f32", 64, [](int64_t, const Tensor&) {});
  } catch (const Error& e) {
    err = e.what();
  }
  CHECK(err.find("tensor \"params.f32\": checksum mismatch while loading it") != std::string::npos);
  // A reader that verifies the file refuses it from the start.
  CHECK(error_of(file).find("tensor \"params.f32\": checksum mismatch") != std::string::npos);
  std::string missing;
  try {
    r.blob("params.bf16");
  } catch (const Error& e) {
    missing = e.what();
  }
  CHECK(missing.find("checkpoint has no tensor \"params.bf16\"") != std::string::npos);
}
