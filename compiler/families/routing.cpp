#include "compiler/families/routing.h"

#include <fmt/format.h>

#include "compiler/families/spec_text.h"

namespace moejit {

using namespace spec_text;

KernelPlan routing_kernel(const LayerSpec& c) {
  const bool noaux = c.topk_method == TopkMethod::NoauxTc;
  KernelPlan k;
  k.stage = Stage::Routing;
  k.role = KernelRole::Routing;
  k.entry = fmt::format("moejit_route_e{}_k{}", c.experts, c.topk);
  if (c.num_expert_group > 1) k.entry += fmt::format("_g{}t{}", c.num_expert_group, c.topk_group);
  k.entry += fmt::format("_{}_{}_{}", to_string(c.scoring), to_string(c.topk_method),
                         c.renormalize ? "renorm" : "norenorm");
  if (c.routed_scaling_factor != 1.0) k.entry += "_s" + identifier_number(c.routed_scaling_factor);
  k.entry += fmt::format("_{}", to_string(c.router_dtype));
  k.unit = "routing";
  k.device_function = "moejit::route_tokens";
  k.args_type = "moejit::RouteArgs";
  k.header = "moejit/routing.cuh";
  k.spec = {
      {"using", "Logit", device_type(c.router_dtype)},
      {"int", "kExperts", std::to_string(c.experts)},
      {"int", "kTopk", std::to_string(c.topk)},
      {"int", "kGroups", std::to_string(c.num_expert_group)},
      {"int", "kTopkGroup", std::to_string(c.topk_group)},
      {"int", "kWarps", std::to_string(kRouteWarps)},
      {"bool", "kSigmoid", boolean(c.scoring == Scoring::Sigmoid)},
      {"bool", "kBias", boolean(noaux)},
      {"bool", "kGroupTop2", boolean(noaux)},
      {"bool", "kRenormalize", boolean(c.renormalize)},
      {"float", "kScale", float_literal(c.routed_scaling_factor)},
  };
  k.launch = {GridRule::TokensPerBlock, kRouteWarps * 32, kRouteWarps};
  return k;
}

RouteArgs routing_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  return RouteArgs{b.in.router_logits, b.in.e_score_correction_bias, b.topk_weights, b.topk_ids, x.call.tokens};
}

}  // namespace moejit
