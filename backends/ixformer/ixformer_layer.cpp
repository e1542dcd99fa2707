#include "backends/ixformer/ixformer_layer.h"

#include <c10/util/Exception.h>

#include <cfloat>

#include <fmt/format.h>

#include "backends/ixformer/ixformer_api.h"
#include "backends/ixformer/portable_routing.h"
#include "backends/torch/dtype.h"

namespace moejit::ilu {
namespace {

void expect(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape,
            const at::Device& device) {
  TORCH_CHECK_VALUE(t.scalar_type() == dtype && t.sizes() == shape, "moejit ilu backend: ", name, " must be ", dtype,
                    " ", shape, ", got ", t.scalar_type(), " ", t.sizes());
  TORCH_CHECK_VALUE(t.device() == device, "moejit ilu backend: ", name, " is on ", t.device(), ", hidden on ", device);
}

// SPEC.md's activation in fp32 from the GEMM 1 rows, rounded once to the model dtype.
at::Tensor activation_aten(const MoeConfig& c, const at::Tensor& g1) {
  auto act_fn = [&](const at::Tensor& x) {
    switch (c.activation) {
      case Activation::Silu: return at::silu(x);
      case Activation::Gelu: return at::gelu(x, "none");
      case Activation::GeluTanh: return at::gelu(x, "tanh");
      case Activation::SwigluOai: break;  // gated only: below
    }
    return x;
  };
  const int64_t I = c.local_intermediate();
  at::Tensor x = g1.to(at::kFloat);
  at::Tensor act;
  if (c.gated && c.activation == Activation::SwigluOai) {
    const at::Tensor g = x.narrow(1, 0, I).clamp_max(c.swiglu_limit);
    act = (x.narrow(1, I, I).clamp(-c.swiglu_limit, c.swiglu_limit) + 1) * g * at::sigmoid(g * kSwigluOaiAlpha);
  } else {
    act = c.gated ? act_fn(x.narrow(1, 0, I)) * x.narrow(1, I, I) : act_fn(x);
  }
  return act.to(g1.scalar_type());
}

}  // namespace

std::string unsupported_capability(const MoeConfig& c) {
  if (c.quant == Quant::W8A8Int8)
    return "quant w8a8_int8 (int8 smoothquant experts): ixformer's declared API has no int8 smoothquant group "
           "GEMM; use bf16/fp16 weights on Iluvatar devices";
  if (is_fp8(c.quant))
    return fmt::format("quant {} (fp8 experts): ixformer's declared API has no fp8 group GEMM; use bf16/fp16 "
                       "weights on Iluvatar devices",
                       to_string(c.quant));
  if (c.expert_bias)
    return "expert_bias (gpt-oss's expert biases): ixformer's declared moe_w16a16_group_gemm has no bias input";
  if (c.fuse_shared_experts)
    return "fuse_shared_experts (the shared experts computed in the layer): not built for Iluvatar devices; pass "
           "the shared experts' output as residual (fuse_shared_experts false)";
  if (c.router_gemm)
    return "router_gemm (the router GEMM computed in the layer): not built for Iluvatar devices; pass router_logits "
           "(router_gemm false)";
  if (c.ep_size > 1)
    return fmt::format(
        "expert parallel (ep_size {}): moejit does not pass expert ranges to moe_compute_token_index_api (whether "
        "end_expert_id is inclusive is not specified), so only ep_size 1 runs on Iluvatar devices",
        c.ep_size);
  if (c.dtype == DType::FP32)
    return "dtype fp32: moe_w16a16_group_gemm computes bf16/fp16 only; use dtype bf16 or fp16";
  if (c.weight_layout == WeightLayout::KN)
    return "weight_layout kn: moe_w16a16_group_gemm's format TN takes weights [E, N, K] (weight_layout nk); "
           "store w13/w2 as nk";
  return {};
}

bool routing_by_topk_softmax(const MoeConfig& c) {
  const bool groups_exclude = c.num_expert_group > 1 && c.topk_group < c.num_expert_group;
  return c.scoring == Scoring::Softmax && c.topk_method != TopkMethod::NoauxTc && !groups_exclude &&
         c.routed_scaling_factor == 1.0;
}

namespace {

// SPEC.md's map of non-finite values, for topk_softmax's fp32 gating (a no-op on finite logits).
at::Tensor sanitize_logits(const at::Tensor& x) {
  return at::nan_to_num(x.to(at::kFloat), -FLT_MAX, FLT_MAX, -FLT_MAX);
}

// A routing, and the per-expert pair counts on the host where the routing ran there.
struct Routed {
  at::Tensor weights, ids;
  std::optional<at::Tensor> host_counts;
};

Routed route_with_counts(const MoeConfig& c, const at::Tensor& router_logits, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(router_logits.dim() == 2 && router_logits.size(1) == c.experts,
                    "moejit ilu backend: router_logits must be [T, ", c.experts, "], got ", router_logits.sizes());
  if (!routing_by_topk_softmax(c)) {
    PortableRouting r = route_portable(c, router_logits, bias);  // on the host: waits for the stream
    return {r.weights, r.ids, r.host_counts};
  }

  // topk_softmax takes fp32 gating only; SPEC.md's non-finite map first (a no-op on finite logits).
  const int64_t T = router_logits.size(0), K = c.topk;
  at::Tensor gating = sanitize_logits(router_logits).contiguous();
  at::Tensor weights = at::empty({T, K}, gating.options());
  at::Tensor ids = at::empty({T, K}, gating.options().dtype(at::kInt));
  at::Tensor token_expert_indices = at::empty({T, K}, gating.options().dtype(at::kInt));
  if (T == 0) return {weights, ids, std::nullopt};
  // renormalize=false: ixformer returns the plain softmax scores of the K picks, and the
  // renormalization runs here, the same on every ixformer version (as xLLM's ILU layer does).
  ixformer::infer::topk_softmax(weights, ids, token_expert_indices, gating, /*renormalize=*/false);
  if (c.renormalize) weights = weights / weights.sum(-1, /*keepdim=*/true);  // softmax picks: the sum is > 0
  return {weights, ids, std::nullopt};
}

// Stages 2-6. host_counts: the pairs per expert, already on the host (portable routing), or none:
// then the index call's device counts are copied to the host, which waits for the stream.
at::Tensor experts_counted(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& topk_ids,
                           const at::Tensor& topk_weights, const at::Tensor& w13, const at::Tensor& w2,
                           const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& host_counts) {
  const std::string missing = unsupported_capability(c);
  TORCH_CHECK_NOT_IMPLEMENTED(missing.empty(), "moejit ilu backend (ixformer): ", missing);
  TORCH_CHECK_VALUE(hidden.dim() == 2 && hidden.size(1) == c.hidden, "moejit ilu backend: hidden must be [T, ",
                    c.hidden, "], got ", hidden.sizes());
  const int64_t T = hidden.size(0), K = c.topk, H = c.hidden, E = c.experts, M = T * K;
  const int64_t I = c.local_intermediate(), N1 = c.gemm1_rows();
  const at::ScalarType dtype = scalar_type(c.dtype);
  const at::Device device = hidden.device();
  expect(hidden, "hidden", dtype, {T, H}, device);
  expect(topk_ids, "topk_ids", at::kInt, {T, K}, device);
  expect(topk_weights, "topk_weights", at::kFloat, {T, K}, device);
  expect(w13, "w13", dtype, {E, N1, H}, device);
  expect(w2, "w2", dtype, {E, H, I}, device);
  if (residual.has_value()) expect(*residual, "residual", dtype, {T, H}, device);
  if (T == 0) return at::empty({0, H}, hidden.options());

  const at::TensorOptions i32 = hidden.options().dtype(at::kInt);
  at::Tensor ids = topk_ids.contiguous();
  at::Tensor x = hidden.contiguous();

  // Stage 2. ixformer's names: src_dst is SPEC.md's pair_pos, dst_src its sorted_pair.
  at::Tensor pair_pos = at::empty({M}, i32);     // src_dst
  at::Tensor sorted_pair = at::empty({M}, i32);  // dst_src
  at::Tensor counts = at::empty({E}, i32);
  ixformer::infer::moe_compute_token_index_api(ids, /*src_dst=*/pair_pos, /*dst_src=*/sorted_pair,
                                               /*expert_sizes_gpu=*/counts, /*expert_mask=*/std::nullopt,
                                               /*expert_sizes_cpu=*/std::nullopt, /*expand_tokens_gpu=*/std::nullopt,
                                               /*start_expert_id=*/0, /*end_expert_id=*/E, /*num_experts=*/E);
  // The group GEMM wants the counts on the host. Counted there by the portable routing; otherwise
  // this copy waits for the stream (the one host synchronization of the call).
  at::Tensor host_tokens = host_counts.has_value() ? *host_counts : counts.to(at::kCPU);

  // Stage 3: A[p] = hidden[sorted_pair[p] / K].
  at::Tensor expanded = at::empty({M, H}, x.options());
  ixformer::infer::moe_expand_input(expanded, x, /*dst_to_src=*/sorted_pair, /*src_to_dst=*/pair_pos,
                                    /*dst_tokens=*/M, /*expand_factor=*/K);

  // Stage 4: G1 in expert-sorted order, then the activation.
  at::Tensor g1 = at::empty({M, N1}, x.options());
  ixformer::infer::moe_w16a16_group_gemm(g1, expanded, w13.contiguous(), host_tokens, /*dst_to_src=*/std::nullopt,
                                         /*bias=*/std::nullopt, /*format=*/"TN", /*persistent=*/0, /*output_n=*/M);
  at::Tensor act;
  if (c.gated && c.activation == Activation::Silu) {
    act = at::empty({M, I}, x.options());
    ixformer::infer::silu_and_mul(/*input=*/g1, /*output=*/act);
  } else {
    act = activation_aten(c, g1);  // gelu variants and non-gated: moejit's own ATen ops
  }

  // Stage 5: with dst_to_src = sorted_pair, row p lands in row sorted_pair[p] = t*K + j.
  at::Tensor y = at::empty({M, H}, x.options());
  ixformer::infer::moe_w16a16_group_gemm(y, act, w2.contiguous(), host_tokens, /*dst_to_src=*/sorted_pair,
                                         /*bias=*/std::nullopt, /*format=*/"TN", /*persistent=*/0, /*output_n=*/M);

  // Stage 6: out[t] = sum_j w[t,j] * Y[t,j] (+ residual). The route scale is already in the
  // weights; scaling_factor stays 1 (ixformer would apply it only when a residual is given).
  at::Tensor out = at::empty({T, H}, x.options());
  std::optional<at::Tensor> extra_residual;
  if (residual.has_value()) extra_residual = residual->contiguous();
  ixformer::infer::moe_output_reduce_sum(out, y.view({T, K, H}), /*mul_weight=*/topk_weights.contiguous(),
                                         /*mask=*/std::nullopt, extra_residual, /*scaling_factor=*/1.0);
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> route(const MoeConfig& c, const at::Tensor& router_logits,
                                         const std::optional<at::Tensor>& bias) {
  Routed r = route_with_counts(c, router_logits, bias);
  return {r.weights, r.ids};
}

at::Tensor experts(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& topk_ids,
                   const at::Tensor& topk_weights, const at::Tensor& w13, const at::Tensor& w2,
                   const std::optional<at::Tensor>& residual) {
  return experts_counted(c, hidden, topk_ids, topk_weights, w13, w2, residual, std::nullopt);
}

at::Tensor forward(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& router_logits,
                   const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                   const std::optional<at::Tensor>& residual) {
  const std::string missing = unsupported_capability(c);
  TORCH_CHECK_NOT_IMPLEMENTED(missing.empty(), "moejit ilu backend (ixformer): ", missing);
  TORCH_CHECK_VALUE(router_logits.dim() == 2 && router_logits.size(0) == hidden.size(0),
                    "moejit ilu backend: router_logits has ", router_logits.sizes(), " but hidden has ",
                    hidden.size(0), " rows");
  Routed r = route_with_counts(c, router_logits, bias);
  return experts_counted(c, hidden, r.ids, r.weights, w13, w2, residual, r.host_counts);
}

}  // namespace moejit::ilu
