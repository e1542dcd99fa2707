// The router's gate weight of a MoE layer, which a router_gemm layer takes instead of router logits
// (docs/LAYER_MATH.md "Router GEMM"): [E, H], one row per expert, as every family stores it:
//   - Qwen2/3-MoE, Qwen3-Next, DeepSeek-V2/V3, Kimi-K2, GLM-4.5: `<layer>.mlp.gate.weight`
//   - Mixtral: `<layer>.block_sparse_moe.gate.weight`
//   - transformers 5.x (its module tree, fused experts): `<layer>.mlp.gate.weight` for Mixtral,
//     Qwen3-MoE and DeepSeek-V3 alike (their *TopKRouter modules are the block's `gate`)
//   - gpt-oss: `<layer>.mlp.router.weight` beside `.router.bias` [E]: a linear with a bias, which a
//     router_gemm layer adds with router_bias (gate_bias, docs/LAYER_MATH.md "Router GEMM").
// That is `<prefix>.gate.weight` for every layer but gpt-oss's, whatever its experts' naming, and the
// bias, where a router has one, `.bias` beside the weight.
#pragma once

#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/expert_tensors.h"
#include "compiler/moe_config.h"

namespace moejit::checkpoint {

// The router weight's name for the layer (its naming says gpt-oss or not).
std::string router_weight_name(const MoeLayerTensors& layer);
// The router bias's name: `.bias` beside the weight (gpt-oss's `<layer>.mlp.router.bias`).
std::string router_bias_name(const MoeLayerTensors& layer);

// Why the layer's router cannot run as the layer's router GEMM, or empty: with router_gemm true and
// router_bias false, a gpt-oss layer, or any layer whose router has a bias beside its weight, is
// refused (the layer would compute hidden @ gate_weight^T and drop the bias). Empty when router_gemm
// is false (the caller's logits carry the bias) or router_bias is true (a missing bias is then a
// missing tensor: expected_gate_bias).
std::string router_gemm_refusal(const Checkpoint& checkpoint, const MoeConfig& config, const MoeLayerTensors& layer);

// The router weight as the config needs it (router_gemm): [E, H] in BF16, F16 or F32, whichever the
// checkpoint holds (it is converted to the model dtype).
ExpectedTensor expected_gate_weight(const MoeConfig& config, const MoeLayerTensors& layer);
// The router bias as the config needs it (router_bias): [E] in BF16, F16 or F32 (converted to the
// model dtype).
ExpectedTensor expected_gate_bias(const MoeConfig& config, const MoeLayerTensors& layer);

// The router's gate weight [E, H] in the model dtype (config.dtype; for fp8 layers too, whose
// router is not quantized), converted from the checkpoint's BF16, F16 or F32 with one rounding to
// nearest even (checkpoint/float_convert.h). All E rows on every rank: routing is global, so
// neither ep_rank nor tp_rank slices it. Throws InvalidInput naming the checkpoint, the layer, the
// tensor and its file when it is missing, has the wrong dtype or shape, or is refused
// (router_gemm_refusal).
HostTensor load_gate_weight(const Checkpoint& checkpoint, const MoeConfig& config, const MoeLayerTensors& layer);

// The router's bias [E] in the model dtype, converted as load_gate_weight converts the weight, whole
// on every rank. Throws InvalidInput as load_gate_weight does (router_bias false: nothing to load).
HostTensor load_gate_bias(const Checkpoint& checkpoint, const MoeConfig& config, const MoeLayerTensors& layer);

}  // namespace moejit::checkpoint
