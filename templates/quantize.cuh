// Stage 3 for w8a8 (and the re-quantization between the GEMMs): per-row dynamic int8 quantization
// of smoothed activations, SPEC.md: x = row * smooth, scale = max|x| / 127,
// q = round-half-even(x / scale) clamped to [-127, 127]. One block per expert-sorted row.
//
// Spec: using Src; kCols; kThreads; kTopk;
//   kGather: the row is hidden[sorted_pair[p] / kTopk] and smooth is input_smooth[global expert]
//            (stage 3); otherwise the row is src[p] and smooth is null (act_smooth was applied in
//            GEMM 1's epilogue).
#pragma once

#include <cub/block/block_reduce.cuh>

#include "moejit/common.cuh"

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

}  // namespace moejit
