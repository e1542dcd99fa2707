#include "backends/ixformer/torch_dispatch.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "runtime/backend_select.h"
#ifdef MOEJIT_IXFORMER_BUILT
#include "backends/ixformer/ixformer_layer.h"
#endif

namespace moejit::ilu {
namespace {

// Only reached after use_ixformer said yes, which it never does in a build without ixformer.
[[noreturn]] void not_built() {
  throw std::runtime_error("moejit: the ixformer backend is not in this build (MOEJIT_WITH_IXFORMER)");
}

}  // namespace

bool use_ixformer(const at::Device& device) {
  static std::mutex mutex;
  static std::map<int, BackendChoice> decided;
  std::lock_guard lock(mutex);
  auto it = decided.find(device.index());
  if (it == decided.end()) {
    // The name as the device's CUDA-compatible runtime (the one torch runs on) reports it.
    DeviceInfo info;
    info.ordinal = device.index();
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
    info.name = prop->name;
    info.cc_major = prop->major;
    info.cc_minor = prop->minor;
    it = decided.emplace(device.index(), select_backend(info, knobs())).first;
  }
  const BackendChoice& choice = it->second;
  if (choice.kind != BackendKind::Ixformer) return false;
  TORCH_CHECK(choice.usable, "moejit: ", choice.reason);
  return true;
}

#ifdef MOEJIT_IXFORMER_BUILT
at::Tensor moe_layer_op(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& logits,
                        const at::Tensor& w13, const at::Tensor& w2, const std::optional<at::Tensor>& bias,
                        const std::optional<at::Tensor>& w13_scale, const std::optional<at::Tensor>& w2_scale,
                        const std::optional<at::Tensor>& input_smooth, const std::optional<at::Tensor>& act_smooth,
                        const std::optional<at::Tensor>& residual) {
  // The scales only exist for w8a8, which forward refuses by name.
  (void)w13_scale, (void)w2_scale, (void)input_smooth, (void)act_smooth;
  return forward(c, hidden, logits, w13, w2, bias, residual);
}

std::tuple<at::Tensor, at::Tensor> route_op(const MoeConfig& c, const at::Tensor& logits,
                                            const std::optional<at::Tensor>& bias) {
  return route(c, logits, bias);
}

at::Tensor experts_op(const MoeConfig& c, const at::Tensor& hidden, const at::Tensor& topk_ids,
                      const at::Tensor& topk_weights, const at::Tensor& w13, const at::Tensor& w2,
                      const std::optional<at::Tensor>& residual) {
  return experts(c, hidden, topk_ids, topk_weights, w13, w2, residual);
}

std::string compile_summary(const MoeConfig& c) {
  nlohmann::json summary = {{"backend", "ixformer"},
                            {"kernels", 0},
                            {"routing", routing_by_topk_softmax(c) ? "ixformer topk_softmax" : "moejit aten"}};
  const std::string missing = unsupported_capability(c);
  if (!missing.empty()) summary["unsupported"] = missing;
  return summary.dump();
}
#else
at::Tensor moe_layer_op(const MoeConfig&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                        const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                        const std::optional<at::Tensor>&, const std::optional<at::Tensor>&) {
  not_built();
}
std::tuple<at::Tensor, at::Tensor> route_op(const MoeConfig&, const at::Tensor&, const std::optional<at::Tensor>&) {
  not_built();
}
at::Tensor experts_op(const MoeConfig&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const std::optional<at::Tensor>&) {
  not_built();
}
std::string compile_summary(const MoeConfig&) { not_built(); }
#endif

}  // namespace moejit::ilu
