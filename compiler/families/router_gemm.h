// The router GEMM family (templates/router_gemm.cuh, docs/LAYER_MATH.md "Router GEMM"): for
// router_gemm layers, logits = hidden @ gate_weight^T (+ gate_bias for router_bias layers) into the
// workspace, read by the routing kernel
// launched next. A kernel per token bucket (TokenBucket::router_kernel): the SIMT kernel at decode,
// which spreads the gate weight over about one block an SM; tensor-core tiles above, which read a
// block's hidden rows once for many experts (mid: narrow expert tiles, for blocks enough; prefill:
// wide ones, for fewer rereads of the hidden rows).
#pragma once

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

// SIMT kernel: tokens of one block (the accumulators a lane holds per expert), its warps, and the
// 16-byte gate vectors a lane loads into registers at a time (DeepSeek-V3's share of a row is 7).
constexpr int kRouterTokensPerBlock = 8;
constexpr int kRouterWarps = 8;
constexpr int kRouterGateVectors = 8;
// Tensor-core kernel: tokens of one block tile; the shared memory its pipeline may fill (at most
// kRouterMaxStages stages; two blocks an SM). On the H200 (bench/RESULTS.md, session 18) neither
// depth nor mma chains bound a block: 16 stages instead of 4 gained ~10% in the mid bucket, 8
// instead of 4 (one block an SM) cost DeepSeek-V3's prefill 60%, and independent mma chains gained
// nothing. A block moves ~35 GB/s, one SM's share of HBM, so the mid bucket's few blocks bind.
constexpr int kRouterTileTokens = 32;
constexpr int kRouterPipelineBytes = 80 * 1024;
constexpr int kRouterMaxStages = 16;
constexpr int kRouterMidExperts = 32;
constexpr int kRouterPrefillExperts = 128;

// Whether the layer's router GEMM can run on tensor cores: bf16/fp16 and rows of whole 16-byte chunks.
bool router_tensor_core_eligible(const LayerSpec& spec);

// The router GEMM kernel of a token bucket: Spec constants, entry name, launch rule
// (ceil(T / token tile), ceil(E / experts per block)) blocks.
KernelPlan router_gemm_kernel(const LayerSpec& spec, BucketKind bucket);

// Its arguments: the call's hidden, gate weight and gate bias (router_bias) in, the workspace's
// router logits out.
RouterGemmArgs router_gemm_args(const CallContext& context);

}  // namespace moejit
