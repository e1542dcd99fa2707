// The activation quantizations of SPEC.md "Quantized experts", one block per row:
//
// quantize_rows (w8a8 int8): stage 3 and the re-quantization between the GEMMs, per-row dynamic
// quantization of smoothed activations: x = row * smooth, scale = max|x| / 127,
// q = round-half-even(x / scale) clamped to [-127, 127]. One block per expert-sorted row.
//   Spec: using Src; kCols; kThreads; kTopk; kLocalExperts (the GEMMs' experts); kSharedSlots;
//   kExperts (E);
//   kGather: the row is hidden[sorted_pair[p] / (kTopk + kSharedSlots)] and smooth is
//            input_smooth[global expert] (a fused shared slot s: expert E + s)
//            (stage 3); otherwise the row is src[p] and smooth is null (act_smooth was applied in
//            GEMM 1's epilogue).
//
// quantize_fp8_rows (fp8_block, fp8_tensor): per group of kGroupCols columns of a row,
// s = max(amax, 1e-10) / 448, q = e4m3(x / s) (round to nearest even, saturating). fp8 has no
// smoothing, so stage 3 quantizes each token's hidden row once (GEMM 1 gathers the quantized rows)
// and the re-quantization reads GEMM 1's fp32 rows in expert-sorted order.
//   Spec: using Src; kCols; kGroupCols (128, or kCols: one scale per row); kThreads; kLocalExperts;
//   kSorted: the rows are expert-sorted positions (rows past the local ones are left alone);
//            otherwise every row of the grid is a token's.
//
// A whole row's scale needs its amax before any element is quantized. Where the row fits
// (RowChunks: at most kMaxRowValues values a thread), each thread loads its 16-byte chunks once
// into registers, the block reduces the amax, and the values are quantized from the registers and
// stored 4 or 8 bytes at a time; the planner sizes kThreads for about 4 chunks a thread. Other rows
// (not whole 16-byte chunks, or too long) are read twice. Both compute the same floats.
#pragma once

#include <cub/block/block_reduce.cuh>

#include "moejit/fp8.cuh"

namespace moejit {

namespace quantize_detail {

constexpr int kMaxRowValues = 64;  // register-resident values per thread

// Packs VEC (4 or 8) quantized bytes and stores them at q + chunk * VEC (aligned: rows of whole
// 16-byte source chunks have byte rows of whole VEC-byte chunks).
template <int VEC>
__device__ __forceinline__ void store_bytes(signed char* q, long long chunk, const unsigned char (&b)[VEC]) {
  static_assert(VEC == 4 || VEC == 8, "4 or 8 bytes");
  unsigned lo = b[0] | b[1] << 8 | b[2] << 16 | static_cast<unsigned>(b[3]) << 24;
  if constexpr (VEC == 4) {
    reinterpret_cast<unsigned*>(q)[chunk] = lo;
  } else {
    const unsigned hi = b[4] | b[5] << 8 | b[6] << 16 | static_cast<unsigned>(b[7]) << 24;
    reinterpret_cast<uint2*>(q)[chunk] = make_uint2(lo, hi);
  }
}

__device__ __forceinline__ unsigned char int8_of(float x, float scale) {
  // A zero row has scale 0: store zeros rather than 0/0.
  const float r = scale > 0.0f ? rintf(x / scale) : 0.0f;
  return static_cast<unsigned char>(static_cast<signed char>(fminf(fmaxf(r, -127.0f), 127.0f)));
}

// A row of COLS elements of Src in chunks of VEC elements (16 bytes where rows are whole 16-byte
// chunks, else 1 element), CHUNKS_PER_THREAD a thread (chunk threadIdx.x + c * THREADS).
template <typename Src, long long COLS, int THREADS>
struct RowChunks {
  static constexpr int VEC = (COLS * static_cast<long long>(sizeof(Src))) % 16 == 0 ? 16 / static_cast<int>(sizeof(Src)) : 1;
  static constexpr long long CHUNKS = (COLS + VEC - 1) / VEC;
  static constexpr int CHUNKS_PER_THREAD = static_cast<int>((CHUNKS + THREADS - 1) / THREADS);
  static constexpr bool kInRegisters = VEC > 1 && CHUNKS_PER_THREAD * VEC <= kMaxRowValues;

  // Loads this thread's chunks of `row` as floats (v[c][i]; chunks past the row are zeros).
  __device__ static void load(const Src* row, float (&v)[CHUNKS_PER_THREAD][VEC]) {
#pragma unroll
    for (int c = 0; c < CHUNKS_PER_THREAD; ++c) {
      const long long chunk = threadIdx.x + static_cast<long long>(c) * THREADS;
      if (chunk < CHUNKS) {
        const uint4 bits = __ldg(reinterpret_cast<const uint4*>(row) + chunk);
        const Src* e = reinterpret_cast<const Src*>(&bits);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[c][i] = to_float(e[i]);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[c][i] = 0.0f;
      }
    }
  }

  // Quantizes the row with one scale into q (whole VEC-byte chunks): adjust(chunk, i, x) is element
  // i of a chunk as quantized (w8a8: times smooth), scale_of(amax) the row's scale (block-wide:
  // every thread calls it), byte_of(x, s) the stored byte.
  template <typename Adjust, typename ScaleOf, typename ByteOf>
  __device__ static void quantize(const Src* row, signed char* q, Adjust adjust, ScaleOf scale_of, ByteOf byte_of) {
    float v[CHUNKS_PER_THREAD][VEC];
    load(row, v);
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS_PER_THREAD; ++c) {
      const long long chunk = threadIdx.x + static_cast<long long>(c) * THREADS;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        if (chunk < CHUNKS) v[c][i] = adjust(chunk, i, v[c][i]);
        amax = fmaxf(amax, fabsf(v[c][i]));
      }
    }
    const float s = scale_of(amax);
#pragma unroll
    for (int c = 0; c < CHUNKS_PER_THREAD; ++c) {
      const long long chunk = threadIdx.x + static_cast<long long>(c) * THREADS;
      if (chunk >= CHUNKS) continue;
      unsigned char b[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) b[i] = byte_of(v[c][i], s);
      store_bytes<VEC>(q, chunk, b);
    }
  }
};

}  // namespace quantize_detail

template <typename Spec>
__device__ void quantize_rows(const QuantizeArgs& args) {
  using namespace quantize_detail;
  using Src = typename Spec::Src;
  using Reduce = cub::BlockReduce<float, Spec::kThreads>;
  using Row = RowChunks<Src, Spec::kCols, Spec::kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float row_scale;

  const long long p = blockIdx.x;
  if (p >= args.expert_offsets[Spec::kLocalExperts]) return;  // not a local row: nothing to do

  const Src* row;
  const float* smooth = nullptr;
  if constexpr (Spec::kGather) {
    const int f = args.sorted_pair[p];
    int t, expert;
    if constexpr (Spec::kSharedSlots == 0) {
      t = f / Spec::kTopk;
      expert = args.topk_ids[f];
    } else {
      // Pairs f = t * K' + j (K' = kTopk + kSharedSlots); a shared slot's smoothing row is global
      // expert E + (j - kTopk), after the routed experts' rows of input_smooth.
      constexpr int SLOTS = Spec::kTopk + Spec::kSharedSlots;
      t = f / SLOTS;
      const int j = f - t * SLOTS;
      expert = j < Spec::kTopk ? args.topk_ids[t * Spec::kTopk + j] : Spec::kExperts + (j - Spec::kTopk);
    }
    row = static_cast<const Src*>(args.src) + static_cast<long long>(t) * Spec::kCols;
    smooth = args.smooth + static_cast<long long>(expert) * Spec::kCols;
  } else {
    row = static_cast<const Src*>(args.src) + p * Spec::kCols;
  }
  signed char* q = args.q + p * Spec::kCols;
  auto publish_scale = [&](float amax) {
    amax = Reduce(temp).Reduce(amax, ::cuda::maximum<>{});
    if (threadIdx.x == 0) {
      row_scale = amax / 127.0f;
      args.scale[p] = row_scale;
    }
    __syncthreads();
    return row_scale;
  };

  if constexpr (Row::kInRegisters) {
    // smooth is read per element: it is only 4-byte aligned (a caller's tensor); L2-resident.
    Row::quantize(
        row, q,
        [&](long long chunk, int i, float x) { return smooth != nullptr ? x * __ldg(smooth + chunk * Row::VEC + i) : x; },
        publish_scale, [](float x, float scale) { return int8_of(x, scale); });
  } else {
    auto value = [&](long long c) {
      const float x = to_float(row[c]);
      return smooth ? x * smooth[c] : x;
    };
    float amax = 0.0f;
    for (long long c = threadIdx.x; c < Spec::kCols; c += Spec::kThreads) amax = fmaxf(amax, fabsf(value(c)));
    const float scale = publish_scale(amax);
    for (long long c = threadIdx.x; c < Spec::kCols; c += Spec::kThreads)
      q[c] = static_cast<signed char>(int8_of(value(c), scale));
  }
}

template <typename Spec>
__device__ void quantize_fp8_rows(const QuantizeArgs& args) {
  constexpr long long COLS = Spec::kCols, GROUP = Spec::kGroupCols;
  constexpr long long GROUPS = (COLS + GROUP - 1) / GROUP;
  const long long p = blockIdx.x;
  if constexpr (Spec::kSorted) {
    if (p >= args.expert_offsets[Spec::kLocalExperts]) return;  // not a local row: nothing to do
  }
  const typename Spec::Src* row = static_cast<const typename Spec::Src*>(args.src) + p * COLS;
  e4m3* q = reinterpret_cast<e4m3*>(args.q) + p * COLS;
  float* scale = args.scale + p * GROUPS;

  if constexpr (GROUP == 128) {
    // A warp per 128-column group, four columns a lane: the group's amax is a warp reduction.
    // (fmaxf drops NaN, so a NaN leaves the scale finite and quantizes to NaN itself: only its row
    // is affected.)
    constexpr int WARPS = Spec::kThreads / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (long long g = warp; g < GROUPS; g += WARPS) {
      float v[4];
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const long long c = g * 128 + lane * 4 + i;
        v[i] = c < COLS ? to_float(row[c]) : 0.0f;
        amax = fmaxf(amax, fabsf(v[i]));
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
      const float s = e4m3_scale(amax);
      if (lane == 0) scale[g] = s;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const long long c = g * 128 + lane * 4 + i;
        if (c < COLS) q[c] = to_e4m3(v[i] / s);
      }
    }
  } else {
    static_assert(GROUP == COLS, "a group is 128 columns or the whole row");
    using namespace quantize_detail;
    using Reduce = cub::BlockReduce<float, Spec::kThreads>;
    using Row = RowChunks<typename Spec::Src, COLS, Spec::kThreads>;
    __shared__ typename Reduce::TempStorage temp;
    __shared__ float row_scale;
    auto publish_scale = [&](float amax) {
      amax = Reduce(temp).Reduce(amax, ::cuda::maximum<>{});
      if (threadIdx.x == 0) {
        row_scale = e4m3_scale(amax);
        scale[0] = row_scale;
      }
      __syncthreads();
      return row_scale;
    };
    if constexpr (Row::kInRegisters) {
      Row::quantize(
          row, reinterpret_cast<signed char*>(q), [](long long, int, float x) { return x; }, publish_scale,
          [](float x, float s) { return to_e4m3(x / s).bits; });
    } else {
      float amax = 0.0f;
      for (long long c = threadIdx.x; c < COLS; c += Spec::kThreads) amax = fmaxf(amax, fabsf(to_float(row[c])));
      const float s = publish_scale(amax);
      for (long long c = threadIdx.x; c < COLS; c += Spec::kThreads) q[c] = to_e4m3(to_float(row[c]) / s);
    }
  }
}

}  // namespace moejit
