#include "compiler/families/index.h"

#include <fmt/format.h>

#include "compiler/families/spec_text.h"

namespace moejit {

std::vector<KernelPlan> index_kernels(const LayerSpec& c) {
  std::vector<KernelPlan> out;
  const std::vector<SpecItem> spec = {
      {"int", "kLocalExperts", std::to_string(c.gemm_experts())},
      {"int", "kPairsPerBlock", std::to_string(kPairsPerIndexBlock)},
      {"int", "kIndexWarps", std::to_string(kIndexWarps)},
      {"int", "kRoutedExperts", std::to_string(c.local_experts())},
      {"int", "kTopk", std::to_string(c.topk)},
      {"int", "kSharedSlots", std::to_string(c.shared_slots())},
  };
  // Without fused shared experts the index does not depend on K: one name for every topk.
  const std::string tag = c.shared_slots() > 0
                              ? fmt::format("e{}_k{}{}", c.local_experts(), c.topk, spec_text::shared_suffix(c))
                              : fmt::format("e{}", c.local_experts());
  struct Step {
    const char* name;
    KernelRole role;
    LaunchRule launch;
  };
  const Step steps[] = {
      {"count", KernelRole::IndexCount, {GridRule::PairsPerBlock, 32 * kIndexWarps, kPairsPerIndexBlock}},
      {"scatter", KernelRole::IndexScatter, {GridRule::PairBlocksCapped, 32 * kIndexWarps, kPairsPerIndexBlock}},
  };
  for (const auto& step : steps) {
    KernelPlan k;
    k.stage = Stage::Index;
    k.role = step.role;
    k.entry = fmt::format("moejit_index_{}_{}", step.name, tag);
    k.unit = "index";
    k.device_function = fmt::format("moejit::index_{}", step.name);
    k.args_type = "moejit::IndexArgs";
    k.header = "moejit/index.cuh";
    k.spec_name = fmt::format("IndexSpec_{}", tag);
    k.spec = spec;
    k.launch = step.launch;
    out.push_back(std::move(k));
  }
  return out;
}

IndexArgs index_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  const WorkspaceOffsets& o = b.offsets;
  return IndexArgs{b.topk_ids,
                   x.call.pairs,
                   first_local_expert(x.spec, x.placement),
                   x.call.bucket->gemm1.bm,
                   b.at<int>(o.block_counts),
                   b.at<int>(o.expert_counts),
                   b.at<int>(o.expert_offsets),
                   b.at<int>(o.sorted_pair),
                   b.at<int>(o.pair_pos),
                   b.at<int>(o.tile_expert),
                   b.at<int>(o.tile_row),
                   b.at<int>(o.num_tiles),
                   // The fused shared experts are computed once over an expert-parallel group: on rank 0.
                   x.placement.ep_rank == 0 ? 1 : 0};
}

}  // namespace moejit
