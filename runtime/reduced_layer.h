// The all_reduce mode of expert parallel for the C++ API and the C ABI (LayerOptions::nccl_comm):
// a layer whose forward() and experts() end with the sum of their output over the caller's NCCL
// communicator, in place, on the caller's stream (graph capturable, as NCCL's collectives are). Each
// rank computes its own experts (ep_rank) and slice of I (tp_rank); the residual is added on the
// communicator's rank 0 only, so that the sum counts it once. The communicator stays the caller's:
// moejit neither creates nor destroys one, and it must outlive the layer.
#pragma once

#include <memory>

#include "runtime/layer.h"

namespace moejit {

// Throws InvalidInput when the communicator does not fit: ncclCommCount must be ep_size * tp_size
// (every (ep_rank, tp_rank) once: its order is the caller's, and not checked) and ncclCommCuDevice
// the layer's device `ordinal`. Loads NCCL (nccl.h; Error when it cannot).
void check_reduce_group(const MoeConfig& config, void* nccl_comm, int ordinal);

// `layer` with its output summed over `nccl_comm` (checked by check_reduce_group).
std::unique_ptr<Layer> reduce_over_group(std::unique_ptr<Layer> layer, void* nccl_comm);

}  // namespace moejit
