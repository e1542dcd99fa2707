#include "compiler/families/router_gemm.h"

#include <algorithm>

#include <fmt/format.h>

#include "compiler/families/spec_text.h"

namespace moejit {

using namespace spec_text;

namespace {

// A router with a bias (router_bias) is another kernel: "_bias" keeps its entry (and spec) apart.
std::string entry_stem(const LayerSpec& c) {
  return fmt::format("e{}_h{}_{}_{}{}", c.experts, c.hidden, to_string(c.dtype), to_string(c.router_dtype),
                     c.router_bias ? "_bias" : "");
}

std::string bias_flag(const LayerSpec& c) { return c.router_bias ? "true" : "false"; }

KernelPlan simt_kernel(const LayerSpec& c) {
  // Experts a block: about 128 blocks along the experts, so that a decode step streams the gate
  // weight through most SMs once; the other warps of a block split an expert's columns.
  int experts_per_block = 1;
  while (experts_per_block < kRouterWarps && c.experts / (experts_per_block * 2) >= 128) experts_per_block *= 2;
  KernelPlan k;
  k.entry = "moejit_router_gemm_" + entry_stem(c);
  k.device_function = "moejit::router_logits_simt";
  k.spec = {
      {"using", "Input", device_type(c.dtype)},
      {"using", "Logit", device_type(c.router_dtype)},
      {"int", "kExperts", std::to_string(c.experts)},
      {"long long", "kHidden", std::to_string(c.hidden)},
      {"int", "kWarps", std::to_string(kRouterWarps)},
      {"int", "kExpertsPerBlock", std::to_string(experts_per_block)},
      {"int", "kTokensPerBlock", std::to_string(kRouterTokensPerBlock)},
      {"int", "kGateVectors", std::to_string(kRouterGateVectors)},
      {"bool", "kBias", bias_flag(c)},
  };
  k.launch = {GridRule::TokenTilesByColumns, kRouterWarps * 32, experts_per_block, 0, c.experts, kRouterTokensPerBlock};
  return k;
}

KernelPlan mma_kernel(const LayerSpec& c, int widest) {
  // Expert tile: a power of two from 16 (a warp's pair of n8 fragments) to `widest`, covering E
  // when it can; a warp per 32 experts, two warps along the 32 tokens.
  int bn = 16;
  while (bn < widest && bn < c.experts) bn *= 2;
  const int warps_n = bn >= 32 ? bn / 32 : 1, warps_m = kRouterTileTokens / 16;
  const int stage_bytes = (kRouterTileTokens + bn) * 64 * 2;  // 64 columns of the token and gate rows
  const int stages = std::max(2, std::min(kRouterMaxStages, kRouterPipelineBytes / stage_bytes));
  const int shared = stages * stage_bytes;
  KernelPlan k;
  k.entry = fmt::format("moejit_router_gemm_mma_{}_{}x{}", entry_stem(c), kRouterTileTokens, bn);
  k.device_function = "moejit::router_logits_mma";
  k.spec = {
      {"using", "Input", device_type(c.dtype)},
      {"using", "Logit", device_type(c.router_dtype)},
      {"int", "kExperts", std::to_string(c.experts)},
      {"long long", "kHidden", std::to_string(c.hidden)},
      {"int", "kBM", std::to_string(kRouterTileTokens)},
      {"int", "kBN", std::to_string(bn)},
      {"int", "kWarpsM", std::to_string(warps_m)},
      {"int", "kWarpsN", std::to_string(warps_n)},
      {"int", "kStages", std::to_string(stages)},
      {"int", "kSharedBytes", std::to_string(shared)},
      {"bool", "kBias", bias_flag(c)},
  };
  k.launch = {GridRule::TokenTilesByColumns, 32 * warps_m * warps_n, bn, shared, c.experts, kRouterTileTokens};
  return k;
}

}  // namespace

bool router_tensor_core_eligible(const LayerSpec& c) {
  return (c.dtype == DType::BF16 || c.dtype == DType::FP16) && c.hidden % 8 == 0;
}

KernelPlan router_gemm_kernel(const LayerSpec& c, BucketKind bucket) {
  KernelPlan k = bucket == BucketKind::Decode || !router_tensor_core_eligible(c)
                     ? simt_kernel(c)
                     : mma_kernel(c, bucket == BucketKind::Mid ? kRouterMidExperts : kRouterPrefillExperts);
  k.stage = Stage::Routing;
  k.role = KernelRole::RouterGemm;
  k.unit = "routing";
  k.args_type = "moejit::RouterGemmArgs";
  k.header = "moejit/router_gemm.cuh";
  return k;
}

RouterGemmArgs router_gemm_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  return RouterGemmArgs{b.in.hidden, b.in.gate_weight, b.in.gate_bias, b.at<void>(b.offsets.router_logits),
                        x.call.tokens};
}

}  // namespace moejit
