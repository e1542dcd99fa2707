// The grouped-GEMM family (SPEC.md stages 4 and 5): one GEMM per local expert over its
// expert-sorted rows, GEMM 1 gathering hidden rows and applying the activation. Three variants,
// chosen per tile (TileShape::kernel):
//   Simt        templates/grouped_gemm.cuh  any dtype, layout, quantization and shape
//   TensorCore  templates/mma_gemm.cuh      mma.sync + cp.async: bf16/fp16, nk layout, H and I multiples of 8
//   Wgmma       templates/wgmma_gemm.cuh    sm_90a: warpgroup MMA, weights by TMA; bf16/fp16 as
//                                           TensorCore, and 8-bit weights (int8, fp8) with H and I
//                                           multiples of 16
// This file holds what the variants need from the host: legality, shared memory, the kernel plan,
// the grid bound, the weight tensor map's shape and the argument packing.
#pragma once

#include <cstdint>
#include <string>

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

// The shortest GEMM row tile (BM) of any plan; the workspace is sized for it.
constexpr int kMinRowTile = 16;

// Whether `arch` runs the warpgroup-MMA GEMMs (wgmma is sm_90a-specific).
bool wgmma_arch(const std::string& arch);

// Whether `arch` has mma.sync on e4m3 operands (sm_89 and later; int8 mma.sync is sm_80's).
bool fp8_mma_arch(const std::string& arch);

// Bytes of a GEMM operand element: 1 for the quantized layers (int8, e4m3), else the dtype's.
int operand_bytes(const LayerSpec& spec);

// The tensor-core variants need bf16/fp16 activations, the nk layout (k contiguous, as the MMAs'
// B operand wants) and rows that split into 16-byte chunks. (mma.sync on e4m3 further needs
// sm_89: tile_problem.)
bool tensor_core_eligible(const LayerSpec& spec);

// A wgmma tile: a consumer warpgroup per 64 rows and one producer warpgroup
// (warps_m = bm / 16 + 4 warps in one column), BK one 128-byte row (64 or 128 elements).
TileShape wgmma_tile(const LayerSpec& spec, int bm, int bn, int stages);

// Why `tile` cannot run GEMM 1 (gemm1) or GEMM 2 of `spec` on `arch`, or empty when it can.
std::string tile_problem(const LayerSpec& spec, bool gemm1, const TileShape& tile, const std::string& arch);

// The GEMM kernel of one tile: entry name, template, Spec constants, launch rule.
KernelPlan gemm_kernel(const LayerSpec& spec, bool gemm1, const TileShape& tile);

// Upper bound of GEMM row tiles for `tokens` tokens with row tile height `bm`:
// sum_e ceil(count_e / bm) <= ceil(T*K / bm) + E_loc.
int64_t max_row_tiles(const LayerSpec& spec, int64_t tokens, int bm);

// The tensor map through which a wgmma GEMM loads its weight tiles (TMA): the weights as a
// [planes][n][k] tensor of 16-bit elements (planes = local experts x halves), box 64 (k) x
// box_rows x 1, 128-byte swizzle. 8-bit weights are mapped as pairs of bytes (byte_pairs: k is
// half the row's elements). The runtime encodes it (cuTensorMapEncodeTiled) per call.
struct WeightMapShape {
  DType dtype;
  bool byte_pairs;
  int64_t planes, n, k;
  int box_rows;
};
WeightMapShape weight_map_shape(const LayerSpec& spec, bool gemm1, const TileShape& tile);

// Whether a GEMM 1 of this tile quantizes its own output for GEMM 2 (fp8_block on wgmma, whole
// 128-column scale groups per tile): then no re-quantization kernel runs between the GEMMs.
bool gemm1_quantizes_output(const LayerSpec& spec, const TileShape& gemm1);

// GEMM 1: hidden (gathered) or a_q -> act / act_f32 (act_q and act_scale where it quantizes its
// output); GEMM 2: act or act_q -> Y. The bucket's tensor maps come from the buffers.
GemmArgs gemm1_args(const CallContext& context);
GemmArgs gemm2_args(const CallContext& context);

}  // namespace moejit
