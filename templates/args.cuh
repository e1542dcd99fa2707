// Kernel arguments, one plain struct per stage. No CUDA keywords here: the host runtime includes
// this file too, so the layout the launcher packs is the layout the kernel reads.
// Pointers to tensors whose dtype is a compile-time parameter are void*; the kernel casts.
#pragma once

namespace moejit {

// Stage 1: router logits -> top-k weights and ids.
struct RouteArgs {
  const void* logits;        // [T, E], dtype RouteSpec::Logit
  const float* bias;         // [E] e_score_correction_bias (noaux_tc only; else null)
  float* topk_weights;       // [T, K]
  int* topk_ids;             // [T, K]
  long long tokens;          // T
};

// Stage 1's router GEMM (router_gemm layers, router_gemm.cuh): logits = hidden @ gate_weight^T
// (+ gate_bias).
struct RouterGemmArgs {
  const void* hidden;        // [T, H], dtype RouterGemmSpec::Input
  const void* gate_weight;   // [E, H], the same dtype
  const void* gate_bias;     // [E], the same dtype: router_bias layers (RouterGemmSpec::kBias); else null
  void* logits;              // [T, E], dtype RouterGemmSpec::Logit (the workspace's router_logits)
  long long tokens;          // T
};

// Stage 2: counting sort of the T*K' (token, slot) pairs by local expert (K' = K + fused shared experts).
struct IndexArgs {
  const int* topk_ids;       // [T*K] flat (the routed slots; shared slots are implied)
  long long pairs;           // M = T*K' (K' = K + fused shared experts)
  int expert_begin;          // s = ep_rank * E_loc: the first local expert (run-time, so every
                             // rank of an expert-parallel group shares one binary)
  int tile_rows;             // rows per GEMM tile (BM of the token bucket in use)
  int* block_counts;         // [ceil(M / PAIRS_PER_BLOCK), E_loc]: per-block counts
  int* expert_counts;        // [E_loc]
  int* expert_offsets;       // [E_loc + 1]: exclusive prefix; [E_loc] = local pairs
  int* sorted_pair;          // [M] position p -> flat pair f (dst_to_src)
  int* pair_pos;             // [M] flat pair f -> position p, or -1 when the expert is not local
  int* tile_expert;          // [max_tiles] local expert of each GEMM row tile
  int* tile_row;             // [max_tiles] first sorted position of each tile
  int* num_tiles;            // [1]
  int shared_local;          // 1 where this rank computes the fused shared experts (ep_rank 0):
                             // their pairs are local experts E_loc.. here, not local elsewhere
};

// Stages 1 and 2 in one single-block launch (route_index.cuh): T*K' <= kPairsPerBlock.
struct RouteIndexArgs {
  RouteArgs routing;
  IndexArgs index;           // index.topk_ids == routing.topk_ids
  int route;                 // 0: the routing is given, index only
};

// Stage 3 and the re-quantization after GEMM 1: per-row smoothed int8 quantization (w8a8), or
// fp8 quantization per row and 128-column group (fp8_block) or per row (fp8_tensor).
struct QuantizeArgs {
  const void* src;           // expand: hidden [T, H] (model dtype); requant: act [M, I] fp32
  const int* sorted_pair;    // [M]
  const int* topk_ids;       // [T*K] (the global expert of each routed pair; a shared slot s is
                             // global expert E + s)
  const int* expert_offsets; // [E_loc + 1] (rows beyond [E_loc] are not local)
  int expert_begin;
  const float* smooth;       // w8a8 expand: input_smooth [E, H]; otherwise null
  signed char* q;            // [rows, cols]: int8, or e4m3 bytes (fp8; expand rows are tokens)
  float* scale;              // [rows, groups]: groups = ceil(cols / 128) for fp8_block, else 1
};

// A CUDA tensor map (cuda.h's CUtensorMap: 128 opaque bytes, 128-byte aligned), encoded by the host
// with cuTensorMapEncodeTiled. The warpgroup-MMA GEMMs load their weight tiles through it (TMA).
struct alignas(128) TensorMap {
  unsigned long long opaque[16];
};

// Stages 4 and 5: grouped GEMM over expert-sorted rows.
struct GemmArgs {
  const void* a;             // GEMM 1: hidden [T, H] (rows gathered), int8 [M, H] (w8a8) or
                             // e4m3 [T, H] (fp8, rows gathered); GEMM 2: act [M, I] (model
                             // dtype), int8 or e4m3 [M, I]
  const float* a_scale;      // [rows of a, groups]: w8a8 and fp8_tensor one per row, fp8_block
                             // one per 128 columns
  const int* sorted_pair;    // [M]: the gather of GEMM 1
  const void* w;             // [E_loc, N, K] (layout nk) or [E_loc, K, N] (layout kn)
  const float* w_scale;      // w8a8: [E_loc, N] per output channel; fp8_block:
                             // [E_loc, ceil(N/128), ceil(K/128)]; fp8_tensor: [E_loc]
  const float* act_smooth;   // w8a8 GEMM 1: [E_loc, I], applied before re-quantization
  const float* bias;         // kBias: [E_loc, N] fp32 (GEMM 1: gate rows then up rows), added to
                             // the scaled sums; null adds nothing (GEMM 2 past tensor-parallel rank 0)
  void* out;                 // GEMM 1: act [M, I]; GEMM 2: Y [M, H]
  float* out_scale;          // GEMM 1 with kQuantizeOut (fp8_block): the scales of `out`, which
                             // holds e4m3, [M, I / 128]; otherwise null
  const int* tile_expert;
  const int* tile_row;
  const int* num_tiles;
  const int* expert_offsets;
  TensorMap w_map;           // wgmma kernels: w as a [E_loc * halves][N][K] tensor, box 64 x BN x 1,
                             // 128-byte swizzle (the host fills it per call; others ignore it);
                             // 8-bit weights as pairs of bytes, box 128 x BN x 1
};

// Stage 6: weighted top-k sum in a fixed order.
struct CombineArgs {
  const void* y;             // [M, H], GEMM 2 output in expert-sorted order
  const float* topk_weights; // [T, K] (a fused shared slot weighs 1)
  const int* pair_pos;       // [T*K']
  const void* residual;      // [T, H] or null
  void* out;                 // [T, H]
  long long tokens;
};


// Expert parallel's all_to_all exchange (exchange.cuh, runtime/dispatched_layer.h): slabs of
// `capacity` rows per destination rank; row r * capacity + c of a slab array is rank r's row c.
struct ExchangeSlotsArgs {
  const int* topk_ids;       // [T, K] global experts (an id outside [0, E) goes nowhere)
  long long tokens;          // T <= capacity
  long long capacity;        // C
  int* slot_of;              // [T, ranks]: token t's row in rank r's slab, or -1 (not sent there)
  int* source;               // [ranks * C]: the token a send row carries, or -1 (unused row)
};

struct ExchangePackArgs {
  const void* hidden;        // [T, H] dtype, or e4m3 (fp8 layers: the rows quantized)
  const float* scales;       // fp8: [T, groups], the quantized rows' scales; else null
  const int* topk_ids;       // [T, K]
  const float* topk_weights; // [T, K]
  const int* source;         // [ranks * C] (ExchangeSlotsArgs::source)
  void* send_rows;           // [ranks * C, H] as hidden: the token's row, zeros in an unused row
  float* send_scales;        // fp8: [ranks * C, groups], 0 in an unused row; else null
  int* send_ids;             // [ranks * C, K]: the token's ids, -1 in an unused row
  float* send_weights;       // [ranks * C, K]: the token's weights, 0 in an unused row
};

struct ExchangeCombineArgs {
  const void* returned;      // [ranks * C, H] dtype: each rank's weighted sums of the rows it got
  const int* slot_of;        // [T, ranks]
  const void* residual;      // [T, H] dtype or null
  void* out;                 // [T, H] dtype
  long long tokens;          // T
  long long capacity;        // C
};

}  // namespace moejit
