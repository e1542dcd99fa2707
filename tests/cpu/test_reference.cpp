// The float64 CPU reference (tests/reference) against hand-computed values from SPEC.md.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "common/cpu_routing.h"
#include "common/fp8.h"
#include "tests/reference/reference.h"

namespace moejit::reference {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sig(x); }

MoeConfig small_config(int experts, int topk) {
  MoeConfig c;
  c.experts = experts;
  c.topk = topk;
  c.hidden = 4;
  c.moe_intermediate = 2;
  return c;
}

void expect_valid_row(const Routing& r, int64_t t, int K, int E) {
  std::set<int> seen;
  for (int j = 0; j < K; ++j) {
    int id = r.ids[t * K + j];
    EXPECT_GE(id, 0);
    EXPECT_LT(id, E);
    seen.insert(id);
    EXPECT_TRUE(std::isfinite(r.weights[t * K + j])) << "t " << t << " j " << j;
  }
  EXPECT_EQ(static_cast<int>(seen.size()), K) << "ids of token " << t << " are not distinct";
}

// ---------------------------------------------------------------- routing

TEST(ReferenceRoute, SoftmaxTop2KnownWeights) {
  MoeConfig c = small_config(4, 2);
  c.renormalize = false;
  std::vector<double> logits = {1, 3, 2, 0};
  Routing r = route(c, 1, logits, {});
  const double S = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(0.0);
  ASSERT_EQ(r.ids, (std::vector<int>{1, 2}));
  EXPECT_NEAR(r.weights[0], std::exp(3.0) / S, 1e-15);
  EXPECT_NEAR(r.weights[1], std::exp(2.0) / S, 1e-15);
  EXPECT_FALSE(r.near_tie[0]);

  c.renormalize = true;
  c.routed_scaling_factor = 2.0;
  r = route(c, 1, logits, {});
  ASSERT_EQ(r.ids, (std::vector<int>{1, 2}));
  EXPECT_NEAR(r.weights[0], 2.0 * std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-15);
  EXPECT_NEAR(r.weights[1], 2.0 * std::exp(2.0) / (std::exp(3.0) + std::exp(2.0)), 1e-15);
}

TEST(ReferenceRoute, SoftmaxIsShiftInvariantForHugeLogits) {
  MoeConfig c = small_config(3, 1);
  c.renormalize = false;
  Routing r = route(c, 1, {1e30, 1e30 - 1e15, 0}, {});  // naive exp would overflow
  EXPECT_EQ(r.ids[0], 0);
  EXPECT_NEAR(r.weights[0], 1.0, 1e-15);
}

// DeepSeek-V3 style: sigmoid, noaux_tc, 4 groups of 2, keep 2 groups, top-2, renormalize, scale 2.5.
TEST(ReferenceRoute, SigmoidBiasGroupsDeepSeekStyle) {
  MoeConfig c = small_config(8, 2);
  c.scoring = Scoring::Sigmoid;
  c.topk_method = TopkMethod::NoauxTc;
  c.num_expert_group = 4;
  c.topk_group = 2;
  c.renormalize = true;
  c.routed_scaling_factor = 2.5;
  std::vector<double> logits = {3, -3, 1, 0.5, 0, -0.2, -1, -1};
  std::vector<double> bias = {0, 0, 0, 0, 0.4, 0.4, 0, 0.1};
  // q = [.9526 .0474 | .7311 .6225 | .9 .8502 | .2689 .3689]; group scores (sum of top 2):
  // g0 1.0, g1 1.3535, g2 1.7502, g3 .6379 -> keep g2, g1. Best allowed q: 4 (.9), 5 (.8502).
  // Without bias/groups the choice would be experts 0 and 2.
  Routing r = route(c, 1, logits, bias);
  ASSERT_EQ(r.ids, (std::vector<int>{4, 5}));
  const double p4 = sig(0.0), p5 = sig(-0.2);  // unbiased scores
  EXPECT_NEAR(r.weights[0], 2.5 * p4 / (p4 + p5), 1e-14);
  EXPECT_NEAR(r.weights[1], 2.5 * p5 / (p4 + p5), 1e-14);
  EXPECT_FALSE(r.near_tie[0]);

  // The same row without bias: groups g0 (1.0) and g1 (1.3535) win; experts 0 and 2.
  r = route(c, 1, logits, std::vector<double>(8, 0.0));
  ASSERT_EQ(r.ids, (std::vector<int>{0, 2}));
  EXPECT_NEAR(r.weights[0], 2.5 * sig(3) / (sig(3) + sig(1)), 1e-14);

  // Without groups, expert 0 (q .9526, in the dropped group g0) would be chosen first.
  MoeConfig flat = c;
  flat.num_expert_group = 1;
  flat.topk_group = 1;
  r = route(flat, 1, logits, bias);
  EXPECT_EQ(r.ids, (std::vector<int>{0, 4}));
}

TEST(ReferenceRoute, GroupScoreSumOfTwoForNoauxMaxOtherwise) {
  MoeConfig c = small_config(4, 1);
  c.scoring = Scoring::Sigmoid;
  c.num_expert_group = 2;
  c.topk_group = 1;
  c.renormalize = false;
  std::vector<double> logits = {2, -5, 1, 0.9};
  // Group 0 has the single best expert; group 1 has the best pair.
  c.topk_method = TopkMethod::GroupLimitedGreedy;
  Routing r = route(c, 1, logits, {});
  EXPECT_EQ(r.ids[0], 0);
  EXPECT_NEAR(r.weights[0], sig(2), 1e-15);
  c.topk_method = TopkMethod::NoauxTc;
  r = route(c, 1, logits, std::vector<double>(4, 0.0));
  EXPECT_EQ(r.ids[0], 2);
  EXPECT_NEAR(r.weights[0], sig(1), 1e-15);
}

TEST(ReferenceRoute, TiesGoToTheLowerIndex) {
  MoeConfig c = small_config(4, 2);
  Routing r = route(c, 1, {1, 2, 2, 2}, {});
  EXPECT_EQ(r.ids, (std::vector<int>{1, 2}));
  EXPECT_TRUE(r.near_tie[0]);

  MoeConfig c3 = small_config(4, 3);
  r = route(c3, 1, {5, 0, 5, 5}, {});
  EXPECT_EQ(r.ids, (std::vector<int>{0, 2, 3}));

  // Groups tie too: both groups score 0.5 -> group 0.
  MoeConfig g = small_config(4, 1);
  g.scoring = Scoring::Sigmoid;
  g.topk_method = TopkMethod::GroupLimitedGreedy;
  g.num_expert_group = 2;
  g.topk_group = 1;
  r = route(g, 1, {-1, 0, 0, -1}, {});
  EXPECT_EQ(r.ids[0], 1);
  EXPECT_TRUE(r.near_tie[0]);
}

TEST(ReferenceRoute, NonFiniteLogitsGiveFiniteWeightsAndDistinctIds) {
  MoeConfig c = small_config(6, 3);
  std::vector<double> logits = {kNaN, kInf, -kInf, 1, kInf, 0};
  // Softmax of [-F, F, -F, 1, F, 0]: p = [0, .5, 0, 0, .5, 0]; the zeros tie -> lowest index 0.
  Routing r = route(c, 1, logits, {});
  expect_valid_row(r, 0, 3, 6);
  EXPECT_EQ(r.ids, (std::vector<int>{1, 4, 0}));
  EXPECT_DOUBLE_EQ(r.weights[0], 0.5);
  EXPECT_DOUBLE_EQ(r.weights[1], 0.5);
  EXPECT_DOUBLE_EQ(r.weights[2], 0.0);
  EXPECT_TRUE(r.near_tie[0]);

  // Sigmoid: p = [0, 1, 0, sig(1), 1, 0.5].
  c.scoring = Scoring::Sigmoid;
  c.renormalize = false;
  r = route(c, 1, logits, {});
  expect_valid_row(r, 0, 3, 6);
  EXPECT_EQ(r.ids, (std::vector<int>{1, 4, 3}));
  EXPECT_DOUBLE_EQ(r.weights[0], 1.0);
  EXPECT_NEAR(r.weights[2], sig(1), 1e-15);

  // A NaN bias excludes its expert (it becomes -FLT_MAX); +inf bias makes one win.
  MoeConfig b = small_config(4, 1);
  b.scoring = Scoring::Sigmoid;
  b.topk_method = TopkMethod::NoauxTc;
  b.renormalize = false;
  r = route(b, 1, {5, 0, 0, 0}, {kNaN, 0, 0, 0});
  EXPECT_EQ(r.ids[0], 1);
  EXPECT_DOUBLE_EQ(r.weights[0], 0.5);
  r = route(b, 1, {5, 0, 0, 0}, {0, 0, kInf, 0});
  EXPECT_EQ(r.ids[0], 2);
  EXPECT_DOUBLE_EQ(r.weights[0], 0.5);

  // Every combination of special values, many rows: always valid.
  MoeConfig big = small_config(8, 4);
  std::vector<double> specials = {kNaN, kInf, -kInf, 0, 1e30, -1e30, FLT_MAX, -FLT_MAX};
  std::vector<double> rows;
  std::mt19937 rng(7);
  const int T = 200;
  for (int i = 0; i < T * 8; ++i) rows.push_back(specials[rng() % specials.size()]);
  for (Scoring s : {Scoring::Softmax, Scoring::Sigmoid}) {
    big.scoring = s;
    r = route(big, T, rows, {});
    for (int t = 0; t < T; ++t) expect_valid_row(r, t, 4, 8);
  }
}

TEST(ReferenceRoute, AllMinusInfRowIsUniformWithTheLowestIds) {
  MoeConfig c = small_config(5, 2);
  c.renormalize = false;
  Routing r = route(c, 1, std::vector<double>(5, -kInf), {});
  EXPECT_EQ(r.ids, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(r.weights[0], 0.2);
  EXPECT_DOUBLE_EQ(r.weights[1], 0.2);
  EXPECT_TRUE(r.near_tie[0]);
  c.renormalize = true;
  r = route(c, 1, std::vector<double>(5, -kInf), {});
  EXPECT_EQ(r.ids, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(r.weights[0], 0.5);
  EXPECT_DOUBLE_EQ(r.weights[1], 0.5);
}

TEST(ReferenceRoute, RenormalizeWithZeroSumLeavesWeights) {
  MoeConfig c = small_config(4, 2);
  c.scoring = Scoring::Sigmoid;  // sigmoid(-FLT_MAX) = 0
  c.renormalize = true;
  c.routed_scaling_factor = 2.0;
  Routing r = route(c, 1, {-kInf, -kInf, -kInf, -kInf}, {});
  EXPECT_EQ(r.ids, (std::vector<int>{0, 1}));
  EXPECT_EQ(r.weights[0], 0.0);
  EXPECT_EQ(r.weights[1], 0.0);
}

TEST(ReferenceRoute, NearTieOnlyForCloseScores) {
  MoeConfig c = small_config(4, 1);
  c.renormalize = false;
  // Exact tie between the chosen expert and the runner-up.
  Routing r = route(c, 3, {0, 1, 1, 0,     //
                           0, 1, 1 - 1e-9, 0,  // within 1e-6 relative
                           0, 1, 0.5, 0},  // clearly separated
                    {});
  EXPECT_TRUE(r.near_tie[0]);
  EXPECT_EQ(r.ids[0], 1);
  EXPECT_TRUE(r.near_tie[1]);
  EXPECT_EQ(r.ids[1], 1);
  EXPECT_FALSE(r.near_tie[2]);
  // A tie below the K boundary, between two unchosen experts, does not count...
  r = route(c, 1, {0, 3, 1, 1}, {});
  EXPECT_FALSE(r.near_tie[0]);
  // ...but a tie inside the chosen K does (it decides the output order).
  MoeConfig c2 = small_config(4, 2);
  r = route(c2, 1, {2, 2, 0, -1}, {});
  EXPECT_EQ(r.ids, (std::vector<int>{0, 1}));
  EXPECT_TRUE(r.near_tie[0]);
}

// The reference routes with common/cpu_routing.h in double; the torch op's CPU kernel and the ILU
// portable routing use the same template in float.
TEST(ReferenceRoute, SharedCpuRoutingInDoubleAndFloat) {
  // Sigmoid in the fp32 implementations' form 1 / (1 + exp(-x)): exactly 0 in double once exp(-x)
  // overflows (x below about -709), so the renormalized weights are 1 and 0.
  MoeConfig s = small_config(4, 2);
  s.scoring = Scoring::Sigmoid;
  Routing r = route(s, 1, {-720, -730, 0, -740}, {});
  EXPECT_EQ(r.ids, (std::vector<int>{2, 0}));
  EXPECT_EQ(r.weights[0], 1.0);
  EXPECT_EQ(r.weights[1], 0.0);
  EXPECT_TRUE(r.near_tie[0]);  // the unchosen experts 0, 1, 3 all score 0

  // The DeepSeek-V3-style row of SigmoidBiasGroupsDeepSeekStyle in float: the same ids, the
  // weights within fp32 rounding, and the near-tie flag written only when asked for.
  MoeConfig c = small_config(8, 2);
  c.scoring = Scoring::Sigmoid;
  c.topk_method = TopkMethod::NoauxTc;
  c.num_expert_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5;
  const std::vector<double> logits = {3, -3, 1, 0.5, 0, -0.2, -1, -1}, bias = {0, 0, 0, 0, 0.4, 0.4, 0, 0.1};
  r = route(c, 1, logits, bias);
  const std::vector<float> logits_f(logits.begin(), logits.end()), bias_f(bias.begin(), bias.end());
  float w[2];
  int ids[2];
  cpu_route_tokens<float>(routing_rule(c), 1, logits_f.data(), bias_f.data(), w, ids);
  EXPECT_EQ(std::vector<int>(ids, ids + 2), r.ids);
  EXPECT_NEAR(w[0], r.weights[0], 1e-6);
  EXPECT_NEAR(w[1], r.weights[1], 1e-6);
  bool tie = true;
  cpu_route_tokens<float>(routing_rule(c), 1, logits_f.data(), bias_f.data(), w, ids, &tie);
  EXPECT_FALSE(tie);
  const std::vector<float> tied = {0, 0, 0, 0, 0, 0, 0, 0};  // every score 0.5 + bias: 4, 5 tie
  cpu_route_tokens<float>(routing_rule(c), 1, tied.data(), bias_f.data(), w, ids, &tie);
  EXPECT_EQ(std::vector<int>(ids, ids + 2), (std::vector<int>{4, 5}));
  EXPECT_TRUE(tie);
}

// ---------------------------------------------------------------- index

TEST(ReferenceIndex, StableCountingSortAndEpRange) {
  MoeConfig c = small_config(4, 2);
  std::vector<int> ids = {2, 0, 0, 3, 2, 1};  // T = 3
  Index ix = index(c, 3, ids);
  EXPECT_EQ(ix.counts, (std::vector<int>{2, 1, 2, 1}));
  EXPECT_EQ(ix.offsets, (std::vector<int>{0, 2, 3, 5, 6}));
  EXPECT_EQ(ix.sorted_pair, (std::vector<int>{1, 2, 5, 0, 4, 3}));
  EXPECT_EQ(ix.pair_pos, (std::vector<int>{3, 0, 1, 5, 4, 2}));

  c.ep_size = 2;
  c.ep_rank = 1;  // experts 2, 3
  ix = index(c, 3, ids);
  EXPECT_EQ(ix.counts, (std::vector<int>{2, 1}));
  EXPECT_EQ(ix.offsets, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(ix.sorted_pair, (std::vector<int>{0, 4, 3}));
  EXPECT_EQ(ix.pair_pos, (std::vector<int>{0, -1, -1, 2, 1, -1}));

  c.ep_rank = 0;  // experts 0, 1
  ix = index(c, 3, ids);
  EXPECT_EQ(ix.counts, (std::vector<int>{2, 1}));
  EXPECT_EQ(ix.sorted_pair, (std::vector<int>{1, 2, 5}));
  EXPECT_EQ(ix.pair_pos, (std::vector<int>{-1, 0, 1, -1, -1, 2}));

  EXPECT_THROW(index(c, 3, {0, 1, 2, 4, 0, 1}), std::invalid_argument);  // id 4 >= E
}

// ---------------------------------------------------------------- experts

// T=2, K=2, E=2, H=2, I=1, gated silu, nk layout.
struct TinyLayer {
  MoeConfig c;
  std::vector<double> hidden = {1, 2, -1, 0.5};
  std::vector<int> ids = {1, 0, 0, 1};
  std::vector<double> w = {0.75, 0.25, 0.6, 0.4};
  Weights wt;
  TinyLayer() {
    c = small_config(2, 2);
    c.hidden = 2;
    c.moe_intermediate = 1;
    // w13[e] = [gate row; up row], each [H].
    wt.w13 = {1, 0, 0, 1,  // e0: gate [1 0], up [0 1]
              0.5, 0.5, 1, -1};  // e1: gate [.5 .5], up [1 -1]
    wt.w2 = {2, -1,  // e0: [H=2, I=1]
             1, 3};  // e1
  }
};

TEST(ReferenceExperts, TinyGatedLayerByHand) {
  TinyLayer L;
  std::vector<double> residual = {10, 20, 30, 40};
  Experts ex = experts(L.c, 2, L.hidden, L.ids, L.w, L.wt, residual);
  const double a_t0e0 = silu(1.0) * 2.0;      // gate 1, up 2
  const double a_t1e0 = silu(-1.0) * 0.5;     // gate -1, up 0.5
  const double a_t0e1 = silu(1.5) * -1.0;     // gate 1.5, up -1
  const double a_t1e1 = silu(-0.25) * -1.5;   // gate -0.25, up -1.5
  // Expert-sorted rows: e0: pairs 1 (t0), 2 (t1); e1: pairs 0 (t0), 3 (t1).
  ASSERT_EQ(ex.act.size(), 4u);
  EXPECT_NEAR(ex.act[0], a_t0e0, 1e-15);
  EXPECT_NEAR(ex.act[1], a_t1e0, 1e-15);
  EXPECT_NEAR(ex.act[2], a_t0e1, 1e-15);
  EXPECT_NEAR(ex.act[3], a_t1e1, 1e-15);
  ASSERT_EQ(ex.y.size(), 8u);
  EXPECT_NEAR(ex.y[0], 2 * a_t0e0, 1e-15);
  EXPECT_NEAR(ex.y[1], -a_t0e0, 1e-15);
  EXPECT_NEAR(ex.y[6], a_t1e1, 1e-15);
  EXPECT_NEAR(ex.y[7], 3 * a_t1e1, 1e-15);
  // out[t0] = .75 * y(t0,e1) + .25 * y(t0,e0) + residual; out[t1] = .6 * y(t1,e0) + .4 * y(t1,e1) + residual.
  std::vector<double> expect = {0.75 * a_t0e1 + 0.25 * 2 * a_t0e0 + 10, 0.75 * 3 * a_t0e1 - 0.25 * a_t0e0 + 20,
                                0.6 * 2 * a_t1e0 + 0.4 * a_t1e1 + 30, -0.6 * a_t1e0 + 0.4 * 3 * a_t1e1 + 40};
  ASSERT_EQ(ex.out.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(ex.out[i], expect[i], 1e-13) << i;

  // Expert parallel: rank 1 holds only expert 1 and computes only its pairs.
  TinyLayer R;
  R.c.ep_size = 2;
  R.c.ep_rank = 1;
  R.wt.w13 = {0.5, 0.5, 1, -1};
  R.wt.w2 = {1, 3};
  ex = experts(R.c, 2, R.hidden, R.ids, R.w, R.wt, {});
  EXPECT_EQ(ex.index.pair_pos, (std::vector<int>{0, -1, -1, 1}));
  std::vector<double> expect1 = {0.75 * a_t0e1, 0.75 * 3 * a_t0e1, 0.4 * a_t1e1, 0.4 * 3 * a_t1e1};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(ex.out[i], expect1[i], 1e-13) << i;
}

TEST(ReferenceExperts, NonGatedGeluForms) {
  MoeConfig c = small_config(1, 1);
  c.hidden = 1;
  c.moe_intermediate = 2;
  c.gated = false;
  Weights wt;
  wt.w13 = {1, -0.5};  // [I=2, H=1]
  wt.w2 = {1, 1};      // [H=1, I=2]
  c.activation = Activation::Gelu;
  Experts ex = experts(c, 1, {1.0}, {0}, {1.0}, wt, {});
  // Values from Python's math.erf / math.tanh.
  EXPECT_NEAR(ex.act[0], 0.8413447460685429, 1e-15);
  EXPECT_NEAR(ex.act[1], -0.15426876936299344, 1e-15);
  EXPECT_NEAR(ex.out[0], 0.8413447460685429 - 0.15426876936299344, 1e-15);
  c.activation = Activation::GeluTanh;
  ex = experts(c, 1, {1.0}, {0}, {1.0}, wt, {});
  EXPECT_NEAR(ex.act[0], 0.8411919906082768, 1e-15);
  EXPECT_NEAR(ex.act[1], -0.15428599017485606, 1e-15);
}

// gpt-oss: w13_bias before the clamped SwiGLU, w2_bias before the combine weight, by hand.
TEST(ReferenceExperts, SwigluOaiWithBiasesByHand) {
  MoeConfig c = small_config(1, 1);
  c.hidden = 1;
  c.moe_intermediate = 3;
  c.activation = Activation::SwigluOai;
  c.swiglu_limit = 7.0;
  c.expert_bias = true;
  Weights wt;
  wt.w13 = {2, -1, 10, 0.5, 20, -20};  // [N1 = 6, H = 1]: gate rows, then up rows
  wt.w2 = {1, 1, 1};                   // [H = 1, I = 3]
  wt.w13_bias = {0.5, 0, 0, 0.25, 0, 0};
  wt.w2_bias = {3};
  const double x = 1.5, w = 0.5;
  Experts ex = experts(c, 1, {x}, {0}, {w}, wt, {});
  auto swiglu = [](double gate, double up) {
    const double g = std::min(gate, 7.0), u = std::clamp(up, -7.0, 7.0);
    return (u + 1) * g / (1 + std::exp(-1.702 * g));
  };
  const double a0 = swiglu(2 * x + 0.5, 0.5 * x + 0.25), a1 = swiglu(-x, 20 * x), a2 = swiglu(10 * x, -20 * x);
  EXPECT_NEAR(ex.act[0], a0, 1e-14);
  EXPECT_NEAR(ex.act[1], a1, 1e-14);                        // up clamped to 7
  EXPECT_NEAR(ex.act[2], a2, 1e-14);                        // gate clamped to 7, up to -7
  EXPECT_NEAR(ex.act[2], -6 * 7 / (1 + std::exp(-1.702 * 7)), 1e-13);
  EXPECT_NEAR(ex.y[0], a0 + a1 + a2 + 3, 1e-13);            // + w2_bias
  EXPECT_NEAR(ex.out[0], w * (a0 + a1 + a2 + 3), 1e-13);
  // Tensor-parallel rank 1 leaves w2_bias to rank 0 (the ranks' outputs are summed).
  c.tp_size = 2;
  c.tp_rank = 1;
  c.moe_intermediate = 6;
  ex = experts(c, 1, {x}, {0}, {w}, wt, {});
  EXPECT_NEAR(ex.y[0], a0 + a1 + a2, 1e-13);
  // The biases are required exactly when the config has them.
  c.tp_size = 1;
  c.tp_rank = 0;
  c.moe_intermediate = 3;
  c.expert_bias = false;
  EXPECT_THROW(experts(c, 1, {x}, {0}, {w}, wt, {}), std::invalid_argument);
  wt.w13_bias.clear();
  wt.w2_bias.clear();
  EXPECT_NO_THROW(experts(c, 1, {x}, {0}, {w}, wt, {}));
}

// NaN in gate or up stays NaN (torch.clamp keeps it), in that token's row only.
TEST(ReferenceExperts, SwigluOaiKeepsNaN) {
  MoeConfig c = small_config(1, 1);
  c.hidden = 1;
  c.moe_intermediate = 1;
  c.activation = Activation::SwigluOai;
  Weights wt;
  wt.w13 = {1, 1};
  wt.w2 = {1};
  Experts ex = experts(c, 2, {NAN, 1.0}, {0, 0}, {1.0, 1.0}, wt, {});
  EXPECT_TRUE(std::isnan(ex.out[0]));
  EXPECT_TRUE(std::isfinite(ex.out[1]));
}

std::vector<double> random_vector(std::mt19937& rng, size_t n, double lo, double hi, bool integer = false) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = integer ? std::round(d(rng)) : d(rng);
  return v;
}

// w[e] stored [rows, cols] -> [cols, rows].
std::vector<double> transpose_experts(const std::vector<double>& w, int64_t experts, int64_t rows, int64_t cols) {
  std::vector<double> t(w.size());
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[e * rows * cols + c * rows + r] = w[e * rows * cols + r * cols + c];
  return t;
}

// Random weights in c's shapes for its gemm_experts() experts (int8 values and their scales and
// smoothing for w8a8), drawn in one fixed order.
Weights random_weights(std::mt19937& rng, const MoeConfig& c) {
  const bool q = c.quant == Quant::W8A8Int8;
  const int64_t E = c.gemm_experts(), H = c.hidden, I = c.local_intermediate(), N1 = c.gemm1_rows();
  Weights w;
  w.w13 = random_vector(rng, E * N1 * H, q ? -127 : -1, q ? 127 : 1, q);
  w.w2 = random_vector(rng, E * H * I, q ? -127 : -1, q ? 127 : 1, q);
  if (q) {
    w.w13_scale = random_vector(rng, E * N1, 0.001, 0.01);
    w.w2_scale = random_vector(rng, E * H, 0.001, 0.01);
    w.input_smooth = random_vector(rng, (c.experts + c.shared_slots()) * H, 0.5, 2);
    w.act_smooth = random_vector(rng, E * I, 0.5, 2);
  }
  return w;
}

TEST(ReferenceExperts, KnLayoutEqualsNkOnTransposedWeights) {
  for (Quant quant : {Quant::None, Quant::W8A8Int8}) {
    SCOPED_TRACE(quant == Quant::None ? "unquantized" : "w8a8");
    MoeConfig c = small_config(8, 3);
    c.hidden = 24;
    c.moe_intermediate = 40;
    c.tp_size = 2;  // I = 20
    c.ep_size = 2;
    c.ep_rank = 1;
    c.quant = quant;
    const int64_t T = 37, H = c.hidden, I = c.local_intermediate(), N1 = c.gemm1_rows(), EL = c.local_experts();
    std::mt19937 rng(1234);
    const Weights nk = random_weights(rng, c);
    std::vector<double> hidden = random_vector(rng, T * H, -1, 1);
    std::vector<double> logits = random_vector(rng, T * c.experts, -2, 2);
    std::vector<double> residual = random_vector(rng, T * H, -1, 1);
    Weights kn = nk;
    kn.w13 = transpose_experts(nk.w13, EL, N1, H);
    kn.w2 = transpose_experts(nk.w2, EL, H, I);
    Layer a = layer(c, T, hidden, logits, {}, nk, residual);
    c.weight_layout = WeightLayout::KN;
    Layer b = layer(c, T, hidden, logits, {}, kn, residual);
    EXPECT_LE(relative_error(a.experts.out, b.experts.out), 1e-14);
    EXPECT_LE(relative_error(a.experts.act, b.experts.act), 1e-14);
    EXPECT_GT(a.experts.index.offsets.back(), 0);  // the rank did some work
    // The layer is route + experts.
    Experts direct = experts(c, T, hidden, a.routing.ids, a.routing.weights, kn, residual);
    EXPECT_EQ(direct.out, b.experts.out);
  }
}

// Fused shared experts (SPEC.md: one more expert every token visits with weight 1): on each
// expert-parallel rank the fused layer equals the routed experts alone plus, on rank 0 only, the
// S shared experts' sum, itself the layer of S experts that every token visits with weight 1.
TEST(ReferenceExperts, FusedSharedExpertsAreSlotsOfWeightOneOnRankZero) {
  for (Quant quant : {Quant::None, Quant::W8A8Int8}) {
    for (int rank : {0, 1}) {
      SCOPED_TRACE(fmt::format("{} ep_rank {}", quant == Quant::None ? "unquantized" : "w8a8", rank));
      MoeConfig c = small_config(8, 3);
      c.hidden = 24;
      c.moe_intermediate = 40;
      c.tp_size = 2;  // I = 20
      c.ep_size = 2;
      c.ep_rank = rank;
      c.quant = quant;
      c.dtype = c.router_dtype = quant == Quant::None ? DType::FP32 : DType::BF16;
      c.n_shared_experts = 2;
      c.fuse_shared_experts = true;
      const int S = c.shared_slots(), EL = c.local_experts(), EA = c.gemm_experts();
      ASSERT_EQ(S, 2);
      ASSERT_EQ(c.pair_slots(), 5);
      const int64_t T = 13, H = c.hidden, I = c.local_intermediate(), N1 = c.gemm1_rows();
      std::mt19937 rng(4321 + rank);
      const bool q = quant == Quant::W8A8Int8;
      const Weights fused = random_weights(rng, c);
      const std::vector<double> hidden = random_vector(rng, T * H, -1, 1);
      const std::vector<double> logits = random_vector(rng, T * c.experts, -2, 2);
      const std::vector<double> residual = random_vector(rng, T * H, -1, 1);
      const Layer got = layer(c, T, hidden, logits, {}, fused, residual);

      // The index: K + S pairs a token; the shared experts' T rows each on rank 0 (local EL, EL + 1).
      const Index& ix = got.experts.index;
      ASSERT_EQ(ix.pair_pos.size(), static_cast<size_t>(T * c.pair_slots()));
      ASSERT_EQ(ix.counts.size(), static_cast<size_t>(EA));
      for (int s = 0; s < S; ++s) EXPECT_EQ(ix.counts[EL + s], rank == 0 ? T : 0);

      // The routed experts alone: the first EL experts' tensors, no shared slots.
      MoeConfig routed_config = c;
      routed_config.fuse_shared_experts = false;
      auto first_experts = [](const std::vector<double>& v, int64_t experts, int64_t per_expert) {
        return std::vector<double>(v.begin(), v.begin() + experts * per_expert);
      };
      Weights routed;
      routed.w13 = first_experts(fused.w13, EL, N1 * H);
      routed.w2 = first_experts(fused.w2, EL, H * I);
      if (q) {
        routed.w13_scale = first_experts(fused.w13_scale, EL, N1);
        routed.w2_scale = first_experts(fused.w2_scale, EL, H);
        routed.input_smooth = first_experts(fused.input_smooth, c.experts, H);
        routed.act_smooth = first_experts(fused.act_smooth, EL, I);
      }
      const Layer want_routed = layer(routed_config, T, hidden, logits, {}, routed, residual);
      EXPECT_EQ(want_routed.routing.ids, got.routing.ids);

      // The shared experts as a layer of S experts (one rank), every token visiting all of them.
      MoeConfig shared_config = c;
      shared_config.experts = S;
      shared_config.topk = S;
      shared_config.ep_size = 1;
      shared_config.ep_rank = 0;
      shared_config.fuse_shared_experts = false;
      auto last_experts = [](const std::vector<double>& v, int64_t from, int64_t experts, int64_t per_expert) {
        return std::vector<double>(v.begin() + from * per_expert, v.begin() + (from + experts) * per_expert);
      };
      Weights shared;
      shared.w13 = last_experts(fused.w13, EL, S, N1 * H);
      shared.w2 = last_experts(fused.w2, EL, S, H * I);
      if (q) {
        shared.w13_scale = last_experts(fused.w13_scale, EL, S, N1);
        shared.w2_scale = last_experts(fused.w2_scale, EL, S, H);
        shared.input_smooth = last_experts(fused.input_smooth, c.experts, S, H);
        shared.act_smooth = last_experts(fused.act_smooth, EL, S, I);
      }
      std::vector<int> every(T * S);
      for (int64_t t = 0; t < T; ++t)
        for (int s = 0; s < S; ++s) every[t * S + s] = s;
      const Experts want_shared = experts(shared_config, T, hidden, every, std::vector<double>(T * S, 1.0), shared, {});

      std::vector<double> want = want_routed.experts.out;
      if (rank == 0)
        for (size_t i = 0; i < want.size(); ++i) want[i] += want_shared.out[i];
      EXPECT_LE(relative_error(want, got.experts.out), 1e-13);
      EXPECT_GT(relative_error(want_routed.experts.out, got.experts.out), rank == 0 ? 1e-3 : -1.0);
    }
  }
}

// One token, E=4 with ep_size 2 (rank 1 holds global experts 2, 3 as local 0, 1), routed to global
// expert 3 = local 1, so every per-expert tensor is read at a non-zero offset. H=2, I=1, gated silu.
TEST(ReferenceExperts, W8A8ByHand) {
  MoeConfig c = small_config(4, 1);
  c.dtype = DType::BF16;
  c.quant = Quant::W8A8Int8;
  c.hidden = 2;
  c.moe_intermediate = 1;
  c.ep_size = 2;
  c.ep_rank = 1;
  Weights wt;
  wt.input_smooth = {1, 1, 2, 2, 3, 3,  // global experts 0..2: must not be used
                     127, 1.25};        // global expert 3
  wt.w13 = {7, 7, 7, 7,                 // local 0: must not be used
            1, 2, -1, 1};               // local 1: gate [1 2], up [-1 1]
  wt.w13_scale = {9, 9, 0.5, 0.25};
  wt.act_smooth = {9, 2};
  wt.w2 = {9, 9, 3, -5};  // [E_loc, H=2, I=1]
  wt.w2_scale = {9, 9, 0.1, 0.2};
  Experts ex = experts(c, 1, {1, -2}, {3}, {1.0}, wt, {});
  // x = [127, -2.5] -> scale 1, q = [127, -2] (round half to even).
  // gate = (127 - 4) * 1 * 0.5 = 61.5; up = (-127 - 2) * 0.25 = -32.25.
  const double act = silu(61.5) * -32.25 * 2;
  ASSERT_EQ(ex.act.size(), 1u);
  EXPECT_NEAR(ex.act[0], act, 1e-12);
  // act re-quantizes to q2 = -127 with scale |act| / 127, so Y = [3 * act * 0.1, -5 * act * 0.2].
  ASSERT_EQ(ex.out.size(), 2u);
  EXPECT_NEAR(ex.out[0], 3 * act * 0.1, 1e-10);
  EXPECT_NEAR(ex.out[1], -5 * act * 0.2, 1e-10);
}

// ---------------------------------------------------------------- fp8

// One token, E=4 with ep_size 2 (rank 1 holds global experts 2, 3 as local 0, 1), routed to global
// expert 3 = local 1, so both per-expert scales are read at a non-zero offset. H=2, I=1, gated
// silu, fp8_tensor.
TEST(ReferenceFp8, TensorScaledByHand) {
  MoeConfig c = small_config(4, 1);
  c.quant = Quant::Fp8Tensor;
  c.hidden = 2;
  c.moe_intermediate = 1;
  c.ep_size = 2;
  c.ep_rank = 1;
  Weights wt;
  wt.w13 = {7, 7, 7, 7,             // local 0: must not be used
            1.5, 0.25, -2, 0.5};    // local 1: gate [1.5 0.25], up [-2 0.5] (e4m3 values)
  wt.w13_scale = {9, 0.5};
  wt.w2 = {9, 9, 3, -5};            // [E_loc, H=2, I=1]
  wt.w2_scale = {9, 0.125};
  Experts ex = experts(c, 1, {0.88, -3.5}, {3}, {0.75}, wt, {});
  // amax 3.5 -> s = 3.5 / 448 = 2^-7 (exact in fp32); 0.88 / s = 112.64 -> 112 (e4m3 steps of 8
  // in [64, 128)); -3.5 / s = -448. So A dequantizes to [0.875, -3.5].
  // gate = 0.5 * (0.875 * 1.5 - 3.5 * 0.25) = 0.21875; up = 0.5 * (0.875 * -2 - 3.5 * 0.5) = -1.75.
  const double act = silu(0.21875) * -1.75;
  ASSERT_EQ(ex.act.size(), 1u);
  EXPECT_NEAR(ex.act[0], act, 1e-15);  // before quantization
  // act alone in its row: s = |act| / 448 in fp32, and act / s = -448 (within an fp32 ulp, which
  // e4m3 rounds or saturates to 448), so act dequantizes to -448 * s.
  const float s = std::fabs(static_cast<float>(act)) / 448.0f;
  const double act_q = -448.0 * s;
  ASSERT_EQ(ex.y.size(), 2u);
  EXPECT_DOUBLE_EQ(ex.y[0], 3 * 0.125 * act_q);
  EXPECT_DOUBLE_EQ(ex.y[1], -5 * 0.125 * act_q);
  EXPECT_DOUBLE_EQ(ex.out[0], 0.75 * 3 * 0.125 * act_q);
  EXPECT_DOUBLE_EQ(ex.out[1], 0.75 * -5 * 0.125 * act_q);
}

TEST(ReferenceFp8, QuantizeRowRoundsToNearestEvenPerGroup) {
  // amax 3.5 -> s = 2^-7: x / s is x * 128 exactly.
  const double u = 1.0 / 128;
  std::vector<double> x = {3.5, 9 * u, 8.5 * u, 9.5 * u, u / 1024, 3 * u / 1024, -3.5, 0, 100.7 * u};
  std::vector<double> q(x.size());
  double scale = -1;
  quantize_fp8_row(x.data(), x.size(), 128, q.data(), &scale);
  EXPECT_EQ(scale, u);
  // 8.5 and 9.5 are ties in [8, 16) (steps of 1): to the even mantissa, 8 and 10. 2^-10 is half
  // the smallest subnormal: to 0; 3 * 2^-10 is halfway between 2^-9 and 2^-8: to 2^-8. 100.7 ->
  // 104 (steps of 8 in [64, 128)).
  EXPECT_EQ(q, (std::vector<double>{448, 9, 8, 10, 0, 1.0 / 256, -448, 0, 104}));

  // A partial last group gets its own scale from its own columns; fp8_tensor's one group is the row.
  std::vector<double> y(130, 0.5);
  y[3] = -1.0;
  y[128] = 100.0;
  y[129] = 3.0;
  q.assign(130, 0);
  double scales[2] = {-1, -1};
  quantize_fp8_row(y.data(), 130, 128, q.data(), scales);
  EXPECT_EQ(scales[0], 1.0f / 448.0f);
  EXPECT_EQ(scales[1], 100.0f / 448.0f);
  EXPECT_EQ(q[3], -448);
  EXPECT_EQ(q[0], 224);  // 0.5 / (1/448) = 224 within an fp32 ulp; 224 is an e4m3 value
  EXPECT_EQ(q[128], 448);
  EXPECT_EQ(q[129], 13);  // 3 / (100 / 448) = 13.44; steps of 1 in [8, 16)
  quantize_fp8_row(y.data(), 130, 130, q.data(), scales);
  EXPECT_EQ(scales[0], 100.0f / 448.0f);
  EXPECT_EQ(q[0], 2.25);  // 0.5 * 4.48 = 2.24 -> 2.25 (steps of 1/4 in [2, 4))
  EXPECT_THROW(quantize_fp8_row(y.data(), 130, 0, q.data(), scales), std::invalid_argument);
}

// An all-zero group takes the floor scale 1e-10 / 448 (computed in fp32) and quantizes to zeros,
// not 0 / 0; a zero token row gives a zero output row.
TEST(ReferenceFp8, ZeroRowUsesTheScaleFloor) {
  std::vector<double> x(200, 0.0), q(200, -1);
  x[150] = 0.25;
  double scales[2] = {-1, -1};
  quantize_fp8_row(x.data(), 200, 128, q.data(), scales);
  EXPECT_EQ(scales[0], 1e-10f / 448.0f);
  EXPECT_EQ(scales[1], 0.25f / 448.0f);
  for (int i = 0; i < 128; ++i) ASSERT_EQ(q[i], 0.0) << i;
  EXPECT_EQ(q[150], 448);

  for (Quant quant : {Quant::Fp8Block, Quant::Fp8Tensor}) {
    MoeConfig c = small_config(2, 1);
    c.quant = quant;
    c.hidden = 3;
    c.moe_intermediate = 2;
    Weights wt;
    wt.w13 = std::vector<double>(2 * 4 * 3, 0.5);
    wt.w2 = std::vector<double>(2 * 3 * 2, -2.0);
    wt.w13_scale = {1.5, 1.5};
    wt.w2_scale = {0.75, 0.75};
    Experts ex = experts(c, 2, {0, 0, 0, 1, -1, 0.5}, {0, 1}, {1.0, 1.0}, wt, {});
    for (int h = 0; h < 3; ++h) EXPECT_EQ(ex.out[h], 0.0) << h;        // token 0: zeros
    for (int h = 3; h < 6; ++h) EXPECT_NE(ex.out[h], 0.0) << h;        // token 1: not
    for (double v : ex.out) EXPECT_TRUE(std::isfinite(v));
  }
}

// SPEC.md's fp8 GEMMs written out as the spec states them, per (token, expert) pair: per group g
// of 128 columns (or the whole row), s_a[g] * scale_w[e][n/128][g] * sum_{k in g} q_a[k] * q_w[e][n][k].
// The reference instead dequantizes both operands and runs its one GEMM; gated silu only.
struct SpecFp8 {
  std::vector<double> out, act, y;  // out [T, H]; act [T*K, I], y [T*K, H] by flat pair
};
SpecFp8 spec_fp8(const MoeConfig& c, int64_t T, const std::vector<double>& hidden, const std::vector<int>& ids,
                 const std::vector<double>& topk_weights, const Weights& w) {
  const int K = c.topk, s = c.first_local_expert(), e_loc = c.local_experts();
  const int64_t H = c.hidden, I = c.local_intermediate(), N1 = c.gemm1_rows();
  const bool block = c.quant == Quant::Fp8Block;
  auto blocks = [](int64_t n) { return (n + 127) / 128; };
  auto quantize = [&](const double* x, int64_t n, std::vector<double>& q, std::vector<double>& scale) {
    const int64_t group = block ? 128 : n;
    q.assign(n, 0);
    scale.assign(blocks(n), 0);
    for (int64_t g = 0; g * group < n; ++g) {
      float amax = 0;
      for (int64_t k = g * group; k < std::min(n, (g + 1) * group); ++k)
        amax = std::max(amax, std::fabs(static_cast<float>(x[k])));
      scale[g] = std::max(amax, 1e-10f) / 448.0f;
      for (int64_t k = g * group; k < std::min(n, (g + 1) * group); ++k)
        q[k] = fp8::round_e4m3(static_cast<float>(x[k]) / static_cast<float>(scale[g]));
    }
  };
  // out_row[n] = sum_g s_x[g] * scale[n/128][g] * sum_{k in g} q_x[k] * wq[n][k] for wq [rows, cols].
  auto scaled_gemm = [&](const std::vector<double>& qx, const std::vector<double>& sx, const double* wq, int64_t rows,
                         int64_t cols, const double* wscale, double* out_row) {
    const int64_t group = block ? 128 : cols;
    for (int64_t n = 0; n < rows; ++n) {
      double acc = 0;
      for (int64_t g = 0; g * group < cols; ++g) {
        double partial = 0;
        for (int64_t k = g * group; k < std::min(cols, (g + 1) * group); ++k) partial += qx[k] * wq[n * cols + k];
        acc += sx[g] * (block ? wscale[(n / 128) * blocks(cols) + g] : wscale[0]) * partial;
      }
      out_row[n] = acc;
    }
  };
  const int64_t s13 = block ? blocks(N1) * blocks(H) : 1, s2 = block ? blocks(H) * blocks(I) : 1;
  EXPECT_EQ(static_cast<int64_t>(w.w13_scale.size()), e_loc * s13);
  SpecFp8 r;
  r.out.assign(T * H, 0);
  r.act.assign(T * K * I, 0);
  r.y.assign(T * K * H, 0);
  std::vector<double> qa, sa, qact, sact, g1(N1);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      const int64_t f = t * K + j;
      const int l = ids[f] - s;
      if (l < 0 || l >= e_loc) continue;
      quantize(hidden.data() + t * H, H, qa, sa);
      scaled_gemm(qa, sa, w.w13.data() + l * N1 * H, N1, H, w.w13_scale.data() + l * s13, g1.data());
      for (int64_t i = 0; i < I; ++i) r.act[f * I + i] = silu(g1[i]) * g1[I + i];
      quantize(r.act.data() + f * I, I, qact, sact);
      scaled_gemm(qact, sact, w.w2.data() + l * H * I, H, I, w.w2_scale.data() + l * s2, r.y.data() + f * H);
      for (int64_t h = 0; h < H; ++h) r.out[t * H + h] += topk_weights[f] * r.y[f * H + h];
    }
  return r;
}

// e4m3 weights over the format's range (a normal draw times 2^u per 128 x 128 block, u in
// [-6, 7]: subnormals to saturation) with fp32 scales spanning six decades, as quant_tensor_shapes
// lays them out.
Weights random_fp8_weights(const MoeConfig& c, std::mt19937& rng) {
  const int64_t EL = c.local_experts(), H = c.hidden, I = c.local_intermediate(), N1 = c.gemm1_rows();
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> exponent(-6, 7), decades(-4, 2);
  auto matrix = [&](int64_t rows, int64_t cols) {
    std::vector<double> v(EL * rows * cols);
    std::vector<double> magnitude(EL * ((rows + 127) / 128) * ((cols + 127) / 128));
    for (double& m : magnitude) m = std::exp2(exponent(rng));
    const int64_t cb = (cols + 127) / 128, rb = (rows + 127) / 128;
    for (int64_t e = 0; e < EL; ++e)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < cols; ++k)
          v[(e * rows + r) * cols + k] =
              fp8::round_e4m3(normal(rng) * magnitude[(e * rb + r / 128) * cb + k / 128]);
    return v;
  };
  auto scales = [&](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<double> v(n);
    for (double& x : v) x = static_cast<float>(std::pow(10.0, decades(rng)));
    return v;
  };
  const QuantTensorShapes shapes = quant_tensor_shapes(c);
  Weights w;
  w.w13 = matrix(N1, H);
  w.w2 = matrix(H, I);
  w.w13_scale = scales(shapes.w13_scale);
  w.w2_scale = scales(shapes.w2_scale);
  return w;
}

// H and I not multiples of 128 (partial last blocks in every direction: N1 = 272 rows of w13 in
// 3 row blocks, H = 300 columns in 3 groups, I = 136 in 2), expert parallel rank 1 of 2.
TEST(ReferenceFp8, MatchesTheSpecFormulasWithPartialBlocks) {
  for (Quant quant : {Quant::Fp8Block, Quant::Fp8Tensor}) {
    SCOPED_TRACE(std::string(to_string(quant)));
    MoeConfig c = small_config(8, 2);
    c.quant = quant;
    c.hidden = 300;
    c.moe_intermediate = 136;
    c.ep_size = 2;
    c.ep_rank = 1;
    const int64_t T = 9, H = c.hidden, I = c.local_intermediate();
    std::mt19937 rng(77);
    const Weights w = random_fp8_weights(c, rng);
    std::vector<double> hidden = random_vector(rng, T * H, -2, 2);
    for (int64_t h = 0; h < H; ++h) hidden[4 * H + h] *= 1000;  // one token far larger than the others
    for (int64_t h = 128; h < 256; ++h) hidden[5 * H + h] *= 1e-3;  // one group far smaller
    std::vector<int> ids;
    std::vector<double> tw = random_vector(rng, T * 2, 0.1, 1);
    for (int64_t t = 0; t < T; ++t) ids.insert(ids.end(), {static_cast<int>(t % 8), static_cast<int>((t + 3) % 8)});
    const Experts ex = experts(c, T, hidden, ids, tw, w, {});
    const SpecFp8 want = spec_fp8(c, T, hidden, ids, tw, w);
    EXPECT_LE(relative_error(want.out, ex.out), 1e-12);
    int64_t local = 0;
    for (int64_t f = 0; f < T * 2; ++f) {
      const int pos = ex.index.pair_pos[f];
      if (pos < 0) continue;
      ++local;
      const std::vector<double> act(ex.act.begin() + pos * I, ex.act.begin() + (pos + 1) * I);
      const std::vector<double> y(ex.y.begin() + pos * H, ex.y.begin() + (pos + 1) * H);
      EXPECT_LE(relative_error(std::vector<double>(want.act.begin() + f * I, want.act.begin() + (f + 1) * I), act),
                1e-12)
          << "pair " << f;
      EXPECT_LE(relative_error(std::vector<double>(want.y.begin() + f * H, want.y.begin() + (f + 1) * H), y), 1e-12)
          << "pair " << f;
    }
    EXPECT_GT(local, 4);
    // The scales multiply: doubling every w2 scale doubles y exactly (powers of two).
    Weights other = w;
    for (double& v : other.w2_scale) v *= 2;
    const Experts doubled = experts(c, T, hidden, ids, tw, other, {});
    for (size_t x = 0; x < ex.y.size(); ++x) ASSERT_EQ(doubled.y[x], 2 * ex.y[x]) << x;
  }
}

// SPEC.md: a NaN in one token's row may make that token's output non-finite and must not change
// any other token's.
TEST(ReferenceFp8, NaNInOneTokenRowStaysInThatToken) {
  for (Quant quant : {Quant::Fp8Block, Quant::Fp8Tensor}) {
    SCOPED_TRACE(std::string(to_string(quant)));
    MoeConfig c = small_config(4, 2);
    c.quant = quant;
    c.hidden = 200;
    c.moe_intermediate = 40;
    const int64_t T = 5, H = c.hidden;
    std::mt19937 rng(5);
    const Weights w = random_fp8_weights(c, rng);
    std::vector<double> hidden = random_vector(rng, T * H, -1, 1);
    const std::vector<int> ids = {0, 1, 1, 2, 0, 2, 3, 1, 2, 0};  // token 2 shares experts with all others
    const std::vector<double> tw(T * 2, 0.5), residual = random_vector(rng, T * H, -1, 1);
    const Experts clean = experts(c, T, hidden, ids, tw, w, residual);
    hidden[2 * H + 7] = kNaN;
    const Experts dirty = experts(c, T, hidden, ids, tw, w, residual);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        if (t == 2)
          ASSERT_TRUE(std::isnan(dirty.out[t * H + h])) << h;
        else
          ASSERT_EQ(dirty.out[t * H + h], clean.out[t * H + h]) << "token " << t << " column " << h;
      }
  }
}

// The fp8 layer differs from the unquantized layer over the same (dequantized) weights only by the
// activations' rounding to e4m3 (3 mantissa bits): a few percent, not zero and not O(1).
TEST(ReferenceFp8, CloseToTheUnquantizedLayerOnTheDequantizedWeights) {
  for (Quant quant : {Quant::Fp8Block, Quant::Fp8Tensor}) {
    SCOPED_TRACE(std::string(to_string(quant)));
    MoeConfig c = small_config(4, 2);
    c.quant = quant;
    c.hidden = 256;
    c.moe_intermediate = 192;
    const int64_t T = 16, H = c.hidden;
    std::mt19937 rng(11);
    const Weights w = random_fp8_weights(c, rng);
    const std::vector<double> hidden = random_vector(rng, T * H, -1, 1);
    const std::vector<double> logits = random_vector(rng, T * c.experts, -2, 2);
    const Layer fp8_layer = layer(c, T, hidden, logits, {}, w, {});
    MoeConfig plain = c;
    plain.quant = Quant::None;
    const Weights dw = dequantized_fp8(c, w);
    EXPECT_TRUE(dw.w13_scale.empty() && dw.w2_scale.empty());
    EXPECT_EQ(dw.w13[5], w.w13[5] * w.w13_scale[0]);  // expert 0, row 0, column 5: block (0, 0)
    const Layer unquantized = layer(plain, T, hidden, logits, {}, dw, {});
    EXPECT_EQ(fp8_layer.routing.ids, unquantized.routing.ids);
    const double err = relative_error(unquantized.experts.out, fp8_layer.experts.out);
    EXPECT_GT(err, 1e-2);
    EXPECT_LT(err, 0.1);
    EXPECT_LE(relative_error(unquantized.experts.act, fp8_layer.experts.act), 0.1);
  }
}

// Expert biases are not quantized: the dequantized weights carry them, so the unquantized layer
// over them (what the GPU tests compare fp8 layers with) adds the same biases.
TEST(ReferenceFp8, DequantizedWeightsKeepTheExpertBiases) {
  MoeConfig c = small_config(4, 2);
  c.quant = Quant::Fp8Block;
  c.hidden = 256;
  c.moe_intermediate = 192;
  c.expert_bias = true;
  std::mt19937 rng(12);
  Weights w = random_fp8_weights(c, rng);
  w.w13_bias = random_vector(rng, 4 * c.gemm1_rows(), -1, 1);
  w.w2_bias = random_vector(rng, 4 * c.hidden, -1, 1);
  const Weights dw = dequantized_fp8(c, w);
  EXPECT_EQ(dw.w13_bias, w.w13_bias);
  EXPECT_EQ(dw.w2_bias, w.w2_bias);
  const int64_t T = 5;
  const std::vector<double> hidden = random_vector(rng, T * c.hidden, -1, 1);
  const std::vector<double> logits = random_vector(rng, T * c.experts, -2, 2);
  const Layer fp8_layer = layer(c, T, hidden, logits, {}, w, {});
  MoeConfig plain = c;
  plain.quant = Quant::None;
  const Layer unquantized = layer(plain, T, hidden, logits, {}, dw, {});
  EXPECT_LT(relative_error(unquantized.experts.out, fp8_layer.experts.out), 0.1);
}

TEST(ReferenceFp8, RejectsScaleTensorsOfTheWrongShape) {
  MoeConfig c = small_config(2, 1);
  c.quant = Quant::Fp8Block;
  c.hidden = 200;
  c.moe_intermediate = 64;
  std::mt19937 rng(3);
  Weights w = random_fp8_weights(c, rng);
  EXPECT_EQ(w.w13_scale.size(), 2u * 1 * 2);  // [E_loc, ceil(128/128), ceil(200/128)]
  EXPECT_EQ(w.w2_scale.size(), 2u * 2 * 1);   // [E_loc, ceil(200/128), ceil(64/128)]
  const std::vector<double> hidden(200, 1.0);
  EXPECT_NO_THROW(experts(c, 1, hidden, {0}, {1.0}, w, {}));
  Weights per_channel = w;
  per_channel.w13_scale.assign(2 * 128, 1.0);  // w8a8's [E_loc, N1]
  EXPECT_THROW(experts(c, 1, hidden, {0}, {1.0}, per_channel, {}), std::invalid_argument);
  Weights missing = w;
  missing.w2_scale.clear();
  EXPECT_THROW(experts(c, 1, hidden, {0}, {1.0}, missing, {}), std::invalid_argument);
  c.quant = Quant::Fp8Tensor;  // [E_loc] each
  EXPECT_THROW(experts(c, 1, hidden, {0}, {1.0}, w, {}), std::invalid_argument);
  w.w13_scale = {0.5, 2.0};
  w.w2_scale = {1.0, 4.0};
  EXPECT_NO_THROW(experts(c, 1, hidden, {0}, {1.0}, w, {}));
  c.quant = Quant::W8A8Int8;
  EXPECT_THROW(dequantized_fp8(c, w), std::invalid_argument);
}

// ---------------------------------------------------------------- quantize_row, relative_error

TEST(ReferenceQuant, QuantizeRowExamples) {
  std::vector<double> x = {127, 2.5, -2.5, 3.5, 0.5, -1.5, -127, 0};
  std::vector<double> q(x.size());
  double scale = -1;
  quantize_row(x.data(), x.size(), q.data(), &scale);
  EXPECT_EQ(scale, 1.0);
  EXPECT_EQ(q, (std::vector<double>{127, 2, -2, 4, 0, -2, -127, 0}));

  std::vector<double> y = {254, 5, 3, -7};  // scale 2: 2.5 -> 2, 1.5 -> 2, -3.5 -> -4
  q.assign(y.size(), -1);
  quantize_row(y.data(), y.size(), q.data(), &scale);
  EXPECT_EQ(scale, 2.0);
  EXPECT_EQ(q, (std::vector<double>{127, 2, 2, -4}));

  std::vector<double> z = {0, -0.0, 0};
  q.assign(z.size(), -1);
  quantize_row(z.data(), z.size(), q.data(), &scale);
  EXPECT_EQ(scale, 0.0);
  EXPECT_EQ(q, (std::vector<double>{0, 0, 0}));

  std::vector<double> n = {-3.0, 1.0};  // the max magnitude is negative: -> -127
  q.assign(n.size(), 0);
  quantize_row(n.data(), n.size(), q.data(), &scale);
  EXPECT_DOUBLE_EQ(scale, 3.0 / 127);
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[1], 42);  // 42.33
}

TEST(ReferenceError, RelativeErrorEdgeCases) {
  EXPECT_EQ(relative_error({}, {}), 0.0);
  EXPECT_EQ(relative_error({0, 0}, {0, 0}), 0.0);
  EXPECT_EQ(relative_error({0, 0}, {0, 1e-300}), kInf);
  EXPECT_DOUBLE_EQ(relative_error({3, 4}, {3, 4.5}), 0.1);
  EXPECT_EQ(relative_error({3, 4}, {3, 4}), 0.0);
  EXPECT_EQ(relative_error({1, 2}, {1, kNaN}), kInf);
  EXPECT_EQ(relative_error({1, kNaN}, {1, 2}), kInf);
  EXPECT_EQ(relative_error({1, kInf}, {1, kInf}), kInf);
  EXPECT_EQ(relative_error({1, 2}, {-kInf, 2}), kInf);
  // No overflow or underflow in the squares.
  EXPECT_NEAR(relative_error({1e200, 1e200}, {1e200, 1.1e200}), 0.1 / std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(relative_error({1e-200, 1e-200}, {1e-200, 1.1e-200}), 0.1 / std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(relative_error({1e308, 1e308}, {-1e308, 1e308}), 2 / std::sqrt(2.0), 1e-12);
  EXPECT_THROW(relative_error({1}, {1, 2}), std::invalid_argument);
}

}  // namespace
}  // namespace moejit::reference
