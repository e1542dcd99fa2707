// Backends other than the JIT register here: the library that implements one (the ixformer
// backend lives in the torch op library, since ixformer's API takes torch tensors) registers a
// factory when it is loaded, and Layer::create, the one place a backend is chosen, builds its
// layers through it. So the C++ API and the C ABI reach every backend the torch ops reach.
#pragma once

#include <memory>

#include "runtime/backend_select.h"
#include "runtime/layer.h"

namespace moejit {

// Makes a layer for `config` on device `ordinal` (the CUDA-runtime ordinal of the device).
using LayerFactory = std::unique_ptr<Layer> (*)(const MoeConfig& config, const LayerOptions& options, int ordinal);

// Registers (or replaces) the factory of `kind`. Thread-safe; typically called from a static
// initializer of the backend's library.
void register_layer_backend(BackendKind kind, LayerFactory factory);

// The layer of `choice`'s backend through its registered factory. Throws Error with the choice's
// reason when the backend is not usable in this build, or not registered in this process (naming
// the library to load).
std::unique_ptr<Layer> create_registered_layer(const BackendChoice& choice, const MoeConfig& config,
                                               const LayerOptions& options, int ordinal);

}  // namespace moejit
