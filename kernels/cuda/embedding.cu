// CUDA embedding. Forward: a grid-stride copy, one element per thread step.
// Backward, deterministic without atomics, sort or workspace: one thread block
// per position i. The block first checks whether an earlier position holds the
// same id (a block-wide OR over ids[0, i)); if so it exits. Otherwise it owns
// that table row and walks positions i..n-1 in order, adding each matching dout
// row (thread t owns columns t, t + blockDim, ...) and rounding to the table's
// dtype after every add, exactly as the CPU does. So dtable is bit-identical
// to the CPU's and to itself run to run. Cost O(n^2 / blockDim) id reads.
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/launch.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

template <typename Id>
__device__ bool valid_id(Id id, int64_t vocab) {
  return id >= 0 && static_cast<int64_t>(id) < vocab;
}

template <typename E, typename Id>
__global__ void gather_kernel(const Id* ids, int64_t n, const E* table, int64_t vocab, int64_t dim,
                              E* out) {
  for (int64_t e = thread_index(); e < n * dim; e += thread_stride()) {
    const Id id = ids[e / dim];
    if (valid_id(id, vocab)) {
      out[e] = table[static_cast<int64_t>(id) * dim + e % dim];
    } else {
      out[e] = static_cast<E>(~E{0});  // all bits set: NaN for f32/f16/bf16
    }
  }
}

// dout rows (S) into the table (T: S, or f32 for a half dout), rounded to T per add.
template <typename S, typename T, typename Id>
__global__ void scatter_kernel(const Id* ids, int64_t n, const S* dout, int64_t vocab, int64_t dim,
                               T* dtable) {
  __shared__ unsigned char match[kThreads];
  const int64_t i = blockIdx.x;
  const Id id = ids[i];
  if (!valid_id(id, vocab)) return;  // the same for the whole block
  bool earlier = false;
  for (int64_t j = threadIdx.x; j < i; j += blockDim.x) earlier = earlier || ids[j] == id;
  if (__syncthreads_or(earlier)) return;  // an earlier block owns this row
  T* row = dtable + static_cast<int64_t>(id) * dim;
  for (int64_t base = i; base < n; base += kThreads) {
    const int64_t j = base + threadIdx.x;
    __syncthreads();  // the previous chunk's flags are no longer read
    match[threadIdx.x] = j < n && ids[j] == id;
    __syncthreads();
    const int m = n - base < kThreads ? static_cast<int>(n - base) : kThreads;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      float acc = load(row, c);
      for (int k = 0; k < m; ++k) {
        if (!match[k]) continue;
        store(row, c, acc + load(dout + (base + k) * dim, c));
        acc = load(row, c);  // rounded to T after every add, as on the CPU
      }
    }
  }
}

template <typename Fn>
void dispatch_ids(DType id_type, Fn&& fn) {
  if (id_type == DType::i32) return fn(Tag<int32_t>{});
  if (id_type == DType::i64) return fn(Tag<int64_t>{});
  throw ::dtrain::Error(
      ::fmt::format("CUDA embedding: ids dtype {} is not i32 or i64", static_cast<int>(id_type)));
}

template <typename Fn>
void dispatch_bytes(int64_t bytes, Fn&& fn) {
  switch (bytes) {
    case 1:
      return fn(Tag<uint8_t>{});
    case 2:
      return fn(Tag<uint16_t>{});
    case 4:
      return fn(Tag<uint32_t>{});
    case 8:
      return fn(Tag<uint64_t>{});
    default:
      throw ::dtrain::Error(::fmt::format("CUDA embedding: {}-byte elements", bytes));
  }
}

__global__ void labeled_rows_kernel(const int32_t* labels, int64_t b, int64_t t, int64_t rows,
                                    int32_t ignore, int32_t* ids, int32_t* out) {
  for (int64_t i = thread_index(); i < b; i += thread_stride()) {
    int64_t n = 0;
    for (int64_t j = 0; j < t && n < rows; ++j) {
      const int32_t label = labels[i * t + j];
      if (label == ignore) continue;
      ids[i * rows + n] = static_cast<int32_t>(i * t + j);
      out[i * rows + n] = label;
      ++n;
    }
    for (; n < rows; ++n) {
      ids[i * rows + n] = static_cast<int32_t>(i * t);
      out[i * rows + n] = ignore;
    }
  }
}

__global__ void padding_mask_kernel(const int32_t* ids, int64_t n, int32_t pad_id, uint8_t* mask) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) mask[i] = ids[i] != pad_id;
}

}  // namespace

void launch_embedding_forward(DType id_type, const void* ids, int64_t n, const void* table,
                              int64_t vocab, int64_t dim, int64_t elem_bytes, void* out,
                              cudaStream_t stream) {
  if (n * dim == 0) return;
  dispatch_ids(id_type, [&](auto id_tag) {
    using Id = typename decltype(id_tag)::type;
    dispatch_bytes(elem_bytes, [&](auto tag) {
      using E = typename decltype(tag)::type;
      gather_kernel<<<grid_for(n * dim), kThreads, 0, stream>>>(static_cast<const Id*>(ids), n,
                                                                static_cast<const E*>(table), vocab,
                                                                dim, static_cast<E*>(out));
      DTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_embedding_backward(DType id_type, const void* ids, int64_t n, DType dout_type,
                               DType dtype, const void* dout, int64_t vocab, int64_t dim,
                               void* dtable, cudaStream_t stream) {
  if (n == 0 || dim == 0) return;
  dispatch_ids(id_type, [&](auto id_tag) {
    using Id = typename decltype(id_tag)::type;
    dispatch_float(dout_type, [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      dispatch_float(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        scatter_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
            static_cast<const Id*>(ids), n, static_cast<const S*>(dout), vocab, dim,
            static_cast<T*>(dtable));
        DTRAIN_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void launch_labeled_rows(const int32_t* labels, int64_t b, int64_t t, int64_t rows,
                         int32_t ignore_index, int32_t* ids, int32_t* out, cudaStream_t stream) {
  if (b == 0 || rows == 0) return;
  labeled_rows_kernel<<<grid_for(b), kThreads, 0, stream>>>(labels, b, t, rows, ignore_index, ids,
                                                            out);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_padding_mask(const int32_t* ids, int64_t n, int32_t pad_id, uint8_t* mask,
                         cudaStream_t stream) {
  if (n == 0) return;
  padding_mask_kernel<<<grid_for(n), kThreads, 0, stream>>>(ids, n, pad_id, mask);
  DTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace dtrain::kernels::cuda_ops
