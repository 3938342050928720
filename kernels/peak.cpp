// NVIDIA's datasheet peaks (kernels/peak.h), dense: the sheets print the bf16 / fp16 and
// tf32 tensor-core figures with 2:4 sparsity, twice these. Each family maps to its
// fastest variant (SXM, the largest HBM): a PCIe, NVL or 40 GB part is slower, so the
// figure stays an upper bound on the device and the roofline time a lower bound. The
// host link: the sheets' PCIe figure (Gen5 x16: 128 GB/s, Gen4 x16: 64 GB/s) counts
// both directions, so half of it per direction; what a transfer achieves is lower
// (about 55 GB/s on Gen5), which again keeps the time a lower bound.
#include <array>

#include "kernels/peak.h"

namespace dtrain::kernels {
namespace {

struct Sheet {
  const char* family;  // what cudaDeviceProp::name contains
  GpuDatasheet sheet;
};

const std::array<Sheet, 3> kSheets = {{
    {"H200", {"H200 SXM", 989.4e12, 494.7e12, 66.9e12, 4.8e12, 64e9}},
    {"H100", {"H100 SXM", 989.4e12, 494.7e12, 66.9e12, 3.35e12, 64e9}},
    {"A100", {"A100 80GB SXM", 312e12, 156e12, 19.5e12, 2.039e12, 32e9}},
}};

}  // namespace

GpuDatasheet gpu_datasheet(const std::string& device_name, bool* matched) {
  for (const Sheet& s : kSheets) {
    if (device_name.find(s.family) != std::string::npos) {
      if (matched != nullptr) *matched = true;
      return s.sheet;
    }
  }
  if (matched != nullptr) *matched = false;
  return kSheets[0].sheet;
}

}  // namespace dtrain::kernels
