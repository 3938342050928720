// What this machine offers the backends: the CPU (model, cores, ISA
// extensions), the oneDNN library, and the CUDA devices with driver, runtime,
// cuDNN and NCCL versions. Every field comes from a real query.
#pragma once

#include <string>
#include <vector>

namespace dtrain::kernels {

struct CpuInfo {
  std::string model;             // /proc/cpuinfo "model name"
  int logical_cores = 0;         // online logical CPUs
  int physical_cores = 0;        // distinct (physical id, core id) pairs; 0 if unknown
  std::vector<std::string> isa;  // the SIMD extensions dtrain cares about that were found
  int threads = 0;               // the OpenMP pool size dtrain will use
};

struct OneDnnInfo {
  int major = 0, minor = 0, patch = 0;
  std::string cpu_runtime;  // "OpenMP", "TBB", ...
};

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory = 0;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  std::string pci_bus_id;  // "00000000:3B:00.0", as NVML takes it
};

struct CudaInfo {
  bool built = false;                           // built with DTRAIN_CUDA
  bool available = false;                       // at least one usable device
  std::string reason;                           // why not available, from CUDA itself
  int driver_version = 0, runtime_version = 0;  // CUDA's encoding: 1000 * major + 10 * minor
  int cudnn_version = 0;  // cuDNN's encoding: 10000 * major + 100 * minor + patch (v9)
  int nccl_version = 0;   // NCCL's encoding: 10000 * major + 100 * minor + patch
  std::vector<CudaDeviceInfo> devices;
};

CpuInfo query_cpu();
OneDnnInfo query_onednn();
CudaInfo query_cuda();  // implemented in kernels/cuda (or the stub without CUDA)

}  // namespace dtrain::kernels
