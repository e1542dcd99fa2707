// SPEC.md stage 1 (routing) on the host: the one CPU implementation, templated on the float type.
// Used by the torch op's CPU kernel (float: backends/torch/cpu_kernels.cpp), the ILU backend's
// portable routing (float, on the host: backends/ixformer/portable_routing.cpp) and the float64
// reference (double, with near-tie detection: tests/reference/reference.cpp). The generated device
// code (templates/routing.cuh) is a separate implementation; with F = float this follows its fp32
// formulas (the sigmoid form, where values are sanitized, renormalize then scale, ties to the lower
// index), but sums the softmax in expert order where the GPU sums per lane and across the warp, and
// uses the host's exp.
//
// The arithmetic, in F:
// - sanitize: NaN -> -FLT_MAX, +inf -> +FLT_MAX, -inf -> -FLT_MAX (FLT_MAX as an F); finite values
//   pass unchanged. It maps the logits and the bias, and (noaux_tc) each q = p + bias and each
//   group score, which can only overflow in float.
// - softmax: p = exp(x - max x) / sum, summed in expert order; sigmoid: p = 1 / (1 + exp(-x)), the
//   GPU kernel's form. (In double this form gives exactly 0 for x below about -709, where exp(-x)
//   overflows, and the stable form e^x / (1 + e^x) a subnormal; otherwise they differ by rounding.)
// - q = p + bias for noaux_tc, else p.
// - groups (num_expert_group G > 1): group score = the sum of the two largest q (noaux_tc, groups of
//   at least two experts) or the largest q; the topk_group best groups are kept by a sequential
//   argmax (ties to the lower group); experts of the other groups are never selected.
// - selection: K sequential argmaxes over the allowed experts' q (ties to the lower index), so the
//   ids come out ordered by descending q.
// - weights: w_j = p[id_j]; renormalize: w_j / sum_j w_j when the sum (accumulated in slot order) is
//   > 0, else w_j unchanged; then times F(routed_scaling_factor).
// - near_tie (only when asked for): the float64 reference's definition (tests/reference/reference.cpp),
//   computed in F. Two selection scores a, b are close when |a - b| <= 1e-6 * max(|a|, |b|, 1e-30);
//   a token has a near tie when the topk_group-th best group score is close to the next best
//   (groups apply and topk_group < G), or when, for r = 0..K-1, the r-th pick's q is close to the
//   (r+1)-th best allowed q (the next pick, or for r = K-1 the best one left unpicked, if any).
//
// No torch, no CUDA: plain C++ on raw pointers. Preconditions: the rule is valid (what
// compiler/moe_config.h's validate() checks: 1 <= K <= topk_group * E / G, G divides E), logits
// hold E values per token, bias E values when noaux_tc (it is not read otherwise). Any input
// values are fine: every output is finite, every id in [0, E), a token's ids are distinct.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

namespace moejit {

// What stage 1 depends on: MoeConfig's fields of the same names (SPEC.md).
struct RoutingRule {
  int experts = 8;            // E
  int topk = 2;               // K
  int num_expert_group = 1;   // G
  int topk_group = 1;         // groups kept per token
  bool sigmoid = false;       // scoring sigmoid; softmax otherwise
  bool noaux_tc = false;      // topk_method noaux_tc: q = p + bias, a group scores its two best q
  bool renormalize = true;
  double routed_scaling_factor = 1.0;
};

// The rule of a compiler/moe_config.h MoeConfig (or LayerSpec). A template over the config's type,
// so that common/ does not include compiler/: any type with MoeConfig's field names and enums works.
template <class Config>
RoutingRule routing_rule(const Config& c) {
  RoutingRule r;
  r.experts = c.experts;
  r.topk = c.topk;
  r.num_expert_group = c.num_expert_group;
  r.topk_group = c.topk_group;
  r.sigmoid = c.scoring == decltype(c.scoring)::Sigmoid;
  r.noaux_tc = c.topk_method == decltype(c.topk_method)::NoauxTc;
  r.renormalize = c.renormalize;
  r.routed_scaling_factor = c.routed_scaling_factor;
  return r;
}

namespace cpu_routing {

// SPEC.md's map of non-finite values, in F. For float it equals fmin(fmax(x, -FLT_MAX), FLT_MAX)
// with NaN first sent to -FLT_MAX; for double, finite values beyond FLT_MAX pass unchanged.
template <typename F>
F sanitize(F x) {
  constexpr F kMax = static_cast<F>(FLT_MAX);
  if (std::isnan(x)) return -kMax;
  if (std::isinf(x)) return x > 0 ? kMax : -kMax;
  return x;
}

// The near-tie test of the float64 reference (see the comment at the top of this file).
template <typename F>
bool close(F a, F b) {
  const F m = std::max({std::fabs(a), std::fabs(b), static_cast<F>(1e-30)});
  return std::fabs(a - b) <= static_cast<F>(1e-6) * m;
}

// Index of the largest score among the candidates, ties to the lower index; -1 when there is none.
template <typename F>
int best_of(const std::vector<F>& score, const std::vector<char>& candidate) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(score.size()); ++i)
    if (candidate[i] && (best < 0 || score[i] > score[best])) best = i;
  return best;
}

}  // namespace cpu_routing

// Routes tokens one at a time, reusing its scratch buffers: one router per thread.
template <typename F>
class CpuRouter {
 public:
  // bias: [E] correction bias, read (and sanitized once, here) only for noaux_tc; may be null otherwise.
  CpuRouter(const RoutingRule& rule, const F* bias)
      : rule_(rule), bias_(rule.noaux_tc ? rule.experts : 0), p_(rule.experts), q_(rule.experts),
        allowed_(rule.experts), group_score_(rule.num_expert_group), group_open_(rule.num_expert_group),
        group_kept_(rule.num_expert_group) {
    for (int e = 0; e < static_cast<int>(bias_.size()); ++e) bias_[e] = cpu_routing::sanitize(bias[e]);
  }

  // One token: logits [E] -> weights [K], ids [K] (ordered by descending selection score).
  // near_tie, when not null, receives whether a selection was decided within the near-tie margin.
  void route(const F* logits, F* weights, int* ids, bool* near_tie = nullptr) {
    using cpu_routing::best_of;
    using cpu_routing::close;
    using cpu_routing::sanitize;
    const int E = rule_.experts, K = rule_.topk, G = rule_.num_expert_group;
    constexpr F kMax = static_cast<F>(FLT_MAX);
    std::vector<F>& p = p_;
    std::vector<F>& q = q_;
    if (rule_.sigmoid) {
      for (int e = 0; e < E; ++e) p[e] = F(1) / (F(1) + std::exp(-sanitize(logits[e])));
    } else {
      F row_max = -kMax;
      for (int e = 0; e < E; ++e) row_max = std::fmax(row_max, sanitize(logits[e]));
      F sum = 0;
      for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(sanitize(logits[e]) - row_max));
      for (int e = 0; e < E; ++e) p[e] /= sum;  // sum >= 1: the max term is exp(0)
    }
    const bool noaux = rule_.noaux_tc;
    for (int e = 0; e < E; ++e) q[e] = noaux ? sanitize(p[e] + bias_[e]) : p[e];

    bool tie = false;
    std::fill(allowed_.begin(), allowed_.end(), char(1));
    if (G > 1) {
      const int size = E / G;
      for (int g = 0; g < G; ++g) {
        F first = -kMax, second = -kMax;
        for (int i = 0; i < size; ++i) {
          const F v = q[g * size + i];
          if (v > first) {
            second = first;
            first = v;
          } else if (v > second) {
            second = v;
          }
        }
        group_score_[g] = noaux && size >= 2 ? sanitize(first + second) : first;
      }
      std::fill(group_open_.begin(), group_open_.end(), char(1));
      std::fill(group_kept_.begin(), group_kept_.end(), char(0));
      int last = -1;
      for (int r = 0; r < rule_.topk_group; ++r) {
        last = best_of(group_score_, group_open_);
        group_open_[last] = 0;
        group_kept_[last] = 1;
      }
      if (near_tie && rule_.topk_group < G) {
        const int runner_up = best_of(group_score_, group_open_);
        tie = tie || close(group_score_[last], group_score_[runner_up]);
      }
      for (int e = 0; e < E; ++e) allowed_[e] = group_kept_[e / size];
    }

    F sum = 0;
    for (int j = 0; j < K; ++j) {
      const int e = best_of(q, allowed_);
      allowed_[e] = 0;
      ids[j] = e;
      weights[j] = p[e];
      sum += p[e];
    }
    if (near_tie) {
      for (int j = 0; j + 1 < K; ++j) tie = tie || close(q[ids[j]], q[ids[j + 1]]);
      const int next = best_of(q, allowed_);  // the best allowed expert left unpicked
      if (next >= 0) tie = tie || close(q[ids[K - 1]], q[next]);
      *near_tie = tie;
    }
    const bool renormalize = rule_.renormalize && sum > 0;
    const F scale = static_cast<F>(rule_.routed_scaling_factor);
    for (int j = 0; j < K; ++j) weights[j] = (renormalize ? weights[j] / sum : weights[j]) * scale;
  }

 private:
  RoutingRule rule_;
  std::vector<F> bias_, p_, q_;
  std::vector<char> allowed_;
  std::vector<F> group_score_;
  std::vector<char> group_open_, group_kept_;
};

// T tokens: logits [T, E] -> weights [T, K], ids [T, K]; near_tie [T] when not null.
// bias [E] as for CpuRouter.
template <typename F>
void cpu_route_tokens(const RoutingRule& rule, int64_t tokens, const F* logits, const F* bias, F* weights,
                      int* ids, bool* near_tie = nullptr) {
  CpuRouter<F> router(rule, bias);
  const int64_t E = rule.experts, K = rule.topk;
  for (int64_t t = 0; t < tokens; ++t)
    router.route(logits + t * E, weights + t * K, ids + t * K, near_tie ? near_tie + t : nullptr);
}

}  // namespace moejit
