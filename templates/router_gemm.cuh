// Stage 1's router GEMM (router_gemm layers; docs/LAYER_MATH.md "Router GEMM"): logits[t][e] =
// sum_h hidden[t][h] * gate_weight[e][h], fp32 accumulation, rounded once to the logit type. The
// routing kernel (or the fused route-and-index one) launched next reads them.
//
// A block computes kExpertsPerBlock experts (blockIdx.y) for kTokensPerBlock tokens (blockIdx.x):
// its hidden rows are staged in shared memory kChunk columns at a time, and kWarps / kExpertsPerBlock
// warps split each expert's columns, every lane streaming 16-byte vectors of the gate row. A decode
// step reads the gate weight once with about one block an SM (the planner picks kExpertsPerBlock
// for that); prefill rereads it per token tile from L2.
// Deterministic and batch invariant: a logit's sum runs in the same order (a lane's columns in
// order, the warp's butterfly, the splits in order) whatever T and the token's tile.
//
// Spec: using Input (hidden and gate dtype), using Logit (router_dtype); kExperts, kHidden, kWarps,
// kExpertsPerBlock (divides kWarps), kTokensPerBlock, kChunk (a multiple of 8).
#pragma once

#include "moejit/common.cuh"

namespace moejit {

// 16 bytes of In widened to fp32.
template <typename In>
__device__ __forceinline__ void load_widened(const In* src, float* out) {
  constexpr int VEC = 16 / sizeof(In);
  const uint4 bits = *reinterpret_cast<const uint4*>(src);
  const In* elements = reinterpret_cast<const In*>(&bits);
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float(elements[i]);
}

template <typename Spec>
__device__ void router_logits(const RouterGemmArgs& args) {
  using In = typename Spec::Input;
  using Logit = typename Spec::Logit;
  constexpr int E = Spec::kExperts;
  constexpr long long H = Spec::kHidden;
  constexpr int EPB = Spec::kExpertsPerBlock;
  constexpr int SPLITS = Spec::kWarps / EPB;  // warps on one expert's columns
  constexpr int TPB = Spec::kTokensPerBlock;
  constexpr int CHUNK = Spec::kChunk;
  constexpr int VEC = 16 / sizeof(In);
  static_assert(Spec::kWarps % EPB == 0, "kExpertsPerBlock divides kWarps");
  static_assert(CHUNK % VEC == 0, "a chunk is whole 16-byte vectors");
  __shared__ __align__(16) In x[TPB][CHUNK];
  __shared__ float partial[Spec::kWarps][TPB];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = warp % SPLITS;
  const int expert = blockIdx.y * EPB + warp / SPLITS;
  const long long token0 = static_cast<long long>(blockIdx.x) * TPB;
  const int rows = static_cast<int>(min(static_cast<long long>(TPB), args.tokens - token0));
  const In* hidden = static_cast<const In*>(args.hidden) + token0 * H;
  const In* gate = static_cast<const In*>(args.gate_weight) + static_cast<long long>(expert) * H;
  // 16-byte vectors when every row starts on 16 bytes (the same answer in every thread); else
  // element by element, in the same order per lane.
  const bool vectors = H % VEC == 0 && reinterpret_cast<unsigned long long>(args.hidden) % 16 == 0 &&
                       reinterpret_cast<unsigned long long>(args.gate_weight) % 16 == 0;

  float acc[TPB];
#pragma unroll
  for (int t = 0; t < TPB; ++t) acc[t] = 0.0f;
  for (long long chunk0 = 0; chunk0 < H; chunk0 += CHUNK) {
    const int cols = static_cast<int>(min(static_cast<long long>(CHUNK), H - chunk0));
    __syncthreads();  // the previous chunk's reads are done
    if (vectors) {
      for (int i = threadIdx.x; i < TPB * (cols / VEC); i += blockDim.x) {
        const int t = i / (cols / VEC), v = i % (cols / VEC);
        uint4 bits = make_uint4(0u, 0u, 0u, 0u);  // rows past T stay zero (never stored)
        if (t < rows) bits = *reinterpret_cast<const uint4*>(hidden + t * H + chunk0 + v * VEC);
        *reinterpret_cast<uint4*>(&x[t][v * VEC]) = bits;
      }
    } else {
      for (int i = threadIdx.x; i < TPB * cols; i += blockDim.x) {
        const int t = i / cols, c = i % cols;
        x[t][c] = t < rows ? hidden[t * H + chunk0 + c] : from_float<In>(0.0f);
      }
    }
    __syncthreads();
    if (expert >= E) continue;
    if (vectors) {
      for (int v = split * 32 + lane; v < cols / VEC; v += SPLITS * 32) {
        float w[VEC];
        load_widened(gate + chunk0 + v * VEC, w);
#pragma unroll
        for (int t = 0; t < TPB; ++t) {
          float h[VEC];
          load_widened(&x[t][v * VEC], h);
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[t] = fmaf(h[i], w[i], acc[t]);
        }
      }
    } else {
      for (int c = split * 32 + lane; c < cols; c += SPLITS * 32) {
        const float w = to_float(gate[chunk0 + c]);
#pragma unroll
        for (int t = 0; t < TPB; ++t) acc[t] = fmaf(to_float(x[t][c]), w, acc[t]);
      }
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
    static_cast<Logit*>(args.logits)[(token0 + t) * E + e] = from_float<Logit>(sum);
  }
}

}  // namespace moejit
