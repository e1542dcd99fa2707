// Layer::create: the one place a layer's backend is chosen (runtime/backend_select.h) and built.
// The JIT: read the tuning store, compile (compiler/layer_compiler.h), load (jit_layer.h). Another
// backend: the factory its library registered (runtime/backend_registry.h). With an NCCL
// communicator, the layer that sums its output over it (runtime/reduced_layer.h).
#include "runtime/layer.h"

#include <fmt/format.h>

#include "cache/kernel_cache.h"
#include "common/error.h"
#include "common/knobs.h"
#include "compiler/layer_compiler.h"
#include "compiler/tuning_store.h"
#include "runtime/backend_registry.h"
#include "runtime/backend_select.h"
#include "runtime/cuda_driver.h"
#include "runtime/jit_layer.h"
#include "runtime/loaded_layer.h"
#include "runtime/reduced_layer.h"

namespace moejit {

size_t Layer::workspace_bytes(int64_t max_tokens) const {
  check_token_count(config(), max_tokens, "max_tokens");
  return static_cast<size_t>(workspace_offsets(config(), max_tokens).total_bytes);
}

namespace {

// The device's backend layer: the JIT, or a registered one (ixformer).
std::unique_ptr<Layer> create_backend_layer(const MoeConfig& config, const LayerOptions& options);

}  // namespace

std::unique_ptr<Layer> Layer::create(const MoeConfig& config, const LayerOptions& options) {
  std::unique_ptr<Layer> layer = create_backend_layer(config, options);
  if (!options.nccl_comm) return layer;
  return reduce_over_group(std::move(layer), options.nccl_comm);
}

namespace {

std::unique_ptr<Layer> create_backend_layer(const MoeConfig& config, const LayerOptions& options) {
  validate(config);
  const CudaDriver& d = require_cuda_driver();
  CUcontext context = nullptr;
  check_cuda(d.ctx_get_current(&context), "cuCtxGetCurrent");
  CUdevice device = 0;
  int ordinal = 0;
  bool retained = false;
  if (!context || options.device >= 0) {
    ordinal = options.device >= 0 ? options.device : 0;
    int count = 0;
    check_cuda(d.device_get_count(&count), "cuDeviceGetCount");
    if (ordinal >= count)
      throw InvalidInput(fmt::format("device: {} does not exist; {} device(s) present", ordinal, count));
    check_cuda(d.device_get(&device, ordinal), "cuDeviceGet");
    check_cuda(d.primary_ctx_retain(&context, device), "cuDevicePrimaryCtxRetain");
    retained = true;
  } else {
    check_cuda(d.ctx_get_device(&device), "cuCtxGetDevice");
    ordinal = static_cast<int>(device);  // a CUdevice is its ordinal
  }
  try {
    // The communicator first: a wrong one fails before anything is compiled.
    if (options.nccl_comm) check_reduce_group(config, options.nccl_comm, ordinal);
    DeviceInfo info;
    info.ordinal = ordinal;
    char name[256] = {};
    if (d.device_get_name(name, sizeof name, device) == CUDA_SUCCESS) info.name = name;
    check_cuda(d.device_get_attribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
               "cuDeviceGetAttribute");
    check_cuda(d.device_get_attribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
               "cuDeviceGetAttribute");
    const BackendChoice backend = select_backend(info, knobs());
    if (backend.kind != BackendKind::CudaJit) {
      if (retained) d.primary_ctx_release(device);
      retained = false;
      return create_registered_layer(backend, config, options, ordinal);
    }
    const std::string arch = options.arch.empty() ? arch_for(info) : options.arch;
    refuse_during_capture(context);
    std::vector<TileOverride> tiles = options.tiles;
    // The tiles `moejit compile --autotune` stored for this spec and device, if any.
    if (tiles.empty() && !info.name.empty())
      if (auto tuned = load_tuning(global_cache().disk(), config, arch, info.name)) tiles = std::move(*tuned);
    CompiledLayer compiled = compile_layer(config, arch, global_cache(), {}, tiles);
    return make_jit_layer(config, std::move(compiled), context, device, retained);
  } catch (...) {
    if (retained) d.primary_ctx_release(device);
    throw;
  }
}

}  // namespace
}  // namespace moejit
