// SPEC.md stage 1 (routing) for the ILU backend, wherever ixformer's topk_softmax cannot route as
// SPEC.md says: sigmoid scoring, expert groups, the noaux_tc correction bias, a route scale other
// than 1. It runs moejit's one CPU routing (common/cpu_routing.h, fp32: the same code and results
// as the torch op's CPU kernel) on the host: the logits (and the bias) are copied to the host once,
// routed there, and the weights and ids copied to the logits' device.
//
// Synchronization: copying the logits to the host waits for the logits' stream (nothing, for CPU
// tensors). That is the one host synchronization of an ILU layer call on this path: since the host
// then holds the ids, it also counts the pairs per expert that ixformer's group GEMM wants as a
// host tensor (ixformer_layer.h), so the device counts need not be copied back. The bias is copied
// without a wait of its own (ordered before the logits' copy on the same stream); the weights and
// ids go to the device from pinned host memory without waiting.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "compiler/moe_config.h"

namespace moejit::ilu {

struct PortableRouting {
  at::Tensor weights;      // [T, K] fp32 on the logits' device
  at::Tensor ids;          // [T, K] int32 on the logits' device
  at::Tensor host_counts;  // [E] int32 on the host: how many of the T*K (token, slot) pairs chose each expert
};

// logits [T, E] (any float dtype, on any device); bias [E] fp32, required for noaux_tc and ignored
// otherwise (on the logits' device or the host).
PortableRouting route_portable(const MoeConfig& config, const at::Tensor& logits,
                               const std::optional<at::Tensor>& bias);

}  // namespace moejit::ilu
