// Checked CUDA / cuBLAS(Lt) / cuDNN / NCCL calls: a failure throws dtrain::RunError
// (exit 3: the job could not run here; never exit 2, it is not bad input) with
// the call, the library's own message and the source location. The macros
// name the libraries' functions only when expanded, so a file includes just the
// headers of the libraries it calls. Every kernel launch is followed by
// DTRAIN_CUDA_CHECK_LAUNCH() (launch errors are reported by cudaGetLastError).
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

#define DTRAIN_GPU_FAIL(lib, call, text, code)                                              \
  throw ::dtrain::RunError(::fmt::format("{} call {} failed at {}:{}: {} ({})", lib, #call, \
                                         __FILE__, __LINE__, text, static_cast<int>(code)))

#define DTRAIN_CUDA_CHECK(call)                                                    \
  do {                                                                             \
    const cudaError_t dtrain_err_ = (call);                                        \
    if (dtrain_err_ != cudaSuccess) {                                              \
      DTRAIN_GPU_FAIL("CUDA", call, cudaGetErrorString(dtrain_err_), dtrain_err_); \
    }                                                                              \
  } while (0)

// After every <<<...>>>: configuration errors (bad grid, too much shared memory)
// surface here; faults inside the kernel surface at the next synchronising call.
#define DTRAIN_CUDA_CHECK_LAUNCH() DTRAIN_CUDA_CHECK(cudaGetLastError())

// cuBLAS and cuBLASLt share cublasStatus_t.
#define DTRAIN_CUBLAS_CHECK(call)                                                     \
  do {                                                                                \
    const cublasStatus_t dtrain_st_ = (call);                                         \
    if (dtrain_st_ != CUBLAS_STATUS_SUCCESS) {                                        \
      DTRAIN_GPU_FAIL("cuBLAS", call, cublasGetStatusString(dtrain_st_), dtrain_st_); \
    }                                                                                 \
  } while (0)

#define DTRAIN_CUDNN_CHECK(call)                                                   \
  do {                                                                             \
    const cudnnStatus_t dtrain_st_ = (call);                                       \
    if (dtrain_st_ != CUDNN_STATUS_SUCCESS) {                                      \
      DTRAIN_GPU_FAIL("cuDNN", call, cudnnGetErrorString(dtrain_st_), dtrain_st_); \
    }                                                                              \
  } while (0)

#define DTRAIN_NCCL_CHECK(call)                                                  \
  do {                                                                           \
    const ncclResult_t dtrain_st_ = (call);                                      \
    if (dtrain_st_ != ncclSuccess) {                                             \
      DTRAIN_GPU_FAIL("NCCL", call, ncclGetErrorString(dtrain_st_), dtrain_st_); \
    }                                                                            \
  } while (0)
