// Layer::create: the one place a layer's backend is chosen (runtime/backend_select.h) and built.
// The JIT: read the tuning store, compile (compiler/layer_compiler.h), load (jit_layer.h). Another
// backend: the factory its library registered (runtime/backend_registry.h). With an NCCL
// communicator, the layer that sums its output over it (runtime/reduced_layer.h), or, in
// all_to_all mode, the one that exchanges its tokens over it (runtime/dispatched_layer.h).
#include "runtime/layer.h"

#include <fmt/format.h>

#include "cache/kernel_cache.h"
#include "common/error.h"
#include "common/knobs.h"
#include "compiler/layer_compiler.h"
#include "compiler/tuning_store.h"
#include "runtime/backend_registry.h"
#include "runtime/backend_select.h"
#include "compiler/families/exchange.h"
#include "runtime/cuda_driver.h"
#include "runtime/dispatched_layer.h"
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
  const bool all_to_all = options.ep_mode == ExpertParallelMode::AllToAll;
  if (all_to_all && !options.nccl_comm)
    throw InvalidInput("nccl_comm: null; ep_mode all_to_all exchanges tokens over a communicator of the ep_size "
                       "ranks (give one, or use the default all_reduce mode)");
  if (!all_to_all && options.max_tokens_per_rank != 0)
    throw InvalidInput(fmt::format("max_tokens_per_rank: {}; only ep_mode all_to_all takes it (0 otherwise)",
                                   options.max_tokens_per_rank));
  return create_backend_layer(config, options);
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
    const bool all_to_all = options.nccl_comm && options.ep_mode == ExpertParallelMode::AllToAll;
    if (all_to_all)
      check_dispatch_group(config, options.nccl_comm, ordinal, options.max_tokens_per_rank);
    else if (options.nccl_comm)
      check_reduce_group(config, options.nccl_comm, ordinal);
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
      std::unique_ptr<Layer> layer = create_registered_layer(backend, config, options, ordinal);
      if (all_to_all) return dispatch_over_group(std::move(layer), options.nccl_comm, options.max_tokens_per_rank, {});
      return options.nccl_comm ? reduce_over_group(std::move(layer), options.nccl_comm) : std::move(layer);
    }
    const std::string arch = options.arch.empty() ? arch_for(info) : options.arch;
    refuse_during_capture(context);
    std::vector<TileOverride> tiles = options.tiles;
    // The tiles `moejit compile --autotune` stored for this spec and device, if any.
    if (tiles.empty() && !info.name.empty())
      if (auto tuned = load_tuning(global_cache().disk(), config, arch, info.name)) tiles = std::move(*tuned);
    CompiledLayer compiled = compile_layer(config, arch, global_cache(), {}, tiles);
    std::unique_ptr<Layer> layer = make_jit_layer(config, std::move(compiled), context, device, retained);
    retained = false;  // the layer releases the primary context now
    if (!all_to_all) return options.nccl_comm ? reduce_over_group(std::move(layer), options.nccl_comm) : std::move(layer);
    // Declared after `layer`, so that a throw unloads these before the layer releases the context.
    std::unique_ptr<ExchangeKernels> exchange =
        load_exchange_kernels(compile_plan(exchange_plan(config, arch), global_cache()), context, device);
    return dispatch_over_group(std::move(layer), options.nccl_comm, options.max_tokens_per_rank, std::move(exchange));
  } catch (...) {
    if (retained) d.primary_ctx_release(device);
    throw;
  }
}

}  // namespace
}  // namespace moejit
