// CPU 2-D convolution through oneDNN (direct algorithm). The primitives are
// created with format_tag::any, so oneDNN picks its blocked layouts (nChw16c,
// OIhw16i16o...), ~2x faster than plain NCHW on 3x3 layers here; arguments are
// reordered from/to the caller's NCHW/KCRS through workspace buffers, unless the
// caller's activations are already in the primitive's layout (Conv2dArgs::x_block:
// the CPU executor keeps a ResNet's activations so, graph/layouts.h). f16
// (absent from oneDNN 2.6 on CPU), and bf16 where this CPU has no oneDNN bf16 path
// (dense_dnnl.h: bf16_compute), compute in f32 via those same reorders.
#include "kernels/conv.h"

#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <vector>

#include "kernels/cpu/dense_dnnl.h"
#include "kernels/cuda_ops.h"

namespace dtrain::kernels {

double Conv2dArgs::flops() const {
  return 2.0 * static_cast<double>(n) * k * out_h() * out_w() * (c / groups) * r * s;
}

namespace {

using namespace dnnl_util;
using tag = dnnl::memory::format_tag;

// Backward-filter sums over the batch, and oneDNN splits that sum across threads in a
// way that follows the thread count (jit:avx512_core's filter gradient differs in the
// last bits between 1 and 2 threads), so a ResNet's weights would follow
// OMP_NUM_THREADS, and 2 ranks of one thread would not reproduce 1 rank of two with 2
// micro-batches. So the work is cut into tasks whose shapes follow the convolution's
// alone: chunks of images (FilterTasks::chunk, sized so that a one-thread primitive
// keeps its rate), times slices of the output channels (so a batch of few images still
// spreads over the threads; a slice reads its channels of dy from a copy). Each task's
// gradient comes from a primitive planned for one thread, tasks run in parallel, and the
// chunks' gradients are added in chunk order: the bits follow the shape only.
struct FilterTasks {
  int64_t chunk = 0, chunks = 0;           // images per chunk; chunks
  int64_t slices = 1;                      // output-channel slices (dy channel-blocked when > 1)
  md x, dy, dw;                            // one task's arguments, in the primitive's layouts
  size_t x_image = 0, dy_image = 0;        // bytes of one image of x; of the whole dy
  size_t dy_run = 0;                       // bytes of a slice's channels in one image of dy
  size_t dw_bytes = 0, scratch_bytes = 0;  // a task's f32 gradient; its scratchpad
  int64_t count() const { return chunks * slices; }
  size_t task_bytes() const {
    return align64(dw_bytes) + (slices > 1 ? align64(dy.get_size()) : 0) + align64(scratch_bytes);
  }
  // Workspace beyond the pass's own for `tasks` tasks at once (none for a single task:
  // it writes the gradient itself).
  size_t extra_bytes(int64_t tasks) const {
    return count() == 1 ? 0 : static_cast<size_t>(tasks) * task_bytes();
  }
};

struct ConvPlan {
  Pass fwd, bwd_data, bwd_filter;  // bwd_filter's primitive computes one task
  FilterTasks tasks;
};

std::string describe(const Conv2dArgs& a, DType t) {
  return fmt::format(
      "[x {}x{}x{}x{} w {}x{}x{}x{} stride {},{} pad {},{} dil {},{} groups {} {} blocks {},{}]",
      a.n, a.c, a.h, a.w, a.k, a.c / a.groups, a.r, a.s, a.stride_h, a.stride_w, a.pad_h, a.pad_w,
      a.dilation_h, a.dilation_w, a.groups, dtype_name(t), a.x_block, a.y_block);
}

struct ConvDescs {
  md x_user, w_user, y_user;  // the caller's NCHW / KCRS, its dtype
  md x_any, w_any, y_any;     // any layout, compute dtype
  dnnl::memory::dims stride, dil, pad_l, pad_r;
};

tag activation_tag(int64_t block) {
  return block == 16 ? tag::nChw16c : block == 8 ? tag::nChw8c : tag::nchw;
}

ConvDescs make_descs(const Conv2dArgs& a, DType t) {
  const dt user = to_dnnl(t), comp = compute_type(user);
  const dnnl::memory::dims x{a.n, a.c, a.h, a.w}, y{a.n, a.k, a.out_h(), a.out_w()};
  const dnnl::memory::dims w =
      a.groups == 1 ? dnnl::memory::dims{a.k, a.c, a.r, a.s}
                    : dnnl::memory::dims{a.groups, a.k / a.groups, a.c / a.groups, a.r, a.s};
  const tag wtag = a.groups == 1 ? tag::oihw : tag::goihw;
  // Right padding so oneDNN's output size equals ours exactly (may be below pad_l).
  const int64_t pr_h = (a.out_h() - 1) * a.stride_h + (a.r - 1) * a.dilation_h + 1 - a.h - a.pad_h;
  const int64_t pr_w = (a.out_w() - 1) * a.stride_w + (a.s - 1) * a.dilation_w + 1 - a.w - a.pad_w;
  return ConvDescs{md(x, user, activation_tag(a.x_block)),
                   md(w, user, wtag),
                   md(y, user, activation_tag(a.y_block)),
                   md(x, comp, tag::any),
                   md(w, comp, tag::any),
                   md(y, comp, tag::any),
                   {a.stride_h, a.stride_w},
                   {a.dilation_h - 1, a.dilation_w - 1},
                   {a.pad_h, a.pad_w},
                   {pr_h, pr_w}};
}

using fwd_t = dnnl::convolution_forward;
using bwd_d_t = dnnl::convolution_backward_data;
using bwd_w_t = dnnl::convolution_backward_weights;

// The primitives of a shape, whatever layout the caller's activations are in;
// backward-filter's for one task (FilterTasks), with whole-batch descriptors of its
// layouts (x_all, dy_all, dw_all).
struct ConvPrims {
  fwd_t::primitive_desc fpd;
  bwd_d_t::primitive_desc dpd;
  bwd_w_t::primitive_desc wpd;
  dnnl::primitive fwd, bwd_d, bwd_w;
  FilterTasks tasks;
  md x_all, dy_all, dw_all;
};

// A chunk: at least kChunkPixels output pixels (a one-thread primitive computes the
// filter gradient of fewer at a lower rate: 3x3, 512 channels, f32, Zen 5: 29 GFLOP/s
// for one 4x4 image, 90 for 16, 92 for 32) and kChunkFlops of work (a call's overhead).
// Each chunk's gradient is written and read back once more: 8 bytes per weight for at
// least 2 * kChunkPixels flops. Slices: at least kSliceChannels output channels, a
// multiple of 16, until there are kTasks tasks.
constexpr int64_t kChunkPixels = 256, kSliceChannels = 64, kTasks = 32;
constexpr double kChunkFlops = 4e6;

// The images per chunk: the smallest divisor of N that reaches both bounds.
int64_t filter_chunk(const Conv2dArgs& a) {
  const double per_image = a.flops() / static_cast<double>(a.n);
  for (int64_t d = 1; d < a.n; ++d) {
    if (a.n % d == 0 && d * a.out_h() * a.out_w() >= kChunkPixels &&
        static_cast<double>(d) * per_image >= kChunkFlops) {
      return d;
    }
  }
  return a.n;
}

// The output-channel slices: the fewest that make kTasks tasks with `chunks` chunks,
// or the most that keep kSliceChannels each.
int64_t filter_slices(const Conv2dArgs& a, int64_t chunks) {
  if (a.groups != 1 || chunks >= kTasks) return 1;
  int64_t best = 1;
  for (int64_t s = 2; a.k / s >= kSliceChannels; ++s) {
    if (a.k % s != 0 || (a.k / s) % 16 != 0) continue;
    best = s;
    if (chunks * s >= kTasks) break;
  }
  return best;
}

// oneDNN plans a primitive for the thread count it sees when the primitive is created,
// and some implementations (the gemm-based ones a grouped convolution can get) look
// again when they run outside an active parallel region: both happen under one thread.
struct OneThread {
  int saved = num_threads();
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;
};

// The tag of `m` among `tags` (described for `m`'s dims and type), if any.
std::optional<tag> tag_of(const md& m, std::span<const tag> tags) {
  for (const tag t : tags) {
    if (m == md(m.dims(), m.data_type(), t)) return t;
  }
  return std::nullopt;
}

// Activation layouts whose images follow each other (a chunk is a slice of the batch),
// and those whose channel blocks do too (a slice of channels is one run per image).
constexpr tag kImageMajor[] = {tag::nchw, tag::nChw16c, tag::nChw8c, tag::nhwc};
constexpr tag kChannelBlocked[] = {tag::nChw16c, tag::nChw8c};
// Filter layouts whose output channels come first (a slice of them is one run).
constexpr tag kOutputMajor[] = {tag::oihw,       tag::ohwi,     tag::OIhw16i16o,
                                tag::OIhw16o16i, tag::OIhw8i8o, tag::OIhw8o8i,
                                tag::Ohwi16o,    tag::Ohwi8o,   tag::Oihw16o};

dnnl::memory::dims with_dim0(dnnl::memory::dims d, int64_t v) {
  d[0] = v;
  return d;
}

// Backward-filter for tasks of `chunk` images and k / `slices` output channels, planned
// for one thread; its gradient is f32 whatever the compute type, so chunks add in f32.
// False where its layouts do not allow that cut (p is then to be planned another way).
bool plan_filter_tasks(const Conv2dArgs& a, DType t, int64_t chunk, int64_t slices, ConvPrims& p) {
  Conv2dArgs c = a;
  c.n = chunk;
  c.k = a.k / slices;
  const ConvDescs d = make_descs(c, t);
  const md dw_any(d.w_any.dims(), dt::f32, tag::any);
  const auto alg = dnnl::algorithm::convolution_direct;
  {
    const OneThread one;
    const fwd_t::primitive_desc hint(
        fwd_t::desc(dnnl::prop_kind::forward_training, alg, d.x_any, d.w_any, d.y_any, d.stride,
                    d.dil, d.pad_l, d.pad_r),
        user_scratchpad_attr(), cpu_engine());
    p.wpd = bwd_w_t::primitive_desc(
        bwd_w_t::desc(alg, d.x_any, dw_any, d.y_any, d.stride, d.dil, d.pad_l, d.pad_r),
        user_scratchpad_attr(), cpu_engine(), hint);
  }
  FilterTasks& ft = p.tasks;
  ft = FilterTasks{};
  ft.chunk = chunk;
  ft.chunks = a.n / chunk;
  ft.slices = slices;
  ft.x = p.wpd.src_desc();
  ft.dy = p.wpd.diff_dst_desc();
  ft.dw = p.wpd.diff_weights_desc();
  const ConvDescs whole = make_descs(a, t);
  const dnnl::memory::dims x_dims = whole.x_any.dims(), y_dims = whole.y_any.dims();
  const auto x_tag = tag_of(ft.x, kImageMajor);
  const auto y_tag = slices > 1 ? tag_of(ft.dy, kChannelBlocked) : tag_of(ft.dy, kImageMajor);
  if (ft.chunks > 1 || slices > 1) {
    if (!x_tag || !y_tag) return false;
    p.x_all = md(x_dims, ft.x.data_type(), *x_tag);
    p.dy_all = md(y_dims, ft.dy.data_type(), *y_tag);
  } else {
    p.x_all = ft.x;
    p.dy_all = ft.dy;
  }
  if (slices > 1) {  // groups 1: the filter is 4-D
    const auto w_tag = tag_of(ft.dw, kOutputMajor);
    if (!w_tag) return false;
    p.dw_all = md(with_dim0(ft.dw.dims(), a.k), dt::f32, *w_tag);
    if (p.dw_all.get_size() != static_cast<size_t>(slices) * ft.dw.get_size()) return false;
  } else {
    p.dw_all = ft.dw;
  }
  ft.x_image = ft.x.get_size() / static_cast<size_t>(chunk);
  ft.dy_image = p.dy_all.get_size() / static_cast<size_t>(a.n);
  ft.dy_run = ft.dy.get_size() / static_cast<size_t>(chunk);
  ft.dw_bytes = ft.dw.get_size();
  ft.scratch_bytes = p.wpd.scratchpad_desc().get_size();
  return true;
}

ConvPrims make_prims(const Conv2dArgs& a, DType t) {
  const ConvDescs d = make_descs(a, t);
  const dnnl::primitive_attr attr = user_scratchpad_attr();
  const auto alg = dnnl::algorithm::convolution_direct;
  ConvPrims p;
  p.fpd = fwd_t::primitive_desc(fwd_t::desc(dnnl::prop_kind::forward_training, alg, d.x_any,
                                            d.w_any, d.y_any, d.stride, d.dil, d.pad_l, d.pad_r),
                                attr, cpu_engine());
  p.dpd = bwd_d_t::primitive_desc(
      bwd_d_t::desc(alg, d.x_any, d.w_any, d.y_any, d.stride, d.dil, d.pad_l, d.pad_r), attr,
      cpu_engine(), p.fpd);
  p.fwd = fwd_t(p.fpd);
  p.bwd_d = bwd_d_t(p.dpd);
  // The cut the shape asks for; without slices where the layouts refuse them; the whole
  // batch as one task where they refuse chunks (always possible).
  const int64_t chunk = filter_chunk(a);
  const int64_t slices = filter_slices(a, a.n / chunk);
  if (!plan_filter_tasks(a, t, chunk, slices, p) &&
      (slices == 1 || !plan_filter_tasks(a, t, chunk, 1, p))) {
    const bool whole = plan_filter_tasks(a, t, a.n, 1, p);
    DTRAIN_CHECK(whole, "conv2d: backward-filter as one task {}", describe(a, t));
  }
  p.bwd_w = bwd_w_t(p.wpd);
  return p;
}

ConvPlan make_plan(const Conv2dArgs& a, DType t, const ConvPrims& pr) {
  const ConvDescs d = make_descs(a, t);
  ConvPlan p;
  p.fwd = make_pass(pr.fwd, pr.fpd.scratchpad_desc(),
                    {{DNNL_ARG_SRC, ArgDir::in, d.x_user, pr.fpd.src_desc()},
                     {DNNL_ARG_WEIGHTS, ArgDir::in, d.w_user, pr.fpd.weights_desc()},
                     {DNNL_ARG_DST, ArgDir::out, d.y_user, pr.fpd.dst_desc()}});
  p.bwd_data = make_pass(pr.bwd_d, pr.dpd.scratchpad_desc(),
                         {{DNNL_ARG_DIFF_DST, ArgDir::in, d.y_user, pr.dpd.diff_dst_desc()},
                          {DNNL_ARG_WEIGHTS, ArgDir::in, d.w_user, pr.dpd.weights_desc()},
                          {DNNL_ARG_DIFF_SRC, ArgDir::out, d.x_user, pr.dpd.diff_src_desc()}});
  p.bwd_filter = make_pass(pr.bwd_w, pr.wpd.scratchpad_desc(),
                           {{DNNL_ARG_SRC, ArgDir::in, d.x_user, pr.x_all},
                            {DNNL_ARG_DIFF_DST, ArgDir::in, d.y_user, pr.dy_all},
                            {DNNL_ARG_DIFF_WEIGHTS, ArgDir::out, d.w_user, pr.dw_all}});
  p.tasks = pr.tasks;
  return p;
}

// Runs backward-filter's tasks (FilterTasks) on the staged arguments, task t being chunk
// t / slices, slice t % slices: waves of as many tasks as there are threads (fewer where
// the workspace holds fewer); chunk 0's gradients written into dw, every other task's
// into its buffer, then added to dw in task order, so in chunk order for each weight.
// The wave size changes no bit.
void run_filter_tasks(const ConvPlan& p, const std::unordered_map<int, dnnl::memory>& args,
                      Workspace ws, size_t& off) {
  const FilterTasks& ft = p.tasks;
  if (ft.count() == 1) {
    const OneThread one;
    p.bwd_filter.prim.execute(cpu_stream(), args);
    return;
  }
  off = align64(off);
  const size_t room = ws.bytes > off ? ws.bytes - off : 0;
  int64_t width = std::min<int64_t>(ft.count(), num_threads());
  while (width > 1 && ft.extra_bytes(width) > room) --width;
  char* task_mem = ws.take<char>(off, ft.extra_bytes(width));
  const auto* x0 = static_cast<const char*>(args.at(DNNL_ARG_SRC).get_data_handle());
  const auto* dy0 = static_cast<const char*>(args.at(DNNL_ARG_DIFF_DST).get_data_handle());
  auto* dw0 = static_cast<char*>(args.at(DNNL_ARG_DIFF_WEIGHTS).get_data_handle());
  const size_t scratch_at = align64(ft.dw_bytes) + (ft.slices > 1 ? align64(ft.dy.get_size()) : 0);
  const md scratch_md({static_cast<int64_t>(std::max<size_t>(ft.scratch_bytes, 1))}, dt::u8,
                      tag::a);
  std::vector<std::exception_ptr> failed(static_cast<size_t>(width));
  for (int64_t first = 0; first < ft.count(); first += width) {
    const int64_t wave = std::min(width, ft.count() - first);
    const auto run = [&](int64_t j) {
      const int64_t i = (first + j) / ft.slices, s = (first + j) % ft.slices;
      char* mine = task_mem + static_cast<size_t>(j) * ft.task_bytes();
      const char* dy = dy0 + static_cast<size_t>(i * ft.chunk) * ft.dy_image;
      if (ft.slices > 1) {  // this slice's channels of the chunk's images, one run each
        char* copy = mine + align64(ft.dw_bytes);
        for (int64_t m = 0; m < ft.chunk; ++m) {
          std::memcpy(
              copy + static_cast<size_t>(m) * ft.dy_run,
              dy + static_cast<size_t>(m) * ft.dy_image + static_cast<size_t>(s) * ft.dy_run,
              ft.dy_run);
        }
        dy = copy;
      }
      void* grad = i == 0 ? dw0 + static_cast<size_t>(s) * ft.dw_bytes : mine;
      thread_local dnnl::stream stream(cpu_engine());
      p.bwd_filter.prim.execute(
          stream,
          {{DNNL_ARG_SRC,
            dnnl::memory(ft.x, cpu_engine(), const_cast<char*>(x0) + i * ft.chunk * ft.x_image)},
           {DNNL_ARG_DIFF_DST, dnnl::memory(ft.dy, cpu_engine(), const_cast<char*>(dy))},
           {DNNL_ARG_DIFF_WEIGHTS, dnnl::memory(ft.dw, cpu_engine(), grad)},
           {DNNL_ARG_SCRATCHPAD, dnnl::memory(scratch_md, cpu_engine(), mine + scratch_at)}});
      stream.wait();
    };
    {
      const OneThread one;  // a wave of one runs on this thread, outside any region
#pragma omp parallel for schedule(static, 1) num_threads(static_cast <int>(wave)) if (wave > 1)
      for (int64_t j = 0; j < wave; ++j) {
        try {
          run(j);
        } catch (...) {
          failed[static_cast<size_t>(j)] = std::current_exception();
        }
      }
    }
    for (const std::exception_ptr& e : failed) {
      if (e) std::rethrow_exception(e);
    }
    // dw += each later chunk's gradient, in task order, element by element.
    const int64_t per_task = static_cast<int64_t>(ft.dw_bytes / sizeof(float));
    auto* sum = reinterpret_cast<float*>(dw0);
    parallel_for(0, per_task * ft.slices, int64_t{1} << 14, [&](int64_t lo, int64_t hi) {
      for (int64_t j = 0; j < wave; ++j) {
        if (first + j < ft.slices) continue;  // chunk 0: written in place
        const int64_t base = (first + j) % ft.slices * per_task;
        const int64_t from = std::max(lo, base), to = std::min(hi, base + per_task);
        const auto* part =
            reinterpret_cast<const float*>(task_mem + static_cast<size_t>(j) * ft.task_bytes());
        for (int64_t e = from; e < to; ++e) sum[e] += part[e - base];
      }
    });
  }
}

void check_args(const Conv2dArgs& a, DType t) {
  DTRAIN_CHECK(a.n > 0 && a.c > 0 && a.h > 0 && a.w > 0 && a.k > 0 && a.r > 0 && a.s > 0,
               "conv2d: empty size {}", describe(a, t));
  DTRAIN_CHECK(a.groups > 0 && a.c % a.groups == 0 && a.k % a.groups == 0,
               "conv2d: groups {} must divide C {} and K {}", a.groups, a.c, a.k);
  DTRAIN_CHECK(a.stride_h > 0 && a.stride_w > 0 && a.dilation_h > 0 && a.dilation_w > 0 &&
                   a.pad_h >= 0 && a.pad_w >= 0,
               "conv2d: bad stride/dilation/padding {}", describe(a, t));
  DTRAIN_CHECK(a.out_h() > 0 && a.out_w() > 0, "conv2d: empty output {}", describe(a, t));
  for (const auto& [block, channels] : {std::pair{a.x_block, a.c}, std::pair{a.y_block, a.k}}) {
    DTRAIN_CHECK(block == 0 || ((block == 8 || block == 16) && channels % block == 0 &&
                                t != DType::f16 && a.groups == 1),
                 "conv2d: channel block {} needs f32 or bf16, groups 1 and a multiple of it {}",
                 block, describe(a, t));
  }
}

// Plans by shape and layout; the primitives by shape alone (a layout adds reorders only).
const ConvPlan& plan_for(const Conv2dArgs& a, DType t) {
  static Cache<ConvPrims> prims;
  static Cache<ConvPlan> plans;
  check_args(a, t);
  const std::string key = describe(a, t);
  return guarded("conv2d", key, [&]() -> const ConvPlan& {
    return plans.get(key, [&] {
      Conv2dArgs shape = a;
      shape.x_block = shape.y_block = 0;
      return make_plan(a, t, prims.get(describe(shape, t), [&] { return make_prims(shape, t); }));
    });
  });
}

// Shared entry checks: x-like [N,C,H,W], w [K,C/g,R,S], y-like [N,K,OH,OW].
void check_tensors(std::string_view op, const Conv2dArgs& a, const Tensor& x, const Tensor& w,
                   const Tensor& y) {
  same_device(op, {&x, &w, &y});
  DTRAIN_CHECK(!x.device().is_cuda() || (a.x_block == 0 && a.y_block == 0),
               "{}: channel blocks are CPU-only", op);
  require_dtype(op, "x", x, {DType::f32, DType::bf16, DType::f16});
  check_args(a, x.dtype());
  require_dtype(op, "w", w, {x.dtype()});
  require_dtype(op, "y", y, {x.dtype()});
  require_numel(op, "x", x, a.n * a.c * a.h * a.w);
  require_numel(op, "w", w, a.k * (a.c / a.groups) * a.r * a.s);
  require_numel(op, "y", y, a.n * a.k * a.out_h() * a.out_w());
}

}  // namespace

namespace {

// The channel block of a ResNet middle layer's primitive (64 -> 64 channels, 3 x 3,
// 56 x 56) computing in `t`, or 0 where it is neither nChw16c nor nChw8c.
int64_t preferred_block(dt t) {
  const dnnl::memory::dims x{1, 64, 56, 56}, w{64, 64, 3, 3};
  const md any_x(x, t, tag::any), any_w(w, t, tag::any);
  using fwd_t = dnnl::convolution_forward;
  const fwd_t::primitive_desc pd(
      fwd_t::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, any_x,
                  any_w, any_x, {1, 1}, {0, 0}, {1, 1}, {1, 1}),
      cpu_engine());
  for (int64_t b : {16, 8}) {
    if (pd.src_desc() == md(x, t, activation_tag(b)) &&
        pd.dst_desc() == md(x, t, activation_tag(b))) {
      return b;
    }
  }
  return 0;
}

}  // namespace

int64_t cpu_channel_block() {
  static const int64_t block = preferred_block(dt::f32);
  return block;
}

int64_t cpu_channel_block(DType dtype) {
  if (dtype == DType::f32) return cpu_channel_block();
  if (dtype != DType::bf16) return 0;
  // Only where oneDNN computes in bf16 and its bf16 primitives want the f32 ones' block.
  // A probe oneDNN refuses means none (every CPU executor asks, f32 ones too).
  static const bool ok = [] {
    try {
      return cpu_channel_block() > 0 && bf16_compute() &&
             preferred_block(dt::bf16) == cpu_channel_block();
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok ? cpu_channel_block() : 0;
}

size_t conv2d_workspace_bytes(const Conv2dArgs& args, DType dtype, Device device) {
  if (device.is_cuda()) {
    check_args(args, dtype);
    DTRAIN_CHECK(args.x_block == 0 && args.y_block == 0, "conv2d: channel blocks are CPU-only");
    return cuda_ops::kConvWorkspaceBytes;
  }
  // The most any layout the executor may pass needs (graph/layouts.h): NCHW, or x / y
  // in this CPU's channel block where their channels allow.
  const int64_t b = cpu_channel_block(dtype);
  const bool can = b > 0 && args.groups == 1;
  size_t bytes = 0;
  for (const int64_t xb : {int64_t{0}, can && args.c % b == 0 ? b : int64_t{-1}}) {
    for (const int64_t yb : {int64_t{0}, can && args.k % b == 0 ? b : int64_t{-1}}) {
      if (xb < 0 || yb < 0) continue;
      Conv2dArgs a = args;
      a.x_block = xb;
      a.y_block = yb;
      const ConvPlan& p = plan_for(a, dtype);
      // Backward-filter: as many tasks at once as there are threads now.
      const size_t tasks = p.tasks.extra_bytes(std::min<int64_t>(p.tasks.count(), num_threads()));
      bytes = std::max({bytes, p.fwd.workspace_bytes, p.bwd_data.workspace_bytes,
                        p.bwd_filter.workspace_bytes + tasks});
    }
  }
  return bytes;
}

void conv2d_forward(const Conv2dArgs& args, const Tensor& x, const Tensor& w, Tensor& y,
                    Workspace ws) {
  check_tensors("conv2d_forward", args, x, w, y);
  if (x.device().is_cuda()) return cuda_ops::conv2d_forward(args, x, w, y, ws);
  const ConvPlan& p = plan_for(args, x.dtype());
  guarded("conv2d_forward", describe(args, x.dtype()), [&] {
    run_pass(p.fwd, {x.raw(), w.raw(), y.raw()}, ws);
  });
}

void conv2d_backward_data(const Conv2dArgs& args, const Tensor& dy, const Tensor& w, Tensor& dx,
                          Workspace ws) {
  check_tensors("conv2d_backward_data", args, dx, w, dy);
  if (dy.device().is_cuda()) return cuda_ops::conv2d_backward_data(args, dy, w, dx, ws);
  const ConvPlan& p = plan_for(args, dy.dtype());
  guarded("conv2d_backward_data", describe(args, dy.dtype()), [&] {
    run_pass(p.bwd_data, {dy.raw(), w.raw(), dx.raw()}, ws);
  });
}

void conv2d_backward_filter(const Conv2dArgs& args, const Tensor& x, const Tensor& dy, Tensor& dw,
                            Workspace ws) {
  check_tensors("conv2d_backward_filter", args, x, dw, dy);
  if (x.device().is_cuda()) return cuda_ops::conv2d_backward_filter(args, x, dy, dw, ws);
  const ConvPlan& p = plan_for(args, x.dtype());
  guarded("conv2d_backward_filter", describe(args, x.dtype()), [&] {
    run_pass_with(p.bwd_filter, {x.raw(), dy.raw(), dw.raw()}, ws,
                  [&](const std::unordered_map<int, dnnl::memory>& staged, size_t& off) {
                    run_filter_tasks(p, staged, ws, off);
                  });
  });
}

}  // namespace dtrain::kernels
