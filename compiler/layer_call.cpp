#include "compiler/layer_call.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/families/combine.h"
#include "compiler/families/grouped_gemm.h"
#include "compiler/families/index.h"
#include "compiler/families/quantize.h"
#include "compiler/families/route_index.h"
#include "compiler/families/router_gemm.h"
#include "compiler/families/routing.h"

namespace moejit {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The grid of a kernel by its launch rule, for `call`'s token count and row tiles.
Grid grid_of(const LaunchRule& rule, const CallPlan& call) {
  switch (rule.rule) {
    case GridRule::TokensPerBlock: return {ceil_div(call.tokens, rule.per_block), 1};
    case GridRule::PairsPerBlock: return {ceil_div(call.pairs, rule.per_block), 1};
    case GridRule::PairBlocksCapped:
      return {std::min(ceil_div(call.pairs, rule.per_block), kMaxIndexScatterBlocks), 1};
    case GridRule::SingleBlock: return {1, 1};
    case GridRule::SortedRows: return {call.pairs, 1};
    case GridRule::RowTilesByColumns: return {call.row_tiles, ceil_div(rule.columns, rule.per_block)};
    case GridRule::RowTileGroups: return {call.row_tiles * ceil_div(rule.columns, rule.per_block), 1};
    case GridRule::TokensByColumns: return {call.tokens, ceil_div(rule.columns, rule.per_block)};
    case GridRule::TokenTilesByColumns:
      return {ceil_div(call.tokens, rule.token_tile), ceil_div(rule.columns, rule.per_block)};
    case GridRule::RanksOfGroup:
    case GridRule::SlabRowsByColumns: break;  // the exchange's, not a layer call's (exchange_grid)
  }
  throw Error("moejit internal error: a layer call's kernel with an exchange's launch rule");
}

}  // namespace

CallPlan plan_call(const Plan& plan, Entry entry, int64_t tokens, bool quantized_hidden) {
  const LayerSpec& c = plan.spec;
  CallPlan call;
  call.entry = entry;
  call.tokens = tokens;
  call.pairs = tokens * c.pair_slots();  // the fused shared experts' slots too
  auto add = [&](KernelRole role, int kernel) {
    if (kernel < 0 || call.count == kMaxCallSteps)
      throw Error(fmt::format("moejit internal error: no {} kernel in the plan, or too many launches",
                              to_string(role)));
    call.steps[static_cast<size_t>(call.count++)] = {role, kernel, {}};
  };
  auto add_role = [&](KernelRole role) { add(role, plan.kernel_index(role)); };
  if (entry == Entry::Route) {
    add_role(KernelRole::Routing);
  } else {
    call.bucket = &plan.bucket_for(tokens);
    call.row_tiles = max_row_tiles(c, tokens, call.bucket->gemm1.bm);
    // The index steps fit one block (route_index.cuh) when every pair is in the first index block;
    // forward() also routes there when the batch is small.
    const bool single_block_index = call.pairs <= kPairsPerIndexBlock;
    const bool fused = entry == Entry::Forward ? single_block_index && tokens <= kFusedRouteIndexMaxTokens
                                               : single_block_index;
    // A router_gemm layer's forward() computes the logits first; routing reads them.
    if (entry == Entry::Forward && c.router_gemm) add(KernelRole::RouterGemm, call.bucket->router_kernel);
    if (fused) {
      add_role(KernelRole::RouteIndex);
    } else {
      if (entry == Entry::Forward) add_role(KernelRole::Routing);
      add_role(KernelRole::IndexCount);
      add_role(KernelRole::IndexScatter);
    }
    const bool quantized = is_quantized(c.quant);
    if (quantized_hidden && (entry != Entry::Experts || !is_fp8(c.quant)))
      throw Error("moejit internal error: quantized hidden rows outside an fp8 layer's experts()");
    if (quantized && !quantized_hidden) add_role(KernelRole::QuantizeExpand);
    add(KernelRole::Gemm1, call.bucket->gemm1_kernel);
    if (quantized && !gemm1_quantizes_output(c, call.bucket->gemm1)) add_role(KernelRole::QuantizeAct);
    add(KernelRole::Gemm2, call.bucket->gemm2_kernel);
    add_role(KernelRole::Combine);
  }
  for (int i = 0; i < call.count; ++i) {
    CallStep& step = call.steps[static_cast<size_t>(i)];
    step.grid = grid_of(plan.kernels[static_cast<size_t>(step.kernel)].launch, call);
  }
  return call;
}

KernelArgs pack_args(const CallStep& step, const CallContext& context) {
  switch (step.role) {
    case KernelRole::RouterGemm: return router_gemm_args(context);
    case KernelRole::Routing: return routing_args(context);
    case KernelRole::IndexCount:
    case KernelRole::IndexScatter: return index_args(context);
    case KernelRole::RouteIndex: return route_index_args(context);
    case KernelRole::QuantizeExpand: return quantize_expand_args(context);
    case KernelRole::QuantizeAct: return quantize_act_args(context);
    case KernelRole::Gemm1: return gemm1_args(context);
    case KernelRole::Gemm2: return gemm2_args(context);
    case KernelRole::Combine: return combine_args(context);
    case KernelRole::ExchangeSlots:
    case KernelRole::ExchangePack:
    case KernelRole::ExchangeCombine: break;  // not a layer call's (runtime/exchange_kernels.h)
  }
  throw Error("moejit internal error: a kernel role without arguments");
}

}  // namespace moejit
