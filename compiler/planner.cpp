// The planner: from a validated MoeConfig to the kernels of one layer, their Spec constants,
// tiles per token bucket and launch rules. Everything here is a closed-form function of the
// config, so the same config always gives the same plan and the same generated source.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/plan.h"

namespace moejit {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kQuantizeThreads = 256;
constexpr int kCombineThreads = 128;
constexpr int kGemmThreads = 256;
// Row tiles per rasterization group of the tensor-core GEMMs (mma_gemm.cuh): 8 tiles of 128 rows
// of one expert share each weight tile while resident together.
constexpr int kGemmGroupRows = 8;
constexpr int64_t kWorkspaceAlign = 256;

// Device type names as the templates spell them.
std::string device_type(DType t) {
  switch (t) {
    case DType::BF16: return "__nv_bfloat16";
    case DType::FP16: return "__half";
    case DType::FP32: return "float";
  }
  return "?";
}

std::string boolean(bool v) { return v ? "true" : "false"; }

// A float literal that NVRTC reads back as exactly the float nearest to `v`.
std::string float_literal(double v) {
  std::string s = fmt::format("{:.9g}", static_cast<float>(v));
  if (s.find_first_of(".e") == std::string::npos) s += ".0";  // "1f" would not be a float literal
  return s + "f";
}

// "2.827" -> "2p827": a value spelled inside an identifier.
std::string identifier_number(double v) {
  std::string s = fmt::format("{:g}", v);
  std::replace(s.begin(), s.end(), '.', 'p');
  std::replace(s.begin(), s.end(), '-', 'm');
  std::replace(s.begin(), s.end(), '+', '_');
  return s;
}

std::string activation_tag(const MoeConfig& c) {
  return fmt::format("{}{}", to_string(c.activation), c.gated ? "_gated" : "");
}

std::string act_kind(Activation a) {
  switch (a) {
    case Activation::Silu: return "moejit::kSilu";
    case Activation::Gelu: return "moejit::kGelu";
    case Activation::GeluTanh: return "moejit::kGeluTanh";
  }
  return "?";
}

std::string data_tag(const MoeConfig& c) {
  return c.quant == Quant::W8A8Int8 ? fmt::format("w8a8_{}", to_string(c.dtype)) : std::string(to_string(c.dtype));
}

KernelPlan routing_kernel(const MoeConfig& c) {
  const bool noaux = c.topk_method == TopkMethod::NoauxTc;
  KernelPlan k;
  k.stage = Stage::Routing;
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

std::vector<KernelPlan> index_kernels(const MoeConfig& c) {
  std::vector<KernelPlan> out;
  const std::vector<SpecItem> spec = {
      {"int", "kLocalExperts", std::to_string(c.local_experts())},
      {"int", "kPairsPerBlock", std::to_string(kPairsPerIndexBlock)},
      {"int", "kIndexWarps", std::to_string(kIndexWarps)},
  };
  struct Step {
    const char* name;
    LaunchRule launch;
  };
  const Step steps[] = {
      {"count", {GridRule::PairsPerBlock, 32 * kIndexWarps, kPairsPerIndexBlock}},
      {"scatter", {GridRule::PairBlocksCapped, 32 * kIndexWarps, kPairsPerIndexBlock}},
  };
  for (const auto& step : steps) {
    KernelPlan k;
    k.stage = Stage::Index;
    k.entry = fmt::format("moejit_index_{}_e{}", step.name, c.local_experts());
    k.unit = "index";
    k.device_function = fmt::format("moejit::index_{}", step.name);
    k.args_type = "moejit::IndexArgs";
    k.header = "moejit/index.cuh";
    k.spec_name = fmt::format("IndexSpec_e{}", c.local_experts());
    k.spec = spec;
    k.launch = step.launch;
    out.push_back(std::move(k));
  }
  return out;
}

// w8a8 only: stage 3 (gather + smooth + quantize hidden) and the re-quantization of GEMM 1's
// output. Both are per-row reductions, one kernel template.
std::vector<KernelPlan> quantize_kernels(const MoeConfig& c) {
  std::vector<KernelPlan> out;
  auto make = [&](bool expand) {
    KernelPlan k;
    k.stage = expand ? Stage::Expand : Stage::Gemm1;
    const int64_t cols = expand ? c.hidden : c.local_intermediate();
    k.entry = expand ? fmt::format("moejit_quantize_expand_h{}_k{}_e{}_{}", cols, c.topk, c.local_experts(),
                                   to_string(c.dtype))
                     : fmt::format("moejit_quantize_act_i{}_e{}", cols, c.local_experts());
    k.unit = "quantize";
    k.device_function = "moejit::quantize_rows";
    k.args_type = "moejit::QuantizeArgs";
    k.header = "moejit/quantize.cuh";
    k.spec = {
        {"using", "Src", expand ? device_type(c.dtype) : "float"},
        {"int", "kCols", std::to_string(cols)},
        {"int", "kThreads", std::to_string(kQuantizeThreads)},
        {"int", "kTopk", std::to_string(c.topk)},
        {"int", "kLocalExperts", std::to_string(c.local_experts())},
        {"bool", "kGather", boolean(expand)},
    };
    k.launch = {GridRule::SortedRows, kQuantizeThreads, 1};
    return k;
  };
  out.push_back(make(true));
  out.push_back(make(false));
  return out;
}

// The tensor-core GEMMs need 16-bit operands, the nk layout (k contiguous, as mma's B operand
// wants) and rows that split into 16-byte chunks.
bool tensor_core_eligible(const MoeConfig& c) {
  return (c.dtype == DType::BF16 || c.dtype == DType::FP16) && c.quant == Quant::None &&
         c.weight_layout == WeightLayout::NK && c.hidden % 8 == 0 && c.local_intermediate() % 8 == 0;
}

// Dynamic shared memory of a tensor-core GEMM (mma_gemm.cuh, wgmma_gemm.cuh): kStages stages of
// the 16-bit A and weight tiles (gated GEMM 1 holds 2 * BN weight rows), then one 8-byte source
// row index per A row; wgmma also two 8-byte mbarriers per stage and 1024 bytes to align its tiles
// to the swizzle period.
int tensor_core_shared_bytes(const MoeConfig& c, bool gemm1, const TileShape& t) {
  const int weight_rows = (gemm1 && c.gated ? 2 : 1) * t.bn;
  const int pipeline = t.stages * (t.bm + weight_rows) * t.bk * 2 + t.bm * 8;
  return pipeline + (t.kernel == GemmKernel::Wgmma ? t.stages * 16 + 1024 : 0);
}

// A wgmma tile: a consumer warpgroup per 64 rows and one producer warpgroup
// (warps_m = bm / 16 + 4 warps in one column).
TileShape wgmma_tile(int bm, int bn, int stages) { return {GemmKernel::Wgmma, bm, bn, 64, bm / 16 + 4, 1, stages}; }

KernelPlan gemm_kernel(const MoeConfig& c, bool gemm1, const TileShape& tile) {
  const bool quant = c.quant == Quant::W8A8Int8;
  const bool tensor_core = tile.kernel != GemmKernel::Simt;
  const bool wgmma = tile.kernel == GemmKernel::Wgmma;
  const int64_t n = gemm1 ? c.local_intermediate() : c.hidden;
  const int64_t k_len = gemm1 ? c.hidden : c.local_intermediate();
  KernelPlan k;
  k.stage = gemm1 ? Stage::Gemm1 : Stage::Gemm2;
  k.entry = fmt::format("moejit_gemm{}_e{}_n{}_k{}{}_{}_{}_m{}n{}k{}", gemm1 ? 1 : 2, c.local_experts(), n,
                        k_len, gemm1 ? "_" + activation_tag(c) : "", data_tag(c), to_string(c.weight_layout),
                        tile.bm, tile.bn, tile.bk);
  if (wgmma)
    k.entry += fmt::format("_wg_s{}", tile.stages);
  else if (tensor_core)
    k.entry += fmt::format("_tc_s{}w{}x{}", tile.stages, tile.warps_m, tile.warps_n);
  k.unit = "experts";
  k.args_type = "moejit::GemmArgs";
  // GEMM 1 reads hidden rows through the gather unless w8a8 quantized them into sorted order.
  std::string a_type = quant ? "signed char" : device_type(c.dtype);
  // w8a8 GEMM 1 stores fp32 for the re-quantization; everything else stores the model dtype.
  std::string out_type = (quant && gemm1) ? "float" : device_type(c.dtype);
  const bool gated = gemm1 && c.gated;
  if (tensor_core) {
    const int threads = 32 * tile.warps_m * tile.warps_n;
    const int shared = tensor_core_shared_bytes(c, gemm1, tile);
    k.device_function = wgmma ? "moejit::grouped_gemm_wgmma" : "moejit::grouped_gemm_mma";
    k.header = wgmma ? "moejit/wgmma_gemm.cuh" : "moejit/mma_gemm.cuh";
    k.spec = {
        {"using", "A", a_type},
        {"using", "W", a_type},
        {"using", "Out", out_type},
        {"int", "kBM", std::to_string(tile.bm)},
        {"int", "kBN", std::to_string(tile.bn)},
        {"int", "kBK", std::to_string(tile.bk)},
        {"int", "kStages", std::to_string(tile.stages)},
        {"int", "kWarpsM", std::to_string(tile.warps_m)},
        {"int", "kWarpsN", std::to_string(tile.warps_n)},
        {"int", "kGroupRows", std::to_string(kGemmGroupRows)},
        {"int", "kSharedBytes", std::to_string(shared)},
        {"long long", "kN", std::to_string(n)},
        {"long long", "kK", std::to_string(k_len)},
        {"bool", "kGemm1", boolean(gemm1)},
        {"bool", "kGated", boolean(gated)},
        {"int", "kAct", act_kind(c.activation)},
        {"bool", "kGather", boolean(gemm1)},
        {"int", "kTopk", std::to_string(c.topk)},
        {"bool", "kWeightsBeforeWait", boolean(!gemm1)},
    };
    k.launch = {GridRule::RowTileGroups, threads, tile.bn, shared};
    // GEMM 2's schedule and weights come from kernels two or more launches back, so it starts its
    // weight copies while GEMM 1 (the kernel before it) still runs (kWeightsBeforeWait).
    k.waits_in_body = !gemm1;
    return k;
  }
  k.device_function = "moejit::grouped_gemm";
  k.header = "moejit/grouped_gemm.cuh";
  k.spec = {
      {"using", "A", a_type},
      {"using", "W", quant ? "signed char" : device_type(c.dtype)},
      {"using", "Out", out_type},
      {"using", "Acc", quant ? "int" : "float"},
      {"int", "kBM", std::to_string(tile.bm)},
      {"int", "kBN", std::to_string(tile.bn)},
      {"int", "kBK", std::to_string(tile.bk)},
      {"int", "kThreads", std::to_string(kGemmThreads)},
      {"long long", "kN", std::to_string(n)},
      {"long long", "kK", std::to_string(k_len)},
      {"bool", "kGemm1", boolean(gemm1)},
      {"bool", "kGated", boolean(gated)},
      {"int", "kAct", act_kind(c.activation)},
      {"bool", "kGather", boolean(gemm1 && !quant)},
      {"int", "kTopk", std::to_string(c.topk)},
      {"bool", "kLayoutNK", boolean(c.weight_layout == WeightLayout::NK)},
      {"bool", "kQuant", boolean(quant)},
  };
  k.launch = {GridRule::RowTilesByColumns, kGemmThreads, tile.bn};
  return k;
}

// Routing and index in one block (route_index.cuh), for small batches: the routing Spec and the
// index Spec in one struct, and as many routing warps as 32 KiB of score rows allow, up to 8
// (NOTES: with 16 warps NVRTC's ptxas spilled this kernel for E = 128; with 8 it does not).
KernelPlan route_index_kernel(const MoeConfig& c) {
  KernelPlan k = routing_kernel(c);
  k.stage = Stage::Index;
  k.entry = "moejit_route_index_" + k.entry.substr(std::string("moejit_route_").size()) +
            fmt::format("_eloc{}", c.local_experts());
  k.unit = "index";
  k.device_function = "moejit::route_and_index";
  k.args_type = "moejit::RouteIndexArgs";
  k.header = "moejit/route_index.cuh";
  const int warps = static_cast<int>(std::clamp<int64_t>(4096 / c.experts, 4, 8));
  for (auto& item : k.spec)
    if (item.name == "kWarps") item.value = std::to_string(warps);
  k.spec.push_back({"int", "kLocalExperts", std::to_string(c.local_experts())});
  k.spec.push_back({"int", "kPairsPerBlock", std::to_string(kPairsPerIndexBlock)});
  k.launch = {GridRule::SingleBlock, warps * 32, 1};
  return k;
}

KernelPlan combine_kernel(const MoeConfig& c) {
  // 16-byte accesses when the hidden size splits into them.
  const int vec_full = 16 / static_cast<int>(dtype_bytes(c.dtype));
  const int vec = c.hidden % vec_full == 0 ? vec_full : 1;
  KernelPlan k;
  k.stage = Stage::Combine;
  k.entry = fmt::format("moejit_combine_h{}_k{}_{}", c.hidden, c.topk, to_string(c.dtype));
  k.unit = "combine";
  k.device_function = "moejit::combine_tokens";
  k.args_type = "moejit::CombineArgs";
  k.header = "moejit/combine.cuh";
  k.spec = {
      {"using", "Y", device_type(c.dtype)},
      {"using", "Out", device_type(c.dtype)},
      {"int", "kHidden", std::to_string(c.hidden)},
      {"int", "kTopk", std::to_string(c.topk)},
      {"int", "kThreads", std::to_string(kCombineThreads)},
      {"int", "kVec", std::to_string(vec)},
  };
  k.launch = {GridRule::TokensByColumns, kCombineThreads, int64_t{kCombineThreads} * vec};
  // The token's slots (pair_pos, topk_weights) come from kernels two or more launches back, so the
  // combine reads them while GEMM 2 still runs and waits for it only before Y's loads.
  k.waits_in_body = true;
  return k;
}

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// The shortest GEMM row tile (BM) of any plan.
constexpr int kMinRowTile = 16;

// Token counts each bucket is tiled for (plan_buckets).
constexpr int64_t kDecodeTokens = 16, kMidTokens = 256, kPrefillTokens = 4096;

// The row tile for a representative T: with uniform routing a local expert sees about T*K/E_loc
// rows, and the tile is the power of two that covers that, 16 to 128, so decode wastes few
// padding rows and prefill reuses each weight tile across many rows.
int row_tile_height(const MoeConfig& c, int64_t representative_tokens) {
  const double rows = static_cast<double>(representative_tokens) * c.topk / c.local_experts();
  int bm = 16;
  while (bm < 128 && bm < rows) bm *= 2;
  return bm;
}

// The token counts [first, last] at or above `from` that get 192-row tiles (three wgmma consumer
// warpgroups), or {0, -1} when there are none (the band is an interval: rows grow with T).
// With uniform routing an expert's rows at T tokens are about Poisson(r = T*K/E_loc). 128-row tiles
// give an expert past 128 rows a second tile of a few rows that streams its whole weight slice again;
// one 192-row tile holds it while nearly every expert stays within 192 (r + 2 sqrt r <= 192). Measured
// on the H200 (bench/RESULTS.md, 2026-12-01), 192 x 192 against 128 x 256: at r = 128 (half the
// experts spill) -10% for DeepSeek-V3 T=4096 and -6.5% for Qwen3-30B-A3B T=2048, at r = 150 (all
// spill) -13% for Mixtral T=600; where neither height saves a tile +2..+8% (DeepSeek-V3 T = 600..2048
// and 8192, Qwen3 T = 600..1536 and 4096, Mixtral T=1024 and 4096), +30% at Mixtral T=900 (r = 225:
// two tiles either way and 4/3 the column tiles); Mixtral T=1536 and 2048 (r = 384, 512) 0 and -5%,
// left on 128 rows. At the low edge (bench/sweeps/band_edge.txt, Qwen3 two rounds each) 192 rows lose
// 6.9% at r = 110, 4.1% at r = 116 and 0.7% at r = 122; so the band starts where about 30% of the
// experts spill past 128, r + 0.5 sqrt r > 128 (r > 122.5).
std::pair<int64_t, int64_t> wide_row_band(const MoeConfig& c, int64_t from) {
  auto rows = [&](int64_t t) { return static_cast<double>(t) * c.topk / c.local_experts(); };
  // The first T in [lo, hi] where `passes` holds (it holds for every T after it), else hi + 1.
  auto first_where = [](int64_t lo, int64_t hi, auto passes) {
    while (lo <= hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (passes(mid)) hi = mid - 1; else lo = mid + 1;
    }
    return lo;
  };
  // 193 rows per expert pass 192 already, so the band ends below this T.
  const int64_t beyond = 193 * static_cast<int64_t>(c.local_experts()) / c.topk + 1;
  const int64_t first = first_where(from, beyond, [&](int64_t t) { return rows(t) + 0.5 * std::sqrt(rows(t)) > 128; });
  const int64_t last = first_where(from, beyond, [&](int64_t t) { return rows(t) + 2 * std::sqrt(rows(t)) > 192; }) - 1;
  if (first > last) return {0, -1};
  return {first, last};
}

// Tensor-core tile for row tile height bm. Decode-sized tiles (bm 16, 32) keep few weight rows per
// block so that even a handful of active experts spread over every SM, and pipeline deeper so that
// each SM keeps enough weight bytes in flight to stream at HBM speed; in the decode bucket itself
// (a few rows per expert) the narrowest, deepest one. Prefill-sized tiles take many weight rows
// for operand reuse: at bm 128 a 64x64 warp tile (128 fp32 accumulators, 232 registers, no
// spills). Every shape gives each warp an even number of 8-column fragments.
// Measured on the H200 (bench/RESULTS.md, tile sweep): at T=4096 the 128 x 256-row tile beat
// 128 x 128 rows by 11-12%; in decode the 32-row, 8-stage tile matched or beat 64 rows by up to 5%.
TileShape tensor_core_tile(const MoeConfig& c, int bm, bool gemm1, bool decode_bucket) {
  TileShape t;
  t.kernel = GemmKernel::TensorCore;
  t.bm = bm;
  t.bk = 64;
  int weight_rows = 0;
  if (bm == 16 && decode_bucket) {
    t.warps_m = 1, t.warps_n = 2, t.stages = 8, weight_rows = 32;
  } else if (bm == 16) {
    t.warps_m = 1, t.warps_n = 4, t.stages = 6, weight_rows = 64;
  } else if (bm == 32) {
    t.warps_m = 2, t.warps_n = 2, t.stages = 5, weight_rows = 64;
  } else if (bm == 64) {
    t.warps_m = 2, t.warps_n = 2, t.stages = 4, weight_rows = 128;
  } else {
    t.warps_m = 2, t.warps_n = 4, t.stages = 3, weight_rows = 256;
  }
  t.bn = (gemm1 && c.gated) ? weight_rows / 2 : weight_rows;
  return t;
}

}  // namespace

std::string_view to_string(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::Simt: return "simt";
    case GemmKernel::TensorCore: return "tensor-core";
    case GemmKernel::Wgmma: return "wgmma";
  }
  return "?";
}

bool wgmma_arch(const std::string& arch) { return arch == "sm_90a"; }

std::string_view to_string(Stage stage) {
  switch (stage) {
    case Stage::Routing: return "routing";
    case Stage::Index: return "index";
    case Stage::Expand: return "expand";
    case Stage::Gemm1: return "gemm1";
    case Stage::Gemm2: return "gemm2";
    case Stage::Combine: return "combine";
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
  throw InvalidInput(fmt::format(
      "stage: '{}' is unknown; allowed values: routing, index, expand, gemm1, gemm2, combine", name));
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
  }
  return "?";
}

std::vector<TokenBucket> plan_buckets(const MoeConfig& c, const std::string& arch) {
  struct Range {
    const char* name;
    int64_t min, max, tuned;
    int64_t representative;  // the T whose rows per expert choose the tile
    bool wide = false;       // 192-row wgmma tiles
  };
  constexpr int64_t kLast = std::numeric_limits<int64_t>::max();
  std::vector<Range> ranges = {{"decode", 1, 32, kDecodeTokens, kDecodeTokens},
                               {"mid", 33, 512, kMidTokens, kMidTokens},
                               {"prefill", 513, kLast, kPrefillTokens, kPrefillTokens}};
  // On sm_90a the prefill range splits around the band of T that takes 192-row tiles
  // (wide_row_band): "short" below it, "wide" in it, "prefill" above it. "short" and "prefill" keep
  // the prefill range's 128-row tiles (chosen at T=4096); each bucket is autotuned at a T inside it.
  const auto [first, last] = wide_row_band(c, 513);
  if (tensor_core_eligible(c) && wgmma_arch(arch) && row_tile_height(c, kPrefillTokens) == 128 && first <= last) {
    ranges.pop_back();
    if (first > 513) ranges.push_back({"short", 513, first - 1, std::clamp<int64_t>(kPrefillTokens / 4, 513, first - 1), kPrefillTokens});
    const int64_t rows_128 = 128 * static_cast<int64_t>(c.local_experts()) / c.topk;  // the T of 128 rows per expert
    const int64_t wide_tuned = std::clamp(rows_128, first, last);
    ranges.push_back({"wide", first, last, wide_tuned, wide_tuned, true});
    ranges.push_back({"prefill", last + 1, kLast, std::max(kPrefillTokens, (last + 1) * 3 / 2), kPrefillTokens});
  }
  std::vector<TokenBucket> buckets;
  for (const auto& r : ranges) {
    const int bm = row_tile_height(c, r.representative);
    TokenBucket b;
    b.name = r.name;
    b.min_tokens = r.min;
    b.max_tokens = r.max;
    b.tuned_tokens = r.tuned;
    if (tensor_core_eligible(c) && bm >= 64 && wgmma_arch(arch)) {
      // Row tiles of 64 and 128 on Hopper: warpgroup MMA, 256 weight rows, 4 stages (162 and
      // 194 KiB). Measured on the H200 (bench/RESULTS.md): Mixtral T=4096 8.7 -> 5.2 ms against
      // the best mma.sync tile, T=256 0.98 -> 0.83 ms. The "wide" bucket: 192 x 192, 4 stages
      // (195 KiB).
      if (r.wide) {
        b.gemm1 = wgmma_tile(192, c.gated ? 96 : 192, 4);
        b.gemm2 = wgmma_tile(192, 192, 4);
      } else {
        b.gemm1 = wgmma_tile(bm, c.gated ? 128 : 256, 4);
        b.gemm2 = wgmma_tile(bm, 256, 4);
      }
    } else if (tensor_core_eligible(c)) {
      const bool decode = std::string_view(r.name) == "decode";
      b.gemm1 = tensor_core_tile(c, bm, /*gemm1=*/true, decode);
      b.gemm2 = tensor_core_tile(c, bm, /*gemm1=*/false, decode);
    } else {
      // Gated GEMM 1 keeps two accumulator sets, so it takes the narrower column tile.
      b.gemm1 = {GemmKernel::Simt, bm, 64, bm <= 32 ? 32 : 16};
      b.gemm2 = {GemmKernel::Simt, bm, bm >= 64 ? 128 : 64, bm <= 32 ? 32 : 16};
    }
    buckets.push_back(b);
  }
  return buckets;
}

int64_t max_row_tiles(const MoeConfig& c, int64_t tokens, int bm) {
  const int64_t pairs = tokens * c.topk;
  // Every tile holds at least one row, so there are never more tiles than pairs.
  return std::min(pairs, (pairs + bm - 1) / bm + c.local_experts());
}

namespace {

[[noreturn]] void bad_tile(std::string_view source, std::string_view entry, std::string_view why) {
  throw InvalidInput(fmt::format(
      "{}: '{}' {}; allowed form: <bucket>.<gemm1|gemm2>=tc:<BM>x<BN>x64:s<stages>:w<M>x<N>, "
      "<bucket>.<gemm>=wg:<BM>x<BN>x64:s<stages> (sm_90a) or <bucket>.<gemm>=simt:<BM>x<BN>x<BK>, comma-separated",
      source, entry, why));
}

// Why `t` cannot run GEMM 1 or 2 of `c` on `arch`, or empty when it can.
std::string tile_problem(const MoeConfig& c, bool gemm1, const TileShape& t, const std::string& arch) {
  const int halves = gemm1 && c.gated ? 2 : 1;
  if (t.bm < kMinRowTile || t.bn <= 0 || t.bk <= 0) return "needs BM >= 16 and positive BN, BK";
  if (t.kernel == GemmKernel::Simt) {
    if (t.bm % 16 || t.bn % 16) return "needs BM and BN multiples of 16 (a 16x16 thread grid)";
    if ((t.bm + halves * t.bn) * t.bk * 4 > 48 * 1024) return "needs more than 48 KiB of static shared memory";
    return {};
  }
  if (!tensor_core_eligible(c))
    return "asks for tensor cores, which need bf16/fp16, no quantization, the nk layout and H, I multiples of 8";
  const int threads = 32 * t.warps_m * t.warps_n, weight_rows = halves * t.bn;
  if (t.bk != 64) return "needs BK = 64";
  if (t.kernel == GemmKernel::Wgmma) {
    if (!wgmma_arch(arch)) return fmt::format("asks for wgmma, which needs arch sm_90a (the arch is {})", arch);
    if (t.bm != 64 && t.bm != 128 && t.bm != 192) return "needs BM 64, 128 or 192 (one warpgroup per 64 rows)";
    if (weight_rows != 64 && weight_rows != 128 && weight_rows != 192 && weight_rows != 256)
      return "needs (2 if gated GEMM 1) * BN of 64, 128, 192 or 256 (the wgmma N)";
    if (t.bm == 192 && weight_rows > 192)
      return "needs (2 if gated GEMM 1) * BN of at most 192 at BM 192 (512 threads leave 128 registers each)";
    if (t.stages < 2) return "needs at least 2 stages";
    if (t.warps_m != t.bm / 16 + 4 || t.warps_n != 1) return "needs warps (bm/16 + 4) x 1";
    if (tensor_core_shared_bytes(c, gemm1, t) > 227 * 1024) return "needs more than 227 KiB of shared memory";
    return {};
  }
  if (t.stages < 2) return "needs at least 2 stages";
  if (t.warps_m <= 0 || t.warps_n <= 0 || threads > 1024) return "needs 1 to 32 warps";
  if (t.bm % (16 * t.warps_m)) return "needs BM a multiple of 16 * warps_m";
  if (weight_rows % (16 * t.warps_n)) return "needs (2 if gated GEMM 1) * BN a multiple of 16 * warps_n";
  if ((t.bm * 8) % threads || (weight_rows * 8) % threads) return "needs the tile's 16-byte chunks to split evenly over the threads";
  if (tensor_core_shared_bytes(c, gemm1, t) > 227 * 1024) return "needs more than 227 KiB of shared memory";
  return {};
}

int parse_int(std::string_view text, std::string_view source, std::string_view entry) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) bad_tile(source, entry, "has a malformed number");
  return v;
}

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

}  // namespace

std::string to_string(const TileOverride& o) {
  const TileShape& t = o.tile;
  std::string out = fmt::format("{}.gemm{}=", o.bucket, o.gemm1 ? 1 : 2);
  if (t.kernel == GemmKernel::TensorCore)
    return out + fmt::format("tc:{}x{}x{}:s{}:w{}x{}", t.bm, t.bn, t.bk, t.stages, t.warps_m, t.warps_n);
  if (t.kernel == GemmKernel::Wgmma) return out + fmt::format("wg:{}x{}x{}:s{}", t.bm, t.bn, t.bk, t.stages);
  return out + fmt::format("simt:{}x{}x{}", t.bm, t.bn, t.bk);
}

std::vector<std::pair<TileShape, TileShape>> tile_candidates(const MoeConfig& c, const TokenBucket& b,
                                                             const std::string& arch) {
  std::vector<std::pair<TileShape, TileShape>> out = {{b.gemm1, b.gemm2}};
  if (b.gemm1.kernel == GemmKernel::Simt) return out;
  auto add = [&](const TileShape& g1, const TileShape& g2) {
    const bool fits = tile_problem(c, true, g1, arch).empty() && tile_problem(c, false, g2, arch).empty();
    const bool known = std::any_of(out.begin(), out.end(), [&](const auto& p) {
      return describe(p.first) == describe(g1) && describe(p.second) == describe(g2);
    });
    if (fits && !known) out.push_back({g1, g2});
  };
  // (warps_m, warps_n, stages, weight rows) alternatives per row tile height: narrower or wider
  // weight tiles and shallower or deeper pipelines around the planner's choice.
  struct Shape {
    int warps_m, warps_n, stages, weight_rows;
  };
  std::vector<Shape> shapes;
  // A 192-row bucket's alternatives are those of the 128-row tile it replaced.
  const int bm = b.gemm1.bm == 192 ? 128 : b.gemm1.bm;
  switch (bm) {
    case 16: shapes = {{1, 2, 8, 32}, {1, 4, 6, 64}, {1, 4, 4, 64}, {1, 2, 6, 32}}; break;
    case 32: shapes = {{2, 2, 5, 64}, {2, 4, 4, 128}, {2, 2, 8, 64}}; break;
    case 64: shapes = {{2, 2, 4, 128}, {2, 4, 3, 256}, {2, 4, 4, 128}, {2, 2, 6, 64}}; break;
    default: shapes = {{2, 4, 3, 256}, {2, 4, 4, 128}, {2, 4, 3, 128}, {4, 2, 3, 256}}; break;
  }
  for (const Shape& s : shapes) {
    std::pair<TileShape, TileShape> pair;
    for (bool gemm1 : {true, false}) {
      TileShape& t = gemm1 ? pair.first : pair.second;
      t = {GemmKernel::TensorCore, bm, 0, 64, s.warps_m, s.warps_n, s.stages};
      t.bn = (gemm1 && c.gated) ? s.weight_rows / 2 : s.weight_rows;
    }
    add(pair.first, pair.second);
  }
  // wgmma for the row tiles it takes: 256 or 128 weight rows, deep or shallow pipelines. (The
  // shallow ones fit twice in shared memory, but registers keep the 128-row ones at one block per
  // SM and the 64-row ones at two: slower on the H200, kept as autotune candidates.)
  if (bm == 64 || bm == 128) {
    const int halves = c.gated ? 2 : 1;
    for (auto [weight_rows, stages] : {std::pair{256, 4}, {128, 6}, {128, 3}, {256, 3}})
      add(wgmma_tile(bm, weight_rows / halves, stages), wgmma_tile(bm, weight_rows, stages));
    // Three consumer warpgroups: a 192 x 192 tile moves 11% fewer bytes per multiply-add through L2
    // than 128 x 256, and an expert whose rows just pass a multiple of 128 needs no extra row tile
    // that streams its whole weight slice again for a few rows.
    if (bm == 128) add(wgmma_tile(192, 192 / halves, 4), wgmma_tile(192, 192, 4));
  }
  return out;
}

std::vector<TileOverride> parse_tile_overrides(std::string_view text, std::string_view source) {
  std::vector<TileOverride> out;
  for (std::string_view entry : split(text, ',')) {
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    if (entry.empty()) continue;
    const size_t eq = entry.find('='), dot = entry.find('.');
    if (eq == std::string_view::npos || dot == std::string_view::npos || dot > eq) bad_tile(source, entry, "is malformed");
    TileOverride o;
    o.bucket = std::string(entry.substr(0, dot));
    const std::string_view gemm = entry.substr(dot + 1, eq - dot - 1);
    if (gemm != "gemm1" && gemm != "gemm2") bad_tile(source, entry, "names no GEMM (gemm1 or gemm2)");
    o.gemm1 = gemm == "gemm1";
    const std::vector<std::string_view> fields = split(entry.substr(eq + 1), ':');
    const std::vector<std::string_view> dims = split(fields.size() > 1 ? fields[1] : "", 'x');
    if (dims.size() != 3) bad_tile(source, entry, "needs BMxBNxBK");
    o.tile.bm = parse_int(dims[0], source, entry);
    o.tile.bn = parse_int(dims[1], source, entry);
    o.tile.bk = parse_int(dims[2], source, entry);
    if (fields[0] == "simt" && fields.size() == 2) {
      o.tile.kernel = GemmKernel::Simt;
    } else if (fields[0] == "wg" && fields.size() == 3 && fields[2].starts_with("s")) {
      o.tile = wgmma_tile(o.tile.bm, o.tile.bn, parse_int(fields[2].substr(1), source, entry));
      o.tile.bk = parse_int(dims[2], source, entry);
    } else if (fields[0] == "tc" && fields.size() == 4 && fields[2].starts_with("s") && fields[3].starts_with("w")) {
      o.tile.kernel = GemmKernel::TensorCore;
      o.tile.stages = parse_int(fields[2].substr(1), source, entry);
      const std::vector<std::string_view> warps = split(fields[3].substr(1), 'x');
      if (warps.size() != 2) bad_tile(source, entry, "needs w<M>x<N>");
      o.tile.warps_m = parse_int(warps[0], source, entry);
      o.tile.warps_n = parse_int(warps[1], source, entry);
    } else {
      bad_tile(source, entry, "names no kernel form");
    }
    out.push_back(o);
  }
  return out;
}

Plan make_plan(const MoeConfig& config, const std::string& arch, const std::vector<TileOverride>& overrides) {
  validate(config);
  Plan plan;
  plan.config = config;
  plan.arch = arch;
  plan.buckets = plan_buckets(config, arch);
  for (const auto& o : overrides) {
    auto b = std::find_if(plan.buckets.begin(), plan.buckets.end(), [&](const auto& x) { return x.name == o.bucket; });
    const std::string entry = fmt::format("{}.gemm{}={}", o.bucket, o.gemm1 ? 1 : 2, describe(o.tile));
    if (b == plan.buckets.end()) {
      std::string names;
      for (const auto& x : plan.buckets) names += (names.empty() ? "" : ", ") + x.name;
      throw InvalidInput(fmt::format("tiles: '{}' names no bucket; allowed: {}", entry, names));
    }
    const std::string problem = tile_problem(config, o.gemm1, o.tile, arch);
    if (!problem.empty()) throw InvalidInput(fmt::format("tiles: '{}' {}", entry, problem));
    (o.gemm1 ? b->gemm1 : b->gemm2) = o.tile;
  }
  for (const auto& b : plan.buckets)
    if (b.gemm1.bm != b.gemm2.bm)
      throw InvalidInput(fmt::format("tiles: bucket {} has GEMM 1 row tile {} and GEMM 2 row tile {}; they share one "
                                     "tile schedule, so they must be equal",
                                     b.name, b.gemm1.bm, b.gemm2.bm));
  plan.kernels.push_back(routing_kernel(config));
  for (auto& k : index_kernels(config)) plan.kernels.push_back(std::move(k));
  plan.kernels.push_back(route_index_kernel(config));
  const bool quant = config.quant == Quant::W8A8Int8;
  std::vector<KernelPlan> quantize;
  if (quant) quantize = quantize_kernels(config);
  if (quant) plan.kernels.push_back(quantize[0]);
  auto add_once = [&](KernelPlan k) {
    for (const auto& existing : plan.kernels)
      if (existing.entry == k.entry) return;
    plan.kernels.push_back(std::move(k));
  };
  for (auto& b : plan.buckets) {
    KernelPlan g1 = gemm_kernel(config, true, b.gemm1);
    b.gemm1_entry = g1.entry;
    add_once(std::move(g1));
  }
  if (quant) plan.kernels.push_back(quantize[1]);
  for (auto& b : plan.buckets) {
    KernelPlan g2 = gemm_kernel(config, false, b.gemm2);
    b.gemm2_entry = g2.entry;
    add_once(std::move(g2));
  }
  plan.kernels.push_back(combine_kernel(config));
  for (auto& k : plan.kernels)
    if (k.spec_name.empty()) k.spec_name = "Spec_" + k.entry.substr(std::string("moejit_").size());
  return plan;
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

std::vector<std::string> Plan::unit_names() const {
  std::vector<std::string> names;
  for (const auto& k : kernels)
    if (std::find(names.begin(), names.end(), k.unit) == names.end()) names.push_back(k.unit);
  return names;
}

const WorkspaceBuffer& WorkspaceLayout::at(std::string_view name) const {
  for (const auto& b : buffers)
    if (b.name == name) return b;
  throw Error(fmt::format("moejit internal error: the workspace has no buffer named {}", name));
}

namespace {

// The one list of workspace buffers: calls add(name, bytes, what, member) in layout order.
template <typename Add>
void visit_workspace(const MoeConfig& c, int64_t tokens, Add&& add) {
  const int64_t pairs = tokens * c.topk;
  const int64_t e_loc = c.local_experts();
  const int64_t inter = c.local_intermediate();
  const int64_t elem = dtype_bytes(c.dtype);
  // Sized for the shortest row tile any plan may use (16, also with MOEJIT_TILES), so the layout
  // stays a function of (config, tokens) alone.
  const int64_t tiles = max_row_tiles(c, tokens, kMinRowTile);
  const int64_t index_blocks = (pairs + kPairsPerIndexBlock - 1) / kPairsPerIndexBlock;
  using W = WorkspaceOffsets;
  add("topk_weights", pairs * 4, "[T, K] fp32", &W::topk_weights);
  add("topk_ids", pairs * 4, "[T, K] int32", &W::topk_ids);
  add("block_counts", index_blocks * e_loc * 4, "[ceil(T*K/1024), E_loc] int32", &W::block_counts);
  add("expert_counts", e_loc * 4, "[E_loc] int32", &W::expert_counts);
  add("expert_offsets", (e_loc + 1) * 4, "[E_loc + 1] int32", &W::expert_offsets);
  add("sorted_pair", pairs * 4, "[T*K] int32", &W::sorted_pair);
  add("pair_pos", pairs * 4, "[T*K] int32", &W::pair_pos);
  add("tile_expert", tiles * 4, "[max_row_tiles] int32", &W::tile_expert);
  add("tile_row", tiles * 4, "[max_row_tiles] int32", &W::tile_row);
  add("num_tiles", 4, "[1] int32", &W::num_tiles);
  if (c.quant == Quant::W8A8Int8) {
    add("a_q", pairs * c.hidden, "[T*K, H] int8", &W::a_q);
    add("a_scale", pairs * 4, "[T*K] fp32", &W::a_scale);
    add("act_f32", pairs * inter * 4, "[T*K, I] fp32", &W::act_f32);
    add("act_q", pairs * inter, "[T*K, I] int8", &W::act_q);
    add("act_scale", pairs * 4, "[T*K] fp32", &W::act_scale);
  } else {
    add("act", pairs * inter * elem, "[T*K, I] model dtype", &W::act);
  }
  add("y", pairs * c.hidden * elem, "[T*K, H] model dtype", &W::y);
}

}  // namespace

WorkspaceOffsets workspace_offsets(const MoeConfig& c, int64_t tokens) {
  WorkspaceOffsets offsets;
  visit_workspace(c, tokens, [&](const char*, int64_t bytes, const char*, int64_t WorkspaceOffsets::*member) {
    offsets.*member = offsets.total_bytes;
    offsets.total_bytes = align_up(offsets.total_bytes + bytes, kWorkspaceAlign);
  });
  return offsets;
}

WorkspaceLayout plan_workspace(const MoeConfig& c, int64_t max_tokens) {
  validate(c);
  if (max_tokens < 0)
    throw InvalidInput(fmt::format("max_tokens: {} is out of range; allowed >= 0", max_tokens));
  WorkspaceLayout layout;
  layout.max_tokens = max_tokens;
  visit_workspace(c, max_tokens, [&](const char* name, int64_t bytes, const char* what, auto) {
    layout.buffers.push_back({name, layout.total_bytes, bytes, what});
    layout.total_bytes = align_up(layout.total_bytes + bytes, kWorkspaceAlign);
  });
  return layout;
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

std::string describe(const Plan& plan, int64_t max_tokens) {
  const MoeConfig& c = plan.config;
  std::string out = fmt::format("plan for arch {}: E={} K={} E_loc={} (first local expert {}) H={} I={} {}{}\n",
                                plan.arch, c.experts, c.topk, c.local_experts(), c.first_local_expert(), c.hidden,
                                c.local_intermediate(), data_tag(c),
                                c.tp_size > 1 ? fmt::format(" (tp {}/{})", c.tp_rank, c.tp_size) : "");
  out += "token buckets:\n";
  for (const auto& b : plan.buckets) {
    std::string range = b.max_tokens == std::numeric_limits<int64_t>::max()
                            ? fmt::format("T >= {}", b.min_tokens)
                            : fmt::format("{} <= T <= {}", b.min_tokens, b.max_tokens);
    out += fmt::format("  {:<8} {:<18} gemm1 tile {}  gemm2 tile {}\n", b.name, range, describe(b.gemm1),
                       describe(b.gemm2));
  }
  out += "kernels:\n";
  for (const auto& k : plan.kernels)
    out += fmt::format("  {:<8} {:<8} {}  [{} threads, {}{}{}]\n", to_string(k.stage), k.unit, k.entry,
                       k.launch.threads, to_string(k.launch.rule),
                       k.launch.per_block > 1 ? fmt::format(", per_block {}", k.launch.per_block) : "",
                       k.launch.shared_bytes > 0 ? fmt::format(", {} bytes dynamic shared", k.launch.shared_bytes) : "");
  WorkspaceLayout ws = plan_workspace(c, max_tokens);
  out += fmt::format("workspace for max_tokens {}: {} bytes\n", max_tokens, ws.total_bytes);
  for (const auto& b : ws.buffers)
    out += fmt::format("  {:<15} offset {:>12}  bytes {:>12}  {}\n", b.name, b.offset, b.bytes, b.what);
  return out;
}

}  // namespace moejit
