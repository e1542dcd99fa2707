// Plan: which kernels a layer needs, their compile-time parameters, tiles per token bucket and
// launch rules. A pure, printable value computed from a MoeConfig and a target arch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/moe_config.h"

namespace moejit {

enum class Stage { Routing, Index, Expand, Gemm1, Gemm2, Combine };
std::string_view to_string(Stage stage);
// Throws InvalidInput listing the stage names.
Stage parse_stage(std::string_view name);
const std::vector<Stage>& all_stages();

// How the runtime derives a kernel's grid from the token count T (block size is `threads`).
enum class GridRule {
  TokensPerBlock,     // ceil(T / per_block) blocks (routing: one warp a token)
  PairsPerBlock,      // ceil(T*K / per_block) blocks (index count)
  PairBlocksCapped,   // min(ceil(T*K / per_block), kMaxIndexScatterBlocks) blocks (index scatter)
  SingleBlock,        // 1 block (routing and index in one launch)
  SortedRows,         // T*K blocks, one per expert-sorted row; rows past the local count exit
  RowTilesByColumns,  // (max_tiles(T), ceil(N / per_block)) blocks (SIMT grouped GEMMs)
  RowTileGroups,      // max_tiles(T) * ceil(N / per_block) blocks, 1-D (tensor-core grouped GEMMs)
  TokensByColumns,    // (T, ceil(H / per_block)) blocks (combine)
};
std::string_view to_string(GridRule rule);

struct LaunchRule {
  GridRule rule = GridRule::SingleBlock;
  int threads = 0;
  int64_t per_block = 1;  // tokens, pairs or columns per block, as the rule says
  int shared_bytes = 0;   // dynamic shared memory per block
};

// One compile-time constant of a kernel's Spec struct, rendered by codegen as
// `using name = value;` (is_type) or `static constexpr type name = value;`.
struct SpecItem {
  std::string type;   // "int", "bool", "float", or "using" for a type alias
  std::string name;
  std::string value;
};

struct KernelPlan {
  Stage stage;
  std::string entry;            // extern "C" name; spells the specialization
  std::string unit;             // the translation unit that holds it
  std::string device_function;  // template in templates/*.cuh, e.g. "moejit::route_tokens"
  std::string args_type;        // e.g. "moejit::RouteArgs"
  std::string header;           // "moejit/routing.cuh"
  std::string spec_name;        // the Spec struct; kernels of one family may share one
  std::vector<SpecItem> spec;
  LaunchRule launch;
  // The device function calls wait_for_previous_kernel() and allow_next_kernel_launch() itself,
  // after work that needs nothing the previous kernel writes; the entry point then does not.
  bool waits_in_body = false;
};

// Which grouped-GEMM template a tile runs on.
enum class GemmKernel {
  Simt,        // grouped_gemm.cuh: any dtype, layout, quantization and shape
  TensorCore,  // mma_gemm.cuh: bf16/fp16, nk layout, H and I multiples of 8 (mma.sync, cp.async)
  Wgmma,       // wgmma_gemm.cuh: as TensorCore, on sm_90a only (warpgroup MMA from shared memory)
};
std::string_view to_string(GemmKernel kernel);

struct TileShape {
  GemmKernel kernel = GemmKernel::Simt;
  int bm = 0, bn = 0, bk = 0;          // bn counts output columns (gate and up: 2*bn weight rows)
  int warps_m = 0, warps_n = 0;        // tensor core: the warp grid of a block (wgmma: bm / 16 + 4 x 1)
  int stages = 0;                      // tensor core and wgmma: cp.async pipeline depth
};

// A range of token counts that shares one GEMM tiling. GEMM 1 and 2 share the row tile height,
// so one tile schedule (index_scatter's) serves both.
struct TokenBucket {
  std::string name;         // "decode", "mid", then "prefill"; on sm_90a maybe "short" and "wide" before it
  int64_t min_tokens = 1;   // inclusive
  int64_t max_tokens = 0;   // inclusive; INT64_MAX for the last bucket
  int64_t tuned_tokens = 0;  // where autotune times the bucket; the planner's tiles follow the rows per
                             // expert at this T, except "short" and "prefill", which keep T=4096's
  TileShape gemm1, gemm2;
  std::string gemm1_entry, gemm2_entry;
};

struct Plan {
  MoeConfig config;
  std::string arch;
  std::vector<TokenBucket> buckets;
  std::vector<KernelPlan> kernels;  // in stage order; GEMMs once per distinct tiling

  const TokenBucket& bucket_for(int64_t tokens) const;
  const KernelPlan& kernel(std::string_view entry) const;
  std::vector<std::string> unit_names() const;  // in first-use order
};

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

// Tile pairs (GEMM 1, GEMM 2) worth timing for one bucket of `config`, the planner's own first;
// every pair fits the config and `arch`, and both GEMMs of a pair share one row tile: the bucket's,
// or on sm_90a 192 for a 128-row bucket and 128 for a 192-row one. One pair when there is nothing to
// choose (the SIMT kernels).
std::vector<std::pair<TileShape, TileShape>> tile_candidates(const MoeConfig& config, const TokenBucket& bucket,
                                                             const std::string& arch);

// Validates the config (InvalidInput) and plans every kernel. Deterministic. Overrides replace the
// planner's tiles; an override that names no bucket, does not fit the config, or gives the two
// GEMMs of a bucket different row tiles is refused (InvalidInput).
Plan make_plan(const MoeConfig& config, const std::string& arch, const std::vector<TileOverride>& overrides = {});

// The buckets and tiles for a config on `arch`: a closed-form choice, no tuning table.
std::vector<TokenBucket> plan_buckets(const MoeConfig& config, const std::string& arch);

// Whether `arch` runs the warpgroup-MMA GEMMs (wgmma is sm_90a-specific).
bool wgmma_arch(const std::string& arch);

// Upper bound of GEMM row tiles for `tokens` tokens with row tile height `bm`:
// sum_e ceil(count_e / bm) <= ceil(T*K / bm) + E_loc.
int64_t max_row_tiles(const MoeConfig& config, int64_t tokens, int bm);

constexpr int kPairsPerIndexBlock = 1024;
// Warps of an index_count / index_scatter block (each scatter warp places a slice of 128 pairs).
constexpr int kIndexWarps = 8;
// Every index_scatter block reads the whole count table (index.cuh); this cap keeps those reads
// linear in T*K. Up to 128 * 1024 pairs each scatter block places one count block's pairs.
constexpr int64_t kMaxIndexScatterBlocks = 128;

// Up to this many tokens forward() routes and indexes in one single-block launch
// (route_index.cuh); experts() indexes in one launch whenever T*K <= kPairsPerIndexBlock.
constexpr int64_t kFusedRouteIndexMaxTokens = 32;

// The workspace of one layer call, a pure function of (config, max_tokens) (DESIGN.md decision 6).
struct WorkspaceBuffer {
  std::string name;
  int64_t offset = 0;
  int64_t bytes = 0;
  std::string what;
};

struct WorkspaceLayout {
  int64_t max_tokens = 0;
  int64_t total_bytes = 0;
  std::vector<WorkspaceBuffer> buffers;

  // Throws Error when the buffer is not part of this layout.
  const WorkspaceBuffer& at(std::string_view name) const;
};

// Throws InvalidInput when max_tokens < 0 or the config is invalid.
WorkspaceLayout plan_workspace(const MoeConfig& config, int64_t max_tokens);

// The same layout as byte offsets, computed without allocating or validating (a layer forward
// calls it per call). Buffers the config does not use are -1.
struct WorkspaceOffsets {
  int64_t topk_weights = -1, topk_ids = -1, block_counts = -1, expert_counts = -1, expert_offsets = -1,
          sorted_pair = -1, pair_pos = -1, tile_expert = -1, tile_row = -1, num_tiles = -1;
  int64_t act = -1, y = -1;                                               // unquantized act; y always
  int64_t a_q = -1, a_scale = -1, act_f32 = -1, act_q = -1, act_scale = -1;  // w8a8
  int64_t total_bytes = 0;
};
WorkspaceOffsets workspace_offsets(const MoeConfig& config, int64_t tokens);

// "16x32x64 (tensor-core, 6 stages, 1x4 warps)", "128x128x64 (wgmma, 4 stages)" or "16x64x32 (simt)".
std::string describe(const TileShape& tile);

// Human-readable plan (buckets, kernels with launch rules, workspace for max_tokens).
std::string describe(const Plan& plan, int64_t max_tokens);

}  // namespace moejit
