// Stage 1's router GEMM (router_gemm layers; docs/LAYER_MATH.md "Router GEMM"): logits[t][e] =
// sum_h hidden[t][h] * gate_weight[e][h], fp32 accumulation, rounded once to the logit type. The
// routing kernel (or the fused route-and-index one) launched next reads them. Two kernels, chosen
// per token bucket (compiler/families/router_gemm.h):
//
// router_logits_simt (decode; any dtype and H): a block computes kExpertsPerBlock experts
// (blockIdx.y) for kTokensPerBlock tokens (blockIdx.x); kWarps / kExpertsPerBlock warps split each
// expert's columns. A lane first loads its whole share of the gate row into registers (up to
// kGateVectors 16-byte vectors at a time), then its tokens' hidden vectors of the same columns,
// so a step pays the memory latency about once instead of once per column chunk. (Rows past T
// are computed on zeros and never stored.) The planner
// picks kExpertsPerBlock so that about one block an SM streams the gate weight.
//
// router_logits_mma (mid and prefill; bf16/fp16, H a multiple of 8): a block tile of kBM tokens x
// kBN experts on mma.sync m16n8k16 (fp32 accumulate), both operands through a cp.async pipeline
// into swizzled shared memory as mma_gemm.cuh's grouped GEMM loads them (hidden rows as A, gate
// rows as the nk-layout B), so a block reads its hidden rows once for all kBN experts.
//
// Both are deterministic, and batch invariant within their token range: a logit's sum runs in the
// same order whatever T and the token's tile (simt: a lane's columns in order, the warp's
// butterfly, the splits in order; mma: the k16 steps in order, whatever the tile's shape). The two
// orders differ, so a token's logits may differ in the last bit between a decode batch and a
// larger one.
//
// Spec, simt: using Input (hidden and gate dtype), using Logit (router_dtype); kExperts, kHidden,
// kWarps, kExpertsPerBlock (divides kWarps), kTokensPerBlock, kGateVectors.
// Spec, mma: Input, Logit, kExperts, kHidden, kBM (16 * kWarpsM), kBN (multiple of 16 * kWarpsN),
// kWarpsM, kWarpsN, kStages, kSharedBytes.
// Both also kBias (router_bias, gpt-oss): gate_bias[e] (Input) joins the fp32 sum before its one rounding.
#pragma once

#include "moejit/mma_gemm.cuh"

namespace moejit {

// The largest power of two of tokens, at most the block's, whose `batch` vectors together fit 16
// uint4 registers (at least one token).
constexpr int router_token_group(int batch, int tokens) {
  int group = 1;
  while (group * 2 <= tokens && group * 2 * batch <= 16) group *= 2;
  return group;
}

// Expert e's finished fp32 sum, with the router's bias when the layer has one (Spec::kBias).
template <typename Spec>
__device__ __forceinline__ float router_logit(const RouterGemmArgs& args, long long e, float sum) {
  if constexpr (Spec::kBias) return sum + to_float(static_cast<const typename Spec::Input*>(args.gate_bias)[e]);
  return sum;
}

template <typename Spec>
__device__ void router_logits_simt(const RouterGemmArgs& args) {
  using In = typename Spec::Input;
  using Logit = typename Spec::Logit;
  constexpr int E = Spec::kExperts;
  constexpr long long H = Spec::kHidden;
  constexpr int EPB = Spec::kExpertsPerBlock;
  constexpr int SPLITS = Spec::kWarps / EPB;  // warps on one expert's columns
  constexpr int LANES = SPLITS * 32;          // lanes on one expert's columns
  constexpr int TPB = Spec::kTokensPerBlock;
  constexpr int VEC = 16 / static_cast<int>(sizeof(In));
  // 16-byte vectors when every row is whole vectors: the layer's checks put hidden and
  // gate_weight on 16 bytes (runtime/layer_checks.cpp). Else element by element.
  constexpr bool VECTORS = H % VEC == 0;
  constexpr long long ROW_VECTORS = H / VEC;
  constexpr long long LANE_VECTORS = (ROW_VECTORS + LANES - 1) / LANES;  // a lane's share of a row
  constexpr int BATCH = LANE_VECTORS < Spec::kGateVectors ? static_cast<int>(LANE_VECTORS) : Spec::kGateVectors;
  constexpr int GROUP = router_token_group(BATCH, TPB);  // tokens whose vectors are loaded at once
  static_assert(TPB % GROUP == 0, "token groups tile the block's tokens (acc[t0 + g] stays in bounds)");
  static_assert(Spec::kWarps % EPB == 0, "kExpertsPerBlock divides kWarps");
  __shared__ float partial[Spec::kWarps][TPB];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = warp % SPLITS;
  const int expert = blockIdx.y * EPB + warp / SPLITS;
  const bool has_expert = expert < E;  // the last block's last warps may have none
  const long long token0 = static_cast<long long>(blockIdx.x) * TPB;
  const int rows = static_cast<int>(min(static_cast<long long>(TPB), args.tokens - token0));
  const In* hidden = static_cast<const In*>(args.hidden) + token0 * H;
  const In* gate = static_cast<const In*>(args.gate_weight) + static_cast<long long>(expert) * H;
  const int first = split * 32 + lane;  // this lane's first vector (or column) of the row

  float acc[TPB];
#pragma unroll
  for (int t = 0; t < TPB; ++t) acc[t] = 0.0f;
  if constexpr (VECTORS) {
    // Vector j of batch b0 is the row's vector first + (b0 + j) * LANES: a lane sums its vectors in
    // increasing order, whatever the grouping below.
    for (long long b0 = 0; b0 < LANE_VECTORS; b0 += BATCH) {
      uint4 w[BATCH];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const long long v = first + (b0 + j) * LANES;
        w[j] = has_expert && v < ROW_VECTORS ? __ldg(reinterpret_cast<const uint4*>(gate + v * VEC))
                                             : make_uint4(0u, 0u, 0u, 0u);
      }
      // GROUP tokens' hidden vectors of the batch at once (about 16 registers of uint4): their
      // loads are independent, so a group shares one round trip. (A token at a time, T = 16 took
      // 2.5x T = 1's time on the H200; a vector at a time, DeepSeek-V3's 7 vectors made T = 1
      // pay 7 round trips.)
#pragma unroll
      for (int t0 = 0; t0 < TPB; t0 += GROUP) {
        if (t0 >= rows || !has_expert) break;
        uint4 x[GROUP][BATCH];
#pragma unroll
        for (int g = 0; g < GROUP; ++g)
#pragma unroll
          for (int j = 0; j < BATCH; ++j) {
            const long long v = first + (b0 + j) * LANES;
            x[g][j] = t0 + g < rows && v < ROW_VECTORS
                          ? __ldg(reinterpret_cast<const uint4*>(hidden + (t0 + g) * H + v * VEC))
                          : make_uint4(0u, 0u, 0u, 0u);
          }
#pragma unroll
        for (int g = 0; g < GROUP; ++g)
#pragma unroll
          for (int j = 0; j < BATCH; ++j) {
            if (first + (b0 + j) * LANES >= ROW_VECTORS) continue;
            const In* wv = reinterpret_cast<const In*>(&w[j]);
            const In* xv = reinterpret_cast<const In*>(&x[g][j]);
#pragma unroll
            for (int i = 0; i < VEC; ++i) acc[t0 + g] = fmaf(to_float(xv[i]), to_float(wv[i]), acc[t0 + g]);
          }
      }
    }
  } else if (has_expert) {
    for (long long c = first; c < H; c += LANES) {
      const float w = to_float(gate[c]);
#pragma unroll
      for (int t = 0; t < TPB; ++t)
        if (t < rows) acc[t] = fmaf(to_float(hidden[t * H + c]), w, acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < TPB; ++t) {
    const float sum = warp_sum(acc[t]);
    if (lane == 0) partial[warp][t] = sum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < EPB * TPB; i += blockDim.x) {
    const int e_in_block = i / TPB, t = i % TPB;
    const int e = blockIdx.y * EPB + e_in_block;
    if (e >= E || t >= rows) continue;
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < SPLITS; ++s) sum += partial[e_in_block * SPLITS + s][t];
    static_cast<Logit*>(args.logits)[(token0 + t) * E + e] = from_float<Logit>(router_logit<Spec>(args, e, sum));
  }
}

template <typename Spec>
__device__ void router_logits_mma(const RouterGemmArgs& args) {
  using namespace mma_detail;
  using namespace tile;
  using T = typename Spec::Input;
  using Logit = typename Spec::Logit;
  constexpr int BM = Spec::kBM, BN = Spec::kBN, BK = 64, STAGES = Spec::kStages;
  constexpr int WARPS_M = Spec::kWarpsM, WARPS_N = Spec::kWarpsN, THREADS = 32 * WARPS_M * WARPS_N;
  constexpr long long N = Spec::kExperts, K = Spec::kHidden;
  constexpr int WARP_ROWS = BM / WARPS_M, WARP_COLS = BN / WARPS_N;
  constexpr int MF = WARP_ROWS / 16;  // 16-row fragments per warp
  constexpr int NF = WARP_COLS / 8;   // 8-expert fragments per warp
  constexpr int A_STAGE = BM * BK, W_STAGE = BN * BK;  // elements
  constexpr int K_TILES = static_cast<int>((K + BK - 1) / BK);
  static_assert(sizeof(T) == 2, "16-bit operands");
  static_assert(WARP_ROWS % 16 == 0 && WARP_COLS % 16 == 0, "warp tile: whole m16 fragments, pairs of n8 ones");
  static_assert(STAGES >= 2, "a pipeline needs two stages");
  static_assert(static_cast<long long>(STAGES) * (A_STAGE + W_STAGE) * 2 <= Spec::kSharedBytes,
                "the launch's shared memory must hold the pipeline");

  extern __shared__ __align__(128) unsigned char shared_raw[];
  T* a_smem = reinterpret_cast<T*>(shared_raw);
  T* w_smem = a_smem + STAGES * A_STAGE;

  const long long token0 = static_cast<long long>(blockIdx.x) * BM;
  const long long n0 = static_cast<long long>(blockIdx.y) * BN;
  const T* hidden = static_cast<const T*>(args.hidden);
  // Gate rows n0.. (past E: zero-filled), and the block's token rows (past T: zero-filled).
  const WeightRows<T, BN, 1, THREADS, N, K> gate_rows(static_cast<const T*>(args.gate_weight), n0, threadIdx.x);
  RowCopies<T, BM, THREADS, K> token_rows(hidden, threadIdx.x);
#pragma unroll
  for (int i = 0; i < token_rows.COPIES; ++i) {
    const long long token = token0 + token_rows.row(i);
    token_rows.src[i] = token < args.tokens ? hidden + token * K + token_rows.chunk * 8 : nullptr;
  }
  // Not unrolled: with up to 16 stages, an unrolled prologue held every stage's addresses at once
  // (255 registers and spills in the 32 x 32 tile).
#pragma unroll 1
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < K_TILES) {
      token_rows.load(a_smem + s * A_STAGE, s);
      gate_rows.load(w_smem + s * W_STAGE, s);
    }
    commit_async();  // an empty group keeps the wait counts uniform
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  float acc[MF][NF][4];
#pragma unroll
  for (int i = 0; i < MF; ++i)
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

  int read_slot = 0, write_slot = STAGES - 1;  // kt % STAGES and (kt + STAGES - 1) % STAGES
  for (int kt = 0; kt < K_TILES; ++kt) {
    wait_async<STAGES - 2>();
    __syncthreads();  // stage kt is visible, and every warp is done with the slot refilled next
    if (kt + STAGES - 1 < K_TILES) {
      token_rows.load(a_smem + write_slot * A_STAGE, kt + STAGES - 1);
      gate_rows.load(w_smem + write_slot * W_STAGE, kt + STAGES - 1);
    }
    commit_async();
    write_slot = write_slot == STAGES - 1 ? 0 : write_slot + 1;
    const T* as = a_smem + read_slot * A_STAGE;
    const T* ws = w_smem + read_slot * W_STAGE;
    read_slot = read_slot == STAGES - 1 ? 0 : read_slot + 1;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      unsigned af[MF][4];
#pragma unroll
      for (int i = 0; i < MF; ++i) load_a_fragment(as, warp_m * WARP_ROWS + i * 16, kk, lane, af[i]);
      unsigned bf[NF][2];
#pragma unroll
      for (int p = 0; p < NF / 2; ++p)
        load_b_fragments(ws, warp_n * WARP_COLS + (2 * p + (lane >> 4)) * 8 + (lane & 7), kk, lane, bf[2 * p],
                         bf[2 * p + 1]);
#pragma unroll
      for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j) mma_16x8x16(acc[i][j], af[i], bf[j][0], bf[j][1], static_cast<const T*>(nullptr));
    }
  }
  wait_async<0>();

  // Thread (g = lane / 4, t = lane % 4) holds rows g and g + 8, experts 2t and 2t + 1 of each
  // fragment. Scalar stores: E may be odd, so a row's logits need not start on 8 bytes.
  Logit* logits = static_cast<Logit*>(args.logits);
#pragma unroll
  for (int i = 0; i < MF; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long token = token0 + warp_m * WARP_ROWS + i * 16 + (lane >> 2) + h * 8;
      if (token >= args.tokens) continue;
#pragma unroll
      for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const long long e = n0 + warp_n * WARP_COLS + j * 8 + (lane & 3) * 2 + c;
          if (e < N) logits[token * N + e] = from_float<Logit>(router_logit<Spec>(args, e, acc[i][j][2 * h + c]));
        }
    }
}

}  // namespace moejit
