// Stage 2: index generation, a stable counting sort of the M = T*K pairs by local expert, done
// on the device so a layer call never waits for the host (DESIGN.md decision 6).
//
//   index_count   a block of kIndexWarps warps per kPairsPerBlock pairs: per-block expert counts
//                 (shared-memory atomics: a count needs no order)
//   index_scatter up to kMaxIndexScatterBlocks blocks, each over a run of count blocks: every block
//                 sums the count table itself (the experts' totals and the counts of the blocks
//                 before its run), so no scan kernel sits between the two; block 0 also writes the
//                 expert offsets and the GEMM row tiles. Then sorted_pair / pair_pos at stable
//                 positions, each warp over its own slice of a count block's pairs.
//   index_single_block  all of it in one warp when M <= kPairsPerBlock (route_index.cuh), with the
//                 pairs' experts, the counts and the offsets kept in shared memory
//
// Stability: position order within an expert is flat pair order f. A pair's position is its
// expert's offset + the pairs of that expert in earlier blocks + in earlier warp slices of its
// block + in earlier 32-pair steps of its warp + the lanes before it with the same expert (a
// popcount of the lower lanes); the result is bitwise the same on every run.
//
// NOTES: the two-kernel form replaced count / scan / scatter with one warp per block, whose
// dependent chain (three kernels, 32 serial 32-pair steps per warp, a one-warp scan over the
// block counts) took about 29 us at Qwen3-30B-A3B T=4096 on the H200 (bench/RESULTS.md).
// Each scatter block re-reads the whole [count blocks, E_loc] table: 16 KiB at T*K = 32768 and
// E_loc = 128, far less than one more kernel in the chain costs; capping the scatter blocks keeps
// those reads linear in T*K (at most kMaxIndexScatterBlocks tables; plan.h).
//
// Spec: kLocalExperts (<= 1024: the experts the GEMMs see, kRoutedExperts + kSharedSlots),
// kRoutedExperts (E_loc), kTopk, kSharedSlots (fused shared experts: moe_config.h pair_slots),
// kPairsPerBlock (a multiple of 32 * kIndexWarps), kIndexWarps (<= 8).
#pragma once

#include "moejit/common.cuh"

namespace moejit {

// The local expert of a pair's shared slot j (0..kSharedSlots-1): E_loc + j on the rank that
// computes the shared experts, -1 (not local) elsewhere.
template <typename Spec>
__device__ __forceinline__ int shared_local_expert(const IndexArgs& args, int j) {
  return args.shared_local ? Spec::kRoutedExperts + j : -1;
}

// The local expert of flat pair f, or -1 when f is past the end or its expert is not local.
// Pairs are f = t * (kTopk + kSharedSlots) + j: slots j < kTopk are topk_ids[t * kTopk + j] (the
// routed experts), the others the fused shared experts (moe_config.h pair_slots).
template <typename Spec>
__device__ __forceinline__ int local_expert_of(const IndexArgs& args, long long f, long long end) {
  static_assert(Spec::kLocalExperts == Spec::kRoutedExperts + Spec::kSharedSlots, "the GEMMs' experts");
  if (f >= end) return -1;
  int id;
  if constexpr (Spec::kSharedSlots == 0) {
    id = args.topk_ids[f];
  } else {
    constexpr int SLOTS = Spec::kTopk + Spec::kSharedSlots;
    const long long t = f / SLOTS;
    const int j = static_cast<int>(f - t * SLOTS);
    if (j >= Spec::kTopk) return shared_local_expert<Spec>(args, j - Spec::kTopk);
    id = args.topk_ids[t * Spec::kTopk + j];
  }
  const int local = id - args.expert_begin;
  return (local >= 0 && local < Spec::kRoutedExperts) ? local : -1;
}

// THREADS threads (thread = their index) read the local experts of the pairs [begin, begin +
// kPairsPerBlock) (-1 from `end` on) into experts[] (shared memory). The loads are independent and
// unrolled, so the walks over the pairs in 32-pair steps below wait for global memory a few times
// instead of once per step. The caller synchronizes its THREADS threads before reading experts[].
template <typename Spec, int THREADS>
__device__ __forceinline__ void stage_pair_experts(const IndexArgs& args, long long begin, long long end, int* experts,
                                                   int thread) {
  static_assert(Spec::kPairsPerBlock % THREADS == 0, "whole rounds of loads");
#pragma unroll 8
  for (int i = thread; i < Spec::kPairsPerBlock; i += THREADS) experts[i] = local_expert_of<Spec>(args, begin + i, end);
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
// NOTES: the scans and sums of this file are written with shuffles and shared-memory atomics
// rather than cub::WarpScan / cub::BlockReduce because CUB's headers cost NVRTC 1.2 s per unit,
// most of a layer's cold compile; over E_loc <= 1024 counts they are a few instructions.
__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += up;
  }
  return v;
}

// One warp, from the per-expert totals count[] (shared memory): start[e] (shared) += expert e's
// first sorted position; with publish also expert_counts, expert_offsets and the GEMM row tiles
// (one block of a launch publishes). Lane l owns experts [l*CHUNK, (l+1)*CHUNK), and tile t of
// expert e covers tile_rows sorted rows from offset[e] + t * tile_rows.
template <typename Spec>
__device__ void write_offsets_and_tiles(const IndexArgs& args, const int* count, int* start, bool publish) {
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
    start[e] += offset;
    const int expert_tiles = (count[e] + args.tile_rows - 1) / args.tile_rows;
    if (publish) {
      args.expert_counts[e] = count[e];
      args.expert_offsets[e] = offset;
      for (int t = 0; t < expert_tiles; ++t) {
        args.tile_expert[tile + t] = e;
        args.tile_row[tile + t] = offset + t * args.tile_rows;
      }
    }
    offset += count[e];
    tile += expert_tiles;
  }
  if (publish && lane == 31) {
    args.expert_offsets[E] = rows_end;
    *args.num_tiles = tiles_end;
  }
}

// A block of kIndexWarps warps per kPairsPerBlock pairs: block_counts[blockIdx.x][e].
template <typename Spec>
__device__ void index_count(const IndexArgs& args) {
  constexpr int E = Spec::kLocalExperts, THREADS = 32 * Spec::kIndexWarps, PER_THREAD = Spec::kPairsPerBlock / THREADS;
  static_assert(Spec::kPairsPerBlock % THREADS == 0, "whole rounds of pairs");
  __shared__ int counts[E];
  for (int e = threadIdx.x; e < E; e += THREADS) counts[e] = 0;
  const long long begin = static_cast<long long>(blockIdx.x) * Spec::kPairsPerBlock;
  const long long end = min(begin + Spec::kPairsPerBlock, args.pairs);
  int expert[PER_THREAD];  // every load first, then the atomics
#pragma unroll
  for (int i = 0; i < PER_THREAD; ++i) expert[i] = local_expert_of<Spec>(args, begin + i * THREADS + threadIdx.x, end);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < PER_THREAD; ++i)
    if (expert[i] >= 0) atomicAdd(&counts[expert[i]], 1);
  __syncthreads();
  int* out = args.block_counts + static_cast<long long>(blockIdx.x) * E;
  for (int e = threadIdx.x; e < E; e += THREADS) out[e] = counts[e];
}

// After index_count, min(count blocks, kMaxIndexScatterBlocks) blocks of kIndexWarps warps; block b
// places the pairs of a contiguous run of count blocks, one count block at a time.
template <typename Spec>
__device__ void index_scatter(const IndexArgs& args) {
  constexpr int E = Spec::kLocalExperts, WARPS = Spec::kIndexWarps, THREADS = 32 * WARPS;
  constexpr int P = Spec::kPairsPerBlock, SLICE = P / WARPS;  // pairs per warp, in flat order
  static_assert(P % THREADS == 0, "warp slices of whole 32-pair steps");
  static_assert(E <= 1024 && WARPS <= 8, "the shared-memory tables below fit 48 KiB");
  __shared__ int total[E];        // pairs of expert e in all count blocks
  __shared__ int start[E];        // next position of expert e's pairs in this block's run
  __shared__ int next[WARPS][E];  // warp w: its count of expert e in the current count block, then its next position
  __shared__ int pair_expert[P];
  const int warp = threadIdx.x / 32;
  const long long count_blocks = (args.pairs + P - 1) / P;
  const long long first = blockIdx.x * count_blocks / gridDim.x, last = (blockIdx.x + 1) * count_blocks / gridDim.x;
  for (int e = threadIdx.x; e < E; e += THREADS) total[e] = start[e] = 0;
  __syncthreads();

  // The count table, [count_blocks, E] in order: coalesced loads, UNROLL independent ones per round.
  // Every block reads all of it (gridDim.x <= kMaxIndexScatterBlocks bounds the reads to that many tables).
  const long long before = first * E, entries = count_blocks * E;
  constexpr int UNROLL = 8;
  for (long long i0 = 0; i0 < entries; i0 += UNROLL * THREADS) {
    int c[UNROLL];
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const long long i = i0 + j * THREADS + threadIdx.x;
      c[j] = i < entries ? args.block_counts[i] : 0;
    }
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const long long i = i0 + j * THREADS + threadIdx.x;
      if (c[j] == 0) continue;
      const int e = static_cast<int>(i % E);
      atomicAdd(&total[e], c[j]);
      if (i < before) atomicAdd(&start[e], c[j]);
    }
  }
  __syncthreads();
  if (warp == 0) write_offsets_and_tiles<Spec>(args, total, start, blockIdx.x == 0);
  // (write_offsets_and_tiles updates start[]; the barrier inside the loop orders it before use)

  for (long long block = first; block < last; ++block) {
    const long long begin = block * P, end = min(begin + P, args.pairs);
    stage_pair_experts<Spec, THREADS>(args, begin, end, pair_expert, threadIdx.x);
    for (int e = threadIdx.x % 32; e < E; e += 32) next[warp][e] = 0;  // the warp's own row
    __syncthreads();
    const long long slice_begin = begin + warp * SLICE, slice_end = min(slice_begin + SLICE, end);
    const auto expert_of = [&, begin](long long f) { return pair_expert[f - begin]; };
    count_pairs(slice_begin, slice_end, expert_of, next[warp]);
    __syncthreads();
    // Exclusive prefix over the warps: warp w's pairs of expert e follow those of warps < w.
    for (int e = threadIdx.x; e < E; e += THREADS) {
      int running = start[e];
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const int count = next[w][e];
        next[w][e] = running;
        running += count;
      }
      start[e] = running;
    }
    __syncthreads();
    scatter_pairs(args, slice_begin, slice_end, expert_of, next[warp]);
    __syncthreads();  // pair_expert and next[] are reused by the next count block
  }
}

// The index as one warp of a one-block launch (M <= kPairsPerBlock). The multi-block kernels
// hand their results over through global memory (block_counts), a chain of dependent round trips;
// here the pairs' experts are read once and everything after stays in shared memory.
// pair_expert ([kPairsPerBlock], shared) holds the pairs' local experts (-1 past the last pair)
// when `staged` (route_index.cuh records them while routing), else this warp reads them from
// topk_ids into it. block_counts is not written: only index_scatter reads it.
template <typename Spec>
__device__ void index_single_block(const IndexArgs& args, int* pair_expert, bool staged) {
  constexpr int E = Spec::kLocalExperts;
  __shared__ int count[E];
  __shared__ int next[E];
  const int lane = threadIdx.x % 32;
  const long long pairs = args.pairs;
  for (int e = lane; e < E; e += 32) count[e] = next[e] = 0;
  if (!staged) stage_pair_experts<Spec, 32>(args, 0, pairs, pair_expert, lane);
  __syncwarp();
  const auto expert_of = [&](long long f) { return pair_expert[f]; };
  count_pairs(0, pairs, expert_of, count);
  __syncwarp();
  write_offsets_and_tiles<Spec>(args, count, next, true);
  __syncwarp();
  scatter_pairs(args, 0, pairs, expert_of, next);
}

}  // namespace moejit
