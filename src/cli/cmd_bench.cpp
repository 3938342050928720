// `dtrain bench [--suite kernels] [--dtype fp32,bf16] [--device cpu|cuda[:N]] [--out FILE.json]
//  [--compare BASELINE.json [--threshold 5%]] [--only SUBSTR] [--min-time S] [--max-time S]`:
// the machine's measured peaks, then the suite's figures (runtime/bench.h), each with its
// spread, share of peak and a check against fp64 sums; JSON written atomically; with
// --compare a baseline/now/ratio table and exit 1 when a figure is slower than the
// threshold. The models and comm suites are not built yet: asking for them is exit 2.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "data/atomic_file.h"
#include "runtime/bench.h"

namespace dtrain::cli {

namespace {

struct BenchArgs {
  std::string suite = "kernels";
  std::string dtypes = "fp32";
  std::string device = "cpu";
  std::string out, compare, threshold = "5%", only, models;
  double min_time = 0.3, max_time = 3.0;
  int steps = 0;
};

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

int run_bench(const BenchArgs& a) {
  if (a.suite != "kernels") {
    throw Error(fmt::format("--suite {}: only the kernels suite is built so far", a.suite),
                "use --suite kernels (bench/bench_model and bench/bench_allreduce time "
                "models and all-reduce meanwhile)");
  }
  if (!a.models.empty() || a.steps != 0) {
    throw Error("--models and --steps belong to the models suite, which is not built yet",
                "leave them out");
  }
  runtime::BenchOptions o;
  o.device = Device::parse(a.device);
  o.dtypes = parse_dtypes(a.dtypes);
  o.only = a.only;
  o.min_seconds = a.min_time;
  o.max_seconds = std::max(a.max_time, a.min_time);
  const double threshold = parse_threshold(a.threshold);
  nlohmann::json baseline;
  if (!a.compare.empty()) baseline = read_baseline(a.compare);  // bad input before any timing

  const nlohmann::json machine = runtime::bench_machine(o);
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
  const nlohmann::json results = runtime::bench_kernels(o, machine, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  const nlohmann::json doc = {{"schema", "dtrain-bench/1"}, {"created", utc_now()},
                              {"dtrain", DTRAIN_VERSION},   {"suite", a.suite},
                              {"machine", machine},         {"results", results}};
  if (!a.out.empty()) {
    write_file_atomic(a.out, {doc.dump(2), "\n"});
    std::printf("wrote %s\n", a.out.c_str());
  }
  bool checks_ok = true;
  for (const nlohmann::json& r : results) checks_ok = checks_ok && r["check"]["ok"].get<bool>();
  if (!checks_ok) {
    std::fprintf(stderr,
                 "error: a kernel's sampled outputs differ from the fp64 sums beyond the "
                 "tolerance (the check column); this is a dtrain bug\n");
    return kExitInternal;
  }
  if (!baseline.is_null()) {
    const runtime::BenchComparison c = runtime::compare_bench(baseline, doc, threshold);
    std::printf("\n%s", runtime::format_comparison(c, threshold).c_str());
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
  cmd->add_option("--suite", args->suite, "kernels (models and comm are not built yet)");
  cmd->add_option("--dtype", args->dtypes, "comma list: fp32, bf16 (default fp32)");
  cmd->add_option("--device", args->device, "cpu, cuda or cuda:N (default cpu)");
  cmd->add_option("--out", args->out, "write the JSON here (atomically)");
  cmd->add_option("--compare", args->compare,
                  "a baseline JSON: print baseline / now / ratio, exit 1 when slower");
  cmd->add_option("--threshold", args->threshold, "slower than this fails --compare (5%)");
  cmd->add_option("--only", args->only, "only the figures whose name contains this");
  cmd->add_option("--min-time", args->min_time, "seconds per figure at least (0.3)");
  cmd->add_option("--max-time", args->max_time, "seconds per figure at most (3)");
  cmd->add_option("--models", args->models, "models suite (not built yet)");
  cmd->add_option("--steps", args->steps, "models suite (not built yet)");
  cmd->callback([args, &action] { action = [args] { return run_bench(*args); }; });
}

}  // namespace dtrain::cli
