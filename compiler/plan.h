// Plan: which kernels a layer needs, their compile-time parameters, tiles per token bucket and
// launch rules. A pure, printable value computed from a LayerSpec and a target arch
// (planner.h); it holds no rank, device or pointer, so every rank of a group shares it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/moe_config.h"

namespace moejit {

// SPEC.md's stages, as `moejit dump-source --stage` names them. Exchange is not one of a layer's
// stages (all_stages() leaves it out): the kernels around the all_to_all mode's NCCL exchanges,
// which exchange_plan (compiler/families/exchange.h) plans beside a layer's plan.
enum class Stage { Routing, Index, Expand, Gemm1, Gemm2, Combine, Exchange };
std::string_view to_string(Stage stage);
// Throws InvalidInput listing the stage names (exchange included).
Stage parse_stage(std::string_view name);
const std::vector<Stage>& all_stages();

// The part a kernel plays in a layer call. The runtime finds and launches kernels by role (and a
// GEMM by its bucket), never by name.
enum class KernelRole {
  Routing,         // stage 1
  IndexCount,      // stage 2, first kernel: per-block expert counts
  IndexScatter,    // stage 2, second kernel: offsets, positions, tile schedule
  RouteIndex,      // stages 1 and 2 in one single-block launch (small batches)
  RouterGemm,      // stage 1's router GEMM (router_gemm layers): logits from the gate weight
  QuantizeExpand,  // quantized stage 3: w8a8 gathers, smooths, quantizes hidden rows; fp8
                   // quantizes each token's row (GEMM 1 gathers)
  QuantizeAct,     // quantized: re-quantize GEMM 1's fp32 output for GEMM 2
  Gemm1,           // stage 4 with the activation (one kernel per distinct tile)
  Gemm2,           // stage 5
  Combine,         // stage 6
  ExchangeSlots,   // all_to_all: each token's row in each rank's send slab
  ExchangePack,    // all_to_all: the send slabs' rows, ids and weights
  ExchangeCombine, // all_to_all: the ranks' returned sums (+ residual) into the output
};
std::string_view to_string(KernelRole role);

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
  TokenTilesByColumns,  // (ceil(T / token_tile), ceil(E / per_block)) blocks (router GEMM)
  RanksOfGroup,       // ep_size blocks (the all_to_all exchange's slots)
  SlabRowsByColumns,  // (ep_size * C, ceil(H / per_block)) blocks (the all_to_all exchange's pack)
};
std::string_view to_string(GridRule rule);

struct LaunchRule {
  GridRule rule = GridRule::SingleBlock;
  int threads = 0;
  int64_t per_block = 1;  // tokens, pairs or columns per block, as the rule says
  int shared_bytes = 0;   // dynamic shared memory per block
  int64_t columns = 0;    // N (H for the combine) of the rules that tile columns
  int64_t token_tile = 0; // tokens per block (TokenTilesByColumns)
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
  KernelRole role;
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
  // The argument is __grid_constant__: the kernel takes the address of a member (a TMA tensor
  // map), which without the qualifier would be copied to local memory first.
  bool grid_constant_args = false;
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

// "16x32x64 (tensor-core, 6 stages, 1x4 warps)", "128x128x64 (wgmma, 4 stages)" or "16x64x32 (simt)".
std::string describe(const TileShape& tile);

// The token ranges a plan tiles differently, in token order. Decode, mid and prefill always
// exist; on sm_90a the prefill range may split into short, wide (192-row tiles) and prefill.
enum class BucketKind { Decode, Mid, Short, Wide, Prefill };
std::string_view to_string(BucketKind kind);  // "decode", "mid", "short", "wide", "prefill"

// A range of token counts that shares one GEMM tiling. GEMM 1 and 2 share the row tile height,
// so one tile schedule (index_scatter's) serves both.
struct TokenBucket {
  BucketKind kind = BucketKind::Decode;
  int64_t min_tokens = 1;   // inclusive
  int64_t max_tokens = 0;   // inclusive; INT64_MAX for the last bucket
  int64_t tuned_tokens = 0;  // where autotune times the bucket; the planner's tiles follow the rows per
                             // expert at this T, except "short" and "prefill", which keep T=4096's
  TileShape gemm1, gemm2;
  int gemm1_kernel = -1, gemm2_kernel = -1;  // indices into Plan::kernels (Plan::kernel_of)
  int router_kernel = -1;  // router_gemm layers: the bucket's router GEMM kernel (index into Plan::kernels)

  std::string_view name() const { return to_string(kind); }
};

struct Plan {
  LayerSpec spec;
  std::string arch;
  std::vector<TokenBucket> buckets;
  std::vector<KernelPlan> kernels;  // in stage order; GEMMs once per distinct tiling

  const TokenBucket& bucket_for(int64_t tokens) const;
  const KernelPlan& kernel(std::string_view entry) const;
  // The GEMM 1 (gemm1) or GEMM 2 kernel of one of this plan's buckets.
  const KernelPlan& kernel_of(const TokenBucket& bucket, bool gemm1) const;
  // The index in `kernels` of the first kernel playing `role` (not Gemm1/Gemm2/RouterGemm, a kernel
  // per bucket: see TokenBucket);
  // -1 when the plan has none (the quantize roles of an unquantized layer).
  int kernel_index(KernelRole role) const;
  std::vector<std::string> unit_names() const;  // in first-use order
};

}  // namespace moejit
