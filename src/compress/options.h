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

struct CompressOptions {
  CompressMethod method = CompressMethod::none;
  double ratio = 0.01;         // topk: fraction of gradient entries sent
  int rank = 4;                // powersgd: rank of the low-rank approximation
  bool error_feedback = true;  // add what compression dropped to the next step's gradient
  int64_t warmup_steps = 0;    // uncompressed all-reduce for the first steps
};

}  // namespace dtrain
