// CPU embedding: forward copies table rows by id (any dtype, rows as bytes);
// backward adds dout rows into dtable without atomics: the table rows are split
// among tasks, each task scans all ids in order and accumulates only the rows it
// owns, so every row sums its contributions in id order (thread-independent).
// Ids are validated (Error naming position and id) before any work. CUDA tensors
// go to kernels/cuda/embedding.cu (same order of adds; ids not read on the host).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/float_io.h"
#include "kernels/cuda_ops.h"
#include "kernels/embedding.h"

namespace dtrain::kernels {

namespace {

template <typename Id>
void check_ids(const Id* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < vocab) continue;
    throw Error(fmt::format("embedding: id {} at position {} is outside [0, {})",
                            static_cast<int64_t>(ids[i]), i, vocab),
                "token ids must be below the vocabulary size; check the tokenizer and vocab_size");
  }
}

// Calls fn(ids pointer) for i32 or i64 ids.
template <typename Fn>
void with_ids(const Tensor& ids, Fn&& fn) {
  if (ids.dtype() == DType::i32) {
    fn(ids.data<int32_t>());
  } else {
    fn(ids.data<int64_t>());
  }
}

// dout rows (S) added into the table (T: S, or f32 for a half dout), each add rounded
// to T, in id order.
template <typename S, typename T, typename Id>
void scatter_add(const Id* ids, int64_t n, int64_t vocab, int64_t dim, const S* dout, T* dtable) {
  const int64_t tasks = std::max(1, num_threads());
  const int64_t rows_per_task = (vocab + tasks - 1) / tasks;
  parallel_for(0, vocab, rows_per_task, [&](int64_t lo, int64_t hi) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = ids[i];
      if (row < lo || row >= hi) continue;
      const S* src = dout + i * dim;
      T* dst = dtable + row * dim;
      for (int64_t k = 0; k < dim; ++k)
        cpu_io::store(dst, k, cpu_io::load(dst, k) + cpu_io::load(src, k));
    }
  });
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) {
  const Device device = same_device("embedding_forward", {&ids, &table, &out});
  require_dtype("embedding_forward", "ids", ids, {DType::i32, DType::i64});
  DTRAIN_CHECK(table.rank() == 2, "embedding_forward: table {} is not [vocab, dim]", table.str());
  DTRAIN_CHECK(out.dtype() == table.dtype(), "embedding_forward: out {} vs table {}", out.str(),
               table.str());
  const int64_t n = ids.numel(), vocab = table.dim(0), dim = table.dim(1);
  require_numel("embedding_forward", "out", out, n * dim);
  if (device.is_cuda()) return cuda_ops::embedding_forward(ids, table, out);
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(table.dtype());
  const auto* src = static_cast<const char*>(table.raw());
  auto* dst = static_cast<char*>(out.raw());
  with_ids(ids, [&](const auto* id) {
    check_ids(id, n, vocab);
    parallel_for(0, n, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t i = lo; i < hi; ++i) {
                     std::memcpy(dst + i * row_bytes, src + id[i] * row_bytes, row_bytes);
                   }
                 });
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  const Device device = same_device("embedding_backward", {&ids, &dout, &dtable});
  require_dtype("embedding_backward", "ids", ids, {DType::i32, DType::i64});
  require_dtype("embedding_backward", "dtable", dtable, {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(dtable.rank() == 2, "embedding_backward: dtable {} is not [vocab, dim]",
               dtable.str());
  DTRAIN_CHECK(dout.dtype() == dtable.dtype() || dtable.dtype() == DType::f32,
               "embedding_backward: dout {} vs dtable {}", dout.str(), dtable.str());
  require_dtype("embedding_backward", "dout", dout, {DType::f32, DType::f16, DType::bf16});
  const int64_t n = ids.numel(), vocab = dtable.dim(0), dim = dtable.dim(1);
  require_numel("embedding_backward", "dout", dout, n * dim);
  if (device.is_cuda()) return cuda_ops::embedding_backward(ids, dout, dtable);
  with_ids(ids, [&](const auto* id) {
    check_ids(id, n, vocab);
    cpu_io::dispatch_float(dout.dtype(), [&](auto src_tag) {
      using S = decltype(src_tag);
      cpu_io::dispatch_float(dtable.dtype(), [&](auto tag) {
        using T = decltype(tag);
        scatter_add(id, n, vocab, dim, static_cast<const S*>(dout.raw()),
                    static_cast<T*>(dtable.raw()));
      });
    });
  });
}

void embedding_forward_share(const Tensor& ids, const Tensor& table, int64_t first, int64_t total,
                             Tensor& out) {
  same_device("embedding_forward_share", {&ids, &table, &out});
  DTRAIN_CHECK(ids.device().is_cpu(), "embedding_forward_share: CPU tensors only");
  require_dtype("embedding_forward_share", "ids", ids, {DType::i32, DType::i64});
  DTRAIN_CHECK(table.rank() == 2 && out.dtype() == table.dtype() && first >= 0 &&
                   first + table.dim(0) <= total,
               "embedding_forward_share: table {} rows from {} of {}, out {}", table.str(), first,
               total, out.str());
  const int64_t n = ids.numel(), rows = table.dim(0), dim = table.dim(1);
  require_numel("embedding_forward_share", "out", out, n * dim);
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(table.dtype());
  const auto* src = static_cast<const char*>(table.raw());
  auto* dst = static_cast<char*>(out.raw());
  with_ids(ids, [&](const auto* id) {
    check_ids(id, n, total);
    parallel_for(0, n, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t i = lo; i < hi; ++i) {
                     const int64_t row = static_cast<int64_t>(id[i]) - first;
                     if (row >= 0 && row < rows) {
                       std::memcpy(dst + i * row_bytes, src + row * row_bytes, row_bytes);
                     } else {
                       std::memset(dst + i * row_bytes, 0, row_bytes);  // +0 in every dtype
                     }
                   }
                 });
  });
}

void embedding_backward_share(const Tensor& ids, const Tensor& dout, int64_t first, int64_t total,
                              Tensor& dtable) {
  same_device("embedding_backward_share", {&ids, &dout, &dtable});
  DTRAIN_CHECK(ids.device().is_cpu(), "embedding_backward_share: CPU tensors only");
  require_dtype("embedding_backward_share", "ids", ids, {DType::i32, DType::i64});
  require_dtype("embedding_backward_share", "dtable", dtable,
                {DType::f32, DType::f16, DType::bf16});
  DTRAIN_CHECK(dtable.rank() == 2 && dout.dtype() == dtable.dtype() && first >= 0 &&
                   first + dtable.dim(0) <= total,
               "embedding_backward_share: dtable {} rows from {} of {}, dout {}", dtable.str(),
               first, total, dout.str());
  const int64_t n = ids.numel(), rows = dtable.dim(0), dim = dtable.dim(1);
  require_numel("embedding_backward_share", "dout", dout, n * dim);
  with_ids(ids, [&](const auto* id) {
    check_ids(id, n, total);
    // The ids as rows of this table; another rank's rows become -1, which no task owns.
    std::vector<int64_t> local(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = static_cast<int64_t>(id[i]) - first;
      local[static_cast<size_t>(i)] = row >= 0 && row < rows ? row : -1;
    }
    cpu_io::dispatch_float(dtable.dtype(), [&](auto tag) {
      using T = decltype(tag);
      scatter_add(local.data(), n, rows, dim, static_cast<const T*>(dout.raw()),
                  static_cast<T*>(dtable.raw()));
    });
  });
}

void labeled_rows(const Tensor& labels, int64_t ignore_index, Tensor& ids, Tensor& out) {
  constexpr std::string_view op = "labeled_rows";
  const Device device = same_device(op, {&labels, &ids, &out});
  for (const Tensor* t : std::initializer_list<const Tensor*>{&labels, &ids, &out})
    require_dtype(op, "labels/ids/out", *t, {DType::i32});
  DTRAIN_CHECK(labels.rank() == 2 && out.rank() == 2 && out.dim(0) == labels.dim(0) &&
                   out.dim(1) <= labels.dim(1),
               "labeled_rows: labels {} and out {} must be [B, T] and [B, R <= T]", labels.str(),
               out.str());
  require_numel(op, "ids", ids, out.numel());
  if (device.is_cuda()) return cuda_ops::labeled_rows(labels, ignore_index, ids, out);
  const int64_t b = labels.dim(0), t = labels.dim(1), rows = out.dim(1);
  const int32_t* lab = labels.data<int32_t>();
  int32_t* id = ids.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    int64_t n = 0;
    for (int64_t j = 0; j < t; ++j) {
      const int32_t label = lab[i * t + j];
      if (label == ignore_index) continue;
      if (n == rows) {
        throw Error(fmt::format("gather_labeled: sequence {} of the batch has more than {} "
                                "labelled positions",
                                i, rows),
                    "the masked-LM head predicts a fixed number of positions per sequence "
                    "(round(data.mlm_probability * seq_len)); labels must come from the "
                    "masked-LM loader, which selects exactly that many");
      }
      id[i * rows + n] = static_cast<int32_t>(i * t + j);
      o[i * rows + n] = label;
      ++n;
    }
    for (; n < rows; ++n) {  // padding: any row of this sequence, its label ignored
      id[i * rows + n] = static_cast<int32_t>(i * t);
      o[i * rows + n] = static_cast<int32_t>(ignore_index);
    }
  }
}

void padding_mask(const Tensor& ids, int32_t pad_id, Tensor& mask) {
  constexpr std::string_view op = "padding_mask";
  const Device device = same_device(op, {&ids, &mask});
  require_dtype(op, "ids", ids, {DType::i32});
  require_dtype(op, "mask", mask, {DType::u8});
  require_numel(op, "mask", mask, ids.numel());
  if (device.is_cuda()) return cuda_ops::padding_mask(ids, pad_id, mask);
  const int32_t* id = ids.data<int32_t>();
  uint8_t* m = mask.data<uint8_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) m[i] = id[i] != pad_id;
}

}  // namespace dtrain::kernels
