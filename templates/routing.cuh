// Stage 1: routing (SPEC.md). One warp per token; the token's scores live in shared memory.
// NOTES: the warp reductions here are xor-butterfly shuffles rather than cub::WarpReduce: CUB's
// headers cost NVRTC about 1.2 s per unit, which would dominate the layer's compile, and a
// butterfly gives every lane the same, run-to-run identical result (fp add is commutative).
// The top-k rounds keep the scores in registers as order-preserving integer keys, so a round is
// two warp reductions (redux.sync on sm_80 and later) instead of a walk through shared memory and
// five shuffle steps: on the H200 the K rounds were most of a decode step's routing latency.
//
// Spec is a struct of compile-time constants written by codegen:
//   using Logit;                 // router logit element type
//   kExperts, kTopk, kGroups, kTopkGroup, kWarps
//   kSigmoid (else softmax), kBias (noaux_tc: q = p + bias), kGroupTop2 (group score = sum of the
//   two best, noaux_tc; else the best), kRenormalize, kScale (routed_scaling_factor)
#pragma once

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

// The score of a taken or excluded entry: -inf, below every (finite, sanitized) real score.
__device__ __forceinline__ float taken() { return __int_as_float(0xff800000u); }

// The unsigned max (MAX) or min over the warp, the same in every lane.
template <bool MAX>
__device__ __forceinline__ unsigned warp_extreme_u32(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return MAX ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = MAX ? max(v, other) : min(v, other);
  }
  return v;
#endif
}

// An unsigned key that orders like the score: a > b exactly when key(a) > key(b), for finite
// scores and -inf (taken). -0 is keyed as +0, since the float comparison holds them equal.
__device__ __forceinline__ unsigned order_key(float score) {
  const unsigned bits = __float_as_uint(score == 0.0f ? 0.0f : score);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Below every score's key (that of -inf included): a slot past the last expert.
constexpr unsigned kNoExpertKey = 0u;

// The selection of K experts from scores held in registers: lane l holds the keys of experts
// l, l + 32, l + 64, ... (R = ceil(E / 32) of them). Each round picks the best key of the warp,
// ties to the lower index (SPEC.md), and marks it taken (the key of -inf), which is what the
// warp_argmax over shared memory with BetterOf did; the result is identical.
template <int E>
struct LaneKeys {
  static constexpr int R = (E + 31) / 32;
  unsigned key[R];

  // The keys of scores[0, E) (shared memory) for this lane.
  __device__ __forceinline__ void load(const float* scores, int lane) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int e = r * 32 + lane;
      key[r] = e < E ? order_key(scores[e]) : kNoExpertKey;
    }
  }

  // The best remaining expert (the same in every lane), then marked taken.
  __device__ __forceinline__ int take_best(int lane) {
    unsigned best = kNoExpertKey;
    int best_r = 0;
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (key[r] > best) best = key[r], best_r = r;  // strictly: the lower index keeps a tie
    const unsigned top = warp_extreme_u32<true>(best);
    const unsigned candidate = best == top ? static_cast<unsigned>(best_r * 32 + lane) : 0xffffffffu;
    const int index = static_cast<int>(warp_extreme_u32<false>(candidate));  // the lowest index holding it
#pragma unroll
    for (int r = 0; r < R; ++r) key[r] = r * 32 + lane == index ? order_key(taken()) : key[r];
    return index;
  }
};

// The best entry of scores[0, n), ties to the lower index; the same result in every lane.
__device__ __forceinline__ ScoredIndex warp_argmax(const float* scores, int n, int lane) {
  ScoredIndex best{taken(), 0x7fffffff};
  for (int i = lane; i < n; i += 32) best = BetterOf()(best, ScoredIndex{scores[i], i});
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    ScoredIndex other{__shfl_xor_sync(0xffffffffu, best.score, offset),
                      __shfl_xor_sync(0xffffffffu, best.index, offset)};
    best = BetterOf()(best, other);
  }
  return best;
}

// What route_token does with each chosen expert besides writing topk_ids: nothing (the routing
// kernel), or route_index.cuh's record of the pair's local expert in shared memory.
struct NoRecord {
  __device__ __forceinline__ void operator()(long long /*token*/, int /*slot*/, int /*expert*/) const {}
};

// Routes one token with one warp; the warp's scratch rows are p, q ([E] each) and group_score ([G]).
// Lane 0 also calls record(token, slot, expert) for the token's K routed slots.
template <typename Spec, typename Record = NoRecord>
__device__ __forceinline__ void route_token(const RouteArgs& args, long long token, float* p, float* q, float* group_score,
                                            const Record& record = Record()) {
  constexpr int E = Spec::kExperts;
  constexpr int K = Spec::kTopk;
  constexpr int G = Spec::kGroups;
  constexpr int GROUP_SIZE = E / G;
  const int lane = threadIdx.x % 32;
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
    row_max = warp_max(row_max);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
      p[e] = expf(p[e] - row_max);
      sum += p[e];
    }
    sum = warp_sum(sum);  // >= 1: the max term is exp(0)
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
      ScoredIndex best = warp_argmax(group_score, G, lane);
      __syncwarp();
      if (lane == 0) group_score[best.index] = taken();
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32)
      if (group_score[e / GROUP_SIZE] != taken()) q[e] = taken();
    __syncwarp();
  }

  // Top-k: K rounds over the scores in registers; each round takes its winner out of the running.
  LaneKeys<E> keys;
  keys.load(q, lane);
  float weight[K];
  int ids[K];
  float weight_sum = 0.0f;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    ids[j] = keys.take_best(lane);
    weight[j] = p[ids[j]];
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
      record(token, j, ids[j]);
    }
  }
}

template <typename Spec>
__device__ void route_tokens(const RouteArgs& args) {
  __shared__ float prob_smem[Spec::kWarps][Spec::kExperts];   // p: the unbiased scores
  __shared__ float score_smem[Spec::kWarps][Spec::kExperts];  // q: the selection scores, then marks
  __shared__ float group_smem[Spec::kWarps][Spec::kGroups];
  const int warp = threadIdx.x / 32;
  const long long token = static_cast<long long>(blockIdx.x) * Spec::kWarps + warp;
  if (token >= args.tokens) return;
  route_token<Spec>(args, token, prob_smem[warp], score_smem[warp], group_smem[warp]);
}

}  // namespace moejit
