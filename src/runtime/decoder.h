// GPT-2 one position at a time with a key/value cache, for `dtrain generate`
// (runtime/generate.h): the training graph runs the prompt once, and this continues
// it, each new token costing one position's work (a matrix-vector product per weight)
// instead of a forward over the whole context. The same arithmetic as the graph's ops
// (layer norm, linear layers with fused bias / GELU, attention over the cached keys),
// through the same kernels on the job's device, in fp32; rounding may differ from the
// graph's forward in the last bits (other GEMM shapes), not more.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/executor.h"
#include "graph/params.h"
#include "models/transformer.h"

namespace dtrain::runtime {

class KvDecoder {
 public:
  // `weights`: the f32 buffer of `layout` (the graph's parameter layout) on the device
  // the decoder runs on; `batch` samples, up to shape.seq_len positions each.
  KvDecoder(const models::TransformerShape& shape, int64_t batch,
            const std::vector<graph::FlatEntry>& layout, const Tensor& weights);

  // The value ids of each layer's fused q, k, v projection in a GPT-2 graph (node
  // "transformer.h.<i>.attn.c_attn", [batch, length, 3 * hidden]): pin them (keep) before
  // the prompt's forward, then fill() from them.
  static std::vector<graph::ValueId> qkv_values(const graph::Graph& g, int64_t layers);

  // After a graph forward over `length` positions: positions [0, filled) of every
  // layer's keys and values into the cache (the rest of the graph's positions were
  // padding).
  void fill(const graph::Executor& ex, const std::vector<graph::ValueId>& qkv, int64_t length,
            int64_t filled);

  // Token ids [batch] (host) at position `filled()`: the cache grows by one and the
  // logits f32 [batch, vocab] (on the device) of the next token are returned.
  const Tensor& step(const std::vector<int32_t>& tokens);

  int64_t filled() const { return filled_; }

 private:
  Tensor w(const std::string& name) const;  // a view of one parameter
  Tensor alloc(Shape shape, DType dtype = DType::f32) const;
  // y [batch, out] = x [batch, in] W^T + b (with GELU when gelu; `pre` then holds x W^T + b).
  void linear(const std::string& name, const Tensor& x, Tensor& y, bool gelu = false);
  // Rows [0, rows) of each (batch, head) of `src` ([batch * heads, src_rows, d]) into the
  // cache's rows [at, at + rows).
  void append(const Tensor& src, int64_t src_rows, int64_t rows, int64_t at, Tensor& cache);

  models::TransformerShape s_;
  int64_t batch_, d_;
  Device device_;
  graph::FlatStore layout_;
  Tensor weights_;
  std::vector<Tensor> k_, v_;  // per layer [batch, heads, seq_len, d]
  int64_t filled_ = 0;
  // Scratch, reused every step.
  Tensor ids_host_, pos_host_, ids_, pos_, mask_host_, mask_;
  Tensor x_, tok_, h_, qkv_, qkv_heads_, att_, lse_, proj_, fc_, pre_, logits_, one_;
  Tensor mean_, rstd_, workspace_;
};

}  // namespace dtrain::runtime
