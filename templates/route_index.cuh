// Stages 1 and 2 in one launch for small batches (the decode bucket): one block routes every
// token (a warp per token, kWarps warps), then its first warp runs the index steps of index.cuh
// (count, offsets, scatter) over all T*K <= kPairsPerBlock pairs, in shared memory
// (index_single_block). Two of a decode layer's six launches disappear, and with them the
// gaps between dependent kernels.
// The result is bitwise the one of the separate kernels (same routing code, same stable order).
//
// With args.route == 0 the routing is given (topk_ids / topk_weights already hold it: the
// experts() entry point) and only the index steps run.
//
// Spec: every constant of routing.cuh's Spec and of index.cuh's Spec (one flat struct).
#pragma once

#include "moejit/index.cuh"
#include "moejit/routing.cuh"

namespace moejit {

template <typename Spec>
__device__ void route_and_index(const RouteIndexArgs& args) {
  __shared__ float prob_smem[Spec::kWarps][Spec::kExperts];
  __shared__ float score_smem[Spec::kWarps][Spec::kExperts];
  __shared__ float group_smem[Spec::kWarps][Spec::kGroups];
  // The pairs' local experts (-1: past the last pair, or not local), for the index steps. Routing
  // records them here as it picks them, so the index does not read topk_ids back from global
  // memory (a dependent round trip on a decode layer's critical path).
  __shared__ int pair_expert[Spec::kPairsPerBlock];
  const int warp = threadIdx.x / 32;
  if (args.route) {
    // Pairs f = token * SLOTS + slot; the fused shared slots (slot >= kTopk) are known before routing.
    constexpr int SLOTS = Spec::kTopk + Spec::kSharedSlots;
    for (int f = threadIdx.x; f < Spec::kPairsPerBlock; f += blockDim.x) {
      const int slot = f % SLOTS;
      pair_expert[f] = (Spec::kSharedSlots > 0 && slot >= Spec::kTopk && f < args.index.pairs)
                           ? shared_local_expert<Spec>(args.index, slot - Spec::kTopk)
                           : -1;
    }
    __syncthreads();  // every entry is set before any routing warp records a pair
    const int expert_begin = args.index.expert_begin;
    const auto record = [&](long long token, int slot, int expert) {
      const int local = expert - expert_begin;
      pair_expert[token * SLOTS + slot] = (local >= 0 && local < Spec::kRoutedExperts) ? local : -1;
    };
    const int tokens = static_cast<int>(args.routing.tokens);  // <= kFusedRouteIndexMaxTokens
    for (int token = warp; token < tokens; token += Spec::kWarps) {
      __syncwarp();  // the previous token's reads of this warp's scratch rows are done
      route_token<Spec>(args.routing, token, prob_smem[warp], score_smem[warp], group_smem[warp], record);
    }
    __syncthreads();  // every token's experts are recorded (and visible to the block) before indexing
  }
  if (warp != 0) return;
  index_single_block<Spec>(args.index, pair_expert, args.route != 0);
}

}  // namespace moejit
