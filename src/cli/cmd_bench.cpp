// `dtrain bench [--suite kernels] [--dtype fp32,bf16] [--device cpu|cuda[:N]] [--out FILE.json]
//  [--compare BASELINE.json [--threshold 5%]] [--only SUBSTR] [--min-time S] [--max-time S]`:
// the machine's measured peaks, then the suite's figures (runtime/bench.h), each with its
// spread, share of peak and a check against fp64 sums; JSON written atomically; with
// --compare a baseline/now/ratio table and exit 1 when a figure is slower than the
// threshold. --suite models trains each built-in model for a few steps on synthetic
// data (the real trainer, in this process) and reports the median step time with its
// spread, samples and tokens per second, MFU, and the measured peak memory beside
// `dtrain estimate`'s. --suite comm times all-reduce (per algorithm), reduce-scatter
// and all-gather across ranks: under mpirun or srun every rank runs it (rank 0 prints
// and writes), or --nproc N starts N local ranks through mpirun as a child and merges
// their figures (with --suite all, after this process's kernels and models, which
// then have the machine's cores to themselves).
#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "config/config.h"
#include "core/allocator.h"
#include "core/error.h"
#include "data/atomic_file.h"
#include "dist/communicator.h"
#include "dist/launcher.h"
#include "kernels/device_info.h"
#include "kernels/memory.h"
#include "runtime/bench.h"
#include "runtime/estimate.h"
#include "runtime/trainer.h"

namespace dtrain::cli {

namespace {

struct BenchArgs {
  std::string suite = "kernels";
  std::string dtypes = "fp32";
  std::string device = "cpu";
  std::string out, compare, threshold = "5%", only;
  std::string models = "resnet50,bert-base,vit-b16,gpt2";
  double min_time = 0.3, max_time = 3.0;
  int steps = 5, warmup = 2;
  // comm suite
  int nproc = 0;
  std::string min_bytes = "4096", max_bytes = "67108864";  // sizes: 4KiB, 64MiB, ...
  std::string algorithms;                                  // comma list; empty: the ones that apply
  int ranks_per_node = 0;                                  // 0: the shared-memory split
  bool child = false;  // one of the ranks --nproc started (no machine section)
};

// The models suite's jobs: configs/*-synthetic.yaml's models and batches (ViT-B/16 at
// 224 x 224 beside them), synthetic data, no evaluation worth timing.
std::string model_job(const std::string& model) {
  if (model == "resnet50") {
    return "model: {arch: resnet50, num_classes: 1000, image_size: 224, in_channels: 3, "
           "stem: standard}\n"
           "data: {dataset: synthetic, global_batch: 32, micro_batch: 32, workers: 1, "
           "limit: {test: 32}}\n"
           "optimizer: {name: sgd, lr: 0.1, momentum: 0.9, schedule: {name: constant}}\n";
  }
  if (model == "vit-b16") {
    return "model: {arch: vit-base, num_classes: 1000, image_size: 224, in_channels: 3, "
           "patch_size: 16}\n"
           "data: {dataset: synthetic, global_batch: 8, micro_batch: 8, workers: 1, "
           "limit: {test: 8}}\n"
           "optimizer: {name: adamw, lr: 1.0e-4, weight_decay: 0.01, schedule: {name: "
           "constant}}\n";
  }
  if (model == "bert-base" || model == "gpt2") {
    const bool bert = model == "bert-base";
    return fmt::format(
        "model: {{arch: {}, seq_len: {}}}\n"
        "data: {{dataset: synthetic, global_batch: {}, micro_batch: {}, limit: {{test: {}}}}}\n"
        "optimizer: {{name: adamw, lr: 1.0e-4, weight_decay: 0.01, schedule: {{name: "
        "constant}}}}\n",
        model, bert ? 128 : 64, bert ? 8 : 4, bert ? 8 : 4, bert ? 8 : 4);
  }
  throw Error(fmt::format("--models: '{}' is not one of resnet50, bert-base, vit-b16, gpt2", model),
              "use --models resnet50,bert-base,vit-b16,gpt2 (or a part of the list)");
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string t; std::getline(in, t, ',');)
    if (!t.empty()) out.push_back(t);
  return out;
}

// One model: warm-up + steps of the real trainer (world of one) in a scratch directory,
// the step times from its metrics.jsonl, the peaks from its summary and the estimate.
nlohmann::json bench_model_run(const std::string& model, DType dt, const BenchArgs& a,
                               const runtime::BenchOptions& o, const nlohmann::json& machine) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      fmt::format("dtrain-bench-{}-{}-{}", model, dt == DType::bf16 ? "bf16" : "fp32", getpid());
  std::filesystem::remove_all(dir);
  const std::string text = fmt::format(
      "run: {{output_dir: {}, seed: 42}}\n{}"
      "train: {{steps: {}, log_every: 1}}\nlogging: {{console: false}}\n"
      "precision: {{dtype: {}}}\ndevice: {}\n",
      dir.string(), model_job(model), a.warmup + a.steps, dt == DType::bf16 ? "bf16" : "fp32",
      o.device.str());
  config::ValidateContext ctx;
  runtime::TrainRequest req;
  req.job = config::load_job_text(text, "bench:" + model, {}, ctx);
  req.resolved_yaml = config::dump_job_yaml(req.job);
  runtime::EstimateOptions eo;
  eo.step_time = true;
  const runtime::MemoryEstimate est = runtime::estimate_memory(req.job, eo);
  // Each model's own peak: the previous model's blocks are free by now.
  host_allocator().release_cached();
  host_allocator().reset_peak();
  if (o.device.is_cuda()) kernels::device_allocator(o.device).reset_peak();
  const int rc = runtime::train(req);
  if (rc != 0) throw RunError(fmt::format("bench: training {} ended with exit {}", model, rc));
  std::vector<double> secs;
  nlohmann::json summary;
  std::ifstream metrics(dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("summary", false)) summary = j;
    if (j.contains("step_time_s") && j.value("step", 0) > a.warmup)
      secs.push_back(j["step_time_s"].get<double>());
  }
  std::filesystem::remove_all(dir);
  if (secs.empty()) throw RunError("bench: no step times in the run's metrics");
  runtime::Timing t = runtime::timing_of(secs);
  const double batch = static_cast<double>(req.job.data.global_batch);
  const double peak_gflops = runtime::bench_peak_gflops(machine, dt);
  const bool cuda = o.device.is_cuda();
  const double measured = summary.value(cuda ? "peak_device_bytes" : "peak_host_bytes", 0.0);
  nlohmann::json r = {
      {"suite", "models"},
      {"name", "model/" + model},
      {"dtype", dt == DType::bf16 ? "bf16" : "fp32"},
      {"device", o.device.str()},
      {"shape", fmt::format("batch {}", req.job.data.global_batch)},
      {"runs", t.runs},
      {"seconds_median", t.median},
      {"seconds_p10", t.p10},
      {"seconds_p90", t.p90},
      {"spread", t.spread()},
      {"samples_per_s", batch / t.median},
      {"peak_bytes", measured},
      {"estimate_peak_bytes", est.peak_bytes},
      {"estimate_ratio", measured > 0 ? static_cast<double>(est.peak_bytes) / measured : 0.0}};
  if (req.job.model.seq_len) r["tokens_per_s"] = batch * *req.job.model.seq_len / t.median;
  if (est.step_time) {
    r["flop_per_step"] = est.step_time->flops;
    r["roofline_seconds"] = est.step_time->seconds;
    if (peak_gflops > 0) r["mfu"] = est.step_time->flops / t.median / (peak_gflops * 1e9);
  }
  return r;
}

std::vector<DType> parse_dtypes(const std::string& text) {
  std::vector<DType> out;
  std::stringstream in(text);
  for (std::string t; std::getline(in, t, ',');) {
    if (t == "fp32" || t == "f32") {
      out.push_back(DType::f32);
    } else if (t == "bf16") {
      out.push_back(DType::bf16);
    } else {
      throw Error(fmt::format("--dtype: '{}' is not fp32 or bf16", t), "use --dtype fp32,bf16");
    }
  }
  if (out.empty()) throw Error("--dtype: empty", "use --dtype fp32,bf16");
  return out;
}

double parse_threshold(const std::string& text) {
  std::string t = text;
  const bool percent = !t.empty() && t.back() == '%';
  if (percent) t.pop_back();
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || end == nullptr || *end != '\0' || !(v >= 0)) {
    throw Error(fmt::format("--threshold: '{}' is not a fraction or a percentage", text),
                "use --threshold 5% (or 0.05)");
  }
  return percent ? v / 100.0 : v;
}

nlohmann::json read_baseline(const std::string& file) {
  std::ifstream in(file);
  if (!in)
    throw Error(fmt::format("{}: cannot read the baseline", file),
                "pass a file `dtrain bench --out` wrote");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("schema", "") != "dtrain-bench/1" ||
      !j.contains("results") || !j["results"].is_array()) {
    throw Error(fmt::format("{}: not a dtrain bench file (schema dtrain-bench/1)", file),
                "pass a file `dtrain bench --out` wrote");
  }
  for (const nlohmann::json& r : j["results"]) {
    if (!r.is_object() || !r.contains("seconds_median") || !r["seconds_median"].is_number()) {
      throw Error(fmt::format("{}: a result without seconds_median", file),
                  "pass a file `dtrain bench --out` wrote");
    }
  }
  return j;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<AllreduceAlgo> parse_algorithms(const std::string& text) {
  std::vector<AllreduceAlgo> out;
  for (const std::string& t : split_list(text)) {
    AllreduceAlgo algo = AllreduceAlgo::native;
    if (!from_string(t, algo) || algo == AllreduceAlgo::auto_) {
      throw Error(fmt::format("--algorithms: '{}' is not native, ring or hierarchical", t),
                  "use --algorithms native,ring,hierarchical (or a part of the list)");
    }
    out.push_back(algo);
  }
  return out;
}

runtime::CommBenchOptions comm_options(const BenchArgs& a) {
  runtime::CommBenchOptions c;
  c.min_bytes = static_cast<int64_t>(runtime::parse_bytes(a.min_bytes, "--min-bytes"));
  c.max_bytes = static_cast<int64_t>(runtime::parse_bytes(a.max_bytes, "--max-bytes"));
  c.algorithms = parse_algorithms(a.algorithms);
  if (c.min_bytes < 4 || c.min_bytes > c.max_bytes) {
    throw Error(fmt::format("--min-bytes {} --max-bytes {}: sizes from at least 4 bytes up",
                            c.min_bytes, c.max_bytes),
                "e.g. --min-bytes 4096 --max-bytes 67108864");
  }
  return c;
}

// This rank's part of the comm suite, under a launcher: MPI over the world on the host,
// NCCL over it on --device cuda (a GPU per local rank, as `dtrain train` picks).
nlohmann::json comm_figures(const BenchArgs& a, runtime::BenchOptions o,
                            const std::function<void(const std::string&)>& print) {
  std::optional<int> per_node;
  if (a.ranks_per_node > 0) per_node = a.ranks_per_node;
  const std::unique_ptr<dist::Communicator> world =
      dist::make_world_communicator(dist::WorldOptions{per_node});
  if (world->size() < 2) {
    throw Error("--suite comm: this launcher started one rank; the figures need several",
                "use mpirun -np N (N >= 2), or --nproc N without a launcher");
  }
  std::unique_ptr<dist::Communicator> nccl;
  dist::Communicator* comm = world.get();
  if (o.device.is_cuda()) {
    const int gpus = static_cast<int>(kernels::query_cuda().devices.size());
    if (gpus > 1) o.device.index = dist::launcher_local_rank().value_or(0) % gpus;
    nccl = dist::make_nccl_communicator(*world, o.device, per_node);
    comm = nccl.get();
  }
  return runtime::bench_comm(*world, *comm, o, comm_options(a), print);
}

// The comm suite from one process: `--nproc` ranks under mpirun as a child (this same
// binary with --child), their figures read back from the file rank 0 writes. Empty
// and `rc` set when the child failed (it printed why).
nlohmann::json comm_via_mpirun(const BenchArgs& a, int& rc) {
  const std::filesystem::path tmp =
      std::filesystem::temp_directory_path() / fmt::format("dtrain-bench-comm-{}.json", getpid());
  std::vector<std::string> argv = local_mpirun(a.nproc, "bench");
  argv.insert(
      argv.end(),
      {self_executable(), "bench", "--suite", "comm", "--child", "--out", tmp.string(), "--device",
       a.device, "--dtype", a.dtypes, "--min-time", fmt::format("{}", a.min_time), "--max-time",
       fmt::format("{}", a.max_time), "--min-bytes", a.min_bytes, "--max-bytes", a.max_bytes});
  if (!a.algorithms.empty()) argv.insert(argv.end(), {"--algorithms", a.algorithms});
  if (a.ranks_per_node > 0)
    argv.insert(argv.end(), {"--ranks-per-node", std::to_string(a.ranks_per_node)});
  if (!a.only.empty()) argv.insert(argv.end(), {"--only", a.only});
  RanksOptions stop;
  stop.graceful = false;  // a stop ends the ranks: they have no checkpoint to write
  rc = run_ranks(argv, stop);
  nlohmann::json results = nlohmann::json::array();
  if (rc == 0) {
    std::ifstream in(tmp);
    const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
    if (doc.is_discarded() || !doc.contains("results")) {
      throw RunError(fmt::format("bench: the comm ranks wrote no figures to {}", tmp.string()));
    }
    results = doc["results"];
  } else {
    std::fprintf(stderr, "bench: the comm suite's %d ranks ended with exit %d\n", a.nproc, rc);
  }
  std::filesystem::remove(tmp);
  return results;
}

void print_machine(const nlohmann::json& machine) {
  std::printf(
      "machine: %s, %d threads; fp32 peak %.1f GFLOP/s (%s), bf16 %.1f (%s), "
      "memory %.1f GB/s\n",
      machine["cpu"].get<std::string>().c_str(), machine["threads"].get<int>(),
      machine["fp32_peak_gflops"].get<double>(), machine["fp32_path"].get<std::string>().c_str(),
      machine["bf16_peak_gflops"].get<double>(),
      machine["bf16_path"].get<std::string>().empty()
          ? "none"
          : machine["bf16_path"].get<std::string>().c_str(),
      machine["memory_gbytes_per_s"].get<double>());
  std::fflush(stdout);
}

int run_bench(const BenchArgs& a) {
  if (a.suite != "kernels" && a.suite != "models" && a.suite != "comm" && a.suite != "all") {
    throw Error(fmt::format("--suite {}: the suites are kernels, models, comm and all", a.suite),
                "use --suite kernels, models, comm or all");
  }
  if (a.steps < 1 || a.warmup < 0) {
    throw Error(fmt::format("--steps {} --warmup {}: at least one timed step", a.steps, a.warmup),
                "use --steps 5 --warmup 2");
  }
  const std::vector<std::string> models = split_list(a.models);
  for (const std::string& m : models) model_job(m);  // unknown names: exit 2 now
  comm_options(a);                                   // and bad comm options
  runtime::BenchOptions o;
  o.device = Device::parse(a.device);
  o.dtypes = parse_dtypes(a.dtypes);
  o.only = a.only;
  o.min_seconds = a.min_time;
  o.max_seconds = std::max(a.max_time, a.min_time);
  const double threshold = parse_threshold(a.threshold);
  const int world = world_from_env();
  if (a.nproc != 0) {
    if (a.nproc < 2) {
      throw Error(fmt::format("--nproc {}: the comm figures need at least 2 ranks", a.nproc),
                  "use --nproc 2 or more");
    }
    if (a.ranks_per_node > 0 && a.nproc % a.ranks_per_node != 0) {
      throw Error(
          fmt::format("--ranks-per-node {} does not divide --nproc {}", a.ranks_per_node, a.nproc),
          "use a number of ranks per node that divides the ranks");
    }
    if (a.suite == "kernels" || a.suite == "models") {
      throw Error(
          fmt::format("--nproc with --suite {}: --nproc starts the comm suite's ranks", a.suite),
          "use --suite comm or all with --nproc, or drop --nproc");
    }
  }
  if (world > 1 && a.suite != "comm") {
    throw Error(fmt::format("--suite {} under a launcher ({} ranks): the kernels and models "
                            "figures are one process's",
                            a.suite, world),
                "run `dtrain bench --suite all --nproc N` in one process, or --suite comm "
                "under mpirun");
  }
  if (a.suite == "comm" && world == 1 && a.nproc == 0) {
    throw Error("--suite comm: one process; the comm figures need several ranks",
                "add --nproc 2 (local ranks through mpirun), or run it under mpirun -np N / srun");
  }
  const bool lead = world == 1 || dist::launcher_rank() == 0;
  nlohmann::json baseline;
  if (!a.compare.empty() && lead) baseline = read_baseline(a.compare);  // before any timing

  auto print = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  nlohmann::json machine = nlohmann::json::object();
  nlohmann::json results = nlohmann::json::array();
  if (world > 1) {
    results = comm_figures(a, o, print);
    if (lead && !a.child) {
      machine = runtime::bench_machine(o);  // after the figures: the other ranks are idle
      print_machine(machine);
    }
  } else {
    machine = runtime::bench_machine(o);
    print_machine(machine);
    if (a.suite == "kernels" || a.suite == "all")
      results = runtime::bench_kernels(o, machine, print);
    if (a.suite == "models" || a.suite == "all") {
      for (DType dt : o.dtypes)
        for (const std::string& m : models) {
          if (!a.only.empty() && m.find(a.only) == std::string::npos) continue;
          const nlohmann::json r = bench_model_run(m, dt, a, o, machine);
          print(fmt::format(
              "{:<34} {:<4} {:>9.3f} s  +-{:4.1f}%  {:8.1f} samples/s  MFU {:5.1f}%  "
              "peak {:.0f} MB (estimate {:.0f} MB)",
              r["name"].get<std::string>(), r["dtype"].get<std::string>(),
              r["seconds_median"].get<double>(), 50.0 * r["spread"].get<double>(),
              r["samples_per_s"].get<double>(), 100.0 * r.value("mfu", 0.0),
              r["peak_bytes"].get<double>() / 1e6, r["estimate_peak_bytes"].get<double>() / 1e6));
          results.push_back(r);
        }
    }
    if (a.nproc > 0) {
      int rc = 0;
      for (nlohmann::json& r : comm_via_mpirun(a, rc)) results.push_back(std::move(r));
      if (rc != 0) return rc;
    } else if (a.suite == "all") {
      print("comm: not timed (one process; --nproc N times the collectives across N ranks)");
    }
  }
  if (!a.only.empty() && results.empty()) {
    throw Error(
        fmt::format("--only {}: no figure of --suite {} has it in its name", a.only, a.suite),
        "see the names dtrain bench prints without --only (gemm/..., conv/..., "
        "attention/..., the model names)");
  }
  runtime::add_comm_shares(results, machine);
  bool checks_ok = true;
  for (const nlohmann::json& r : results)
    if (r.contains("check")) checks_ok = checks_ok && r["check"]["ok"].get<bool>();
  if (!lead) return checks_ok ? kExitOk : kExitInternal;

  const nlohmann::json doc = {{"schema", "dtrain-bench/1"}, {"created", utc_now()},
                              {"dtrain", DTRAIN_VERSION},   {"suite", a.suite},
                              {"machine", machine},         {"results", results}};
  if (!a.out.empty()) {
    write_file_atomic(a.out, {doc.dump(2), "\n"});
    if (!a.child) std::printf("wrote %s\n", a.out.c_str());
  }
  if (!checks_ok) {
    std::fprintf(stderr,
                 "error: a figure's sampled outputs differ from the exact or fp64 sums beyond "
                 "the tolerance (the check column); this is a dtrain bug\n");
    return kExitInternal;
  }
  if (!baseline.is_null()) {
    const runtime::BenchComparison c = runtime::compare_bench(baseline, doc, threshold);
    std::printf("\n%s", runtime::format_comparison(c, threshold).c_str());
    if (c.rows.empty()) {  // a gate that compared nothing must not pass
      throw Error(fmt::format("--compare {}: none of its figures was measured now (another "
                              "suite, dtype, world size or --only?): nothing compared",
                              a.compare),
                  "compare with a baseline of the same --suite, --dtype and --only");
    }
    if (c.any_slower) {
      std::printf("slower than %s by more than %s: exit 1\n", a.compare.c_str(),
                  a.threshold.c_str());
      return 1;
    }
  }
  return kExitOk;
}

}  // namespace

void add_bench(CLI::App& app, Action& action) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "time kernels at the built-in models' shapes against this machine's peaks");
  cmd->add_option("--suite", args->suite, "kernels, models, comm or all (default kernels)");
  cmd->add_option("--dtype", args->dtypes, "comma list: fp32, bf16 (default fp32)");
  cmd->add_option("--device", args->device, "cpu, cuda or cuda:N (default cpu)");
  cmd->add_option("--out", args->out, "write the JSON here (atomically)");
  cmd->add_option("--compare", args->compare,
                  "a baseline JSON: print baseline / now / ratio, exit 1 when slower");
  cmd->add_option("--threshold", args->threshold, "slower than this fails --compare (5%)");
  cmd->add_option("--only", args->only, "only the figures whose name contains this");
  cmd->add_option("--min-time", args->min_time, "seconds per figure at least (0.3)");
  cmd->add_option("--max-time", args->max_time, "seconds per figure at most (3)");
  cmd->add_option("--models", args->models,
                  "models suite: comma list of resnet50, bert-base, vit-b16, gpt2 (all)");
  cmd->add_option("--steps", args->steps, "models suite: timed steps per model (5)");
  cmd->add_option("--warmup", args->warmup, "models suite: untimed steps first (2)");
  cmd->add_option("--nproc", args->nproc,
                  "comm suite: start N local ranks through mpirun (else run under mpirun/srun)");
  cmd->add_option("--min-bytes", args->min_bytes,
                  "comm suite: smallest buffer (4096; units too: 4KiB, 1MB)");
  cmd->add_option("--max-bytes", args->max_bytes,
                  "comm suite: largest buffer (67108864); sizes go up x4");
  cmd->add_option("--algorithms", args->algorithms,
                  "comm suite: all-reduce algorithms, comma list of native, ring, hierarchical");
  cmd->add_option("--ranks-per-node", args->ranks_per_node,
                  "comm suite: consecutive ranks that count as one node (hierarchical)");
  cmd->add_flag("--child", args->child)->group("");  // one of the ranks --nproc started
  cmd->callback([args, &action] { action = [args] { return run_bench(*args); }; });
}

}  // namespace dtrain::cli
