// The ILU backend (DESIGN.md decision 9): moejit's layer forward on Iluvatar CoreX devices, through
// the vendor library ixformer (ixformer_api.h) instead of NVRTC-generated kernels, which do not run
// there. Same contract as the JIT path (SPEC.md), torch tensors on the ILU device in and out.
//
// Who computes what (SPEC.md stage by stage):
//   routing     ixformer topk_softmax when the config is plain softmax top-k (no groups kept out, no
//               correction bias, route scale 1); the renormalization then runs as one ATen op.
//               Anything else (sigmoid, expert groups, noaux_tc bias, route scale != 1) runs on
//               moejit's one CPU routing (common/cpu_routing.h, the torch op's CPU kernel) on the
//               host (portable_routing.h): logits and bias copied to the host, weights and ids back
//               to the device, and the per-expert pair counts counted on the host from the ids.
//   index       ixformer moe_compute_token_index_api (full expert range [0, E)).
//   expand      ixformer moe_expand_input.
//   GEMM 1      ixformer moe_w16a16_group_gemm, format TN, expert-sorted rows.
//   activation  ixformer silu_and_mul for gated silu; gelu / gelu_tanh / non-gated run as ATen ops.
//   GEMM 2      ixformer moe_w16a16_group_gemm with dst_to_src = sorted_pair: rows land in flat
//               (t,k) order.
//   combine     ixformer moe_output_reduce_sum with mul_weight = topk_weights (route scale included)
//               and scaling_factor 1 (ixformer applies it only with a residual).
//   refused     quant w8a8_int8, expert parallel (ep_size > 1), dtype fp32, weight_layout kn:
//               c10::NotImplementedError naming the capability (unsupported_capability below).
//
// Unlike the JIT path (DESIGN.md decision 6), a call SYNCHRONIZES the stream once: ixformer's group
// GEMM takes the per-expert token counts as a host tensor. Where that wait happens:
//   forward, topk_softmax routing   the counts are copied device -> host after index generation.
//   forward, portable routing       the logits are copied device -> host for the routing; the host
//                                   then counts from the ids, and the device counts are not copied.
//   route                           portable routing: the logits' copy; topk_softmax: no wait.
//   experts                         the counts' copy after index generation.
// For the same reason a call cannot be captured into a CUDA graph.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "compiler/moe_config.h"

namespace moejit::ilu {

// What the ixformer path cannot compute for `config`, one line naming the capability
// (e.g. "quant w8a8_int8: ..."); empty when the config is supported. Routing never appears here:
// what topk_softmax cannot do runs on moejit's portable routing.
std::string unsupported_capability(const MoeConfig& config);

// True when ixformer's topk_softmax computes this config's routing exactly as SPEC.md says.
bool routing_by_topk_softmax(const MoeConfig& config);

// Stage 1 only. logits [T, E] (dtype or fp32); bias [E] fp32 for noaux_tc.
// Returns (topk_weights [T, K] fp32, topk_ids [T, K] int32) on the logits' device.
std::tuple<at::Tensor, at::Tensor> route(const MoeConfig& config, const at::Tensor& router_logits,
                                         const std::optional<at::Tensor>& e_score_correction_bias);

// Stages 2-6 given a routing. hidden [T, H]; topk_ids [T, K] int32 in [0, experts); topk_weights
// [T, K] fp32; w13 [E, N1, H]; w2 [E, H, I]; residual [T, H] optional. Returns out [T, H].
// Throws c10::NotImplementedError when unsupported_capability(config) is not empty.
at::Tensor experts(const MoeConfig& config, const at::Tensor& hidden, const at::Tensor& topk_ids,
                   const at::Tensor& topk_weights, const at::Tensor& w13, const at::Tensor& w2,
                   const std::optional<at::Tensor>& residual);

// The whole layer: route, then experts (with the host counts of a portable routing, so one wait in
// all). The capability check runs before any ixformer call and any copy.
at::Tensor forward(const MoeConfig& config, const at::Tensor& hidden, const at::Tensor& router_logits,
                   const at::Tensor& w13, const at::Tensor& w2,
                   const std::optional<at::Tensor>& e_score_correction_bias,
                   const std::optional<at::Tensor>& residual);

}  // namespace moejit::ilu
