// Typed options of the precision module: compute dtype, fp32 master weights and
// the loss scaler. Plain data with defaults; src/config fills and checks them.
// The scaler itself is precision/loss_scaler.h.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "core/dtype.h"
#include "core/enum_names.h"

namespace dtrain {

enum class PrecisionDType : uint8_t { fp32, fp16, bf16 };
inline constexpr std::pair<PrecisionDType, std::string_view> kPrecisionDTypeNames[] = {
    {PrecisionDType::fp32, "fp32"}, {PrecisionDType::fp16, "fp16"}, {PrecisionDType::bf16, "bf16"}};
inline std::string_view to_string(PrecisionDType v) { return enum_name(kPrecisionDTypeNames, v); }
inline bool from_string(std::string_view text, PrecisionDType& out) {
  return enum_parse(kPrecisionDTypeNames, text, out);
}
inline const auto& enum_names(PrecisionDType) { return kPrecisionDTypeNames; }
// The tensor dtype a precision computes in (graph::DTypePolicy's compute dtype).
inline DType compute_dtype(PrecisionDType p) {
  return p == PrecisionDType::bf16   ? DType::bf16
         : p == PrecisionDType::fp16 ? DType::f16
                                     : DType::f32;
}

enum class LossScaleMode : uint8_t { dynamic, static_, none };
inline constexpr std::pair<LossScaleMode, std::string_view> kLossScaleModeNames[] = {
    {LossScaleMode::dynamic, "dynamic"},
    {LossScaleMode::static_, "static"},
    {LossScaleMode::none, "none"}};
inline std::string_view to_string(LossScaleMode v) { return enum_name(kLossScaleModeNames, v); }
inline bool from_string(std::string_view text, LossScaleMode& out) {
  return enum_parse(kLossScaleModeNames, text, out);
}
inline const auto& enum_names(LossScaleMode) { return kLossScaleModeNames; }

// What a dynamic scaler does when an overflow arrives at the minimum scale.
enum class LossScaleOnMin : uint8_t { error, clamp };
inline constexpr std::pair<LossScaleOnMin, std::string_view> kLossScaleOnMinNames[] = {
    {LossScaleOnMin::error, "error"}, {LossScaleOnMin::clamp, "clamp"}};
inline std::string_view to_string(LossScaleOnMin v) { return enum_name(kLossScaleOnMinNames, v); }
inline bool from_string(std::string_view text, LossScaleOnMin& out) {
  return enum_parse(kLossScaleOnMinNames, text, out);
}
inline const auto& enum_names(LossScaleOnMin) { return kLossScaleOnMinNames; }

// The scaler's settings; precision/loss_scaler.h specifies the state machine.
// Dynamic: start at init, back off (x backoff_factor) and skip the step on inf/nan,
// grow (x growth_factor) after growth_interval clean steps, kept within [min, max].
// Static: always init. When the job leaves mode out: dynamic for fp16, none otherwise.
struct LossScaleOptions {
  LossScaleMode mode = LossScaleMode::none;
  double init = 32768.0;  // 2^15
  int64_t growth_interval = 2000;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  double min = 1.0;
  double max = 16777216.0;  // 2^24
  int64_t hysteresis = 1;   // overflows tolerated (skipped, scale kept) before backing off
  LossScaleOnMin on_min = LossScaleOnMin::error;
};

struct PrecisionOptions {
  PrecisionDType dtype = PrecisionDType::fp32;
  bool master_weights = true;  // fp32 master weights and optimizer state for half dtypes
  // f32 GEMMs and convolutions on CUDA may use TF32 tensor cores (10-bit mantissa
  // inputs, f32 accumulation). No effect on the CPU, which computes f32 in full.
  bool tf32 = false;
  LossScaleOptions loss_scale;
};

}  // namespace dtrain
