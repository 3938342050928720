// test_kernels: runs the kernel table. Usage:
//   test_kernels [--mode check|grad] [--device cpu|cuda|cuda:N] [--family NAME]
//                [--filter SUBSTRING] [--list]
// Prints one line per case and "N passed, N failed"; exits 1 on any failure
// or when the selection matches no case. On CUDA with no usable device it
// prints "skipped: no GPU (<reason>)" and exits with kSkip (ctest's
// SKIP_RETURN_CODE for the `gpu` tests).
#include <cstdio>
#include <cstring>
#include <string>

#include "harness.h"
#include "kernels/device_info.h"

using namespace dtrain;
using namespace dtrain::test;

namespace {
constexpr int kSkip = 77;
}

int main(int argc, char** argv) {
  std::string mode = "check", family, filter, device_name = "cpu";
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "test_kernels: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--mode")
      mode = next();
    else if (arg == "--family")
      family = next();
    else if (arg == "--filter")
      filter = next();
    else if (arg == "--device")
      device_name = next();
    else if (arg == "--list")
      list = true;
    else {
      std::fprintf(stderr, "test_kernels: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (mode != "check" && mode != "grad") {
    std::fprintf(stderr, "test_kernels: --mode must be check or grad\n");
    return 2;
  }
  Device device;
  try {
    device = Device::parse(device_name);
  } catch (const Error& e) {
    std::fprintf(stderr, "test_kernels: %s\n", e.what());
    return 2;
  }
  if (device.is_cuda() && !list) {
    const kernels::CudaInfo info = kernels::query_cuda();
    if (!info.available) {
      std::printf("skipped: no GPU (%s)\n", info.reason.c_str());
      return kSkip;
    }
  }
  int passed = 0, failed = 0;
  for (const KernelCase& c : all_cases()) {
    const std::string fam = c.name.substr(0, c.name.find('/'));
    if (!family.empty() && fam != family) continue;
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    if (mode == "grad" && !c.backward) continue;
    if (list) {
      std::printf("%s\n", c.name.c_str());
      continue;
    }
    CaseResult r;
    try {
      r = mode == "check" ? run_check(c, device) : run_grad(c, device);
    } catch (const std::exception& e) {
      r = {false, std::string("threw: ") + e.what()};
    }
    std::printf("%s %s %s%s%s\n", r.passed ? "PASS" : "FAIL", mode.c_str(), c.name.c_str(),
                r.passed ? "" : ": ", r.detail.c_str());
    (r.passed ? passed : failed)++;
  }
  if (list) return 0;
  std::printf("%d passed, %d failed\n", passed, failed);
  if (passed + failed == 0) {
    std::fprintf(stderr, "test_kernels: no case matched\n");
    return 1;
  }
  return failed == 0 ? 0 : 1;
}
