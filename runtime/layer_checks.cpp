#include "runtime/layer_checks.h"

#include <utility>

#include <fmt/format.h>

#include "common/error.h"

namespace moejit {
namespace {

bool aligned(const void* p, size_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

}  // namespace

void check_pointer(const void* p, const char* name, size_t alignment) {
  if (!p) throw InvalidInput(fmt::format("{}: null pointer; this layer needs it", name));
  if (!aligned(p, alignment)) throw InvalidInput(fmt::format("{}: pointer {} is not {}-byte aligned", name, p, alignment));
}

void check_call_device(int layer_device, int stream_device) {
  if (stream_device != layer_device)
    throw InvalidInput(fmt::format(
        "stream: its context is on device {}, and this layer was created for device {}; create a layer per device "
        "(LayerOptions::device)",
        stream_device, layer_device));
}

void check_tokens(const LayerSpec& c, int64_t tokens) { check_token_count(c, tokens, "tokens"); }

// With no tokens nothing per token is read or written, so those pointers may be null (an empty
// torch tensor's data pointer is); the weights and scales are checked whatever the count.
void check_routing_arguments(const LayerSpec& c, int64_t tokens, const void* logits, const float* bias) {
  check_routable(c);
  check_tokens(c, tokens);
  if (tokens > 0) check_pointer(logits, "router_logits", static_cast<size_t>(dtype_bytes(c.router_dtype)));
  if (c.topk_method == TopkMethod::NoauxTc) check_pointer(bias, "e_score_correction_bias", 4);
}

void check_forward_routing_arguments(const LayerSpec& c, int64_t tokens, const LayerInputs& in) {
  if (in.hidden_scale)
    throw InvalidInput("hidden_scale: forward() quantizes hidden itself; quantized hidden rows are for experts()");
  if (!c.router_gemm) {
    if (in.gate_weight)
      throw InvalidInput(
          "gate_weight: given, but this layer takes the caller's router_logits (router_gemm false); pass router_logits, "
          "or create the layer with router_gemm true");
    if (in.gate_bias)
      throw InvalidInput(
          "gate_bias: given, but this layer takes the caller's router_logits (router_gemm false), which hold the "
          "router's bias already; pass no gate_bias, or create the layer with router_gemm and router_bias true");
    check_routing_arguments(c, tokens, in.router_logits, in.e_score_correction_bias);
    return;
  }
  if (in.router_logits)
    throw InvalidInput(
        "router_logits: given, but this layer computes its router logits from gate_weight (router_gemm true); pass "
        "gate_weight [E, H] and no router_logits");
  check_routable(c);
  check_tokens(c, tokens);
  check_pointer(in.gate_weight, "gate_weight", 16);
  // A bias the layer would not add is a different router than the caller means (and one it needs,
  // missing, would silently route from hidden @ gate_weight^T alone).
  if (c.router_bias)
    check_pointer(in.gate_bias, "gate_bias", static_cast<size_t>(dtype_bytes(c.dtype)));
  else if (in.gate_bias)
    throw InvalidInput(
        "gate_bias: given, but this layer's router has no bias (router_bias false); pass no gate_bias, or create the "
        "layer with router_bias true");
  if (c.topk_method == TopkMethod::NoauxTc) check_pointer(in.e_score_correction_bias, "e_score_correction_bias", 4);
}

WorkspaceOffsets check_expert_arguments(const LayerSpec& c, int64_t tokens, const LayerInputs& in,
                                        const void* output, const void* workspace, size_t workspace_size) {
  check_tokens(c, tokens);
  check_pointer(in.w13, "w13", 16);
  check_pointer(in.w2, "w2", 16);
  if (is_quantized(c.quant)) {
    check_pointer(in.w13_scale, "w13_scale", 4);
    check_pointer(in.w2_scale, "w2_scale", 4);
  }
  if (c.quant == Quant::W8A8Int8) {
    check_pointer(in.input_smooth, "input_smooth", 4);
    check_pointer(in.act_smooth, "act_smooth", 4);
  }
  if (c.expert_bias) {
    check_pointer(in.w13_bias, "w13_bias", 4);
    check_pointer(in.w2_bias, "w2_bias", 4);
  } else {
    // A bias this layer would not add is a different layer than the caller means.
    for (auto [bias, name] : {std::pair{in.w13_bias, "w13_bias"}, std::pair{in.w2_bias, "w2_bias"}})
      if (bias) throw InvalidInput(fmt::format("{}: given, but this layer has no expert biases (expert_bias false)", name));
  }
  if (in.hidden_scale && !is_fp8(c.quant))
    throw InvalidInput(fmt::format("hidden_scale: given, but only fp8 layers take quantized hidden rows (this layer's "
                                   "quant is {}); pass hidden in the model dtype and no hidden_scale",
                                   to_string(c.quant)));
  if (tokens == 0) return {};
  check_pointer(in.hidden, "hidden", 16);
  if (in.hidden_scale) check_pointer(in.hidden_scale, "hidden_scale", 4);
  check_pointer(output, "output", 16);
  if (in.residual && !aligned(in.residual, 16))
    throw InvalidInput(fmt::format("residual: pointer {} is not 16-byte aligned", in.residual));
  const WorkspaceOffsets offsets = workspace_offsets(c, tokens);
  check_pointer(workspace, "workspace", 256);
  if (static_cast<int64_t>(workspace_size) < offsets.total_bytes)
    throw InvalidInput(fmt::format("workspace: {} bytes is too small; {} tokens need {} bytes (workspace_bytes())",
                                   workspace_size, tokens, offsets.total_bytes));
  return offsets;
}

}  // namespace moejit
