#include "backends/ixformer/ixformer_backend.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <optional>

#include <nlohmann/json.hpp>

#include "backends/ixformer/ixformer_layer.h"
#include "backends/torch/dtype.h"
#include "runtime/backend_registry.h"
#include "runtime/layer_checks.h"

namespace moejit::ilu {
namespace {

// The caller's stream made current on a CUDA device for the scope of one call (nothing on the CPU).
class StreamScope {
 public:
  StreamScope(const at::Device& device, void* stream) {
    if (!device.is_cuda()) return;
    const c10::cuda::CUDAStream s =
        stream ? c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), device.index())
               : c10::cuda::getDefaultCUDAStream(device.index());
    guard_.emplace(s);
  }

 private:
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
};

class IxformerLayer final : public Layer {
 public:
  IxformerLayer(const MoeConfig& config, const at::Device& device) : config_(config), device_(device) {}

  const MoeConfig& config() const override { return config_; }
  const Plan* plan() const override { return nullptr; }
  int launches(int64_t) const override { return 0; }
  size_t workspace_bytes(int64_t max_tokens) const override {
    Layer::workspace_bytes(max_tokens);  // the same refusal of max_tokens < 0
    return 0;
  }

  std::string describe() const override {
    nlohmann::json summary = {{"backend", "ixformer"},
                              {"kernels", 0},
                              {"routing", routing_by_topk_softmax(config_) ? "ixformer topk_softmax" : "moejit cpu"}};
    const std::string missing = unsupported_capability(config_);
    if (!missing.empty()) summary["unsupported"] = missing;
    return summary.dump();
  }

  void forward(void* stream, int64_t tokens, const LayerInputs& in, void* output, void*, size_t) const override {
    check_forward_routing_arguments(config_, tokens, in);  // a gate_weight or gate_bias is refused (router_gemm false)
    check_inputs(tokens, in, output);
    if (tokens == 0) return;
    StreamScope scope(device_, stream);
    const at::Tensor out = ilu::forward(config_, hidden(in, tokens), logits(in.router_logits, tokens), w13(in),
                                        w2(in), bias(in.e_score_correction_bias), residual(in, tokens));
    wrap(output, {tokens, config_.hidden}, scalar_type(config_.dtype)).copy_(out);
  }

  void route(void* stream, int64_t tokens, const void* router_logits, const float* e_score_correction_bias,
             float* topk_weights, int* topk_ids) const override {
    check_routing_arguments(config_, tokens, router_logits, e_score_correction_bias);
    if (tokens != 0) {  // [T, K] arrays: null is fine when there are none
      check_pointer(topk_weights, "topk_weights", 4);
      check_pointer(topk_ids, "topk_ids", 4);
    }
    if (tokens == 0) return;
    StreamScope scope(device_, stream);
    auto [weights, ids] = ilu::route(config_, logits(router_logits, tokens), bias(e_score_correction_bias));
    wrap(topk_weights, {tokens, config_.topk}, at::kFloat).copy_(weights);
    wrap(topk_ids, {tokens, config_.topk}, at::kInt).copy_(ids);
  }

  void experts(void* stream, int64_t tokens, const int* topk_ids, const float* topk_weights, const LayerInputs& in,
               void* output, void*, size_t) const override {
    if (tokens != 0) {  // [T, K] arrays: null is fine when there are none
      check_pointer(topk_ids, "topk_ids", 4);
      check_pointer(topk_weights, "topk_weights", 4);
    }
    check_inputs(tokens, in, output);
    if (tokens == 0) return;
    StreamScope scope(device_, stream);
    const at::Tensor out =
        ilu::experts(config_, hidden(in, tokens), wrap(topk_ids, {tokens, config_.topk}, at::kInt),
                     wrap(topk_weights, {tokens, config_.topk}, at::kFloat), w13(in), w2(in), residual(in, tokens));
    wrap(output, {tokens, config_.hidden}, scalar_type(config_.dtype)).copy_(out);
  }

 private:
  // The JIT's checks of stages 2-6 but the workspace's, and what ixformer cannot compute, before
  // any pointer is wrapped (a w8a8 layer's weights are int8: refused here by name, as the torch op's).
  void check_inputs(int64_t tokens, const LayerInputs& in, const void* output) const {
    check_expert_arguments(config_, 0, in, output, nullptr, 0);  // the weights and scales
    check_tokens(config_, tokens);
    if (tokens != 0) {  // the per-token pointers (check_expert_arguments skips them at 0 tokens)
      check_pointer(in.hidden, "hidden", 16);
      check_pointer(output, "output", 16);
      if (in.residual) check_pointer(in.residual, "residual", 16);
    }
    const std::string missing = unsupported_capability(config_);
    TORCH_CHECK_NOT_IMPLEMENTED(missing.empty(), "moejit ilu backend (ixformer): ", missing);
  }

  at::Tensor wrap(const void* p, at::IntArrayRef shape, at::ScalarType type) const {
    return at::from_blob(const_cast<void*>(p), shape, at::TensorOptions().dtype(type).device(device_));
  }
  at::Tensor hidden(const LayerInputs& in, int64_t tokens) const {
    return wrap(in.hidden, {tokens, config_.hidden}, scalar_type(config_.dtype));
  }
  at::Tensor logits(const void* p, int64_t tokens) const {
    return wrap(p, {tokens, config_.experts}, scalar_type(config_.router_dtype));
  }
  at::Tensor w13(const LayerInputs& in) const {
    return wrap(in.w13, {config_.local_experts(), config_.gemm1_rows(), config_.hidden}, scalar_type(config_.dtype));
  }
  at::Tensor w2(const LayerInputs& in) const {
    return wrap(in.w2, {config_.local_experts(), config_.hidden, config_.local_intermediate()},
                scalar_type(config_.dtype));
  }
  std::optional<at::Tensor> bias(const float* p) const {
    if (!p || config_.topk_method != TopkMethod::NoauxTc) return std::nullopt;
    return wrap(p, {config_.experts}, at::kFloat);
  }
  std::optional<at::Tensor> residual(const LayerInputs& in, int64_t tokens) const {
    if (!in.residual) return std::nullopt;
    return wrap(in.residual, {tokens, config_.hidden}, scalar_type(config_.dtype));
  }

  MoeConfig config_;
  at::Device device_;
};

// Layer::create reaches this backend through the registry (runtime/backend_registry.h).
const bool registered = [] {
  register_layer_backend(BackendKind::Ixformer, [](const MoeConfig& config, const LayerOptions&, int ordinal) {
    return make_layer(config, at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(ordinal)));
  });
  return true;
}();

}  // namespace

std::unique_ptr<Layer> make_layer(const MoeConfig& config, const at::Device& device) {
  validate(config);
  return std::make_unique<IxformerLayer>(config, device);
}

}  // namespace moejit::ilu
