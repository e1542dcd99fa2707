// The ILU backend as a moejit::Layer (runtime/layer.h): the same raw-pointer API as the JIT, so the
// one place a backend is chosen (Layer::create) hands it to the C++ API, the C ABI and the torch
// ops alike. A call wraps the caller's device pointers as torch tensors (no copy) on the layer's
// device, makes the caller's stream current, runs the ixformer adapter (ixformer_layer.h) and
// copies its result into the caller's output. The argument checks are the JIT's
// (runtime/layer_checks.h), except that no workspace is used (workspace_bytes() is 0): the adapter
// allocates through torch's caching allocator, and it synchronizes once per call (ixformer_layer.h).
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "runtime/layer.h"

namespace moejit::ilu {

// A layer on `device`: a CUDA-runtime device (an Iluvatar GPU), or the CPU (the contract tests, with
// the ixformer test double; the stream argument is then ignored).
std::unique_ptr<Layer> make_layer(const MoeConfig& config, const at::Device& device);

}  // namespace moejit::ilu
