// The float64 CPU reference of every stage of SPEC.md. Written from the spec alone, it shares no
// code with the generated kernels; the GPU tests compare against it. Its routing (stage 1) is the
// one CPU routing of common/cpu_routing.h in double, which it shares with the torch op's CPU kernel
// and the ILU backend's portable routing (both in float). Inputs are the values the device sees
// (already rounded to bf16/fp16/int8/e4m3), widened to double.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/moe_config.h"

namespace moejit::reference {

// Stage 1. logits [T, E]; bias [E] (empty unless topk_method is noaux_tc).
struct Routing {
  std::vector<double> weights;   // [T, K]
  std::vector<int> ids;          // [T, K]
  // Per token: true when some selection (a group or an expert) was decided between candidates whose
  // selection scores differ by at most 1e-6 relative; ids may then legitimately differ from a
  // float32 implementation (SPEC.md's tolerance rule).
  std::vector<bool> near_tie;    // [T]
};
Routing route(const MoeConfig& config, int64_t tokens, const std::vector<double>& logits,
              const std::vector<double>& bias);

// Stage 1's router GEMM (router_gemm layers): logits [T, E] = hidden [T, H] @ gate_weight [E, H]^T
// (+ gate_bias [E] for router_bias layers: given exactly then), exact sums of the inputs as the
// device holds them (the device's fp32 sum rounded to router_dtype differs from these by that
// rounding).
std::vector<double> router_logits(const MoeConfig& config, int64_t tokens, const std::vector<double>& hidden,
                                  const std::vector<double>& gate_weight, const std::vector<double>& gate_bias = {});

// Stage 2 for this rank (config.ep_rank): stable counting sort of the flat pairs by local expert.
// With fused shared experts (S = shared_slots()), a token has K' = K + S pairs f = t * K' + j
// (slots j >= K: shared expert j - K, local expert E_loc + j - K on ep_rank 0, not local
// elsewhere), and E_loc below counts them: E_loc + S.
struct Index {
  std::vector<int> counts;       // [E_loc]
  std::vector<int> offsets;      // [E_loc + 1]
  std::vector<int> sorted_pair;  // [offsets[E_loc]] position -> flat pair
  std::vector<int> pair_pos;     // [T*K'] flat pair -> position, -1 when the expert is not local
};
Index index(const MoeConfig& config, int64_t tokens, const std::vector<int>& ids);

// Weights as the device holds them, widened to double (int8 values as integers for w8a8, e4m3
// values as the numbers they encode for fp8). The scale shapes are quant_tensor_shapes(config)'s.
// E_loc and E count the fused shared experts (E_loc + S, E + S): theirs follow the routed experts'.
struct Weights {
  std::vector<double> w13;           // [E_loc, N1, H] in the config's weight_layout (nk or kn)
  std::vector<double> w2;            // [E_loc, H, I] (nk) or [E_loc, I, H] (kn)
  std::vector<double> w13_scale;     // w8a8 [E_loc, N1]; fp8_block [E_loc, ceil(N1/128), ceil(H/128)];
                                     // fp8_tensor [E_loc]
  std::vector<double> w2_scale;      // w8a8 [E_loc, H]; fp8_block [E_loc, ceil(H/128), ceil(I/128)];
                                     // fp8_tensor [E_loc]
  std::vector<double> input_smooth;  // [E, H]       (w8a8)
  std::vector<double> act_smooth;    // [E_loc, I]   (w8a8)
  std::vector<double> w13_bias;      // [E_loc, N1]  (expert_bias): added to GEMM 1 before the activation
  std::vector<double> w2_bias;       // [E_loc, H]   (expert_bias): added to GEMM 2, tensor-parallel rank 0 only
};

// Stages 3-6 given a routing (so GEMM checks do not depend on routing ties).
struct Experts {
  Index index;
  std::vector<double> act;   // [offsets[E_loc], I]: activation rows in expert-sorted order
                             // (w8a8: after act_smooth, before re-quantization; fp8: before
                             // quantization, the float64 value of the device's act_f32)
  std::vector<double> y;     // [offsets[E_loc], H]: GEMM 2 rows in expert-sorted order
  std::vector<double> out;   // [T, H]: combine (+ residual); a fused shared expert's pair weighs 1
};
Experts experts(const MoeConfig& config, int64_t tokens, const std::vector<double>& hidden,
                const std::vector<int>& ids, const std::vector<double>& topk_weights, const Weights& weights,
                const std::vector<double>& residual /* [T, H] or empty */);

// The whole layer: route, then experts.
struct Layer {
  Routing routing;
  Experts experts;
};
Layer layer(const MoeConfig& config, int64_t tokens, const std::vector<double>& hidden,
            const std::vector<double>& logits, const std::vector<double>& bias, const Weights& weights,
            const std::vector<double>& residual);

// ||got - ref||_F / ||ref||_F; 0 when both are zero; +inf when ref is zero and got is not, or any
// value is NaN or infinite.
double relative_error(const std::vector<double>& ref, const std::vector<double>& got);

// SPEC.md w8a8 row quantization: scale = max|x| / 127, q = round-half-even(x / scale) clamped to
// [-127, 127]; a zero row gives scale 0 and q 0.
void quantize_row(const double* x, int64_t n, double* q, double* scale);

// SPEC.md fp8 activation quantization of one row of n values, per group of `group` consecutive
// columns (128 for fp8_block, n for fp8_tensor; the last group may be shorter): in fp32 as the
// device computes it, amax = max |float(x)| over the group (a NaN does not enter it, as with
// fmaxf), s = max(amax, 1e-10f) / 448.0f, q = e4m3(float(x) / s) rounded to nearest even and
// saturating to +-448 (NaN stays NaN). Writes q [n] (the e4m3 values) and scales
// [ceil(n / group)].
void quantize_fp8_row(const double* x, int64_t n, int64_t group, double* q, double* scales);

// The dequantized weights of an fp8 config (SPEC.md: W[e][n][k] = w[e][n][k] * scale[e][n/128][k/128]
// for fp8_block, * scale[e] for fp8_tensor), without scales: with the config's quant set to none,
// reference::experts on them is the unquantized layer over the same weights, against which the
// fp8 layer's quantization error can be measured.
Weights dequantized_fp8(const MoeConfig& config, const Weights& weights);

}  // namespace moejit::reference
