// Small layer configs the GPU test suites share: a plain softmax layer of any size and dtype, and
// DeepSeek-V3's routing at a small size.
#pragma once

#include <cstdint>

#include "compiler/moe_config.h"

namespace moejit::test {

// `c` resized (experts, top-k, hidden, intermediate) in `dtype`, its router logits too.
inline MoeConfig sized(MoeConfig c, int experts, int topk, int64_t hidden, int64_t inter, DType dtype) {
  c.experts = experts;
  c.topk = topk;
  c.hidden = hidden;
  c.moe_intermediate = inter;
  c.dtype = c.router_dtype = dtype;
  return c;
}

inline MoeConfig small_config(int experts, int topk, int64_t hidden, int64_t inter, DType dtype) {
  return sized(MoeConfig{}, experts, topk, hidden, inter, dtype);
}

// DeepSeek-V3's routing (8 groups keep 4, sigmoid, noaux_tc, scale 2.5) at a small size.
inline MoeConfig grouped_sigmoid(int experts, int topk, int64_t hidden, int64_t inter, DType dtype) {
  return sized(preset("deepseek-v3"), experts, topk, hidden, inter, dtype);
}

}  // namespace moejit::test
