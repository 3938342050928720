// KvDecoder (runtime/decoder.h): GPT-2's block (models/gpt2.cpp) for one position per
// sample, its keys and values kept per layer.
#include "runtime/decoder.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/layout.h"
#include "kernels/memory.h"

namespace dtrain::runtime {
namespace {

constexpr float kLnEps = 1e-5f;  // GPT-2's layer norms (models/gpt2.cpp)

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

kernels::Workspace workspace_of(const Tensor& t) { return {t.raw(), t.nbytes(), t.device()}; }

}  // namespace

KvDecoder::KvDecoder(const models::TransformerShape& shape, int64_t batch,
                     const std::vector<graph::FlatEntry>& layout, const Tensor& weights)
    : s_(shape),
      batch_(batch),
      d_(shape.hidden / shape.heads),
      device_(weights.device()),
      layout_(layout),
      weights_(weights) {
  DTRAIN_CHECK(weights.dtype() == DType::f32 && weights.numel() == layout_.buffer_elems(DType::f32),
               "KvDecoder: weights {} for a layout of {} f32", weights.str(),
               layout_.buffer_elems(DType::f32));
  const int64_t b = batch_, h = s_.hidden, c = s_.seq_len;
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

  // One workspace for the largest need of any call.
  size_t ws = 0;
  const auto gemm_need = [&](int64_t m, int64_t n, int64_t k) {
    kernels::GemmArgs a;
    a.trans_b = kernels::Trans::yes;
    a.m = m, a.n = n, a.k = k;
    ws = std::max(ws, kernels::gemm_workspace_bytes(a, DType::f32, DType::f32, device_));
  };
  gemm_need(b, 3 * h, h);
  gemm_need(b, h, h);
  gemm_need(b, s_.ffn, h);
  gemm_need(b, h, s_.ffn);
  gemm_need(b, s_.vocab, h);
  ws = std::max(ws, kernels::gemm_workspace_bytes(block_copy(b * s_.heads, c * d_, c * d_, c * d_),
                                                  DType::f32, DType::f32, device_));
  kernels::AttentionArgs att;
  att.b = b, att.h = s_.heads, att.tq = 1, att.tk = c, att.d = d_;
  ws = std::max(ws, kernels::attention_workspace_bytes(att, DType::f32, device_));
  workspace_ = alloc({static_cast<int64_t>(std::max<size_t>(ws, 64))}, DType::u8);
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

Tensor KvDecoder::w(const std::string& name) const {
  for (const graph::FlatEntry& e : layout_.entries())
    if (e.name == name) return weights_.view(e.offset, e.spec.shape);
  DTRAIN_CHECK(false, "KvDecoder: no parameter {}", name);
  return {};
}

Tensor KvDecoder::alloc(Shape shape, DType dtype) const {
  return Tensor::empty(shape, dtype, &kernels::device_allocator(device_));
}

void KvDecoder::linear(const std::string& name, const Tensor& x, Tensor& y, bool gelu) {
  const Tensor weight = w(name + ".weight");  // [out, in]
  kernels::GemmArgs a;
  a.trans_b = kernels::Trans::yes;
  a.m = batch_;
  a.n = weight.dim(0);
  a.k = weight.dim(1);
  a.epilogue = gelu ? kernels::Epilogue::bias_gelu : kernels::Epilogue::bias;
  kernels::gemm(a, x, weight, y, workspace_of(workspace_), w(name + ".bias"),
                gelu ? pre_ : Tensor());
}

void KvDecoder::append(const Tensor& src, int64_t src_rows, int64_t rows, int64_t at,
                       Tensor& cache) {
  const int64_t bh = batch_ * s_.heads, c = s_.seq_len;
  DTRAIN_CHECK(at + rows <= c && rows <= src_rows, "KvDecoder: rows [{}, {}) of {}", at, at + rows,
               c);
  Tensor dst = cache.view(at * d_, {(bh - 1) * c * d_ + rows * d_});
  kernels::gemm(block_copy(bh, rows * d_, src_rows * d_, c * d_), one_, src, dst,
                workspace_of(workspace_));
}

void KvDecoder::fill(const graph::Executor& ex, const std::vector<graph::ValueId>& qkv,
                     int64_t length, int64_t filled) {
  DTRAIN_CHECK(
      static_cast<int64_t>(qkv.size()) == s_.layers && filled <= length && filled <= s_.seq_len,
      "KvDecoder::fill: {} of {} positions", filled, length);
  const int64_t b = batch_, heads = s_.heads;
  Tensor split = alloc({3, b, heads, length, d_});
  constexpr std::array<int, 5> perm = {2, 0, 3, 1,
                                       4};  // [B, L, 3, heads, d] -> [3, B, heads, L, d]
  for (int64_t i = 0; i < s_.layers; ++i) {
    const Tensor& t = ex.value(qkv[static_cast<size_t>(i)]);  // [B, L, 3 * hidden]
    kernels::permute(t.view(0, {b, length, 3, heads, d_}), perm, split);
    const int64_t part = b * heads * length * d_;
    append(split.view(part, {b * heads, length, d_}), length, filled, 0,
           k_[static_cast<size_t>(i)]);
    append(split.view(2 * part, {b * heads, length, d_}), length, filled, 0,
           v_[static_cast<size_t>(i)]);
  }
  filled_ = filled;
}

const Tensor& KvDecoder::step(const std::vector<int32_t>& tokens) {
  const int64_t b = batch_, h = s_.hidden, c = s_.seq_len, pos = filled_;
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

  kernels::embedding_forward(ids_, w("transformer.word_embeddings.weight"), tok_);
  kernels::embedding_forward(pos_, w("transformer.position_embeddings.weight"), h_);
  kernels::add(tok_, h_, x_);
  const kernels::LayerNormArgs ln{b, h, kLnEps};
  const auto residual = [&](const Tensor& y) {  // x += y
    kernels::add(x_, y, tok_);
    std::swap(x_, tok_);
  };
  kernels::AttentionArgs att;
  att.b = b, att.h = s_.heads, att.tq = 1, att.tk = c, att.d = d_;
  const int64_t part = b * s_.heads * d_;
  constexpr std::array<int, 5> perm = {2, 0, 3, 1,
                                       4};  // [B, 1, 3, heads, d] -> [3, B, heads, 1, d]
  for (int64_t i = 0; i < s_.layers; ++i) {
    const auto k = static_cast<size_t>(i);
    kernels::layer_norm_forward(ln, x_, w(layer(i, "ln_1.weight")), w(layer(i, "ln_1.bias")), h_,
                                mean_, rstd_);
    linear(layer(i, "attn.c_attn"), h_, qkv_);
    kernels::permute(qkv_.view(0, {b, 1, 3, s_.heads, d_}), perm, qkv_heads_);
    append(qkv_heads_.view(part, {b * s_.heads, 1, d_}), 1, 1, pos, k_[k]);
    append(qkv_heads_.view(2 * part, {b * s_.heads, 1, d_}), 1, 1, pos, v_[k]);
    kernels::attention_forward(att, qkv_heads_.view(0, {b, s_.heads, 1, d_}), k_[k], v_[k], mask_,
                               att_, lse_, workspace_of(workspace_));
    linear(layer(i, "attn.c_proj"), att_.view(0, {b, h}), proj_);  // [B, heads, 1, d] = [B, h]
    residual(proj_);
    kernels::layer_norm_forward(ln, x_, w(layer(i, "ln_2.weight")), w(layer(i, "ln_2.bias")), h_,
                                mean_, rstd_);
    linear(layer(i, "mlp.c_fc"), h_, fc_, /*gelu=*/true);
    linear(layer(i, "mlp.c_proj"), fc_, proj_);
    residual(proj_);
  }
  kernels::layer_norm_forward(ln, x_, w("transformer.ln_f.weight"), w("transformer.ln_f.bias"), h_,
                              mean_, rstd_);
  kernels::GemmArgs head;  // the tied word table
  head.trans_b = kernels::Trans::yes;
  head.m = b;
  head.n = s_.vocab;
  head.k = h;
  kernels::gemm(head, h_, w("transformer.word_embeddings.weight"), logits_,
                workspace_of(workspace_));
  ++filled_;
  return logits_;
}

}  // namespace dtrain::runtime
