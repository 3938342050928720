// See grad_compression.h.
#include "runtime/grad_compression.h"

#include <fmt/format.h>

#include <algorithm>

#include "dist/ddp.h"
#include "kernels/elementwise.h"
#include "kernels/memory.h"
#include "runtime/estimate.h"
#include "runtime/param_groups.h"

namespace dtrain::runtime {

std::vector<compress::ParamInfo> compression_params(const std::vector<graph::FlatEntry>& layout,
                                                    const ParamGroups& groups) {
  const bool tensor_split = std::any_of(
      layout.begin(), layout.end(), [](const graph::FlatEntry& e) { return e.spec.split.split(); });
  std::vector<compress::ParamInfo> params;
  for (const graph::FlatEntry& e : layout) {
    const Shape& sh = e.spec.shape;
    const bool frozen = groups.frozen(e.name);
    const bool compressible = sh.rank() >= 2 && (!tensor_split || e.spec.split.split()) && !frozen;
    params.push_back({e.offset, sh.numel(), compressible ? sh[0] : 0});
  }
  return params;
}

CompressionPlanSummary summarize_plan(const CompressOptions& o,
                                      const std::vector<compress::BucketPlan>& plans, int tensors,
                                      int data_ranks) {
  CompressionPlanSummary s;
  for (const compress::BucketPlan& p : plans) s.compressed += static_cast<int>(p.compressed.size());
  s.tensors = tensors;
  s.per_step = compress::bytes_per_step(o, plans, std::max(data_ranks, 1));
  return s;
}

std::string gather_note(const CompressOptions& o, int data_ranks, double bus, double dense) {
  if (resolve_exchange(o, data_ranks) != CompressExchange::gather ||
      o.method == CompressMethod::powersgd || o.method == CompressMethod::none || bus <= dense)
    return {};
  return fmt::format(
      "on {} data ranks {} moves {:.1f}x the bytes per rank of a dense all-reduce ({} against "
      "{}): compress.exchange gather all-gathers every rank's compressed gradient, so its traffic "
      "grows with the ranks; compress.exchange: two_phase (auto's choice where gathering moves "
      "over a quarter of the dense bytes) moves about twice what a rank sends, at any size",
      data_ranks, to_string(o.method), bus / dense, format_bytes(bus), format_bytes(dense));
}

std::string two_phase_note(const CompressOptions& o, int data_ranks) {
  if (o.exchange != CompressExchange::auto_ ||
      resolve_exchange(o, data_ranks) != CompressExchange::two_phase)
    return {};
  return fmt::format(
      "note: compress.exchange auto took two_phase on {} data ranks, where gathering would move "
      "{:.2f} of a dense all-reduce's bytes (auto gathers up to 0.25); its second compression "
      "costs accuracy (GPT-2 tiny, top-k 2%, validation loss over gathering's: +0.30 nats on 8 "
      "ranks and +0.50 on 16 after 300 steps, +0.17 on 8 ranks after 1200); "
      "compress.exchange: gather keeps one compression",
      data_ranks, gather_share(o, data_ranks));
}

std::string gather_warning(const CompressOptions& o, const std::vector<compress::BucketPlan>& plans,
                           int data_ranks, bool zero1) {
  const int n = std::max(data_ranks, 1);
  if (o.method == CompressMethod::powersgd || o.method == CompressMethod::none || n < 2) return {};
  const double layout = static_cast<double>(compress::bytes_per_step(o, plans, n).dense);
  const double gather = zero1 ? (n - 1.0) / n * layout : 0.0;
  const double bus = compress::bus_bytes_per_step(o, plans, n) + gather;
  const double dense = 2.0 * (n - 1) / n * layout;
  const std::string note = gather_note(o, n, bus, dense);
  return note.empty() ? note : "warning: " + note;
}

GradCompression::GradCompression(const CompressOptions& o, const ParamGroups& groups,
                                 const std::vector<graph::FlatEntry>& layout,
                                 const std::vector<dist::Bucket>& buckets,
                                 dist::Communicator& grad_comm, dist::GradSync& sync,
                                 int64_t layout_elems, AllreduceAlgo dense_algo, uint64_t seed,
                                 Device device, std::vector<int64_t> place)
    : o_(o),
      sync_(sync),
      compressor_(o, grad_comm,
                  compress::plan_compression(o, buckets, compression_params(layout, groups)),
                  layout_elems, dense_algo, seed, device),
      summary_(summarize_plan(o, compressor_.plans(), static_cast<int>(layout.size()),
                              grad_comm.size())),
      place_(std::move(place)) {
  // Another method's residual means another thing; the residual's form is 2: compact in
  // layout order (Compressor::residual). Earlier forms (the whole layout, or compact in
  // bucket order) are not restored.
  place_.push_back(static_cast<int64_t>(o.method));
  place_.push_back(2);
  if (groups.any_frozen()) {              // another freeze list compresses other tensors
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the compressed pieces
    for (const compress::BucketPlan& p : compressor_.plans()) {
      for (const compress::Piece& m : p.compressed) {
        for (const int64_t v : {m.lo, m.hi}) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
      }
    }
    place_.push_back(static_cast<int64_t>(h));
  }
  // two_phase: the server residual is this rank's segment of each bucket, so it is
  // restored only at the same place with the same buckets (their compressed sizes).
  // The rank's own residual does not depend on the buckets or the exchange.
  if (compressor_.server_residual().numel() > 0) {
    server_place_ = place_;
    for (const compress::BucketPlan& p : compressor_.plans()) {
      int64_t n = 0;
      for (const compress::Piece& m : p.compressed) n += m.hi - m.lo;
      server_place_.push_back(n);
    }
  }
  sync_.set_reducer({[this](size_t b, Tensor grads) { compressor_.start(b, std::move(grads)); },
                     [this] { return compressor_.advance(); },
                     [this] { return compressor_.complete(); }});
}

std::string GradCompression::describe(bool zero1) const {
  const std::string exchange =
      o_.method == CompressMethod::powersgd
          ? std::string()
          : fmt::format(", exchange {}", to_string(compressor_.exchange()));
  std::string text = fmt::format(
      "compression: {} on {} of {} parameter tensors{}, error feedback {}, {} dense step(s) "
      "first; {} bytes sent per step per rank instead of {} ({:.1f}x)",
      to_string(o_.method), summary_.compressed, summary_.tensors, exchange,
      o_.error_feedback ? "on" : "off", o_.warmup_steps, summary_.per_step.sent,
      summary_.per_step.dense, summary_.ratio());
  const std::string warning =
      gather_warning(o_, compressor_.plans(), static_cast<int>(place_[1]), zero1);
  if (!warning.empty()) text += "\n" + warning;
  const std::string choice = two_phase_note(o_, static_cast<int>(place_[1]));
  if (!choice.empty()) text += "\n" + choice;
  return text;
}

void GradCompression::begin_step(int64_t step) { sync_.use_reducer(step >= o_.warmup_steps); }

std::vector<NamedTensor> GradCompression::state(bool with_q) const {
  // The save writes them before the next step: no copies but a device's to the host.
  std::vector<NamedTensor> out = {{"compress.residual", kernels::to_host(compressor_.residual())}};
  Tensor place = Tensor::empty(Shape{static_cast<int64_t>(place_.size())}, DType::i64);
  std::copy(place_.begin(), place_.end(), place.data<int64_t>());
  out.push_back({"compress.place", place});
  const Tensor q = compressor_.powersgd_q();
  if (with_q && q.defined()) out.push_back({"compress.q", kernels::to_host(q)});
  if (compressor_.server_residual().numel() > 0) {
    out.push_back({"compress.server", kernels::to_host(compressor_.server_residual())});
    Tensor at = Tensor::empty(Shape{static_cast<int64_t>(server_place_.size())}, DType::i64);
    std::copy(server_place_.begin(), server_place_.end(), at.data<int64_t>());
    out.push_back({"compress.server_place", at});
  }
  return out;
}

bool GradCompression::restore(const std::vector<NamedTensor>& blobs) {
  Tensor residual = compressor_.residual();
  Tensor q = compressor_.powersgd_q();
  Tensor server = compressor_.server_residual();
  const NamedTensor *place = nullptr, *saved = nullptr, *saved_q = nullptr, *saved_server = nullptr,
                    *server_place = nullptr;
  const auto equal = [](const NamedTensor& t, const std::vector<int64_t>& v) {
    return t.tensor.dtype() == DType::i64 && t.tensor.numel() == static_cast<int64_t>(v.size()) &&
           std::equal(v.begin(), v.end(), t.tensor.data<int64_t>());
  };
  for (const NamedTensor& t : blobs) {
    if (t.name == "compress.place" && equal(t, place_)) place = &t;
    if (t.name == "compress.server_place" && !server_place_.empty() && equal(t, server_place_))
      server_place = &t;
    if (t.tensor.dtype() == DType::f32 && t.name == "compress.residual" &&
        t.tensor.shape().rank() == 1 && t.tensor.numel() == residual.numel())
      saved = &t;
    if (t.tensor.dtype() == DType::f32 && t.name == "compress.q" && q.defined() &&
        t.tensor.numel() == q.numel())
      saved_q = &t;
    if (t.tensor.dtype() == DType::f32 && t.name == "compress.server" &&
        t.tensor.numel() == server.numel())
      saved_server = &t;
  }
  // All of it or nothing: a residual made elsewhere would feed back the wrong entries.
  // The server residual on its own: made with other buckets (or by the gather exchange,
  // which has none), it starts empty while the rest is restored.
  if (place == nullptr || saved == nullptr || (q.defined() && saved_q == nullptr)) return false;
  if (residual.numel() > 0) kernels::copy(saved->tensor, residual);
  restored_server_ = server_place != nullptr && saved_server != nullptr;
  if (restored_server_) kernels::copy(saved_server->tensor, server);
  if (q.defined()) kernels::copy(saved_q->tensor.view(0, q.shape()), q);
  return true;
}

void GradCompression::adjust(const precision::ScaleDecision& d) {
  for (Tensor r : {compressor_.residual(), compressor_.server_residual()}) {
    if (r.numel() == 0) continue;  // no error feedback (or no server residual)
    if (d.skip) {
      kernels::fill(r, -0.0f);  // -0: see Compressor's constructor
    } else if (d.new_scale != d.old_scale) {
      kernels::scale(static_cast<float>(d.new_scale / d.old_scale), r, r);
    }
  }
}

}  // namespace dtrain::runtime
