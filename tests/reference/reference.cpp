// The float64 CPU reference of SPEC.md, written from the spec alone (no code shared with
// templates/). Plain loops in double precision; the innermost loops walk contiguous memory.
// Stage 1 (routing) is the one CPU routing of common/cpu_routing.h instantiated for double, which
// the torch op's CPU kernel (float) and the ILU backend's portable routing (float) share; the
// generated kernels (templates/routing.cuh) remain a separate implementation checked against it.
//
// Choices where SPEC.md leaves room (see also reference.h):
// - All routing math is done in double, on the logits widened to double. Non-finite logits (and
//   bias values) are mapped first: NaN -> -FLT_MAX, +inf -> +FLT_MAX, -inf -> -FLT_MAX, with
//   FLT_MAX the float constant taken as a double. Finite values are used as given.
// - sigmoid is 1 / (1 + exp(-x)), the form of the fp32 implementations (common/cpu_routing.h):
//   in double it is exactly 0 for x below about -709 (exp(-x) overflows), where the stable form
//   e^x / (1 + e^x) would give a subnormal; elsewhere the two differ only by rounding. (The
//   activations of stage 4 keep the stable form below.)
// - Groups apply when num_expert_group > 1, for any topk_method that validate() accepts
//   (group_limited_greedy: group score = max q; noaux_tc: sum of the two largest q; a group of one
//   expert, which validate() rejects for noaux_tc, would score its single q).
// - near_tie[t] is set when, for token t, any of these pairs of selection scores is "close"
//   (|a - b| <= 1e-6 * max(|a|, |b|, 1e-30)):
//     * group boundary (only when groups apply and topk_group < G): the topk_group-th best group
//       score and the next best group score (the order among kept groups does not change any
//       output, so it is not checked);
//     * expert selection: among the allowed experts sorted by descending q (ties to the lower
//       index), each adjacent pair (r, r+1) for r = 1..K, i.e. every step of a sequential argmax
//       (the chosen one against the runner-up), which covers both the K-th vs (K+1)-th boundary
//       (which experts are chosen) and the order of the K outputs (ids and weights are ordered).
//   The 1e-30 floor makes values below ~1e-36 apart count as ties, so scores that underflow to 0
//   or to subnormals in float32 (e.g. softmax of logits far below the row max) are marked too.
// - renormalize: w /= sum(w) only when the sum is not 0; routed_scaling_factor always applies after.
// - Every entry point calls validate(config) and throws std::invalid_argument for tensor sizes
//   that do not match the config, or ids outside [0, E).
// - fp8 (fp8_block, fp8_tensor): each gathered row of A and each act row is quantized with
//   quantize_fp8_row, which computes the scale and the division in fp32 as the device does, so
//   both sides round the same numbers to e4m3; the GEMMs then run in double over the dequantized
//   operands (q * s and w * scale, both exact in double), which is SPEC's per-group sum
//   sum_g s_a * scale_w * sum_k q_a * q_w in another order. act is quantized from its double
//   value cast to float (the device's act_f32 is the fp32 computation of the same number).
#include "tests/reference/reference.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <stdexcept>
#include <string>

#include "common/cpu_routing.h"
#include "common/fp8.h"

namespace moejit::reference {
namespace {

void require_size(const char* what, size_t got, int64_t want) {
  if (want < 0 || got != static_cast<size_t>(want))
    throw std::invalid_argument(std::string("moejit reference: ") + what + " has " + std::to_string(got) +
                                " elements, expected " + std::to_string(want));
}

// For the activations (stage 4); routing's sigmoid is common/cpu_routing.h's.
double sigmoid(double x) {
  // Stable for any finite x: no inf/inf.
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  double e = std::exp(x);
  return e / (1.0 + e);
}

double activation(Activation kind, double x) {
  switch (kind) {
    case Activation::Silu:
      return x * sigmoid(x);
    case Activation::Gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::GeluTanh: {
      const double c = std::sqrt(2.0 / std::numbers::pi);
      return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
    }
    case Activation::SwigluOai:
      break;  // gated only: gated_activation
  }
  throw std::invalid_argument("moejit reference: activation of one value for a gated-only activation");
}

// A gated activation from one column's gate and up values: act(gate) * up, or swigluoai's
// (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g) with g = min(gate, limit).
double gated_activation(const MoeConfig& config, double gate, double up) {
  if (config.activation != Activation::SwigluOai) return activation(config.activation, gate) * up;
  // std::min and std::clamp return a NaN first argument as it is, as torch.clamp does.
  const double limit = config.swiglu_limit;
  const double g = std::min(gate, limit);
  const double u = std::clamp(up, -limit, limit);
  return (u + 1.0) * g * sigmoid(kSwigluOaiAlpha * g);
}

// out[r, n] = sum_k a[r, k] * W(n, k) for r < rows, n < n_out, k < kd.
// W is stored [n_out, kd] (NK, k contiguous) or [kd, n_out] (KN, n contiguous).
// Rows are taken in tiles so the weight rows are reused from cache across a tile.
void gemm(const double* a, int64_t rows, int64_t kd, const double* w, int64_t n_out, WeightLayout layout,
          double* out) {
  constexpr int64_t kTile = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    if (layout == WeightLayout::NK) {
      for (int64_t n = 0; n < n_out; ++n) {
        const double* wrow = w + n * kd;
        int64_t r = r0;
        // Four rows at a time: independent accumulators, each still a plain sum in k order.
        for (; r + 4 <= r1; r += 4) {
          const double *a0 = a + r * kd, *a1 = a0 + kd, *a2 = a1 + kd, *a3 = a2 + kd;
          double c0 = 0.0, c1 = 0.0, c2 = 0.0, c3 = 0.0;
          for (int64_t k = 0; k < kd; ++k) {
            const double wk = wrow[k];
            c0 += a0[k] * wk;
            c1 += a1[k] * wk;
            c2 += a2[k] * wk;
            c3 += a3[k] * wk;
          }
          out[r * n_out + n] = c0;
          out[(r + 1) * n_out + n] = c1;
          out[(r + 2) * n_out + n] = c2;
          out[(r + 3) * n_out + n] = c3;
        }
        for (; r < r1; ++r) {
          const double* arow = a + r * kd;
          double acc = 0.0;
          for (int64_t k = 0; k < kd; ++k) acc += arow[k] * wrow[k];
          out[r * n_out + n] = acc;
        }
      }
    } else {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t n = 0; n < n_out; ++n) out[r * n_out + n] = 0.0;
      for (int64_t k = 0; k < kd; ++k) {
        const double* wrow = w + k * n_out;
        for (int64_t r = r0; r < r1; ++r) {
          const double av = a[r * kd + k];
          double* orow = out + r * n_out;
          for (int64_t n = 0; n < n_out; ++n) orow[n] += av * wrow[n];
        }
      }
    }
  }
}

// sqrt(sum v^2), scaled by the largest magnitude so the squares neither overflow nor underflow.
double frobenius(const std::vector<double>& v) {
  double scale = 0.0;
  for (double x : v) scale = std::max(scale, std::fabs(x));
  if (scale == 0.0 || !std::isfinite(scale)) return scale;
  double sum = 0.0;
  for (double x : v) {
    const double r = x / scale;
    sum += r * r;
  }
  return scale * std::sqrt(sum);
}

// Elements of one expert's slice of a scale tensor of shape [E_loc, ...].
int64_t per_expert(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

int64_t elements(const std::vector<int64_t>& shape) { return shape.empty() ? 0 : shape[0] * per_expert(shape); }

// One expert's fp8 matrix [rows, cols] (nk layout) dequantized: w * scale[r/128][c/128] with
// scale [ceil(rows/128), ceil(cols/128)] (fp8_block), or w * scale[0] (fp8_tensor).
void dequantize_fp8_matrix(Quant quant, const double* w, int64_t rows, int64_t cols, const double* scale,
                           double* out) {
  const int64_t col_blocks = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  for (int64_t r = 0; r < rows; ++r) {
    const double* srow = quant == Quant::Fp8Block ? scale + (r / kFp8BlockSize) * col_blocks : scale;
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = w[r * cols + c] * (quant == Quant::Fp8Block ? srow[c / kFp8BlockSize] : srow[0]);
  }
}

// The activation groups of an fp8 config: 128 columns (fp8_block) or the whole row (fp8_tensor).
int64_t fp8_group(const MoeConfig& config, int64_t cols) {
  return config.quant == Quant::Fp8Block ? kFp8BlockSize : cols;
}

// Each row of a [rows, cols] replaced by the dequantized values (q * s) of its fp8 quantization.
void fp8_quantize_rows(const double* a, int64_t rows, int64_t cols, int64_t group, double* out) {
  std::vector<double> q(cols), s((cols + group - 1) / group);
  for (int64_t r = 0; r < rows; ++r) {
    quantize_fp8_row(a + r * cols, cols, group, q.data(), s.data());
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = q[c] * s[c / group];
  }
}

}  // namespace

Routing route(const MoeConfig& config, int64_t tokens, const std::vector<double>& logits,
              const std::vector<double>& bias) {
  validate(config);
  check_routable(config);
  if (tokens < 0) throw std::invalid_argument("moejit reference: tokens < 0");
  const int E = config.experts;
  const int K = config.topk;
  const bool noaux = config.topk_method == TopkMethod::NoauxTc;
  require_size("router logits", logits.size(), tokens * E);
  if (noaux)
    require_size("e_score_correction_bias", bias.size(), E);
  else
    require_size("e_score_correction_bias (only for noaux_tc)", bias.size(), 0);

  Routing r;
  r.weights.assign(tokens * K, 0.0);
  r.ids.assign(tokens * K, 0);
  std::unique_ptr<bool[]> near_tie(new bool[tokens]());
  cpu_route_tokens<double>(routing_rule(config), tokens, logits.data(), noaux ? bias.data() : nullptr,
                           r.weights.data(), r.ids.data(), near_tie.get());
  r.near_tie.assign(near_tie.get(), near_tie.get() + tokens);
  return r;
}

Index index(const MoeConfig& config, int64_t tokens, const std::vector<int>& ids) {
  validate(config);
  if (tokens < 0) throw std::invalid_argument("moejit reference: tokens < 0");
  const int E = config.experts;
  const int K = config.topk;
  // Pairs f = t * KS + j: slots j < K are the routed experts ids[t * K + j], slots K..KS-1 the
  // fused shared experts (local experts e_loc.. on expert-parallel rank 0, not local elsewhere).
  const int KS = config.pair_slots();
  const int e_loc = config.local_experts();
  const int e_all = config.gemm_experts();
  const int s = config.first_local_expert();
  const int64_t M = tokens * KS;
  require_size("topk_ids", ids.size(), tokens * K);

  std::vector<int> local(M, -1);
  for (int64_t f = 0; f < M; ++f) {
    const int64_t t = f / KS;
    const int j = static_cast<int>(f % KS);
    if (j >= K) {
      if (config.ep_rank == 0) local[f] = e_loc + (j - K);
      continue;
    }
    const int e = ids[t * K + j];
    if (e < 0 || e >= E)
      throw std::invalid_argument("moejit reference: topk_ids[" + std::to_string(t * K + j) + "] = " +
                                  std::to_string(e) + " is outside [0, " + std::to_string(E) + ")");
    if (e >= s && e < s + e_loc) local[f] = e - s;
  }
  Index ix;
  ix.counts.assign(e_all, 0);
  ix.offsets.assign(e_all + 1, 0);
  ix.pair_pos.assign(M, -1);
  for (int64_t f = 0; f < M; ++f)
    if (local[f] >= 0) ix.counts[local[f]]++;
  for (int l = 0; l < e_all; ++l) ix.offsets[l + 1] = ix.offsets[l] + ix.counts[l];
  ix.sorted_pair.assign(ix.offsets[e_all], -1);
  std::vector<int> next(ix.offsets.begin(), ix.offsets.end() - 1);
  for (int64_t f = 0; f < M; ++f) {  // ascending f: a stable sort
    if (local[f] < 0) continue;
    const int pos = next[local[f]]++;
    ix.sorted_pair[pos] = static_cast<int>(f);
    ix.pair_pos[f] = pos;
  }
  return ix;
}

Experts experts(const MoeConfig& config, int64_t tokens, const std::vector<double>& hidden,
                const std::vector<int>& ids, const std::vector<double>& topk_weights, const Weights& weights,
                const std::vector<double>& residual) {
  validate(config);
  const int K = config.topk;
  const int KS = config.pair_slots();  // pairs per token: K routed slots, then the fused shared experts
  const int E = config.experts;
  const int e_loc = config.gemm_experts();  // the routed local experts, then the fused shared ones
  const int e_routed = config.local_experts();
  const int s = config.first_local_expert();
  const int64_t H = config.hidden;
  const int64_t I = config.local_intermediate();
  const int64_t N1 = config.gemm1_rows();
  const bool w8a8 = config.quant == Quant::W8A8Int8;
  const bool fp8 = is_fp8(config.quant);
  const WeightLayout layout = config.weight_layout;  // nk for fp8 (validate() enforces it)

  require_size("hidden", hidden.size(), tokens * H);
  require_size("topk_weights", topk_weights.size(), tokens * K);
  require_size("w13", weights.w13.size(), e_loc * N1 * H);
  require_size("w2", weights.w2.size(), e_loc * H * I);
  if (!residual.empty()) require_size("residual", residual.size(), tokens * H);
  require_size("w13_bias", weights.w13_bias.size(), config.expert_bias ? e_loc * N1 : 0);
  require_size("w2_bias", weights.w2_bias.size(), config.expert_bias ? e_loc * H : 0);
  // The tensor-parallel ranks' GEMM 2 outputs are summed: rank 0 adds the bias.
  const bool add_w2_bias = config.expert_bias && config.tp_rank == 0;
  if (w8a8) {
    require_size("w13_scale", weights.w13_scale.size(), e_loc * N1);
    require_size("w2_scale", weights.w2_scale.size(), e_loc * H);
    require_size("input_smooth", weights.input_smooth.size(), static_cast<int64_t>(E + config.shared_slots()) * H);
    require_size("act_smooth", weights.act_smooth.size(), e_loc * I);
  }
  const QuantTensorShapes shapes = quant_tensor_shapes(config);
  if (fp8) {
    require_size("w13_scale", weights.w13_scale.size(), elements(shapes.w13_scale));
    require_size("w2_scale", weights.w2_scale.size(), elements(shapes.w2_scale));
  }

  Experts ex;
  ex.index = index(config, tokens, ids);
  const Index& ix = ex.index;
  const int64_t rows_total = ix.offsets[e_loc];
  ex.act.assign(rows_total * I, 0.0);
  ex.y.assign(rows_total * H, 0.0);

  std::vector<double> a, g1, qa, sa, qact, sact, dw13, dw2;
  for (int l = 0; l < e_loc; ++l) {
    const int64_t begin = ix.offsets[l];
    const int64_t rows = ix.counts[l];
    if (rows == 0) continue;
    const int global_e = l < e_routed ? s + l : E + (l - e_routed);  // a shared expert: E + its slot
    const double* w13 = weights.w13.data() + l * N1 * H;
    const double* w2 = weights.w2.data() + l * H * I;
    if (fp8) {  // from here on the GEMMs see the dequantized weights
      dw13.resize(N1 * H);
      dw2.resize(H * I);
      dequantize_fp8_matrix(config.quant, w13, N1, H, weights.w13_scale.data() + l * per_expert(shapes.w13_scale),
                            dw13.data());
      dequantize_fp8_matrix(config.quant, w2, H, I, weights.w2_scale.data() + l * per_expert(shapes.w2_scale),
                            dw2.data());
      w13 = dw13.data();
      w2 = dw2.data();
    }
    double* act = ex.act.data() + begin * I;
    double* y = ex.y.data() + begin * H;

    // Stage 3: expand (gather the token rows of this expert).
    a.assign(rows * H, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = ix.sorted_pair[begin + r] / KS;
      for (int64_t h = 0; h < H; ++h) a[r * H + h] = hidden[t * H + h];
    }

    // Stage 4: GEMM 1.
    g1.assign(rows * N1, 0.0);
    if (fp8) {
      qa.resize(rows * H);
      fp8_quantize_rows(a.data(), rows, H, fp8_group(config, H), qa.data());
      gemm(qa.data(), rows, H, w13, N1, layout, g1.data());
    } else if (!w8a8) {
      gemm(a.data(), rows, H, w13, N1, layout, g1.data());
    } else {
      const double* smooth = weights.input_smooth.data() + global_e * H;
      qa.assign(rows * H, 0.0);
      sa.assign(rows, 0.0);
      std::vector<double> xrow(H);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < H; ++h) xrow[h] = a[r * H + h] * smooth[h];
        quantize_row(xrow.data(), H, qa.data() + r * H, &sa[r]);
      }
      gemm(qa.data(), rows, H, w13, N1, layout, g1.data());
      const double* ws = weights.w13_scale.data() + l * N1;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = 0; n < N1; ++n) g1[r * N1 + n] = g1[r * N1 + n] * sa[r] * ws[n];
    }

    if (config.expert_bias) {
      const double* b = weights.w13_bias.data() + l * N1;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = 0; n < N1; ++n) g1[r * N1 + n] += b[n];
    }

    // Activation.
    for (int64_t r = 0; r < rows; ++r) {
      const double* gr = g1.data() + r * N1;
      for (int64_t i = 0; i < I; ++i)
        act[r * I + i] = config.gated ? gated_activation(config, gr[i], gr[I + i]) : activation(config.activation, gr[i]);
    }
    if (w8a8) {
      const double* smooth = weights.act_smooth.data() + l * I;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < I; ++i) act[r * I + i] *= smooth[i];
    }

    // Stage 5: GEMM 2.
    if (fp8) {
      qact.resize(rows * I);
      fp8_quantize_rows(act, rows, I, fp8_group(config, I), qact.data());
      gemm(qact.data(), rows, I, w2, H, layout, y);
    } else if (!w8a8) {
      gemm(act, rows, I, w2, H, layout, y);
    } else {
      qact.assign(rows * I, 0.0);
      sact.assign(rows, 0.0);
      for (int64_t r = 0; r < rows; ++r) quantize_row(act + r * I, I, qact.data() + r * I, &sact[r]);
      gemm(qact.data(), rows, I, w2, H, layout, y);
      const double* ws = weights.w2_scale.data() + l * H;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < H; ++h) y[r * H + h] = y[r * H + h] * sact[r] * ws[h];
    }
    if (add_w2_bias) {
      const double* b = weights.w2_bias.data() + l * H;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < H; ++h) y[r * H + h] += b[h];
    }
  }

  // Stage 6: combine (+ residual).
  ex.out.assign(tokens * H, 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    double* o = ex.out.data() + t * H;
    for (int j = 0; j < KS; ++j) {
      const int pos = ix.pair_pos[t * KS + j];
      if (pos < 0) continue;
      const double w = j < K ? topk_weights[t * K + j] : 1.0;  // a fused shared expert weighs 1
      const double* yr = ex.y.data() + static_cast<int64_t>(pos) * H;
      for (int64_t h = 0; h < H; ++h) o[h] += w * yr[h];
    }
    if (!residual.empty())
      for (int64_t h = 0; h < H; ++h) o[h] += residual[t * H + h];
  }
  return ex;
}

Layer layer(const MoeConfig& config, int64_t tokens, const std::vector<double>& hidden,
            const std::vector<double>& logits, const std::vector<double>& bias, const Weights& weights,
            const std::vector<double>& residual) {
  Layer out;
  out.routing = route(config, tokens, logits, bias);
  out.experts = experts(config, tokens, hidden, out.routing.ids, out.routing.weights, weights, residual);
  return out;
}

std::vector<double> router_logits(const MoeConfig& c, int64_t tokens, const std::vector<double>& hidden,
                                  const std::vector<double>& gate_weight, const std::vector<double>& gate_bias) {
  const int64_t H = c.hidden, E = c.experts;
  if (static_cast<int64_t>(hidden.size()) != tokens * H || static_cast<int64_t>(gate_weight.size()) != E * H)
    throw std::invalid_argument("reference::router_logits: hidden must be [T, H] and gate_weight [E, H]");
  if (static_cast<int64_t>(gate_bias.size()) != (c.router_bias ? E : 0))
    throw std::invalid_argument("reference::router_logits: gate_bias must be [E] for router_bias layers and empty "
                                "otherwise");
  std::vector<double> logits(static_cast<size_t>(tokens * E));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < E; ++e) {
      double sum = 0.0;
      for (int64_t h = 0; h < H; ++h) sum += hidden[t * H + h] * gate_weight[e * H + h];
      logits[t * E + e] = c.router_bias ? sum + gate_bias[e] : sum;
    }
  return logits;
}

double relative_error(const std::vector<double>& ref, const std::vector<double>& got) {
  if (ref.size() != got.size())
    throw std::invalid_argument("moejit reference: relative_error of sizes " + std::to_string(ref.size()) +
                                " and " + std::to_string(got.size()));
  for (size_t i = 0; i < ref.size(); ++i)
    if (!std::isfinite(ref[i]) || !std::isfinite(got[i])) return INFINITY;
  // Divide by a power of two near the largest magnitude first (exact, barring subnormals) so that
  // neither got - ref nor the squares overflow.
  double amax = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) amax = std::max({amax, std::fabs(ref[i]), std::fabs(got[i])});
  if (amax == 0.0) return 0.0;  // both all zero (or empty)
  const double s = std::ldexp(1.0, std::ilogb(amax));
  std::vector<double> r(ref.size()), d(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    r[i] = ref[i] / s;
    d[i] = got[i] / s - r[i];
  }
  const double num = frobenius(d);
  const double den = frobenius(r);
  if (num == 0.0) return 0.0;
  if (den == 0.0) return INFINITY;  // ref is zero and got is not
  return num / den;
}

void quantize_row(const double* x, int64_t n, double* q, double* scale) {
  double amax = 0.0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const double sc = amax / 127.0;
  *scale = sc;
  for (int64_t i = 0; i < n; ++i) {
    if (sc == 0.0) {
      q[i] = 0.0;
      continue;
    }
    const double v = x[i] / sc;
    // Round half to even, independent of the floating-point rounding mode.
    double r = std::floor(v);
    const double frac = v - r;
    if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
    q[i] = std::clamp(r, -127.0, 127.0);
  }
}

void quantize_fp8_row(const double* x, int64_t n, int64_t group, double* q, double* scales) {
  if (group <= 0) throw std::invalid_argument("moejit reference: quantize_fp8_row group " + std::to_string(group));
  for (int64_t g0 = 0, g = 0; g0 < n; g0 += group, ++g) {
    const int64_t g1 = std::min(n, g0 + group);
    float amax = 0.0f;
    for (int64_t k = g0; k < g1; ++k) {
      const float v = std::fabs(static_cast<float>(x[k]));
      if (v > amax) amax = v;  // false for NaN: NaN does not enter amax
    }
    // The floor keeps an all-zero group's q at 0 instead of 0 / 0.
    const float s = std::max(amax, 1e-10f) / static_cast<float>(fp8::kE4m3Max);
    scales[g] = s;
    for (int64_t k = g0; k < g1; ++k) q[k] = fp8::round_e4m3(static_cast<float>(x[k]) / s);
  }
}

Weights dequantized_fp8(const MoeConfig& config, const Weights& weights) {
  validate(config);
  if (!is_fp8(config.quant))
    throw std::invalid_argument("moejit reference: dequantized_fp8 needs quant fp8_block or fp8_tensor, not " +
                                std::string(to_string(config.quant)));
  const int e_loc = config.gemm_experts();
  const int64_t H = config.hidden, I = config.local_intermediate(), N1 = config.gemm1_rows();
  const QuantTensorShapes shapes = quant_tensor_shapes(config);
  require_size("w13", weights.w13.size(), e_loc * N1 * H);
  require_size("w2", weights.w2.size(), e_loc * H * I);
  require_size("w13_scale", weights.w13_scale.size(), elements(shapes.w13_scale));
  require_size("w2_scale", weights.w2_scale.size(), elements(shapes.w2_scale));
  Weights out;
  out.w13.resize(weights.w13.size());
  out.w2.resize(weights.w2.size());
  // The expert biases are not quantized: the dequantized layer adds the same ones.
  out.w13_bias = weights.w13_bias;
  out.w2_bias = weights.w2_bias;
  for (int l = 0; l < e_loc; ++l) {
    dequantize_fp8_matrix(config.quant, weights.w13.data() + l * N1 * H, N1, H,
                          weights.w13_scale.data() + l * per_expert(shapes.w13_scale), out.w13.data() + l * N1 * H);
    dequantize_fp8_matrix(config.quant, weights.w2.data() + l * H * I, H, I,
                          weights.w2_scale.data() + l * per_expert(shapes.w2_scale), out.w2.data() + l * H * I);
  }
  return out;
}

}  // namespace moejit::reference
