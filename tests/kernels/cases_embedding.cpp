// Kernel-table cases for kernels/embedding.h: i32 and i64 ids, ids at 0 and
// vocab-1, repeated ids, f32/f16/bf16 tables; grad mode (f32) for the table; half
// gradients into an f32 table, and f32 or f16 ones into a bf16 table refused;
// the scatter-add kernel checked directly on half types; out-of-range ids
// (negative and == vocab) must raise an Error naming the position and the id
// (on CUDA: give a NaN output row and add nothing to the table gradient).
// The token-batch helpers beside them: labeled_rows (a masked-LM head's gather ids)
// and padding_mask (a classifier's key mask), exact on both devices.
#include <cmath>
#include <string>

#include "kernels/elementwise.h"
#include "kernels/embedding.h"

#include "pointwise_case_util.h"
#include "ref/embedding.h"

namespace dtrain::test {

namespace {

using kernels::Workspace;

ArgSpec ids_spec(DType id_type, int64_t n, int64_t vocab, const Values& explicit_ids) {
  ArgSpec ids{"ids", Shape{n}, id_type, Init::integers, 0.0, static_cast<double>(vocab)};
  ids.differentiable = false;
  if (!explicit_ids.empty()) {
    ids.init = Init::explicit_values;
    ids.values = explicit_ids;
  }
  return ids;
}

std::string tag(const char* variant, DType dt, DType id_type, int64_t n, int64_t vocab,
                int64_t dim) {
  return "embedding/" + std::string(variant) + "_" + dname(id_type) + "/" + dname(dt) + "/" +
         std::to_string(n) + "x" + std::to_string(vocab) + "x" + std::to_string(dim);
}

KernelCase forward_case(const char* variant, DType dt, DType id_type, int64_t n, int64_t vocab,
                        int64_t dim, const Values& explicit_ids = {}) {
  KernelCase c;
  c.name = tag(variant, dt, id_type, n, vocab, dim);
  c.inputs = {ids_spec(id_type, n, vocab, explicit_ids), {"table", Shape{vocab, dim}, dt}};
  c.outputs = {{"out", Shape{n, dim}, dt}};
  c.forward = [](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::embedding_forward(in[0], in[1], out[0]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::embedding(n, dim, in[0].data(), in[1].data(), out[0].data());
  };
  if (dt == DType::f32) {
    c.backward = [](const std::vector<Tensor>& in, const std::vector<Tensor>&,
                    const std::vector<Tensor>& dout, std::vector<Tensor>& din, Workspace) {
      kernels::fill(din[1], 0.0f);
      kernels::embedding_backward(in[0], dout[0], din[1]);
    };
  }
  c.check_tol = {0.0, 0.0};  // a gather is exact
  return c;
}

// dtable = scatter-add of dout rows (zeroed first), many repeated ids.
KernelCase backward_case(DType dt, DType id_type, int64_t n, int64_t vocab, int64_t dim) {
  KernelCase c;
  c.name = tag("backward", dt, id_type, n, vocab, dim);
  c.inputs = {ids_spec(id_type, n, vocab, {}), {"dout", Shape{n, dim}, dt}};
  c.outputs = {{"dtable", Shape{vocab, dim}, dt}};
  c.forward = [](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::fill(out[0], 0.0f);
    kernels::embedding_backward(in[0], in[1], out[0]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    ref::embedding_backward(n, vocab, dim, in[0].data(), in[1].data(), out[0].data());
  };
  // Half tables round after every add: error grows with the repeats of an id.
  c.check_tol = dt == DType::f32   ? Tolerance{1e-6, 1e-6}
                : dt == DType::f16 ? Tolerance{1e-2, 1e-2}
                                   : Tolerance{6e-2, 6e-2};
  return c;
}

// A half table's gradient kept in f32: half dout rows added into an f32 dtable (the
// executor's path for a half word table, graph/op.h param_grad_in_f32): f32 sums.
KernelCase backward_wide_case(DType dt, DType id_type, int64_t n, int64_t vocab, int64_t dim) {
  KernelCase c = backward_case(dt, id_type, n, vocab, dim);
  c.name = tag("backward_f32_table", dt, id_type, n, vocab, dim);
  c.outputs = {{"dtable", Shape{vocab, dim}, DType::f32}};
  c.check_tol = {1e-6, 1e-6};
  return c;
}

// ids[2] is out of range: forward and backward must each throw an Error that
// names position 2 and the id. Output 1 = both did.
KernelCase bad_id_case(DType id_type, double bad) {
  KernelCase c;
  c.name = "embedding/bad_id_" + dname(id_type) + "/f32/" + (bad < 0 ? "negative" : "vocab");
  c.inputs = {ids_spec(id_type, 4, 5, {0, 4, bad, 1}), {"table", Shape{5, 3}}};
  c.outputs = {{"threw", Shape{1}}};
  const std::string id_text = std::to_string(static_cast<int64_t>(bad));
  c.forward = [=](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    auto named = [&](auto&& call) {
      try {
        call();
      } catch (const Error& e) {
        const std::string m = e.what();
        return m.find("position 2") != std::string::npos && m.find(id_text) != std::string::npos;
      }
      return false;
    };
    Tensor o = empty_on(in[0], Shape{4, 3}, DType::f32),
           d = empty_on(in[0], Shape{5, 3}, DType::f32);
    if (in[0].device().is_cuda()) {  // ids stay on the device: row 2 is NaN, dtable unchanged
      kernels::embedding_forward(in[0], in[1], o);
      kernels::fill(d, 0.0f);
      kernels::embedding_backward(in[0], o, d);
      const Values ov = to_values(o), dv = to_values(d);
      bool ok = true;
      for (int k = 0; k < 3; ++k) ok = ok && std::isnan(ov[6 + k]) && !std::isnan(ov[k]);
      for (int r = 0; r < 5; ++r) {  // ids 0, 4, 1 take rows 0, 1, 3 of o; rows 2, 3 stay 0
        for (int k = 0; k < 3; ++k) {
          const double v = dv[r * 3 + k];
          ok = ok && !std::isnan(v) &&
               (r == 2 || r == 3 ? v == 0.0
                                 : v == ov[(r == 0   ? 0
                                            : r == 4 ? 1
                                                     : 3) *
                                               3 +
                                           k]);
        }
      }
      kernels::fill(out[0], ok ? 1.0f : 0.0f);
      return;
    }
    const bool fwd = named([&] { kernels::embedding_forward(in[0], in[1], o); });
    const bool bwd = named([&] { kernels::embedding_backward(in[0], o, d); });
    out[0].data<float>()[0] = fwd && bwd ? 1.0f : 0.0f;
  };
  c.reference = [](const std::vector<Values>&, std::vector<Values>& out) { out[0][0] = 1.0; };
  return c;
}

// A half table takes rows of its own dtype only (an f32 table any float rows): f32
// rows and f16 rows into a bf16 table must each be refused (an internal error naming
// the kernel: a caller's bug). Output 1 = both were.
KernelCase bad_dtype_case() {
  KernelCase c;
  c.name = "embedding/bad_dtypes_i32/bf16/4x5x3";
  c.inputs = {ids_spec(DType::i32, 4, 5, {0, 4, 2, 1}), {"table", Shape{5, 3}}};
  c.outputs = {{"threw", Shape{1}}};
  c.forward = [](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    auto refused = [&](DType rows_dtype) {
      Tensor rows = empty_on(in[0], Shape{4, 3}, rows_dtype);
      Tensor table = empty_on(in[0], Shape{5, 3}, DType::bf16);
      try {
        kernels::embedding_backward(in[0], rows, table);
      } catch (const InternalError& e) {  // a caller's bug, not bad input
        return std::string(e.what()).find("embedding_backward") != std::string::npos;
      }
      return false;
    };
    const bool ok = refused(DType::f32) && refused(DType::f16);
    kernels::fill(out[0], ok ? 1.0f : 0.0f);
  };
  c.reference = [](const std::vector<Values>&, std::vector<Values>& out) { out[0][0] = 1.0; };
  return c;
}

// labeled_rows: labels i32 [b, t] -> the flat positions of each row's first r labelled
// tokens (padding: the row's first position) and their labels (padding: ignore).
KernelCase labeled_rows_case(int64_t b, int64_t t, int64_t r, const Values& labels) {
  constexpr double kIgnore = -100.0;
  KernelCase c;
  c.name = "embedding/labeled_rows_i32/i32/" + std::to_string(b) + "x" + std::to_string(t) + "x" +
           std::to_string(r);
  ArgSpec lab{"labels", Shape{b, t}, DType::i32, Init::explicit_values};
  lab.values = labels;
  lab.differentiable = false;
  c.inputs = {lab};
  c.outputs = {{"ids", Shape{b * r}, DType::i32}, {"rows", Shape{b, r}, DType::i32}};
  for (ArgSpec& o : c.outputs) o.differentiable = false;
  c.forward = [](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::labeled_rows(in[0], -100, out[0], out[1]);
  };
  c.reference = [=](const std::vector<Values>& in, std::vector<Values>& out) {
    for (int64_t i = 0; i < b; ++i) {
      int64_t n = 0;
      for (int64_t j = 0; j < t && n < r; ++j) {
        const double label = in[0][i * t + j];
        if (label == kIgnore) continue;
        out[0][i * r + n] = static_cast<double>(i * t + j);
        out[1][i * r + n] = label;
        ++n;
      }
      for (; n < r; ++n) {
        out[0][i * r + n] = static_cast<double>(i * t);
        out[1][i * r + n] = kIgnore;
      }
    }
  };
  c.check_tol = {0.0, 0.0};
  return c;
}

// padding_mask: ids i32 [b, t] -> u8 1 where the id is not pad (pad -1 masks nothing).
KernelCase padding_mask_case(int64_t b, int64_t t, int32_t pad, const Values& ids) {
  KernelCase c;
  c.name = "embedding/padding_mask_i32/u8/" + std::to_string(b) + "x" + std::to_string(t) +
           (pad < 0 ? "_nopad" : "_pad" + std::to_string(pad));
  ArgSpec id{"ids", Shape{b, t}, DType::i32, Init::explicit_values};
  id.values = ids;
  id.differentiable = false;
  c.inputs = {id};
  c.outputs = {{"mask", Shape{b, t}, DType::u8}};
  c.outputs[0].differentiable = false;
  c.forward = [pad](const std::vector<Tensor>& in, std::vector<Tensor>& out, Workspace) {
    kernels::padding_mask(in[0], pad, out[0]);
  };
  c.reference = [pad](const std::vector<Values>& in, std::vector<Values>& out) {
    for (size_t i = 0; i < in[0].size(); ++i) out[0][i] = in[0][i] != pad ? 1.0 : 0.0;
  };
  c.check_tol = {0.0, 0.0};
  return c;
}

}  // namespace

std::vector<KernelCase> cases_embedding() {
  std::vector<KernelCase> cases;
  for (DType id_type : {DType::i32, DType::i64}) {
    for (DType dt : kFloatTypes) {
      cases.push_back(forward_case("random", dt, id_type, 17, 11, 7));
      cases.push_back(forward_case("edges", dt, id_type, 6, 9, 33, {0, 8, 3, 0, 8, 8}));
      cases.push_back(backward_case(dt, id_type, 65, 7, 33));
      if (dt != DType::f32) cases.push_back(backward_wide_case(dt, id_type, 65, 7, 33));
    }
    cases.push_back(forward_case("single", DType::f32, id_type, 1, 1, 1));
    cases.push_back(forward_case("wide", DType::f32, id_type, 33, 1000, 130));
    cases.push_back(backward_case(DType::f32, id_type, 130, 1000, 17));
    cases.push_back(bad_id_case(id_type, -1));
    cases.push_back(bad_id_case(id_type, 5));
  }
  cases.push_back(bad_dtype_case());
  // Row 0: labels at both ends; row 1: none (all padding); rows 2 and 3: exactly r, the
  // last at the row's end (more than r is an Error on the CPU, so no row has more).
  const double x = -100.0;
  cases.push_back(labeled_rows_case(
      4, 6, 3, {7, x, x, x, x, 2, x, x, x, x, x, x, 0, x, 5, x, 9, x, x, 1, x, x, x, x}));
  cases.push_back(labeled_rows_case(1, 1, 1, {4}));
  // Padding at a row's end (a short text), none, the whole row, and the pad id at the
  // start; a second pad id value checks the kernel compares with its argument.
  const Values ids = {1, 5, 9, 0, 0, 0, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 2, 3, 0, 0, 1};
  cases.push_back(padding_mask_case(4, 6, 0, ids));
  cases.push_back(padding_mask_case(4, 6, 5, ids));
  cases.push_back(padding_mask_case(4, 6, -1, ids));
  Values many(3 * 37);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<double>(i % 3);
  cases.push_back(padding_mask_case(3, 37, 2, many));  // more than one vector's worth
  return cases;
}

}  // namespace dtrain::test
