// The routing family (templates/routing.cuh, SPEC.md stage 1): router logits -> top-k weights and
// ids, one warp a token.
#pragma once

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

// Warps of a routing block (one token each).
constexpr int kRouteWarps = 4;

// The routing kernel: Spec constants (scoring, groups, bias, renormalize, scale), entry name, and
// launch rule (ceil(T / kRouteWarps) blocks).
KernelPlan routing_kernel(const LayerSpec& spec);

// Its arguments: the call's logits and correction bias in, topk_weights / topk_ids out.
RouteArgs routing_args(const CallContext& context);

}  // namespace moejit
