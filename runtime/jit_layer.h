// The JIT backend's layer: a compiled layer loaded onto a device (LoadedLayer), run by the plan's
// call schedule (plan_call): each step's arguments are packed by its kernel family (pack_args),
// then launched with cuLaunchKernelEx on the caller's stream. forward() checks its arguments,
// encodes the wgmma GEMMs' weight tensor maps on the host, and launches: no allocation, no
// synchronization, no compilation.
#pragma once

#include <memory>

#include "compiler/layer_compiler.h"
#include "runtime/cuda_driver.h"
#include "runtime/layer.h"

namespace moejit {

// Loads `compiled` (the config's spec) into `context` on `device`. With `retained_primary` the
// layer releases the device's primary context when destroyed.
std::unique_ptr<Layer> make_jit_layer(const MoeConfig& config, CompiledLayer compiled, CUcontext context,
                                      CUdevice device, bool retained_primary);

}  // namespace moejit
