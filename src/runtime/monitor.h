// Per-window system figures for metrics.jsonl and TensorBoard: this process's resident
// memory and CPU use, and on a CUDA device its utilisation, power and memory in use
// as NVML reports them. NVML (libnvidia-ml.so.1, part of the NVIDIA driver) is loaded
// at run time, never linked: where it is absent the GPU fields are left out and
// note() says so once.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "core/device.h"

namespace dtrain::runtime {

class SystemMonitor {
 public:
  explicit SystemMonitor(Device device);
  ~SystemMonitor();
  SystemMonitor(const SystemMonitor&) = delete;
  SystemMonitor& operator=(const SystemMonitor&) = delete;

  // host_rss_bytes (now), cpu_util (CPU seconds per wall second since the last call:
  // 2.0 is two cores busy), and on CUDA gpu_util_percent (the share of the last sample
  // period a kernel ran), gpu_power_w and gpu_memory_used_bytes (every process's).
  void add_fields(nlohmann::json& line);
  // Why the GPU fields are missing ("" when they are there or the job is on the CPU).
  const std::string& note() const { return note_; }

 private:
  struct Nvml;
  // NVML for the device at `pci_bus_id`, or null with the reason in `why`.
  static std::unique_ptr<Nvml> open_nvml(const std::string& pci_bus_id, std::string& why);
  std::unique_ptr<Nvml> nvml_;
  std::string note_;
  std::chrono::steady_clock::time_point wall_mark_;
  double cpu_mark_ = 0;
};

// This process's resident set in bytes (/proc/self/statm), 0 where unreadable.
size_t resident_bytes();
// User plus system CPU seconds this process has used (getrusage).
double cpu_seconds();

}  // namespace dtrain::runtime
