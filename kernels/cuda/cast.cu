// CUDA cast. Wide sources (f64, i32, i64) reach a half type through an f32
// rounded to odd, which never changes the final round-to-nearest-even (f32
// keeps >= 2 more bits than f16 or bf16): the same scheme, line for line, as
// kernels/cpu/cast.cpp, so both backends give the same bits.
#include <cfloat>

#include "kernels/cuda/cast.cuh"
#include "kernels/cuda/launch.cuh"

namespace dtrain::kernels::cuda_ops {

namespace {

__device__ float f64_to_f32_odd(double d) {
  float f = static_cast<float>(d);
  if (isnan(d) || static_cast<double>(f) == d) return f;
  if (isinf(f)) return copysignf(FLT_MAX, f);
  if ((__float_as_uint(f) & 1u) == 0) {
    f = nextafterf(f, static_cast<double>(f) < d ? INFINITY : -INFINITY);
  }
  return f;
}

__device__ float i64_to_f32_odd(int64_t v) {
  const uint64_t mag = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  const int width = 64 - __clzll(static_cast<long long>(mag));
  const int shift = width > 24 ? width - 24 : 0;
  uint64_t m = mag >> shift;
  if (shift > 0 && (mag & ((uint64_t{1} << shift) - 1)) != 0) m |= 1;
  const float f = ldexpf(static_cast<float>(m), shift);  // exact: m < 2^24
  return v < 0 ? -f : f;
}

// One source element as the f32 the destination rounds from (see the file comment).
template <typename S>
__device__ float source_f32(S s, bool to_half) {
  if constexpr (std::is_same_v<S, double>) {
    return to_half ? f64_to_f32_odd(s) : static_cast<float>(s);
  } else if constexpr (std::is_same_v<S, int32_t> || std::is_same_v<S, int64_t>) {
    return to_half ? i64_to_f32_odd(s) : static_cast<float>(s);
  } else if constexpr (std::is_same_v<S, uint8_t>) {
    return static_cast<float>(s);
  } else {
    return load(&s, 0);
  }
}

template <typename S>
__device__ double source_f64(S s) {
  if constexpr (std::is_same_v<S, __half> || std::is_same_v<S, __nv_bfloat16>) {
    return load(&s, 0);
  } else {
    return static_cast<double>(s);
  }
}

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    if constexpr (std::is_same_v<D, double>) {
      dst[i] = source_f64(src[i]);
    } else {
      store(dst, i, source_f32(src[i], !std::is_same_v<D, float>));
    }
  }
}

template <typename Fn>
void dispatch_any(DType t, Fn&& fn) {
  switch (t) {
    case DType::f64:
      return fn(Tag<double>{});
    case DType::i32:
      return fn(Tag<int32_t>{});
    case DType::i64:
      return fn(Tag<int64_t>{});
    case DType::u8:
      return fn(Tag<uint8_t>{});
    default:
      return dispatch_float(t, fn);
  }
}

}  // namespace

void launch_cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n,
                 cudaStream_t stream) {
  if (n == 0) return;
  dispatch_any(src_dtype, [&](auto stag) {
    using S = typename decltype(stag)::type;
    dispatch_any(dst_dtype, [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      if constexpr (std::is_floating_point_v<D> || std::is_same_v<D, __half> ||
                    std::is_same_v<D, __nv_bfloat16>) {
        cast_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const S*>(src),
                                                          static_cast<D*>(dst), n);
        DTRAIN_CUDA_CHECK_LAUNCH();
      } else {
        throw ::dtrain::Error("CUDA cast: the destination must be a float dtype");
      }
    });
  });
}

}  // namespace dtrain::kernels::cuda_ops
