// oneDNN plumbing shared by the GEMM and convolution CPU kernels: the one CPU
// engine and stream, a mutex-guarded cache of prepared primitives, error
// translation, and "passes": a primitive plus, per argument, an optional
// reorder between the caller's plain layout/dtype and the one the primitive
// wants. Every data buffer (staged copies, scratchpad) is carved from the
// caller's Workspace; oneDNN only allocates its own primitive objects.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/parallel.h"
#include "kernels/common.h"
#include "kernels/cpu/float_io.h"

namespace dtrain::kernels::dnnl_util {

using md = dnnl::memory::desc;
using dt = dnnl::memory::data_type;

inline dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

inline dnnl::stream& cpu_stream() {
  static dnnl::stream stream(cpu_engine());
  return stream;
}

inline dt to_dnnl(DType t) {
  switch (t) {
    case DType::f32:
      return dt::f32;
    case DType::f16:
      return dt::f16;
    case DType::bf16:
      return dt::bf16;
    default:
      DTRAIN_CHECK(false, "no oneDNN type for {}", dtype_name(t));
  }
  return dt::undef;
}

// Whether oneDNN computes bf16 GEMMs and convolutions on this CPU (oneDNN 2.6 needs
// AVX-512: avx512_core, emulated, or avx512_core_bf16 / AMX, native). Probed once by
// asking for a small bf16 matmul; where it cannot, bf16 is widened like f16.
inline bool bf16_compute() {
  static const bool ok = [] {
    try {
      const md a({1, 16, 16}, dt::bf16, dnnl::memory::format_tag::abc);
      const md c({1, 16, 16}, dt::f32, dnnl::memory::format_tag::abc);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

// The type a primitive computes a `user` argument in: f16 always, and bf16 where the
// CPU has no bf16 path, widened to f32 (StagedArg::widen).
inline dt compute_type(dt user) {
  return user == dt::f16 || (user == dt::bf16 && !bf16_compute()) ? dt::f32 : user;
}

// Attributes for every primitive we build: scratchpad memory comes from us.
inline dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Runs fn, turning a dnnl::error into a CHECK failure naming the op and shape.
template <typename Fn>
decltype(auto) guarded(std::string_view op, const std::string& what, Fn&& fn) {
  try {
    return fn();
  } catch (const dnnl::error& e) {
    check_failed(__FILE__, __LINE__, "oneDNN call",
                 fmt::format("{} {}: oneDNN error (status {}): {}", op, what,
                             static_cast<int>(e.status), e.what()));
  }
}

// Prepared objects keyed by a description of shape, dtype and parameters.
// std::map nodes never move, so returned references stay valid.
template <typename V>
class Cache {
 public:
  template <typename Make>
  const V& get(const std::string& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) it = map_.emplace(key, make()).first;
    return it->second;
  }

 private:
  std::mutex mu_;
  std::map<std::string, V> map_;
};

enum class ArgDir : uint8_t { in, out, inout };

// One primitive argument: the caller's memory layout and the primitive's. When
// they differ, the argument is staged through a workspace buffer by reorders.
// A dense f16 (or, without bf16_compute(), bf16) argument of an f32 primitive (oneDNN
// 2.6 has no f16 compute on the CPU) is first widened by our vectorised converter into f32 in the
// caller's layout (`wide`), since oneDNN's own f16 reorders take its slow reference path; oneDNN
// then reorders only f32, where its layouts differ.
struct StagedArg {
  int dnnl_arg = 0;
  ArgDir dir = ArgDir::in;
  md user, prim;
  bool staged = false;
  bool widen = false;
  md wide;
  int64_t wide_elems = 0;
  dnnl::reorder to_prim, to_user;
};

struct Pass {
  dnnl::primitive prim;
  std::array<StagedArg, 4> args;
  int nargs = 0;
  size_t scratch_bytes = 0;  // max over the primitive and its reorders (run in sequence)
  size_t workspace_bytes = 0;
};

inline size_t align64(size_t b) { return (b + 63) / 64 * 64; }

inline dnnl::reorder make_reorder(const md& from, const md& to, size_t& scratch) {
  dnnl::reorder::primitive_desc pd(cpu_engine(), from, cpu_engine(), to, user_scratchpad_attr());
  scratch = std::max(scratch, pd.scratchpad_desc().get_size());
  return dnnl::reorder(pd);
}

struct PassArg {
  int dnnl_arg;
  ArgDir dir;
  md user, prim;
};

inline Pass make_pass(dnnl::primitive prim, const md& scratchpad,
                      std::initializer_list<PassArg> specs) {
  Pass p;
  p.prim = std::move(prim);
  p.scratch_bytes = scratchpad.get_size();
  size_t staged_bytes = 0;
  for (const PassArg& s : specs) {
    StagedArg& a = p.args[p.nargs++];
    a.dnnl_arg = s.dnnl_arg;
    a.dir = s.dir;
    a.user = s.user;
    a.prim = s.prim;
    int64_t elems = 1;
    for (int64_t d : s.user.dims()) elems *= d;
    if ((s.user.data_type() == dt::f16 || s.user.data_type() == dt::bf16) &&
        s.prim.data_type() == dt::f32 && s.user.get_size() == static_cast<size_t>(elems) * 2) {
      a.widen = true;
      a.wide = s.user;
      a.wide.data.data_type = dnnl_f32;
      a.wide_elems = elems;
      staged_bytes += align64(a.wide.get_size());
      a.staged = !(a.wide == s.prim);
      if (!a.staged) continue;
      staged_bytes += align64(s.prim.get_size());
      if (s.dir != ArgDir::out) a.to_prim = make_reorder(a.wide, s.prim, p.scratch_bytes);
      if (s.dir != ArgDir::in) a.to_user = make_reorder(s.prim, a.wide, p.scratch_bytes);
      continue;
    }
    a.staged = !(s.user == s.prim);
    if (!a.staged) continue;
    staged_bytes += align64(s.prim.get_size());
    if (s.dir != ArgDir::out) a.to_prim = make_reorder(s.user, s.prim, p.scratch_bytes);
    if (s.dir != ArgDir::in) a.to_user = make_reorder(s.prim, s.user, p.scratch_bytes);
  }
  p.workspace_bytes = staged_bytes + align64(p.scratch_bytes) + 64;
  return p;
}

// Runs the pass on the caller's pointers (one per argument, in make_pass order):
// stages the inputs, calls body(args, off) with the primitive's arguments (scratchpad
// included) and the workspace offset past them, then stages the outputs. run_pass's
// body executes the primitive once; a body may carve more workspace from `off`.
template <typename Body>
void run_pass_with(const Pass& p, std::initializer_list<const void*> user_ptrs, Workspace ws,
                   Body&& body) {
  DTRAIN_CHECK(static_cast<int>(user_ptrs.size()) == p.nargs, "run_pass: {} pointers for {} args",
               user_ptrs.size(), p.nargs);
  dnnl::engine& eng = cpu_engine();
  dnnl::stream& s = cpu_stream();
  size_t off = 0;
  std::array<dnnl::memory, 4> user_mem, prim_mem;
  std::array<void*, 4> user_raw{};
  constexpr int64_t kGrain = 1 << 16;
  for (int i = 0; i < p.nargs; ++i) {
    const StagedArg& a = p.args[i];
    void* ptr = const_cast<void*>(user_ptrs.begin()[i]);
    user_raw[static_cast<size_t>(i)] = ptr;
    user_mem[i] = a.widen ? dnnl::memory(a.wide, eng, ws.take<char>(off, a.wide.get_size()))
                          : dnnl::memory(a.user, eng, ptr);
    prim_mem[i] =
        a.staged ? dnnl::memory(a.prim, eng, ws.take<char>(off, a.prim.get_size())) : user_mem[i];
  }
  // f16 (bf16) in: widen into the f32 copy of the caller's layout.
  for (int i = 0; i < p.nargs; ++i) {
    const StagedArg& a = p.args[i];
    if (!a.widen || a.dir == ArgDir::out) continue;
    auto* dst = static_cast<float*>(user_mem[i].get_data_handle());
    const void* raw = user_raw[static_cast<size_t>(i)];
    parallel_for(0, a.wide_elems, kGrain, [&](int64_t lo, int64_t hi) {
      if (a.user.data_type() == dt::bf16) {
        cpu_io::load_n(static_cast<const bf16*>(raw) + lo, dst + lo, hi - lo);
      } else {
        cpu_io::load_n(static_cast<const f16*>(raw) + lo, dst + lo, hi - lo);
      }
    });
  }
  const size_t scratch_bytes = std::max<size_t>(p.scratch_bytes, 1);
  dnnl::memory scratch(
      md({static_cast<int64_t>(scratch_bytes)}, dt::u8, dnnl::memory::format_tag::a), eng,
      ws.take<char>(off, scratch_bytes));
  for (int i = 0; i < p.nargs; ++i) {
    const StagedArg& a = p.args[i];
    if (a.staged && a.dir != ArgDir::out) {
      a.to_prim.execute(s, {{DNNL_ARG_FROM, user_mem[i]},
                            {DNNL_ARG_TO, prim_mem[i]},
                            {DNNL_ARG_SCRATCHPAD, scratch}});
    }
  }
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SCRATCHPAD, scratch}};
  for (int i = 0; i < p.nargs; ++i) args[p.args[i].dnnl_arg] = prim_mem[i];
  s.wait();
  body(args, off);
  for (int i = 0; i < p.nargs; ++i) {
    const StagedArg& a = p.args[i];
    if (a.staged && a.dir != ArgDir::in) {
      a.to_user.execute(s, {{DNNL_ARG_FROM, prim_mem[i]},
                            {DNNL_ARG_TO, user_mem[i]},
                            {DNNL_ARG_SCRATCHPAD, scratch}});
    }
  }
  s.wait();
  // f16 (bf16) out: round the f32 result into the caller's buffer.
  for (int i = 0; i < p.nargs; ++i) {
    const StagedArg& a = p.args[i];
    if (!a.widen || a.dir == ArgDir::in) continue;
    const auto* src = static_cast<const float*>(user_mem[i].get_data_handle());
    void* raw = user_raw[static_cast<size_t>(i)];
    parallel_for(0, a.wide_elems, kGrain, [&](int64_t lo, int64_t hi) {
      if (a.user.data_type() == dt::bf16) {
        cpu_io::store_n(src + lo, static_cast<bf16*>(raw) + lo, hi - lo);
      } else {
        cpu_io::store_n(src + lo, static_cast<f16*>(raw) + lo, hi - lo);
      }
    });
  }
}

inline void run_pass(const Pass& p, std::initializer_list<const void*> user_ptrs, Workspace ws) {
  run_pass_with(p, user_ptrs, ws, [&](const std::unordered_map<int, dnnl::memory>& args, size_t&) {
    p.prim.execute(cpu_stream(), args);
  });
}

}  // namespace dtrain::kernels::dnnl_util
