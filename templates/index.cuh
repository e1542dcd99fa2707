// Stage 2: index generation, a stable counting sort of the M = T*K pairs by local expert, done
// on the device so a layer call never waits for the host (DESIGN.md decision 6).
//
//   index_count   one warp per block of kPairsPerBlock pairs: per-block expert counts
//   index_scan    one warp: per-expert prefix over blocks, expert offsets, GEMM row tiles
//   index_scatter one warp per block again: sorted_pair / pair_pos at stable positions
//   index_single_block  all three steps in one warp when M <= kPairsPerBlock (route_index.cuh),
//                 with the pairs' experts, the counts and the offsets kept in shared memory
//
// Stability: a block walks its pairs in ascending f, 32 at a time; within 32 lanes the rank among
// lanes with the same expert is a popcount of the lower lanes, so position order is f order and
// the result is bitwise the same on every run.
//
// Spec: kLocalExperts, kPairsPerBlock (multiple of 32).
#pragma once

#include "moejit/common.cuh"

namespace moejit {

// The local expert of flat pair f, or -1 when f is past the end or its expert is not local.
template <typename Spec>
__device__ __forceinline__ int local_expert_of(const IndexArgs& args, long long f, long long end) {
  if (f >= end) return -1;
  const int local = args.topk_ids[f] - args.expert_begin;
  return (local >= 0 && local < Spec::kLocalExperts) ? local : -1;
}

// One warp reads the local experts of the pairs [begin, begin + kPairsPerBlock) (-1 from `end` on)
// into experts[] (shared memory). The loads are independent and unrolled, so the walks over the
// pairs in 32-pair steps below wait for global memory a few times instead of once per step.
template <typename Spec>
__device__ __forceinline__ void stage_pair_experts(const IndexArgs& args, long long begin, long long end, int* experts) {
  const int lane = threadIdx.x % 32;
#pragma unroll 8
  for (int i = lane; i < Spec::kPairsPerBlock; i += 32) experts[i] = local_expert_of<Spec>(args, begin + i, end);
  __syncwarp();
}

// One warp adds the pairs [begin, end) to counts[local expert] (shared memory); expert_of(f) is
// the pair's local expert or -1 (not local, or f >= end).
template <typename ExpertOf>
__device__ __forceinline__ void count_pairs(long long begin, long long end, const ExpertOf& expert_of, int* counts) {
  const int lane = threadIdx.x % 32;
  for (long long base = begin; base < end; base += 32) {
    const int e = expert_of(base + lane);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) counts[e] += __popc(peers);
    __syncwarp();
  }
}

// One warp writes the sorted positions of the pairs [begin, end): next[e] (shared memory) is the
// first free position of expert e and advances past the pairs placed.
template <typename ExpertOf>
__device__ __forceinline__ void scatter_pairs(const IndexArgs& args, long long begin, long long end,
                                              const ExpertOf& expert_of, int* next) {
  const int lane = threadIdx.x % 32;
  for (long long base = begin; base < end; base += 32) {
    const long long f = base + lane;
    const int e = expert_of(f);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0) {
      const int pos = next[e] + __popc(peers & lanemask_lt());
      args.sorted_pair[pos] = static_cast<int>(f);
      args.pair_pos[f] = pos;
    } else if (f < end) {
      args.pair_pos[f] = -1;
    }
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) next[e] += __popc(peers);
    __syncwarp();
  }
}

// Inclusive prefix sum across the 32 lanes (Hillis-Steele with shuffles).
__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += up;
  }
  return v;
}

// One warp, from the per-expert totals count[] (shared memory): expert_counts, expert_offsets and
// the GEMM row tiles; lane l owns experts [l*CHUNK, (l+1)*CHUNK), and tile t of expert e covers
// tile_rows sorted rows from offset[e] + t * tile_rows. first (shared, or null) receives offset[e].
template <typename Spec>
__device__ void write_offsets_and_tiles(const IndexArgs& args, const int* count, int* first_position) {
  constexpr int E = Spec::kLocalExperts;
  constexpr int CHUNK = (E + 31) / 32;
  const int lane = threadIdx.x % 32;
  const int first = lane * CHUNK;
  int rows = 0, tiles = 0;
  for (int e = first; e < min(first + CHUNK, E); ++e) {
    rows += count[e];
    tiles += (count[e] + args.tile_rows - 1) / args.tile_rows;
  }
  const int rows_end = warp_inclusive_sum(rows, lane);
  const int tiles_end = warp_inclusive_sum(tiles, lane);
  int offset = rows_end - rows, tile = tiles_end - tiles;
  for (int e = first; e < min(first + CHUNK, E); ++e) {
    args.expert_counts[e] = count[e];
    args.expert_offsets[e] = offset;
    if (first_position) first_position[e] = offset;
    const int expert_tiles = (count[e] + args.tile_rows - 1) / args.tile_rows;
    for (int t = 0; t < expert_tiles; ++t) {
      args.tile_expert[tile + t] = e;
      args.tile_row[tile + t] = offset + t * args.tile_rows;
    }
    offset += count[e];
    tile += expert_tiles;
  }
  if (lane == 31) {
    args.expert_offsets[E] = rows_end;
    *args.num_tiles = tiles_end;
  }
}

template <typename Spec>
__device__ void index_count(const IndexArgs& args) {
  __shared__ int counts[Spec::kLocalExperts];
  __shared__ int pair_expert[Spec::kPairsPerBlock];
  const int lane = threadIdx.x;
  for (int e = lane; e < Spec::kLocalExperts; e += 32) counts[e] = 0;
  const long long begin = static_cast<long long>(blockIdx.x) * Spec::kPairsPerBlock;
  const long long end = min(begin + Spec::kPairsPerBlock, args.pairs);
  stage_pair_experts<Spec>(args, begin, end, pair_expert);
  count_pairs(begin, end, [&](long long f) { return pair_expert[f - begin]; }, counts);
  int* out = args.block_counts + static_cast<long long>(blockIdx.x) * Spec::kLocalExperts;
  for (int e = lane; e < Spec::kLocalExperts; e += 32) out[e] = counts[e];
}

// One warp. NOTES: written with shuffles rather than cub::BlockScan because CUB's headers cost
// NVRTC 1.2 s per unit, most of a layer's cold compile; a 32-lane scan over E_loc <= 1024
// counts is a few instructions.
template <typename Spec>
__device__ void index_scan(const IndexArgs& args) {
  constexpr int E = Spec::kLocalExperts;
  __shared__ int count[E];
  const int lane = threadIdx.x;
  // Per expert: exclusive prefix of the block counts (in place, for index_scatter) and the total.
  // The counts are read BATCH blocks at a time with independent loads: one wait per batch.
  constexpr int BATCH = 16;
  const long long blocks = (args.pairs + Spec::kPairsPerBlock - 1) / Spec::kPairsPerBlock;
  for (int e = lane; e < E; e += 32) {
    int running = 0;
    for (long long b0 = 0; b0 < blocks; b0 += BATCH) {
      int here[BATCH];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) here[j] = b0 + j < blocks ? args.block_counts[(b0 + j) * E + e] : 0;
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        if (b0 + j < blocks) args.block_counts[(b0 + j) * E + e] = running;
        running += here[j];
      }
    }
    count[e] = running;
  }
  __syncwarp();
  write_offsets_and_tiles<Spec>(args, count, nullptr);
}

template <typename Spec>
__device__ void index_scatter(const IndexArgs& args) {
  __shared__ int next[Spec::kLocalExperts];
  __shared__ int pair_expert[Spec::kPairsPerBlock];
  const int lane = threadIdx.x;
  const int* prefix = args.block_counts + static_cast<long long>(blockIdx.x) * Spec::kLocalExperts;
  for (int e = lane; e < Spec::kLocalExperts; e += 32) next[e] = args.expert_offsets[e] + prefix[e];
  const long long begin = static_cast<long long>(blockIdx.x) * Spec::kPairsPerBlock;
  const long long end = min(begin + Spec::kPairsPerBlock, args.pairs);
  stage_pair_experts<Spec>(args, begin, end, pair_expert);
  scatter_pairs(args, begin, end, [&](long long f) { return pair_expert[f - begin]; }, next);
}

// The three steps as one warp of a one-block launch (M <= kPairsPerBlock). The separate steps
// hand their results over through global memory (block_counts, expert_offsets), a chain of
// dependent round trips; here the pairs' experts are read once and everything after stays in
// shared memory. block_counts is not written: only index_scan and index_scatter read it.
template <typename Spec>
__device__ void index_single_block(const IndexArgs& args) {
  constexpr int E = Spec::kLocalExperts;
  __shared__ int pair_expert[Spec::kPairsPerBlock];
  __shared__ int count[E];
  __shared__ int next[E];
  const int lane = threadIdx.x % 32;
  const long long pairs = args.pairs;
  for (int e = lane; e < E; e += 32) count[e] = 0;
  stage_pair_experts<Spec>(args, 0, pairs, pair_expert);
  const auto expert_of = [&](long long f) { return pair_expert[f]; };
  count_pairs(0, pairs, expert_of, count);
  __syncwarp();
  write_offsets_and_tiles<Spec>(args, count, next);
  __syncwarp();
  scatter_pairs(args, 0, pairs, expert_of, next);
}

}  // namespace moejit
