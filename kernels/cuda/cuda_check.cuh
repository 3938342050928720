// Checked CUDA / cuDNN / NCCL calls: a failure throws dtrain::Error with the
// call, the library's own message and the source location.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

#define DTRAIN_CUDA_CHECK(call)                                                                \
  do {                                                                                         \
    const cudaError_t dtrain_err_ = (call);                                                    \
    if (dtrain_err_ != cudaSuccess) {                                                          \
      throw ::dtrain::Error(::fmt::format("CUDA call {} failed at {}:{}: {} ({})", #call,      \
                                          __FILE__, __LINE__, cudaGetErrorString(dtrain_err_), \
                                          static_cast<int>(dtrain_err_)));                     \
    }                                                                                          \
  } while (0)
