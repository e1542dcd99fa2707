#include "backends/ixformer/portable_routing.h"

#include <c10/util/Exception.h>

#include "common/cpu_routing.h"

namespace moejit::ilu {

PortableRouting route_portable(const MoeConfig& c, const at::Tensor& logits, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(logits.dim() == 2 && logits.size(1) == c.experts, "moejit ilu routing: router_logits must be [T, ",
                    c.experts, "], got ", logits.sizes());
  const int64_t T = logits.size(0), E = c.experts, K = c.topk;
  const at::Device device = logits.device();
  const bool noaux = c.topk_method == TopkMethod::NoauxTc;

  // To the host. The bias first, without waiting (into pinned memory) when it is on the logits'
  // device: the logits' copy below is queued after it on the same stream and waits for the stream.
  at::Tensor host_bias;
  if (noaux) {
    TORCH_CHECK_VALUE(bias.has_value() && bias->numel() == E, "moejit ilu routing: e_score_correction_bias [", E,
                      "] is required for topk_method noaux_tc");
    const bool queued = bias->device() == device && !device.is_cpu();
    host_bias = bias->to(at::kFloat).contiguous().to(at::kCPU, /*non_blocking=*/queued);
  }
  at::Tensor host_logits = logits.to(at::kCPU).to(at::kFloat).contiguous();  // the one wait

  // Route on the host into pinned memory (when the result goes to a device), and count the pairs
  // per expert from the ids there.
  const at::TensorOptions host = at::TensorOptions().device(at::kCPU).pinned_memory(!device.is_cpu());
  at::Tensor weights = at::empty({T, K}, host.dtype(at::kFloat));
  at::Tensor ids = at::empty({T, K}, host.dtype(at::kInt));
  cpu_route_tokens<float>(routing_rule(c), T, host_logits.data_ptr<float>(),
                          noaux ? host_bias.data_ptr<float>() : nullptr, weights.data_ptr<float>(),
                          ids.data_ptr<int>());
  at::Tensor counts = at::zeros({E}, at::TensorOptions().dtype(at::kInt));
  int* count = counts.data_ptr<int>();
  const int* id = ids.data_ptr<int>();
  for (int64_t f = 0; f < T * K; ++f) ++count[id[f]];

  // To the logits' device, without waiting (a no-op for CPU tensors).
  return {weights.to(device, /*non_blocking=*/true), ids.to(device, /*non_blocking=*/true), counts};
}

}  // namespace moejit::ilu
