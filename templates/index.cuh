// Stage 2: index generation, a stable counting sort of the M = T*K pairs by local expert, done
// on the device so a layer call never waits for the host (DESIGN.md decision 6).
//
//   index_count   one warp per block of kPairsPerBlock pairs: per-block expert counts
//   index_scan    one block: per-expert prefix over blocks, expert offsets, GEMM row tiles
//   index_scatter one warp per block again: sorted_pair / pair_pos at stable positions
//
// Stability: a block walks its pairs in ascending f, 32 at a time; within 32 lanes the rank among
// lanes with the same expert is a popcount of the lower lanes, so position order is f order and
// the result is bitwise the same on every run.
//
// Spec: kLocalExperts, kPairsPerBlock (multiple of 32), kScanThreads.
#pragma once

#include <cub/block/block_scan.cuh>

#include "moejit/common.cuh"

namespace moejit {

// The local expert of flat pair f, or -1 when f is past the end or its expert is not local.
template <typename Spec>
__device__ __forceinline__ int local_expert_of(const IndexArgs& args, long long f, long long end) {
  if (f >= end) return -1;
  const int local = args.topk_ids[f] - args.expert_begin;
  return (local >= 0 && local < Spec::kLocalExperts) ? local : -1;
}

template <typename Spec>
__device__ void index_count(const IndexArgs& args) {
  __shared__ int counts[Spec::kLocalExperts];
  const int lane = threadIdx.x;
  for (int e = lane; e < Spec::kLocalExperts; e += 32) counts[e] = 0;
  __syncwarp();
  const long long begin = static_cast<long long>(blockIdx.x) * Spec::kPairsPerBlock;
  const long long end = min(begin + Spec::kPairsPerBlock, args.pairs);
  for (long long base = begin; base < end; base += 32) {
    const int e = local_expert_of<Spec>(args, base + lane, end);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) counts[e] += __popc(peers);
    __syncwarp();
  }
  int* out = args.block_counts + static_cast<long long>(blockIdx.x) * Spec::kLocalExperts;
  for (int e = lane; e < Spec::kLocalExperts; e += 32) out[e] = counts[e];
}

template <typename Spec>
__device__ void index_scan(const IndexArgs& args) {
  constexpr int E = Spec::kLocalExperts;
  constexpr int THREADS = Spec::kScanThreads;
  constexpr int ITEMS = (E + THREADS - 1) / THREADS;
  using Scan = cub::BlockScan<int, THREADS>;
  __shared__ typename Scan::TempStorage scan_temp;

  const long long blocks = (args.pairs + Spec::kPairsPerBlock - 1) / Spec::kPairsPerBlock;
  // Per expert: exclusive prefix of the block counts (in place) and the total.
  int count[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int e = threadIdx.x * ITEMS + i;
    int running = 0;
    if (e < E) {
      for (long long b = 0; b < blocks; ++b) {
        int* c = args.block_counts + b * E + e;
        const int here = *c;
        *c = running;
        running += here;
      }
      args.expert_counts[e] = running;
    }
    count[i] = running;
  }
  // Expert offsets, and the GEMM row tiles: tile t of expert e covers tile_rows sorted rows.
  int offset[ITEMS];
  int total = 0;
  Scan(scan_temp).ExclusiveSum(count, offset, total);
  __syncthreads();
  int tiles[ITEMS], tile_offset[ITEMS];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) tiles[i] = (count[i] + args.tile_rows - 1) / args.tile_rows;
  int total_tiles = 0;
  Scan(scan_temp).ExclusiveSum(tiles, tile_offset, total_tiles);
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int e = threadIdx.x * ITEMS + i;
    if (e >= E) continue;
    args.expert_offsets[e] = offset[i];
    for (int t = 0; t < tiles[i]; ++t) {
      args.tile_expert[tile_offset[i] + t] = e;
      args.tile_row[tile_offset[i] + t] = offset[i] + t * args.tile_rows;
    }
  }
  if (threadIdx.x == 0) {
    args.expert_offsets[E] = total;
    *args.num_tiles = total_tiles;
  }
}

template <typename Spec>
__device__ void index_scatter(const IndexArgs& args) {
  __shared__ int next[Spec::kLocalExperts];
  const int lane = threadIdx.x;
  const int* prefix = args.block_counts + static_cast<long long>(blockIdx.x) * Spec::kLocalExperts;
  for (int e = lane; e < Spec::kLocalExperts; e += 32) next[e] = args.expert_offsets[e] + prefix[e];
  __syncwarp();
  const long long begin = static_cast<long long>(blockIdx.x) * Spec::kPairsPerBlock;
  const long long end = min(begin + Spec::kPairsPerBlock, args.pairs);
  for (long long base = begin; base < end; base += 32) {
    const long long f = base + lane;
    const int e = local_expert_of<Spec>(args, f, end);
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

}  // namespace moejit
