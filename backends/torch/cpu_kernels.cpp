#include "backends/torch/cpu_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "backends/torch/dtype.h"
#include "common/cpu_routing.h"
#include "common/fp8.h"

namespace moejit::torch_ops {
namespace {

// SPEC.md w8a8 row quantization in fp32: returns (q as float values, scale [rows, 1]).
std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x) {
  at::Tensor scale = x.abs().amax(1, /*keepdim=*/true) / 127.0f;
  at::Tensor q = at::where(scale > 0, at::round(x / scale), at::zeros_like(x)).clamp(-127, 127);
  return {q, scale};
}

// x (fp32) rounded to the nearest e4m3 value, as fp32, with the device's rounding (common/fp8.h:
// to nearest even, saturating to +-448, NaN to NaN).
at::Tensor round_e4m3(const at::Tensor& x) {
  at::Tensor in = x.contiguous();
  at::Tensor out = at::empty_like(in);
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, in.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<float>(fp8::round_e4m3(src[i]));
  });
  return out;
}

// SPEC.md fp8 activation quantization of x [rows, cols] (fp32), per row and per group of `group`
// columns (128 for fp8_block, the whole row for fp8_tensor; a partial last group covers the columns
// that exist): s = max(amax, 1e-10) / 448 and q = e4m3(x / s), both in fp32. Returns (q as fp32
// values [rows, cols], s [rows, groups]).
std::pair<at::Tensor, at::Tensor> quantize_fp8_groups(const at::Tensor& x, int64_t group) {
  const int64_t rows = x.size(0), cols = x.size(1), groups = (cols + group - 1) / group;
  // Zero columns past the end leave every amax as it is.
  at::Tensor grouped = at::constant_pad_nd(x, {0, groups * group - cols}).view({rows, groups, group});
  // The device takes the amax with fmaxf, which skips NaN: a NaN quantizes to NaN itself but leaves
  // its group's scale (and so the rest of its row) finite.
  at::Tensor magnitude = grouped.abs();
  magnitude.masked_fill_(magnitude.isnan(), 0.0);
  at::Tensor scale = magnitude.amax(-1).clamp_min(1e-10) / fp8::kE4m3Max;
  at::Tensor q = round_e4m3(grouped / scale.unsqueeze(-1)).view({rows, groups * group}).narrow(1, 0, cols);
  return {q, scale};
}

// The activation quantization of the config's fp8 mode for an operand with `cols` columns.
std::pair<at::Tensor, at::Tensor> quantize_fp8(const MoeConfig& c, const at::Tensor& x) {
  return quantize_fp8_groups(x, c.quant == Quant::Fp8Block ? kFp8BlockSize : std::max<int64_t>(x.size(1), 1));
}

// SPEC.md's fp8 GEMM of one expert: quantized activations q [n, K] with scales s [n, groups], times
// the e4m3 weight w [N, K] (nk) scaled by w_scale (fp8_block: [ceil(N/128), ceil(K/128)];
// fp8_tensor: one value) -> [n, N] fp32. The e4m3 products are exact in fp32; like the GPU, each
// 128-deep block's partial sum is scaled (fp8_block), or the whole sum once (fp8_tensor).
at::Tensor fp8_gemm(const MoeConfig& c, const at::Tensor& q, const at::Tensor& s, const at::Tensor& w,
                    const at::Tensor& w_scale) {
  at::Tensor wq = w.to(at::kFloat);  // exact: every e4m3 value is a float
  if (c.quant == Quant::Fp8Tensor) return at::matmul(q, wq.t()) * s * w_scale;
  const int64_t n = q.size(0), N = wq.size(0), K = wq.size(1);
  at::Tensor out = at::zeros({n, N}, q.options());
  for (int64_t g = 0; g * kFp8BlockSize < K; ++g) {
    const int64_t k0 = g * kFp8BlockSize, depth = std::min(kFp8BlockSize, K - k0);
    at::Tensor partial = at::matmul(q.narrow(1, k0, depth), wq.narrow(1, k0, depth).t());
    // The weight scale of each output row n: its 128-row block's, for this K block.
    at::Tensor row_scale = w_scale.select(1, g).repeat_interleave(kFp8BlockSize).narrow(0, 0, N);
    out += partial * (s.narrow(1, g, 1) * row_scale);
  }
  return out;
}

at::Tensor activate(const MoeConfig& c, const at::Tensor& x) {
  switch (c.activation) {
    case Activation::Silu: return at::silu(x);
    case Activation::Gelu: return at::gelu(x, "none");
    case Activation::GeluTanh: return at::gelu(x, "tanh");
    case Activation::SwigluOai: break;  // gated only (validate() enforces it)
  }
  TORCH_CHECK(false, "moejit: activation ", to_string(c.activation), " needs gate and up values");
}

// GEMM 1's activation of rows g1 [n, N1]: act(gate) * up when gated, or swigluoai's
// (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g) with g = min(gate, limit).
at::Tensor activate_rows(const MoeConfig& c, const at::Tensor& g1) {
  const int64_t I = c.local_intermediate();
  if (!c.gated) return activate(c, g1);
  const at::Tensor gate = g1.narrow(1, 0, I), up = g1.narrow(1, I, I);
  if (c.activation != Activation::SwigluOai) return activate(c, gate) * up;
  const at::Tensor g = gate.clamp_max(c.swiglu_limit);
  return (up.clamp(-c.swiglu_limit, c.swiglu_limit) + 1) * g * at::sigmoid(g * kSwigluOaiAlpha);
}

// x [n, K] times the expert's weight as [N, K] (nk) or [K, N] (kn): [n, N].
at::Tensor times_weight(const at::Tensor& x, const at::Tensor& w, WeightLayout layout) {
  return layout == WeightLayout::NK ? at::matmul(x, w.t()) : at::matmul(x, w);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> quantize_hidden_cpu(const at::Tensor& hidden, const std::string& config) {
  const MoeConfig& c = parse_config(config);
  check_quantize_hidden(c, hidden);
  auto [q, scale] = quantize_fp8(c, hidden.to(at::kFloat));
  return {q.to(at::kFloat8_e4m3fn), scale.contiguous()};  // exact: q holds e4m3 values
}

std::tuple<at::Tensor, at::Tensor> route_cpu(const at::Tensor& router_logits, const std::optional<at::Tensor>& bias,
                                             const std::string& config) {
  const MoeConfig& c = parse_config(config);
  check_routing_tensors(c, router_logits, bias);
  const int64_t tokens = router_logits.size(0);
  at::Tensor logits = router_logits.to(at::kFloat).contiguous();
  at::Tensor weights = at::empty({tokens, c.topk}, logits.options());
  at::Tensor ids = at::empty({tokens, c.topk}, logits.options().dtype(at::kInt));
  const std::optional<at::Tensor> bias32 = layer_float32(bias);
  const float* b = bias32.has_value() ? bias32->data_ptr<float>() : nullptr;
  // The one CPU routing (common/cpu_routing.h) in fp32, as the GPU kernel computes it.
  cpu_route_tokens<float>(routing_rule(c), tokens, logits.data_ptr<float>(), b, weights.data_ptr<float>(),
                          ids.data_ptr<int>());
  return {weights, ids};
}

at::Tensor experts_cpu(const at::Tensor& hidden, const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                       const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& w13_scale,
                       const std::optional<at::Tensor>& w2_scale, const std::optional<at::Tensor>& input_smooth,
                       const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                       const std::string& config, const std::optional<at::Tensor>& w13_bias,
                       const std::optional<at::Tensor>& w2_bias, const std::optional<at::Tensor>& hidden_scale) {
  const MoeConfig& c = parse_config(config);
  check_expert_tensors(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, w13_bias, w2_bias,
                       hidden_scale);
  // fp32 biases; GEMM 2's on tensor-parallel rank 0 only (the ranks' outputs are summed).
  const std::optional<at::Tensor> b13 = layer_float32(w13_bias);
  const std::optional<at::Tensor> b2 = c.tp_rank == 0 ? layer_float32(w2_bias) : std::nullopt;
  const int64_t tokens = hidden.size(0), H = c.hidden, I = c.local_intermediate();
  at::Tensor ids = layer_topk_ids(c, topk_ids, tokens), weights = layer_topk_weights(c, topk_weights, tokens);
  // The fused shared experts are slots K..K'-1 of every token, global experts E + s, weight 1
  // (SPEC.md; moe_config.h pair_slots). A routed id outside [0, E) selects nothing, as on the GPU.
  const int64_t K = c.pair_slots(), E = c.experts, S = c.shared_slots();
  if (S > 0) {
    const at::Tensor routed = ids.masked_fill(ids.ge(E).logical_or(ids.lt(0)), -1);
    const at::Tensor shared = at::arange(E, E + S, ids.options()).unsqueeze(0).expand({tokens, S});
    ids = at::cat({routed, shared}, 1);
    weights = at::cat({weights, at::ones({tokens, S}, weights.options())}, 1);
  }
  const at::ScalarType dtype = scalar_type(c.dtype);
  const bool w8a8 = c.quant == Quant::W8A8Int8, fp8 = is_fp8(c.quant);
  at::Tensor x = hidden.to(at::kFloat);
  // fp8 has no smoothing, so each token's row is quantized once, whichever experts it visits (as
  // the GPU's stage 3 does), or was quantized already (hidden_scale: x holds the e4m3 values).
  at::Tensor x_q, x_scale;
  if (hidden_scale.has_value())
    std::tie(x_q, x_scale) = std::pair{x, *hidden_scale};
  else if (fp8)
    std::tie(x_q, x_scale) = quantize_fp8(c, x);
  at::Tensor flat_ids = ids.reshape({-1}).to(at::kLong);
  // Y of every (token, slot) pair, zero for pairs another rank computes.
  at::Tensor y = at::zeros({tokens * K, H}, x.options());
  const int64_t first = c.first_local_expert();
  // Local experts: the routed ones, then the fused shared ones, which expert-parallel rank 0 computes.
  const int64_t experts_here = c.ep_rank == 0 ? c.gemm_experts() : c.local_experts();
  for (int64_t e = 0; e < experts_here; ++e) {
    const int64_t global = e < c.local_experts() ? first + e : E + (e - c.local_experts());
    at::Tensor pairs = (flat_ids == global).nonzero().reshape({-1});  // ascending: the stable order
    if (pairs.numel() == 0) continue;
    at::Tensor rows = at::floor_divide(pairs, K);  // the pairs' tokens
    at::Tensor g1, act, ye;
    if (w8a8) {
      auto [q, scale] = quantize_rows(x.index_select(0, rows) * (*input_smooth)[global]);
      g1 = times_weight(q.to(at::kDouble), w13[e].to(at::kDouble), c.weight_layout).to(at::kFloat) * scale *
           (*w13_scale)[e];
    } else if (fp8) {
      g1 = fp8_gemm(c, x_q.index_select(0, rows), x_scale.index_select(0, rows), w13[e], (*w13_scale)[e]);
    } else {
      g1 = times_weight(x.index_select(0, rows), w13[e].to(at::kFloat), c.weight_layout);
    }
    if (b13.has_value()) g1 = g1 + (*b13)[e];
    act = activate_rows(c, g1);
    if (w8a8) {
      auto [q, scale] = quantize_rows(act * (*act_smooth)[e]);
      ye = times_weight(q.to(at::kDouble), w2[e].to(at::kDouble), c.weight_layout).to(at::kFloat) * scale *
           (*w2_scale)[e];
    } else if (fp8) {
      // The fp32 activation is quantized again for GEMM 2, without a round trip through the model dtype.
      auto [q, scale] = quantize_fp8(c, act);
      ye = fp8_gemm(c, q, scale, w2[e], (*w2_scale)[e]);
    } else {
      // The GPU stores the activation in the model dtype between the GEMMs.
      ye = times_weight(act.to(dtype).to(at::kFloat), w2[e].to(at::kFloat), c.weight_layout);
    }
    if (b2.has_value()) ye = ye + (*b2)[e];
    y.index_copy_(0, pairs, ye.to(dtype).to(at::kFloat));
  }
  // Weighted sum over slots in order j = 0..K'-1, in fp32, rounded once.
  at::Tensor yk = y.view({tokens, K, H});
  const at::Tensor& w = weights;
  at::Tensor out = at::zeros({tokens, H}, x.options());
  for (int64_t j = 0; j < K; ++j) out += w.select(1, j).unsqueeze(1) * yk.select(1, j);
  if (residual.has_value()) out += residual->to(at::kFloat);
  return out.to(dtype);
}

at::Tensor moe_layer_cpu(const at::Tensor& hidden, const at::Tensor& router_logits, const at::Tensor& w13,
                         const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                         const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                         const std::optional<at::Tensor>& residual, const std::string& config,
                         const std::optional<at::Tensor>& w13_bias, const std::optional<at::Tensor>& w2_bias) {
  const MoeConfig& c = parse_config(config);
  check_expert_tensors(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, w13_bias, w2_bias);
  check_router_input(c, false);
  TORCH_CHECK_VALUE(router_logits.dim() == 2 && router_logits.size(0) == hidden.size(0), "moejit: router_logits has ",
                    router_logits.sizes(), " but hidden has ", hidden.size(0), " rows");
  auto [weights, ids] = route_cpu(router_logits, bias, config);
  return experts_cpu(hidden, ids, weights, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, config,
                     w13_bias, w2_bias, std::nullopt);
}

at::Tensor moe_layer_gate_cpu(const at::Tensor& hidden, const at::Tensor& gate_weight, const at::Tensor& w13,
                              const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                              const std::optional<at::Tensor>& input_smooth,
                              const std::optional<at::Tensor>& act_smooth, const std::optional<at::Tensor>& residual,
                              const std::string& config, const std::optional<at::Tensor>& w13_bias,
                              const std::optional<at::Tensor>& w2_bias, const std::optional<at::Tensor>& gate_bias) {
  const MoeConfig& c = parse_config(config);
  check_expert_tensors(c, hidden, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, w13_bias, w2_bias);
  check_gate_weight(c, hidden, gate_weight);
  check_gate_bias(c, hidden, gate_bias);
  // docs/LAYER_MATH.md "Router GEMM": fp32 sums of the inputs as given (the bias added to them in
  // fp32), rounded once to router_dtype.
  at::Tensor sums = at::matmul(hidden.to(at::kFloat), gate_weight.to(at::kFloat).t());
  if (gate_bias.has_value()) sums = sums + gate_bias->to(at::kFloat);
  const at::Tensor logits = sums.to(scalar_type(c.router_dtype));
  auto [weights, ids] = route_cpu(logits, bias, config);
  return experts_cpu(hidden, ids, weights, w13, w2, w13_scale, w2_scale, input_smooth, act_smooth, residual, config,
                     w13_bias, w2_bias, std::nullopt);
}

}  // namespace moejit::torch_ops
