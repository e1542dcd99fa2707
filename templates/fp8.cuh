// Conversion to float8_e4m3fn (common.cuh's e4m3) as SPEC.md's quantization rounds: to nearest
// even, saturating to +-448 (infinities too), NaN to NaN. cuda_fp8.h's conversion does exactly
// this (cvt.rn.satfinite.e4m3x2.f32 on sm_89 and later, the same rounding in software before);
// only the kernels that quantize include it.
#pragma once

#include <cuda_fp8.h>

#include "moejit/common.cuh"

namespace moejit {

constexpr float kE4m3Max = 448.0f;

// The scale of a group whose largest magnitude is amax (SPEC.md): max(amax, 1e-10) / 448. The
// quantize kernels and fp8_block GEMM 1's fused epilogue share it, so their outputs agree bit for bit.
__device__ __forceinline__ float e4m3_scale(float amax) { return fmaxf(amax, 1e-10f) / kE4m3Max; }

__device__ __forceinline__ e4m3 to_e4m3(float x) {
  return e4m3{static_cast<unsigned char>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3))};
}

}  // namespace moejit
