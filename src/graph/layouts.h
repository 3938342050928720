// Which activations the CPU executor keeps channel-blocked. oneDNN's convolutions
// compute in NCHW[B]c ([N, C/B, H, W, B], B = kernels::cpu_channel_block(): 8 with
// AVX2, 16 with AVX-512); a convolutional network's activations kept so from the stem
// to the global pool are never reordered around a convolution, where plain NCHW would
// cost two reorders of every activation and gradient per convolution and pass
// (ResNet-50: 0.70 s of a 6.5 s step). The layout is the CPU backend's business: the
// graph, its shapes, the memory plan and every op's result (bit for bit) are the same
// either way; only ops with a blocked form see it (OpContext::input_block / output_block).
//
// Each op says whether it has a blocked form (Op::blocked_form): batch norm (with or
// without its ReLU), max / average pooling, ReLU and add (with or without its ReLU)
// need their operands alike; a convolution with groups 1 and no bias takes each
// operand as it lies; global average pooling reads a blocked input. A value is blocked
// when it is an f32 (or, with `bf16`, a bf16) [N, C, H, W] with C a multiple of B, made inside the
// executor's range by an op with a blocked form and read only inside the range by such ops; and it
// is not pinned (the caller reads it) nor crosses the range (what pipeline stages send and receive
// stays NCHW). A node that needs its operands alike has them all blocked or none. A value's
// gradient lies as the value.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "graph/graph.h"

namespace dtrain::graph {

// Per value: B or 0. block 0: none. pinned: per value, or empty (none). bf16: bf16
// values too (kernels::cpu_channel_block(DType::bf16): oneDNN computes them in that block).
std::vector<int32_t> channel_blocks(const Graph& graph, int64_t block, std::span<const char> pinned,
                                    int begin, int end, bool bf16 = false);

}  // namespace dtrain::graph
