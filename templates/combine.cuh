// Stage 6: out[t] = sum_j topk_weights[t, j] * Y[pair_pos[t*K + j]] (+ residual[t]), in fp32,
// slots in order j = 0..K-1 and no atomics, so the result is bitwise reproducible; rounded once
// to the output dtype. A pair whose expert is not local (pair_pos -1) contributes 0.
//
// combine_tokens is the stage's own kernel. Grid: (T, ceil(H / (kThreads * kVec))): a token's row
// is split over blocks so that even T = 1 spreads over several SMs; each thread handles kVec
// consecutive columns with 16-byte loads when kVec * sizeof(element) == 16 (H a multiple of kVec).
// Spec: using Y, Out; kHidden, kTopk, kThreads, kVec (1, or 16 / sizeof(Y) when H allows).
//
// combine_when_last folds the stage into GEMM 2 (the decode bucket, where the combine's own launch
// and its wait for GEMM 2 to drain cost more than its work): the last GEMM 2 block to finish a
// column tile combines those columns of every token, with the same arithmetic in the same order,
// so the output is bitwise the separate kernel's.
#pragma once

#include "moejit/common.cuh"

namespace moejit {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// One slot of a token: its routing weight and its row of Y (-1: the expert is not local).
struct CombineSlot {
  float weight;
  long long row;
};

// 16 or 2 bytes from L2, past L1: Y rows that other blocks of the running kernel wrote (L1 is not
// coherent across SMs, and a line of them may sit there from an earlier read).
template <typename V>
__device__ __forceinline__ V load_from_l2(const V* p) {
  static_assert(sizeof(V) == 16 || sizeof(V) == 2, "16-byte vectors or single 16-bit elements");
  V v;
  if constexpr (sizeof(V) == 16) {
    const uint4 bits = __ldcg(reinterpret_cast<const uint4*>(p));
    memcpy(&v, &bits, sizeof v);
  } else {
    const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
    memcpy(&v, &bits, sizeof v);
  }
  return v;
}

// out[t, h .. h + VEC) of an [*, H] output from the token's K slots (slot(j), j = 0..K-1).
template <typename Y, typename Out, int K, int VEC, bool FROM_L2, typename SlotOf>
__device__ __forceinline__ void combine_vector(const CombineArgs& args, long long t, long long h, long long H,
                                               const SlotOf& slot) {
  const auto* y = static_cast<const Y*>(args.y);
  float acc[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    const CombineSlot s = slot(j);
    if (s.row < 0) continue;
    const auto* at = reinterpret_cast<const Vec<Y, VEC>*>(y + s.row * H + h);
    Vec<Y, VEC> in;
    if constexpr (FROM_L2) {
      in = load_from_l2(at);
    } else {
      in = *at;
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] += s.weight * to_float(in.v[i]);
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

template <typename Spec>
__device__ void combine_tokens(const CombineArgs& args) {
  constexpr int K = Spec::kTopk, VEC = Spec::kVec;
  constexpr long long H = Spec::kHidden;
  static_assert(H % VEC == 0, "vector width must divide the hidden size");
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

  const long long h = (static_cast<long long>(blockIdx.y) * Spec::kThreads + threadIdx.x) * VEC;
  if (h >= H) return;
  combine_vector<typename Spec::Y, typename Spec::Out, K, VEC, false>(
      args, t, h, H, [&](int j) { return CombineSlot{weight[j], row[j]}; });
}

// Adds 1 to *counter and returns its old value, at GPU scope with release and acquire semantics:
// the memory accesses the calling thread has ordered before it (through a block barrier, those
// of the whole block) are visible to whoever acquires the new value, and whatever this thread
// then reads sees what the earlier adders released. (Lighter than __threadfence's sequentially
// consistent fences around a relaxed atomicAdd.)
__device__ __forceinline__ int arrive_acq_rel(int* counter) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// Called by every thread of a GEMM 2 block (THREADS of them) once its part of Y, the output
// columns [n0, n0 + BN) of one row tile, is stored: the block counts itself into
// args.column_done[col_tile], and the last of the column tile's `tiles` blocks combines those
// columns of every token. (With no row tiles at all, tiles = 0, the caller calls it from the
// column tile's block of row tile 0, which then writes the residual or zeros.)
// Order: every thread's Y stores precede thread 0's release (the barrier), and the last block
// reads Y only after thread 0's acquire and a second barrier. Each thread reads the slots of its
// first output vector before counting (every block does; they were written kernels ago), so the
// last block's chain is the count, then Y.
template <typename Y, typename Out, int K, int VEC, long long N, int BN, int THREADS>
__device__ void combine_when_last(const GemmArgs& args, int col_tile, int tiles) {
  static_assert(BN % VEC == 0 && N % VEC == 0, "whole vectors per column tile");
  const CombineArgs& c = args.combine;
  const long long n0 = static_cast<long long>(col_tile) * BN;
  const long long vectors = (min(n0 + BN, N) - n0) / VEC;  // per token
  const long long items = c.tokens * vectors;
  CombineSlot slots[K];
  auto read_slots = [&](long long i) {
    const long long t = i / vectors;
#pragma unroll
    for (int j = 0; j < K; ++j) slots[j] = CombineSlot{c.topk_weights[t * K + j], c.pair_pos[t * K + j]};
  };
  long long i = threadIdx.x;
  if (i < items) read_slots(i);
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) last = tiles == 0 || arrive_acq_rel(args.column_done + col_tile) == tiles - 1;
  __syncthreads();
  if (!last) return;
  for (; i < items; i += THREADS) {
    const long long t = i / vectors, h = n0 + (i % vectors) * VEC;
    combine_vector<Y, Out, K, VEC, true>(c, t, h, N, [&](int j) { return slots[j]; });
    if (i + THREADS < items) read_slots(i + THREADS);
  }
}

}  // namespace moejit
