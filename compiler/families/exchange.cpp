#include "compiler/families/exchange.h"

#include <tuple>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/families/spec_text.h"

namespace moejit {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// name: "slots", "pack" or "combine", which names the device function and its argument struct.
KernelPlan exchange_kernel(const LayerSpec& c, KernelRole role, const std::string& name, const char* args,
                           int threads) {
  KernelPlan k;
  k.stage = Stage::Exchange;
  k.role = role;
  k.unit = "exchange";
  k.header = "moejit/exchange.cuh";
  k.device_function = "moejit::exchange_" + name;
  k.args_type = args;
  k.entry = fmt::format("moejit_exchange_{}_h{}_k{}_e{}_r{}_{}", name, c.hidden, c.topk, c.local_experts(), c.ep_size,
                        to_string(c.dtype));
  k.spec_name = "ExchangeSpec_" + k.entry.substr(std::string("moejit_exchange_").size());
  // 16-byte row accesses when the hidden size splits into them.
  const int vec_full = 16 / static_cast<int>(dtype_bytes(c.dtype));
  const int vec = c.hidden % vec_full == 0 ? vec_full : 1;
  k.spec = {
      {"using", "Row", spec_text::device_type(c.dtype)},
      {"int", "kHidden", std::to_string(c.hidden)},
      {"int", "kTopk", std::to_string(c.topk)},
      {"int", "kLocalExperts", std::to_string(c.local_experts())},
      {"int", "kRanks", std::to_string(c.ep_size)},
      {"int", "kThreads", std::to_string(threads)},
      {"int", "kVec", std::to_string(vec)},
  };
  return k;
}

}  // namespace

Plan exchange_plan(const LayerSpec& spec, const std::string& arch) {
  Plan plan;
  plan.spec = spec;
  plan.arch = arch;
  KernelPlan slots = exchange_kernel(spec, KernelRole::ExchangeSlots, "slots", "moejit::ExchangeSlotsArgs",
                                     kExchangeSlotsThreads);
  slots.launch = {GridRule::RanksOfGroup, kExchangeSlotsThreads, 1, 0, 0};
  plan.kernels.push_back(std::move(slots));
  for (auto [role, name, args, rule] :
       {std::tuple{KernelRole::ExchangePack, "pack", "moejit::ExchangePackArgs", GridRule::SlabRowsByColumns},
        std::tuple{KernelRole::ExchangeCombine, "combine", "moejit::ExchangeCombineArgs", GridRule::TokensByColumns}}) {
    KernelPlan k = exchange_kernel(spec, role, name, args, kExchangeRowThreads);
    const int vec = std::stoi(k.spec.back().value);
    k.launch = {rule, kExchangeRowThreads, int64_t{kExchangeRowThreads} * vec, 0, spec.hidden};
    plan.kernels.push_back(std::move(k));
  }
  return plan;
}

Grid exchange_grid(const KernelPlan& k, int ranks, int64_t capacity, int64_t tokens) {
  switch (k.launch.rule) {
    case GridRule::RanksOfGroup: return {ranks, 1};
    case GridRule::SlabRowsByColumns: return {int64_t{ranks} * capacity, ceil_div(k.launch.columns, k.launch.per_block)};
    case GridRule::TokensByColumns: return {tokens, ceil_div(k.launch.columns, k.launch.per_block)};
    default: break;
  }
  throw Error(fmt::format("moejit internal error: {} is not an exchange kernel", k.entry));
}

}  // namespace moejit
