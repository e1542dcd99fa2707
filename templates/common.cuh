// Device helpers shared by every stage: element conversion, sanitizing, activations.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "moejit/args.cuh"

namespace moejit {

enum ActivationKind { kSilu = 0, kGelu = 1, kGeluTanh = 2, kSwigluOai = 3 };

// How a GEMM's 8-bit operands are scaled back (SPEC.md "Quantized experts"):
//   kNoScaling          16-bit operands
//   kRowChannelScaling  w8a8 int8: acc * a_scale[row] * w_scale[expert][column] after the K loop
//   kTensorScaling      fp8_tensor: acc * a_scale[row] * w_scale[expert] after the K loop
//   kBlockScaling       fp8_block: every 128-deep K block's partial sum times
//                       a_scale[row][block] * w_scale[expert][row block][block]
enum ScalingKind { kNoScaling = 0, kRowChannelScaling = 1, kTensorScaling = 2, kBlockScaling = 3 };

// A float8_e4m3fn value as stored (1 sign bit, 4 exponent bits biased by 7, 3 mantissa bits, no
// infinities, 0x7f / 0xff NaN). A type of moejit's own, so kernels that only move or widen fp8 bytes
// need no cuda_fp8.h; fp8.cuh converts to it.
struct e4m3 {
  unsigned char bits;
};

constexpr float kFloatMax = 3.402823466e+38f;

// N elements moved as one access (16 bytes when sizeof(T) * N == 16): the row copies and sums of
// the combine and the expert-parallel exchange.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(signed char v) { return static_cast<float>(v); }
// Exact: every e4m3 value is a float (exponent e - 7 + 127; the subnormals are m * 2^-9).
__device__ __forceinline__ float to_float(e4m3 v) {
  const unsigned e = (v.bits >> 3) & 15u, m = v.bits & 7u;
  float magnitude;
  if (e == 15u && m == 7u)
    magnitude = __int_as_float(0x7fc00000);
  else if (e == 0u)
    magnitude = static_cast<float>(m) * 0.001953125f;
  else
    magnitude = __int_as_float(static_cast<int>(((e + 120u) << 23) | (m << 20)));
  return (v.bits & 0x80u) ? -magnitude : magnitude;
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// GEMM operands widened for accumulation: int8 stays integer (exact int32 products), every
// other type goes to fp32. Overloads rather than <cuda/std/type_traits>, which costs NVRTC
// 0.75 s per unit.
__device__ __forceinline__ int widen(signed char v) { return v; }
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(e4m3 v) { return to_float(v); }

// SPEC.md stage 1: NaN -> -FLT_MAX, +inf -> +FLT_MAX, -inf -> -FLT_MAX, so every later step
// works on finite numbers whatever the caller's logits hold.
__device__ __forceinline__ float sanitize(float x) {
  if (x != x) return -kFloatMax;
  return fminf(fmaxf(x, -kFloatMax), kFloatMax);
}

// num / (1 + e^-z), the logistic factor of SiLU and SwiGLU. The quotient is __fdividef (div.approx,
// 2 ulp; 0 once the denominator passes 2^126, i.e. z < -87.3, where the exact value is below 1e-35):
// IEEE division's slow path made each of a gated GEMM 1's 32-64 epilogue values a branch and a
// subroutine, about a quarter of a wgmma GEMM 1's NVRTC time (bench/RESULTS.md, session 21).
__device__ __forceinline__ float over_one_plus_exp_neg(float num, float z) { return __fdividef(num, 1.0f + expf(-z)); }

template <int ACT>
__device__ __forceinline__ float activate(float x) {
  static_assert(ACT != kSwigluOai, "swigluoai is gated: gated_activation");
  if constexpr (ACT == kSilu) {
    return over_one_plus_exp_neg(x, x);
  } else if constexpr (ACT == kGelu) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  } else {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  }
}

// A gated GEMM 1's output from one column's gate and up values: act(gate) * up, or gpt-oss's clamped
// SwiGLU, g = min(gate, limit), u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(1.702 g).
// The comparisons keep a NaN a NaN, as torch.clamp does (fminf would drop it).
template <int ACT>
__device__ __forceinline__ float gated_activation(float gate, float up, float limit) {
  if constexpr (ACT == kSwigluOai) {
    const float g = gate > limit ? limit : gate;
    const float u = up > limit ? limit : (up < -limit ? -limit : up);
    return over_one_plus_exp_neg((u + 1.0f) * g, 1.702f * g);
  } else {
    return activate<ACT>(gate) * up;
  }
}

// Programmatic dependent launch (sm_90 and later). The runtime launches every kernel of a layer
// call after the first with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: its blocks may
// be scheduled once every block of the kernel before it has called allow_next_kernel_launch(),
// which hides the launch and the drain of one kernel behind the next. So every entry point waits,
// before it touches global memory, until the previous kernel has completed and its writes are
// visible; that kernel waited for its own predecessor, so the whole chain before it is done too.
// Since every kernel allows the next one only after its own wait, what kernels two or more
// launches back wrote is complete whenever a kernel runs: GEMM 2 reads its schedule and starts
// its weight copies before its wait (gemm_tiles.cuh's wait_in_body), and the combine reads its
// tokens' slots before its wait (combine.cuh).
// Without the launch attribute (or before sm_90) the wait returns at once.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel in the stream launch early. Called right after the wait: the next kernel's
// blocks then only take SM slots that this kernel's blocks, all already resident, do not need.
__device__ __forceinline__ void allow_next_kernel_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Warp reductions by xor butterfly: every lane gets the same, run-to-run identical result.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ unsigned lanemask_lt() {
  unsigned mask;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
  return mask;
}

}  // namespace moejit
