// The ILU backend behind the Layer interface (backends/ixformer/ixformer_backend.h): what the C++ API,
// the C ABI and the torch ops reach through Layer::create on an Iluvatar device. Against the test
// double, on the CPU (and a CUDA device when present): raw pointers in give bitwise the adapter's
// tensors out; the shared argument checks hold; what ixformer cannot compute is refused by name; the
// backend is registered with Layer::create's registry.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <fmt/format.h>

#include "backends/ixformer/ixformer_backend.h"
#include "backends/ixformer/ixformer_layer.h"
#include "common/error.h"
#include "runtime/backend_registry.h"
#include "tests/ixformer/ixformer_double.h"
#include "tests/ixformer/problem.h"

namespace moejit::ilu_test {
namespace {

LayerInputs inputs_of(const Problem& p) {
  LayerInputs in;
  in.hidden = p.hidden.data_ptr();
  in.router_logits = p.logits.data_ptr();
  in.w13 = p.w13.data_ptr();
  in.w2 = p.w2.data_ptr();
  in.e_score_correction_bias = p.bias ? p.bias->data_ptr<float>() : nullptr;
  in.residual = p.residual ? p.residual->data_ptr() : nullptr;
  return in;
}

// forward / route / experts through the Layer against the adapter's own entry points: bitwise.
void check_entry_points(const MoeConfig& c, int64_t T, at::Device device) {
  SCOPED_TRACE(fmt::format("T = {}, device = {}", T, device.str()));
  Problem p = make_problem(c, T, 17 + T, /*residual=*/true, device);
  std::unique_ptr<Layer> layer = ilu::make_layer(c, device);
  EXPECT_EQ(layer->plan(), nullptr);
  EXPECT_EQ(layer->launches(T), 0);
  EXPECT_EQ(layer->workspace_bytes(T), 0u);
  const LayerInputs in = inputs_of(p);

  at::Tensor out = at::full_like(p.hidden, 7.0);  // poisoned: every element must be written
  layer->forward(nullptr, T, in, out.data_ptr(), nullptr, 0);
  const at::Tensor want = ilu::forward(c, p.hidden, p.logits, p.w13, p.w2, p.bias, p.residual);
  EXPECT_TRUE(at::equal(out, want));

  at::Tensor weights = at::full({T, c.topk}, -1.0f, p.logits.options().dtype(at::kFloat));
  at::Tensor ids = at::full({T, c.topk}, -1, p.logits.options().dtype(at::kInt));
  layer->route(nullptr, T, in.router_logits, in.e_score_correction_bias, weights.data_ptr<float>(),
               ids.data_ptr<int>());
  auto [want_weights, want_ids] = ilu::route(c, p.logits, p.bias);
  EXPECT_TRUE(at::equal(weights, want_weights));
  EXPECT_TRUE(at::equal(ids, want_ids));

  at::Tensor expert_out = at::full_like(p.hidden, 7.0);
  layer->experts(nullptr, T, ids.data_ptr<int>(), weights.data_ptr<float>(), in, expert_out.data_ptr(), nullptr, 0);
  EXPECT_TRUE(at::equal(expert_out, ilu::experts(c, p.hidden, ids, weights, p.w13, p.w2, p.residual)));
}

TEST(IxformerBackend, LayerInterfaceGivesTheAdaptersResults) {
  for (const at::Device& device : test_devices())
    for (const std::string preset : {"qwen3-30b-a3b", "deepseek-v3"})
      for (int64_t T : {1, 5, 33}) {
        SCOPED_TRACE(preset);
        check_entry_points(small_preset(preset, DType::BF16), T, device);
      }
}

TEST(IxformerBackend, ZeroTokensTouchNothing) {
  const MoeConfig c = small_preset("qwen3-30b-a3b", DType::BF16);
  Problem p = make_problem(c, 1, 1, false);  // one row's buffers, called with T = 0
  std::unique_ptr<Layer> layer = ilu::make_layer(c, at::Device(at::kCPU));
  ixformer_double::reset();
  at::Tensor out = at::full_like(p.hidden, 7.0);
  layer->forward(nullptr, 0, inputs_of(p), out.data_ptr(), nullptr, 0);
  EXPECT_TRUE(ixformer_double::calls().empty());
  EXPECT_TRUE(at::equal(out, at::full_like(p.hidden, 7.0)));
  // Empty tensors' data pointers are null: with no tokens only the weights must be real.
  LayerInputs empty = inputs_of(p);
  empty.hidden = empty.router_logits = empty.residual = nullptr;
  EXPECT_NO_THROW(layer->forward(nullptr, 0, empty, nullptr, nullptr, 0));
  EXPECT_NO_THROW(layer->route(nullptr, 0, nullptr, nullptr, nullptr, nullptr));
  EXPECT_NO_THROW(layer->experts(nullptr, 0, nullptr, nullptr, empty, nullptr, nullptr, 0));
  EXPECT_TRUE(ixformer_double::calls().empty());
}

TEST(IxformerBackend, SharedArgumentChecksNameTheArgument) {
  const MoeConfig c = small_preset("qwen3-30b-a3b", DType::BF16);
  Problem p = make_problem(c, 4, 3, false);
  std::unique_ptr<Layer> layer = ilu::make_layer(c, at::Device(at::kCPU));
  at::Tensor out = at::empty_like(p.hidden);
  LayerInputs in = inputs_of(p);
  in.w13 = nullptr;
  try {
    layer->forward(nullptr, 4, in, out.data_ptr(), nullptr, 0);
    FAIL() << "a null w13 was accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("w13"), std::string::npos) << e.what();
  }
  EXPECT_THROW(layer->forward(nullptr, -1, inputs_of(p), out.data_ptr(), nullptr, 0), InvalidInput);
  EXPECT_THROW(layer->workspace_bytes(-1), InvalidInput);
  EXPECT_THROW(layer->route(nullptr, 4, nullptr, nullptr, nullptr, nullptr), InvalidInput);
  // The per-token pointers are checked whenever there are tokens.
  in = inputs_of(p);
  in.hidden = nullptr;
  EXPECT_THROW(layer->forward(nullptr, 4, in, out.data_ptr(), nullptr, 0), InvalidInput);
  EXPECT_THROW(layer->forward(nullptr, 4, inputs_of(p), nullptr, nullptr, 0), InvalidInput);
}

TEST(IxformerBackend, RefusesWhatIxformerCannotComputeByName) {
  MoeConfig c = small_preset("qwen3-30b-a3b", DType::BF16);
  c.ep_size = 2;
  Problem p = make_problem(small_preset("qwen3-30b-a3b", DType::BF16), 2, 5, false);
  std::unique_ptr<Layer> layer = ilu::make_layer(c, at::Device(at::kCPU));
  at::Tensor out = at::empty_like(p.hidden);
  try {
    layer->forward(nullptr, 2, inputs_of(p), out.data_ptr(), nullptr, 0);
    FAIL() << "expert parallel was accepted";
  } catch (const c10::NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("ep_size"), std::string::npos) << e.what();
  }
  EXPECT_NE(layer->describe().find("unsupported"), std::string::npos) << layer->describe();
}

TEST(IxformerBackend, RegisteredWithLayerCreate) {
  // This binary links the backend, so Layer::create's registry has it: a usable choice reaches it
  // (a layer on the ordinal's CUDA device; making it touches no device), an unusable one names the reason.
  BackendChoice usable{BackendKind::Ixformer, "device 0 (Iluvatar BI-V150) is an Iluvatar CoreX GPU", true};
  std::unique_ptr<Layer> layer = create_registered_layer(usable, small_preset("deepseek-v3", DType::BF16), {}, 0);
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->plan(), nullptr);
  EXPECT_NE(layer->describe().find("\"backend\":\"ixformer\""), std::string::npos) << layer->describe();
  BackendChoice unusable{BackendKind::Ixformer, "forced by MOEJIT_BACKEND=ixformer; but not built", false};
  try {
    create_registered_layer(unusable, small_preset("qwen3-30b-a3b", DType::BF16), {}, 0);
    FAIL() << "an unusable backend was used";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not built"), std::string::npos) << e.what();
  }
  BackendChoice jit{BackendKind::CudaJit, "the JIT", true};
  EXPECT_THROW(create_registered_layer(jit, small_preset("qwen3-30b-a3b", DType::BF16), {}, 0), Error)
      << "the JIT is built by Layer::create itself, never registered";
}

}  // namespace
}  // namespace moejit::ilu_test
