// `dtrain ckpt` on a sharded (ZeRO-1, 2 ranks) checkpoint directory that `dtrain train
// --nproc 2` wrote: inspect shows the world, the stage, each shard's range and each
// rank's own state (gradient compression's residual), verify checks the manifest and
// every shard (a flipped byte in a shard: exit 2 naming it), and export consolidates the
// shards into one safetensors file equal to the assembled fp32 weights.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>

#include "corpus.h"
#include "harness.h"
#include "runtime/export_names.h"
#include "runtime/safetensors.h"
#include "runtime/train_state.h"

using namespace dtrain;
using namespace dtrain::train_test;

namespace {

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("dtrain ckpt inspects, verifies and exports a ZeRO-1 checkpoint of 2 ranks") {
  TempDir tmp("ckpt-sharded");
  const fs::path job = tmp.path() / "gpt2.yaml", run = tmp.path() / "run";
  std::ofstream(job) << "run: {seed: 3, output_dir: " << run.string() << "}\n"
                     << "model: {arch: gpt2-tiny, layers: 1, hidden: 32, heads: 2, seq_len: 16,"
                     << " vocab_size: 320}\n"
                     << "data: {dataset: synthetic, global_batch: 4, limit: {test: 4}}\n"
                     << "optimizer: {name: adamw, lr: 1.0e-3}\n"
                     << "parallel: {zero_stage: 1}\n"
                     << "compress: {method: topk, ratio: 0.1}\n"  // each rank's own residual
                     << "train: {steps: 2, log_every: 1}\nlogging: {console: false}\n";
  RunResult r = run_dtrain({job.string(), "--nproc", "2"}, tmp.path() / "train.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const fs::path dir = run / "checkpoints" / "step-00000002";
  REQUIRE(fs::is_regular_file(dir / "manifest.dtckpt"));

  r = run_dtrain_command({"ckpt", "inspect", run.string()}, tmp.path() / "list.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK_MESSAGE(has(r.log, "sharded  2      1"), r.log);

  r = run_dtrain_command({"ckpt", "inspect", dir.string()}, tmp.path() / "inspect.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  for (const char* line :
       {"(sharded,", "step: 2\n", "sharded: 2 shards, zero stage 1, precision fp32",
        "  rank 0: [0, ", "  rank 1: [", "rank-00001-of-00002.dtckpt",
        "transformer.h.0.attn.c_attn.weight",
        // the compression state each shard holds for its rank alone
        "rank-00000-of-00002.dtckpt, ", "    own state: compress.residual f32["})
    CHECK_MESSAGE(has(r.log, line), line, "\n", r.log);

  r = run_dtrain_command({"ckpt", "verify", dir.string()}, tmp.path() / "verify.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  CHECK(has(r.log, "ok: " + dir.string()));

  const fs::path out = tmp.path() / "gpt2.safetensors";
  r = run_dtrain_command({"ckpt", "export", dir.string(), "--safetensors", out.string()},
                         tmp.path() / "export.log");
  REQUIRE_MESSAGE(r.rc == 0, r.describe());
  const runtime::Checkpoint ck = runtime::read_any_checkpoint(dir);
  const runtime::InitWeights w = runtime::load_init_weights(
      out, "gpt2-tiny", runtime::layout_from_meta(ck.meta.at("params")), {});
  const Tensor& p = ck.get("params.f32");
  REQUIRE(w.params.nbytes() == p.nbytes());
  CHECK(std::memcmp(w.params.raw(), p.raw(), p.nbytes()) == 0);

  // One file of the directory is half a save: refused, naming the directory to pass
  // (inspect once read it as a whole checkpoint and failed with an internal error).
  const fs::path shard1 = dir / "rank-00001-of-00002.dtckpt";
  for (const fs::path& part : {shard1, dir / "manifest.dtckpt"}) {
    CAPTURE(part);
    r = run_dtrain_command({"ckpt", "inspect", part.string()}, tmp.path() / "part.log");
    CHECK_MESSAGE(r.rc == 2, r.describe());
    CHECK_MESSAGE(has(r.log, "one file of the sharded checkpoint " + dir.string()), r.log);
    // verify checks such a file's own checksums.
    r = run_dtrain_command({"ckpt", "verify", part.string()}, tmp.path() / "part-verify.log");
    CHECK_MESSAGE(r.rc == 0, r.describe());
    CHECK_MESSAGE(has(r.log, "ok: " + part.string()), r.log);
  }
  // generate reads the sharded directory: the export's weights, so the export's tokens.
  {
    const TokenDir tok = tokenize(tmp.path(), 100);
    const auto gen = [&](const fs::path& weights, const std::string& log) {
      const RunResult g = run_dtrain_command(
          {"generate", job.string(), "--checkpoint", weights.string(), "--tokenizer",
           (tok.dir / "tokenizer.json").string(), "--tokens", "8", "--ignore-end", "--json"},
          tmp.path() / log);
      REQUIRE_MESSAGE(g.rc == 0, g.describe());
      return nlohmann::json::parse(g.log.substr(g.log.find("{\n"))).at("samples");
    };
    CHECK(gen(dir, "gen-sharded.log") == gen(out, "gen-export.log"));
  }

  std::string bytes = read_bytes(shard1);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
  write_bytes(shard1, bytes);
  r = run_dtrain_command({"ckpt", "verify", dir.string()}, tmp.path() / "damaged.log");
  CHECK_MESSAGE(r.rc == 2, r.describe());
  CHECK_MESSAGE(has(r.log, shard1.string()), r.log);
  r = run_dtrain_command({"ckpt", "verify", (run / "checkpoints").string()},
                         tmp.path() / "damaged-dir.log");
  CHECK_MESSAGE(r.rc == 2, r.describe());
  CHECK(has(r.log, "damaged: " + shard1.string()));
}
