// moejit's portable routing for the ILU backend (backends/ixformer/portable_routing.h: the one CPU
// routing of common/cpu_routing.h, run on the host), which the ILU backend uses wherever ixformer's
// topk_softmax cannot route as SPEC.md says, against the float64 reference on hostile inputs: ids
// exact except near ties, weights within fp32 rounding. Also its plumbing: results on the logits'
// device, bitwise the fp32 CPU routing of the same logits, and host counts that match the ids.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cfloat>
#include <limits>

#include <fmt/format.h>

#include "backends/ixformer/ixformer_layer.h"
#include "backends/ixformer/portable_routing.h"
#include "common/cpu_routing.h"
#include "tests/ixformer/problem.h"

namespace moejit::ilu_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<double> doubles(const at::Tensor& t) {
  at::Tensor d = t.to(at::kCPU).to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// Routes logits (and bias) given on the CPU with the portable routing on every test device, and
// checks each result against the float64 reference and the fp32 CPU routing. mostly_compared: more
// than half the tokens must route as the reference does (false where near ties are the point).
void check_routing(const MoeConfig& c, const at::Tensor& logits, const std::optional<at::Tensor>& bias,
                   bool mostly_compared = true) {
  const int64_t T = logits.size(0), K = c.topk, E = c.experts;
  const bool noaux = c.topk_method == TopkMethod::NoauxTc;
  reference::Routing ref = reference::route(c, T, doubles(logits), noaux ? doubles(*bias) : std::vector<double>{});

  // What the torch op's CPU kernel computes: the shared routing in fp32 on the float logits.
  at::Tensor lf = logits.to(at::kFloat).contiguous();
  at::Tensor bf = noaux ? bias->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor want_w = at::empty({T, K}, at::kFloat), want_ids = at::empty({T, K}, at::kInt);
  cpu_route_tokens<float>(routing_rule(c), T, lf.data_ptr<float>(), noaux ? bf.data_ptr<float>() : nullptr,
                          want_w.data_ptr<float>(), want_ids.data_ptr<int>());

  for (at::Device device : test_devices()) {
    SCOPED_TRACE(device.str());
    std::optional<at::Tensor> b;
    if (bias) b = bias->to(device);
    ilu::PortableRouting got = ilu::route_portable(c, logits.to(device), b);
    ASSERT_EQ(got.ids.scalar_type(), at::kInt);
    ASSERT_EQ(got.weights.scalar_type(), at::kFloat);
    ASSERT_EQ(got.ids.sizes(), at::IntArrayRef({T, K}));
    ASSERT_EQ(got.weights.sizes(), at::IntArrayRef({T, K}));
    EXPECT_EQ(got.ids.device(), device);
    EXPECT_EQ(got.weights.device(), device);
    at::Tensor ids_c = got.ids.to(at::kCPU), w_c = got.weights.to(at::kCPU);
    EXPECT_TRUE(at::equal(ids_c, want_ids)) << "ids differ from the fp32 CPU routing";
    EXPECT_TRUE(at::equal(w_c, want_w)) << "weights differ from the fp32 CPU routing";

    // Host counts: the pairs per expert, what moe_compute_token_index_api would count.
    ASSERT_TRUE(got.host_counts.device().is_cpu());
    ASSERT_EQ(got.host_counts.scalar_type(), at::kInt);
    ASSERT_EQ(got.host_counts.sizes(), at::IntArrayRef({E}));
    EXPECT_TRUE(at::equal(got.host_counts, at::bincount(ids_c.reshape({-1}).to(at::kLong), {}, E).to(at::kInt)));

    EXPECT_TRUE(at::isfinite(w_c).all().item<bool>());
    int64_t compared = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int> row(K);
      for (int64_t j = 0; j < K; ++j) row[j] = ids_c[t][j].item<int>();
      for (int64_t j = 0; j < K; ++j) {
        EXPECT_TRUE(row[j] >= 0 && row[j] < E) << "token " << t << " slot " << j << ": id " << row[j];
        for (int64_t i = 0; i < j; ++i) EXPECT_NE(row[i], row[j]) << "token " << t << ": ids not distinct";
      }
      bool same = true;
      for (int64_t j = 0; j < K; ++j) same = same && row[j] == ref.ids[t * K + j];
      if (!same) {
        EXPECT_TRUE(ref.near_tie[t]) << "token " << t << ": ids differ without a near tie";
        continue;
      }
      ++compared;
      for (int64_t j = 0; j < K; ++j)
        EXPECT_NEAR(w_c[t][j].item<double>(), ref.weights[t * K + j], 1e-5 * std::max(1.0, c.routed_scaling_factor))
            << "token " << t << " slot " << j;
    }
    if (mostly_compared) {
      EXPECT_GT(compared, T / 2);
    }
  }
}

at::Tensor random_logits(int64_t T, int64_t E, uint64_t seed, double scale = 2.0) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn({T, E}, gen, at::TensorOptions().dtype(at::kFloat)) * scale;
}

at::Tensor random_bias(int64_t E, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn({E}, gen, at::TensorOptions().dtype(at::kFloat)) * 0.05;
}

TEST(PortableRouting, SigmoidPresetsMatchReference) {
  uint64_t seed = 10;
  for (const char* name : {"deepseek-v3", "kimi-k2", "glm-4.5-air"}) {
    SCOPED_TRACE(name);
    MoeConfig c = preset(name);
    c.router_dtype = DType::FP32;
    at::Tensor bias = random_bias(c.experts, ++seed);
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
  ilu::PortableRouting r = ilu::route_portable(c, logits, bias);
  // All equal: groups 0..3 kept, experts 0..7 in order.
  EXPECT_TRUE(at::equal(r.ids[0], at::arange(8, at::kInt)));
  EXPECT_TRUE(at::allclose(r.weights[0], at::full({8}, 2.5 / 8)));
  EXPECT_TRUE(at::equal(r.host_counts, (at::arange(c.experts) < 8).to(at::kInt) * 2));
  check_routing(c, logits, bias);
  check_routing(c, random_logits(64, c.experts, 30).to(at::kBFloat16).to(at::kFloat), at::zeros({c.experts}));
  // bf16 logits as given (the routing converts them to fp32 itself).
  check_routing(c, random_logits(64, c.experts, 31).to(at::kBFloat16), random_bias(c.experts, 32));
}

TEST(PortableRouting, NonFiniteLogits) {
  for (const char* name : {"deepseek-v3", "qwen3-30b-a3b"}) {
    SCOPED_TRACE(name);
    MoeConfig c = preset(name);
    c.router_dtype = DType::FP32;
    c.routed_scaling_factor = 1.5;  // so that the softmax preset is not one topk_softmax routes
    at::Tensor logits = random_logits(8, c.experts, 40);
    logits[0].fill_(-kInf);  // all -inf: uniform scores, the K lowest ids
    logits[1].fill_(kNaN);
    logits[2][7].fill_(kInf);
    logits[3][9].fill_(kNaN);
    logits[4][0].fill_(FLT_MAX);
    logits[4][1].fill_(-FLT_MAX);
    logits[5].fill_(kInf);
    logits[6].narrow(0, 0, c.experts / 2).fill_(kInf);
    logits[7].narrow(0, 0, c.experts / 2).fill_(-kInf);
    std::optional<at::Tensor> bias;
    if (c.topk_method == TopkMethod::NoauxTc) {
      bias = at::zeros({c.experts});
      (*bias)[3].fill_(kNaN);
      (*bias)[4].fill_(kInf);
      (*bias)[5].fill_(-kInf);
      (*bias)[6].fill_(FLT_MAX);
    }
    ASSERT_FALSE(ilu::routing_by_topk_softmax(c));
    check_routing(c, logits, bias, /*mostly_compared=*/false);
  }
}

// Huge and tiny logits: softmax scores that underflow to zero or subnormals in fp32, sigmoid
// saturating at 0 and 1, and a noaux_tc bias far larger than every score.
TEST(PortableRouting, ExtremeMagnitudes) {
  uint64_t seed = 50;
  for (const char* name : {"deepseek-v3", "kimi-k2"}) {
    SCOPED_TRACE(name);
    MoeConfig c = preset(name);
    c.router_dtype = DType::FP32;
    for (double scale : {1e-7, 30.0, 120.0, 1e30}) {
      SCOPED_TRACE(fmt::format("logit scale {}", scale));
      const at::Tensor logits = random_logits(32, c.experts, ++seed, scale);
      check_routing(c, logits, random_bias(c.experts, ++seed), /*mostly_compared=*/scale > 1e-6);
    }
    const at::Tensor big_bias = random_bias(c.experts, ++seed) * 1e30;
    check_routing(c, random_logits(32, c.experts, ++seed), big_bias);
  }
  MoeConfig c = preset("qwen3-next-80b-a3b");  // softmax, 512 experts
  c.router_dtype = DType::FP32;
  c.routed_scaling_factor = 2.0;
  for (double scale : {1e-7, 60.0, 1e30}) {
    SCOPED_TRACE(fmt::format("softmax, logit scale {}", scale));
    check_routing(c, random_logits(32, c.experts, ++seed, scale), std::nullopt, /*mostly_compared=*/scale > 1e-6);
  }
}

// Zero tokens: empty results on the device, zero counts.
TEST(PortableRouting, NoTokens) {
  MoeConfig c = preset("deepseek-v3");
  c.router_dtype = DType::FP32;
  for (at::Device device : test_devices()) {
    ilu::PortableRouting r = ilu::route_portable(c, at::zeros({0, c.experts}, device), at::zeros({c.experts}, device));
    EXPECT_EQ(r.weights.sizes(), at::IntArrayRef({0, c.topk}));
    EXPECT_EQ(r.ids.device(), device);
    EXPECT_EQ(r.host_counts.sum().item<int64_t>(), 0);
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
