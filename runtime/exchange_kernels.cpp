#include "runtime/exchange_kernels.h"

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/families/exchange.h"
#include "runtime/kernel_launch.h"
#include "runtime/loaded_layer.h"

namespace moejit {
namespace {

class JitExchangeKernels final : public ExchangeKernels {
 public:
  JitExchangeKernels(CompiledLayer compiled, CUcontext context, CUdevice device)
      : loaded_(std::move(compiled), context, device) {}

  void quantize(CUstream stream, const QuantizeArgs& args, int64_t tokens) const override {
    if (tokens > 0) launch(stream, KernelRole::QuantizeExpand, &args, 0, tokens);
  }
  void slots(CUstream stream, const ExchangeSlotsArgs& args) const override {
    launch(stream, KernelRole::ExchangeSlots, &args, 0, args.tokens);
  }
  void pack(CUstream stream, const ExchangePackArgs& args, int64_t capacity) const override {
    launch(stream, KernelRole::ExchangePack, &args, capacity, 0);
  }
  void combine(CUstream stream, const ExchangeCombineArgs& args) const override {
    if (args.tokens > 0) launch(stream, KernelRole::ExchangeCombine, &args, args.capacity, args.tokens);
  }

 private:
  void launch(CUstream stream, KernelRole role, const void* args, int64_t capacity, int64_t tokens) const {
    const Plan& plan = loaded_.plan();
    const int index = plan.kernel_index(role);
    if (index < 0) throw Error(fmt::format("moejit internal error: the exchange has no {} kernel", to_string(role)));
    const KernelPlan& k = plan.kernels[static_cast<size_t>(index)];
    const CUfunction function = loaded_.functions_for(stream)[static_cast<size_t>(index)];
    launch_planned(function, k, exchange_grid(k, plan.spec.ep_size, capacity, tokens), args, stream, false);
  }

  LoadedLayer loaded_;
};

}  // namespace

std::unique_ptr<ExchangeKernels> load_exchange_kernels(CompiledLayer compiled, CUcontext context, CUdevice device) {
  return std::make_unique<JitExchangeKernels>(std::move(compiled), context, device);
}

}  // namespace moejit
