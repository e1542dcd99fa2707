// Stage 6: out[t] = sum_j topk_weights[t, j] * Y[pair_pos[t*K + j]] (+ residual[t]), in fp32,
// slots in order j = 0..K-1 and no atomics, so the result is bitwise reproducible; rounded once
// to the output dtype. A pair whose expert is not local (pair_pos -1) contributes 0.
//
// Spec: using Y, Out; kHidden, kTopk, kThreads.
#pragma once

#include "moejit/common.cuh"

namespace moejit {

template <typename Spec>
__device__ void combine_tokens(const CombineArgs& args) {
  constexpr int K = Spec::kTopk;
  const long long t = blockIdx.x;
  if (t >= args.tokens) return;

  __shared__ float weight[K];
  __shared__ long long row[K];
  if (threadIdx.x < K) {
    const int pos = args.pair_pos[t * K + threadIdx.x];
    weight[threadIdx.x] = args.topk_weights[t * K + threadIdx.x];
    row[threadIdx.x] = pos;  // -1 marks a pair another rank computes
  }
  __syncthreads();

  const auto* y = static_cast<const typename Spec::Y*>(args.y);
  const auto* residual = static_cast<const typename Spec::Out*>(args.residual);
  auto* out = static_cast<typename Spec::Out*>(args.out) + t * Spec::kHidden;
  for (long long h = threadIdx.x; h < Spec::kHidden; h += Spec::kThreads) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j)
      if (row[j] >= 0) acc += weight[j] * to_float(y[row[j] * Spec::kHidden + h]);
    if (residual) acc += to_float(residual[t * Spec::kHidden + h]);
    out[h] = from_float<typename Spec::Out>(acc);
  }
}

}  // namespace moejit
