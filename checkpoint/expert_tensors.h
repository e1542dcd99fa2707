// The MoE layers of a checkpoint and their expert tensors, under the names the model families
// use, and the packing of one layer's experts into what a moejit layer call takes for one rank
// (SPEC.md "Inputs of one layer call", "Quantized experts"):
//   - Qwen2/3-MoE, DeepSeek-V2/V3, Kimi-K2, GLM-4.5: `<layer>.mlp.experts.<e>.{gate,up,down}_proj.weight`
//   - Mixtral: `<layer>.block_sparse_moe.experts.<e>.{w1,w3,w2}.weight` (gate, up, down)
//   - transformers 5.x fused: `<layer>.mlp.experts.gate_up_proj` [E, 2I, H], `.down_proj` [E, H, I]
//   - gpt-oss (fused with expert biases, `.gate_up_proj_bias` [E, 2I] beside them): `.gate_up_proj`
//     [E, H, 2I] with gate and up columns interleaved (gate 2i, up 2i + 1), `.down_proj` [E, I, H],
//     `.down_proj_bias` [E, H]; packed into the layer's nk layout (transposed, de-interleaved)
// fp8 scales sit beside each weight as `<weight>_scale_inv` (HF's name; they multiply), DeepSeek's
// correction bias at `<layer>.mlp.gate.e_score_correction_bias`, the router's gate weight (loaded
// for router_gemm) at `<prefix>.gate.weight`, gpt-oss's at `.router.weight` with its bias (loaded
// for router_bias) at `.router.bias` (checkpoint/router_weight.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "compiler/moe_config.h"

namespace moejit::checkpoint {

enum class ExpertNaming { PerExpert, Mixtral, Fused, GptOss };
const char* to_string(ExpertNaming naming);

// One MoE layer found in a checkpoint.
struct MoeLayerTensors {
  int layer = 0;
  std::string prefix;  // "model.layers.3.mlp": the names below start with it
  ExpertNaming naming = ExpertNaming::PerExpert;
  std::vector<int> experts;  // the expert indices that have a tensor (PerExpert, Mixtral), sorted
};

// Every layer with expert tensors, by layer index. Names that look like expert tensors but fit no
// family are not layers (inspect lists what a layer lacks instead).
std::vector<MoeLayerTensors> find_moe_layers(const Checkpoint& checkpoint);

// The weight names of expert e's projection ("gate", "up", "down") in a per-expert layer, or of
// the layer's fused tensor ("gate_up", "down"; e ignored).
std::string weight_name(const MoeLayerTensors& layer, const std::string& projection, int e = 0);
// The weight name of the layer's shared experts' projection ("gate", "up", "down"): DeepSeek's
// `<layer>.mlp.shared_experts.<p>_proj.weight`, one MLP n_shared_experts * moe_intermediate wide.
std::string shared_weight_name(const MoeLayerTensors& layer, const std::string& projection);
// The fp8 scale beside a weight name.
std::string scale_name(const MoeLayerTensors& layer, const std::string& weight);
// The expert bias beside a weight name (gpt-oss).
std::string bias_name(const std::string& weight);
// The routing correction bias of the layer (noaux_tc).
std::string correction_bias_name(const MoeLayerTensors& layer);

// A tensor a layer needs from the checkpoint, with the dtypes and shapes it may have.
struct ExpectedTensor {
  std::string name;
  std::vector<std::string> dtypes;
  std::vector<std::vector<int64_t>> shapes;  // usually one; a per-tensor fp8 scale may be [] or [1]
  std::string meaning;                       // "expert 3's gate projection"
};

// Every tensor the config needs for experts [first, first + count) of the layer (and the layer's
// own: the correction bias for noaux_tc, the router's gate weight for router_gemm and its bias for
// router_bias), in the checkpoint's full shapes.
std::vector<ExpectedTensor> expected_tensors(const MoeConfig& config, const MoeLayerTensors& layer, int first, int count);

// Why the checkpoint's tensor does not meet `expected` ("missing", "is [2, 3] F32; ..."), or empty.
std::string tensor_problem(const Checkpoint& checkpoint, const ExpectedTensor& expected);

// A host buffer with a safetensors dtype and a shape.
struct HostTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
};

// What one layer call takes for the config's rank: w13 [E_loc, 2I_loc (I_loc non-gated), H] (gate
// rows, then up rows), w2 [E_loc, H, I_loc] (with fuse_shared_experts, E_loc + S: slice s of the
// shared experts after the routed experts, on every rank), the local experts from ep_rank * E_loc and the
// intermediate columns from tp_rank * I_loc; fp8 scales in the layer's shapes; the correction bias
// [E] as fp32 for noaux_tc; the expert biases (expert_bias) as fp32 w13_bias [E_loc, 2I_loc] (gate,
// then up) and w2_bias [E_loc, H]; with router_gemm the router's gate_weight [E, H] in the model
// dtype, every expert's row on every rank (routing is global: neither ep_rank nor tp_rank slices it),
// and with router_bias its gate_bias [E] in the model dtype.
struct ExpertWeights {
  HostTensor w13, w2;
  std::optional<HostTensor> w13_scale, w2_scale, correction_bias, w13_bias, w2_bias, gate_weight, gate_bias;

  // The tensors present, under the names the layer's inputs use ("w13", "w2", "w13_scale",
  // "w2_scale", "e_score_correction_bias", "w13_bias", "w2_bias", "gate_weight", "gate_bias"), in
  // that order.
  std::vector<std::pair<const char*, const HostTensor*>> named() const;
};

// Reads and packs one layer. Throws InvalidInput naming the tensor (and its file) that is missing,
// has the wrong dtype or shape, or cannot be represented in the layer's layout (fp8 scale blocks
// that a rank's slice of I would split; per-tensor fp8 with different gate and up scales), and
// refuses router_gemm without router_bias for a router with a bias (gpt-oss's) by name.
// The buffers hold the rank's whole share of the layer: E_loc * 3 * H * I_loc weights (and the
// router's E * H, and E for its bias).
ExpertWeights load_experts(const Checkpoint& checkpoint, const MoeConfig& config, const MoeLayerTensors& layer);

}  // namespace moejit::checkpoint
