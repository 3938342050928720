// `dtrain info`: the CPU, oneDNN, MPI, and CUDA devices (or why there are none).
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "dist/mpi_info.h"
#include "kernels/device_info.h"

#include <fmt/format.h>

namespace dtrain::cli {

namespace {

std::string cuda_version(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }
std::string lib_version(int v) {
  return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
}

int run_info() {
  const kernels::CpuInfo cpu = kernels::query_cpu();
  std::string isa;
  for (const std::string& f : cpu.isa) isa += (isa.empty() ? "" : " ") + f;
  std::printf("dtrain %s\n", DTRAIN_VERSION);
  std::printf("cpu: %s\n", cpu.model.c_str());
  std::printf("  cores: %d logical, %d physical; dtrain threads: %d\n", cpu.logical_cores,
              cpu.physical_cores, cpu.threads);
  std::printf("  isa: %s\n", isa.empty() ? "(none of the tracked extensions)" : isa.c_str());
  const kernels::OneDnnInfo dnn = kernels::query_onednn();
  std::printf("onednn: %d.%d.%d (%s)\n", dnn.major, dnn.minor, dnn.patch, dnn.cpu_runtime.c_str());
  const dist::MpiInfo mpi = dist::query_mpi();
  if (mpi.built) {
    std::printf("mpi: %s (MPI %d.%d)\n", mpi.library.c_str(), mpi.version, mpi.subversion);
  } else {
    std::printf("mpi: none (%s)\n", mpi.library.c_str());
  }
  const kernels::CudaInfo cuda = kernels::query_cuda();
  if (cuda.built) {
    std::printf("cuda: runtime %s, driver %s, cudnn %s, nccl %s\n",
                cuda_version(cuda.runtime_version).c_str(),
                cuda.driver_version ? cuda_version(cuda.driver_version).c_str() : "none",
                lib_version(cuda.cudnn_version).c_str(), lib_version(cuda.nccl_version).c_str());
  }
  if (!cuda.available) {
    std::printf("cuda: no CUDA device available (%s)\n", cuda.reason.c_str());
    return kExitOk;
  }
  for (const kernels::CudaDeviceInfo& d : cuda.devices) {
    std::printf("cuda:%d: %s, %.1f GiB, compute capability %d.%d, %d SMs\n", d.index,
                d.name.c_str(), static_cast<double>(d.total_memory) / (1 << 30), d.cc_major,
                d.cc_minor, d.multiprocessors);
  }
  return kExitOk;
}

}  // namespace

void add_info(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("info", "print the CPU, oneDNN, MPI and CUDA devices");
  cmd->callback([&action] { action = run_info; });
}

}  // namespace dtrain::cli
