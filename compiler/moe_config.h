// MoeConfig: everything about one MoE layer that the generated code is specialized on,
// plus the parallel layout. SPEC.md defines the meaning of every field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moejit {

enum class Scoring { Softmax, Sigmoid };
enum class TopkMethod { Greedy, GroupLimitedGreedy, NoauxTc };
// SwigluOai: gpt-oss's clamped SwiGLU, gated only: g = min(gate, limit), u = clamp(up, -limit, limit),
// act = (u + 1) * g * sigmoid(1.702 g), limit = swiglu_limit.
enum class Activation { Silu, Gelu, GeluTanh, SwigluOai };
enum class DType { BF16, FP16, FP32 };
// How the expert weights are quantized (SPEC.md "Quantized experts"):
//   W8A8Int8   int8 weights with per-channel scales, smoothed activations quantized per row
//   Fp8Block   float8_e4m3fn weights with a scale per 128 x 128 block (DeepSeek-V3's checkpoints),
//              activations quantized per row and 128-column group
//   Fp8Tensor  float8_e4m3fn weights with one scale per expert matrix, activations per row
enum class Quant { None, W8A8Int8, Fp8Block, Fp8Tensor };
// How w13/w2 are stored. NK: [E, N, K] with K (the reduction dim) contiguous, as Hugging Face
// and vLLM store them (w13 [E, 2I, H]); KN: [E, K, N], the transpose.
enum class WeightLayout { NK, KN };

std::string_view to_string(Scoring v);
std::string_view to_string(TopkMethod v);
std::string_view to_string(Activation v);
std::string_view to_string(DType v);
std::string_view to_string(Quant v);
std::string_view to_string(WeightLayout v);
int dtype_bytes(DType v);

inline bool is_fp8(Quant q) { return q == Quant::Fp8Block || q == Quant::Fp8Tensor; }
// Whether the expert weights are 8-bit (int8 or e4m3) and the activations quantized on the fly.
inline bool is_quantized(Quant q) { return q != Quant::None; }

// The edge of fp8 block scaling: a scale covers 128 weight rows x 128 columns and an activation
// scale 128 columns of one row.
constexpr int64_t kFp8BlockSize = 128;

// Everything the generated code is specialized on: every field reaches codegen and the cache keys,
// so every rank of a parallel group shares one plan, one source and one binary.
struct LayerSpec {
  int experts = 8;               // routed experts, global (E)
  int topk = 2;                  // K
  int num_expert_group = 1;      // G
  int topk_group = 1;            // groups kept per token
  Scoring scoring = Scoring::Softmax;
  TopkMethod topk_method = TopkMethod::Greedy;
  bool renormalize = true;       // norm_topk_prob
  double routed_scaling_factor = 1.0;
  int64_t hidden = 4096;         // H
  int64_t moe_intermediate = 14336;  // the model's moe_intermediate_size, before the TP split
  Activation activation = Activation::Silu;
  bool gated = true;
  double swiglu_limit = 7.0;     // swigluoai's clamp (gpt-oss's swiglu_limit); no other activation reads it
  bool expert_bias = false;      // w13_bias [E_loc, N1] added before the activation, w2_bias [E_loc, H]
                                 // to each expert's output before the combine (gpt-oss)
  DType dtype = DType::BF16;     // hidden, weights (unquantized), output
  DType router_dtype = DType::BF16;  // router logits: dtype or fp32
  bool router_gemm = false;      // the layer computes the router logits itself from gate_weight [E, H]
                                 // (dtype): logits = hidden @ gate_weight^T, fp32 accumulation,
                                 // rounded to router_dtype (docs/LAYER_MATH.md "Router GEMM"); else the
                                 // caller passes router_logits
  bool router_bias = false;      // router_gemm layers whose router is a linear with a bias (gpt-oss):
                                 // logits = hidden @ gate_weight^T + gate_bias, gate_bias [E] (dtype) added
                                 // to the fp32 sum before its one rounding
  Quant quant = Quant::None;
  int ep_size = 1;
  int tp_size = 1;
  int n_shared_experts = 0;      // the model's shared experts: the caller adds them through
                                 // `residual`, or, with fuse_shared_experts, the layer computes them
  bool fuse_shared_experts = false;  // the layer computes the shared experts in its grouped GEMMs
                                 // (docs/LAYER_MATH.md "Shared experts"): n_shared_experts more slots per
                                 // token (weight 1), their weights after the routed experts' in
                                 // w13/w2; computed on expert-parallel rank 0
  WeightLayout weight_layout = WeightLayout::NK;

  int local_experts() const { return experts / ep_size; }                 // E_loc
  // S: the shared-expert slots a token has in this layer's pairs (0 unless fused).
  int shared_slots() const { return fuse_shared_experts ? n_shared_experts : 0; }
  // K' = K + S: the pairs of one token, f = t * K' + j; slots j >= K are the shared experts.
  int pair_slots() const { return topk + shared_slots(); }
  // E_loc + S: the experts the grouped GEMMs see (the leading dim of w13, w2 and their per-expert
  // tensors): local experts 0..E_loc-1 routed, E_loc..E_loc+S-1 shared.
  int gemm_experts() const { return local_experts() + shared_slots(); }
  int64_t local_intermediate() const { return moe_intermediate / tp_size; }  // I of this rank
  int64_t gemm1_rows() const { return gated ? 2 * local_intermediate() : local_intermediate(); }

  bool operator==(const LayerSpec&) const = default;
};

// The scale and smoothing tensors of a quantized layer (SPEC.md "Quantized experts"), fp32, as
// shapes (N1 = gemm1_rows(); E_loc and E here count the fused shared experts too: E_loc + S, E + S);
// an empty shape: the layer takes no such tensor.
//   w8a8_int8   w13_scale [E_loc, N1], w2_scale [E_loc, H] (per output channel),
//               input_smooth [E, H], act_smooth [E_loc, I]
//   fp8_block   w13_scale [E_loc, ceil(N1/128), ceil(H/128)], w2_scale [E_loc, ceil(H/128), ceil(I/128)]
//   fp8_tensor  w13_scale [E_loc], w2_scale [E_loc]
struct QuantTensorShapes {
  std::vector<int64_t> w13_scale, w2_scale, input_smooth, act_smooth;
};
QuantTensorShapes quant_tensor_shapes(const LayerSpec& spec);

// gpt-oss's alpha of swigluoai: g * sigmoid(kSwigluOaiAlpha * g).
constexpr double kSwigluOaiAlpha = 1.702;

// The activation scales of one row of a `cols`-column GEMM operand: one per 128-column group for
// fp8_block, one per row otherwise (int8, fp8_tensor).
inline int64_t activation_scale_groups(const LayerSpec& spec, int64_t cols) {
  return spec.quant == Quant::Fp8Block ? (cols + kFp8BlockSize - 1) / kFp8BlockSize : 1;
}

// Where this process's share of the layer sits in its parallel groups. Run-time arguments only:
// nothing here reaches codegen or a cache key.
struct Placement {
  int ep_rank = 0;
  int tp_rank = 0;

  bool operator==(const Placement&) const = default;
};

// s = ep_rank * E_loc: the first of the rank's local experts.
inline int first_local_expert(const LayerSpec& spec, const Placement& placement) {
  return placement.ep_rank * spec.local_experts();
}

// One layer as a user names it (presets, config.json, the C++/C/Python APIs): the compile-time
// spec and this rank's placement. The planner and codegen see only the spec.
struct MoeConfig : LayerSpec, Placement {
  int first_local_expert() const { return moejit::first_local_expert(*this, *this); }

  const LayerSpec& spec() const { return *this; }
  const Placement& placement() const { return *this; }

  bool operator==(const MoeConfig&) const = default;
};

// The config of `spec` at `placement` (rank 0 of every group by default).
inline MoeConfig at_placement(const LayerSpec& spec, const Placement& placement = {}) {
  MoeConfig c;
  static_cast<LayerSpec&>(c) = spec;
  static_cast<Placement&>(c) = placement;
  return c;
}

// Throws InvalidInput naming the field, the value and the rule for the first violated rule.
void validate(const MoeConfig& config);
// The same rules for the spec alone (its placement is rank 0 of every group, always valid).
void validate(const LayerSpec& spec);

// Every rule violation, in a fixed order; empty when the config is valid.
std::vector<std::string> validation_errors(const MoeConfig& config);

// What a valid config lacks for routing (route, forward): topk distinct experts to pick, within
// the kept groups. Empty when it routes; a config that does not still serves experts-only calls.
std::vector<std::string> routing_errors(const LayerSpec& spec);
// Throws InvalidInput with the first of routing_errors.
void check_routable(const LayerSpec& spec);

// Sets one field from text, as the CLI overrides and the moejit JSON format spell it
// (e.g. "experts", "64"; "scoring", "sigmoid"). Throws InvalidInput for an unknown field or a
// value that does not parse, naming the allowed values.
void set_field(MoeConfig& config, std::string_view field, std::string_view value);

// The names set_field accepts, in declaration order.
const std::vector<std::string>& field_names();

// Presets from SPEC.md (the models' published config.json values).
const std::vector<std::string>& preset_names();
// Throws InvalidInput listing the preset names when `name` is unknown.
MoeConfig preset(std::string_view name);

// The moejit JSON format: one object whose keys are field_names(); absent keys keep defaults.
nlohmann::json to_json(const MoeConfig& config);
MoeConfig config_from_json(const nlohmann::json& j);

// One line per field, "name = value", in field_names() order.
std::string describe(const MoeConfig& config);
// The same without the placement's fields (ep_rank, tp_rank): the generated sources' headers.
std::string describe(const LayerSpec& spec);

}  // namespace moejit
