#include "backends/ixformer/portable_routing.h"

#include <c10/util/Exception.h>

#include <cfloat>
#include <limits>

namespace moejit::ilu {
namespace {

// Indices of x [..., n] in descending order; equal values keep ascending index order.
at::Tensor order_desc(const at::Tensor& x) {
  return std::get<1>(at::sort(x, /*stable=*/true, /*dim=*/-1, /*descending=*/true));
}

}  // namespace

at::Tensor sanitize_logits(const at::Tensor& x) {
  return at::nan_to_num(x.to(at::kFloat), -FLT_MAX, FLT_MAX, -FLT_MAX);
}

std::tuple<at::Tensor, at::Tensor> route_portable(const MoeConfig& c, const at::Tensor& logits,
                                                  const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(logits.dim() == 2 && logits.size(1) == c.experts, "moejit ilu routing: router_logits must be [T, ",
                    c.experts, "], got ", logits.sizes());
  const int64_t T = logits.size(0), E = c.experts, K = c.topk, G = c.num_expert_group;
  const bool noaux = c.topk_method == TopkMethod::NoauxTc;
  at::Tensor x = sanitize_logits(logits);
  at::Tensor p = c.scoring == Scoring::Sigmoid ? at::sigmoid(x) : at::softmax(x, /*dim=*/-1);
  at::Tensor q = p;
  if (noaux) {
    TORCH_CHECK_VALUE(bias.has_value() && bias->numel() == E, "moejit ilu routing: e_score_correction_bias [", E,
                      "] is required for topk_method noaux_tc");
    at::Tensor b = sanitize_logits(bias->to(logits.device()).reshape({1, E}));
    q = at::nan_to_num(p + b, -FLT_MAX, FLT_MAX, -FLT_MAX);
  }

  // Groups: keep the topk_group best; experts of the other groups can never be selected (-inf,
  // below every finite q).
  at::Tensor candidates = q;
  if (G > 1 && c.topk_group < G) {
    const int64_t size = E / G;
    at::Tensor qg = q.view({T, G, size});
    at::Tensor group_score =
        noaux ? at::nan_to_num(std::get<0>(qg.topk(2, /*dim=*/-1)).sum(-1), -FLT_MAX, FLT_MAX, -FLT_MAX)
              : std::get<0>(qg.max(/*dim=*/-1));
    at::Tensor kept = order_desc(group_score).narrow(1, 0, c.topk_group);
    at::Tensor group_open = at::zeros({T, G}, q.options().dtype(at::kBool)).scatter_(1, kept, true);
    at::Tensor expert_open = group_open.unsqueeze(-1).expand({T, G, size}).reshape({T, E});
    candidates = q.masked_fill(expert_open.logical_not(), -std::numeric_limits<float>::infinity());
  }

  at::Tensor ids = order_desc(candidates).narrow(1, 0, K).contiguous();
  at::Tensor weights = p.gather(1, ids);
  if (c.renormalize) {
    at::Tensor sum = weights.sum(-1, /*keepdim=*/true);
    weights = at::where(sum > 0, weights / sum, weights);
  }
  if (c.routed_scaling_factor != 1.0) weights = weights * static_cast<float>(c.routed_scaling_factor);
  return {weights.contiguous(), ids.to(at::kInt)};
}

}  // namespace moejit::ilu
