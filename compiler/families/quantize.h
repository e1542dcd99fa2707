// The quantize family (templates/quantize.cuh): the activation quantizations of the quantized
// layers, once as SPEC.md stage 3 and once between the GEMMs (GEMM 1's fp32 output for GEMM 2).
//   w8a8_int8: quantize_rows, per expert-sorted row with the row's smoothing (stage 3 gathers
//              hidden rows into sorted order: a block per pair)
//   fp8:       quantize_fp8_rows, per 128-column group (fp8_block) or row (fp8_tensor); stage 3
//              quantizes each token's row once (a block per token; GEMM 1 gathers)
#pragma once

#include <vector>

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

// {quantize_expand, quantize_act}.
std::vector<KernelPlan> quantize_kernels(const LayerSpec& spec);

// Stage 3: hidden -> a_q, a_scale (w8a8: input_smooth of each row's expert).
QuantizeArgs quantize_expand_args(const CallContext& context);
// After GEMM 1: act_f32 -> act_q, act_scale (w8a8: act_smooth was applied by GEMM 1).
QuantizeArgs quantize_act_args(const CallContext& context);

}  // namespace moejit
