// The quantize family (templates/quantize.cuh, w8a8 only): per-row smoothed int8 quantization,
// once as SPEC.md stage 3 (gather hidden rows into expert-sorted order, smooth, quantize) and once
// between the GEMMs (re-quantize GEMM 1's fp32 output). One template, two kernels.
#pragma once

#include <vector>

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

// {quantize_expand, quantize_act}; one block per expert-sorted row.
std::vector<KernelPlan> quantize_kernels(const LayerSpec& spec);

// Stage 3: hidden -> a_q, a_scale (input_smooth of each row's expert).
QuantizeArgs quantize_expand_args(const CallContext& context);
// After GEMM 1: act_f32 -> act_q, act_scale (act_smooth was applied by GEMM 1).
QuantizeArgs quantize_act_args(const CallContext& context);

}  // namespace moejit
