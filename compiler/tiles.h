// Tiles chosen from outside the planner: the MOEJIT_TILES form of a tile (parsed and printed), and
// the candidates autotune times per bucket.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/plan.h"

namespace moejit {

// A tile the caller chooses instead of the planner's, for one GEMM of one bucket. Written
// "<bucket>.<gemm1|gemm2>=tc:<BM>x<BN>x64:s<stages>:w<warps_m>x<warps_n>",
// "<bucket>.<gemm1|gemm2>=wg:<BM>x<BN>x64:s<stages>" or "<bucket>.<gemm1|gemm2>=simt:<BM>x<BN>x<BK>";
// BN counts output columns.
struct TileOverride {
  std::string bucket;
  bool gemm1 = true;
  TileShape tile;
};

// Parses a comma-separated list of overrides (MOEJIT_TILES); throws InvalidInput naming `source`
// and the allowed form.
std::vector<TileOverride> parse_tile_overrides(std::string_view text, std::string_view source = "MOEJIT_TILES");

// "decode.gemm1=tc:16x16x64:s8:w1x2": the MOEJIT_TILES form of one override (parses back to it).
std::string to_string(const TileOverride& tile);
// The overrides joined with commas (the form a tuning record stores).
std::string to_string(const std::vector<TileOverride>& tiles);

// Tile pairs (GEMM 1, GEMM 2) worth timing for one bucket of `spec`, the planner's own first;
// every pair fits the spec and `arch`, and both GEMMs of a pair share one row tile: the bucket's,
// or on sm_90a 192 for a 128-row bucket and 128 for a 192-row one. One pair when there is nothing to
// choose (the SIMT kernels).
std::vector<std::pair<TileShape, TileShape>> tile_candidates(const LayerSpec& spec, const TokenBucket& bucket,
                                                             const std::string& arch);

}  // namespace moejit
