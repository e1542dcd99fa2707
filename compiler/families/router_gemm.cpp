#include "compiler/families/router_gemm.h"

#include <fmt/format.h>

#include "compiler/families/spec_text.h"

namespace moejit {

using namespace spec_text;

KernelPlan router_gemm_kernel(const LayerSpec& c) {
  // Experts a block: about 128 blocks along the experts, so that a decode step streams the gate
  // weight through most SMs once; the other warps of a block split an expert's columns.
  int experts_per_block = 1;
  while (experts_per_block < kRouterWarps && c.experts / (experts_per_block * 2) >= 128) experts_per_block *= 2;
  KernelPlan k;
  k.stage = Stage::Routing;
  k.role = KernelRole::RouterGemm;
  k.entry = fmt::format("moejit_router_gemm_e{}_h{}_{}_{}", c.experts, c.hidden, to_string(c.dtype),
                        to_string(c.router_dtype));
  k.unit = "routing";
  k.device_function = "moejit::router_logits";
  k.args_type = "moejit::RouterGemmArgs";
  k.header = "moejit/router_gemm.cuh";
  k.spec = {
      {"using", "Input", device_type(c.dtype)},
      {"using", "Logit", device_type(c.router_dtype)},
      {"int", "kExperts", std::to_string(c.experts)},
      {"long long", "kHidden", std::to_string(c.hidden)},
      {"int", "kWarps", std::to_string(kRouterWarps)},
      {"int", "kExpertsPerBlock", std::to_string(experts_per_block)},
      {"int", "kTokensPerBlock", std::to_string(kRouterTokensPerBlock)},
      {"int", "kChunk", std::to_string(kRouterChunkColumns)},
  };
  k.launch = {GridRule::TokenTilesByColumns, kRouterWarps * 32, experts_per_block, 0, c.experts};
  return k;
}

RouterGemmArgs router_gemm_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  return RouterGemmArgs{b.in.hidden, b.in.gate_weight, b.at<void>(b.offsets.router_logits), x.call.tokens};
}

}  // namespace moejit
