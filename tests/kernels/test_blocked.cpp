// Channel-blocked activations (NCHW[B]c, graph/layouts.h) against plain NCHW, bit for
// bit, for every CPU kernel with a blocked form, in f32 and bf16: convolution (each
// direction, either side blocked), batch norm (train, eval and backward, planes shorter
// than a lane group, longer than a sum chunk), max pooling (ties, a NaN), average and
// global average pooling; for B = 8 and 16 on any CPU. And batch norm with its ReLU
// fused against the two kernels in turn, in either layout (f32).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/cpu/float_io.h"
#include "kernels/elementwise.h"
#include "kernels/pooling.h"

using namespace dtrain;
using namespace dtrain::kernels;

namespace {

Tensor random_tensor(const Shape& s, uint32_t seed, bool relu_like = false) {
  Tensor t = Tensor::empty(s, DType::f32);
  uint32_t state = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    state = state * 1664525u + 1013904223u;
    float v = static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
    if (relu_like) v = std::max(v, 0.0f);  // many ties at zero
    t.data<float>()[i] = v;
  }
  return t;
}

// [N, C, H, W] <-> [N, C/B, H, W, B] (any element type).
Tensor relayout(const Tensor& x, int64_t b, bool to_blocked) {
  const Shape& s = x.shape();
  Tensor y = Tensor::empty(s, x.dtype());
  const int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  const size_t e = dtype_size(x.dtype());
  const auto* in = static_cast<const char*>(x.raw());
  auto* out = static_cast<char*>(y.raw());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t p = 0; p < hw; ++p) {
        const int64_t plain = (i * c + ch) * hw + p;
        const int64_t blocked = ((i * (c / b) + ch / b) * hw + p) * b + ch % b;
        const int64_t to = to_blocked ? blocked : plain, from = to_blocked ? plain : blocked;
        std::memcpy(out + static_cast<size_t>(to) * e, in + static_cast<size_t>(from) * e, e);
      }
    }
  }
  return y;
}
Tensor to_blocked(const Tensor& x, int64_t b) { return relayout(x, b, true); }
Tensor from_blocked(const Tensor& y, int64_t b) { return relayout(y, b, false); }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype()); }

// `t` (f32) in `dtype`, rounded.
Tensor as(const Tensor& t, DType dtype) {
  if (dtype == t.dtype()) return t;
  Tensor out = Tensor::empty(t.shape(), dtype);
  cast(t, out);
  return out;
}

struct Scratch {  // generous: a non-native block reorders into the primitive's layout
  Tensor t = Tensor::empty({int64_t{64} << 20}, DType::u8);
  Workspace ws() { return {t.raw(), t.nbytes(), Device::cpu()}; }
};

}  // namespace

TEST_CASE("conv2d: channel-blocked x and y give the NCHW bits in every direction") {
  Scratch scratch;
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (int64_t b : {8, 16}) {
      for (const auto& [c, k, r, stride, pad] :
           {std::tuple{16, 32, 3, 1, 1}, std::tuple{32, 16, 1, 2, 0},
            std::tuple{16, 16, 3, 2, 1}}) {
        Conv2dArgs a;
        a.n = 2, a.c = c, a.h = 9, a.w = 7, a.k = k, a.r = a.s = r;
        a.stride_h = a.stride_w = stride, a.pad_h = a.pad_w = pad;
        CAPTURE(dtype_name(dt));
        CAPTURE(b);
        CAPTURE(c);
        CAPTURE(r);
        const Tensor x = as(random_tensor({a.n, a.c, a.h, a.w}, 1), dt);
        const Tensor w = as(random_tensor({a.k, a.c, a.r, a.s}, 2), dt);
        const Tensor dy = as(random_tensor({a.n, a.k, a.out_h(), a.out_w()}, 3), dt);
        Tensor y = empty_like(dy), dx = empty_like(x), dw = empty_like(w);
        conv2d_forward(a, x, w, y, scratch.ws());
        conv2d_backward_data(a, dy, w, dx, scratch.ws());
        conv2d_backward_filter(a, x, dy, dw, scratch.ws());
        for (const auto& [xb, yb] :
             {std::pair{b, b}, std::pair{int64_t{0}, b}, std::pair{b, int64_t{0}}}) {
          Conv2dArgs ab = a;
          ab.x_block = xb, ab.y_block = yb;
          const auto lay = [](const Tensor& t, int64_t blk) {
            return blk ? to_blocked(t, blk) : t;
          };
          const auto unlay = [](const Tensor& t, int64_t blk) {
            return blk ? from_blocked(t, blk) : t;
          };
          Tensor yk = empty_like(dy), dxk = empty_like(x), dwk = empty_like(w);
          conv2d_forward(ab, lay(x, xb), w, yk, scratch.ws());
          conv2d_backward_data(ab, lay(dy, yb), w, dxk, scratch.ws());
          conv2d_backward_filter(ab, lay(x, xb), lay(dy, yb), dwk, scratch.ws());
          CHECK(same_bits(unlay(yk, yb), y));
          CHECK(same_bits(unlay(dxk, xb), dx));
          CHECK(same_bits(dwk, dw));
        }
      }
    }
  }
}

// Backward-filter sums over the batch in a fixed cut (kernels/cpu/conv.cpp, FilterTasks):
// tasks planned for one thread, run as many at once as there are threads or as the
// workspace holds, added in chunk order. Neither changes a bit. (The planning side,
// oneDNN seeing another thread count in another process, is the end-to-end test
// "ResNet: ... any OpenMP thread count" in tests/train/test_data_parallel.cpp.)
TEST_CASE("conv2d: backward-filter's bits follow neither the thread count nor the workspace") {
  const int threads = num_threads();
  for (const DType dt : {DType::f32, DType::bf16}) {
    // 8 images of 8x8 to 128 channels: 2 chunks x 2 slices; 12 of 9x9 to 64: 3 chunks;
    // 3 of 5x5 to 128: 2 slices. Grouped (oneDNN's gemm-based path, which reads the
    // thread count again as it runs): one task of 1 image; 2 chunks of 2, which a
    // one-task workspace runs one at a time.
    for (const auto& [n, c, hw, k, g] :
         {std::tuple{8, 16, 8, 128, 1}, std::tuple{12, 16, 9, 64, 1}, std::tuple{3, 32, 5, 128, 1},
          std::tuple{1, 20, 160, 24, 2}, std::tuple{4, 20, 64, 24, 2}}) {
      Conv2dArgs a;
      a.n = n, a.c = c, a.h = a.w = hw, a.k = k, a.r = a.s = 3, a.pad_h = a.pad_w = 1;
      a.groups = g;
      CAPTURE(dtype_name(dt));
      CAPTURE(n);
      CAPTURE(g);
      const Tensor x = as(random_tensor({a.n, a.c, a.h, a.w}, 4), dt);
      const Tensor dy = as(random_tensor({a.n, a.k, a.out_h(), a.out_w()}, 5), dt);
      set_num_threads(1);
      const size_t narrow = conv2d_workspace_bytes(a, dt);  // room for one task at a time
      set_num_threads(threads);
      Tensor one = Tensor::empty({a.k, a.c / a.groups, a.r, a.s}, dt);
      Tensor ws = Tensor::empty({static_cast<int64_t>(narrow)}, DType::u8);
      set_num_threads(1);
      conv2d_backward_filter(a, x, dy, one, {ws.raw(), ws.nbytes(), Device::cpu()});
      for (const int t : {2, 3, 5}) {
        CAPTURE(t);
        set_num_threads(t);
        Tensor wide = empty_like(one), tight = empty_like(one);
        Tensor big =
            Tensor::empty({static_cast<int64_t>(conv2d_workspace_bytes(a, dt))}, DType::u8);
        conv2d_backward_filter(a, x, dy, wide, {big.raw(), big.nbytes(), Device::cpu()});
        conv2d_backward_filter(a, x, dy, tight, {ws.raw(), ws.nbytes(), Device::cpu()});
        CHECK(same_bits(wide, one));
        CHECK(same_bits(tight, one));
      }
      set_num_threads(threads);
    }
  }
}

TEST_CASE("batch norm: channel-blocked train, eval and backward give the NCHW bits") {
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (int64_t b : {8, 16}) {
      for (const auto& [n, c, h, w] : {std::tuple{3, 16, 7, 7}, std::tuple{2, 32, 1, 3},
                                       std::tuple{2, 16, 20, 30}, std::tuple{1, 48, 4, 4}}) {
        if (c % b) continue;
        CAPTURE(dtype_name(dt));
        CAPTURE(b);
        CAPTURE(c);
        CAPTURE(h * w);
        const BatchNormArgs plain{n, c, h * w, 1e-5f, 0.1f, 0};
        BatchNormArgs blk = plain;
        blk.block = b;
        Tensor xf = random_tensor({n, c, h, w}, 4);
        for (int64_t i = 0; i < xf.numel(); ++i) xf.data<float>()[i] += 0.25f * (i % 5);  // a mean
        const Tensor x = as(xf, dt);
        const Tensor dy = as(random_tensor({n, c, h, w}, 5), dt);
        const Tensor gamma = random_tensor({c}, 6), beta = random_tensor({c}, 7);
        struct Run {
          Tensor y, rm, rv, sm, si, dx, dg, db, yi;
        };
        const auto run = [&](const BatchNormArgs& a, const Tensor& xin, const Tensor& dyin) {
          Run r{empty_like(xin),   random_tensor({c}, 8), random_tensor({c}, 9),
                empty_like(gamma), empty_like(gamma),     empty_like(xin),
                empty_like(gamma), empty_like(gamma),     empty_like(xin)};
          for (int64_t i = 0; i < c; ++i) r.rv.data<float>()[i] = std::fabs(r.rv.data<float>()[i]);
          batch_norm_forward_train(a, xin, gamma, beta, r.y, r.rm, r.rv, r.sm, r.si);
          batch_norm_backward(a, xin, dyin, gamma, r.sm, r.si, r.dx, r.dg, r.db);
          batch_norm_forward_infer(a, xin, gamma, beta, r.rm, r.rv, r.yi);
          return r;
        };
        const Run p = run(plain, x, dy);
        const Run k = run(blk, to_blocked(x, b), to_blocked(dy, b));
        CHECK(same_bits(from_blocked(k.y, b), p.y));
        CHECK(same_bits(from_blocked(k.dx, b), p.dx));
        CHECK(same_bits(from_blocked(k.yi, b), p.yi));
        for (const auto& [kt, pt] :
             {std::pair{&k.rm, &p.rm}, std::pair{&k.rv, &p.rv}, std::pair{&k.sm, &p.sm},
              std::pair{&k.si, &p.si}, std::pair{&k.dg, &p.dg}, std::pair{&k.db, &p.db}}) {
          CHECK(same_bits(*kt, *pt));
        }
      }
    }
  }
}

// In bf16 the ReLU takes what batch norm alone would store: channel 3's gamma 0 and
// beta a tiny negative make every t round to -0, which the ReLU keeps.
TEST_CASE("batch norm with the ReLU fused gives batch norm then ReLU's bits, in either layout") {
  const int64_t n = 2, c = 16, hw = 45;
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (int64_t b : {int64_t{0}, int64_t{8}, int64_t{16}}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(b);
      const auto lay = [&](const Tensor& t) { return b ? to_blocked(t, b) : t; };
      const auto unlay = [&](const Tensor& t) { return b ? from_blocked(t, b) : t; };
      Tensor xf = random_tensor({n, c, 5, 9}, 21);
      xf.data<float>()[7] = -0.0f;
      const Tensor x = as(xf, dt);
      const Tensor dy = as(random_tensor({n, c, 5, 9}, 22), dt);
      Tensor gamma = random_tensor({c}, 23), beta = random_tensor({c}, 24);
      gamma.data<float>()[3] = 0.0f;
      beta.data<float>()[3] = -1e-41f;  // below half bf16's least denormal (2^-133)
      const BatchNormArgs plain{n, c, hw, 1e-5f, 0.1f, b};
      BatchNormArgs fused = plain;
      fused.relu = true;
      Tensor stats[8];
      for (Tensor& t : stats) t = random_tensor({c}, 25);
      for (Tensor* t : {&stats[1], &stats[5]})
        for (int64_t i = 0; i < c; ++i) t->data<float>()[i] = 1.0f;
      // Two kernels: batch norm, ReLU, ReLU's backward from its input, batch norm's backward.
      Tensor pre = empty_like(x), y = empty_like(x), g = empty_like(x), dx = empty_like(x);
      Tensor dgamma = empty_like(gamma), dbeta = empty_like(gamma);
      batch_norm_forward_train(plain, lay(x), gamma, beta, pre, stats[0], stats[1], stats[2],
                               stats[3]);
      activation_forward(Activation::relu, pre, y);
      activation_backward(Activation::relu, pre, lay(dy), g);
      batch_norm_backward(plain, lay(x), g, gamma, stats[2], stats[3], dx, dgamma, dbeta);
      // Fused.
      Tensor yf = empty_like(x), dxf = empty_like(x), dgf = empty_like(gamma),
             dbf = empty_like(gamma);
      batch_norm_forward_train(fused, lay(x), gamma, beta, yf, stats[4], stats[5], stats[6],
                               stats[7]);
      batch_norm_backward(fused, lay(x), lay(dy), gamma, stats[6], stats[7], dxf, dgf, dbf, yf);
      CHECK(same_bits(unlay(yf), unlay(y)));
      CHECK(same_bits(unlay(dxf), unlay(dx)));
      CHECK(same_bits(dgf, dgamma));
      CHECK(same_bits(dbf, dbeta));
      for (int k = 0; k < 4; ++k) CHECK(same_bits(stats[k], stats[k + 4]));
      // Eval.
      Tensor yi = empty_like(x), yif = empty_like(x);
      batch_norm_forward_infer(plain, lay(x), gamma, beta, stats[0], stats[1], yi);
      activation_forward(Activation::relu, yi, yi);
      batch_norm_forward_infer(fused, lay(x), gamma, beta, stats[0], stats[1], yif);
      CHECK(same_bits(yif, yi));
      if (dt == DType::bf16) {  // channel 3 of image 0 (in either layout): -0 kept
        const Tensor plain_y = unlay(yf);
        const uint16_t bits = plain_y.data<bf16>()[3 * hw].bits;
        CHECK(bits == 0x8000);
      }
    }
  }
  const BatchNormArgs half{1, 16, 4, 1e-5f, 0.1f, 0, true};
  Tensor h = Tensor::empty({1, 16, 2, 2}, DType::f16), hy = empty_like(h);
  Tensor s[6];
  for (Tensor& t : s) t = Tensor::empty({16}, DType::f32);
  CHECK_THROWS(batch_norm_forward_train(half, h, s[0], s[1], hy, s[2], s[3], s[4], s[5]));
}

// add_relu in one pass against add then ReLU, f32 and bf16: -0 + -0 (kept by the ReLU),
// x + -x (+0), a NaN, random sums.
TEST_CASE("add with the ReLU fused gives add then ReLU's bits") {
  for (const DType dt : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    Tensor af = random_tensor({1000}, 31), bf = random_tensor({1000}, 32);
    af.data<float>()[0] = -0.0f, bf.data<float>()[0] = -0.0f;
    af.data<float>()[1] = 0.5f, bf.data<float>()[1] = -0.5f;
    af.data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
    const Tensor a = as(af, dt), b = as(bf, dt);
    Tensor sum = empty_like(a), two = empty_like(a), one = empty_like(a);
    add(a, b, sum);
    activation_forward(Activation::relu, sum, two);
    add_relu(a, b, one);
    CHECK(same_bits(one, two));
    if (dt == DType::bf16) CHECK(one.data<bf16>()[0].bits == 0x8000);
    if (dt == DType::f32) CHECK(std::signbit(one.data<float>()[0]));
  }
  Tensor h = Tensor::empty({4}, DType::f16);
  CHECK_THROWS(add_relu(h, h, h));
}

TEST_CASE(
    "pooling: channel-blocked max (ties, a NaN), average and global average give the NCHW bits") {
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (int64_t b : {8, 16}) {
      for (const auto& [kernel, stride, pad] :
           {std::tuple{3, 2, 1}, std::tuple{2, 2, 0}, std::tuple{3, 1, 1}}) {
        for (PoolKind kind : {PoolKind::max, PoolKind::avg}) {
          for (bool nan : {false, true}) {
            CAPTURE(dtype_name(dt));
            CAPTURE(b);
            CAPTURE(kernel);
            CAPTURE(nan);
            Pool2dArgs a{2, 32, 11, 10, kernel, kernel, stride, stride, pad, pad};
            Tensor xf = random_tensor({a.n, a.c, a.h, a.w}, 10, true);
            if (nan) xf.data<float>()[3 * a.h * a.w + 17] = std::numeric_limits<float>::quiet_NaN();
            const Tensor x = as(xf, dt);
            const Shape ys{a.n, a.c, a.out_h(), a.out_w()};
            const Tensor dy = as(random_tensor(ys, 11), dt);
            Tensor y = Tensor::empty(ys, dt), am = Tensor::empty(ys, DType::i32);
            Tensor dx = empty_like(x);
            pool2d_forward(kind, a, x, y, am);
            pool2d_backward(kind, a, dy, am, dx);
            Pool2dArgs ab = a;
            ab.block = b;
            Tensor yk = empty_like(y), amk = empty_like(am), dxk = empty_like(x);
            pool2d_forward(kind, ab, to_blocked(x, b), yk, amk);
            pool2d_backward(kind, ab, to_blocked(dy, b), amk, dxk);
            CHECK(same_bits(from_blocked(yk, b), y));
            if (kind == PoolKind::max) CHECK(same_bits(from_blocked(amk, b), am));
            CHECK(same_bits(from_blocked(dxk, b), dx));
          }
        }
      }
      const Tensor x = as(random_tensor({3, 32, 5, 6}, 12), dt);
      const Tensor dy = as(random_tensor({3, 32}, 13), dt);
      Tensor y = Tensor::empty({3, 32}, dt), yk = empty_like(y);
      Tensor dx = empty_like(x), dxk = empty_like(x);
      global_avg_pool_forward(3, 32, 30, x, y);
      global_avg_pool_forward(3, 32, 30, to_blocked(x, b), yk, b);
      global_avg_pool_backward(3, 32, 30, dy, dx);
      global_avg_pool_backward(3, 32, 30, dy, dxk, b);
      CHECK(same_bits(yk, y));
      CHECK(same_bits(from_blocked(dxk, b), dx));
    }
  }
}

// The blocked kernels' eight-lane bf16 load and store against core/dtype.h's
// conversions: every bf16 pattern widened, and special and swept f32 values rounded
// (NaNs quiet and kept NaN, overflow to Inf, denormals, -0, ties to even).
TEST_CASE("bf16 load8 / store8: core/dtype.h's conversions, lane by lane") {
  for (uint32_t h0 = 0; h0 < 65536; h0 += 8) {
    bf16 in[8];
    for (uint32_t l = 0; l < 8; ++l) in[l].bits = static_cast<uint16_t>(h0 + l);
    const cpu_io::v8f v = cpu_io::load8(in);
    for (int l = 0; l < 8; ++l) {
      const float want = bf16_bits_to_f32(in[l].bits);
      CHECK(std::memcmp(&v[l], &want, sizeof want) == 0);
    }
  }
  std::vector<uint32_t> patterns = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                                    0x00008000u, 0x00018000u, 0x3f808000u, 0x3f818000u,
                                    0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                                    0x7f800001u, 0xffc00000u, 0x7fbfffffu, 0x7f7f8000u};
  for (uint32_t u = 1; u < 0xffffffffu / 7919; ++u) patterns.push_back(u * 7919u);
  while (patterns.size() % 8) patterns.push_back(0x3f800000u);
  size_t differ = 0;
  for (size_t i = 0; i < patterns.size(); i += 8) {
    cpu_io::v8f v;
    std::memcpy(&v, &patterns[i], sizeof v);
    bf16 out[8];
    cpu_io::store8(out, v);
    for (size_t l = 0; l < 8; ++l) {
      float f;
      std::memcpy(&f, &patterns[i + l], sizeof f);
      differ += out[l].bits != f32_to_bf16_bits(f) ? 1 : 0;
    }
  }
  CHECK(patterns.size() > 500000);
  CHECK(differ == 0);
}

TEST_CASE("channel blocks: refused for f16, a channel count off the block, CUDA") {
  Pool2dArgs a{1, 12, 4, 4, 2, 2, 2, 2, 0, 0};
  a.block = 8;  // 12 channels
  Tensor x = random_tensor({1, 12, 4, 4}, 1), y = Tensor::empty({1, 12, 2, 2}, DType::f32);
  Tensor am = Tensor::empty({1, 12, 2, 2}, DType::i32);
  CHECK_THROWS(pool2d_forward(PoolKind::max, a, x, y, am));
  BatchNormArgs bn{1, 16, 4, 1e-5f, 0.1f, 8};
  Tensor h = Tensor::empty({1, 16, 2, 2}, DType::f16),
         hy = Tensor::empty({1, 16, 2, 2}, DType::f16);
  Tensor s[6];
  for (Tensor& t : s) t = Tensor::empty({16}, DType::f32);
  CHECK_THROWS(batch_norm_forward_train(bn, h, s[0], s[1], hy, s[2], s[3], s[4], s[5]));
  Pool2dArgs hp{1, 16, 2, 2, 2, 2, 2, 2, 0, 0};
  hp.block = 8;
  Tensor hpy = Tensor::empty({1, 16, 1, 1}, DType::f16),
         hpa = Tensor::empty({1, 16, 1, 1}, DType::i32);
  CHECK_THROWS(pool2d_forward(PoolKind::max, hp, h, hpy, hpa));
  Conv2dArgs hc;
  hc.n = 1, hc.c = 16, hc.h = hc.w = 2, hc.k = 16, hc.r = hc.s = 1;
  hc.x_block = 8;
  Tensor hw = Tensor::empty({16, 16, 1, 1}, DType::f16), hcy = empty_like(h);
  Scratch half_scratch;
  CHECK_THROWS(conv2d_forward(hc, h, hw, hcy, half_scratch.ws()));
  Conv2dArgs c;
  c.n = 1, c.c = 16, c.h = c.w = 4, c.k = 12, c.r = c.s = 1;
  c.y_block = 8;  // 12 output channels
  Tensor cx = random_tensor({1, 16, 4, 4}, 2), cw = random_tensor({12, 16, 1, 1}, 3);
  Tensor cy = Tensor::empty({1, 12, 4, 4}, DType::f32);
  Scratch scratch;
  CHECK_THROWS(conv2d_forward(c, cx, cw, cy, scratch.ws()));
  c.k = 16;
  CHECK_THROWS(conv2d_workspace_bytes(c, DType::f32, Device::cuda()));
}
