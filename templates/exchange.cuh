// Expert parallel's all_to_all mode (runtime/dispatched_layer.h): the kernels before and after the
// two NCCL exchanges of a call. Every rank sends every other rank one slab of C rows (C = the
// layer's max_tokens_per_rank), so the sizes never depend on the routing and no count leaves the
// device. A token goes to a rank at most once (when any of its top-k experts lives there), so C
// rows always suffice for T <= C tokens.
//
//   exchange_slots    one block per destination rank r: token t's row in r's slab is the number of
//                     tokens before t that also go to r (a stable order, so a call is bitwise
//                     reproducible); unused rows are marked -1.
//   exchange_pack     one block per send row (by column blocks): the token's hidden row, top-k ids
//                     and weights, or zeros / -1 / 0 in an unused row, which selects no expert. fp8
//                     layers send the rows quantized (e4m3, by the layer's own stage-3 kernel, run
//                     before: quantize.cuh) with their kScaleGroups scales.
//   exchange_combine  one block per token (by column blocks): out[t] = residual[t] + the returned
//                     sums of the ranks it went to (each in the model dtype), added in fp32, rank 0
//                     first, and the total rounded to the model dtype.
//
// Spec: using Row (pack: what is sent, the model dtype or e4m3; combine: the model dtype); kHidden,
// kTopk, kLocalExperts (E_loc: rank r holds experts r * E_loc ..), kRanks, kThreads (a multiple of
// 32), kVec (1, or 16 / sizeof(Row) when H allows), kScaleGroups (pack: scales per fp8 row, else 0).
#pragma once

#include "moejit/common.cuh"

namespace moejit {

template <typename Spec>
__device__ void exchange_slots(const ExchangeSlotsArgs& args) {
  constexpr int K = Spec::kTopk, THREADS = Spec::kThreads, WARPS = THREADS / 32;
  static_assert(THREADS % 32 == 0, "whole warps count the tokens");
  __shared__ int warp_count[WARPS];
  const int rank = blockIdx.x;
  const int first = rank * Spec::kLocalExperts, last = first + Spec::kLocalExperts;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int* source = args.source + static_cast<long long>(rank) * args.capacity;
  long long used = 0;  // rows of this rank's slab filled by the chunks so far
  for (long long start = 0; start < args.tokens; start += THREADS) {
    const long long t = start + threadIdx.x;
    bool goes = false;
    if (t < args.tokens) {
#pragma unroll
      for (int j = 0; j < K; ++j) {
        const int id = args.topk_ids[t * K + j];
        goes |= id >= first && id < last;
      }
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, goes);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, chunk = 0;  // this chunk's tokens to `rank` in earlier warps, and in all
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      before += w < warp ? warp_count[w] : 0;
      chunk += warp_count[w];
    }
    if (t < args.tokens) {
      const long long slot = used + before + __popc(ballot & ((1u << lane) - 1u));
      args.slot_of[t * Spec::kRanks + rank] = goes ? static_cast<int>(slot) : -1;
      if (goes) source[slot] = static_cast<int>(t);
    }
    used += chunk;
    __syncthreads();  // the next chunk rewrites warp_count
  }
  for (long long c = used + threadIdx.x; c < args.capacity; c += THREADS) source[c] = -1;
}

template <typename Spec>
__device__ void exchange_pack(const ExchangePackArgs& args) {
  constexpr int K = Spec::kTopk, VEC = Spec::kVec;
  constexpr long long H = Spec::kHidden;
  static_assert(H % VEC == 0, "vector width must divide the hidden size");
  static_assert(K <= Spec::kThreads, "a thread per slot copies the token's ids and weights");
  using Row = typename Spec::Row;
  const long long row = blockIdx.x;
  const int t = args.source[row];
  constexpr int GROUPS = Spec::kScaleGroups;
  if (blockIdx.y == 0) {
    if (threadIdx.x < K) {
      args.send_ids[row * K + threadIdx.x] = t >= 0 ? args.topk_ids[static_cast<long long>(t) * K + threadIdx.x] : -1;
      args.send_weights[row * K + threadIdx.x] =
          t >= 0 ? args.topk_weights[static_cast<long long>(t) * K + threadIdx.x] : 0.0f;
    }
    for (int g = threadIdx.x; g < GROUPS; g += Spec::kThreads)
      args.send_scales[row * GROUPS + g] = t >= 0 ? args.scales[static_cast<long long>(t) * GROUPS + g] : 0.0f;
  }
  const long long h = (static_cast<long long>(blockIdx.y) * Spec::kThreads + threadIdx.x) * VEC;
  if (h >= H) return;
  Vec<Row, VEC> v;
  if (t >= 0) {
    v = *reinterpret_cast<const Vec<Row, VEC>*>(static_cast<const Row*>(args.hidden) + t * H + h);
  } else {  // all-zero bits: +0 in every type sent (bf16, fp16, fp32, e4m3)
    unsigned char* bytes = reinterpret_cast<unsigned char*>(&v);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(v)); ++i) bytes[i] = 0;
  }
  *reinterpret_cast<Vec<Row, VEC>*>(static_cast<Row*>(args.send_rows) + row * H + h) = v;
}

template <typename Spec>
__device__ void exchange_combine(const ExchangeCombineArgs& args) {
  constexpr int VEC = Spec::kVec, RANKS = Spec::kRanks;
  constexpr long long H = Spec::kHidden;
  static_assert(H % VEC == 0, "vector width must divide the hidden size");
  using Row = typename Spec::Row;
  const long long t = blockIdx.x;
  __shared__ int slot[RANKS];
  for (int r = threadIdx.x; r < RANKS; r += Spec::kThreads) slot[r] = args.slot_of[t * RANKS + r];
  __syncthreads();
  const long long h = (static_cast<long long>(blockIdx.y) * Spec::kThreads + threadIdx.x) * VEC;
  if (h >= H) return;
  float acc[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
  if (args.residual) {
    const Vec<Row, VEC> r = *reinterpret_cast<const Vec<Row, VEC>*>(static_cast<const Row*>(args.residual) + t * H + h);
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] += to_float(r.v[i]);
  }
  const auto* returned = static_cast<const Row*>(args.returned);
  for (int r = 0; r < RANKS; ++r) {
    if (slot[r] < 0) continue;
    const Vec<Row, VEC> in =
        *reinterpret_cast<const Vec<Row, VEC>*>(returned + (r * args.capacity + slot[r]) * H + h);
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] += to_float(in.v[i]);
  }
  Vec<Row, VEC> result;
#pragma unroll
  for (int i = 0; i < VEC; ++i) result.v[i] = from_float<Row>(acc[i]);
  *reinterpret_cast<Vec<Row, VEC>*>(static_cast<Row*>(args.out) + t * H + h) = result;
}

}  // namespace moejit
