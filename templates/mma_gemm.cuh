// Stages 4 and 5 on tensor cores: the grouped GEMM of grouped_gemm.cuh, C[p, n] = sum_k A[p, k] *
// W[e, n, k], for bf16/fp16 operands in the nk layout, with mma.sync m16n8k16 (fp32 accumulate),
// ldmatrix from XOR-swizzled shared memory and a cp.async pipeline of kStages stages.
//
// What it fuses: GEMM 1 gathers hidden rows straight into its cp.async loads (no expanded copy),
// loads the gate and the up rows of the same columns into one weight tile so the activation
// act(gate) * up is applied in registers (no [T*K, 2I] round trip); GEMM 2 stores Y in sorted order
// for the fixed-order combine.
//
// 8-bit operands (int8 for w8a8 on sm_80 and later, e4m3 for fp8 on sm_89 and later): mma.sync
// m16n8k32 (s8 x s8 -> s32, e4m3 x e4m3 -> f32), whose fragments, read as pairs of bytes, are
// m16n8k16's: the pipeline copies and ldmatrix-loads 16-bit units as for bf16, a stage is the same
// 128 bytes deep (128 elements, one fp8 scale block). Scaling as wgmma_gemm.cuh: int8 and
// fp8_tensor once in the epilogue (a_scale[row] x w_scale[e][column] or w_scale[e]); fp8_block
// multiplies each k-tile's partial sum by a_scale[row][kt] x w_scale[e][row block][kt] into a
// running fp32 sum. A quantized GEMM 1 stores fp32 (times act_smooth for int8).
//
// Grid: 1-D, max_row_tiles(T) * ceil(N / kBN) blocks in groups of kGroupRows row tiles: within a
// group the row tile runs fastest, so the row tiles of one expert that are resident together
// share each weight tile through L2, and a group's activation rows stay in L2 while every column
// tile passes over them. Blocks whose row tile is past *num_tiles exit; they come last.
//
// Spec:
//   using A, W (one type: __nv_bfloat16, __half, signed char or moejit::e4m3), Out (the model's
//   16-bit type, or float for a quantized GEMM 1)
//   kBM (multiple of 16 * kWarpsM), kBN (output columns; multiple of 8 * kWarpsN), kBK = 64 (16-bit)
//   or 128 (8-bit)
//   kStages >= 2, kWarpsM, kWarpsN (threads = 32 * kWarpsM * kWarpsN), kGroupRows
//   kN, kK (rows of 16-byte chunks), kGemm1, kGated, kAct, kSwigluLimit, kBias, kGather, kTopk
//   8-bit only: kScaling (common.cuh's ScalingKind), kScaleCols, kScaleRows (grouped_gemm.cuh)
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

// The A fragment of k16 step kk (16 units) of tile rows row0..row0 + 15, from a 128-byte-swizzled
// tile of 64-unit rows: lanes 0-15 address the rows' first 8 units, lanes 16-31 the next 8.
template <typename T>
__device__ __forceinline__ void load_a_fragment(const T* tile, int row0, int kk, int lane, unsigned (&a)[4]) {
  const int row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
  load_matrix_x4(tile::shared_address(tile + tile::swizzled(row, kk * 2 + (lane >> 4))), a);
}

// Two B fragments of k16 step kk (8 nk-layout weight rows each) from the same kind of tile: `row`
// is this lane's row, the first fragment's rows for lanes 0-15 and the second's for lanes 16-31.
template <typename T>
__device__ __forceinline__ void load_b_fragments(const T* tile, int row, int kk, int lane, unsigned (&b0)[2],
                                                 unsigned (&b1)[2]) {
  unsigned r[4];
  load_matrix_x4(tile::shared_address(tile + tile::swizzled(row, kk * 2 + ((lane >> 3) & 1))), r);
  b0[0] = r[0];
  b0[1] = r[1];
  b1[0] = r[2];
  b1[1] = r[3];
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

// 8-bit operands, K = 32 (templates: instantiated, so emitted, only where a kernel multiplies
// that type; e4m3 needs sm_89).
template <int = 0>
__device__ __forceinline__ void mma_16x8x32(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                            const signed char*) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int = 0>
__device__ __forceinline__ void mma_16x8x32(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                            const e4m3*) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace mma_detail

template <typename Spec>
__device__ void grouped_gemm_mma(const GemmArgs& args) {
  using namespace mma_detail;
  using namespace tile;
  using Operand = typename Spec::A;                // what the mma multiplies
  using T = typename PipelineUnit<Operand>::type;  // what the pipeline copies: 16 bits
  using Acc = typename Accumulator<Operand>::type;
  using Out = typename Spec::Out;
  constexpr bool EIGHT_BIT = sizeof(Operand) == 1;
  constexpr int SCALING = Scaling<Spec, EIGHT_BIT>::kind;
  constexpr bool BLOCK = SCALING == kBlockScaling;  // a running sum, scaled per K block
  constexpr int ELEMENTS_PER_UNIT = static_cast<int>(sizeof(T) / sizeof(Operand));
  // BK and K below count pipeline units: a k-tile of 64 units is 128 bytes of a row.
  constexpr int BM = Spec::kBM, BN = Spec::kBN, BK = Spec::kBK / ELEMENTS_PER_UNIT, STAGES = Spec::kStages;
  constexpr int WARPS_M = Spec::kWarpsM, WARPS_N = Spec::kWarpsN, THREADS = 32 * WARPS_M * WARPS_N;
  constexpr int HALVES = Spec::kGated ? 2 : 1;  // gate rows, then up rows of the same columns
  constexpr int TILE_W_ROWS = HALVES * BN;
  constexpr long long N = Spec::kN, K = Spec::kK / ELEMENTS_PER_UNIT;
  constexpr long long EXPERT_W_ROWS = HALVES * N;
  constexpr int WARP_ROWS = BM / WARPS_M, WARP_COLS = BN / WARPS_N;
  constexpr int MF = WARP_ROWS / 16;       // 16-row fragments per warp
  constexpr int NF = WARP_COLS / 8;        // 8-column fragments per warp and half
  constexpr int FRAGS = HALVES * NF;       // gate fragments first, then the up ones
  constexpr int A_STAGE = BM * BK, W_STAGE = TILE_W_ROWS * BK;  // units
  constexpr int K_TILES = static_cast<int>((K + BK - 1) / BK);
  constexpr int COL_TILES = static_cast<int>((N + BN - 1) / BN);
  static_assert(BK == 64, "the swizzle assumes 64-unit (128-byte) rows");
  static_assert(WARP_ROWS % 16 == 0 && WARP_COLS % 8 == 0 && FRAGS % 2 == 0, "warp tile shape");
  static_assert(STAGES >= 2, "a pipeline needs two stages");
  static_assert(sizeof(T) == 2, "16-bit pipeline units");
  static_assert(Spec::kK % ELEMENTS_PER_UNIT == 0, "8-bit rows of whole byte pairs");
  static_assert(!BLOCK || Spec::kBK == Scaling<Spec, EIGHT_BIT>::cols, "a k-tile is one scale block");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static_assert(!EIGHT_BIT || SCALING == kRowChannelScaling, "e4m3 mma.sync needs sm_89 or later");
#endif
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

  Acc acc[MF][FRAGS][4];
#pragma unroll
  for (int i = 0; i < MF; ++i)
#pragma unroll
    for (int j = 0; j < FRAGS; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = Acc(0);

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
  // The tile row of this thread's accumulators (i, h): fragment rows lane / 4 and 8 more.
  auto acc_row = [&](int i, int h) { return warp_m * WARP_ROWS + i * 16 + (lane >> 2) + h * 8; };
  // The output column of this thread's accumulator pair of fragment j (within its half).
  auto acc_col = [&](int j) { return n0 + warp_n * WARP_COLS + (j % NF) * 8 + (lane & 3) * 2; };

  // 8-bit: the scale blocks of the activation rows (per row) and of the expert's weights.
  constexpr long long SCALE_COLS = Scaling<Spec, EIGHT_BIT>::cols, SCALE_ROWS = Scaling<Spec, EIGHT_BIT>::rows;
  constexpr long long A_GROUPS = (Spec::kK + SCALE_COLS - 1) / SCALE_COLS;
  constexpr long long W_ROW_BLOCKS = (HALVES * N + SCALE_ROWS - 1) / SCALE_ROWS;
  // fp8_block: the running sum, and where this thread's weight rows find their scales: a half's
  // WARP_COLS (<= 128) rows from first_row meet at most one block edge; fragments of columns below
  // `edge` have row block first_block[half], the others the next one.
  static_assert(!BLOCK || (WARP_COLS <= SCALE_ROWS && SCALE_ROWS % 8 == 0), "a half's rows span at most two row blocks");
  float total[BLOCK ? MF : 1][BLOCK ? FRAGS : 1][4];
  int first_block[HALVES], edge[HALVES];
  if constexpr (BLOCK) {
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
      for (int j = 0; j < FRAGS; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) total[i][j][v] = 0.0f;
#pragma unroll
    for (int h = 0; h < HALVES; ++h) {
      const long long first_row = h * N + n0 + warp_n * WARP_COLS;
      first_block[h] = static_cast<int>(first_row / SCALE_ROWS);
      edge[h] = static_cast<int>((first_block[h] + 1) * SCALE_ROWS - first_row);
    }
  }
  const float* w_block_scales = BLOCK ? args.w_scale + expert * W_ROW_BLOCKS * A_GROUPS : nullptr;

  int read_slot = 0, write_slot = STAGES - 1;  // kt % STAGES and (kt + STAGES - 1) % STAGES
  for (int kt = 0; kt < K_TILES; ++kt) {
    wait_async<STAGES - 2>();
    __syncthreads();  // stage kt is visible, and every warp is done with the slot refilled next
    if (kt + STAGES - 1 < K_TILES) load_stage(write_slot, kt + STAGES - 1);
    commit_async();
    write_slot = write_slot == STAGES - 1 ? 0 : write_slot + 1;

    // fp8_block: this k-tile's scales, read while its mmas run: the activation scales of the
    // thread's rows (a_row: their source rows, -1 for none) and, per half, the weight scales of
    // its (at most two) row blocks.
    float row_scale[BLOCK ? MF : 1][2], block_scale[HALVES][2];
    if constexpr (BLOCK) {
#pragma unroll
      for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const long long src = a_row[acc_row(i, h)];
          row_scale[i][h] = src >= 0 ? __ldg(args.a_scale + src * A_GROUPS + kt) : 0.0f;
        }
#pragma unroll
      for (int h = 0; h < HALVES; ++h) {
        block_scale[h][0] = first_block[h] < W_ROW_BLOCKS ? __ldg(w_block_scales + first_block[h] * A_GROUPS + kt) : 0.0f;
        block_scale[h][1] = edge[h] < WARP_COLS && first_block[h] + 1 < W_ROW_BLOCKS
                                ? __ldg(w_block_scales + (first_block[h] + 1) * A_GROUPS + kt)
                                : 0.0f;
      }
    }

    const T* as = a_smem + read_slot * A_STAGE;
    const T* ws = w_smem + read_slot * W_STAGE;
    read_slot = read_slot == STAGES - 1 ? 0 : read_slot + 1;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {  // 16 units: k16 of 16-bit, k32 of 8-bit operands
      unsigned af[MF][4];
#pragma unroll
      for (int i = 0; i < MF; ++i) load_a_fragment(as, warp_m * WARP_ROWS + i * 16, kk, lane, af[i]);
      unsigned bf[FRAGS][2];
#pragma unroll
      for (int p = 0; p < FRAGS / 2; ++p)
        load_b_fragments(ws, w_frag_row(2 * p + (lane >> 4)) + (lane & 7), kk, lane, bf[2 * p], bf[2 * p + 1]);
#pragma unroll
      for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < FRAGS; ++j) {
          if constexpr (EIGHT_BIT)
            mma_16x8x32(acc[i][j], af[i], bf[j][0], bf[j][1], static_cast<const Operand*>(nullptr));
          else
            mma_16x8x16(acc[i][j], af[i], bf[j][0], bf[j][1], static_cast<const Operand*>(nullptr));
        }
    }
    if constexpr (BLOCK) {
      // The k-tile's partial sums into the running sum; the next k-tile starts afresh.
#pragma unroll
      for (int j = 0; j < FRAGS; ++j) {
        const int half = j / NF;
        const float w_scale = (j % NF) * 8 < edge[half] ? block_scale[half][0] : block_scale[half][1];
#pragma unroll
        for (int i = 0; i < MF; ++i)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            total[i][j][v] = fmaf(acc[i][j][v], row_scale[i][v / 2] * w_scale, total[i][j][v]);
            acc[i][j][v] = 0.0f;
          }
      }
    }
  }
  wait_async<0>();

  // int8 and fp8_tensor: the expert's tensor scale.
  float tensor_scale = 1.0f;
  if constexpr (SCALING == kTensorScaling) tensor_scale = __ldg(args.w_scale + expert);
  // The sum of accumulator (i, j, v), scaled back for 8-bit operands; r its tile row's source row
  // (row scales), col its column.
  auto scaled = [&](int i, int j, int v, float row_scale, long long col) -> float {
    if constexpr (BLOCK) {
      return total[i][j][v];
    } else if constexpr (SCALING == kRowChannelScaling) {
      const float channel = __ldg(args.w_scale + (static_cast<long long>(expert) * HALVES + j / NF) * N + col);
      return static_cast<float>(acc[i][j][v]) * row_scale * channel;
    } else if constexpr (SCALING == kTensorScaling) {
      return acc[i][j][v] * row_scale * tensor_scale;
    } else {
      return acc[i][j][v];
    }
  };
  // ... plus the expert's bias of that weight row (kBias; fragment j < NF: the gate half).
  auto sum = [&](int i, int j, int v, float row_scale, long long col) -> float {
    float x = scaled(i, j, v, row_scale, col);
    if constexpr (Spec::kBias)
      if (args.bias != nullptr) x += __ldg(args.bias + (static_cast<long long>(expert) * HALVES + j / NF) * N + col);
    return x;
  };

  // Epilogue: thread (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns 2t and 2t + 1
  // of each fragment.
  Out* out = static_cast<Out*>(args.out);
#pragma unroll
  for (int i = 0; i < MF; ++i) {
#pragma unroll
    for (int j = 0; j < NF; ++j) {
      const long long col = acc_col(j);
      if (col >= N) continue;  // N is even, so col + 1 < N too
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = acc_row(i, h);
        if (r >= rows) continue;
        float row_scale = 1.0f;  // int8 and fp8_tensor: the row's activation scale
        if constexpr (SCALING == kRowChannelScaling || SCALING == kTensorScaling) row_scale = __ldg(args.a_scale + a_row[r]);
        float x = sum(i, j, 2 * h, row_scale, col), y = sum(i, j, 2 * h + 1, row_scale, col + 1);
        if constexpr (Spec::kGemm1) {
          if constexpr (Spec::kGated) {
            x = gated_activation<Spec::kAct>(x, sum(i, NF + j, 2 * h, row_scale, col), Spec::kSwigluLimit);
            y = gated_activation<Spec::kAct>(y, sum(i, NF + j, 2 * h + 1, row_scale, col + 1), Spec::kSwigluLimit);
          } else {
            x = activate<Spec::kAct>(x);
            y = activate<Spec::kAct>(y);
          }
          if constexpr (SCALING == kRowChannelScaling) {  // int8: smoothing for GEMM 2's quantization
            x *= __ldg(args.act_smooth + expert * N + col);
            y *= __ldg(args.act_smooth + expert * N + col + 1);
          }
        }
        store_pair(out + (row0 + r) * N + col, x, y);
      }
    }
  }
}

}  // namespace moejit
