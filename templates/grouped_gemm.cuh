// Stages 4 and 5: grouped GEMM over expert-sorted rows, C[p, n] = sum_k A[p, k] * W[e, n, k],
// with GEMM 1's activation (gated: act(gate) * up) or GEMM 2's plain store in the epilogue.
//
// This is the portable SIMT version (shared-memory tiles, a 16x16 thread grid, fp32 or int32
// accumulation), correct for every shape; the Hopper wgmma/TMA kernels replace it where it pays.
//
// Grid: x = row tile (from index_scatter's schedule; tiles past *num_tiles exit), y = column tile.
//
// Spec:
//   using A, W, Out; using Acc (float, or int for int8 x int8)
//   kBM, kBN, kBK (kBM, kBN multiples of 16), kThreads = 256
//   kN: output columns (I for GEMM 1, H for GEMM 2); kK: reduction length (H or I)
//   kGated, kAct (ActivationKind), kSwigluLimit (swigluoai's clamp), kBias (expert biases), kGemm1
//   kGather: A rows are hidden[sorted_pair[p] / kTopk] (GEMM 1 on unquantized input)
//   kTopk: pairs per token (K, plus the fused shared experts)
//   kLayoutNK: W is [E_loc, rows, kK] (else [E_loc, kK, rows]); rows = kGated ? 2*kN : kN
//   kScaling (common.cuh's ScalingKind), kScaleCols, kScaleRows:
//     kRowChannelScaling: int8 A and W (Acc int); dequantize with a_scale[p] * w_scale[e, n]; GEMM 1
//       then multiplies by act_smooth[e, n] and stores fp32 for re-quantization
//     kTensorScaling, kBlockScaling: e4m3 A and W, dequantized as they are loaded: A's element k of
//       source row r times a_scale[r][k / kScaleCols], weight row n's element k times
//       w_scale[e][n / kScaleRows][k / kScaleCols] (kScaleCols 128 or K, kScaleRows 128 or every
//       row); GEMM 1 stores fp32 for re-quantization
#pragma once

#include "moejit/common.cuh"

namespace moejit {

template <typename Spec>
__device__ void grouped_gemm(const GemmArgs& args) {
  constexpr int BM = Spec::kBM, BN = Spec::kBN, BK = Spec::kBK;
  constexpr int TM = BM / 16, TN = BN / 16;
  constexpr long long N = Spec::kN, K = Spec::kK;
  constexpr long long W_ROWS = Spec::kGated ? 2 * N : N;
  constexpr int HALVES = Spec::kGated ? 2 : 1;  // gate and up columns side by side
  using Acc = typename Spec::Acc;
  static_assert(Spec::kThreads == 256, "the tile loops assume a 16x16 thread grid");

  const int tile = blockIdx.x;
  if (tile >= *args.num_tiles) return;
  const int expert = args.tile_expert[tile];
  const long long row0 = args.tile_row[tile];
  const long long row_end = min(row0 + BM, static_cast<long long>(args.expert_offsets[expert + 1]));
  const long long n0 = static_cast<long long>(blockIdx.y) * BN;

  __shared__ Acc a_tile[BK][BM];
  __shared__ Acc w_tile[HALVES][BK][BN];

  const auto* a = static_cast<const typename Spec::A*>(args.a);
  const auto* w = static_cast<const typename Spec::W*>(args.w) + static_cast<long long>(expert) * W_ROWS * K;

  // Source row of each tile row, resolved once: the gather of GEMM 1 happens here.
  __shared__ long long a_row[BM];
  if (threadIdx.x < BM) {
    const long long p = row0 + threadIdx.x;
    long long src = -1;
    if (p < row_end) src = Spec::kGather ? args.sorted_pair[p] / Spec::kTopk : p;
    a_row[threadIdx.x] = src;
  }

  constexpr bool INT8 = Spec::kScaling == kRowChannelScaling;  // scaled in the epilogue
  constexpr bool FP8 = Spec::kScaling == kTensorScaling || Spec::kScaling == kBlockScaling;
  constexpr long long SCALE_COLS = FP8 ? Spec::kScaleCols : 1, SCALE_ROWS = FP8 ? Spec::kScaleRows : 1;
  constexpr long long A_GROUPS = (K + SCALE_COLS - 1) / SCALE_COLS;               // scales per A row
  constexpr long long W_BLOCKS = (W_ROWS + SCALE_ROWS - 1) / SCALE_ROWS * A_GROUPS;  // per expert
  // fp8: the dequantized element k of A's source row `src` / of weight row `wrow`.
  auto a_value = [&](long long src, long long k) -> Acc {
    if constexpr (FP8) return widen(a[src * K + k]) * args.a_scale[src * A_GROUPS + k / SCALE_COLS];
    else return widen(a[src * K + k]);
  };
  auto w_value = [&](long long at, long long wrow, long long k) -> Acc {
    if constexpr (FP8)
      return widen(w[at]) * args.w_scale[expert * W_BLOCKS + wrow / SCALE_ROWS * A_GROUPS + k / SCALE_COLS];
    else return widen(w[at]);
  };

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  Acc acc[HALVES][TM][TN];
#pragma unroll
  for (int h = 0; h < HALVES; ++h)
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[h][i][j] = Acc(0);

  for (long long k0 = 0; k0 < K; k0 += BK) {
    __syncthreads();
    // A tile, consecutive threads along k (coalesced); out-of-range elements are zero.
    for (int idx = threadIdx.x; idx < BM * BK; idx += Spec::kThreads) {
      const int m = idx / BK, k = idx % BK;
      const long long src = a_row[m];
      Acc v = Acc(0);
      if (src >= 0 && k0 + k < K) v = a_value(src, k0 + k);
      a_tile[k][m] = v;
    }
    // W tiles: gate rows n (and up rows N + n).
    for (int half = 0; half < HALVES; ++half) {
      const long long row_base = half * N;
      for (int idx = threadIdx.x; idx < BN * BK; idx += Spec::kThreads) {
        int n, k;
        if constexpr (Spec::kLayoutNK) {
          n = idx / BK;
          k = idx % BK;
        } else {
          k = idx / BN;
          n = idx % BN;
        }
        Acc v = Acc(0);
        if (n0 + n < N && k0 + k < K) {
          const long long wrow = row_base + n0 + n;
          const long long at = Spec::kLayoutNK ? wrow * K + (k0 + k) : (k0 + k) * W_ROWS + wrow;
          v = w_value(at, wrow, k0 + k);
        }
        w_tile[half][k][n] = v;
      }
    }
    __syncthreads();
#pragma unroll 4
    for (int k = 0; k < BK; ++k) {
      Acc av[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = a_tile[k][ty + 16 * i];
#pragma unroll
      for (int h = 0; h < HALVES; ++h)
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const Acc wv = w_tile[h][k][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < TM; ++i) acc[h][i][j] += av[i] * wv;
        }
    }
  }

  // Epilogue: dequantize, activate, store.
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const long long p = row0 + ty + 16 * i;
    if (p >= row_end) continue;
    const float a_scale = INT8 ? args.a_scale[p] : 1.0f;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const long long n = n0 + tx + 16 * j;
      if (n >= N) continue;
      float gate = static_cast<float>(acc[0][i][j]);
      if constexpr (INT8) gate *= a_scale * args.w_scale[expert * W_ROWS + n];
      if constexpr (Spec::kBias)
        if (args.bias != nullptr) gate += args.bias[expert * W_ROWS + n];
      float v;
      if constexpr (Spec::kGemm1) {
        if constexpr (Spec::kGated) {
          float up = static_cast<float>(acc[HALVES - 1][i][j]);
          if constexpr (INT8) up *= a_scale * args.w_scale[expert * W_ROWS + N + n];
          if constexpr (Spec::kBias)
            if (args.bias != nullptr) up += args.bias[expert * W_ROWS + N + n];
          v = gated_activation<Spec::kAct>(gate, up, Spec::kSwigluLimit);
        } else {
          v = activate<Spec::kAct>(gate);
        }
        if constexpr (INT8) v *= args.act_smooth[expert * N + n];
      } else {
        v = gate;
      }
      static_cast<typename Spec::Out*>(args.out)[p * N + n] = from_float<typename Spec::Out>(v);
    }
  }
}

}  // namespace moejit
