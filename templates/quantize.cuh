// The activation quantizations of SPEC.md "Quantized experts", one block per row:
//
// quantize_rows (w8a8 int8): stage 3 and the re-quantization between the GEMMs, per-row dynamic
// quantization of smoothed activations: x = row * smooth, scale = max|x| / 127,
// q = round-half-even(x / scale) clamped to [-127, 127]. One block per expert-sorted row.
//   Spec: using Src; kCols; kThreads; kTopk; kLocalExperts;
//   kGather: the row is hidden[sorted_pair[p] / kTopk] and smooth is input_smooth[global expert]
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
#pragma once

#include <cub/block/block_reduce.cuh>

#include "moejit/fp8.cuh"

namespace moejit {

template <typename Spec>
__device__ void quantize_rows(const QuantizeArgs& args) {
  using Reduce = cub::BlockReduce<float, Spec::kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float row_scale;

  const long long p = blockIdx.x;
  if (p >= args.expert_offsets[Spec::kLocalExperts]) return;  // not a local row: nothing to do

  const typename Spec::Src* row;
  const float* smooth = nullptr;
  if constexpr (Spec::kGather) {
    const int f = args.sorted_pair[p];
    row = static_cast<const typename Spec::Src*>(args.src) + static_cast<long long>(f / Spec::kTopk) * Spec::kCols;
    smooth = args.smooth + static_cast<long long>(args.topk_ids[f]) * Spec::kCols;
  } else {
    row = static_cast<const typename Spec::Src*>(args.src) + p * Spec::kCols;
  }
  auto value = [&](long long c) {
    const float x = to_float(row[c]);
    return smooth ? x * smooth[c] : x;
  };

  float amax = 0.0f;
  for (long long c = threadIdx.x; c < Spec::kCols; c += Spec::kThreads) amax = fmaxf(amax, fabsf(value(c)));
  amax = Reduce(temp).Reduce(amax, ::cuda::maximum<>{});
  if (threadIdx.x == 0) {
    row_scale = amax / 127.0f;
    args.scale[p] = row_scale;
  }
  __syncthreads();
  const float scale = row_scale;
  signed char* q = args.q + p * Spec::kCols;
  for (long long c = threadIdx.x; c < Spec::kCols; c += Spec::kThreads) {
    // A zero row has scale 0: store zeros rather than 0/0.
    const float r = scale > 0.0f ? rintf(value(c) / scale) : 0.0f;
    q[c] = static_cast<signed char>(fminf(fmaxf(r, -127.0f), 127.0f));
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
      const float s = fmaxf(amax, 1e-10f) / kE4m3Max;
      if (lane == 0) scale[g] = s;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const long long c = g * 128 + lane * 4 + i;
        if (c < COLS) q[c] = to_e4m3(v[i] / s);
      }
    }
  } else {
    static_assert(GROUP == COLS, "a group is 128 columns or the whole row");
    using Reduce = cub::BlockReduce<float, Spec::kThreads>;
    __shared__ typename Reduce::TempStorage temp;
    __shared__ float row_scale;
    float amax = 0.0f;
    for (long long c = threadIdx.x; c < COLS; c += Spec::kThreads) amax = fmaxf(amax, fabsf(to_float(row[c])));
    amax = Reduce(temp).Reduce(amax, ::cuda::maximum<>{});
    if (threadIdx.x == 0) {
      row_scale = fmaxf(amax, 1e-10f) / kE4m3Max;
      scale[0] = row_scale;
    }
    __syncthreads();
    const float s = row_scale;
    for (long long c = threadIdx.x; c < COLS; c += Spec::kThreads) q[c] = to_e4m3(to_float(row[c]) / s);
  }
}

}  // namespace moejit
