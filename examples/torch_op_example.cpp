// libtorch-only: call the moejit layer operator through the dispatcher, as a C++ engine would.
// The op library registers itself when loaded; this program links it.
//
//   build/examples/moejit_torch_op_example          (CUDA when available, else the CPU kernel)
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <iostream>
#include <string>

int main() {
  // A Qwen3-MoE-shaped layer, shrunk; any moejit JSON config works (MoeConfig::to_json()).
  const std::string config =
      R"({"experts": 16, "topk": 4, "hidden": 256, "moe_intermediate": 128, "dtype": "bf16", "router_dtype": "bf16"})";
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(device);
  const int64_t tokens = 8, experts = 16, hidden = 256, inter = 128;
  torch::Tensor x = torch::randn({tokens, hidden}, bf16);
  torch::Tensor logits = torch::randn({tokens, experts}, bf16);
  torch::Tensor w13 = torch::randn({experts, 2 * inter, hidden}, bf16) / 16;
  torch::Tensor w2 = torch::randn({experts, hidden, inter}, bf16) / 11;

  // The typed handle is looked up once; calls go through the dispatcher to the CUDA or CPU kernel.
  using Optional = const std::optional<at::Tensor>&;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("moejit::moe_layer", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         Optional, Optional, Optional, Optional, Optional, Optional,
                                         const std::string&)>();
  torch::Tensor out = op.call(x, logits, w13, w2, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                              std::nullopt, std::nullopt, config);
  std::cout << "moejit::moe_layer on " << device << ": out " << out.sizes() << ", norm "
            << out.to(torch::kFloat).norm().item<float>() << "\n";
  return 0;
}
