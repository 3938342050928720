// CPU permute: walks the output in order and gathers from the input through
// the permuted strides; the innermost output dim is a strided copy loop.
// CUDA tensors go, after the same checks, to kernels/cuda/layout.cu.
#include "kernels/layout.h"

#include <array>
#include <cstring>

#include "core/parallel.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels {

void permute(const Tensor& x, std::span<const int> perm, Tensor& y) {
  const Device device = same_device("permute", {&x, &y});
  const int rank = x.rank();
  DTRAIN_CHECK(rank >= 1 && rank <= 6 && static_cast<int>(perm.size()) == rank && y.rank() == rank,
               "permute: rank {} with {} perm entries", rank, perm.size());
  DTRAIN_CHECK(x.dtype() == y.dtype(), "permute: dtype mismatch");
  std::array<int64_t, 6> in_stride{}, src_stride{}, out_dim{};
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    in_stride[i] = s;
    s *= x.dim(i);
  }
  unsigned seen = 0;
  for (int i = 0; i < rank; ++i) {
    DTRAIN_CHECK(perm[i] >= 0 && perm[i] < rank && !(seen & (1u << perm[i])), "permute: bad perm");
    seen |= 1u << perm[i];
    DTRAIN_CHECK(y.dim(i) == x.dim(perm[i]), "permute: y{} vs x{}", y.shape().str(),
                 x.shape().str());
    src_stride[i] = in_stride[perm[i]];
    out_dim[i] = y.dim(i);
  }
  if (device.is_cuda()) return cuda_ops::permute(x, out_dim, src_stride, y);
  const size_t es = dtype_size(x.dtype());
  const auto* src = static_cast<const char*>(x.raw());
  auto* dst = static_cast<char*>(y.raw());
  const int64_t inner = out_dim[rank - 1];
  const int64_t inner_stride = src_stride[rank - 1];
  const int64_t rows = y.numel() / std::max<int64_t>(inner, 1);
  parallel_for(0, rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t rem = r, off = 0;
      for (int i = rank - 2; i >= 0; --i) {
        off += (rem % out_dim[i]) * src_stride[i];
        rem /= out_dim[i];
      }
      char* out = dst + static_cast<size_t>(r * inner) * es;
      if (inner_stride == 1) {
        std::memcpy(out, src + static_cast<size_t>(off) * es, static_cast<size_t>(inner) * es);
        continue;
      }
      for (int64_t j = 0; j < inner; ++j) {
        std::memcpy(out + j * es, src + static_cast<size_t>(off + j * inner_stride) * es, es);
      }
    }
  });
}

}  // namespace dtrain::kernels
