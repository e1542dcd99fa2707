// The layer through the ILU adapter (backends/ixformer) against the float64 reference, with the
// ixformer test double standing in for the vendor library: the same checks as the JIT path's layer
// tests (routing ids exact except near ties, layer output within SPEC.md's tolerance), over the
// softmax presets (ixformer routes them), the sigmoid/grouped/biased presets (moejit's portable
// routing), the activations ixformer lacks, and what the backend refuses.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <functional>
#include <limits>

#include <fmt/format.h>

#include "backends/ixformer/ixformer_layer.h"
#include "tests/ixformer/ixformer_double.h"
#include "tests/ixformer/problem.h"

namespace moejit::ilu_test {
namespace {

const std::vector<int64_t> kTokens = {0, 1, 17, 64};

bool called(const std::string& name) {
  for (const auto& n : ixformer_double::call_names())
    if (n == name) return true;
  return false;
}

// The routing the layer used: the topk_ids the adapter handed to moe_compute_token_index_api.
at::Tensor routed_ids(int64_t T, int64_t K) {
  for (const auto& c : ixformer_double::calls())
    if (c.function == "moe_compute_token_index_api") return c.tensors.at("topk_ids").view({T, K});
  return at::empty({0, K}, at::kInt);
}

// Runs the adapter's forward on a fresh problem and checks it against the reference.
void check_layer(const MoeConfig& c, int64_t T, uint64_t seed, bool residual, at::Device device) {
  SCOPED_TRACE(fmt::format("T = {}, seed = {}, residual = {}, device = {}", T, seed, residual, device.str()));
  Problem p = make_problem(c, T, seed, residual, device);
  ixformer_double::reset();
  at::Tensor out = ilu::forward(c, p.hidden, p.logits, p.w13, p.w2, p.bias, p.residual);
  ASSERT_EQ(out.device(), device);
  ASSERT_EQ(out.scalar_type(), p.hidden.scalar_type());
  ASSERT_EQ(out.sizes(), at::IntArrayRef({T, c.hidden}));
  if (T == 0) {
    EXPECT_TRUE(ixformer_double::calls().empty()) << "no ixformer call for zero tokens";
    return;
  }
  reference::Layer ref = reference_layer(p);
  Comparison cmp = compare(p, ref, routed_ids(T, c.topk), out);
  EXPECT_TRUE(cmp.failure.empty()) << cmp.failure;
  EXPECT_GT(cmp.compared, 0);
}

struct LayerCase {
  std::string preset;
  DType dtype;
};
void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.preset << " " << to_string(c.dtype); }

std::string case_name(const testing::TestParamInfo<LayerCase>& info) {
  std::string n = fmt::format("{}_{}", info.param.preset, to_string(info.param.dtype));
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

// ---------------------------------------------------------------------------------------------
// Softmax presets: ixformer does the routing (topk_softmax) and every expert stage.
class SoftmaxPreset : public testing::TestWithParam<LayerCase> {};

TEST_P(SoftmaxPreset, MatchesReference) {
  const MoeConfig c = small_preset(GetParam().preset, GetParam().dtype);
  ASSERT_TRUE(ilu::routing_by_topk_softmax(c));
  ASSERT_EQ(ilu::unsupported_capability(c), "");
  uint64_t seed = 100;
  for (at::Device device : test_devices())
    for (int64_t T : kTokens) {
      check_layer(c, T, ++seed, /*residual=*/T % 2 == 1, device);
      if (T > 0) {
        EXPECT_TRUE(called("topk_softmax"));
        EXPECT_TRUE(called("silu_and_mul"));
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Ilu, SoftmaxPreset,
                         testing::Values(LayerCase{"mixtral-8x7b", DType::BF16}, LayerCase{"mixtral-8x7b", DType::FP16},
                                         LayerCase{"qwen3-30b-a3b", DType::BF16},
                                         LayerCase{"qwen3-30b-a3b", DType::FP16},
                                         LayerCase{"qwen3-235b-a22b", DType::BF16},
                                         LayerCase{"deepseek-v2-lite", DType::BF16},
                                         LayerCase{"deepseek-v2-lite", DType::FP16},
                                         LayerCase{"qwen3-next-80b-a3b", DType::BF16}),
                         case_name);

// ---------------------------------------------------------------------------------------------
// Sigmoid / noaux_tc / groups / route scale: moejit's portable routing, ixformer for the experts.
// With a residual, as these models add their shared experts through it.
class MoejitRoutedPreset : public testing::TestWithParam<LayerCase> {};

TEST_P(MoejitRoutedPreset, MatchesReference) {
  MoeConfig c = small_preset(GetParam().preset, GetParam().dtype);
  c.router_dtype = DType::FP32;  // as these models' gates run
  ASSERT_FALSE(ilu::routing_by_topk_softmax(c));
  uint64_t seed = 200;
  for (at::Device device : test_devices())
    for (int64_t T : kTokens) {
      for (bool residual : {true, false}) {
        check_layer(c, T, ++seed, residual, device);
        EXPECT_FALSE(called("topk_softmax")) << "ixformer's topk_softmax cannot route " << GetParam().preset;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Ilu, MoejitRoutedPreset,
                         testing::Values(LayerCase{"deepseek-v3", DType::BF16}, LayerCase{"deepseek-v3", DType::FP16},
                                         LayerCase{"kimi-k2", DType::BF16}, LayerCase{"glm-4.5-air", DType::BF16}),
                         case_name);

// A softmax config whose only difference from ixformer's routing is the route scale.
TEST(IluLayer, SoftmaxWithRouteScaleUsesMoejitRouting) {
  MoeConfig c = small_preset("qwen3-30b-a3b", DType::BF16);
  c.routed_scaling_factor = 1.5;
  ASSERT_FALSE(ilu::routing_by_topk_softmax(c));
  check_layer(c, 17, 301, /*residual=*/false, at::Device(at::kCPU));
  EXPECT_FALSE(called("topk_softmax"));
}

// Softmax with groups (group_limited_greedy): moejit's routing; with every group kept, ixformer's.
TEST(IluLayer, GroupLimitedGreedySoftmax) {
  MoeConfig c = small_preset("qwen3-30b-a3b", DType::BF16);
  c.topk_method = TopkMethod::GroupLimitedGreedy;
  c.num_expert_group = 8;
  c.topk_group = 3;
  ASSERT_FALSE(ilu::routing_by_topk_softmax(c));
  check_layer(c, 64, 302, /*residual=*/true, at::Device(at::kCPU));
  EXPECT_FALSE(called("topk_softmax"));
  c.topk_group = 8;  // no group excluded: plain softmax top-k
  ASSERT_TRUE(ilu::routing_by_topk_softmax(c));
  check_layer(c, 64, 303, /*residual=*/true, at::Device(at::kCPU));
  EXPECT_TRUE(called("topk_softmax"));
}

// ---------------------------------------------------------------------------------------------
// Activations ixformer has no kernel for run as ATen ops between the two ixformer GEMMs.
TEST(IluLayer, GeluVariantsAndNonGated) {
  struct Variant {
    Activation activation;
    bool gated;
  };
  uint64_t seed = 400;
  for (Variant v : {Variant{Activation::Gelu, true}, Variant{Activation::GeluTanh, true},
                    Variant{Activation::Silu, false}, Variant{Activation::Gelu, false},
                    Variant{Activation::SwigluOai, true}}) {
    MoeConfig c = small_preset("mixtral-8x7b", DType::BF16);
    c.activation = v.activation;
    c.gated = v.gated;
    SCOPED_TRACE(fmt::format("activation {} gated {}", to_string(v.activation), v.gated));
    check_layer(c, 17, ++seed, /*residual=*/false, at::Device(at::kCPU));
    EXPECT_FALSE(called("silu_and_mul"));
    EXPECT_EQ(ixformer_double::call_names().size(), 6u);  // routing, index, expand, gemm, gemm, reduce
  }
}

// Tensor parallel: the rank's slice of I is all the adapter sees.
TEST(IluLayer, TensorParallelSlice) {
  MoeConfig c = small_preset("mixtral-8x7b", DType::BF16, 128, 128);
  c.tp_size = 2;
  c.tp_rank = 1;
  check_layer(c, 17, 501, /*residual=*/true, at::Device(at::kCPU));
}

// fp32 router logits with a bf16 model.
TEST(IluLayer, Fp32RouterLogits) {
  MoeConfig c = small_preset("qwen3-30b-a3b", DType::BF16);
  c.router_dtype = DType::FP32;
  check_layer(c, 64, 502, /*residual=*/false, at::Device(at::kCPU));
}

// NaN / inf logits: SPEC.md's map runs before topk_softmax (the double refuses non-finite gating),
// and the moejit routing path applies the same map.
TEST(IluLayer, NonFiniteLogits) {
  for (const char* name : {"mixtral-8x7b", "deepseek-v3"}) {
    SCOPED_TRACE(name);
    MoeConfig c = small_preset(name, DType::BF16);
    c.router_dtype = DType::FP32;
    Problem p = make_problem(c, 4, 601, /*residual=*/false);
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    p.logits[0].fill_(-inf);  // all -inf: uniform scores, the K lowest ids
    p.logits[1][3].fill_(nan);
    p.logits[2][5].fill_(inf);
    p.logits[3].fill_(nan);
    at::Tensor l = p.logits.to(at::kDouble).contiguous();
    p.logits_d.assign(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
    ixformer_double::reset();
    at::Tensor out = ilu::forward(c, p.hidden, p.logits, p.w13, p.w2, p.bias, p.residual);
    EXPECT_TRUE(at::isfinite(out).all().item<bool>());
    Comparison cmp = compare(p, reference_layer(p), routed_ids(4, c.topk), out);
    EXPECT_TRUE(cmp.failure.empty()) << cmp.failure;
  }
}

// ---------------------------------------------------------------------------------------------
// Refusals: named capability, no ixformer call made.
TEST(IluLayer, RefusesWhatIxformerCannotComputeByName) {
  struct Refusal {
    std::string what;
    std::function<void(MoeConfig&)> change;
  };
  std::vector<Refusal> refusals = {
      {"w8a8_int8", [](MoeConfig& c) { c.quant = Quant::W8A8Int8; }},
      {"fp8_block", [](MoeConfig& c) { c.quant = Quant::Fp8Block; }},
      {"fp8_tensor", [](MoeConfig& c) { c.quant = Quant::Fp8Tensor; }},
      {"expert parallel", [](MoeConfig& c) { c.ep_size = 2; }},
      {"dtype fp32", [](MoeConfig& c) { c.dtype = c.router_dtype = DType::FP32; }},
      {"weight_layout kn", [](MoeConfig& c) { c.weight_layout = WeightLayout::KN; }},
      {"expert_bias", [](MoeConfig& c) { c.expert_bias = true; }},
      {"router_gemm", [](MoeConfig& c) { c.router_gemm = true; }},
      {"router_gemm", [](MoeConfig& c) { c.router_gemm = c.router_bias = true; }},  // gpt-oss's router
  };
  for (const auto& r : refusals) {
    SCOPED_TRACE(r.what);
    MoeConfig c = small_preset("mixtral-8x7b", DType::BF16);
    r.change(c);
    validate(c);
    EXPECT_NE(ilu::unsupported_capability(c).find(r.what), std::string::npos) << ilu::unsupported_capability(c);
    Problem p = make_problem(small_preset("mixtral-8x7b", DType::BF16), 3, 701, false);
    ixformer_double::reset();
    try {
      ilu::forward(c, p.hidden, p.logits, p.w13, p.w2, p.bias, p.residual);
      ADD_FAILURE() << "no error for " << r.what;
    } catch (const c10::NotImplementedError& e) {
      EXPECT_NE(std::string(e.what()).find(r.what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(ixformer_double::calls().empty());
  }
}

}  // namespace
}  // namespace moejit::ilu_test
