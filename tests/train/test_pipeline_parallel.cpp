// Pipeline parallelism end to end: `dtrain train --nproc N` with parallel.pipeline
// (mpirun under the hood, one OpenMP thread per rank) against one rank accumulating
// the same micro-batches. A pipeline computes exactly what that rank computes (every
// stage runs its backward passes in micro-batch order), so losses and the final
// checkpoint must match bit for bit: a batch-norm ResNet in 2 and 3 stages with GPipe
// and 1F1B, a ViT with dropout, AdamW and clipping, bf16 with fp32 masters, and a
// pipeline x data grid against plain data parallelism, with ZeRO-1 over its data axis
// too. Each stage steps and saves its own span of the parameters: the checkpoint is a
// shard per stage (and data rank under ZeRO), and resumes on one rank and the other
// way round; 1F1B holds at most P - s micro-batches on stage s where GPipe holds all
// of them; a weight tied across the cut (GPT-2, BERT masked-LM) trains within 1e-5;
// refused layouts exit 2 with one message.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "corpus.h"
#include "harness.h"
#include "same_run.h"

using namespace dtrain::train_test;

namespace {

// A 3-layer ViT with dropout on the Fashion-MNIST slice, AdamW with clipping.
fs::path vit_job(const fs::path& dir) {
  const fs::path job = dir / "vit.yaml";
  std::ofstream(job) << "run: {seed: 2}\n"
                     << "model: {arch: vit-tiny, image_size: 28, patch_size: 7, in_channels: 1,\n"
                     << "        num_classes: 10, layers: 3, hidden: 32, heads: 2, ffn: 64,\n"
                     << "        dropout: 0.1}\n"
                     << "data: {dataset: fashion-mnist, global_batch: 16, micro_batch: 4,\n"
                     << "       workers: 1, limit: {train: 200, test: 32}}\n"
                     << "optimizer: {name: adamw, lr: 0.003, weight_decay: 0.01,\n"
                     << "            clip_grad_norm: 0.5}\n"
                     << "train: {steps: 6, log_every: 1}\n"
                     << "logging: {console: false}\n";
  return job;
}

// Two transformer layers of width 32 on the generated corpus (dropout on), so the
// stage cut falls between them, with the token embedding and the LM head (GPT-2) or
// the masked-LM decoder (BERT) on different stages.
fs::path lm_job(const fs::path& dir, const std::string& arch, const TokenDir& t) {
  const fs::path job = dir / (arch + ".yaml");
  std::ofstream(job) << "run: {seed: 3}\n"
                     << "model: {arch: " << arch << ", layers: 2, hidden: 32, heads: 2,\n"
                     << "        seq_len: 16, max_positions: 16, vocab_size: " << t.vocab
                     << ", dropout: 0.1}\n"
                     << "data: {dataset: tokens, path: " << t.dir.string()
                     << ", global_batch: 8, micro_batch: 2, mlm_probability: 0.3,"
                     << " limit: {test: 8}}\n"
                     << "optimizer: {name: adamw, lr: 0.003, weight_decay: 0.01}\n"
                     << "train: {steps: 8, log_every: 1}\n"
                     << "logging: {console: false}\n";
  return job;
}

nlohmann::json summary_of(const fs::path& run_dir) {
  return nlohmann::json::parse(read_bytes(run_dir / "summary.json"));
}

}  // namespace

TEST_CASE("a ResNet in 2 and 3 pipeline stages trains exactly like one rank, GPipe and 1F1B") {
  OneThread one;
  TempDir tmp("pp-resnet");
  const fs::path job = write_job(tmp.path(), "resnet");
  const std::vector<std::string> micro = {"--set", "data.micro_batch=8"};  // 4 per step
  const fs::path whole = run_job(job, tmp.path(), "one", 1, micro);
  // By hand too: parallel.pipeline_blocks moves the cut, not the result.
  std::vector<std::string> by_hand = micro;
  by_hand.insert(by_hand.end(),
                 {"--set", "parallel.pipeline=2", "--set", "parallel.pipeline_blocks=[3, 5]"});
  require_same(run_job(job, tmp.path(), "pp2-blocks", 2, by_hand), whole);
  for (const auto& [stages, schedule] :
       std::vector<std::pair<int, std::string>>{{2, "gpipe"}, {2, "1f1b"}, {3, "1f1b"}}) {
    CAPTURE(stages);
    CAPTURE(schedule);
    std::vector<std::string> extra = micro;
    extra.insert(extra.end(), {"--set", fmt::format("parallel.pipeline={}", stages), "--set",
                               "parallel.schedule=" + schedule});
    const fs::path out =
        run_job(job, tmp.path(), fmt::format("pp{}-{}", stages, schedule), stages, extra);
    require_same(out, whole);
    // The console names the stages and what crosses each cut.
    const std::string log = read_bytes(tmp.path() / fmt::format("pp{}-{}.log", stages, schedule));
    CHECK(log.find(fmt::format("pipeline: {} stages, schedule {}", stages, schedule)) !=
          std::string::npos);
    CHECK(log.find("receives 1 value(s)") != std::string::npos);
  }
}

// The later stage's feeds bring labels only (it decodes no image); the first stage's
// images and the last's labels make the one-rank run.
TEST_CASE("an image folder in 2 pipeline stages trains exactly like one rank") {
  OneThread one;
  TempDir tmp("pp-folder");
  const fs::path job = write_image_folder_job(tmp.path());
  const std::vector<std::string> micro = {"--set", "data.micro_batch=4"};  // 2 per step
  const fs::path whole = run_job(job, tmp.path(), "one", 1, micro);
  std::vector<std::string> extra = micro;
  extra.insert(extra.end(), {"--set", "parallel.pipeline=2"});
  require_same(run_job(job, tmp.path(), "pp2", 2, extra), whole);
}

TEST_CASE("a ViT with dropout, AdamW and clipping in 3 stages, and bf16 in 2: bit for bit") {
  OneThread one;
  TempDir tmp("pp-vit");
  const fs::path vit = vit_job(tmp.path());
  require_same(run_job(vit, tmp.path(), "vit-pp3", 3, {"--set", "parallel.pipeline=3"}),
               run_job(vit, tmp.path(), "vit-one", 1, {}));
  const fs::path resnet = write_job(tmp.path(), "resnet");
  const std::vector<std::string> bf16 = {"--set", "precision.dtype=bf16", "--set",
                                         "data.micro_batch=16"};
  std::vector<std::string> piped = bf16;
  piped.insert(piped.end(), {"--set", "parallel.pipeline=2"});
  require_same(run_job(resnet, tmp.path(), "bf16-pp2", 2, piped),
               run_job(resnet, tmp.path(), "bf16-one", 1, bf16));
}

// optimizer.freeze, layer_decay and groups across stages: the first stage's frozen patch
// embedding and first layer, each stage's layer factors and groups; the one rank skips
// the frozen part's backward, the stages (which send their input's gradient) do not.
// And BitFit, whose frozen linears keep no input in either layout.
TEST_CASE("freeze, layer_decay and groups in 3 stages train exactly like one rank") {
  OneThread one;
  TempDir tmp("pp-freeze");
  const fs::path vit = vit_job(tmp.path());
  const std::vector<std::string> tune = {
      "--set",
      "optimizer.freeze=[conv_proj, encoder.layers.encoder_layer_0]",
      "--set",
      "optimizer.layer_decay=0.7",
      "--set",
      "optimizer.groups=[{params: [heads], lr_scale: 3}, {params: [\"*.bias\"], weight_decay: "
      "0.3}]"};
  std::vector<std::string> piped = tune;
  piped.insert(piped.end(), {"--set", "parallel.pipeline=3"});
  require_same(run_job(vit, tmp.path(), "pp3", 3, piped), run_job(vit, tmp.path(), "one", 1, tune));
  // BitFit: every weight frozen, the biases trained; a stage's frozen linears keep no
  // input (the stage receives its first one from the stage before).
  const std::vector<std::string> bitfit = {
      "--set", "optimizer.freeze=[\"*.weight\", conv_proj, class_token, \"*pos_embedding*\"]"};
  std::vector<std::string> bitfit_piped = bitfit;
  bitfit_piped.insert(bitfit_piped.end(), {"--set", "parallel.pipeline=3"});
  require_same(run_job(vit, tmp.path(), "bitfit-pp3", 3, bitfit_piped),
               run_job(vit, tmp.path(), "bitfit-one", 1, bitfit));
}

// A weight tied across the cut: each stage computes its users' part of the gradient and
// the two parts are summed between the stages after backward, where one rank adds them
// micro-batch by micro-batch: another order of the same sums, so within 1e-5 over the
// steps rather than bit for bit.
TEST_CASE("GPT-2 and BERT masked-LM with the embedding tied across the cut, within 1e-5") {
  OneThread one;
  TempDir tmp("pp-tied");
  const TokenDir tokens = tokenize(tmp.path(), 300);
  for (const std::string arch : {"gpt2-tiny", "bert-mini"}) {
    CAPTURE(arch);
    const fs::path job = lm_job(tmp.path(), arch, tokens);
    const fs::path one_rank = run_job(job, tmp.path(), arch + "-one", 1, {});
    const fs::path piped =
        run_job(job, tmp.path(), arch + "-pp2", 2, {"--set", "parallel.pipeline=2"});
    const auto a = read_losses(one_rank / "metrics.jsonl"),
               b = read_losses(piped / "metrics.jsonl");
    REQUIRE(a.size() == 8);
    REQUIRE(b.size() == a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      CHECK(b[i].step == a[i].step);
      CHECK(std::fabs(b[i].loss - a[i].loss) <= 1e-5 * std::fabs(a[i].loss));
    }
    CHECK(a.back().loss < a.front().loss);  // it learns
    const std::string log = read_bytes(tmp.path() / (arch + "-pp2.log"));
    CHECK(log.find("pipeline: 2 stages") != std::string::npos);
  }
}

TEST_CASE("2 pipeline stages x 2 data-parallel ranks train exactly like 2 data-parallel ranks") {
  OneThread one;
  TempDir tmp("pp-grid");
  const fs::path job = write_job(tmp.path(), "resnet");
  const std::vector<std::string> micro = {"--set", "data.micro_batch=8"};  // 2 per rank
  std::vector<std::string> grid = micro;
  grid.insert(grid.end(), {"--set", "parallel.pipeline=2", "--set", "parallel.data=2"});
  require_same(run_job(job, tmp.path(), "grid", 4, grid),
               run_job(job, tmp.path(), "dp2", 2, micro));
}

// ZeRO-1 over a pipeline's data axis: each stage's data ranks shard its span (the
// gradient reduced into each range's owner, the stepped parameters gathered back), and a
// weight tied across the cut is stepped by the earlier stage's owner and sent on. SGD
// and AdamW update each element alone, so the shards compute the replicas' bits.
TEST_CASE("ZeRO-1 over a pipeline's data axis trains exactly like its replicas, tied weights too") {
  OneThread one;
  TempDir tmp("pp-zero");
  const fs::path job = write_job(tmp.path(), "resnet");
  const std::vector<std::string> micro = {"--set", "data.micro_batch=8"};  // 2 per rank
  const fs::path dp2 = run_job(job, tmp.path(), "dp2", 2, micro);
  for (const std::string order : {"pp_dp_tp", "dp_pp_tp"}) {
    CAPTURE(order);
    std::vector<std::string> grid = micro;
    grid.insert(grid.end(), {"--set", "parallel.pipeline=2", "--set", "parallel.data=2", "--set",
                             "parallel.zero_stage=1", "--set", "parallel.order=" + order});
    require_same(run_job(job, tmp.path(), "zero-" + order, 4, grid), dp2);
    const std::string log = read_bytes(tmp.path() / ("zero-" + order + ".log"));
    CHECK(log.find("ZeRO-1") != std::string::npos);
  }
  const TokenDir tokens = tokenize(tmp.path(), 300);
  const fs::path gpt = lm_job(tmp.path(), "gpt2-tiny", tokens);
  const std::vector<std::string> grid = {"--set", "parallel.pipeline=2", "--set", "parallel.data=2",
                                         "--set", "precision.dtype=bf16"};
  std::vector<std::string> zero = grid;
  zero.insert(zero.end(), {"--set", "parallel.zero_stage=1"});
  require_same(run_job(gpt, tmp.path(), "gpt-zero", 4, zero),
               run_job(gpt, tmp.path(), "gpt-replicas", 4, grid));
}

// optimizer.ema in a pipeline: each stage keeps the average of its own span (and under
// ZeRO-1 its data rank's shard of the span), exchanges it for each evaluation and back.
// 2 stages (bf16 masters) against one rank, and 2 stages x 2 data ranks with ZeRO-1
// against 2 data-parallel ranks: the same losses, evaluations and final checkpoint,
// the average included, bit for bit.
TEST_CASE("optimizer.ema in pipeline stages keeps and evaluates one rank's average exactly") {
  OneThread one;
  TempDir tmp("pp-ema");
  const fs::path job = write_job(tmp.path(), "resnet");
  const std::vector<std::string> ema = {"--set", "optimizer.ema.decay=0.9",
                                        "--set", "train.eval_every=4",
                                        "--set", "data.micro_batch=8"};
  const auto evals = [](const fs::path& run) { return eval_losses(run / "metrics.jsonl", "ema"); };
  std::vector<std::string> bf16 = ema;
  bf16.insert(bf16.end(), {"--set", "precision.dtype=bf16"});
  std::vector<std::string> piped = bf16;
  piped.insert(piped.end(), {"--set", "parallel.pipeline=2"});
  const fs::path whole = run_job(job, tmp.path(), "one", 1, bf16);
  const fs::path pp2 = run_job(job, tmp.path(), "pp2", 2, piped);
  require_same(pp2, whole);
  CHECK(evals(pp2).size() == 2);
  CHECK(evals(pp2) == evals(whole));
  const fs::path dp2 = run_job(job, tmp.path(), "dp2", 2, ema);
  std::vector<std::string> grid = ema;
  grid.insert(grid.end(), {"--set", "parallel.pipeline=2", "--set", "parallel.data=2", "--set",
                           "parallel.zero_stage=1"});
  const fs::path zero = run_job(job, tmp.path(), "grid-zero1", 4, grid);
  require_same(zero, dp2);
  CHECK(evals(zero).size() == 2);
  CHECK(evals(zero) == evals(dp2));
  // A GPT-2 whose embedding is tied to the LM head on the other stage: the later stage's
  // copy follows the average for the evaluations too (the pipeline's sums within 1e-5).
  const TokenDir tokens = tokenize(tmp.path(), 300);
  const fs::path gpt = lm_job(tmp.path(), "gpt2-tiny", tokens);
  const std::vector<std::string> lm = {"--set", "optimizer.ema.decay=0.9", "--set",
                                       "train.eval_every=4"};
  std::vector<std::string> lm_piped = lm;
  lm_piped.insert(lm_piped.end(), {"--set", "parallel.pipeline=2"});
  const std::vector<double> one_rank = evals(run_job(gpt, tmp.path(), "gpt-one", 1, lm)),
                            piped_lm = evals(run_job(gpt, tmp.path(), "gpt-pp2", 2, lm_piped));
  REQUIRE(one_rank.size() == 2);
  REQUIRE(piped_lm.size() == 2);
  for (size_t i = 0; i < 2; ++i) CHECK(std::fabs(piped_lm[i] / one_rank[i] - 1) < 1e-5);
}

// A stage saves its own span (one data replica of it; under ZeRO every data rank its
// shard of the span): a step-N directory of shards and a manifest, which any layout
// resumes from. 2 stages against one rank; 2 stages x 2 data ranks with ZeRO-1 against
// 2 plain data-parallel ranks (the same sums in the same order, unlike one rank
// accumulating 4 micro-batches). 4 steps: 2 data ranks would start the 200 samples'
// next epoch earlier than one rank at step 6.
TEST_CASE(
    "a pipeline checkpoint is a shard per stage and resumes on one rank and back, bit for bit") {
  OneThread one;
  TempDir tmp("pp-resume");
  const fs::path job = write_job(tmp.path(), "resnet");
  const std::vector<std::string> base = {
      "--set", "data.micro_batch=8", "--set", "train.steps=4", "--set", "train.checkpoint.every=2"};
  struct Layout {
    std::string name;
    int ranks, shards;
    std::vector<std::string> sets;
    int other_ranks;  // the layout it resumes from and into: plain data parallelism
  };
  const std::vector<Layout> layouts = {{"pp2", 2, 2, {"--set", "parallel.pipeline=2"}, 1},
                                       {"pp2-dp2-zero1",
                                        4,
                                        4,
                                        {"--set", "parallel.pipeline=2", "--set", "parallel.data=2",
                                         "--set", "parallel.zero_stage=1"},
                                        2}};
  for (const Layout& grid : layouts) {
    const fs::path whole = run_job(job, tmp.path(), grid.name + "-other", grid.other_ranks, base);
    for (const bool grid_first : {true, false}) {
      CAPTURE(grid.name);
      CAPTURE(grid_first);
      const auto with = [&](bool on_grid) {
        std::vector<std::string> a = base;
        if (on_grid) a.insert(a.end(), grid.sets.begin(), grid.sets.end());
        return a;
      };
      const auto ranks = [&](bool on_grid) { return on_grid ? grid.ranks : grid.other_ranks; };
      const std::string name = fmt::format("{}-{}", grid.name, grid_first ? "first" : "second");
      std::vector<std::string> half = with(grid_first);
      half.insert(half.end(), {"--set", "train.steps=2"});
      const fs::path out = run_job(job, tmp.path(), name, ranks(grid_first), half);
      if (grid_first) {  // one shard per writer, each its range of the layout, in order
        const fs::path step2 = newest_checkpoint(out / "checkpoints");
        CHECK(fs::is_regular_file(step2 / "manifest.dtckpt"));
        for (int r = 0; r < grid.shards; ++r) {
          CHECK(fs::is_regular_file(step2 /
                                    fmt::format("rank-{:05}-of-{:05}.dtckpt", r, grid.shards)));
        }
      }
      std::vector<std::string> rest = with(!grid_first);
      rest.insert(rest.end(), {"--resume", "latest"});
      run_job(job, tmp.path(), name, ranks(!grid_first), rest);
      require_same(out, whole);
    }
  }
}

TEST_CASE("1F1B holds at most P - s micro-batches on stage s, GPipe all of them") {
  OneThread one;
  TempDir tmp("pp-memory");
  const fs::path job = write_job(tmp.path(), "resnet");
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    CAPTURE(schedule);
    const fs::path out =
        run_job(job, tmp.path(), schedule, 3,
                {"--set", "data.micro_batch=4", "--set", "parallel.pipeline=3", "--set",
                 "parallel.schedule=" + schedule, "--set", "train.steps=2", "--set",
                 "logging.profile={start: 2, steps: 1}"});
    // Each stage's trace: every micro-batch's forward and backward, and the exchanges
    // with its neighbours on their own track, inside the traced step.
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      const nlohmann::json trace =
          nlohmann::json::parse(read_bytes(out / fmt::format("trace-rank-{}.json", s)));
      double from = 0, to = 0;
      int forwards = 0, backwards = 0, exchanges = 0;
      std::vector<std::pair<double, double>> spans;
      for (const nlohmann::json& e : trace.at("traceEvents")) {
        if (e.at("ph") != "X") continue;
        const std::string cat = e.value("cat", "");
        const double t = e.at("ts").get<double>(), d = e.at("dur").get<double>();
        if (cat == "step") std::tie(from, to) = std::pair{t, t + d};
        if (cat == "pipeline") {
          const std::string name = e.at("name");
          forwards += name.rfind("forward ", 0) == 0 ? 1 : 0;
          backwards += name.rfind("backward ", 0) == 0 ? 1 : 0;
          spans.emplace_back(t, t + d);
        }
        if (cat == "exchange") {
          ++exchanges;
          CHECK(e.at("args").at("bytes").get<double>() > 0);
          spans.emplace_back(t, t + d);
        }
      }
      CHECK(forwards == 8);
      CHECK(backwards == 8);
      CHECK(exchanges >= 8);  // at least one per micro-batch's activations or gradients
      for (const auto& [a, b] : spans) {
        CHECK(a >= from);
        CHECK(b <= to + 1);  // microseconds, rounded
      }
    }
    const nlohmann::json p = summary_of(out).at("pipeline");
    CHECK(p.at("stages") == 3);
    CHECK(p.at("micro_batches") == 8);
    CHECK(p.at("bubble_theory").get<double>() == doctest::Approx(2.0 / 10.0));
    REQUIRE(p.at("per_rank").size() == 3);
    for (const nlohmann::json& r : p.at("per_rank")) {
      const int s = r.at("stage");
      CHECK(r.at("rank") == s);  // data = 1: rank r is stage r
      CHECK(r.at("max_micro_batches_in_flight") == (schedule == "gpipe" ? 8 : 3 - s));
      CHECK(r.at("peak_host_bytes").get<double>() > 0);
      CHECK(r.at("exchange_bytes").get<double>() > 0);
      CHECK(r.at("exchange_share").get<double>() >= 0);
      CHECK(r.at("exchange_share").get<double>() < 1);
    }
  }
}

// Gradient compression over each stage's data group (2 stages x 2 data ranks, GPT-2 with
// its embedding tied across the cut: each stage compresses its own copy's gradient,
// then the two are summed). Top-k at ratio 1 is the plain run bit for bit; each method
// saves every step (data replicas proven equal) and a run stopped at step 4 resumes bit
// for bit: every rank's residual (and its stage's Q) is in its own shard, data rank 1's
// in an empty-range shard.
// comm.allreduce auto in a grid: the data group of rank 0 times, every group (each
// stage's, with its own buckets) takes that table, and the checkpoint keeps it; a resume
// on the same grid and buckets uses it instead of timing again, so that with 3 data ranks
// (native and ring sum in other orders) it is the uninterrupted run with that algorithm.
TEST_CASE("comm.allreduce auto in 2 stages x 3 data ranks: one table, kept by a resume") {
  OneThread one;
  TempDir tmp("pp-auto");
  const TokenDir tokens = tokenize(tmp.path(), 300);
  const fs::path job = lm_job(tmp.path(), "gpt2-tiny", tokens);
  const std::vector<std::string> grid = {
      "--set", "parallel.pipeline=2", "--set", "parallel.data=3", "--set", "data.global_batch=12",
      "--set", "comm.bucket_mb=25"};  // one bucket per stage: one size class each
  std::vector<std::string> first = grid;
  first.insert(first.end(), {"--set", "comm.allreduce=auto", "--set", "train.steps=3"});
  const fs::path split = run_job(job, tmp.path(), "split", 6, first);
  const std::string chosen = auto_choice(read_bytes(tmp.path() / "split.log"));
  REQUIRE((chosen == "native" || chosen == "ring"));
  // Rank 3 (stage 1) timed nothing and took rank 0's group's table.
  const std::string stage1 = read_bytes(split / "logs" / "rank-3.log");
  CHECK_MESSAGE(stage1.find("the table the data group of rank 0 timed") != std::string::npos,
                stage1);
  CHECK(stage1.find(" -> " + chosen) != std::string::npos);
  std::vector<std::string> rest = grid;
  rest.insert(rest.end(), {"--set", "comm.allreduce=auto", "--resume", "latest"});
  run_job(job, tmp.path(), "split", 6, rest);
  const std::string resumed = read_bytes(tmp.path() / "split.log");
  CHECK_MESSAGE(resumed.find("all-reduce auto: the checkpoint's choice") != std::string::npos,
                resumed);
  CHECK(resumed.find("max over ranks of the median time") == std::string::npos);
  std::vector<std::string> fixed = grid;
  fixed.insert(fixed.end(), {"--set", "comm.allreduce=" + chosen});
  require_same(run_job(job, tmp.path(), "whole", 6, fixed), split);
  // Other buckets on some stage change the signature: timed again.
  rest = {"--set",    "parallel.pipeline=2",
          "--set",    "parallel.data=3",
          "--set",    "data.global_batch=12",
          "--set",    "comm.bucket_mb=0.005",
          "--set",    "comm.allreduce=auto",
          "--set",    "train.steps=10",
          "--resume", "latest"};
  run_job(job, tmp.path(), "split", 6, rest);
  const std::string retimed = read_bytes(tmp.path() / "split.log");
  CHECK(retimed.find("max over ranks of the median time") != std::string::npos);
  CHECK_MESSAGE(retimed.find("not the checkpoint's table: this run's gradient buckets differ") !=
                    std::string::npos,
                retimed);
}

TEST_CASE("gradient compression with 2 stages x 2 data ranks: ratio 1 is plain, each resumes") {
  OneThread one;
  TempDir tmp("pp-compress");
  const TokenDir tokens = tokenize(tmp.path(), 300);
  const fs::path job = lm_job(tmp.path(), "gpt2-tiny", tokens);
  const std::vector<std::string> grid = {
      "--set", "parallel.pipeline=2", "--set", "parallel.data=2",
      "--set", "comm.allreduce=ring", "--set", "model.max_positions=64"};
  require_topk1_plain(job, tmp.path(), grid);
  const std::vector<std::vector<std::string>> methods = {
      {"compress.method=topk", "compress.ratio=0.05"},
      {"compress.method=onebit", "parallel.schedule=gpipe"},
      {"compress.method=powersgd", "compress.rank=2"},
      {"compress.method=powersgd", "compress.rank=2", "parallel.zero_stage=1"}};
  for (const std::vector<std::string>& m : methods)
    require_compressed_resume(job, tmp.path(), grid, m, 4);
}

// dtrain estimate's pipeline stages (graph::StageRange, runtime/estimate.cpp): each stage
// replays its nodes for one micro-batch, K - 1 micro-batches hold what a forward leaves
// for its backward and every slot its input copies; against each rank's measured peak
// (synthetic data: nothing outside the estimate's items).
TEST_CASE("dtrain estimate gives every pipeline stage's measured peak within 3%") {
  OneThread one;
  TempDir tmp("pp-estimate");
  const fs::path resnet = tmp.path() / "resnet.yaml";
  std::ofstream(resnet) << "run: {seed: 1}\n"
                        << "model: {arch: resnet18, stem: small, width: 0.25, image_size: 32,\n"
                        << "        num_classes: 10}\n"
                        << "data: {dataset: synthetic, global_batch: 32, micro_batch: 4,\n"
                        << "       workers: 1, limit: {test: 32}}\n"
                        << "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                        << "train: {steps: 3, log_every: 1}\n"
                        << "logging: {console: false}\n";
  const fs::path vit = tmp.path() / "vit.yaml";
  std::ofstream(vit) << "run: {seed: 1}\n"
                     << "model: {arch: vit-tiny, image_size: 64, patch_size: 8, num_classes: 10,\n"
                     << "        layers: 3, hidden: 96, heads: 3, ffn: 384}\n"
                     << "data: {dataset: synthetic, global_batch: 16, micro_batch: 4,\n"
                     << "       workers: 1, limit: {test: 16}}\n"
                     << "optimizer: {name: adamw, lr: 1.0e-3}\n"
                     << "train: {steps: 3, log_every: 1}\n"
                     << "logging: {console: false}\n";
  struct Case {
    fs::path job;
    std::string name;
    std::vector<std::string> sets;
    int stages = 3, data = 1;
  };
  // A probe of the vit started from an export of it: every stage streams the file into
  // the weights it holds, a tensor at a time.
  const fs::path seed_run = run_job(vit, tmp.path(), "vit-seed", 1, {"--set", "train.steps=1"});
  const fs::path exported = tmp.path() / "vit.safetensors";
  const RunResult x =
      run_dtrain_command({"ckpt", "export", seed_run.string(), "--safetensors", exported.string()},
                         tmp.path() / "export.log");
  REQUIRE_MESSAGE(x.rc == 0, x.describe());
  // A stage holds the masters and optimizer state of its own span (ZeRO-1: its shard of
  // it); the last case's bf16 masters and AdamW state are most of a stage's state.
  const std::vector<Case> cases = {
      {vit,
       "vit-1f1b-init-probe",
       {"--set", "parallel.schedule=1f1b", "--set", "model.init_from=" + exported.string(), "--set",
        "optimizer.freeze=[conv_proj, encoder]"}},
      {resnet, "resnet-gpipe", {"--set", "parallel.schedule=gpipe"}},
      {resnet, "resnet-1f1b", {"--set", "parallel.schedule=1f1b"}},
      {resnet,
       "resnet-ckpt",
       {"--set", "parallel.schedule=gpipe", "--set", "memory.checkpointing=block"}},
      {vit, "vit-gpipe", {"--set", "parallel.schedule=gpipe"}},
      {vit, "vit-1f1b", {"--set", "parallel.schedule=1f1b"}},
      {vit,
       "vit-1f1b-bf16-zero1",
       {"--set", "parallel.schedule=1f1b", "--set", "precision.dtype=bf16", "--set",
        "parallel.data=2", "--set", "parallel.zero_stage=1"},
       2,
       2},
      // Data replicas without ZeRO: each steps its stage's whole span (the estimate took
      // a ZeRO shard of it until 2026-12-06: 5-7% under).
      {vit, "vit-1f1b-dp2", {"--set", "parallel.schedule=1f1b", "--set", "parallel.data=2"}, 2, 2},
      // A frozen first half holds no optimizer state: stage 0's data ranks keep AdamW's
      // moments for none (rank 0's shard) or few of their tensors.
      {vit,
       "vit-1f1b-zero1-frozen",
       {"--set", "parallel.schedule=1f1b", "--set", "parallel.data=2", "--set",
        "parallel.zero_stage=1", "--set",
        "optimizer.freeze=[conv_proj, encoder.layers.encoder_layer_0]"},
       2,
       2},
      // Gradient compression over each stage's data group: the stage's own residual and
      // Q, its buckets' exchanges in its last micro-batch's backward (or after it).
      {vit,
       "vit-1f1b-dp2-topk",
       {"--set", "parallel.schedule=1f1b", "--set", "parallel.data=2", "--set",
        "comm.allreduce=ring", "--set", "compress.method=topk", "--set", "compress.ratio=0.1"},
       2,
       2},
      {vit,
       "vit-gpipe-dp2-powersgd-no-overlap",
       {"--set", "parallel.schedule=gpipe", "--set", "parallel.data=2", "--set",
        "comm.allreduce=ring", "--set", "compress.method=powersgd", "--set", "comm.overlap=false"},
       2,
       2},
      {vit,
       "vit-1f1b-dp2-onebit-zero1",
       {"--set", "parallel.schedule=1f1b", "--set", "parallel.data=2", "--set",
        "comm.allreduce=ring", "--set", "compress.method=onebit", "--set", "parallel.zero_stage=1"},
       2,
       2},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::vector<std::string> sets = c.sets;
    sets.insert(sets.end(), {"--set", fmt::format("parallel.pipeline={}", c.stages)});
    const int world = c.stages * c.data;
    const fs::path out = run_job(c.job, tmp.path(), c.name, world, sets);
    const nlohmann::json est =
        estimate_json(c.job, world, sets, tmp.path() / (c.name + "-estimate.log"));
    const nlohmann::json& stages = est.at("pipeline_stages");
    REQUIRE(stages.size() == static_cast<size_t>(c.stages));
    const bool gpipe =
        c.name.find("gpipe") != std::string::npos || c.name.find("ckpt") != std::string::npos;
    const nlohmann::json summary = summary_of(out);
    const int micro = (c.job == vit ? 4 : 8) / c.data;
    REQUIRE(summary.at("pipeline").at("per_rank").size() == static_cast<size_t>(world));
    for (const nlohmann::json& r : summary.at("pipeline").at("per_rank")) {
      const int s = r.at("stage");
      CAPTURE(s);
      const nlohmann::json& st = stages[static_cast<size_t>(s)];
      CHECK(st.at("in_flight") == (gpipe ? micro : std::min(micro, c.stages - s)));
      const double measured = r.at("peak_host_bytes").get<double>();
      MESSAGE(c.name, " stage ", s, ": estimated ", st.at("peak_bytes").get<double>(),
              ", measured ", measured);
      CHECK(std::abs(st.at("peak_bytes").get<double>() / measured - 1.0) <= 0.03);
    }
  }
}

// Activation checkpointing inside the stages: segments restart at each stage's first
// block, so none straddles a cut; recomputing gives the same bits, and each stage holds
// less (GPipe keeps every micro-batch's activations alive).
TEST_CASE("activation checkpointing in pipeline stages: the same bits, a lower peak per stage") {
  OneThread one;
  TempDir tmp("pp-ckpt");
  const fs::path job = write_job(tmp.path(), "resnet");
  const std::vector<std::string> base = {"--set", "data.micro_batch=4",
                                         "--set", "parallel.pipeline=2",
                                         "--set", "parallel.schedule=gpipe"};
  const fs::path whole = run_job(job, tmp.path(), "one", 1, {"--set", "data.micro_batch=4"});
  const fs::path plain = run_job(job, tmp.path(), "plain", 2, base);
  for (const std::string rule : {"block", "sqrt"}) {
    CAPTURE(rule);
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--set", "memory.checkpointing=" + rule});
    const fs::path out = run_job(job, tmp.path(), rule, 2, args);
    require_same(out, whole);
    const nlohmann::json a = summary_of(out).at("pipeline").at("per_rank");
    const nlohmann::json b = summary_of(plain).at("pipeline").at("per_rank");
    for (size_t r = 0; r < 2; ++r)
      CHECK(a[r].at("peak_host_bytes").get<double>() < b[r].at("peak_host_bytes").get<double>());
  }
}

// A stage that hangs leaves its neighbour waiting in an exchange: the watchdog ends
// every rank within comm.timeout_s, naming the exchange and the missing stage, and the
// newest checkpoint (written by stage 0) resumes.
TEST_CASE("a pipeline stage that hangs ends every rank within the timeout") {
  OneThread one;
  TempDir tmp("pp-fault");
  const fs::path job = write_job(tmp.path(), "resnet");
  const fs::path out = tmp.path() / "hang";
  setenv("DTRAIN_TEST_FAULT", "1:3:hang", 1);
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r =
      run_dtrain({job.string(), "--nproc", "2", "--set", "run.output_dir=" + out.string(), "--set",
                  "parallel.pipeline=2", "--set", "train.steps=50", "--set",
                  "train.checkpoint.every=2", "--set", "comm.timeout_s=5"},
                 tmp.path() / "hang.log", 25);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsetenv("DTRAIN_TEST_FAULT");
  CHECK_MESSAGE(r.rc != 0, r.describe());
  CHECK_MESSAGE(took < 20.0, "ended after ", took, " s: ", r.describe());
  // One micro-batch of 32 (its warning says stages idle): the 32 x 16 x 14 x 14 f32
  // activation crossing the cut.
  CHECK_MESSAGE(
      r.log.find("exchange of 401408 bytes has not finished after 5 s") != std::string::npos,
      r.log);
  CHECK_MESSAGE(r.log.find("missing peer: rank 1 (pid") != std::string::npos, r.log);
  const fs::path newest = newest_checkpoint(out / "checkpoints");
  REQUIRE(!newest.empty());
  const RunResult check = run_dtrain(
      {job.string(), "--set", "run.output_dir=" + (tmp.path() / "check").string(), "--set",
       "train.steps=" + std::to_string(checkpoint_step(newest)), "--resume", newest.string()},
      tmp.path() / "check.log");
  CHECK_MESSAGE(check.rc == 0, check.describe());
}

TEST_CASE("pipeline layouts not supported yet exit 2 on every rank with one message") {
  OneThread one;
  TempDir tmp("pp-bad");
  const fs::path job = write_job(tmp.path(), "resnet");
  struct Case {
    fs::path job;
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {job,
       {"--set", "parallel.zero_stage=2"},
       "ZeRO-2 does not combine with pipeline parallelism"},
      {job,
       {"--set", "precision.dtype=bf16", "--set", "precision.master_weights=false"},
       "precision.master_weights: false with parallel.pipeline"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.expect);
    std::vector<std::string> args = {c.job.string(), "--nproc", "2", "--set",
                                     "parallel.pipeline=2"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    check_refused(args, tmp.path() / "bad.log", c.expect);
  }
}
