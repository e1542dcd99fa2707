#include "compiler/families/grouped_gemm.h"

#include <algorithm>

#include <fmt/format.h>

#include "compiler/families/spec_text.h"

namespace moejit {
namespace {

using namespace spec_text;

constexpr int kGemmThreads = 256;
// Row tiles per rasterization group of the tensor-core GEMMs (mma_gemm.cuh): 8 tiles of 128 rows
// of one expert share each weight tile while resident together.
constexpr int kGemmGroupRows = 8;

// Dynamic shared memory of a tensor-core GEMM (mma_gemm.cuh, wgmma_gemm.cuh): kStages stages of
// the 16-bit A and weight tiles (gated GEMM 1 holds 2 * BN weight rows), then one 8-byte source
// row index per A row; wgmma also two 8-byte mbarriers per stage and 1024 bytes to align its tiles
// to the swizzle period.
int tensor_core_shared_bytes(const LayerSpec& c, bool gemm1, const TileShape& t) {
  const int weight_rows = (gemm1 && c.gated ? 2 : 1) * t.bn;
  const int pipeline = t.stages * (t.bm + weight_rows) * t.bk * 2 + t.bm * 8;
  return pipeline + (t.kernel == GemmKernel::Wgmma ? t.stages * 16 + 1024 : 0);
}

}  // namespace

bool wgmma_arch(const std::string& arch) { return arch == "sm_90a"; }

bool tensor_core_eligible(const LayerSpec& c) {
  return (c.dtype == DType::BF16 || c.dtype == DType::FP16) && c.quant == Quant::None &&
         c.weight_layout == WeightLayout::NK && c.hidden % 8 == 0 && c.local_intermediate() % 8 == 0;
}

TileShape wgmma_tile(int bm, int bn, int stages) { return {GemmKernel::Wgmma, bm, bn, 64, bm / 16 + 4, 1, stages}; }

std::string tile_problem(const LayerSpec& c, bool gemm1, const TileShape& t, const std::string& arch) {
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

KernelPlan gemm_kernel(const LayerSpec& c, bool gemm1, const TileShape& tile) {
  const bool quant = c.quant == Quant::W8A8Int8;
  const bool tensor_core = tile.kernel != GemmKernel::Simt;
  const bool wgmma = tile.kernel == GemmKernel::Wgmma;
  const int64_t n = gemm1 ? c.local_intermediate() : c.hidden;
  const int64_t k_len = gemm1 ? c.hidden : c.local_intermediate();
  KernelPlan k;
  k.stage = gemm1 ? Stage::Gemm1 : Stage::Gemm2;
  k.role = gemm1 ? KernelRole::Gemm1 : KernelRole::Gemm2;
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
    k.launch = {GridRule::RowTileGroups, threads, tile.bn, shared, n};
    // GEMM 2's schedule and weights come from kernels two or more launches back, so it starts its
    // weight copies while GEMM 1 (the kernel before it) still runs (kWeightsBeforeWait).
    k.waits_in_body = !gemm1;
    // The TMA takes the address of the tensor map inside the kernel parameter.
    k.grid_constant_args = wgmma;
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
  k.launch = {GridRule::RowTilesByColumns, kGemmThreads, tile.bn, 0, n};
  return k;
}

int64_t max_row_tiles(const LayerSpec& c, int64_t tokens, int bm) {
  const int64_t pairs = tokens * c.topk;
  // Every tile holds at least one row, so there are never more tiles than pairs.
  return std::min(pairs, (pairs + bm - 1) / bm + c.local_experts());
}

WeightMapShape weight_map_shape(const LayerSpec& c, bool gemm1, const TileShape& tile) {
  if (gemm1) return {c.dtype, int64_t{c.local_experts()} * (c.gated ? 2 : 1), c.local_intermediate(), c.hidden, tile.bn};
  return {c.dtype, c.local_experts(), c.hidden, c.local_intermediate(), tile.bn};
}

GemmArgs gemm1_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  const WorkspaceOffsets& o = b.offsets;
  const bool w8a8 = x.spec.quant == Quant::W8A8Int8;
  return GemmArgs{w8a8 ? b.at<char>(o.a_q) : b.in.hidden,
                  b.at<float>(o.a_scale),
                  b.at<int>(o.sorted_pair),
                  b.in.w13,
                  b.in.w13_scale,
                  b.in.act_smooth,
                  w8a8 ? b.at<char>(o.act_f32) : b.at<char>(o.act),
                  b.at<int>(o.tile_expert),
                  b.at<int>(o.tile_row),
                  b.at<int>(o.num_tiles),
                  b.at<int>(o.expert_offsets),
                  b.w13_map};
}

GemmArgs gemm2_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  const WorkspaceOffsets& o = b.offsets;
  const bool w8a8 = x.spec.quant == Quant::W8A8Int8;
  return GemmArgs{w8a8 ? b.at<char>(o.act_q) : b.at<char>(o.act),
                  b.at<float>(o.act_scale),
                  b.at<int>(o.sorted_pair),
                  b.in.w2,
                  b.in.w2_scale,
                  nullptr,
                  b.at<char>(o.y),
                  b.at<int>(o.tile_expert),
                  b.at<int>(o.tile_row),
                  b.at<int>(o.num_tiles),
                  b.at<int>(o.expert_offsets),
                  b.w2_map};
}

}  // namespace moejit
