// The Philox purposes (the top 8 bits of a stream id, see core/rng.h) that the
// data module draws from. Graph code uses 1 (init) and 3 (dropout); data takes
// 0x10 upwards so the streams never meet.
#pragma once

#include <cstdint>

namespace dtrain::data_rng {

inline constexpr uint32_t kShuffle = 0x10;     // stream index: epoch
inline constexpr uint32_t kAugment = 0x11;     // stream index: epoch; block: sample index
inline constexpr uint32_t kSynthetic = 0x12;   // rank field: split; stream index: sample index
inline constexpr uint32_t kTextOffset = 0x13;  // stream index: epoch (first token of window 0)
inline constexpr uint32_t kMask = 0x14;      // stream index: window; block: epoch << 32 | position
inline constexpr uint32_t kDocSplit = 0x15;  // stream index: document (train / validation)
inline constexpr uint32_t kResizedCrop = 0x16;  // stream index: epoch; block: sample << 4 | try

}  // namespace dtrain::data_rng
