#include "compiler/families/exchange.h"

#include <tuple>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/families/quantize.h"
#include "compiler/families/spec_text.h"

namespace moejit {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// name: "slots", "pack" or "combine", which names the device function and its argument struct;
// row: the device type of the rows it moves (pack: what is sent), row_bytes its size.
KernelPlan exchange_kernel(const LayerSpec& c, KernelRole role, const std::string& name, const char* args,
                           int threads, const std::string& row, int row_bytes, int64_t scale_groups,
                           const std::string& tag) {
  KernelPlan k;
  k.stage = Stage::Exchange;
  k.role = role;
  k.unit = "exchange";
  k.header = "moejit/exchange.cuh";
  k.device_function = "moejit::exchange_" + name;
  k.args_type = args;
  k.entry = fmt::format("moejit_exchange_{}_h{}_k{}_e{}_r{}_{}{}", name, c.hidden, c.topk, c.local_experts(), c.ep_size,
                        to_string(c.dtype), tag);
  k.spec_name = "ExchangeSpec_" + k.entry.substr(std::string("moejit_exchange_").size());
  // 16-byte row accesses when the hidden size splits into them.
  const int vec_full = 16 / row_bytes;
  const int vec = c.hidden % vec_full == 0 ? vec_full : 1;
  k.spec = {
      {"using", "Row", row},
      {"int", "kHidden", std::to_string(c.hidden)},
      {"int", "kTopk", std::to_string(c.topk)},
      {"int", "kLocalExperts", std::to_string(c.local_experts())},
      {"int", "kRanks", std::to_string(c.ep_size)},
      {"int", "kThreads", std::to_string(threads)},
      {"int", "kVec", std::to_string(vec)},
      {"int", "kScaleGroups", std::to_string(scale_groups)},
  };
  if (role != KernelRole::ExchangeSlots)
    k.launch = {role == KernelRole::ExchangePack ? GridRule::SlabRowsByColumns : GridRule::TokensByColumns, threads,
                int64_t{threads} * vec, 0, c.hidden};
  else
    k.launch = {GridRule::RanksOfGroup, threads, 1, 0, 0};
  return k;
}

}  // namespace

Plan exchange_plan(const LayerSpec& spec, const std::string& arch) {
  Plan plan;
  plan.spec = spec;
  plan.arch = arch;
  const bool fp8 = is_fp8(spec.quant);
  if (fp8) {
    // fp8 rows travel quantized, by the very kernel (template and Spec) the layer's stage 3 runs,
    // so the receiving rank's GEMM 1 gets the bytes and scales its own expand would have made.
    KernelPlan quantize = quantize_kernels(spec)[0];
    quantize.stage = Stage::Exchange;
    quantize.unit = "exchange";
    quantize.spec_name = "Spec_" + quantize.entry.substr(std::string("moejit_").size());
    plan.kernels.push_back(std::move(quantize));
  }
  const std::string model_row = spec_text::device_type(spec.dtype);
  const int model_bytes = static_cast<int>(dtype_bytes(spec.dtype));
  plan.kernels.push_back(exchange_kernel(spec, KernelRole::ExchangeSlots, "slots", "moejit::ExchangeSlotsArgs",
                                         kExchangeSlotsThreads, model_row, model_bytes, 0, ""));
  plan.kernels.push_back(exchange_kernel(spec, KernelRole::ExchangePack, "pack", "moejit::ExchangePackArgs",
                                         kExchangeRowThreads, fp8 ? "moejit::e4m3" : model_row, fp8 ? 1 : model_bytes,
                                         exchange_scale_groups(spec), fp8 ? "_" + std::string(to_string(spec.quant)) : ""));
  plan.kernels.push_back(exchange_kernel(spec, KernelRole::ExchangeCombine, "combine", "moejit::ExchangeCombineArgs",
                                         kExchangeRowThreads, model_row, model_bytes, 0, ""));
  return plan;
}

int64_t exchange_scale_groups(const LayerSpec& spec) {
  return is_fp8(spec.quant) ? activation_scale_groups(spec, spec.hidden) : 0;
}

Grid exchange_grid(const KernelPlan& k, int ranks, int64_t capacity, int64_t tokens) {
  switch (k.launch.rule) {
    case GridRule::RanksOfGroup: return {ranks, 1};
    case GridRule::SlabRowsByColumns: return {int64_t{ranks} * capacity, ceil_div(k.launch.columns, k.launch.per_block)};
    case GridRule::TokensByColumns: return {tokens, ceil_div(k.launch.columns, k.launch.per_block)};
    case GridRule::TokensPerBlock: return {ceil_div(tokens, k.launch.per_block), 1};  // the fp8 quantization
    default: break;
  }
  throw Error(fmt::format("moejit internal error: {} is not an exchange kernel", k.entry));
}

}  // namespace moejit
