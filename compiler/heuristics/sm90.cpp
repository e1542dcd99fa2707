// sm_90a (H100, H200): the warpgroup-MMA tiles and the "wide" bucket of 192-row tiles.
#include <algorithm>
#include <cmath>
#include <limits>

#include "compiler/families/grouped_gemm.h"
#include "compiler/heuristics/heuristics.h"

namespace moejit::heuristics {

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
// experts spill past 128, r + 0.5 sqrt r > 128 (r > 122.5). The band is an interval: rows grow with T.
std::pair<int64_t, int64_t> wide_row_band(const LayerSpec& c, int64_t from) {
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

// The mid bucket's tile (mid_rows high: 16-row mma.sync, or 64-row wgmma for few experts) against
// the prefill range's 128-row wgmma tiles, measured on the H200 (bench/RESULTS.md, session 20, two
// rounds, bench/sweeps/mid_rows.txt; r = T*K/E_loc rows an expert): the 128-row tiles lose 1-9%
// while r is below about three quarters of the mid tile (Qwen3-30B-A3B T <= 192 8-9%, DeepSeek-V3
// T <= 320 1.5-3%, Kimi-K2 and Qwen3-Next-80B-A3B through T=512 1-6%), break even where r reaches
// it (Qwen3 T=256, r = 16: 0.331 / 0.332 ms; Mixtral T=192, r = 48: 0.698 / 0.700; DeepSeek-V3 T=384,
// r = 12: 5.22 / 5.20), and win past it: Qwen3 T = 320 / 512 -9% / -22%, DeepSeek-V3 T = 448 / 512
// -5% / -11%, Mixtral T = 256..448 -16..-21%, where each expert's second mid tile streams its weight
// slice again. So the mid bucket ends before the T whose mean rows reach the mid tile's height
// (still at 512 at most), and the prefill range (its "short", "wide" and "prefill" buckets) starts
// there.
int64_t sm90_mid_end(const LayerSpec& c, int mid_rows) {
  // The first T with T*K/E_loc >= mid_rows, computed in integers: ceil(mid_rows * E_loc / K).
  const int64_t fills = (static_cast<int64_t>(mid_rows) * c.local_experts() + c.topk - 1) / c.topk;
  return std::clamp<int64_t>(fills - 1, 33, 512);
}

// The prefill range [from, ...) splits around the band of T that takes 192-row tiles: "short" below
// it, "wide" in it, "prefill" above it. "short" and "prefill" keep the prefill range's 128-row tiles
// (chosen at T=4096); each bucket is autotuned at a T inside it.
std::vector<BucketRange> sm90_prefill_ranges(const LayerSpec& c, int64_t from) {
  constexpr int64_t kLast = std::numeric_limits<int64_t>::max();
  const auto [first, last] = wide_row_band(c, from);
  if (row_tile_height(c, kPrefillTokens) != 128 || first > last) return {};
  std::vector<BucketRange> ranges;
  if (first > from)
    ranges.push_back({BucketKind::Short, from, first - 1, std::clamp<int64_t>(kPrefillTokens / 4, from, first - 1),
                      kPrefillTokens});
  const int64_t rows_128 = 128 * static_cast<int64_t>(c.local_experts()) / c.topk;  // the T of 128 rows per expert
  const int64_t wide_tuned = std::clamp(rows_128, first, last);
  ranges.push_back({BucketKind::Wide, first, last, wide_tuned, wide_tuned, true});
  ranges.push_back({BucketKind::Prefill, last + 1, kLast, std::max(kPrefillTokens, (last + 1) * 3 / 2), kPrefillTokens});
  return ranges;
}

// Row tiles of 64 and 128 on Hopper: warpgroup MMA, 256 weight rows, 4 stages (162 and 194 KiB).
// Measured on the H200 (bench/RESULTS.md): Mixtral T=4096 8.7 -> 5.2 ms against the best mma.sync
// tile, T=256 0.98 -> 0.83 ms. The "wide" bucket: 192 x 192, 4 stages (195 KiB).
void sm90_tiles(const LayerSpec& c, int bm, bool wide, TokenBucket& b) {
  if (wide) {
    b.gemm1 = wgmma_tile(c, 192, c.gated ? 96 : 192, 4);
    b.gemm2 = wgmma_tile(c, 192, 192, 4);
  } else {
    b.gemm1 = wgmma_tile(c, bm, c.gated ? 128 : 256, 4);
    b.gemm2 = wgmma_tile(c, bm, 256, 4);
  }
}

// 8-bit weights (int8, fp8), every bucket: row tiles of at least 64 (a wgmma is 64 rows; decode
// pays the padding rows in tensor-core time, not in weight bytes). A stage of 128-row tiles is
// 128 bytes deep like the 16-bit ones, holding a whole fp8 scale block. int8 and fp8_tensor scale
// once after the K loop and take the 16-bit tiles' 256 weight rows. fp8_block keeps a running sum
// beside each K block's partial sum; its 128-row tiles take 256 weight rows too, the partial sums in
// two passes of 128 rows (wgmma_gemm.cuh), where N is a multiple of 128 (else a pass may meet a
// scale-block edge, whose second weight scale the registers do not hold: 128 rows). Stages fill
// about 200 KiB of shared memory. Measured on the H200 (bench/RESULTS.md, session 14, one run):
// against 128 weight rows, DeepSeek-V3 T = 4096 / 16384 6.05 -> 5.22 / 18.47 -> 15.77 ms (732
// TFLOP/s), Qwen3-30B-A3B 0.698 -> 0.589 / 2.509 -> 2.015, Mixtral 4.41 -> 3.72 / 16.97 -> 15.07;
// 192 rows (two passes of 96) were 1-5% slower than 128. Decode and mid (64-row tiles) keep 128
// rows: 256 there (branch exp/fp8-block-decode-256, session 15, two rounds) was slower at every
// point, Qwen3-30B-A3B T = 1 0.029 -> 0.052 ms and T = 64 +40%, despite the re-quantization launch
// it saves: half the column tiles stream the weights.
void sm90_8bit_tiles(const LayerSpec& c, int bm, TokenBucket& b) {
  bm = std::max(bm, 64);
  auto tile = [&](bool gemm1) {
    const bool gated = gemm1 && c.gated;
    int weight_rows = 256;
    if (c.quant == Quant::Fp8Block) {
      const int64_t n = gemm1 ? c.local_intermediate() : c.hidden;
      weight_rows = bm >= 128 && n % kFp8BlockSize == 0 ? 256 : 128;
    }
    const int stages = std::min(8, 200 * 1024 / ((bm + weight_rows) * 128));
    return wgmma_tile(c, bm, gated ? weight_rows / 2 : weight_rows, stages);
  };
  b.gemm1 = tile(true);
  b.gemm2 = tile(false);
}
}  // namespace moejit::heuristics
