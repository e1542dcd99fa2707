// One MoE layer's packed expert tensors (checkpoint::load_experts) copied to the memory of one
// CUDA device, owned until destruction, and the LayerInputs pointers they fill: what a C++ or C
// caller needs between a checkpoint folder and Layer::forward / experts.
#pragma once
#include <cuda.h>

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/expert_tensors.h"
#include "runtime/layer.h"

namespace moejit {

class DeviceExperts {
 public:
  // Copies every tensor of `weights` to device `ordinal` (allocated in its primary context, which
  // stays retained while this lives). Throws InvalidInput for a device that does not exist, Error
  // when the driver or an allocation fails (nothing is left allocated then).
  static std::unique_ptr<DeviceExperts> upload(const checkpoint::ExpertWeights& weights, int ordinal);
  // Reads layer `layer` of the model folder's checkpoint for `config`'s rank and uploads it.
  static std::unique_ptr<DeviceExperts> load(const std::string& model_dir, int layer, const MoeConfig& config,
                                             int ordinal);
  ~DeviceExperts();
  DeviceExperts(const DeviceExperts&) = delete;
  DeviceExperts& operator=(const DeviceExperts&) = delete;

  // Sets w13, w2 and, where the layer has them, w13_scale, w2_scale, e_score_correction_bias,
  // w13_bias, w2_bias, gate_weight (router_gemm) and gate_bias (router_bias); leaves the other
  // entries (hidden, logits, residual, smoothing) alone.
  void fill(LayerInputs& inputs) const;
  int device() const { return ordinal_; }
  size_t bytes() const;  // device memory held

 private:
  struct Buffer {
    std::string name;  // "w13", "w2", "w13_scale", ... (ExpertWeights' names)
    CUdeviceptr ptr = 0;
    size_t bytes = 0;
  };
  DeviceExperts() = default;
  const void* find(const char* name) const;

  int ordinal_ = 0;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;  // the device's primary context, retained while this lives
  std::vector<Buffer> buffers_;
};

}  // namespace moejit
