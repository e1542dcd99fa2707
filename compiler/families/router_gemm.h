// The router GEMM family (templates/router_gemm.cuh, docs/LAYER_MATH.md "Router GEMM"): for
// router_gemm layers, logits = hidden @ gate_weight^T into the workspace, read by the routing kernel
// launched next.
#pragma once

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

// Tokens of one router GEMM block (its accumulators a lane holds per expert).
constexpr int kRouterTokensPerBlock = 8;
// Warps of a router GEMM block.
constexpr int kRouterWarps = 8;
// Hidden columns a block stages in shared memory at a time (8 tokens x 1024 bf16: 16 KB).
constexpr int kRouterChunkColumns = 1024;

// The router GEMM kernel: Spec constants, entry name, and launch rule
// (ceil(T / kRouterTokensPerBlock), ceil(E / experts per block)) blocks.
KernelPlan router_gemm_kernel(const LayerSpec& spec);

// Its arguments: the call's hidden and gate weight in, the workspace's router logits out.
RouterGemmArgs router_gemm_args(const CallContext& context);

}  // namespace moejit
