// The torch ops' argument checks (moejit_ops.cpp's CUDA and Meta kernels, cpu_kernels.cpp): every
// shape, dtype and device a layer call takes, raised as ValueError naming the tensor; and the
// conversions of what callers have into the dtypes the layer takes.
#include "backends/torch/op_checks.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "backends/torch/dtype.h"
#include "compiler/moe_config.h"

namespace moejit::torch_ops {
namespace {

void expect(const at::Tensor& t, const char* name, at::ScalarType dtype, std::vector<int64_t> shape) {
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, "moejit: ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(shape), "moejit: ", name, " must have shape ", at::IntArrayRef(shape),
                    ", got ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), "moejit: ", name, " must be contiguous (call .contiguous())");
}

void expect_optional(const std::optional<at::Tensor>& t, const char* name, at::ScalarType dtype,
                     std::vector<int64_t> shape, bool required, const char* why) {
  if (!t.has_value()) {
    TORCH_CHECK_VALUE(!required, "moejit: ", name, " is required ", why);
    return;
  }
  expect(*t, name, dtype, std::move(shape));
}

// Shapes of SPEC.md for the expert weights in the config's layout.
std::vector<int64_t> w13_shape(const MoeConfig& c) {
  return c.weight_layout == WeightLayout::NK ? std::vector<int64_t>{c.gemm_experts(), c.gemm1_rows(), c.hidden}
                                             : std::vector<int64_t>{c.gemm_experts(), c.hidden, c.gemm1_rows()};
}
std::vector<int64_t> w2_shape(const MoeConfig& c) {
  return c.weight_layout == WeightLayout::NK
             ? std::vector<int64_t>{c.gemm_experts(), c.hidden, c.local_intermediate()}
             : std::vector<int64_t>{c.gemm_experts(), c.local_intermediate(), c.hidden};
}

// The stored weights' dtype (SPEC.md "Quantized experts"): int8 for w8a8_int8, float8_e4m3fn for
// fp8_block and fp8_tensor, the model dtype otherwise.
at::ScalarType weight_scalar_type(const MoeConfig& c) {
  if (c.quant == Quant::W8A8Int8) return at::kChar;
  if (is_fp8(c.quant)) return at::kFloat8_e4m3fn;
  return scalar_type(c.dtype);
}

}  // namespace

// The weights and the quantization tensors (static shapes, so the Meta kernels check them too).
void check_weights_and_scales(const MoeConfig& c, const at::Tensor& w13, const at::Tensor& w2,
                              const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                              const std::optional<at::Tensor>& input_smooth,
                              const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& w13_bias,
                              const std::optional<at::Tensor>& w2_bias) {
  expect(w13, "w13", weight_scalar_type(c), w13_shape(c));
  expect(w2, "w2", weight_scalar_type(c), w2_shape(c));
  // Expert biases (gpt-oss): fp32, bf16 or fp16 (converted to fp32 on the device), required exactly
  // when the config has expert_bias; a bias the layer would not add is refused.
  auto check_bias = [&](const std::optional<at::Tensor>& t, const char* name, std::vector<int64_t> shape) {
    if (!c.expert_bias) {
      TORCH_CHECK_VALUE(!t.has_value(), "moejit: ", name,
                        " is given, but this layer has no expert biases (config expert_bias false); pass None");
      return;
    }
    TORCH_CHECK_VALUE(t.has_value(), "moejit: ", name, " is required: the layer has expert biases (expert_bias true)");
    const at::ScalarType type = t->scalar_type();
    TORCH_CHECK_VALUE(type == at::kFloat || type == at::kBFloat16 || type == at::kHalf, "moejit: ", name,
                      " must be float32, bfloat16 or float16, got ", type);
    expect_optional(t, name, type, shape, true, "for expert_bias");
  };
  check_bias(w13_bias, "w13_bias", {c.gemm_experts(), c.gemm1_rows()});
  check_bias(w2_bias, "w2_bias", {c.gemm_experts(), c.hidden});
  if (c.quant == Quant::None) {
    // Unquantized layers ignore these. One given anyway (MoELayer keeps what its caller passes) is
    // checked against the w8a8_int8 shapes, as it was before fp8 existed.
    expect_optional(w13_scale, "w13_scale", at::kFloat, {c.gemm_experts(), c.gemm1_rows()}, false, "");
    expect_optional(w2_scale, "w2_scale", at::kFloat, {c.gemm_experts(), c.hidden}, false, "");
    expect_optional(input_smooth, "input_smooth", at::kFloat, {c.experts + c.shared_slots(), c.hidden}, false, "");
    expect_optional(act_smooth, "act_smooth", at::kFloat, {c.gemm_experts(), c.local_intermediate()}, false, "");
    return;
  }
  // SPEC.md "Quantized experts": the tensors the quantization takes, fp32, in the shapes
  // quant_tensor_shapes gives; an empty shape is a tensor this quantization has no use for.
  const QuantTensorShapes shapes = quant_tensor_shapes(c.spec());
  const std::string why = fmt::format("for quant {}", to_string(c.quant));
  auto check = [&](const std::optional<at::Tensor>& t, const char* name, const std::vector<int64_t>& shape) {
    if (shape.empty()) {
      TORCH_CHECK_VALUE(!t.has_value(), "moejit: ", name, " must not be given ", why,
                        ": it quantizes the activations without smoothing (only quant w8a8_int8 takes ", name,
                        "); pass None");
      return;
    }
    expect_optional(t, name, at::kFloat, shape, true, why.c_str());
  };
  check(w13_scale, "w13_scale", shapes.w13_scale);
  check(w2_scale, "w2_scale", shapes.w2_scale);
  check(input_smooth, "input_smooth", shapes.input_smooth);
  check(act_smooth, "act_smooth", shapes.act_smooth);
}


void check_expert_tensors(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& w13, const at::Tensor& w2,
                          const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                          const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                          const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& w13_bias,
                          const std::optional<at::Tensor>& w2_bias, const std::optional<at::Tensor>& hidden_scale) {
  TORCH_CHECK_VALUE(hidden.dim() == 2, "moejit: hidden must be [tokens, ", c.hidden, "], got ", hidden.sizes());
  const int64_t tokens = hidden.size(0);
  if (hidden_scale.has_value()) {
    TORCH_CHECK_VALUE(is_fp8(c.quant), "moejit: hidden_scale is given, but only fp8 layers take quantized hidden "
                      "rows (this config's quant is ", to_string(c.quant), "); pass hidden in ", scalar_type(c.dtype),
                      " and no hidden_scale");
    expect(hidden, "hidden (quantized rows, with hidden_scale)", at::kFloat8_e4m3fn, {tokens, c.hidden});
    expect(*hidden_scale, "hidden_scale", at::kFloat, {tokens, activation_scale_groups(c, c.hidden)});
    TORCH_CHECK_VALUE(hidden_scale->device() == hidden.device(), "moejit: hidden_scale is on ", hidden_scale->device(),
                      "; it must be on ", hidden.device(), " (hidden's device)");
  } else {
    expect(hidden, "hidden", scalar_type(c.dtype), {tokens, c.hidden});
  }
  check_weights_and_scales(c, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, w13_bias, w2_bias);
  expect_optional(residual, "residual", scalar_type(c.dtype), {tokens, c.hidden}, false, "");
  for (const auto* t : {&w13, &w2})
    TORCH_CHECK_VALUE(t->device() == hidden.device(), "moejit: every tensor must be on ", hidden.device());
  const std::pair<const char*, const std::optional<at::Tensor>*> optional_tensors[] = {
      {"w13_scale", &w13_scale}, {"w2_scale", &w2_scale}, {"input_smooth", &input_smooth},
      {"act_smooth", &act_smooth}, {"residual", &residual}, {"w13_bias", &w13_bias}, {"w2_bias", &w2_bias}};
  for (const auto& [name, t] : optional_tensors)
    TORCH_CHECK_VALUE(!t->has_value() || (*t)->device() == hidden.device(), "moejit: ", name, " is on ",
                      t->has_value() ? (*t)->device() : hidden.device(), "; every tensor must be on ",
                      hidden.device(), " (hidden's device)");
}

void check_quantize_hidden(const MoeConfig& c, const at::Tensor& hidden) {
  TORCH_CHECK_VALUE(is_fp8(c.quant), "moejit: quantize_hidden is an fp8 layer's stage 3; this config's quant is ",
                    to_string(c.quant));
  TORCH_CHECK_VALUE(hidden.dim() == 2, "moejit: hidden must be [tokens, ", c.hidden, "], got ", hidden.sizes());
  expect(hidden, "hidden", scalar_type(c.dtype), {hidden.size(0), c.hidden});
}

void check_routable_config(const MoeConfig& c) {
  const std::vector<std::string> unroutable = routing_errors(c);
  TORCH_CHECK_VALUE(unroutable.empty(), "moejit: ", unroutable.empty() ? "" : unroutable.front());
}

void check_routing_tensors(const MoeConfig& c, const at::Tensor& logits, const std::optional<at::Tensor>& bias) {
  check_routable_config(c);
  TORCH_CHECK_VALUE(logits.dim() == 2, "moejit: router_logits must be [tokens, ", c.experts, "], got ", logits.sizes());
  expect(logits, "router_logits", scalar_type(c.router_dtype), {logits.size(0), c.experts});
  check_correction_bias(c, bias, logits.device(), "router_logits' device");
}

void check_correction_bias(const MoeConfig& c, const std::optional<at::Tensor>& bias, const at::Device& device,
                           const char* whose) {
  const bool floating = !bias.has_value() || bias->scalar_type() == at::kFloat ||
                        bias->scalar_type() == at::kBFloat16 || bias->scalar_type() == at::kHalf;
  TORCH_CHECK_VALUE(floating, "moejit: e_score_correction_bias must be float32, bfloat16 or float16, got ",
                    bias->scalar_type());
  expect_optional(bias, "e_score_correction_bias", bias.has_value() ? bias->scalar_type() : at::kFloat, {c.experts},
                  c.topk_method == TopkMethod::NoauxTc, "for topk_method noaux_tc");
  TORCH_CHECK_VALUE(!bias.has_value() || bias->device() == device, "moejit: e_score_correction_bias is on ",
                    bias.has_value() ? bias->device() : device, "; it must be on ", device, " (", whose, ")");
}

// moe_layer takes logits and moe_layer_gate a gate weight, as the config's router_gemm says.
void check_router_input(const MoeConfig& c, bool gate_given) {
  TORCH_CHECK_VALUE(c.router_gemm == gate_given, "moejit: ",
                    c.router_gemm ? "this config has router_gemm true: the layer computes its router logits; call "
                                    "moejit::moe_layer_gate with the gate weight"
                                  : "this config has router_gemm false: the layer takes router_logits; call "
                                    "moejit::moe_layer, or set router_gemm true in the config");
}

void check_gate_weight(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& gate) {
  check_router_input(c, true);
  check_routable_config(c);
  TORCH_CHECK_VALUE(gate.dim() == 2, "moejit: gate_weight must be [", c.experts, ", ", c.hidden, "], got ", gate.sizes());
  expect(gate, "gate_weight", scalar_type(c.dtype), {c.experts, c.hidden});
  TORCH_CHECK_VALUE(gate.device() == hidden.device(), "moejit: gate_weight is on ", gate.device(), "; it must be on ",
                    hidden.device(), " (hidden's device)");
}

void check_gate_bias_meta(const MoeConfig& c, const std::optional<at::Tensor>& bias) {
  if (!c.router_bias) {
    TORCH_CHECK_VALUE(!bias.has_value(), "moejit: gate_bias is given, but this config has router_bias false (its "
                      "router has no bias); pass None, or set router_bias true in the config");
    return;
  }
  TORCH_CHECK_VALUE(bias.has_value(), "moejit: gate_bias is required: this config has router_bias true (the router's "
                    "bias [", c.experts, "], added to the logits the layer computes)");
  TORCH_CHECK_VALUE(bias->dim() == 1 && bias->sym_size(0) == c.experts && bias->scalar_type() == scalar_type(c.dtype),
                    "moejit: gate_bias must be [", c.experts, "] ", scalar_type(c.dtype), " (the model dtype, as "
                    "gate_weight), got ", bias->sym_sizes(), " ", bias->scalar_type());
}

void check_gate_bias(const MoeConfig& c, const at::Tensor& hidden, const std::optional<at::Tensor>& bias) {
  check_gate_bias_meta(c, bias);
  if (!bias.has_value()) return;
  expect(*bias, "gate_bias", scalar_type(c.dtype), {c.experts});
  TORCH_CHECK_VALUE(bias->device() == hidden.device(), "moejit: gate_bias is on ", bias->device(), "; it must be on ",
                    hidden.device(), " (hidden's device)");
}

// What callers have, in the dtypes the layer takes. Each conversion is an ATen kernel on the
// tensor's device and the current stream: asynchronous, no host sync, capturable in a CUDA graph.
std::optional<at::Tensor> layer_float32(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || t->scalar_type() == at::kFloat) return t;
  return t->to(at::kFloat);
}

at::Tensor layer_topk_ids(const MoeConfig& c, const at::Tensor& ids, int64_t tokens) {
  TORCH_CHECK_VALUE(ids.scalar_type() == at::kInt || ids.scalar_type() == at::kLong,
                    "moejit: topk_ids must be int32 or int64 (torch.topk's), got ", ids.scalar_type());
  expect(ids, "topk_ids", ids.scalar_type(), {tokens, c.topk});
  if (ids.scalar_type() == at::kInt) return ids;
  // An id outside [0, E) selects no expert of any rank (SPEC.md, expert parallel) as int32 or int64;
  // clamping to [-1, E] before narrowing keeps a huge one from wrapping onto a valid id.
  return ids.clamp(-1, c.experts).to(at::kInt);
}

at::Tensor layer_topk_weights(const MoeConfig& c, const at::Tensor& weights, int64_t tokens) {
  const at::ScalarType t = weights.scalar_type();
  TORCH_CHECK_VALUE(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf,
                    "moejit: topk_weights must be float32, bfloat16 or float16, got ", t);
  expect(weights, "topk_weights", t, {tokens, c.topk});
  return t == at::kFloat ? weights : weights.to(at::kFloat);
}

}  // namespace moejit::torch_ops
