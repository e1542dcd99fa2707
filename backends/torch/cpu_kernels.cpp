#include "backends/torch/cpu_kernels.h"

#include "backends/torch/dtype.h"
#include "common/cpu_routing.h"

namespace moejit::torch_ops {
namespace {

// SPEC.md w8a8 row quantization in fp32: returns (q as float values, scale [rows, 1]).
std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x) {
  at::Tensor scale = x.abs().amax(1, /*keepdim=*/true) / 127.0f;
  at::Tensor q = at::where(scale > 0, at::round(x / scale), at::zeros_like(x)).clamp(-127, 127);
  return {q, scale};
}

at::Tensor activate(const MoeConfig& c, const at::Tensor& x) {
  switch (c.activation) {
    case Activation::Silu: return at::silu(x);
    case Activation::Gelu: return at::gelu(x, "none");
    case Activation::GeluTanh: return at::gelu(x, "tanh");
  }
  return x;
}

// x [n, K] times the expert's weight as [N, K] (nk) or [K, N] (kn): [n, N].
at::Tensor times_weight(const at::Tensor& x, const at::Tensor& w, WeightLayout layout) {
  return layout == WeightLayout::NK ? at::matmul(x, w.t()) : at::matmul(x, w);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> route_cpu(const at::Tensor& router_logits, const std::optional<at::Tensor>& bias,
                                             const std::string& config) {
  const MoeConfig& c = parse_config(config);
  check_routing_tensors(c, router_logits, bias);
  const int64_t tokens = router_logits.size(0);
  at::Tensor logits = router_logits.to(at::kFloat).contiguous();
  at::Tensor weights = at::empty({tokens, c.topk}, logits.options());
  at::Tensor ids = at::empty({tokens, c.topk}, logits.options().dtype(at::kInt));
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  // The one CPU routing (common/cpu_routing.h) in fp32, as the GPU kernel computes it.
  cpu_route_tokens<float>(routing_rule(c), tokens, logits.data_ptr<float>(), b, weights.data_ptr<float>(),
                          ids.data_ptr<int>());
  return {weights, ids};
}

at::Tensor experts_cpu(const at::Tensor& hidden, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                       const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& w13_scale,
                       const std::optional<at::Tensor>& w2_scale, const std::optional<at::Tensor>& input_smooth,
                       const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                       const std::string& config) {
  const MoeConfig& c = parse_config(config);
  check_expert_tensors(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual);
  const int64_t tokens = hidden.size(0), K = c.topk, H = c.hidden, I = c.local_intermediate();
  TORCH_CHECK_VALUE(topk_ids.is_contiguous() && topk_weights.is_contiguous(),
                    "moejit: topk_ids and topk_weights must be contiguous (call .contiguous())");
  TORCH_CHECK_VALUE(topk_ids.sizes() == at::IntArrayRef({tokens, K}) && topk_ids.scalar_type() == at::kInt,
                    "moejit: topk_ids must be int32 [", tokens, ", ", K, "], got ", topk_ids.scalar_type(), " ",
                    topk_ids.sizes());
  TORCH_CHECK_VALUE(topk_weights.sizes() == at::IntArrayRef({tokens, K}) && topk_weights.scalar_type() == at::kFloat,
                    "moejit: topk_weights must be float32 [", tokens, ", ", K, "], got ", topk_weights.scalar_type(),
                    " ", topk_weights.sizes());
  const at::ScalarType dtype = scalar_type(c.dtype);
  const bool w8a8 = c.quant == Quant::W8A8Int8;
  at::Tensor x = hidden.to(at::kFloat);
  at::Tensor flat_ids = topk_ids.reshape({-1}).to(at::kLong);
  // Y of every (token, slot) pair, zero for pairs another rank computes.
  at::Tensor y = at::zeros({tokens * K, H}, x.options());
  const int64_t first = c.first_local_expert();
  for (int64_t e = 0; e < c.local_experts(); ++e) {
    at::Tensor pairs = (flat_ids == first + e).nonzero().reshape({-1});  // ascending: the stable order
    if (pairs.numel() == 0) continue;
    at::Tensor a = x.index_select(0, at::floor_divide(pairs, K));
    at::Tensor g1, act, ye;
    if (w8a8) {
      auto [q, scale] = quantize_rows(a * (*input_smooth)[first + e]);
      g1 = times_weight(q.to(at::kDouble), w13[e].to(at::kDouble), c.weight_layout).to(at::kFloat) * scale *
           (*w13_scale)[e];
    } else {
      g1 = times_weight(a, w13[e].to(at::kFloat), c.weight_layout);
    }
    act = c.gated ? activate(c, g1.narrow(1, 0, I)) * g1.narrow(1, I, I) : activate(c, g1);
    if (w8a8) {
      auto [q, scale] = quantize_rows(act * (*act_smooth)[e]);
      ye = times_weight(q.to(at::kDouble), w2[e].to(at::kDouble), c.weight_layout).to(at::kFloat) * scale *
           (*w2_scale)[e];
    } else {
      // The GPU stores the activation in the model dtype between the GEMMs.
      ye = times_weight(act.to(dtype).to(at::kFloat), w2[e].to(at::kFloat), c.weight_layout);
    }
    y.index_copy_(0, pairs, ye.to(dtype).to(at::kFloat));
  }
  // Weighted sum over slots in order j = 0..K-1, in fp32, rounded once.
  at::Tensor yk = y.view({tokens, K, H});
  at::Tensor w = topk_weights.to(at::kFloat);
  at::Tensor out = at::zeros({tokens, H}, x.options());
  for (int64_t j = 0; j < K; ++j) out += w.select(1, j).unsqueeze(1) * yk.select(1, j);
  if (residual.has_value()) out += residual->to(at::kFloat);
  return out.to(dtype);
}

at::Tensor moe_layer_cpu(const at::Tensor& hidden, const at::Tensor& router_logits, const at::Tensor& w13,
                         const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                         const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                         const std::optional<at::Tensor>& residual, const std::string& config) {
  const MoeConfig& c = parse_config(config);
  check_expert_tensors(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual);
  TORCH_CHECK_VALUE(router_logits.dim() == 2 && router_logits.size(0) == hidden.size(0), "moejit: router_logits has ",
                    router_logits.sizes(), " but hidden has ", hidden.size(0), " rows");
  auto [weights, ids] = route_cpu(router_logits, bias, config);
  return experts_cpu(hidden, ids, weights, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, config);
}

}  // namespace moejit::torch_ops
