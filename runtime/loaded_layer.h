// The load step: a compiled layer's binaries put on a device. Modules are loaded per CUDA context,
// on first use in that context, and never while a stream is being captured (a graph must not
// contain a module load; the caller warms up first).
#pragma once

#include <deque>
#include <mutex>
#include <vector>

#include "compiler/layer_compiler.h"
#include "runtime/cuda_driver.h"

namespace moejit {

class LoadedLayer {
 public:
  // Loads every unit into `context` now (Layer::create's context, on `device`).
  LoadedLayer(CompiledLayer compiled, CUcontext context, CUdevice device);
  ~LoadedLayer();
  LoadedLayer(const LoadedLayer&) = delete;
  LoadedLayer& operator=(const LoadedLayer&) = delete;

  const CompiledLayer& compiled() const { return compiled_; }
  const Plan& plan() const { return compiled_.plan; }

  // The functions (by plan kernel index) of the stream's context (null stream: the current
  // context), loading the modules there on first use. Throws Error when that first use happens
  // during stream capture, InvalidInput when that context is on another device than the layer's
  // (check_call_device). The reference stays valid for the LoadedLayer's life.
  const std::vector<CUfunction>& functions_for(CUstream stream) const;

 private:
  // The modules of one layer loaded in one context.
  struct InContext {
    CUcontext context = nullptr;
    std::vector<CUmodule> modules;
    std::vector<CUfunction> functions;  // by plan kernel index
  };
  void load_locked(CUcontext context) const;

  CompiledLayer compiled_;
  CUdevice device_;
  mutable std::mutex mutex_;
  // A deque: a call keeps a reference to its context's functions while another thread may load a
  // new context, and push_back on a deque never moves the existing elements.
  mutable std::deque<InContext> contexts_;
};

// The message of every refusal to compile or load during stream capture.
extern const char* const kCaptureMessage;

// Refuses to go on (Error, kCaptureMessage) while this thread is inside a global-mode stream
// capture on `context`.
void refuse_during_capture(CUcontext context);

}  // namespace moejit
