// The hook the torch op library's CUDA kernels call (backends/torch/moejit_ops.cpp): on a device
// whose backend is ixformer (runtime/backend_select.h), the op runs through the ILU adapter
// (ixformer_layer.h) instead of the JIT. Compiled into the op library whether or not this build
// has ixformer; without it, a device that needs ixformer gets a clear error instead of a JIT
// compile that cannot run there.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "compiler/moe_config.h"

namespace moejit::ilu {

// True when ops on `device` (a CUDA-runtime device) must go through ixformer. Throws (RuntimeError)
// when the device needs ixformer but this build does not have it. Decided once per device.
bool use_ixformer(const at::Device& device);

// The ops, on the ixformer path (only called when use_ixformer returned true).
at::Tensor moe_layer_op(const MoeConfig& config, const at::Tensor& hidden, const at::Tensor& router_logits,
                        const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                        const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                        const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                        const std::optional<at::Tensor>& residual);
std::tuple<at::Tensor, at::Tensor> route_op(const MoeConfig& config, const at::Tensor& router_logits,
                                            const std::optional<at::Tensor>& bias);
at::Tensor experts_op(const MoeConfig& config, const at::Tensor& hidden, const at::Tensor& topk_ids,
                      const at::Tensor& topk_weights, const at::Tensor& w13, const at::Tensor& w2,
                      const std::optional<at::Tensor>& residual);
// What moejit::compile returns for an ixformer device (nothing to compile).
std::string compile_summary(const MoeConfig& config);

}  // namespace moejit::ilu
