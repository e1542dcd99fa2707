// Stages 4 and 5 on tensor cores: the grouped GEMM of grouped_gemm.cuh, C[p, n] = sum_k A[p, k] *
// W[e, n, k], for bf16/fp16 operands in the nk layout, with mma.sync m16n8k16 (fp32 accumulate),
// ldmatrix from XOR-swizzled shared memory and a cp.async pipeline of kStages stages.
//
// What it fuses: GEMM 1 gathers hidden rows straight into its cp.async loads (no expanded copy),
// loads the gate and the up rows of the same columns into one weight tile so the activation
// act(gate) * up is applied in registers (no [T*K, 2I] round trip); GEMM 2 stores Y in sorted order
// for the fixed-order combine.
//
// Grid: 1-D, max_row_tiles(T) * ceil(N / kBN) blocks in groups of kGroupRows row tiles: within a
// group the row tile runs fastest, so the row tiles of one expert that are resident together
// share each weight tile through L2, and a group's activation rows stay in L2 while every column
// tile passes over them. Blocks whose row tile is past *num_tiles exit; they come last.
//
// Spec:
//   using A, W, Out (one 16-bit type: __nv_bfloat16 or __half)
//   kBM (multiple of 16 * kWarpsM), kBN (output columns; multiple of 8 * kWarpsN), kBK = 64
//   kStages >= 2, kWarpsM, kWarpsN (threads = 32 * kWarpsM * kWarpsN), kGroupRows
//   kN, kK (kK % 8 == 0), kGemm1, kGated, kAct, kGather, kTopk
//   kSharedBytes: the dynamic shared memory the launch provides
//   kWeightsBeforeWait: the entry point left the wait for the previous kernel to the body, which
//   first issues the weight copies of the first stages (GEMM 2; gemm_tiles.cuh's wait_in_body)
#pragma once

#include "moejit/gemm_tiles.cuh"

namespace moejit {
namespace mma_detail {

__device__ __forceinline__ void load_matrix_x4(unsigned address, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                            const __nv_bfloat16*) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                            const __half*) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace mma_detail

template <typename Spec>
__device__ void grouped_gemm_mma(const GemmArgs& args) {
  using namespace mma_detail;
  using namespace tile;
  using T = typename Spec::A;
  constexpr int BM = Spec::kBM, BN = Spec::kBN, BK = Spec::kBK, STAGES = Spec::kStages;
  constexpr int WARPS_M = Spec::kWarpsM, WARPS_N = Spec::kWarpsN, THREADS = 32 * WARPS_M * WARPS_N;
  constexpr int HALVES = Spec::kGated ? 2 : 1;  // gate rows, then up rows of the same columns
  constexpr int TILE_W_ROWS = HALVES * BN;
  constexpr long long N = Spec::kN, K = Spec::kK;
  constexpr long long EXPERT_W_ROWS = HALVES * N;
  constexpr int WARP_ROWS = BM / WARPS_M, WARP_COLS = BN / WARPS_N;
  constexpr int MF = WARP_ROWS / 16;       // 16-row fragments per warp
  constexpr int NF = WARP_COLS / 8;        // 8-column fragments per warp and half
  constexpr int FRAGS = HALVES * NF;       // gate fragments first, then the up ones
  constexpr int A_STAGE = BM * BK, W_STAGE = TILE_W_ROWS * BK;  // elements
  constexpr int K_TILES = static_cast<int>((K + BK - 1) / BK);
  constexpr int COL_TILES = static_cast<int>((N + BN - 1) / BN);
  static_assert(BK == 64, "the swizzle assumes 64-element (128-byte) rows");
  static_assert(WARP_ROWS % 16 == 0 && WARP_COLS % 8 == 0 && FRAGS % 2 == 0, "warp tile shape");
  static_assert(STAGES >= 2, "a pipeline needs two stages");
  static_assert(sizeof(T) == 2, "16-bit operands only");
  static_assert(static_cast<long long>(STAGES) * (A_STAGE + W_STAGE) * 2 + BM * 8 <= Spec::kSharedBytes,
                "the launch's shared memory must hold the pipeline");

  extern __shared__ __align__(128) unsigned char shared_raw[];
  T* a_smem = reinterpret_cast<T*>(shared_raw);
  T* w_smem = a_smem + STAGES * A_STAGE;
  long long* a_row = reinterpret_cast<long long*>(w_smem + STAGES * W_STAGE);

  // Grouped rasterization of the 1-D grid (see the header).
  const Position at = grouped_position<Spec::kGroupRows>(COL_TILES);
  const int tile = at.tile, col_tile = at.col_tile;
  const ScheduledTile scheduled = scheduled_tile(args, tile);
  const int tiles = scheduled.tiles, expert = scheduled.expert;
  const long long row0 = scheduled.row0;
  if (tile >= tiles) return wait_in_body<Spec::kWeightsBeforeWait>();
  const long long n0 = static_cast<long long>(col_tile) * BN;
  const T* w = static_cast<const T*>(args.w) + static_cast<long long>(expert) * EXPERT_W_ROWS * K;

  // The weight rows of the pipeline's first stages are copied before the A rows are resolved
  // (their chain of dependent reads: the expert's row count, then GEMM 1's gather), so the
  // weights, most of a small-T GEMM's bytes, are in flight that much earlier. Group 0 then holds
  // those weight copies and stage 0's A rows, group s stage s's A rows: stage kt is complete once
  // group kt is, which is what the main loop's wait counts assume. GEMM 2 issues them even before
  // GEMM 1, whose output is its A, has finished (kWeightsBeforeWait).
  const WeightRows<T, BN, HALVES, THREADS, N, K> weight_rows(w, n0, threadIdx.x);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < K_TILES) weight_rows.load(w_smem + s * W_STAGE, s);
  wait_in_body<Spec::kWeightsBeforeWait>();

  const int rows = static_cast<int>(min(static_cast<long long>(BM), args.expert_offsets[expert + 1] - row0));
  // Source row of each tile row, resolved once: the gather of GEMM 1 happens here.
  resolve_source_rows<BM, THREADS, Spec::kGather, Spec::kTopk>(args, row0, rows, a_row);
  const SourceRows<T, BM, THREADS, K> a_rows(static_cast<const T*>(args.a), a_row, threadIdx.x);
  auto load_stage = [&](int slot, int kt) {
    a_rows.load(a_smem + slot * A_STAGE, kt);
    weight_rows.load(w_smem + slot * W_STAGE, kt);
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;

  float acc[MF][FRAGS][4];
#pragma unroll
  for (int i = 0; i < MF; ++i)
#pragma unroll
    for (int j = 0; j < FRAGS; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < K_TILES) a_rows.load(a_smem + s * A_STAGE, s);
    commit_async();  // an empty group keeps the wait counts uniform
  }

  // First smem row of 8-column fragment `frag` of this warp (gate fragments, then up ones).
  auto w_frag_row = [&](int frag) {
    const int half = frag / NF, j = frag % NF;
    return half * BN + warp_n * WARP_COLS + j * 8;
  };

  int read_slot = 0, write_slot = STAGES - 1;  // kt % STAGES and (kt + STAGES - 1) % STAGES
  for (int kt = 0; kt < K_TILES; ++kt) {
    wait_async<STAGES - 2>();
    __syncthreads();  // stage kt is visible, and every warp is done with the slot refilled next
    if (kt + STAGES - 1 < K_TILES) load_stage(write_slot, kt + STAGES - 1);
    commit_async();
    write_slot = write_slot == STAGES - 1 ? 0 : write_slot + 1;

    const T* as = a_smem + read_slot * A_STAGE;
    const T* ws = w_smem + read_slot * W_STAGE;
    read_slot = read_slot == STAGES - 1 ? 0 : read_slot + 1;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      unsigned af[MF][4];
#pragma unroll
      for (int i = 0; i < MF; ++i) {
        const int row = warp_m * WARP_ROWS + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        load_matrix_x4(shared_address(as + swizzled(row, kk * 2 + (lane >> 4))), af[i]);
      }
      unsigned bf[FRAGS][2];
#pragma unroll
      for (int p = 0; p < FRAGS / 2; ++p) {
        const int row = w_frag_row(2 * p + (lane >> 4)) + (lane & 7);
        unsigned r[4];
        load_matrix_x4(shared_address(ws + swizzled(row, kk * 2 + ((lane >> 3) & 1))), r);
        bf[2 * p][0] = r[0];
        bf[2 * p][1] = r[1];
        bf[2 * p + 1][0] = r[2];
        bf[2 * p + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < FRAGS; ++j) mma_16x8x16(acc[i][j], af[i], bf[j][0], bf[j][1], static_cast<const T*>(nullptr));
    }
  }
  wait_async<0>();

  // Epilogue: thread (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns 2t and 2t + 1
  // of each fragment.
  T* out = static_cast<T*>(args.out);
#pragma unroll
  for (int i = 0; i < MF; ++i) {
#pragma unroll
    for (int j = 0; j < NF; ++j) {
      const long long col = n0 + warp_n * WARP_COLS + j * 8 + (lane & 3) * 2;
      if (col >= N) continue;  // N is even, so col + 1 < N too
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_m * WARP_ROWS + i * 16 + (lane >> 2) + h * 8;
        if (r >= rows) continue;
        float x = acc[i][j][2 * h], y = acc[i][j][2 * h + 1];
        if constexpr (Spec::kGemm1) {
          x = activate<Spec::kAct>(x);
          y = activate<Spec::kAct>(y);
          if constexpr (Spec::kGated) {
            x *= acc[i][NF + j][2 * h];
            y *= acc[i][NF + j][2 * h + 1];
          }
        }
        store_pair(out + (row0 + r) * N + col, x, y);
      }
    }
  }
}

}  // namespace moejit
