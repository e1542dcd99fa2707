// The torch ops' argument checks, shared by the CUDA, CPU and Meta kernels (op_checks.cpp): each
// raises ValueError naming the tensor, its shape or dtype, and what is allowed.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "compiler/moe_config.h"

namespace moejit::torch_ops {

// The weights and the quantization tensors (static shapes: the Meta kernels check them too).
void check_weights_and_scales(const MoeConfig& c, const at::Tensor& w13, const at::Tensor& w2,
                              const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                              const std::optional<at::Tensor>& input_smooth,
                              const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& w13_bias,
                              const std::optional<at::Tensor>& w2_bias);
// A config whose forward and route are refused (e.g. topk > experts: experts-only) is refused by name.
void check_routable_config(const MoeConfig& c);
// hidden_scale (experts only): fp8 configs' quantized rows, hidden then float8_e4m3fn [tokens, H]
// with hidden_scale fp32 [tokens, groups] on its device (as quantize_hidden returns them).
void check_expert_tensors(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& w13, const at::Tensor& w2,
                          const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                          const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                          const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& w13_bias,
                          const std::optional<at::Tensor>& w2_bias,
                          const std::optional<at::Tensor>& hidden_scale = std::nullopt);
// quantize_hidden's input: an fp8 config, hidden [tokens, H] in the model dtype.
void check_quantize_hidden(const MoeConfig& c, const at::Tensor& hidden);
void check_routing_tensors(const MoeConfig& c, const at::Tensor& logits, const std::optional<at::Tensor>& bias);
// e_score_correction_bias: [E] fp32, bf16 or fp16, given exactly for noaux_tc, on `device` (`whose` names it).
void check_correction_bias(const MoeConfig& c, const std::optional<at::Tensor>& bias, const at::Device& device,
                           const char* whose);
// moe_layer takes router_logits and moe_layer_gate a gate weight, as the config's router_gemm says.
void check_router_input(const MoeConfig& c, bool gate_given);
// gate_weight [E, H] in the model dtype on hidden's device (router_gemm configs).
void check_gate_weight(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& gate);
// gate_bias [E] in the model dtype on hidden's device, given exactly for router_bias configs.
void check_gate_bias(const MoeConfig& c, const at::Tensor& hidden, const std::optional<at::Tensor>& bias);
// The same without a device (the Meta kernels; sizes may be symbolic).
void check_gate_bias_meta(const MoeConfig& c, const std::optional<at::Tensor>& bias);
// The callers' tensors in the dtypes the layer takes (checked, then converted on their device):
// the correction bias and the expert biases fp32 (layer_float32; None stays None), topk_ids int32
// [tokens, K], topk_weights fp32 [tokens, K].
std::optional<at::Tensor> layer_float32(const std::optional<at::Tensor>& t);
at::Tensor layer_topk_ids(const MoeConfig& c, const at::Tensor& ids, int64_t tokens);
at::Tensor layer_topk_weights(const MoeConfig& c, const at::Tensor& weights, int64_t tokens);

}  // namespace moejit::torch_ops
