// Typed options of the gradient-compression module (top-k, 1-bit, PowerSGD, all
// with error feedback). Plain data with defaults; src/config fills and checks them.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

#include "core/enum_names.h"

namespace dtrain {

enum class CompressMethod : uint8_t { none, topk, onebit, powersgd };
inline constexpr std::pair<CompressMethod, std::string_view> kCompressMethodNames[] = {
    {CompressMethod::none, "none"},
    {CompressMethod::topk, "topk"},
    {CompressMethod::onebit, "onebit"},
    {CompressMethod::powersgd, "powersgd"}};
inline std::string_view to_string(CompressMethod v) { return enum_name(kCompressMethodNames, v); }
inline bool from_string(std::string_view text, CompressMethod& out) {
  return enum_parse(kCompressMethodNames, text, out);
}
inline const auto& enum_names(CompressMethod) { return kCompressMethodNames; }

// How top-k and 1-bit exchange a bucket. gather: every rank's compressed bucket is
// all-gathered and summed (one compression; a rank receives world x what it sends).
// two_phase: each rank compresses its chunk of the bucket for every peer, an
// all-to-all sends each chunk to the rank that owns it, the owner sums its chunk, adds
// its own (server) residual, compresses the sum again and all-gathers it (two
// compressions, each with error feedback; a rank moves about twice what it sends,
// whatever the world size). auto (gather_share): gather while gathering moves at most a
// quarter of a dense all-reduce's bytes, since its one compression loses less (GPT-2
// tiny on fortunes, 300 steps, validation loss gathered against two-phase: 2 ranks 5.74
// / 5.95 for top-k 2%, 5.80 / 5.98 for 1-bit; 8 ranks 5.87 / 6.17 and 5.81 / 6.12,
// dense 5.52; after 1200 steps on 8 ranks 5.43 / 5.60 for top-k 2%, dense 4.93); two_phase beyond
// (1-bit from 16 data ranks, top-k from 0.25 / ratio: 13 at 2%, 26 at the default 1%). PowerSGD
// all-reduces its factors and takes none of them.
enum class CompressExchange : uint8_t { auto_, gather, two_phase };
inline constexpr std::pair<CompressExchange, std::string_view> kCompressExchangeNames[] = {
    {CompressExchange::auto_, "auto"},
    {CompressExchange::gather, "gather"},
    {CompressExchange::two_phase, "two_phase"}};
inline std::string_view to_string(CompressExchange v) {
  return enum_name(kCompressExchangeNames, v);
}
inline bool from_string(std::string_view text, CompressExchange& out) {
  return enum_parse(kCompressExchangeNames, text, out);
}
inline const auto& enum_names(CompressExchange) { return kCompressExchangeNames; }

struct CompressOptions {
  CompressMethod method = CompressMethod::none;
  double ratio = 0.01;         // topk: fraction of gradient entries sent
  int rank = 4;                // powersgd: rank of the low-rank approximation
  bool error_feedback = true;  // add what compression dropped to the next step's gradient
  int64_t warmup_steps = 0;    // uncompressed all-reduce for the first steps
  CompressExchange exchange = CompressExchange::auto_;  // topk and onebit
};

// What a gathered exchange of top-k or 1-bit moves on `world` data ranks for each
// compressed element, as a share of what a dense all-reduce moves for it (bus bytes:
// (n-1) x the bytes one rank sends against 2 (n-1) / n x 4): world x ratio for top-k
// (an index and a value per entry sent), world x 33 / 2048 for 1-bit (a sign bit and a
// scale per 1024 entries); 0 for the others.
inline double gather_share(const CompressOptions& o, int world) {
  double sent = 0;  // bytes one rank sends per compressed element
  if (o.method == CompressMethod::topk) sent = 8.0 * o.ratio;
  if (o.method == CompressMethod::onebit) sent = 4.0 * (1.0 / 32 + 1.0 / 1024);
  return static_cast<double>(world) * sent / 8.0;
}

// The exchange a job of `method` runs on `world` data ranks: gather or two_phase for
// top-k and 1-bit (auto resolved: two_phase where gather_share passes a quarter),
// gather (meaning: the method's own) for PowerSGD.
inline CompressExchange resolve_exchange(const CompressOptions& o, int world) {
  if (o.method != CompressMethod::topk && o.method != CompressMethod::onebit)
    return CompressExchange::gather;
  if (o.exchange != CompressExchange::auto_) return o.exchange;
  return gather_share(o, world) > 0.25 ? CompressExchange::two_phase : CompressExchange::gather;
}

}  // namespace dtrain
