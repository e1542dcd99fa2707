#include "runtime/loaded_layer.h"

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/layer_checks.h"

namespace moejit {
namespace {

bool capture_error(CUresult r) {
  return r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
         r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
}

}  // namespace

const char* const kCaptureMessage =
    "moejit: cannot compile or load kernels while a stream is being captured; warm up before graph "
    "capture (create the layer and run forward once before capturing)";

// NOTES: the driver lets module loading through during capture, so probe with an allocation, which
// global capture mode forbids ("potentially unsafe API call"); outside capture it is a 1-byte
// alloc and free at model load.
void refuse_during_capture(CUcontext context) {
  const CudaDriver& d = cuda_driver();
  check_cuda(d.ctx_push_current(context), "cuCtxPushCurrent");
  CUdeviceptr probe = 0;
  const CUresult r = d.mem_alloc(&probe, 1);
  if (r == CUDA_SUCCESS) d.mem_free(probe);
  CUcontext popped = nullptr;
  d.ctx_pop_current(&popped);
  if (capture_error(r)) throw Error(kCaptureMessage);
  check_cuda(r, "cuMemAlloc (capture probe)");
}

LoadedLayer::LoadedLayer(CompiledLayer compiled, CUcontext context, CUdevice device)
    : compiled_(std::move(compiled)), device_(device) {
  std::lock_guard lock(mutex_);
  load_locked(context);
}

LoadedLayer::~LoadedLayer() {
  const CudaDriver& d = cuda_driver();
  // Unload errors are ignored: at process exit the context may already be gone.
  for (auto& loaded : contexts_)
    for (CUmodule m : loaded.modules) d.module_unload(m);
}

const std::vector<CUfunction>& LoadedLayer::functions_for(CUstream stream) const {
  const CudaDriver& d = cuda_driver();
  CUcontext context = nullptr;
  if (stream) {
    check_cuda(d.stream_get_ctx(stream, &context), "cuStreamGetCtx");
  } else {
    check_cuda(d.ctx_get_current(&context), "cuCtxGetCurrent");
  }
  std::lock_guard lock(mutex_);
  for (const auto& loaded : contexts_)
    if (loaded.context == context) return loaded.functions;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check_cuda(d.stream_is_capturing(stream, &capture), "cuStreamIsCapturing");
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE)
    throw Error("moejit: this layer's kernels are not loaded in the captured stream's context, and loading "
                "during stream capture is not allowed; warm up before graph capture (run forward once "
                "eagerly on this context first)");
  load_locked(context);
  return contexts_.back().functions;
}

// Loads every unit's CUBIN into `context` (made current for the duration).
void LoadedLayer::load_locked(CUcontext context) const {
  const CudaDriver& d = cuda_driver();
  const Plan& p = plan();
  check_cuda(d.ctx_push_current(context), "cuCtxPushCurrent");
  // Once per context: a context of another device is refused before anything is loaded there.
  CUdevice on = 0;
  const CUresult got = d.ctx_get_device(&on);
  if (got != CUDA_SUCCESS || on != device_) {
    CUcontext popped = nullptr;
    d.ctx_pop_current(&popped);
    check_cuda(got, "cuCtxGetDevice");
    check_call_device(static_cast<int>(device_), static_cast<int>(on));
  }
  InContext loaded;
  loaded.context = context;
  loaded.functions.assign(p.kernels.size(), nullptr);
  try {
    for (const auto& unit : compiled_.units) {
      CUmodule module = nullptr;
      CUresult r = d.module_load_data(&module, unit.binary->cubin.data());
      if (capture_error(r)) throw Error(kCaptureMessage);
      check_cuda(r, fmt::format("loading unit '{}'", unit.unit).c_str());
      loaded.modules.push_back(module);
      for (const auto& entry : unit.binary->kernel_names) {
        for (size_t i = 0; i < p.kernels.size(); ++i) {
          if (p.kernels[i].entry != entry) continue;
          check_cuda(d.module_get_function(&loaded.functions[i], module, entry.c_str()), entry.c_str());
          // Above 48 KiB, dynamic shared memory must be opted into per function.
          const int shared = p.kernels[i].launch.shared_bytes;
          if (shared > 48 * 1024)
            check_cuda(d.func_set_attribute(loaded.functions[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            shared),
                       entry.c_str());
        }
      }
    }
    for (size_t i = 0; i < loaded.functions.size(); ++i)
      if (!loaded.functions[i])
        throw Error(fmt::format("moejit internal error: kernel {} is in no loaded unit", p.kernels[i].entry));
  } catch (...) {
    for (CUmodule m : loaded.modules) d.module_unload(m);
    CUcontext popped = nullptr;
    d.ctx_pop_current(&popped);
    throw;
  }
  CUcontext popped = nullptr;
  d.ctx_pop_current(&popped);
  contexts_.push_back(std::move(loaded));
}

}  // namespace moejit
