#include "compiler/plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/families/index.h"

namespace moejit {

std::string_view to_string(Stage stage) {
  switch (stage) {
    case Stage::Routing: return "routing";
    case Stage::Index: return "index";
    case Stage::Expand: return "expand";
    case Stage::Gemm1: return "gemm1";
    case Stage::Gemm2: return "gemm2";
    case Stage::Combine: return "combine";
    case Stage::Exchange: return "exchange";
  }
  return "?";
}

const std::vector<Stage>& all_stages() {
  static const std::vector<Stage> stages = {Stage::Routing, Stage::Index, Stage::Expand,
                                            Stage::Gemm1,   Stage::Gemm2, Stage::Combine};
  return stages;
}

Stage parse_stage(std::string_view name) {
  for (Stage s : all_stages())
    if (to_string(s) == name) return s;
  if (name == to_string(Stage::Exchange)) return Stage::Exchange;
  throw InvalidInput(fmt::format(
      "stage: '{}' is unknown; allowed values: routing, index, expand, gemm1, gemm2, combine, exchange", shown(name)));
}

std::string_view to_string(KernelRole role) {
  switch (role) {
    case KernelRole::Routing: return "routing";
    case KernelRole::IndexCount: return "index_count";
    case KernelRole::IndexScatter: return "index_scatter";
    case KernelRole::RouteIndex: return "route_index";
    case KernelRole::RouterGemm: return "router_gemm";
    case KernelRole::QuantizeExpand: return "quantize_expand";
    case KernelRole::QuantizeAct: return "quantize_act";
    case KernelRole::Gemm1: return "gemm1";
    case KernelRole::Gemm2: return "gemm2";
    case KernelRole::Combine: return "combine";
    case KernelRole::ExchangeSlots: return "exchange_slots";
    case KernelRole::ExchangePack: return "exchange_pack";
    case KernelRole::ExchangeCombine: return "exchange_combine";
  }
  return "?";
}

std::string_view to_string(GridRule rule) {
  switch (rule) {
    case GridRule::TokensPerBlock: return "ceil(T / per_block) blocks";
    case GridRule::PairsPerBlock: return "ceil(T*K / per_block) blocks";
    case GridRule::PairBlocksCapped: {
      static const std::string text = fmt::format("min(ceil(T*K / per_block), {}) blocks", kMaxIndexScatterBlocks);
      return text;
    }
    case GridRule::SingleBlock: return "1 block";
    case GridRule::SortedRows: return "T*K blocks (one per sorted row)";
    case GridRule::RowTilesByColumns: return "(max_row_tiles(T), ceil(N / per_block)) blocks";
    case GridRule::RowTileGroups: return "max_row_tiles(T) * ceil(N / per_block) blocks, grouped";
    case GridRule::TokensByColumns: return "(T, ceil(H / per_block)) blocks";
    case GridRule::TokenTilesByColumns: return "(ceil(T / token_tile), ceil(E / per_block)) blocks";
    case GridRule::RanksOfGroup: return "ep_size blocks";
    case GridRule::SlabRowsByColumns: return "(ep_size * C, ceil(H / per_block)) blocks";
  }
  return "?";
}

std::string_view to_string(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::Simt: return "simt";
    case GemmKernel::TensorCore: return "tensor-core";
    case GemmKernel::Wgmma: return "wgmma";
  }
  return "?";
}

std::string_view to_string(BucketKind kind) {
  switch (kind) {
    case BucketKind::Decode: return "decode";
    case BucketKind::Mid: return "mid";
    case BucketKind::Short: return "short";
    case BucketKind::Wide: return "wide";
    case BucketKind::Prefill: return "prefill";
  }
  return "?";
}

std::string describe(const TileShape& t) {
  std::string out = fmt::format("{}x{}x{}", t.bm, t.bn, t.bk);
  if (t.kernel == GemmKernel::TensorCore)
    out += fmt::format(" ({}, {} stages, {}x{} warps)", to_string(t.kernel), t.stages, t.warps_m, t.warps_n);
  else if (t.kernel == GemmKernel::Wgmma)
    out += fmt::format(" ({}, {} stages)", to_string(t.kernel), t.stages);
  else
    out += fmt::format(" ({})", to_string(t.kernel));
  return out;
}

const TokenBucket& Plan::bucket_for(int64_t tokens) const {
  for (const auto& b : buckets)
    if (tokens <= b.max_tokens) return b;
  return buckets.back();
}

const KernelPlan& Plan::kernel(std::string_view entry) const {
  for (const auto& k : kernels)
    if (k.entry == entry) return k;
  throw Error(fmt::format("moejit internal error: the plan has no kernel named {}", entry));
}

const KernelPlan& Plan::kernel_of(const TokenBucket& bucket, bool gemm1) const {
  return kernels.at(static_cast<size_t>(gemm1 ? bucket.gemm1_kernel : bucket.gemm2_kernel));
}

int Plan::kernel_index(KernelRole role) const {
  for (size_t i = 0; i < kernels.size(); ++i)
    if (kernels[i].role == role) return static_cast<int>(i);
  return -1;
}

std::vector<std::string> Plan::unit_names() const {
  std::vector<std::string> names;
  for (const auto& k : kernels)
    if (std::find(names.begin(), names.end(), k.unit) == names.end()) names.push_back(k.unit);
  return names;
}

}  // namespace moejit
