// Stage 1: routing (SPEC.md). One warp per token; the token's scores live in shared memory.
//
// Spec is a struct of compile-time constants written by codegen:
//   using Logit;                 // router logit element type
//   kExperts, kTopk, kGroups, kTopkGroup, kWarps
//   kSigmoid (else softmax), kBias (noaux_tc: q = p + bias), kGroupTop2 (group score = sum of the
//   two best, noaux_tc; else the best), kRenormalize, kScale (routed_scaling_factor)
#pragma once

#include <cub/warp/warp_reduce.cuh>
#include <cuda/std/limits>

#include "moejit/common.cuh"

namespace moejit {

// An expert (or group) and its selection score. Ordering: larger score first, then lower index,
// which is SPEC.md's tie rule; a taken or excluded entry has score -inf and is never chosen
// over a real one, since real scores are finite.
struct ScoredIndex {
  float score;
  int index;
};

struct BetterOf {
  __device__ __forceinline__ ScoredIndex operator()(const ScoredIndex& a, const ScoredIndex& b) const {
    if (a.score > b.score) return a;
    if (b.score > a.score) return b;
    return a.index < b.index ? a : b;
  }
};

constexpr float kTaken = -::cuda::std::numeric_limits<float>::infinity();

template <typename Spec>
struct RouteWarp {
  using Reduce = cub::WarpReduce<float>;
  using ArgReduce = cub::WarpReduce<ScoredIndex>;

  // The best entry of scores[0, n), ties to the lower index; the result is in every lane.
  static __device__ ScoredIndex argmax(const float* scores, int n, int lane,
                                       typename ArgReduce::TempStorage& temp) {
    ScoredIndex best{kTaken, 0x7fffffff};
    for (int i = lane; i < n; i += 32) best = BetterOf()(best, ScoredIndex{scores[i], i});
    best = ArgReduce(temp).Reduce(best, BetterOf());
    best.score = __shfl_sync(0xffffffffu, best.score, 0);
    best.index = __shfl_sync(0xffffffffu, best.index, 0);
    return best;
  }
};

template <typename Spec>
__device__ void route_tokens(const RouteArgs& args) {
  constexpr int E = Spec::kExperts;
  constexpr int K = Spec::kTopk;
  constexpr int G = Spec::kGroups;
  constexpr int GROUP_SIZE = E / G;
  using Warp = RouteWarp<Spec>;

  __shared__ float prob_smem[Spec::kWarps][E];   // p: the unbiased scores
  __shared__ float score_smem[Spec::kWarps][E];  // q: the selection scores, then marks
  __shared__ float group_smem[Spec::kWarps][G];
  __shared__ typename Warp::Reduce::TempStorage reduce_temp[Spec::kWarps];
  __shared__ typename Warp::ArgReduce::TempStorage arg_temp[Spec::kWarps];

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const long long token = static_cast<long long>(blockIdx.x) * Spec::kWarps + warp;
  if (token >= args.tokens) return;

  float* p = prob_smem[warp];
  float* q = score_smem[warp];
  const auto* logits = static_cast<const typename Spec::Logit*>(args.logits) + token * E;

  // Scores: softmax subtracts the row max, so a row of huge or all-equal logits stays finite.
  if constexpr (Spec::kSigmoid) {
    for (int e = lane; e < E; e += 32) p[e] = 1.0f / (1.0f + expf(-sanitize(to_float(logits[e]))));
  } else {
    float row_max = -kFloatMax;
    for (int e = lane; e < E; e += 32) {
      p[e] = sanitize(to_float(logits[e]));
      row_max = fmaxf(row_max, p[e]);
    }
    row_max = Warp::Reduce(reduce_temp[warp]).Reduce(row_max, ::cuda::maximum<>{});
    row_max = __shfl_sync(0xffffffffu, row_max, 0);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
      p[e] = expf(p[e] - row_max);
      sum += p[e];
    }
    __syncwarp();
    sum = Warp::Reduce(reduce_temp[warp]).Sum(sum);
    sum = __shfl_sync(0xffffffffu, sum, 0);  // >= 1: the max term is exp(0)
    for (int e = lane; e < E; e += 32) p[e] /= sum;
  }
  for (int e = lane; e < E; e += 32) {
    float biased = p[e];
    if constexpr (Spec::kBias) biased = sanitize(p[e] + sanitize(args.bias[e]));
    q[e] = biased;
  }
  __syncwarp();

  // Groups: score each group, keep the kTopkGroup best, exclude every expert of the others.
  if constexpr (G > 1) {
    float* group_score = group_smem[warp];
    for (int g = lane; g < G; g += 32) {
      const float* qs = q + g * GROUP_SIZE;
      float first = -kFloatMax, second = -kFloatMax;
      for (int i = 0; i < GROUP_SIZE; ++i) {
        float v = qs[i];
        if (v > first) {
          second = first;
          first = v;
        } else if (v > second) {
          second = v;
        }
      }
      group_score[g] = Spec::kGroupTop2 ? sanitize(first + second) : first;
    }
    __syncwarp();
    // Mark kept groups as taken (-inf) in group_score; the ones left finite are excluded.
    for (int r = 0; r < Spec::kTopkGroup; ++r) {
      ScoredIndex best = Warp::argmax(group_score, G, lane, arg_temp[warp]);
      __syncwarp();
      if (lane == 0) group_score[best.index] = kTaken;
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32)
      if (group_score[e / GROUP_SIZE] != kTaken) q[e] = kTaken;
    __syncwarp();
  }

  // Top-k: K rounds of a warp argmax; each round takes its winner out of the running.
  float weight[K];
  int ids[K];
  float weight_sum = 0.0f;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    ScoredIndex best = Warp::argmax(q, E, lane, arg_temp[warp]);
    __syncwarp();
    if (lane == 0) q[best.index] = kTaken;
    __syncwarp();
    ids[j] = best.index;
    weight[j] = p[best.index];
    weight_sum += weight[j];  // in slot order, so the sum is the same on every run
  }
  if (lane == 0) {
    // Renormalize first, then scale (SPEC.md); a zero sum leaves the weights as they are.
    const bool renormalize = Spec::kRenormalize && weight_sum > 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) {
      float w = renormalize ? weight[j] / weight_sum : weight[j];
      args.topk_weights[token * K + j] = w * Spec::kScale;
      args.topk_ids[token * K + j] = ids[j];
    }
  }
}

}  // namespace moejit
