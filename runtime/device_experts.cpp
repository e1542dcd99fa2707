#include "runtime/device_experts.h"

#include <algorithm>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "runtime/cuda_driver.h"

namespace moejit {
namespace {

// The primary context of `device` current for the scope (retained by the caller).
class CurrentContext {
 public:
  explicit CurrentContext(CUcontext context) {
    check_cuda(cuda_driver().ctx_push_current(context), "cuCtxPushCurrent");
  }
  ~CurrentContext() {
    CUcontext popped = nullptr;
    cuda_driver().ctx_pop_current(&popped);
  }
  CurrentContext(const CurrentContext&) = delete;
  CurrentContext& operator=(const CurrentContext&) = delete;
};

}  // namespace

std::unique_ptr<DeviceExperts> DeviceExperts::upload(const checkpoint::ExpertWeights& w, int ordinal) {
  const CudaDriver& d = require_cuda_driver();
  int count = 0;
  check_cuda(d.device_get_count(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count)
    throw InvalidInput(fmt::format("device: {} does not exist; this machine has CUDA devices 0..{}", ordinal, count - 1));
  std::unique_ptr<DeviceExperts> out(new DeviceExperts());
  out->ordinal_ = ordinal;
  check_cuda(d.device_get(&out->device_, ordinal), "cuDeviceGet");
  check_cuda(d.primary_ctx_retain(&out->context_, out->device_), "cuDevicePrimaryCtxRetain");
  // From here the destructor frees what was allocated and releases the context.
  const CurrentContext current(out->context_);
  for (const auto& [name, t] : w.named()) {
    Buffer b{name, 0, t->bytes.size()};
    check_cuda(d.mem_alloc(&b.ptr, std::max<size_t>(b.bytes, 1)),
               fmt::format("cuMemAlloc of {} ({} bytes) on device {}", name, b.bytes, ordinal).c_str());
    out->buffers_.push_back(b);
    // Synchronous from pageable host memory: the tensor is in place when this returns.
    if (b.bytes) check_cuda(d.memcpy_htod(b.ptr, t->bytes.data(), b.bytes), fmt::format("cuMemcpyHtoD of {}", name).c_str());
  }
  return out;
}

std::unique_ptr<DeviceExperts> DeviceExperts::load(const std::string& model_dir, int layer, const MoeConfig& config,
                                                   int ordinal) {
  validate(config);
  const checkpoint::Checkpoint ckpt = checkpoint::Checkpoint::open(model_dir);
  for (const auto& found : checkpoint::find_moe_layers(ckpt))
    if (found.layer == layer) return upload(checkpoint::load_experts(ckpt, config, found), ordinal);
  throw InvalidInput(fmt::format("checkpoint '{}': layer {} has no expert tensors", model_dir, layer));
}

DeviceExperts::~DeviceExperts() {
  if (!context_) return;
  const CudaDriver& d = cuda_driver();
  if (d.ctx_push_current(context_) == CUDA_SUCCESS) {
    for (const Buffer& b : buffers_) d.mem_free(b.ptr);
    CUcontext popped = nullptr;
    d.ctx_pop_current(&popped);
  }
  d.primary_ctx_release(device_);
}

const void* DeviceExperts::find(const char* name) const {
  for (const Buffer& b : buffers_)
    if (b.name == name) return reinterpret_cast<const void*>(b.ptr);
  return nullptr;
}

void DeviceExperts::fill(LayerInputs& in) const {
  in.w13 = find("w13");
  in.w2 = find("w2");
  auto floats = [&](const char* name) { return static_cast<const float*>(find(name)); };
  if (find("w13_scale")) in.w13_scale = floats("w13_scale");
  if (find("w2_scale")) in.w2_scale = floats("w2_scale");
  if (find("e_score_correction_bias")) in.e_score_correction_bias = floats("e_score_correction_bias");
  if (find("w13_bias")) in.w13_bias = floats("w13_bias");
  if (find("w2_bias")) in.w2_bias = floats("w2_bias");
  if (find("gate_weight")) in.gate_weight = find("gate_weight");
  if (find("gate_bias")) in.gate_bias = find("gate_bias");
}

size_t DeviceExperts::bytes() const {
  size_t total = 0;
  for (const Buffer& b : buffers_) total += b.bytes;
  return total;
}

}  // namespace moejit
