#include "compiler/planner.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/families/combine.h"
#include "compiler/families/grouped_gemm.h"
#include "compiler/families/index.h"
#include "compiler/families/quantize.h"
#include "compiler/families/route_index.h"
#include "compiler/families/router_gemm.h"
#include "compiler/families/routing.h"
#include "compiler/families/spec_text.h"
#include "compiler/workspace.h"

namespace moejit {
namespace {

// Replaces the buckets' tiles by the overrides, refusing what does not fit.
void apply_overrides(const LayerSpec& spec, const std::string& arch, const std::vector<TileOverride>& overrides,
                     std::vector<TokenBucket>& buckets) {
  for (const auto& o : overrides) {
    auto b = std::find_if(buckets.begin(), buckets.end(), [&](const auto& x) { return x.name() == o.bucket; });
    const std::string entry = fmt::format("{}.gemm{}={}", o.bucket, o.gemm1 ? 1 : 2, describe(o.tile));
    if (b == buckets.end()) {
      std::string names;
      for (const auto& x : buckets) names += (names.empty() ? "" : ", ") + std::string(x.name());
      throw InvalidInput(fmt::format("tiles: '{}' names no bucket; allowed: {}", shown(entry), names));
    }
    const std::string problem = tile_problem(spec, o.gemm1, o.tile, arch);
    if (!problem.empty()) throw InvalidInput(fmt::format("tiles: '{}' {}", entry, problem));
    (o.gemm1 ? b->gemm1 : b->gemm2) = o.tile;
  }
  for (const auto& b : buckets)
    if (b.gemm1.bm != b.gemm2.bm)
      throw InvalidInput(fmt::format("tiles: bucket {} has GEMM 1 row tile {} and GEMM 2 row tile {}; they share one "
                                     "tile schedule, so they must be equal",
                                     b.name(), b.gemm1.bm, b.gemm2.bm));
}

// Appends `k` unless a kernel of the same entry is there; returns its index.
int add_once(std::vector<KernelPlan>& kernels, KernelPlan k) {
  for (size_t i = 0; i < kernels.size(); ++i)
    if (kernels[i].entry == k.entry) return static_cast<int>(i);
  kernels.push_back(std::move(k));
  return static_cast<int>(kernels.size()) - 1;
}

}  // namespace

Plan make_plan(const LayerSpec& spec, const std::string& arch, const std::vector<TileOverride>& overrides) {
  validate(spec);
  Plan plan;
  plan.spec = spec;
  plan.arch = arch;
  plan.buckets = plan_buckets(spec, arch);
  apply_overrides(spec, arch, overrides, plan.buckets);
  // Stage order; each bucket's GEMMs once per distinct tiling.
  if (spec.router_gemm)
    for (auto& b : plan.buckets) b.router_kernel = add_once(plan.kernels, router_gemm_kernel(spec, b.kind));
  plan.kernels.push_back(routing_kernel(spec));
  for (auto& k : index_kernels(spec)) plan.kernels.push_back(std::move(k));
  plan.kernels.push_back(route_index_kernel(spec));
  const bool quant = is_quantized(spec.quant);
  std::vector<KernelPlan> quantize;
  if (quant) quantize = quantize_kernels(spec);
  if (quant) plan.kernels.push_back(quantize[0]);
  for (auto& b : plan.buckets) {
    b.gemm1_kernel = add_once(plan.kernels, gemm_kernel(spec, true, b.gemm1));
  }
  if (quant) plan.kernels.push_back(quantize[1]);
  for (auto& b : plan.buckets) {
    b.gemm2_kernel = add_once(plan.kernels, gemm_kernel(spec, false, b.gemm2));
  }
  plan.kernels.push_back(combine_kernel(spec));
  for (auto& k : plan.kernels)
    if (k.spec_name.empty()) k.spec_name = "Spec_" + k.entry.substr(std::string("moejit_").size());
  return plan;
}

std::string describe(const Plan& plan, const Placement& placement, int64_t max_tokens) {
  const LayerSpec& c = plan.spec;
  std::string out = fmt::format("plan for arch {}: E={} K={} E_loc={} (first local expert {}){} H={} I={} {}{}\n",
                                plan.arch, c.experts, c.topk, c.local_experts(), first_local_expert(c, placement),
                                c.shared_slots() > 0
                                    ? fmt::format(" S={} fused shared experts (local experts {}..{}, on ep_rank 0)",
                                                  c.shared_slots(), c.local_experts(), c.gemm_experts() - 1)
                                    : "",
                                c.hidden, c.local_intermediate(), spec_text::data_tag(c),
                                c.tp_size > 1 ? fmt::format(" (tp {}/{})", placement.tp_rank, c.tp_size) : "");
  out += "token buckets:\n";
  for (const auto& b : plan.buckets) {
    std::string range = b.max_tokens == std::numeric_limits<int64_t>::max()
                            ? fmt::format("T >= {}", b.min_tokens)
                            : fmt::format("{} <= T <= {}", b.min_tokens, b.max_tokens);
    out += fmt::format("  {:<8} {:<18} gemm1 tile {}  gemm2 tile {}{}\n", b.name(), range, describe(b.gemm1),
                       describe(b.gemm2),
                       b.router_kernel >= 0 ? "  router " + plan.kernels[static_cast<size_t>(b.router_kernel)].entry : "");
  }
  out += "kernels:\n";
  for (const auto& k : plan.kernels)
    out += fmt::format("  {:<8} {:<8} {}  [{} threads, {}{}{}{}]\n", to_string(k.stage), k.unit, k.entry,
                       k.launch.threads, to_string(k.launch.rule),
                       k.launch.per_block > 1 ? fmt::format(", per_block {}", k.launch.per_block) : "",
                       k.launch.token_tile > 0 ? fmt::format(", token_tile {}", k.launch.token_tile) : "",
                       k.launch.shared_bytes > 0 ? fmt::format(", {} bytes dynamic shared", k.launch.shared_bytes) : "");
  WorkspaceLayout ws = plan_workspace(c, max_tokens);
  out += fmt::format("workspace for max_tokens {}: {} bytes\n", max_tokens, ws.total_bytes);
  for (const auto& b : ws.buffers)
    out += fmt::format("  {:<15} offset {:>12}  bytes {:>12}  {}\n", b.name, b.offset, b.bytes, b.what);
  return out;
}

}  // namespace moejit
