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

#include "backends/torch/op_checks.h"
#include "compiler/moe_config.h"

namespace moejit::torch_ops {

// The op registry's parsed config (moejit_ops.cpp); the argument checks are in op_checks.h.
const MoeConfig& parse_config(const std::string& config_json);

at::Tensor moe_layer_cpu(const at::Tensor& hidden, const at::Tensor& router_logits, const at::Tensor& w13,
                         const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                         const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                         const std::optional<at::Tensor>& residual, const std::string& config,
                         const std::optional<at::Tensor>& w13_bias, const std::optional<at::Tensor>& w2_bias);

// The whole layer with its router GEMM (router_gemm): logits = hidden @ gate_weight^T (+ gate_bias
// for router_bias) in fp32, rounded to router_dtype, then as moe_layer_cpu.
at::Tensor moe_layer_gate_cpu(const at::Tensor& hidden, const at::Tensor& gate_weight, const at::Tensor& w13,
                              const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                              const std::optional<at::Tensor>& input_smooth,
                              const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                              const std::string& config, const std::optional<at::Tensor>& w13_bias,
                              const std::optional<at::Tensor>& w2_bias, const std::optional<at::Tensor>& gate_bias);

std::tuple<at::Tensor, at::Tensor> route_cpu(const at::Tensor& router_logits, const std::optional<at::Tensor>& bias,
                                             const std::string& config);

at::Tensor experts_cpu(const at::Tensor& hidden, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                       const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& w13_scale,
                       const std::optional<at::Tensor>& w2_scale, const std::optional<at::Tensor>& input_smooth,
                       const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                       const std::string& config, const std::optional<at::Tensor>& w13_bias,
                       const std::optional<at::Tensor>& w2_bias, const std::optional<at::Tensor>& hidden_scale);

// An fp8 layer's stage 3 alone: hidden [T, H] -> (q float8_e4m3fn [T, H], scale fp32 [T, groups]),
// the rows experts() takes with hidden_scale (expert parallel's fp8 dispatch sends them).
std::tuple<at::Tensor, at::Tensor> quantize_hidden_cpu(const at::Tensor& hidden, const std::string& config);

}  // namespace moejit::torch_ops
