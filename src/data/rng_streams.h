// The Philox purposes (the top 8 bits of a stream id, see core/rng.h) that the
// data module draws from. Graph code uses 1 (init) and 3 (dropout); data takes
// 0x10 upwards so the streams never meet.
#pragma once

#include <cstdint>

namespace dtrain::data_rng {

inline constexpr uint32_t kShuffle = 0x10;    // stream index: epoch
inline constexpr uint32_t kAugment = 0x11;    // stream index: epoch; block: sample index
inline constexpr uint32_t kSynthetic = 0x12;  // rank field: split; stream index: sample index

}  // namespace dtrain::data_rng
