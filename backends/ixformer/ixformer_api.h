// The ixformer functions the ILU backend calls, declared as the CoreX ixformer library exports them
// (C++ symbols in namespace ixformer::infer of libixformer.so; SPEC.md "The ixformer API").
//
// Why moejit declares them itself: CoreX does not publish a stand-alone header for these entry
// points under a name we can rely on (the engines that call them, e.g. xLLM's
// core/kernels/ilu/ixformer.h, declare them themselves), so this file is the declaration and the
// build links libixformer.so. The declarations must match the library's mangled names exactly: the
// argument types (Tensor by value, Tensor&, const optional<Tensor>&) are part of each symbol, so a
// mismatch is an undefined-symbol error at link time, never a silent miscall. (c10::optional is
// std::optional in libtorch >= 2.4, so both spellings mangle alike; a CoreX torch older than that
// would need c10::optional here.)
// When an ixformer install does ship a header with these declarations, configure with
// IXFORMER_HEADER=<its name under include/> (the CMake block also probes ixformer/ixformer.h and
// ixformer.h): the build then defines MOEJIT_IXFORMER_VENDOR_HEADER and this file includes that
// header *instead of* the declarations below.
//
// In the contract tests (tests/ixformer) these symbols are provided by a CPU test double, not by
// ixformer.
//
// The meaning of the arguments, with the traps:
//   topk_softmax(topk_weights [T,K] fp32, topk_indices [T,K] int32, token_expert_indices [T,K] int32,
//                gating_output [T,E] **fp32 only**, renormalize)
//       softmax + top-k; no groups, no correction bias, no sigmoid, no route scale.
//   moe_compute_token_index_api(topk_ids, src_dst, dst_src, expert_sizes_gpu, expert_mask?,
//                               expert_sizes_cpu?, expand_tokens_gpu?, start_expert_id, end_expert_id,
//                               num_experts)
//       src_dst [T*K] int32 is SPEC.md's pair_pos (flat pair -> expert-sorted position);
//       dst_src [T*K] int32 is SPEC.md's sorted_pair (position -> flat pair index t*K+j, undivided);
//       expert_sizes_gpu [E] int32 the per-expert counts, on the device.
//   moe_expand_input(outputs [M,H], inputs [T,H], dst_to_src, src_to_dst?, dst_tokens, expand_factor)
//       outputs[p] = inputs[dst_to_src[p] / expand_factor]: dst_to_src is dst_src (sorted_pair).
//   moe_w16a16_group_gemm(output, inputs [M,Kd], weights, tokens_per_experts, dst_to_src?, bias?, format,
//                         persistent, output_n)
//       format "TN": weights [E,N,Kd]. tokens_per_experts is a **host** int32 tensor [E].
//       Without dst_to_src, row r of the result goes to output row r (expert-sorted order); with it,
//       row r goes to output row dst_to_src[r], so passing dst_src gives flat (t,k) order.
//       output_n is the number of rows.
//   silu_and_mul(input [M,2I], output [M,I])  -- input first: silu(input[:, :I]) * input[:, I:].
//   moe_output_reduce_sum(outputs [T,H], inputs [T,K,H], mul_weight? [T,K] fp32, mask?, extra_residual?,
//                         scaling_factor)
//       outputs[t] = sum_k mul_weight[t,k] * inputs[t,k]; scaling_factor applies **only** with
//       extra_residual, so a route scale must travel in mul_weight.
#pragma once

#include <torch/types.h>  // torch::Tensor is at::Tensor

#include <cstdint>
#include <optional>
#include <string>

#ifdef MOEJIT_IXFORMER_VENDOR_HEADER
#include MOEJIT_IXFORMER_VENDOR_HEADER
#else
namespace ixformer::infer {

void topk_softmax(torch::Tensor& topk_weights, torch::Tensor& topk_indices, torch::Tensor& token_expert_indices,
                  torch::Tensor& gating_output, bool renormalize);

void moe_compute_token_index_api(torch::Tensor& topk_ids, torch::Tensor& src_dst, torch::Tensor& dst_src,
                                 torch::Tensor& expert_sizes_gpu, const std::optional<torch::Tensor>& expert_mask,
                                 const std::optional<torch::Tensor>& expert_sizes_cpu,
                                 const std::optional<torch::Tensor>& expand_tokens_gpu, int64_t start_expert_id,
                                 int64_t end_expert_id, int64_t num_experts);

void moe_expand_input(torch::Tensor outputs, torch::Tensor inputs, torch::Tensor dst_to_src,
                      const std::optional<torch::Tensor>& src_to_dst, int64_t dst_tokens, int64_t expand_factor);

void moe_w16a16_group_gemm(torch::Tensor output, torch::Tensor inputs, torch::Tensor weights,
                           torch::Tensor tokens_per_experts, const std::optional<torch::Tensor>& dst_to_src,
                           const std::optional<torch::Tensor>& bias, std::string format, int64_t persistent,
                           int64_t output_n);

void silu_and_mul(torch::Tensor& input, torch::Tensor& output);

void moe_output_reduce_sum(torch::Tensor outputs, torch::Tensor inputs, const std::optional<torch::Tensor>& mul_weight,
                           const std::optional<torch::Tensor>& mask,
                           const std::optional<torch::Tensor>& extra_residual, double scaling_factor);

}  // namespace ixformer::infer
#endif  // MOEJIT_IXFORMER_VENDOR_HEADER
