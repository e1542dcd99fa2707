#include "compiler/families/route_index.h"

#include <algorithm>

#include <fmt/format.h>

#include "compiler/families/index.h"
#include "compiler/families/routing.h"
#include "compiler/families/spec_text.h"

namespace moejit {

// NOTES: with 16 warps NVRTC's ptxas spilled this kernel for E = 128; with 8 it does not.
KernelPlan route_index_kernel(const LayerSpec& c) {
  KernelPlan k = routing_kernel(c);
  k.stage = Stage::Index;
  k.role = KernelRole::RouteIndex;
  k.entry = "moejit_route_index_" + k.entry.substr(std::string("moejit_route_").size()) +
            fmt::format("_eloc{}", c.local_experts()) + spec_text::shared_suffix(c);
  k.unit = "index";
  k.device_function = "moejit::route_and_index";
  k.args_type = "moejit::RouteIndexArgs";
  k.header = "moejit/route_index.cuh";
  const int warps = static_cast<int>(std::clamp<int64_t>(4096 / c.experts, 4, 8));
  for (auto& item : k.spec)
    if (item.name == "kWarps") item.value = std::to_string(warps);
  k.spec.push_back({"int", "kLocalExperts", std::to_string(c.gemm_experts())});
  k.spec.push_back({"int", "kPairsPerBlock", std::to_string(kPairsPerIndexBlock)});
  k.spec.push_back({"int", "kRoutedExperts", std::to_string(c.local_experts())});
  k.spec.push_back({"int", "kSharedSlots", std::to_string(c.shared_slots())});
  k.launch = {GridRule::SingleBlock, warps * 32, 1};
  return k;
}

RouteIndexArgs route_index_args(const CallContext& x) {
  const bool route = x.call.entry == Entry::Forward;
  return RouteIndexArgs{route ? routing_args(x) : RouteArgs{}, index_args(x), route ? 1 : 0};
}

}  // namespace moejit
