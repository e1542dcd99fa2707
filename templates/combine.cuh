// Stage 6: out[t] = sum_j topk_weights[t, j] * Y[pair_pos[t*K' + j]] (+ residual[t]), in fp32,
// slots in order j = 0..K'-1 (K' = K + kSharedSlots; a fused shared slot weighs 1) and no
// atomics, so the result is bitwise reproducible; rounded once
// to the output dtype. A pair whose expert is not local (pair_pos -1) contributes 0.
//
// Grid: (T, ceil(H / (kThreads * kVec))): a token's row is split over blocks so that even T = 1
// spreads over several SMs; each thread handles kVec consecutive columns with 16-byte loads
// when kVec * sizeof(element) == 16 (H a multiple of kVec).
//
// Spec: using Y, Out; kHidden, kTopk, kSharedSlots, kThreads (>= K'), kVec (1, or 16 / sizeof(Y)
// when H allows).
#pragma once

#include "moejit/common.cuh"

namespace moejit {

template <typename Spec>
__device__ void combine_tokens(const CombineArgs& args) {
  constexpr int K = Spec::kTopk, VEC = Spec::kVec;
  constexpr long long H = Spec::kHidden;
  static_assert(H % VEC == 0, "vector width must divide the hidden size");
  using Y = typename Spec::Y;
  using Out = typename Spec::Out;
  const long long t = blockIdx.x;

  // The token's slots are read before the wait for GEMM 2 (the entry point leaves the wait to this
  // body): pair_pos and topk_weights come from the index and the routing (or the caller), two or
  // more launches back, which are complete once this kernel runs (common.cuh), so after the wait
  // only Y's loads stand between GEMM 2's end and the sum. Read through L2 (ld.global.cg): an L1
  // line left by an earlier layer call must not answer.
  // Slots j >= K are the fused shared experts (kSharedSlots), weight 1, after the routed ones.
  constexpr int SLOTS = K + Spec::kSharedSlots;
  static_assert(SLOTS <= Spec::kThreads, "a thread per slot reads the token's slots");
  __shared__ float weight[SLOTS];
  __shared__ long long row[SLOTS];
  if (t < args.tokens && threadIdx.x < SLOTS) {
    weight[threadIdx.x] = threadIdx.x < K ? __ldcg(args.topk_weights + t * K + threadIdx.x) : 1.0f;
    row[threadIdx.x] = __ldcg(args.pair_pos + t * SLOTS + threadIdx.x);  // -1 marks a pair another rank computes
  }
  wait_for_previous_kernel();
  allow_next_kernel_launch();
  __syncthreads();
  if (t >= args.tokens) return;

  const long long h = (static_cast<long long>(blockIdx.y) * Spec::kThreads + threadIdx.x) * VEC;
  if (h >= H) return;
  const auto* y = static_cast<const Y*>(args.y);
  float acc[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) {
    if (row[j] < 0) continue;
    const Vec<Y, VEC> in = *reinterpret_cast<const Vec<Y, VEC>*>(y + row[j] * H + h);
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] += weight[j] * to_float(in.v[i]);
  }
  if (args.residual) {
    const Vec<Out, VEC> r = *reinterpret_cast<const Vec<Out, VEC>*>(static_cast<const Out*>(args.residual) + t * H + h);
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] += to_float(r.v[i]);
  }
  Vec<Out, VEC> result;
#pragma unroll
  for (int i = 0; i < VEC; ++i) result.v[i] = from_float<Out>(acc[i]);
  *reinterpret_cast<Vec<Out, VEC>*>(static_cast<Out*>(args.out) + t * H + h) = result;
}

}  // namespace moejit
