// What both tensor-core grouped GEMMs (mma_gemm.cuh, wgmma_gemm.cuh) share: the grouped
// rasterization of their 1-D grid, the source row of every tile row (GEMM 1's gather), 16-byte
// cp.async copies into 128-byte-swizzled shared tiles, paired stores, and the traits of 8-bit
// operands (copied as 16-bit pairs, their accumulator, their scaling).
#pragma once

#include "moejit/common.cuh"

namespace moejit {
namespace tile {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; zero-fills the destination when !valid (the source is
// then not read, but must still be a mapped address).
__device__ __forceinline__ void copy_16_async(unsigned dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

// 4 bytes global -> shared (through L1); zero-fills when !valid, as copy_16_async.
__device__ __forceinline__ void copy_4_async(unsigned dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// Element offset of (row, 16-byte chunk) in a tile of 64-element (128-byte) rows. The chunk is
// XORed with the row's low three bits: ldmatrix's 8 rows of one phase fall in 8 bank groups, and
// a tile that starts on a 1024-byte boundary is exactly Hopper's 128-byte swizzle layout.
__device__ __forceinline__ int swizzled(int row, int chunk) { return row * 64 + ((chunk ^ (row & 7)) << 3); }

__device__ __forceinline__ unsigned bits_of(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned bits_of(__half v) { return __half_as_ushort(v); }

// Two adjacent 16-bit outputs (at: 4-byte aligned) as one 4-byte store. (A two-member struct
// store compiled to two 2-byte stores in the mma.sync kernels' PTX.)
template <typename T>
__device__ __forceinline__ void store_pair(T* at, float x, float y) {
  static_assert(sizeof(T) == 2, "16-bit outputs");
  *reinterpret_cast<unsigned*>(at) = bits_of(from_float<T>(x)) | bits_of(from_float<T>(y)) << 16;
}
// Two adjacent fp32 outputs (at: 8-byte aligned): a quantized GEMM 1's activation.
__device__ __forceinline__ void store_pair(float* at, float x, float y) { *reinterpret_cast<float2*>(at) = make_float2(x, y); }

// The 16-bit unit the pipeline copies and maps: the element itself, or a pair of 8-bit elements.
template <typename T>
struct PipelineUnit {
  using type = T;
};
template <>
struct PipelineUnit<signed char> {
  using type = unsigned short;
};
template <>
struct PipelineUnit<e4m3> {
  using type = unsigned short;
};

// The accumulator of a product: int32 for s8 x s8, fp32 otherwise.
template <typename T>
struct Accumulator {
  using type = float;
};
template <>
struct Accumulator<signed char> {
  using type = int;
};

// A spec's 8-bit scaling constants (grouped_gemm.cuh's kScaling, kScaleCols, kScaleRows), or none for 16-bit operands, whose specs
// do not name them.
template <typename Spec, bool EIGHT_BIT>
struct Scaling {
  static constexpr int kind = kNoScaling;
  static constexpr long long cols = 1, rows = 1;
  static constexpr bool quantize_out = false;
};
template <typename Spec>
struct Scaling<Spec, true> {
  static constexpr int kind = Spec::kScaling;
  static constexpr long long cols = Spec::kScaleCols, rows = Spec::kScaleRows;
  // fp8_block GEMM 1 on wgmma: the epilogue quantizes its output for GEMM 2 (out, out_scale).
  static constexpr bool quantize_out = Spec::kQuantizeOut;
};

// The (row tile, column tile) of this block in a 1-D grid of max_row_tiles * col_tiles blocks,
// in groups of GROUP_ROWS row tiles: within a group the row tile runs fastest, so the row tiles of
// one expert that are resident together share each weight tile through L2, and a group's
// activation rows stay in L2 while every column tile passes over them.
struct Position {
  int tile, col_tile;
};

template <int GROUP_ROWS>
__device__ __forceinline__ Position grouped_position(int col_tiles) {
  const int max_tiles = static_cast<int>(gridDim.x) / col_tiles;
  const int group_blocks = GROUP_ROWS * col_tiles;
  const int group = static_cast<int>(blockIdx.x) / group_blocks;
  const int first_tile = group * GROUP_ROWS;
  const int group_rows = min(max_tiles - first_tile, GROUP_ROWS);
  const int in_group = static_cast<int>(blockIdx.x) - group * group_blocks;
  return {first_tile + in_group % group_rows, in_group / group_rows};
}

// The tile a block works on, read from the schedule: the schedule's count and this tile's entries
// are read together (a tile index below the grid's row tiles is inside the schedule's buffers;
// past the count its entries are not used), which saves one dependent round trip. Read through L2
// (ld.global.cg): a GEMM 2 block reads them before it waits for the kernel before it
// (kWeightsBeforeWait), and an L1 line left by an earlier layer call must not answer.
struct ScheduledTile {
  int tiles, expert;
  long long row0;
};

__device__ __forceinline__ ScheduledTile scheduled_tile(const GemmArgs& args, int tile) {
  return {__ldcg(args.num_tiles), __ldcg(args.tile_expert + tile), __ldcg(args.tile_row + tile)};
}

// For a kernel whose entry point leaves the wait to its body (kWeightsBeforeWait: GEMM 2, whose
// schedule and weights were written two or more launches back, by kernels that are complete once
// this one runs, since the kernel before it calls allow_next_kernel_launch() only after its own
// wait): waits for the previous kernel here, then lets the next one launch. Every thread of the
// block calls it once, on every path, so no block finishes before the previous kernel has.
template <bool WEIGHTS_BEFORE_WAIT>
__device__ __forceinline__ void wait_in_body() {
  if constexpr (WEIGHTS_BEFORE_WAIT) {
    wait_for_previous_kernel();
    allow_next_kernel_launch();
  }
}

// The source row of each of the BM tile rows (-1 past the tile's `rows`): GEMM 1 gathers hidden
// rows of the pairs' tokens, GEMM 2 reads its own sorted rows. Ends with a block barrier.
template <int BM, int THREADS, bool GATHER, int TOPK>
__device__ __forceinline__ void resolve_source_rows(const GemmArgs& args, long long row0, int rows,
                                                    long long* a_row) {
  for (int i = threadIdx.x; i < BM; i += THREADS) {
    long long src = -1;
    if (i < rows) src = GATHER ? args.sorted_pair[row0 + i] / TOPK : row0 + i;
    a_row[i] = src;
  }
  __syncthreads();
}

// Copies k-tiles of ROWS tile rows into a 128-byte-swizzled shared tile of 64-element rows, by
// THREADS threads numbered 0.. (`thread`). Each thread copies the same 16-byte chunk column of fixed
// tile rows in every stage, so its source rows are resolved once (the derived loaders below) and a
// stage only adds k0. A null source marks a row with no data (past the tile's rows, or a column past
// N): its chunks, and those past K, are zero-filled from `mapped`, any mapped address.
template <typename T, int ROWS, int THREADS, long long K>
struct RowCopies {
  static constexpr int COPIES = ROWS * 8 / THREADS, ROW_STEP = THREADS / 8;
  static_assert(ROWS * 8 % THREADS == 0, "copies split evenly over threads");
  static_assert(K % 8 == 0, "rows are copied in 16-byte chunks");

  const T* src[COPIES];
  const T* mapped;
  int chunk, first_row;

  __device__ __forceinline__ RowCopies(const T* mapped_address, int thread)
      : mapped(mapped_address), chunk(thread & 7), first_row(thread >> 3) {}

  // The tile row of this thread's copy i.
  __device__ __forceinline__ int row(int i) const { return first_row + i * ROW_STEP; }

  // Issues this thread's copies of k-tile kt (64 columns) into `tile`, not committed.
  __device__ __forceinline__ void load(T* tile, int kt) const {
    const long long k0 = static_cast<long long>(kt) * 64;
    const bool k_valid = k0 + chunk * 8 < K;
#pragma unroll
    for (int i = 0; i < COPIES; ++i) {
      const bool valid = k_valid && src[i] != nullptr;
      copy_16_async(shared_address(tile + swizzled(row(i), chunk)), valid ? src[i] + k0 : mapped, valid);
    }
  }
};

// A block's weight rows: HALVES * BN rows of this expert's [HALVES * N, K] weights w, the gate rows
// from column n0, then (gated) the up rows of the same columns. Known from the expert and n0 alone,
// so a block can start these copies before it has resolved its A rows.
template <typename T, int BN, int HALVES, int THREADS, long long N, long long K>
struct WeightRows : RowCopies<T, HALVES * BN, THREADS, K> {
  __device__ __forceinline__ WeightRows(const T* w, long long n0, int thread)
      : RowCopies<T, HALVES * BN, THREADS, K>(w, thread) {
#pragma unroll
    for (int i = 0; i < this->COPIES; ++i) {
      const int r = this->row(i), half = r / BN;
      const long long col = n0 + (r - half * BN);
      this->src[i] = col < N ? w + (half * N + col) * K + this->chunk * 8 : nullptr;
    }
  }
};

// A block's A rows: BM rows of the matrix a, row i from a_row[i] (resolve_source_rows' table in
// shared memory, after its barrier; -1: no row, zero-filled).
template <typename T, int BM, int THREADS, long long K>
struct SourceRows : RowCopies<T, BM, THREADS, K> {
  __device__ __forceinline__ SourceRows(const T* a, const long long* a_row, int thread)
      : RowCopies<T, BM, THREADS, K>(a, thread) {
#pragma unroll
    for (int i = 0; i < this->COPIES; ++i) {
      const long long src = a_row[this->row(i)];
      this->src[i] = src >= 0 ? a + src * K + this->chunk * 8 : nullptr;
    }
  }
};

}  // namespace tile
}  // namespace moejit
