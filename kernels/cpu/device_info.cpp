// CPU and oneDNN queries for `dtrain info`: /proc/cpuinfo and dnnl_version().
#include <oneapi/dnnl/dnnl.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "core/parallel.h"
#include "kernels/device_info.h"

namespace dtrain::kernels {

namespace {
std::string value_of(const std::string& line) {
  const auto colon = line.find(':');
  if (colon == std::string::npos) return {};
  const auto start = line.find_first_not_of(" \t", colon + 1);
  return start == std::string::npos ? std::string() : line.substr(start);
}
}  // namespace

CpuInfo query_cpu() {
  CpuInfo info;
  info.logical_cores = static_cast<int>(std::thread::hardware_concurrency());
  info.threads = num_threads();
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags, phys;
  std::set<std::string> cores;
  for (; std::getline(in, line);) {
    if (line.starts_with("model name") && info.model.empty()) info.model = value_of(line);
    if (line.starts_with("flags") && flags.empty()) flags = value_of(line);
    if (line.starts_with("physical id")) phys = value_of(line);
    if (line.starts_with("core id")) cores.insert(phys + "/" + value_of(line));
  }
  info.physical_cores = static_cast<int>(cores.size());
  if (info.model.empty()) info.model = "unknown (no /proc/cpuinfo model name)";
  std::set<std::string> have;
  std::istringstream fs(flags);
  for (std::string f; fs >> f;) have.insert(f);
  for (const char* want :
       {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
        "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"}) {
    if (have.count(want)) info.isa.emplace_back(want);
  }
  return info;
}

OneDnnInfo query_onednn() {
  const dnnl_version_t* v = dnnl_version();
  OneDnnInfo info;
  info.major = v->major;
  info.minor = v->minor;
  info.patch = v->patch;
  switch (v->cpu_runtime) {
    case DNNL_RUNTIME_OMP:
      info.cpu_runtime = "OpenMP";
      break;
    case DNNL_RUNTIME_TBB:
      info.cpu_runtime = "TBB";
      break;
    case DNNL_RUNTIME_SEQ:
      info.cpu_runtime = "sequential";
      break;
    case DNNL_RUNTIME_THREADPOOL:
      info.cpu_runtime = "threadpool";
      break;
    default:
      info.cpu_runtime = "other";
      break;
  }
  return info;
}

}  // namespace dtrain::kernels
