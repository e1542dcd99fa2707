// CPU kernels of the moejit torch ops: SPEC.md's math with ATen, so the ops (and models patched to
// use them) also run on CPU tensors. Routing accumulates in fp32 like the GPU kernels; expert
// matmuls run in fp32 (int8 products exactly, in fp64; fp8 e4m3 products exactly in fp32, scaled per
// 128-deep block or per tensor as SPEC.md says) and are rounded to the model dtype where the GPU
// rounds them.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "compiler/moe_config.h"

namespace moejit::torch_ops {

// Shared argument checks (moejit_ops.cpp), raising ValueError with the argument's name.
const MoeConfig& parse_config(const std::string& config_json);
void check_expert_tensors(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& w13, const at::Tensor& w2,
                          const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                          const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                          const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& w13_bias,
                          const std::optional<at::Tensor>& w2_bias);
void check_routing_tensors(const MoeConfig& c, const at::Tensor& logits, const std::optional<at::Tensor>& bias);
// e_score_correction_bias: [E] fp32, bf16 or fp16, given exactly for noaux_tc, on `device` (`whose` names it).
void check_correction_bias(const MoeConfig& c, const std::optional<at::Tensor>& bias, const at::Device& device,
                           const char* whose);
// moe_layer takes router_logits and moe_layer_gate a gate weight, as the config's router_gemm says.
void check_router_input(const MoeConfig& c, bool gate_given);
// gate_weight [E, H] in the model dtype on hidden's device (router_gemm configs).
void check_gate_weight(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& gate);
// The callers' tensors in the dtypes the layer takes (checked, then converted on their device):
// the correction bias and the expert biases fp32 (layer_float32; None stays None), topk_ids int32
// [tokens, K], topk_weights fp32 [tokens, K].
std::optional<at::Tensor> layer_float32(const std::optional<at::Tensor>& t);
at::Tensor layer_topk_ids(const MoeConfig& c, const at::Tensor& ids, int64_t tokens);
at::Tensor layer_topk_weights(const MoeConfig& c, const at::Tensor& weights, int64_t tokens);

at::Tensor moe_layer_cpu(const at::Tensor& hidden, const at::Tensor& router_logits, const at::Tensor& w13,
                         const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                         const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                         const std::optional<at::Tensor>& residual, const std::string& config,
                         const std::optional<at::Tensor>& w13_bias, const std::optional<at::Tensor>& w2_bias);

// The whole layer with its router GEMM (router_gemm): logits = hidden @ gate_weight^T in fp32,
// rounded to router_dtype, then as moe_layer_cpu.
at::Tensor moe_layer_gate_cpu(const at::Tensor& hidden, const at::Tensor& gate_weight, const at::Tensor& w13,
                              const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                              const std::optional<at::Tensor>& input_smooth,
                              const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                              const std::string& config, const std::optional<at::Tensor>& w13_bias,
                              const std::optional<at::Tensor>& w2_bias);

std::tuple<at::Tensor, at::Tensor> route_cpu(const at::Tensor& router_logits, const std::optional<at::Tensor>& bias,
                                             const std::string& config);

at::Tensor experts_cpu(const at::Tensor& hidden, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                       const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& w13_scale,
                       const std::optional<at::Tensor>& w2_scale, const std::optional<at::Tensor>& input_smooth,
                       const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                       const std::string& config, const std::optional<at::Tensor>& w13_bias,
                       const std::optional<at::Tensor>& w2_bias);

}  // namespace moejit::torch_ops
