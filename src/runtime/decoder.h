// GPT-2 one position at a time with a key/value cache, for `dtrain generate`
// (runtime/generate.h): the training graph runs the prompt once, and this continues
// it, each new token costing one position's work (a matrix-vector product per weight)
// instead of a forward over the whole context. The same arithmetic as the graph's ops
// (layer norm, linear layers with fused bias / GELU, attention over the cached keys),
// through the same kernels on the job's device, in fp32. Its GEMMs have one row per
// sample where the graph's have one per position, so rounding may differ in the last
// bits (on this CPU the two have given the same bits; a GPU's GEMMs choose kernels by
// shape).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "graph/executor.h"
#include "graph/params.h"
#include "models/transformer.h"

namespace dtrain::runtime {

class KvDecoder {
 public:
  // `weights`: the graph's parameters (an fp32 graph's store: every entry f32) on the
  // device the decoder runs on; `batch` samples, `capacity` positions each (at most
  // shape.seq_len: what the generation will reach, so a short one holds a short cache).
  KvDecoder(const models::TransformerShape& shape, int64_t batch, int64_t capacity,
            const graph::FlatStore& weights);

  // The value ids of each layer's fused q, k, v projection in a GPT-2 graph (node
  // "transformer.h.<i>.attn.c_attn", [batch, length, 3 * hidden]): pin them (keep) before
  // the prompt's forward, then fill() from them.
  static std::vector<graph::ValueId> qkv_values(const graph::Graph& g, int64_t layers);

  // After a graph forward over `length` positions: positions [0, filled) of every
  // layer's keys and values into the cache (the rest of the graph's positions were
  // padding).
  void fill(const graph::Executor& ex, const std::vector<graph::ValueId>& qkv, int64_t length,
            int64_t filled);

  // Token ids [batch] (host) at position `filled()` (< capacity): the cache grows by one and the
  // logits f32 [batch, vocab] (on the device) of the next token are returned.
  const Tensor& step(const std::vector<int32_t>& tokens);

  int64_t filled() const { return filled_; }

 private:
  struct Linear {
    Tensor weight, bias;  // [out, in], [out]
  };
  struct Norm {
    Tensor gamma, beta;
  };
  struct Layer {
    Norm ln_1, ln_2;
    Linear c_attn, c_proj, c_fc, mlp_proj;
  };

  Tensor alloc(Shape shape, DType dtype = DType::f32) const;
  // The shared workspace, grown to `bytes` when a call needs more.
  kernels::Workspace workspace(size_t bytes);
  // y [batch, out] = x [batch, in] W^T + b (with GELU when gelu; `pre` then holds x W^T + b).
  void linear(const Linear& l, const Tensor& x, Tensor& y, bool gelu = false);
  void norm(const Norm& n, const Tensor& x, Tensor& y);
  // Rows [0, rows) of each (batch, head) of `src` ([batch * heads, src_rows, d]) into the
  // cache's rows [at, at + rows).
  void append(const Tensor& src, int64_t src_rows, int64_t rows, int64_t at, Tensor& cache);

  models::TransformerShape s_;
  int64_t batch_, capacity_, d_;
  Device device_;
  Tensor wte_, wpe_;  // [vocab, hidden] (also the head), [positions, hidden]
  Norm ln_f_;
  std::vector<Layer> layers_;
  std::vector<Tensor> k_, v_;  // per layer [batch, heads, capacity, d]
  int64_t filled_ = 0;
  // Scratch, reused every step.
  Tensor ids_host_, pos_host_, ids_, pos_, mask_host_, mask_;
  Tensor x_, tok_, h_, qkv_, qkv_heads_, att_, lse_, proj_, fc_, pre_, logits_, one_;
  Tensor mean_, rstd_, workspace_;  // workspace_: u8, grown on demand
};

}  // namespace dtrain::runtime
