// Multi-head self-attention core: splits a fused qkv projection into heads,
// runs the memory-efficient attention kernel and merges the heads back. The
// projections themselves are ordinary linear ops around this one. An optional
// second input is the key-padding mask u8 [B, T]. Memory: only the output in
// head layout and the row log-sum-exp are saved (no [T, T] scores anywhere);
// probability dropout is redrawn in backward from the same Philox stream.
#include "kernels/attention.h"
#include "core/rng.h"
#include "graph/ops.h"
#include "kernels/layout.h"

namespace dtrain::graph {
namespace {

constexpr int kMerge[4] = {0, 2, 1, 3};           // [B, H, T, D] <-> [B, T, H, D]
constexpr uint32_t kAttentionDropoutPurpose = 4;  // Philox purposes: 1 init, 3 dropout

class SelfAttention final : public Op {
 public:
  SelfAttention(int64_t heads, kernels::Causal causal, KeyMask mask, float dropout)
      : heads_(heads), causal_(causal), mask_(mask), dropout_(dropout) {}
  std::string_view kind() const override { return "self_attention"; }

  // Tensor parallelism: heads [begin, begin + count) of total, the mask drawn as the
  // whole layer draws it for those heads.
  std::unique_ptr<Op> tensor_share(const TpShare& share) const override {
    if (share.role != TpRole::heads || heads_total_ != 0 || share.total != heads_) return nullptr;
    auto op = std::make_unique<SelfAttention>(*this);
    op->heads_ = share.count;
    op->heads_total_ = share.total;
    op->head_first_ = share.begin;
    return op;
  }

 protected:
  struct Dims {
    int64_t b, t, c, d;
  };
  Dims dims(const Shape& qkv) const { return {qkv[0], qkv[1], qkv[2] / 3, qkv[2] / 3 / heads_}; }
  kernels::AttentionArgs args(const Dims& s) const {
    return {s.b, heads_, s.t, s.t, s.d, 0.0f, causal_};
  }
  // Training draws a fresh mask per (op, step), as the dropout op does.
  kernels::AttentionArgs args(const Dims& s, const OpContext& ctx) const {
    kernels::AttentionArgs a = args(s);
    if (ctx.mode == Mode::train && dropout_ > 0.0f) {
      a.dropout = dropout_;
      a.seed = ctx.seed;
      a.stream = rng_stream_id(kAttentionDropoutPurpose, 0, (ctx.step << 16) | ctx.op_index);
      a.heads_total = heads_total_;
      a.head_first = head_first_;
      const int64_t all_heads = heads_total_ > 0 ? heads_total_ : heads_;
      a.offset = ctx.batch.word_offset(a.b * all_heads * a.tq * a.tk);
    }
    return a;
  }
  size_t head_bytes(const Dims& s, DType dt) const {
    return static_cast<size_t>(s.b * s.t * s.c) * dtype_size(dt);
  }

  int num_inputs() const override { return mask_ == KeyMask::input ? 2 : 1; }
  Tensor key_mask(const OpContext& ctx) const {
    return mask_ == KeyMask::input ? ctx.inputs[1] : Tensor();
  }

  OpInfo do_infer(std::span<const TensorSpec> in) const override {
    const Shape& x = in[0].shape;
    if (x.rank() != 3 || x[2] % 3 != 0 || (x[2] / 3) % heads_ != 0) {
      op_error(kind(), fmt::format("input {} must be [B, T, 3C] with C divisible by {} heads",
                                   x.str(), heads_));
    }
    if (mask_ == KeyMask::input &&
        (!(in[1].shape == Shape{x[0], x[1]}) || in[1].dtype != DType::u8)) {
      op_error(kind(), fmt::format("key mask must be u8 [{}, {}], got {} {}", x[0], x[1],
                                   dtype_name(in[1].dtype), in[1].shape.str()));
    }
    const Dims s = dims(x);
    OpInfo info;
    info.outputs = {{{s.b, s.t, s.c}, in[0].dtype}};
    info.saved = {{{s.b, heads_, s.t, s.d}, in[0].dtype}, {{s.b, heads_, s.t}, DType::f32}};
    const size_t hb = head_bytes(s, in[0].dtype);
    // q, k, v, dq, dk, dv and dout in head layout, plus the kernel's own tiles.
    info.workspace_bytes = 7 * (hb + 64) + kernels::attention_workspace_bytes(args(s), in[0].dtype);
    info.cuda_workspace_bytes =
        7 * (hb + 64) + kernels::attention_workspace_bytes(args(s), in[0].dtype, Device::cuda());
    info.flops = 4.0 * static_cast<double>(s.b * s.t * s.t * s.c);
    return info;
  }

  // Carves the [3, B, H, T, D] split of `qkv` out of the workspace.
  Tensor split(const Tensor& qkv, const Dims& s, kernels::Workspace ws, size_t& off) const {
    Tensor heads = ws.tensor(off, {3, s.b, heads_, s.t, s.d}, qkv.dtype());
    kernels::permute(qkv.reshape({s.b, s.t, 3, heads_, s.d}), kSplitHeads, heads);
    return heads;
  }

  void do_forward(OpContext& ctx) const override {
    const Dims s = dims(ctx.inputs[0].shape());
    size_t off = 0;
    Tensor qkv = split(ctx.inputs[0], s, ctx.workspace, off);
    const int64_t n = s.b * s.t * s.c;
    const Shape hs{s.b, heads_, s.t, s.d};
    const kernels::Workspace rest = ctx.workspace.after(off);
    kernels::attention_forward(args(s, ctx), qkv.view(0, hs), qkv.view(n, hs), qkv.view(2 * n, hs),
                               key_mask(ctx), ctx.saved[0], ctx.saved[1], rest);
    Tensor y = ctx.outputs[0].reshape({s.b, s.t, heads_, s.d});
    kernels::permute(ctx.saved[0], kMerge, y);
  }

  void do_backward(OpContext& ctx) const override {
    const Dims s = dims(ctx.inputs[0].shape());
    const DType dt = ctx.inputs[0].dtype();
    size_t off = 0;
    Tensor qkv = split(ctx.inputs[0], s, ctx.workspace, off);
    const int64_t n = s.b * s.t * s.c;
    const Shape hs{s.b, heads_, s.t, s.d};
    Tensor grads = ctx.workspace.tensor(off, {3, s.b, heads_, s.t, s.d}, dt);
    Tensor dout = ctx.workspace.tensor(off, hs, dt);
    kernels::permute(ctx.grad_outputs[0].reshape({s.b, s.t, heads_, s.d}), kMerge, dout);
    const kernels::Workspace rest = ctx.workspace.after(off);
    Tensor dq = grads.view(0, hs), dk = grads.view(n, hs), dv = grads.view(2 * n, hs);
    kernels::attention_backward(args(s, ctx), qkv.view(0, hs), qkv.view(n, hs), qkv.view(2 * n, hs),
                                key_mask(ctx), ctx.saved[0], ctx.saved[1], dout, dq, dk, dv, rest);
    if (!ctx.grad_inputs[0].defined()) return;
    constexpr int kUnsplit[5] = {1, 3, 0, 2, 4};  // [3, B, H, T, D] -> [B, T, 3, H, D]
    Tensor dx = ctx.grad_inputs[0].reshape({s.b, s.t, 3, heads_, s.d});
    kernels::permute(grads, kUnsplit, dx);
  }

 private:
  int64_t heads_;
  int64_t heads_total_ = 0, head_first_ = 0;  // a tensor-parallel share of the heads
  kernels::Causal causal_;
  KeyMask mask_;
  float dropout_;
};

}  // namespace

std::unique_ptr<Op> self_attention(int64_t heads, kernels::Causal causal, KeyMask mask,
                                   float dropout) {
  if (heads <= 0) op_error("self_attention", fmt::format("heads must be positive, got {}", heads));
  if (!(dropout >= 0.0f && dropout < 1.0f)) {
    op_error("self_attention", fmt::format("dropout must be in [0, 1), got {}", dropout));
  }
  return std::make_unique<SelfAttention>(heads, causal, mask, dropout);
}

}  // namespace dtrain::graph
