// Kernel-table cases for kernels/compress.h (check mode only: nothing here is
// differentiated). Top-k on random data, at k = 1 and k = n, and on explicit values
// with equal magnitudes of both signs (ties to the lower index) and zeros; the
// sparse sum of three ranks' pairs onto a base; 1-bit packing with n and the chunk
// not multiples of 32, +0 and -0; unpacking written and added; Gram-Schmidt on tall,
// square and wide-ranked matrices and one with a zero column. Sign words are int32
// bit patterns compared exactly (atol below 1), scales and sums to f32 rounding.
#include <algorithm>
#include <numeric>

#include "kernels/compress.h"
#include "kernels/memory.h"

#include "harness.h"
#include "ref/compress.h"

namespace dtrain::test {

namespace {

using kernels::Workspace;

ArgSpec fixed(const std::string& name, const Shape& shape, DType dtype, Values v) {
  ArgSpec a{name, shape, dtype, Init::explicit_values};
  a.values = std::move(v);
  a.differentiable = false;
  return a;
}

ArgSpec data(const std::string& name, const Shape& shape, double lo = -1.0, double hi = 1.0) {
  ArgSpec a{name, shape, DType::f32, Init::uniform, lo, hi};
  a.differentiable = false;
  return a;
}

KernelCase topk_case(const std::string& variant, int64_t n, int64_t k, Values explicit_x = {}) {
  KernelCase c;
  c.name = "compress/topk_" + variant + "/f32/" + std::to_string(n) + "k" + std::to_string(k);
  c.inputs = {explicit_x.empty() ? data("x", Shape{n})
                                 : fixed("x", Shape{n}, DType::f32, std::move(explicit_x))};
  c.outputs = {{"indices", Shape{k}, DType::i32}, {"values", Shape{k}, DType::f32}};
  c.workspace_on = [n](Device d) { return kernels::topk_workspace_bytes(n, d); };
  c.forward = [](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace ws) {
    kernels::topk_select(in[0], out[0], out[1], ws);
  };
  c.reference = [n, k](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::topk(in[0].data(), n, k, out[0].data(), out[1].data());
  };
  c.check_tol = {0.0, 0.0};  // a selection is exact
  return c;
}

// Three runs (ranks) of `k` distinct indices in [0, n), each a shuffled prefix.
Values rank_indices(int64_t n, int64_t k, int runs) {
  Values v;
  for (int r = 0; r < runs; ++r) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), 0);
    for (int64_t i = n - 1; i > 0; --i)  // a fixed Fisher-Yates from a tiny LCG
      std::swap(p[static_cast<size_t>(i)],
                p[static_cast<size_t>((i * 2654435761u + static_cast<uint64_t>(r) * 40503u) %
                                      static_cast<uint64_t>(i + 1))]);
    for (int64_t j = 0; j < k; ++j) v.push_back(static_cast<double>(p[static_cast<size_t>(j)]));
  }
  return v;
}

KernelCase scatter_case(int64_t n, int64_t k, int runs) {
  KernelCase c;
  c.name = "compress/scatter_add/f32/" + std::to_string(n) + "x" + std::to_string(runs) + "k" +
           std::to_string(k);
  const int64_t m = k * runs;
  c.inputs = {data("base", Shape{n}),
              fixed("indices", Shape{m}, DType::i32, rank_indices(n, k, runs)),
              data("values", Shape{m})};
  c.outputs = {{"out", Shape{n}, DType::f32}};
  c.forward = [k](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::copy(in[0], out[0]);
    kernels::scatter_add(in[1], in[2], k, out[0]);
  };
  c.reference = [n, m](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::scatter_add(in[0].data(), n, in[1].data(), in[2].data(), m, out[0].data());
  };
  c.check_tol = {1e-6, 1e-6};  // up to `runs` f32 additions per entry
  return c;
}

KernelCase clear_case(int64_t n, int64_t k) {
  KernelCase c;
  c.name = "compress/clear_at/f32/" + std::to_string(n) + "k" + std::to_string(k);
  c.inputs = {data("x", Shape{n}), fixed("indices", Shape{k}, DType::i32, rank_indices(n, k, 1))};
  c.outputs = {{"out", Shape{n}, DType::f32}};
  c.forward = [](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::copy(in[0], out[0]);
    kernels::clear_at(in[1], out[0]);
  };
  c.reference = [n, k](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::clear_at(in[0].data(), n, in[1].data(), k, out[0].data());
  };
  c.check_tol = {0.0, 0.0};
  return c;
}

KernelCase pack_case(int64_t n, int64_t chunk, Values explicit_x = {}) {
  KernelCase c;
  c.name = "compress/sign_pack" + std::string(explicit_x.empty() ? "" : "_zeros") + "/f32/" +
           std::to_string(n) + "c" + std::to_string(chunk);
  c.inputs = {explicit_x.empty() ? data("x", Shape{n})
                                 : fixed("x", Shape{n}, DType::f32, std::move(explicit_x))};
  c.outputs = {{"words", Shape{(n + 31) / 32}, DType::i32},
               {"scales", Shape{(n + chunk - 1) / chunk}, DType::f32}};
  c.forward = [chunk](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::sign_pack(in[0], chunk, out[0], out[1]);
  };
  c.reference = [n, chunk](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::sign_pack(in[0].data(), n, chunk, out[0].data(), out[1].data());
  };
  c.check_tol = {1e-7, 0.0};  // words exact (integers); scales (<= 1) to f32 rounding
  return c;
}

KernelCase unpack_case(int64_t n, int64_t chunk, bool add) {
  KernelCase c;
  c.name = std::string("compress/sign_unpack_") + (add ? "add" : "write") + "/f32/" +
           std::to_string(n) + "c" + std::to_string(chunk);
  ArgSpec words{"words",        Shape{(n + 31) / 32}, DType::i32,
                Init::integers, -2147483648.0,        2147483648.0};
  words.differentiable = false;
  c.inputs = {words, data("scales", Shape{(n + chunk - 1) / chunk}, 0.1, 2.0),
              data("base", Shape{n})};
  c.outputs = {{"out", Shape{n}, DType::f32}};
  c.forward = [chunk, add](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    if (add) kernels::copy(in[2], out[0]);
    kernels::sign_unpack(in[0], in[1], chunk, out[0], add);
  };
  c.reference = [n, chunk, add](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::sign_unpack(in[0].data(), in[1].data(), n, chunk, add ? in[2].data() : nullptr,
                     out[0].data());
  };
  c.check_tol = {1e-6, 1e-6};
  return c;
}

KernelCase ortho_case(int64_t rows, int64_t cols, Values explicit_a = {}) {
  KernelCase c;
  c.name = "compress/orthonormalize" + std::string(explicit_a.empty() ? "" : "_zero_column") +
           "/f32/" + std::to_string(rows) + "x" + std::to_string(cols);
  c.inputs = {explicit_a.empty()
                  ? data("a", Shape{rows, cols})
                  : fixed("a", Shape{rows, cols}, DType::f32, std::move(explicit_a))};
  c.outputs = {{"q", Shape{rows, cols}, DType::f32}};
  c.forward = [](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::copy(in[0], out[0]);
    kernels::orthonormalize_columns(out[0]);
  };
  c.reference = [rows, cols](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::orthonormalize_columns(in[0].data(), rows, cols, out[0].data());
  };
  c.check_tol = {2e-5, 2e-5};  // f32 Gram-Schmidt of a well-conditioned matrix
  return c;
}

}  // namespace

std::vector<KernelCase> cases_compress() {
  std::vector<KernelCase> cs;
  cs.push_back(topk_case("random", 1000, 20));
  cs.push_back(topk_case("random", 4099, 1));
  cs.push_back(topk_case("random", 777, 777));  // ratio 1: every index
  cs.push_back(topk_case("random", 200000, 4000));
  // Equal magnitudes of both signs (-3 at 1 before 3 at 2), zeros of both signs.
  cs.push_back(topk_case("ties", 10, 4, {1.0, -3.0, 3.0, 2.0, -0.5, 0.0, -2.0, 2.0, -0.0, 0.25}));
  cs.push_back(topk_case("ties", 10, 9, {1.0, -3.0, 3.0, 2.0, -0.5, 0.0, -2.0, 2.0, -0.0, 0.25}));
  cs.push_back(scatter_case(400, 50, 3));
  cs.push_back(scatter_case(5000, 5000, 2));  // ratio 1: every entry from each run
  cs.push_back(clear_case(1000, 37));
  cs.push_back(pack_case(1000, 64));
  cs.push_back(pack_case(5000, 1024));
  // +0 and -0 (both +), tiny magnitudes; scaled into [-1, 1] so scales stay below 1.
  Values signs = {1.0,  -2.0, 0.0,  -0.0, 3.0,  -1e-30, 1e-30,  0.5,  -0.5, 7.0,  -7.0,
                  0.0,  0.0,  -0.0, -0.0, 1.0,  1.0,    1.0,    -1.0, -1.0, -1.0, 2.0,
                  -2.0, 4.0,  -4.0, 8.0,  -8.0, 0.125,  -0.125, 9.0,  -9.0, 0.0,  -3.0};
  for (double& v : signs) v /= 16.0;
  cs.push_back(pack_case(33, 5, signs));
  cs.push_back(unpack_case(1000, 64, false));
  cs.push_back(unpack_case(1000, 64, true));
  cs.push_back(unpack_case(70, 1024, true));
  cs.push_back(ortho_case(300, 4));
  cs.push_back(ortho_case(64, 8));
  cs.push_back(ortho_case(7, 7));
  Values zero_col(5 * 3);
  for (int i = 0; i < 5; ++i) {
    zero_col[i * 3] = 1.0 + i;
    zero_col[i * 3 + 2] = i % 2 ? -0.5 : 0.75;  // column 1 stays 0
  }
  cs.push_back(ortho_case(5, 3, zero_col));
  return cs;
}

}  // namespace dtrain::test
