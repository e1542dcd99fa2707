// The planner's closed-form choices (DESIGN.md decision 1: no tuning table): which token buckets a
// layer has and which GEMM tiles each takes, per arch.
//   buckets.cpp  the token ranges and row tile heights every arch shares, and the dispatch
//   sm90.cpp     sm_90a: warpgroup-MMA tiles, and the "wide" band of 192-row tiles
//   sm80.cpp     every other tensor-core arch (mma.sync tiles), and the SIMT fallback
// To change a bucket's tiles, edit the arch's file; the measurements behind each choice are in
// its comments and bench/RESULTS.md.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compiler/plan.h"

namespace moejit {

// The buckets and tiles for a spec on `arch`, in token order, covering every T >= 1.
std::vector<TokenBucket> plan_buckets(const LayerSpec& spec, const std::string& arch);

namespace heuristics {

// Token counts each bucket is tiled for.
constexpr int64_t kDecodeTokens = 16, kMidTokens = 256, kPrefillTokens = 4096;

// A bucket before its tiles: its token range, where autotune times it, the T whose rows per
// expert choose its row tile, and whether it takes 192-row wgmma tiles.
struct BucketRange {
  BucketKind kind;
  int64_t min, max, tuned;
  int64_t representative;
  bool wide = false;
};

// The row tile for a representative T: with uniform routing a local expert sees about T*K/E_loc
// rows, and the tile is the power of two that covers that, 16 to 128, so decode wastes few
// padding rows and prefill reuses each weight tile across many rows.
int row_tile_height(const LayerSpec& spec, int64_t representative_tokens);

// sm90.cpp. The last T of the mid bucket on sm_90a (16-bit weights) whose tile is mid_rows high:
// the T before the mean rows an expert reach mid_rows, within [33, 512].
int64_t sm90_mid_end(const LayerSpec& spec, int mid_rows);
// The ranges that replace the prefill range [from, INT64_MAX] on sm_90a ("short", "wide",
// "prefill"), or empty when the spec has no band of 192-row tiles.
std::vector<BucketRange> sm90_prefill_ranges(const LayerSpec& spec, int64_t from);
// The token counts [first, last] at or above `from` that get 192-row tiles, or {0, -1}.
std::pair<int64_t, int64_t> wide_row_band(const LayerSpec& spec, int64_t from);
// The wgmma tiles of a bucket with row tile bm (64 or 128), or 192 rows when `wide`.
void sm90_tiles(const LayerSpec& spec, int bm, bool wide, TokenBucket& bucket);
// The wgmma tiles of a bucket with row tile bm (any; 64 at least) for 8-bit weights.
void sm90_8bit_tiles(const LayerSpec& spec, int bm, TokenBucket& bucket);

// sm80.cpp. The mma.sync tile for row tile height bm (the decode bucket takes its own).
TileShape tensor_core_tile(const LayerSpec& spec, int bm, bool gemm1, bool decode_bucket);
// The SIMT tiles of a bucket with row tile bm.
void simt_tiles(int bm, TokenBucket& bucket);

}  // namespace heuristics
}  // namespace moejit
