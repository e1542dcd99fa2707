#include "compiler/families/grouped_gemm.h"

#include <algorithm>
#include <cstdlib>

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
// the A and weight tiles (gated GEMM 1 holds 2 * BN weight rows; BK elements of 2 or 1 bytes),
// then one 8-byte source row index per A row; wgmma also two 8-byte mbarriers per stage, its
// epilogue's vectors per consumer warpgroup (a float per weight row for int8's channel scales and
// for the expert bias, one per output column for int8 GEMM 1's act_smooth) and 1024 bytes to align
// its tiles to the swizzle period.
int tensor_core_shared_bytes(const LayerSpec& c, bool gemm1, const TileShape& t) {
  const int weight_rows = (gemm1 && c.gated ? 2 : 1) * t.bn;
  const int pipeline = t.stages * (t.bm + weight_rows) * t.bk * operand_bytes(c) + t.bm * 8;
  if (t.kernel != GemmKernel::Wgmma) return pipeline;
  const bool int8 = c.quant == Quant::W8A8Int8;
  const int epilogue_floats =
      (int8 ? weight_rows : 0) + (c.expert_bias ? weight_rows : 0) + (int8 && gemm1 ? t.bn : 0);
  return pipeline + t.stages * 16 + t.bm / 64 * epilogue_floats * 4 + 1024;
}

// The scaling the GEMM applies to its 8-bit operands (common.cuh's ScalingKind).
std::string scaling_kind(const LayerSpec& c) {
  switch (c.quant) {
    case Quant::None: return "moejit::kNoScaling";
    case Quant::W8A8Int8: return "moejit::kRowChannelScaling";
    case Quant::Fp8Tensor: return "moejit::kTensorScaling";
    case Quant::Fp8Block: return "moejit::kBlockScaling";
  }
  return "?";
}

// The device type of the GEMMs' 8-bit or 16-bit operands.
std::string operand_type(const LayerSpec& c) {
  if (c.quant == Quant::W8A8Int8) return "signed char";
  if (is_fp8(c.quant)) return "moejit::e4m3";
  return device_type(c.dtype);
}

}  // namespace

bool wgmma_arch(const std::string& arch) { return arch == "sm_90a"; }

bool fp8_mma_arch(const std::string& arch) {
  // "sm_89", "sm_90a", "sm_120": the number after "sm_".
  return arch.starts_with("sm_") && std::atoi(arch.c_str() + 3) >= 89;
}

int operand_bytes(const LayerSpec& c) { return is_quantized(c.quant) ? 1 : dtype_bytes(c.dtype); }

bool tensor_core_eligible(const LayerSpec& c) {
  // Rows of H and I elements split into 16-byte chunks (8 16-bit or 16 8-bit elements).
  const int chunk = 16 / operand_bytes(c);
  return (c.dtype == DType::BF16 || c.dtype == DType::FP16) && c.weight_layout == WeightLayout::NK &&
         c.hidden % chunk == 0 && c.local_intermediate() % chunk == 0;
}

TileShape wgmma_tile(const LayerSpec& c, int bm, int bn, int stages) {
  // BK: one 128-byte swizzled row, 64 16-bit or 128 8-bit elements (an fp8 scale block).
  return {GemmKernel::Wgmma, bm, bn, 128 / operand_bytes(c), bm / 16 + 4, 1, stages};
}

std::string tile_problem(const LayerSpec& c, bool gemm1, const TileShape& t, const std::string& arch) {
  const int halves = gemm1 && c.gated ? 2 : 1;
  if (t.bm < kMinRowTile || t.bn <= 0 || t.bk <= 0) return "needs BM >= 16 and positive BN, BK";
  if (t.kernel == GemmKernel::Simt) {
    if (t.bm % 16 || t.bn % 16) return "needs BM and BN multiples of 16 (a 16x16 thread grid)";
    if ((t.bm + halves * t.bn) * t.bk * 4 > 48 * 1024) return "needs more than 48 KiB of static shared memory";
    return {};
  }
  if (!tensor_core_eligible(c))
    return "asks for tensor cores, which need bf16/fp16 activations, the nk layout and rows of H and I in "
           "16-byte chunks (multiples of 8 16-bit or 16 8-bit elements)";
  const int threads = 32 * t.warps_m * t.warps_n, weight_rows = halves * t.bn;
  const bool eight_bit = operand_bytes(c) == 1;
  if (t.kernel == GemmKernel::TensorCore && is_fp8(c.quant) && !fp8_mma_arch(arch))
    return fmt::format("asks for mma.sync on e4m3, which needs sm_89 or later (the arch is {}); fp8 runs on SIMT there",
                       arch);
  if (t.bk * operand_bytes(c) != 128)
    return eight_bit ? "needs BK = 128 (8-bit operands)" : "needs BK = 64";
  if (t.kernel == GemmKernel::Wgmma) {
    if (!wgmma_arch(arch)) return fmt::format("asks for wgmma, which needs arch sm_90a (the arch is {})", arch);
    if (t.bm != 64 && t.bm != 128 && t.bm != 192) return "needs BM 64, 128 or 192 (one warpgroup per 64 rows)";
    if (weight_rows != 64 && weight_rows != 128 && weight_rows != 192 && weight_rows != 256)
      return "needs (2 if gated GEMM 1) * BN of 64, 128, 192 or 256 (the wgmma N)";
    if (t.bm == 192 && weight_rows > 192)
      return "needs (2 if gated GEMM 1) * BN of at most 192 at BM 192 (512 threads leave 128 registers each)";
    // fp8_block keeps a running sum beside each K block's partial one (past 128 weight rows the
    // partial covers half of them at a time): three consumer warpgroups' registers do not hold both.
    if (c.quant == Quant::Fp8Block && t.bm == 192)
      return "needs BM 64 or 128 with fp8_block (a running sum beside each K block's partial one)";
    // ... and at 256 weight rows the promotion's registers hold one weight scale per pass, not the
    // two of a pass that meets a scale-block edge (ptxas spills).
    const int64_t n = gemm1 ? c.local_intermediate() : c.hidden;
    if (c.quant == Quant::Fp8Block && weight_rows == 256 && n % kFp8BlockSize != 0)
      return fmt::format("needs the GEMM's N ({}) a multiple of {} for 256 weight rows with fp8_block", n,
                         kFp8BlockSize);
    if (t.stages < 2) return "needs at least 2 stages";
    if (t.warps_m != t.bm / 16 + 4 || t.warps_n != 1) return "needs warps (bm/16 + 4) x 1";
    if (tensor_core_shared_bytes(c, gemm1, t) > 227 * 1024) return "needs more than 227 KiB of shared memory";
    return {};
  }
  if (t.stages < 2) return "needs at least 2 stages";
  if (t.warps_m <= 0 || t.warps_n <= 0 || threads > 1024) return "needs 1 to 32 warps";
  if (t.bm % (16 * t.warps_m)) return "needs BM a multiple of 16 * warps_m";
  if (weight_rows % (16 * t.warps_n)) return "needs (2 if gated GEMM 1) * BN a multiple of 16 * warps_n";
  // fp8_block keeps a running sum beside each K block's partial one: two accumulator sets.
  if (c.quant == Quant::Fp8Block && (t.bm / t.warps_m) * (weight_rows / t.warps_n) / 32 > 64)
    return "needs at most 64 accumulators per thread ((BM / warps_m) x ((2 if gated GEMM 1) * BN / warps_n) / 32) "
           "with fp8_block (two accumulator sets)";
  if ((t.bm * 8) % threads || (weight_rows * 8) % threads) return "needs the tile's 16-byte chunks to split evenly over the threads";
  if (tensor_core_shared_bytes(c, gemm1, t) > 227 * 1024) return "needs more than 227 KiB of shared memory";
  return {};
}

KernelPlan gemm_kernel(const LayerSpec& c, bool gemm1, const TileShape& tile) {
  const bool int8 = c.quant == Quant::W8A8Int8, quantized = is_quantized(c.quant);
  const bool tensor_core = tile.kernel != GemmKernel::Simt;
  const bool wgmma = tile.kernel == GemmKernel::Wgmma;
  const int64_t n = gemm1 ? c.local_intermediate() : c.hidden;
  const int64_t k_len = gemm1 ? c.hidden : c.local_intermediate();
  KernelPlan k;
  k.stage = gemm1 ? Stage::Gemm1 : Stage::Gemm2;
  k.role = gemm1 ? KernelRole::Gemm1 : KernelRole::Gemm2;
  k.entry = fmt::format("moejit_gemm{}_e{}_n{}_k{}{}_{}{}_{}_m{}n{}k{}", gemm1 ? 1 : 2, c.gemm_experts(), n,
                        k_len, gemm1 ? "_" + activation_tag(c) : "", data_tag(c), c.expert_bias ? "_bias" : "",
                        to_string(c.weight_layout),
                        tile.bm, tile.bn, tile.bk);
  if (wgmma)
    k.entry += fmt::format("_wg_s{}", tile.stages);
  else if (tensor_core)
    k.entry += fmt::format("_tc_s{}w{}x{}", tile.stages, tile.warps_m, tile.warps_n);
  k.unit = gemm1 ? "gemm1" : "gemm2";  // two units, compiled in parallel: together they took most of a cold compile
  k.args_type = "moejit::GemmArgs";
  // GEMM 1 gathers hidden rows (fp8: the tokens' quantized rows) unless w8a8 quantized them into
  // sorted order.
  const std::string a_type = operand_type(c);
  const bool gather = gemm1 && !int8;
  // A quantized GEMM 1 stores fp32 for the re-quantization, or e4m3 and its scales where its
  // epilogue quantizes (fp8_block, gemm1_quantizes_output); everything else the model dtype.
  const bool quantize_out = gemm1 && gemm1_quantizes_output(c, tile);
  const std::string out_type =
      quantize_out ? "moejit::e4m3" : (quantized && gemm1) ? "float" : device_type(c.dtype);
  const bool gated = gemm1 && c.gated;
  // fp8 scale blocks: columns per activation and weight scale (128, or K: one per row / matrix)
  // and weight rows per weight scale (128, or every row).
  const int64_t w_rows = gated ? 2 * n : n;
  const int64_t scale_cols = c.quant == Quant::Fp8Block ? kFp8BlockSize : k_len;
  const int64_t scale_rows = c.quant == Quant::Fp8Block ? kFp8BlockSize : w_rows;
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
        {"float", "kSwigluLimit", float_literal(c.swiglu_limit)},
        {"bool", "kBias", boolean(c.expert_bias)},
        {"bool", "kGather", boolean(gather)},
        {"int", "kTopk", std::to_string(c.pair_slots())},  // pairs per token: the gather divides by it
        {"bool", "kWeightsBeforeWait", boolean(!gemm1)},
    };
    if (quantized) {
      k.spec.push_back({"int", "kScaling", scaling_kind(c)});
      k.spec.push_back({"long long", "kScaleCols", std::to_string(scale_cols)});
      k.spec.push_back({"long long", "kScaleRows", std::to_string(scale_rows)});
      k.spec.push_back({"bool", "kQuantizeOut", boolean(quantize_out)});
    }
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
      {"using", "W", a_type},
      {"using", "Out", out_type},
      {"using", "Acc", int8 ? "int" : "float"},
      {"int", "kBM", std::to_string(tile.bm)},
      {"int", "kBN", std::to_string(tile.bn)},
      {"int", "kBK", std::to_string(tile.bk)},
      {"int", "kThreads", std::to_string(kGemmThreads)},
      {"long long", "kN", std::to_string(n)},
      {"long long", "kK", std::to_string(k_len)},
      {"bool", "kGemm1", boolean(gemm1)},
      {"bool", "kGated", boolean(gated)},
      {"int", "kAct", act_kind(c.activation)},
      {"float", "kSwigluLimit", float_literal(c.swiglu_limit)},
      {"bool", "kBias", boolean(c.expert_bias)},
      {"bool", "kGather", boolean(gather)},
      {"int", "kTopk", std::to_string(c.pair_slots())},  // pairs per token: the gather divides by it
      {"bool", "kLayoutNK", boolean(c.weight_layout == WeightLayout::NK)},
      {"int", "kScaling", scaling_kind(c)},
      {"long long", "kScaleCols", std::to_string(scale_cols)},
      {"long long", "kScaleRows", std::to_string(scale_rows)},
  };
  k.launch = {GridRule::RowTilesByColumns, kGemmThreads, tile.bn, 0, n};
  return k;
}

int64_t max_row_tiles(const LayerSpec& c, int64_t tokens, int bm) {
  const int64_t pairs = tokens * c.pair_slots();
  // Every tile holds at least one row, so there are never more tiles than pairs.
  return std::min(pairs, (pairs + bm - 1) / bm + c.gemm_experts());
}

WeightMapShape weight_map_shape(const LayerSpec& c, bool gemm1, const TileShape& tile) {
  // 8-bit weights as pairs of bytes: the map's k is the row's bytes / 2 (H and I are multiples of 16).
  const int per_unit = 2 / operand_bytes(c);
  const bool pairs = per_unit == 2;
  if (gemm1)
    return {c.dtype, pairs, int64_t{c.gemm_experts()} * (c.gated ? 2 : 1), c.local_intermediate(), c.hidden / per_unit,
            tile.bn};
  return {c.dtype, pairs, c.gemm_experts(), c.hidden, c.local_intermediate() / per_unit, tile.bn};
}

bool gemm1_quantizes_output(const LayerSpec& c, const TileShape& gemm1) {
  // A tile's output columns hold whole 128-column scale groups (n0 is a multiple of BN), so each
  // row's amax per group is a reduction within the tile.
  return c.quant == Quant::Fp8Block && gemm1.kernel == GemmKernel::Wgmma && gemm1.bn % kFp8BlockSize == 0 &&
         c.local_intermediate() % kFp8BlockSize == 0;
}

GemmArgs gemm1_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  const WorkspaceOffsets& o = b.offsets;
  const bool quantized = is_quantized(x.spec.quant);
  const bool quantize_out = gemm1_quantizes_output(x.spec, x.call.bucket->gemm1);
  // An fp8 layer's experts() given quantized rows (LayerInputs::hidden_scale) gathers them as they are.
  const bool given = b.in.hidden_scale != nullptr;
  return GemmArgs{given ? b.in.hidden : quantized ? b.at<char>(o.a_q) : b.in.hidden,
                  given ? b.in.hidden_scale : b.at<float>(o.a_scale),
                  b.at<int>(o.sorted_pair),
                  b.in.w13,
                  b.in.w13_scale,
                  x.spec.quant == Quant::W8A8Int8 ? b.in.act_smooth : nullptr,
                  x.spec.expert_bias ? b.in.w13_bias : nullptr,
                  quantize_out ? b.at<char>(o.act_q) : quantized ? b.at<char>(o.act_f32) : b.at<char>(o.act),
                  quantize_out ? b.at<float>(o.act_scale) : nullptr,
                  b.at<int>(o.tile_expert),
                  b.at<int>(o.tile_row),
                  b.at<int>(o.num_tiles),
                  b.at<int>(o.expert_offsets),
                  b.w13_map};
}

GemmArgs gemm2_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  const WorkspaceOffsets& o = b.offsets;
  const bool quantized = is_quantized(x.spec.quant);
  return GemmArgs{quantized ? b.at<char>(o.act_q) : b.at<char>(o.act),
                  b.at<float>(o.act_scale),
                  b.at<int>(o.sorted_pair),
                  b.in.w2,
                  b.in.w2_scale,
                  nullptr,
                  // The tensor-parallel ranks' outputs are summed: one of them adds the bias.
                  x.spec.expert_bias && x.placement.tp_rank == 0 ? b.in.w2_bias : nullptr,
                  b.at<char>(o.y),
                  nullptr,
                  b.at<int>(o.tile_expert),
                  b.at<int>(o.tile_row),
                  b.at<int>(o.num_tiles),
                  b.at<int>(o.expert_offsets),
                  b.w2_map};
}

}  // namespace moejit
