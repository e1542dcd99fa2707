// moejit's portable ATen routing (backends/ixformer/portable_routing.h), which the ILU backend
// uses wherever ixformer's topk_softmax cannot route as SPEC.md says, against the float64
// reference: ids exact except near ties, weights within fp32 rounding.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cfloat>
#include <limits>

#include <fmt/format.h>

#include "backends/ixformer/ixformer_layer.h"
#include "backends/ixformer/portable_routing.h"
#include "tests/ixformer/problem.h"

namespace moejit::ilu_test {
namespace {

void check_routing(const MoeConfig& c, const at::Tensor& logits, const std::optional<at::Tensor>& bias) {
  const int64_t T = logits.size(0), K = c.topk;
  at::Tensor l = logits.to(at::kDouble).contiguous();
  std::vector<double> ld(l.data_ptr<double>(), l.data_ptr<double>() + l.numel()), bd;
  if (bias) {
    at::Tensor b = bias->to(at::kDouble).contiguous();
    bd.assign(b.data_ptr<double>(), b.data_ptr<double>() + b.numel());
  }
  reference::Routing ref = reference::route(c, T, ld, bd);
  auto [weights, ids] = ilu::route_portable(c, logits, bias);
  ASSERT_EQ(ids.scalar_type(), at::kInt);
  ASSERT_EQ(weights.scalar_type(), at::kFloat);
  ASSERT_EQ(ids.sizes(), at::IntArrayRef({T, K}));
  at::Tensor ids_c = ids.to(at::kCPU), w_c = weights.to(at::kCPU).to(at::kDouble);
  int64_t compared = 0;
  for (int64_t t = 0; t < T; ++t) {
    bool same = true;
    for (int64_t j = 0; j < K; ++j) same = same && ids_c[t][j].item<int>() == ref.ids[t * K + j];
    if (!same) {
      EXPECT_TRUE(ref.near_tie[t]) << "token " << t << ": ids differ without a near tie";
      continue;
    }
    ++compared;
    for (int64_t j = 0; j < K; ++j)
      EXPECT_NEAR(w_c[t][j].item<double>(), ref.weights[t * K + j], 1e-5 * std::max(1.0, c.routed_scaling_factor))
          << "token " << t << " slot " << j;
  }
  EXPECT_GT(compared, T / 2);
}

at::Tensor random_logits(int64_t T, int64_t E, uint64_t seed, double scale = 2.0) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn({T, E}, gen, at::TensorOptions().dtype(at::kFloat)) * scale;
}

TEST(PortableRouting, SigmoidPresetsMatchReference) {
  uint64_t seed = 10;
  for (const char* name : {"deepseek-v3", "kimi-k2", "glm-4.5-air"}) {
    SCOPED_TRACE(name);
    MoeConfig c = preset(name);
    c.router_dtype = DType::FP32;
    at::Generator gen = at::detail::createCPUGenerator(++seed);
    at::Tensor bias = at::randn({c.experts}, gen, at::TensorOptions().dtype(at::kFloat)) * 0.05;
    check_routing(c, random_logits(64, c.experts, ++seed), bias);
  }
}

TEST(PortableRouting, SoftmaxVariantsMatchReference) {
  MoeConfig c = preset("qwen3-30b-a3b");
  c.router_dtype = DType::FP32;
  check_routing(c, random_logits(64, c.experts, 20), std::nullopt);  // what topk_softmax also does
  c.renormalize = false;
  c.routed_scaling_factor = 1.7;
  check_routing(c, random_logits(64, c.experts, 21), std::nullopt);
  c.topk_method = TopkMethod::GroupLimitedGreedy;
  c.num_expert_group = 8;
  c.topk_group = 2;
  check_routing(c, random_logits(64, c.experts, 22), std::nullopt);
  c.scoring = Scoring::Sigmoid;  // sigmoid without bias, grouped by max
  check_routing(c, random_logits(64, c.experts, 23), std::nullopt);
}

// bf16 logits: exact ties are common; ties go to the lower expert index (and the lower group).
TEST(PortableRouting, TiesGoToTheLowerIndex) {
  MoeConfig c = preset("deepseek-v3");
  c.router_dtype = DType::FP32;
  at::Tensor logits = at::zeros({2, c.experts});
  at::Tensor bias = at::zeros({c.experts});
  auto [weights, ids] = ilu::route_portable(c, logits, bias);
  // All equal: groups 0..3 kept, experts 0..7 in order.
  EXPECT_TRUE(at::equal(ids[0], at::arange(8, at::kInt)));
  EXPECT_TRUE(at::allclose(weights[0], at::full({8}, 2.5 / 8)));
  check_routing(c, random_logits(64, c.experts, 30).to(at::kBFloat16).to(at::kFloat), at::zeros({c.experts}));
}

TEST(PortableRouting, NonFiniteLogits) {
  for (const char* name : {"deepseek-v3", "qwen3-30b-a3b"}) {
    SCOPED_TRACE(name);
    MoeConfig c = preset(name);
    c.router_dtype = DType::FP32;
    at::Tensor logits = random_logits(6, c.experts, 40);
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    logits[0].fill_(-inf);
    logits[1].fill_(nan);
    logits[2][7].fill_(inf);
    logits[3][9].fill_(nan);
    logits[4][0].fill_(FLT_MAX);
    logits[4][1].fill_(-FLT_MAX);
    std::optional<at::Tensor> bias;
    if (c.topk_method == TopkMethod::NoauxTc) {
      bias = at::zeros({c.experts});
      (*bias)[3].fill_(nan);
      (*bias)[4].fill_(inf);
    }
    auto [weights, ids] = ilu::route_portable(c, logits, bias);
    EXPECT_TRUE(at::isfinite(weights).all().item<bool>());
    EXPECT_TRUE(((ids >= 0) & (ids < c.experts)).all().item<bool>());
    check_routing(c, logits, bias);
  }
}

// Which configs ixformer's topk_softmax routes exactly as SPEC.md says.
TEST(PortableRouting, RoutingByTopkSoftmaxRule) {
  EXPECT_TRUE(ilu::routing_by_topk_softmax(preset("mixtral-8x7b")));
  EXPECT_TRUE(ilu::routing_by_topk_softmax(preset("qwen3-30b-a3b")));
  EXPECT_TRUE(ilu::routing_by_topk_softmax(preset("qwen3-235b-a22b")));
  EXPECT_TRUE(ilu::routing_by_topk_softmax(preset("deepseek-v2-lite")));  // renormalize off: still softmax top-k
  EXPECT_TRUE(ilu::routing_by_topk_softmax(preset("qwen3-next-80b-a3b")));
  EXPECT_FALSE(ilu::routing_by_topk_softmax(preset("deepseek-v3")));  // sigmoid, bias, groups, scale 2.5
  EXPECT_FALSE(ilu::routing_by_topk_softmax(preset("kimi-k2")));      // sigmoid, bias, scale 2.827
  EXPECT_FALSE(ilu::routing_by_topk_softmax(preset("glm-4.5-air")));  // sigmoid, bias
  MoeConfig c = preset("mixtral-8x7b");
  c.routed_scaling_factor = 2.0;
  EXPECT_FALSE(ilu::routing_by_topk_softmax(c));
}

}  // namespace
}  // namespace moejit::ilu_test
