// One layer call as values: the caller's device pointers (LayerInputs), the launches a call of T
// tokens makes (CallPlan, from the plan's launch rules; the planner's one decision per call) and
// the buffers its kernels read and write (CallBuffers), from which each kernel family packs its
// arguments (pack_args). Pure host code: no CUDA call, no allocation; the runtime fills these per
// call and launches.
#pragma once

#include <array>
#include <cstdint>
#include <variant>

#include "compiler/plan.h"
#include "compiler/workspace.h"
#include "templates/args.cuh"

namespace moejit {

// Device pointers of one layer call. Shapes follow SPEC.md (T tokens; E_loc = experts / ep_size;
// I = moe_intermediate / tp_size; N1 = 2I when gated, else I):
struct LayerInputs {
  const void* hidden = nullptr;          // [T, H] dtype
  const void* router_logits = nullptr;   // [T, E] router_dtype; null for router_gemm layers
  const void* gate_weight = nullptr;     // [E, H] dtype: router_gemm layers only (the router's weight)
  const void* gate_bias = nullptr;       // [E] dtype: router_bias layers only (the router's bias, gpt-oss)
  const void* w13 = nullptr;             // [E_loc, N1, H] (layout nk) or [E_loc, H, N1] (kn); int8 for
                                         // w8a8, float8_e4m3fn for fp8
  const void* w2 = nullptr;              // [E_loc, H, I] (nk) or [E_loc, I, H] (kn); int8 / e4m3 as w13
  const float* e_score_correction_bias = nullptr;  // [E]; required for topk_method noaux_tc
  // The scales of a quantized layer, shaped as quant_tensor_shapes() says (compiler/moe_config.h):
  const float* w13_scale = nullptr;      // w8a8 [E_loc, N1]; fp8_block [E_loc, ceil(N1/128), ceil(H/128)]; fp8_tensor [E_loc]
  const float* w2_scale = nullptr;       // w8a8 [E_loc, H]; fp8_block [E_loc, ceil(H/128), ceil(I/128)]; fp8_tensor [E_loc]
  const float* input_smooth = nullptr;   // [E, H]; w8a8
  const float* act_smooth = nullptr;     // [E_loc, I]; w8a8
  // The expert biases of a layer with expert_bias (fp32): w13_bias is added to GEMM 1's rows before
  // the activation, w2_bias to each expert's output before the combine (tensor-parallel rank 0
  // only: the ranks' outputs are summed).
  const float* w13_bias = nullptr;       // [E_loc, N1] (gate rows, then up rows)
  const float* w2_bias = nullptr;        // [E_loc, H]
  const void* residual = nullptr;        // [T, H] dtype, optional (shared experts' output)
  // fp8 layers' experts() only: hidden given already quantized, [T, H] float8_e4m3fn with these
  // scales ([T, ceil(H/128)] for fp8_block, [T] for fp8_tensor), as the layer's own stage 3 makes them
  // (a row quantized once per token, so the result is the same bit for bit); stage 3 is then skipped.
  // What expert parallel's fp8 dispatch delivers (runtime/dispatched_layer.h). Null: hidden is dtype.
  const float* hidden_scale = nullptr;
};

// The layer's entry points (runtime/layer.h): the whole layer, stage 1 alone, stages 2-6 on a
// given routing.
enum class Entry { Forward, Route, Experts };

struct Grid {
  int64_t x = 1, y = 1;
};

struct CallStep {
  KernelRole role;
  int kernel;  // index into Plan::kernels
  Grid grid;
};

constexpr int kMaxCallSteps = 10;

// Up to this many tokens forward() routes and indexes in one single-block launch
// (route_index.cuh); experts() indexes in one launch whenever T*K' <= kPairsPerIndexBlock (K' =
// K + fused shared experts).
constexpr int64_t kFusedRouteIndexMaxTokens = 32;

// The launches of one call, in order. Computed once per call; no allocation.
struct CallPlan {
  Entry entry = Entry::Forward;
  int64_t tokens = 0, pairs = 0;
  const TokenBucket* bucket = nullptr;  // the GEMMs' bucket; null for Entry::Route
  int64_t row_tiles = 0;                // the GEMM grids' bound on row tiles (max_row_tiles)
  std::array<CallStep, kMaxCallSteps> steps{};
  int count = 0;

  const CallStep* begin() const { return steps.data(); }
  const CallStep* end() const { return steps.data() + count; }
};

// The launches `entry` makes for `tokens` (> 0) tokens: routing and index fused into one launch for
// small batches, the bucket's GEMMs, the quantized layers' quantizations (stage 3's not when
// `quantized_hidden`: an fp8 layer's experts() given quantized rows, LayerInputs::hidden_scale);
// grids by each kernel's launch rule.
CallPlan plan_call(const Plan& plan, Entry entry, int64_t tokens, bool quantized_hidden = false);

// Every buffer of one call. topk_weights / topk_ids: the caller's outputs (Route), the workspace's
// (Forward) or the caller's routing (Experts, read only).
struct CallBuffers {
  LayerInputs in;
  void* output = nullptr;
  float* topk_weights = nullptr;
  int* topk_ids = nullptr;
  char* workspace = nullptr;
  WorkspaceOffsets offsets;
  TensorMap w13_map{}, w2_map{};  // the bucket's wgmma GEMMs' weight maps (zero for other kernels)

  // The workspace buffer at `offset` (null when the config does not use it: offset -1).
  template <typename T>
  T* at(int64_t offset) const {
    return offset < 0 ? nullptr : reinterpret_cast<T*>(workspace + offset);
  }
};

// What a kernel family packs its arguments from.
struct CallContext {
  const LayerSpec& spec;
  Placement placement;
  const CallPlan& call;
  const CallBuffers& buffers;
};

// A kernel's argument struct (templates/args.cuh), by role.
using KernelArgs =
    std::variant<RouterGemmArgs, RouteArgs, IndexArgs, RouteIndexArgs, QuantizeArgs, GemmArgs, CombineArgs>;

// The arguments of one launch of `step`, packed by the kernel family that plays its role.
KernelArgs pack_args(const CallStep& step, const CallContext& context);

}  // namespace moejit
