#include "runtime/jit_layer.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/knobs.h"
#include "compiler/families/grouped_gemm.h"
#include "runtime/kernel_launch.h"
#include "runtime/layer_checks.h"
#include "runtime/loaded_layer.h"

namespace moejit {
namespace {

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) == alignof(CUtensorMap),
              "args.cuh's TensorMap must be cuda.h's CUtensorMap");

// Encodes the tensor map a wgmma GEMM loads `w`'s tiles through (weight_map_shape): box 64 (k) x
// box_rows x 1 in the 128-byte swizzle layout, zero fill outside. A host-side encoding: no device work.
TensorMap encode_weight_map(const void* w, const WeightMapShape& s, const char* name) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(s.k), static_cast<cuuint64_t>(s.n),
                              static_cast<cuuint64_t>(s.planes)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(s.k * 2), static_cast<cuuint64_t>(s.n * s.k * 2)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(s.box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  // 8-bit weights travel as pairs of bytes (the zero fill is bytes of zero either way).
  const CUtensorMapDataType type = s.byte_pairs           ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                   : s.dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map;
  const CUresult r = cuda_driver().tensor_map_encode_tiled(
      &map, type, 3,
      const_cast<void*>(w), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check_cuda(r, fmt::format("{}: cuTensorMapEncodeTiled ([{}][{}][{}], box 64 x {})", name, s.planes, s.n, s.k,
                            s.box_rows)
                    .c_str());
  TensorMap out;
  std::memcpy(&out, &map, sizeof map);
  return out;
}

// Whether the plan's arch has programmatic dependent launch (sm_90 and later).
bool has_programmatic_launch(const std::string& arch) {
  return arch.starts_with("sm_") && std::atoi(arch.c_str() + 3) >= 90;
}

class JitLayer final : public Layer {
 public:
  JitLayer(const MoeConfig& config, CompiledLayer compiled, CUcontext context, CUdevice device, bool retained_primary)
      : config_(config),
        loaded_(std::make_unique<LoadedLayer>(std::move(compiled), context, device)),
        device_(device),
        retained_primary_(retained_primary),
        programmatic_launch_(knobs().programmatic_launch && has_programmatic_launch(loaded_->plan().arch)) {}

  ~JitLayer() override {
    loaded_.reset();  // unload the modules while the primary context is still retained
    if (retained_primary_) cuda_driver().primary_ctx_release(device_);
  }

  const MoeConfig& config() const override { return config_; }
  const Plan* plan() const override { return &loaded_->plan(); }

  std::string describe() const override {
    const Plan& p = loaded_->plan();
    return nlohmann::json{{"kernels", p.kernels.size()}, {"units", p.unit_names()}, {"arch", p.arch}}.dump();
  }

  int launches(int64_t tokens) const override {
    return tokens <= 0 ? 0 : plan_call(loaded_->plan(), Entry::Forward, tokens).count;
  }

  void forward(void* stream, int64_t tokens, const LayerInputs& in, void* output, void* workspace,
               size_t workspace_size) const override {
    check_forward_routing_arguments(config_, tokens, in);
    const WorkspaceOffsets offsets = check_expert_arguments(config_, tokens, in, output, workspace, workspace_size);
    if (tokens == 0) return;
    const CallPlan call = plan_call(loaded_->plan(), Entry::Forward, tokens);
    CallBuffers b = expert_buffers(call, offsets, in, output, workspace);
    b.topk_weights = b.at<float>(b.offsets.topk_weights);
    b.topk_ids = b.at<int>(b.offsets.topk_ids);
    // The router GEMM's logits, which the routing launch after it reads.
    if (config_.router_gemm) b.in.router_logits = b.at<void>(b.offsets.router_logits);
    run(stream, call, b);
  }

  void route(void* stream, int64_t tokens, const void* router_logits, const float* bias, float* topk_weights,
             int* topk_ids) const override {
    check_routing_arguments(config_, tokens, router_logits, bias);
    if (tokens != 0) {  // [T, K] arrays: null is fine when there are none
      check_pointer(topk_weights, "topk_weights", 4);
      check_pointer(topk_ids, "topk_ids", 4);
    }
    if (tokens == 0) return;
    CallBuffers b;
    b.in.router_logits = router_logits;
    b.in.e_score_correction_bias = bias;
    b.topk_weights = topk_weights;
    b.topk_ids = topk_ids;
    run(stream, plan_call(loaded_->plan(), Entry::Route, tokens), b);
  }

  void experts(void* stream, int64_t tokens, const int* topk_ids, const float* topk_weights, const LayerInputs& in,
               void* output, void* workspace, size_t workspace_size) const override {
    if (tokens != 0) {  // [T, K] arrays: null is fine when there are none
      check_pointer(topk_ids, "topk_ids", 4);
      check_pointer(topk_weights, "topk_weights", 4);
    }
    const WorkspaceOffsets offsets = check_expert_arguments(config_, tokens, in, output, workspace, workspace_size);
    if (tokens == 0) return;
    const CallPlan call = plan_call(loaded_->plan(), Entry::Experts, tokens, in.hidden_scale != nullptr);
    CallBuffers b = expert_buffers(call, offsets, in, output, workspace);
    // The caller's routing: the kernels of Entry::Experts only read it.
    b.topk_weights = const_cast<float*>(topk_weights);
    b.topk_ids = const_cast<int*>(topk_ids);
    run(stream, call, b);
  }

 private:
  // The buffers of stages 2-6, the call's bucket's weight tensor maps included (encoded before the
  // first launch, since encoding may throw).
  CallBuffers expert_buffers(const CallPlan& call, const WorkspaceOffsets& offsets, const LayerInputs& in,
                             void* output, void* workspace) const {
    CallBuffers b;
    b.offsets = offsets;
    b.in = in;
    b.output = output;
    b.workspace = static_cast<char*>(workspace);
    const TokenBucket& bucket = *call.bucket;
    if (bucket.gemm1.kernel == GemmKernel::Wgmma)
      b.w13_map = encode_weight_map(in.w13, weight_map_shape(config_, true, bucket.gemm1), "w13");
    if (bucket.gemm2.kernel == GemmKernel::Wgmma)
      b.w2_map = encode_weight_map(in.w2, weight_map_shape(config_, false, bucket.gemm2), "w2");
    return b;
  }

  // Launches the call's steps in order on `stream`. Every launch after the first may overlap the
  // drain of the one before it (programmatic dependent launch: common.cuh's
  // wait_for_previous_kernel() keeps the order of memory accesses); the first follows the caller's
  // work in plain stream order, whatever that work is (a kernel, a copy, an event wait).
  void run(void* stream_handle, const CallPlan& call, const CallBuffers& buffers) const {
    const CUstream stream = static_cast<CUstream>(stream_handle);
    const std::vector<CUfunction>& functions = loaded_->functions_for(stream);
    const CallContext context{config_, config_.placement(), call, buffers};
    bool first = true;
    for (const CallStep& step : call) {
      KernelArgs args = pack_args(step, context);
      void* arg = std::visit([](auto& a) -> void* { return &a; }, args);
      launch_planned(functions[static_cast<size_t>(step.kernel)],
                     loaded_->plan().kernels[static_cast<size_t>(step.kernel)], step.grid, arg, stream,
                     programmatic_launch_ && !first);
      first = false;
    }
  }

  MoeConfig config_;
  std::unique_ptr<LoadedLayer> loaded_;
  CUdevice device_;
  bool retained_primary_;
  bool programmatic_launch_;
};

}  // namespace

std::unique_ptr<Layer> make_jit_layer(const MoeConfig& config, CompiledLayer compiled, CUcontext context,
                                      CUdevice device, bool retained_primary) {
  return std::make_unique<JitLayer>(config, std::move(compiled), context, device, retained_primary);
}

}  // namespace moejit
