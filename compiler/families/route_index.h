// The fused routing + index family (templates/route_index.cuh): stages 1 and 2 in one single-block
// launch for small batches (CallPlan decides when), or the index steps alone on a given routing.
#pragma once

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

// The routing Spec and the index Spec in one struct, and as many routing warps as 32 KiB of score
// rows allow, up to 8.
KernelPlan route_index_kernel(const LayerSpec& spec);

// Its arguments: routing then index for Entry::Forward; the index alone (route = 0) on the
// caller's routing for Entry::Experts.
RouteIndexArgs route_index_args(const CallContext& context);

}  // namespace moejit
