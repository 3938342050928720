// Stub for builds without CUDA: reports why no device can be used.
#include "kernels/device_info.h"

namespace dtrain::kernels {

CudaInfo query_cuda() {
  CudaInfo info;
  info.reason = "dtrain was built without CUDA; rebuild with -DDTRAIN_CUDA=ON";
  return info;
}

}  // namespace dtrain::kernels
