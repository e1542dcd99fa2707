// Every tensor-core arch without wgmma (sm_80 and the others NVRTC builds for): mma.sync tiles;
// and the SIMT tiles any spec the tensor-core GEMMs cannot take runs on.
#include "compiler/families/grouped_gemm.h"
#include "compiler/heuristics/heuristics.h"

namespace moejit::heuristics {

// Decode-sized tiles (bm 16, 32) keep few weight rows per block so that even a handful of active
// experts spread over every SM, and pipeline deeper so that each SM keeps enough weight bytes in
// flight to stream at HBM speed; in the decode bucket itself (a few rows per expert) the narrowest,
// deepest one. Prefill-sized tiles take many weight rows for operand reuse: at bm 128 a 64x64 warp
// tile (128 fp32 accumulators, 232 registers, no spills). Every shape gives each warp an even
// number of 8-column fragments.
// Measured on the H200 (bench/RESULTS.md, tile sweep): at T=4096 the 128 x 256-row tile beat
// 128 x 128 rows by 11-12%; in decode the 32-row, 8-stage tile matched or beat 64 rows by up to 5%.
// Except a decode GEMM 2 whose whole K fits in the 8 stages (16-bit, I <= 512): each 32-row block
// would be all pipeline fill (32 KiB at I = 512), so it takes the mid bucket's 64 rows (and kernel).
// Measured on the H200 (bench/RESULTS.md, session 20, two rounds): Qwen3-Next-80B-A3B (I = 512) T = 1..32
// -7% / -4% / -3.4% / -3% / -2.2% / -2.3%; Qwen3-30B-A3B (I = 768) +3.5% at T=1, so 768 keeps 32 rows.
TileShape tensor_core_tile(const LayerSpec& c, int bm, bool gemm1, bool decode_bucket) {
  TileShape t;
  t.kernel = GemmKernel::TensorCore;
  t.bm = bm;
  t.bk = 128 / operand_bytes(c);  // one 128-byte row: 64 16-bit or 128 8-bit elements
  constexpr int kDecodeStages = 8;
  const bool k_within_stages = !gemm1 && operand_bytes(c) == 2 && c.local_intermediate() <= kDecodeStages * t.bk;
  int weight_rows = 0;
  if (bm == 16 && decode_bucket && !k_within_stages) {
    t.warps_m = 1, t.warps_n = 2, t.stages = kDecodeStages, weight_rows = 32;
  } else if (bm == 16) {
    t.warps_m = 1, t.warps_n = 4, t.stages = 6, weight_rows = 64;
  } else if (bm == 32) {
    t.warps_m = 2, t.warps_n = 2, t.stages = 5, weight_rows = 64;
  } else if (bm == 64) {
    t.warps_m = 2, t.warps_n = 2, t.stages = 4, weight_rows = 128;
  } else {
    t.warps_m = 2, t.warps_n = 4, t.stages = 3, weight_rows = 256;
    // fp8_block's running sum doubles the accumulators: a 64 x 32 warp tile (64 + 64 per thread).
    if (c.quant == Quant::Fp8Block) weight_rows = 128;
  }
  t.bn = (gemm1 && c.gated) ? weight_rows / 2 : weight_rows;
  return t;
}

// Gated GEMM 1 keeps two accumulator sets, so it takes the narrower column tile.
void simt_tiles(int bm, TokenBucket& b) {
  b.gemm1 = {GemmKernel::Simt, bm, 64, bm <= 32 ? 32 : 16};
  b.gemm2 = {GemmKernel::Simt, bm, bm >= 64 ? 128 : 64, bm <= 32 ? 32 : 16};
}

}  // namespace moejit::heuristics
