// The combine family (templates/combine.cuh, SPEC.md stage 6): each token's weighted top-k sum of
// GEMM 2's rows in a fixed order (+ residual), no floating-point atomics.
#pragma once

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

// (T, ceil(H / (128 threads x vector))) blocks; 16-byte accesses when H splits into them.
KernelPlan combine_kernel(const LayerSpec& spec);

// Y, topk_weights, pair_pos and the residual in; the caller's output out.
CombineArgs combine_args(const CallContext& context);

}  // namespace moejit
