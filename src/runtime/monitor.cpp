// See monitor.h. NVML's C interface is declared here (the few calls used, with the
// types of nvml.h) and resolved with dlsym, so the binary needs no NVML at build or
// load time.
#include "runtime/monitor.h"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include "core/error.h"

#include "kernels/device_info.h"

namespace dtrain::runtime {

namespace {

// nvml.h's types, for the calls below.
using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = void*;
struct NvmlUtilization {
  unsigned int gpu, memory;  // percent of the last sample period
};
struct NvmlMemory {
  unsigned long long total, free, used;  // bytes
};

}  // namespace

struct SystemMonitor::Nvml {
  void* lib = nullptr;
  nvmlDevice_t device = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, NvmlUtilization*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;  // milliwatts
  nvmlReturn_t (*memory)(nvmlDevice_t, NvmlMemory*) = nullptr;

  ~Nvml() {
    if (shutdown) shutdown();
    if (lib) dlclose(lib);
  }
  template <typename Fn>
  bool bind(Fn& fn, const char* name) {
    fn = reinterpret_cast<Fn>(dlsym(lib, name));
    return fn != nullptr;
  }
};

SystemMonitor::SystemMonitor(Device device)
    : wall_mark_(std::chrono::steady_clock::now()), cpu_mark_(cpu_seconds()) {
  if (!device.is_cuda()) return;
  const kernels::CudaInfo info = kernels::query_cuda();
  if (!info.available || device.index >= static_cast<int>(info.devices.size())) {
    note_ = "note: GPU utilisation and power are not logged (no CUDA device to ask NVML about)";
    return;
  }
  std::string why;
  nvml_ = open_nvml(info.devices[static_cast<size_t>(device.index)].pci_bus_id, why);
  if (!nvml_) note_ = "note: GPU utilisation and power are not logged: " + why;
}

SystemMonitor::~SystemMonitor() = default;

void SystemMonitor::add_fields(nlohmann::json& line) {
  const auto now = std::chrono::steady_clock::now();
  const double wall = std::chrono::duration<double>(now - wall_mark_).count();
  const double cpu = cpu_seconds();
  line["host_rss_bytes"] = resident_bytes();
  if (wall > 0) line["cpu_util"] = (cpu - cpu_mark_) / wall;
  wall_mark_ = now;
  cpu_mark_ = cpu;
  if (!nvml_) return;
  NvmlUtilization u{};
  unsigned int mw = 0;
  NvmlMemory m{};
  if (nvml_->utilization(nvml_->device, &u) == 0) line["gpu_util_percent"] = u.gpu;
  if (nvml_->power(nvml_->device, &mw) == 0) line["gpu_power_w"] = mw / 1000.0;
  if (nvml_->memory(nvml_->device, &m) == 0) line["gpu_memory_used_bytes"] = m.used;
}

std::unique_ptr<SystemMonitor::Nvml> SystemMonitor::open_nvml(const std::string& pci_bus_id,
                                                              std::string& why) {
  auto n = std::make_unique<SystemMonitor::Nvml>();
  n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n->lib) {
    why = "libnvidia-ml.so.1 (NVML, part of the NVIDIA driver) was not found";
    return nullptr;
  }
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*by_pci)(const char*, nvmlDevice_t*) = nullptr;
  if (!n->bind(init, "nvmlInit_v2") || !n->bind(by_pci, "nvmlDeviceGetHandleByPciBusId_v2") ||
      !n->bind(n->utilization, "nvmlDeviceGetUtilizationRates") ||
      !n->bind(n->power, "nvmlDeviceGetPowerUsage") ||
      !n->bind(n->memory, "nvmlDeviceGetMemoryInfo") || !n->bind(n->shutdown, "nvmlShutdown")) {
    n->shutdown = nullptr;  // NVML was not initialised
    why = "libnvidia-ml.so.1 lacks a function dtrain calls (an old driver?)";
    return nullptr;
  }
  if (const nvmlReturn_t r = init(); r != 0) {
    n->shutdown = nullptr;  // not initialised: nothing to shut down
    why = fmt::format("nvmlInit failed (NVML error {})", r);
    return nullptr;
  }
  if (const nvmlReturn_t r = by_pci(pci_bus_id.c_str(), &n->device); r != 0) {
    why = fmt::format("NVML does not know the device at PCI {} (NVML error {})", pci_bus_id, r);
    return nullptr;
  }
  return n;
}

size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  if (got != 2) return 0;
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

double cpu_seconds() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

}  // namespace dtrain::runtime
