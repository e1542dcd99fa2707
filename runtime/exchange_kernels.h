// The all_to_all exchange's kernels (templates/exchange.cuh) loaded on a device and launched on a
// stream: what runtime/dispatched_layer.h runs around its NCCL exchanges. An interface, so that the
// decorator's order of launches and exchanges is tested on a machine without a GPU
// (tests/cpu/dispatched_layer_test.cpp) with a stand-in that records the arguments.
#pragma once

#include <cstdint>
#include <memory>

#include "compiler/layer_compiler.h"
#include "runtime/cuda_driver.h"
#include "templates/args.cuh"

namespace moejit {

class ExchangeKernels {
 public:
  virtual ~ExchangeKernels() = default;
  // fp8 layers: `tokens` rows of hidden quantized as the layer's stage 3 does (none when 0).
  virtual void quantize(CUstream stream, const QuantizeArgs& args, int64_t tokens) const = 0;
  // ep_size blocks: slot_of and source from the tokens' top-k ids.
  virtual void slots(CUstream stream, const ExchangeSlotsArgs& args) const = 0;
  // ep_size * capacity rows: the send slabs.
  virtual void pack(CUstream stream, const ExchangePackArgs& args, int64_t capacity) const = 0;
  // args.tokens rows (none when 0): the output.
  virtual void combine(CUstream stream, const ExchangeCombineArgs& args) const = 0;
};

// `compiled` (exchange_plan's kernels, compile_plan) loaded into `context` on `device`; launches in
// plain stream order (no programmatic overlap: an NCCL kernel may come before or after each).
std::unique_ptr<ExchangeKernels> load_exchange_kernels(CompiledLayer compiled, CUcontext context, CUdevice device);

}  // namespace moejit
