// KvDecoder (runtime/decoder.h): GPT-2's block (models/gpt2.cpp) for one position per
// sample, its keys and values kept per layer.
#include "runtime/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "graph/ops.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/layout.h"
#include "kernels/memory.h"
#include "models/gpt2.h"

namespace dtrain::runtime {
namespace {

std::string layer(int64_t i, const char* part) {
  return fmt::format("transformer.h.{}.{}", i, part);
}

// y = 1 * x over `batch` strided blocks: a copy of each block to its place, exact in f32.
kernels::GemmArgs block_copy(int64_t batch, int64_t n, int64_t stride_b, int64_t stride_c) {
  kernels::GemmArgs a;
  a.m = 1;
  a.k = 1;
  a.n = n;
  a.batch = batch;
  a.stride_a = 0;
  a.stride_b = stride_b;
  a.stride_c = stride_c;
  return a;
}

}  // namespace

KvDecoder::KvDecoder(const models::TransformerShape& shape, int64_t batch, int64_t capacity,
                     const graph::FlatStore& weights)
    : s_(shape),
      batch_(batch),
      capacity_(capacity),
      d_(shape.hidden / shape.heads),
      device_(weights.device()) {
  DTRAIN_CHECK(capacity >= 1 && capacity <= shape.seq_len, "KvDecoder: {} positions of {}",
               capacity, shape.seq_len);
  const auto view = [&](const std::string& name) {
    Tensor t = weights.view(name);
    DTRAIN_CHECK(t.dtype() == DType::f32, "KvDecoder: {} is {}, not f32", name,
                 dtype_name(t.dtype()));
    return t;
  };
  const auto linear = [&](int64_t i, const char* part) {
    return Linear{view(layer(i, part) + ".weight"), view(layer(i, part) + ".bias")};
  };
  const auto norm = [&](const std::string& name) {
    return Norm{view(name + ".weight"), view(name + ".bias")};
  };
  wte_ = view("transformer.word_embeddings.weight");
  wpe_ = view("transformer.position_embeddings.weight");
  ln_f_ = norm("transformer.ln_f");
  for (int64_t i = 0; i < s_.layers; ++i) {
    layers_.push_back({norm(layer(i, "ln_1")), norm(layer(i, "ln_2")), linear(i, "attn.c_attn"),
                       linear(i, "attn.c_proj"), linear(i, "mlp.c_fc"), linear(i, "mlp.c_proj")});
  }
  const int64_t b = batch_, h = s_.hidden, c = capacity_;
  for (int64_t i = 0; i < s_.layers; ++i) {
    for (std::vector<Tensor>* cache : {&k_, &v_}) {
      Tensor t = alloc({b, s_.heads, c, d_});
      kernels::fill(t, 0.0f);  // finite where no key is yet (masked)
      cache->push_back(t);
    }
  }
  ids_host_ = Tensor::empty({b}, DType::i32);
  pos_host_ = Tensor::empty({b}, DType::i32);
  mask_host_ = Tensor::empty({b, c}, DType::u8);
  ids_ = alloc({b}, DType::i32);
  pos_ = alloc({b}, DType::i32);
  mask_ = alloc({b, c}, DType::u8);
  for (Tensor* t : {&x_, &tok_, &h_, &proj_}) *t = alloc({b, h});
  qkv_ = alloc({b, 3 * h});
  qkv_heads_ = alloc({3, b, s_.heads, 1, d_});
  att_ = alloc({b, s_.heads, 1, d_});
  lse_ = alloc({b, s_.heads, 1});
  fc_ = alloc({b, s_.ffn});
  pre_ = alloc({b, s_.ffn});
  logits_ = alloc({b, s_.vocab});
  mean_ = alloc({b});
  rstd_ = alloc({b});
  Tensor one = Tensor::empty({1}, DType::f32);
  one.data<float>()[0] = 1.0f;
  one_ = alloc({1});
  kernels::copy(one, one_);
}

std::vector<graph::ValueId> KvDecoder::qkv_values(const graph::Graph& g, int64_t layers) {
  std::vector<graph::ValueId> out;
  for (int64_t i = 0; i < layers; ++i) {
    const std::string name = layer(i, "attn.c_attn");
    const auto& nodes = g.nodes();
    const auto it = std::find_if(nodes.begin(), nodes.end(),
                                 [&](const graph::Node& n) { return n.name == name; });
    DTRAIN_CHECK(it != nodes.end() && it->outputs.size() == 1, "GPT-2 graph without node {}", name);
    out.push_back(it->outputs[0]);
  }
  return out;
}

Tensor KvDecoder::alloc(Shape shape, DType dtype) const {
  return Tensor::empty(shape, dtype, &kernels::device_allocator(device_));
}

kernels::Workspace KvDecoder::workspace(size_t bytes) {
  bytes = std::max<size_t>(bytes, 64);
  if (!workspace_.defined() || workspace_.nbytes() < bytes)
    workspace_ = alloc({static_cast<int64_t>(bytes)}, DType::u8);
  return {workspace_.raw(), workspace_.nbytes(), device_};
}

void KvDecoder::linear(const Linear& l, const Tensor& x, Tensor& y, bool gelu) {
  kernels::GemmArgs a;
  a.trans_b = kernels::Trans::yes;
  a.m = batch_;
  a.n = l.weight.dim(0);
  a.k = l.weight.dim(1);
  a.epilogue = gelu ? kernels::Epilogue::bias_gelu : kernels::Epilogue::bias;
  const kernels::Workspace ws =
      workspace(kernels::gemm_workspace_bytes(a, DType::f32, DType::f32, device_));
  kernels::gemm(a, x, l.weight, y, ws, l.bias, gelu ? pre_ : Tensor());
}

void KvDecoder::norm(const Norm& n, const Tensor& x, Tensor& y) {
  kernels::layer_norm_forward({batch_, s_.hidden, models::kGpt2LayerNormEps}, x, n.gamma, n.beta, y,
                              mean_, rstd_);
}

void KvDecoder::append(const Tensor& src, int64_t src_rows, int64_t rows, int64_t at,
                       Tensor& cache) {
  const int64_t bh = batch_ * s_.heads, c = capacity_;
  DTRAIN_CHECK(at + rows <= c && rows <= src_rows, "KvDecoder: rows [{}, {}) of {}", at, at + rows,
               c);
  Tensor dst = cache.view(at * d_, {(bh - 1) * c * d_ + rows * d_});
  const kernels::GemmArgs a = block_copy(bh, rows * d_, src_rows * d_, c * d_);
  const kernels::Workspace ws =
      workspace(kernels::gemm_workspace_bytes(a, DType::f32, DType::f32, device_));
  kernels::gemm(a, one_, src, dst, ws);
}

void KvDecoder::fill(const graph::Executor& ex, const std::vector<graph::ValueId>& qkv,
                     int64_t length, int64_t filled) {
  DTRAIN_CHECK(
      static_cast<int64_t>(qkv.size()) == s_.layers && filled <= length && filled <= capacity_,
      "KvDecoder::fill: {} of {} positions", filled, length);
  const int64_t b = batch_, heads = s_.heads;
  Tensor split = alloc({3, b, heads, length, d_});
  const int64_t part = b * heads * length * d_;
  for (int64_t i = 0; i < s_.layers; ++i) {
    const Tensor& t = ex.value(qkv[static_cast<size_t>(i)]);  // [B, L, 3 * hidden]
    kernels::permute(t.view(0, {b, length, 3, heads, d_}), graph::kSplitHeads, split);
    append(split.view(part, {b * heads, length, d_}), length, filled, 0,
           k_[static_cast<size_t>(i)]);
    append(split.view(2 * part, {b * heads, length, d_}), length, filled, 0,
           v_[static_cast<size_t>(i)]);
  }
  filled_ = filled;
}

const Tensor& KvDecoder::step(const std::vector<int32_t>& tokens) {
  const int64_t b = batch_, h = s_.hidden, c = capacity_, pos = filled_;
  DTRAIN_CHECK(static_cast<int64_t>(tokens.size()) == b && pos < c,
               "KvDecoder::step: {} tokens at position {} of {}", tokens.size(), pos, c);
  std::copy(tokens.begin(), tokens.end(), ids_host_.data<int32_t>());
  std::fill_n(pos_host_.data<int32_t>(), b, static_cast<int32_t>(pos));
  uint8_t* m = mask_host_.data<uint8_t>();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t j = 0; j < c; ++j) m[r * c + j] = j <= pos;
  kernels::copy(ids_host_, ids_);
  kernels::copy(pos_host_, pos_);
  kernels::copy(mask_host_, mask_);

  kernels::embedding_forward(ids_, wte_, tok_);
  kernels::embedding_forward(pos_, wpe_, h_);
  kernels::add(tok_, h_, x_);
  const auto residual = [&](const Tensor& y) {  // x += y
    kernels::add(x_, y, tok_);
    std::swap(x_, tok_);
  };
  kernels::AttentionArgs att;
  att.b = b, att.h = s_.heads, att.tq = 1, att.tk = c, att.d = d_;
  const int64_t part = b * s_.heads * d_;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    norm(l.ln_1, x_, h_);
    linear(l.c_attn, h_, qkv_);
    kernels::permute(qkv_.view(0, {b, 1, 3, s_.heads, d_}), graph::kSplitHeads, qkv_heads_);
    append(qkv_heads_.view(part, {b * s_.heads, 1, d_}), 1, 1, pos, k_[i]);
    append(qkv_heads_.view(2 * part, {b * s_.heads, 1, d_}), 1, 1, pos, v_[i]);
    const kernels::Workspace ws =
        workspace(kernels::attention_workspace_bytes(att, DType::f32, device_));
    kernels::attention_forward(att, qkv_heads_.view(0, {b, s_.heads, 1, d_}), k_[i], v_[i], mask_,
                               att_, lse_, ws);
    linear(l.c_proj, att_.view(0, {b, h}), proj_);  // [B, heads, 1, d] is [B, hidden]
    residual(proj_);
    norm(l.ln_2, x_, h_);
    linear(l.c_fc, h_, fc_, /*gelu=*/true);
    linear(l.mlp_proj, fc_, proj_);
    residual(proj_);
  }
  norm(ln_f_, x_, h_);
  kernels::GemmArgs head;  // the tied word table, no bias
  head.trans_b = kernels::Trans::yes;
  head.m = b;
  head.n = s_.vocab;
  head.k = h;
  const kernels::Workspace ws =
      workspace(kernels::gemm_workspace_bytes(head, DType::f32, DType::f32, device_));
  kernels::gemm(head, h_, wte_, logits_, ws);
  ++filled_;
  return logits_;
}

}  // namespace dtrain::runtime
