#include "harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <sstream>

#include <fmt/format.h>

#include "common/fp8.h"
#include "compiler/families/grouped_gemm.h"

namespace moejit::test {

// ---------------------------------------------------------------------------------------------
// Elements.
Elem elem_of(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return Elem::BF16;
    case DType::FP16:
      return Elem::FP16;
    case DType::FP32:
      return Elem::FP32;
  }
  throw std::runtime_error("test harness: unknown dtype");
}

int elem_bytes(Elem elem) {
  switch (elem) {
    case Elem::BF16:
    case Elem::FP16:
      return 2;
    case Elem::FP32:
      return 4;
    case Elem::I8:
    case Elem::E4M3:
      return 1;
  }
  return 0;
}

float round_to(Elem elem, float v) {
  switch (elem) {
    case Elem::BF16:
      return bf16_to_float(float_to_bf16(v));
    case Elem::FP16:
      return half_to_float(float_to_half(v));
    case Elem::FP32:
      return v;
    case Elem::I8:
      return v;
    case Elem::E4M3:
      return static_cast<float>(fp8::round_e4m3(v));
  }
  return v;
}

void encode(Elem elem, float v, uint8_t* dst) {
  switch (elem) {
    case Elem::BF16: {
      const uint16_t b = float_to_bf16(v);
      std::memcpy(dst, &b, 2);
      return;
    }
    case Elem::FP16: {
      const uint16_t h = float_to_half(v);
      std::memcpy(dst, &h, 2);
      return;
    }
    case Elem::FP32:
      std::memcpy(dst, &v, 4);
      return;
    case Elem::I8: {
      if (v != std::nearbyint(v) || v < -128.0f || v > 127.0f)
        throw std::runtime_error(fmt::format("test harness: {} is not an int8 value", v));
      const int8_t q = static_cast<int8_t>(v);
      std::memcpy(dst, &q, 1);
      return;
    }
    case Elem::E4M3:
      *dst = fp8::encode_e4m3(v);
      return;
  }
}

double decode(Elem elem, const uint8_t* src) {
  switch (elem) {
    case Elem::BF16: {
      uint16_t b;
      std::memcpy(&b, src, 2);
      return bf16_to_float(b);
    }
    case Elem::FP16: {
      uint16_t h;
      std::memcpy(&h, src, 2);
      return half_to_float(h);
    }
    case Elem::FP32: {
      float f;
      std::memcpy(&f, src, 4);
      return f;
    }
    case Elem::I8:
      return static_cast<int8_t>(*src);
    case Elem::E4M3:
      return fp8::decode_e4m3(*src);
  }
  return 0;
}

std::vector<double> HostTensor::doubles(int64_t begin, int64_t end) const {
  std::vector<double> v(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) v[i - begin] = at(i);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Seeds.
uint64_t base_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("MOEJIT_GPU_TEST_SEED");
    uint64_t s = 0;
    if (env && std::string(env) == "random") {
      s = static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
    } else if (env && *env) {
      s = std::strtoull(env, nullptr, 0);
    }
    std::fprintf(stderr, "moejit gpu tests: base seed %llu (set MOEJIT_GPU_TEST_SEED to change it)\n",
                 static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::string current_test_name() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (!info) return "no-test";
  return std::string(info->test_suite_name()) + "." + info->name();
}

std::string Seeds::how_to_reproduce() const {
  // Each test's draws depend only on the base seed and the test's name, so rerunning the one
  // test with the same base seed reproduces every draw it made.
  return fmt::format("MOEJIT_GPU_TEST_SEED={} moejit_gpu_tests --gtest_filter='{}'", base_seed(), name_);
}

// ---------------------------------------------------------------------------------------------
// Problems.
std::string short_config(const MoeConfig& c) {
  std::string s = fmt::format("E={} K={}", c.experts, c.topk);
  if (c.num_expert_group > 1) s += fmt::format(" G={}/{}", c.num_expert_group, c.topk_group);
  s += fmt::format(" {} {}{} scale={:.4g} H={} I={}", to_string(c.scoring), to_string(c.topk_method),
                   c.renormalize ? " renorm" : "", c.routed_scaling_factor, c.hidden, c.local_intermediate());
  if (c.tp_size > 1) s += fmt::format(" (tp {}/{})", c.tp_rank, c.tp_size);
  s += fmt::format(" {} router={} {} {}{} {}", to_string(c.dtype), to_string(c.router_dtype), to_string(c.quant),
                   to_string(c.activation), c.gated ? " gated" : " plain", to_string(c.weight_layout));
  if (c.ep_size > 1) s += fmt::format(" ep={}/{}", c.ep_rank, c.ep_size);
  return s;
}

std::string Problem::describe() const {
  const std::string scales = fp8() && options.fp8_scale_max > 0
                                 ? fmt::format(" fp8 scales {:g}..{:g}", options.fp8_scale_min, options.fp8_scale_max)
                                 : "";
  return fmt::format("[{} T={}{}{} seed={:#x}/{:#x}] reproduce: {}", short_config(config), tokens,
                     residual.count ? " residual" : "", scales, seed, activation_seed, reproduce);
}

Problem Problem::for_rank(int ep_size, int ep_rank) const {
  Problem p = *this;
  p.config.ep_size = ep_size;
  p.config.ep_rank = ep_rank;
  return p;
}

namespace {

void fill_activations(Problem& p) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden, E = c.experts;
  // Hidden ~ U(-sqrt3, sqrt3): unit variance, so with weights scaled by 1/sqrt(fan_in) every
  // stage's values stay O(1) whatever H and I are.
  p.hidden = HostTensor(elem_of(c.dtype), T * H);
  const CounterRng hidden_rng(p.activation_seed, static_cast<uint64_t>(Tensor::Hidden));
  parallel_for(
      T * H,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          p.hidden.set(i, static_cast<float>(hidden_rng.uniform(i, -1.7320508, 1.7320508)));
      },
      1 << 16);

  if (p.options.residual) {
    p.residual = HostTensor(elem_of(c.dtype), T * H);
    const CounterRng rng(p.activation_seed, static_cast<uint64_t>(Tensor::Residual));
    parallel_for(
        T * H,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) p.residual.set(i, static_cast<float>(rng.uniform(i, -1.0, 1.0)));
        },
        1 << 16);
  } else {
    p.residual = HostTensor();
  }

  // Logits ~ U(-4, 4), rounded to the router dtype; with distinct_logits, equal values in a row
  // are redrawn (bf16 has only 128 values per binade, so a 512-expert row has many equal pairs,
  // and every one would make the reference call the token a near tie).
  const Elem le = elem_of(c.router_dtype);
  p.logits = HostTensor(le, T * E);
  parallel_for(
      T,
      [&](int64_t b, int64_t e) {
        std::vector<float> row(E);
        std::vector<int> order(E);
        for (int64_t t = b; t < e; ++t) {
          const CounterRng first(p.activation_seed, static_cast<uint64_t>(Tensor::Logits));
          for (int64_t x = 0; x < E; ++x)
            row[x] = round_to(le, static_cast<float>(first.uniform(t * E + x, -4.0, 4.0)));
          for (int attempt = 1; p.options.distinct_logits && attempt < 200; ++attempt) {
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(),
                      [&](int a, int z) { return row[a] < row[z] || (row[a] == row[z] && a < z); });
            bool redrawn = false;
            const CounterRng again(p.activation_seed, static_cast<uint64_t>(Tensor::Logits) + 1000u * attempt);
            for (int64_t k = 1; k < E; ++k) {
              if (row[order[k]] == row[order[k - 1]]) {
                row[order[k]] = round_to(le, static_cast<float>(again.uniform(t * E + order[k], -4.0, 4.0)));
                redrawn = true;
              }
            }
            if (!redrawn) break;
          }
          for (int64_t x = 0; x < E; ++x) p.logits.set(t * E + x, row[x]);
        }
      },
      64);
}

uint64_t slice_id(Tensor t, int expert) { return (static_cast<uint64_t>(t) << 32) | static_cast<uint32_t>(expert); }

// The blocks of one expert's fp8 matrix (W13 [N1, H] or W2 [H, I]): 128 x 128 for fp8_block, the
// whole matrix for fp8_tensor. Block b's e4m3 values are normal draws times magnitude[b] and its
// fp32 scale is scale[b] (ProblemOptions::fp8_scale_min says how the two are drawn). The weight
// and the scale generators both derive them from the scale tensor's seed, so they agree.
struct Fp8Blocks {
  int64_t cols = 0, rows_per_block = 1, cols_per_block = 1, col_blocks = 1;
  std::vector<double> magnitude;
  std::vector<float> scale;
};

Fp8Blocks fp8_blocks(const Problem& p, Tensor matrix, int global_expert) {
  const MoeConfig& c = p.config;
  const bool w13 = matrix == Tensor::W13 || matrix == Tensor::W13Scale;
  const int64_t rows = w13 ? c.gemm1_rows() : c.hidden, cols = w13 ? c.hidden : c.local_intermediate();
  const bool block = c.quant == Quant::Fp8Block;
  Fp8Blocks b;
  b.cols = cols;
  b.rows_per_block = block ? kFp8BlockSize : rows;
  b.cols_per_block = block ? kFp8BlockSize : cols;
  b.col_blocks = (cols + b.cols_per_block - 1) / b.cols_per_block;
  const int64_t count = (rows + b.rows_per_block - 1) / b.rows_per_block * b.col_blocks;
  // The dequantized weights' standard deviation: unit-variance GEMM outputs for unit-variance inputs.
  const double target = 1.0 / std::sqrt(static_cast<double>(cols));
  const CounterRng rng(p.seed, slice_id(w13 ? Tensor::W13Scale : Tensor::W2Scale, global_expert));
  const double lo = p.options.fp8_scale_min, hi = p.options.fp8_scale_max;
  b.magnitude.resize(count);
  b.scale.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    if (hi > 0) {
      b.scale[i] = static_cast<float>(std::exp(rng.uniform(i, std::log(lo), std::log(hi))));
      b.magnitude[i] = std::clamp(target / b.scale[i], 0x1.0p-6, 0x1.0p6);
    } else {
      b.magnitude[i] = std::exp2(rng.uniform(i, -5.0, 7.0));
      b.scale[i] = static_cast<float>(target / b.magnitude[i]);
    }
  }
  return b;
}

// The values of one global expert's slice of a per-expert tensor, before rounding to the storage
// type (parameters hoisted out of the per-element loop: the full-size presets draw 37 G values).
struct WeightGen {
  enum class Kind { Uniform, Int8, Fp8Weight, Fp8Scale };
  CounterRng rng;
  Kind kind = Kind::Uniform;
  double lo = -1, hi = 1, scale = 1;
  Fp8Blocks fp8 = {};
  float operator()(int64_t i) const {
    switch (kind) {
      case Kind::Uniform:
        break;
      case Kind::Int8:
        return static_cast<float>(static_cast<int>(rng.bits(i) % 255u) - 127);
      case Kind::Fp8Weight: {
        const int64_t row = i / fp8.cols, col = i % fp8.cols;
        const int64_t b = row / fp8.rows_per_block * fp8.col_blocks + col / fp8.cols_per_block;
        return static_cast<float>(normal(i) * fp8.magnitude[b]);
      }
      case Kind::Fp8Scale:
        return fp8.scale[i];
    }
    return static_cast<float>(rng.uniform(i, lo, hi) * scale);
  }
  // A standard normal draw (Box-Muller on the two 32-bit halves of one draw; |z| < 6.8).
  double normal(int64_t i) const {
    const uint64_t bits = rng.bits(i);
    const double u1 = (static_cast<double>(bits >> 32) + 0.5) * 0x1.0p-32;
    const double u2 = static_cast<double>(bits & 0xffffffffu) * 0x1.0p-32;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

WeightGen weight_gen(const Problem& p, Tensor t, int global_expert) {
  const MoeConfig& c = p.config;
  const double H = static_cast<double>(c.hidden), I = static_cast<double>(c.local_intermediate());
  const bool w8a8 = c.quant == Quant::W8A8Int8;
  WeightGen g{CounterRng(p.seed, slice_id(t, global_expert))};
  if (p.fp8() && (t == Tensor::W13 || t == Tensor::W2 || t == Tensor::W13Scale || t == Tensor::W2Scale)) {
    g.kind = t == Tensor::W13 || t == Tensor::W2 ? WeightGen::Kind::Fp8Weight : WeightGen::Kind::Fp8Scale;
    g.fp8 = fp8_blocks(p, t, global_expert);
    return g;
  }
  switch (t) {
    // w ~ U(-1,1) * sqrt(3/fan_in): unit-variance GEMM outputs for unit-variance inputs.
    case Tensor::W13:
      if (w8a8) g.kind = WeightGen::Kind::Int8;
      g.scale = std::sqrt(3.0 / H);
      return g;
    case Tensor::W2:
      if (w8a8) g.kind = WeightGen::Kind::Int8;
      g.scale = std::sqrt(3.0 / I);
      return g;
    // Per-channel scales that vary by a factor 3, so a kernel that used the wrong channel's scale
    // (or none) is far off; int8 weights times scale ~ U(-1,1) * sqrt(3/fan_in) again.
    case Tensor::W13Scale:
      g.lo = 0.5;
      g.hi = 1.5;
      g.scale = std::sqrt(3.0 / H) / 127.0;
      return g;
    case Tensor::W2Scale:
      g.lo = 0.5;
      g.hi = 1.5;
      g.scale = std::sqrt(3.0 / I) / 127.0;
      return g;
    case Tensor::ActSmooth:
      g.lo = 0.5;
      g.hi = 2.0;
      return g;
    // Expert biases (expert_bias) of the GEMM outputs' size, so a missing or misplaced bias is
    // far off: U(-1, 1).
    case Tensor::W13Bias:
    case Tensor::W2Bias:
      return g;
    default:
      break;
  }
  throw std::runtime_error("test harness: not a per-expert weight tensor");
}

}  // namespace

Problem make_problem(const MoeConfig& config, int64_t tokens, uint64_t seed, const std::string& reproduce,
                     const ProblemOptions& options) {
  validate(config);
  if (is_fp8(config.quant) && options.fp8_scale_max > 0 &&
      !(options.fp8_scale_min > 0 && options.fp8_scale_min <= options.fp8_scale_max))
    throw std::runtime_error(fmt::format("test harness: fp8_scale_min {} and fp8_scale_max {} are not a range of "
                                         "positive scales",
                                         options.fp8_scale_min, options.fp8_scale_max));
  Problem p;
  p.config = config;
  p.tokens = tokens;
  p.seed = seed;
  p.activation_seed = mix_seed(seed, 0xac71u);
  p.reproduce = reproduce;
  p.options = options;
  fill_activations(p);
  const int E = config.experts;
  const int64_t H = config.hidden;
  if (p.noaux()) {
    // The correction bias moves the selection but not the weights; sized like the scores it
    // corrects (sigmoid scores are in (0, 1); softmax scores are about 1/E).
    const CounterRng rng(seed, static_cast<uint64_t>(Tensor::Bias));
    const double spread = config.scoring == Scoring::Sigmoid ? 0.3 : 1.0 / E;
    p.bias.resize(E);
    for (int e = 0; e < E; ++e) p.bias[e] = static_cast<float>(rng.uniform(e, -spread, spread));
  }
  if (p.w8a8()) {
    const CounterRng rng(seed, static_cast<uint64_t>(Tensor::InputSmooth));
    // Rows E.. are the fused shared experts' (global experts E + s).
    const int64_t rows = E + config.shared_slots();
    p.input_smooth.resize(static_cast<size_t>(rows * H));
    for (int64_t i = 0; i < rows * H; ++i) p.input_smooth[i] = static_cast<float>(rng.uniform(i, 0.5, 2.0));
  }
  return p;
}

void redraw_activations(Problem& p, uint64_t seed) {
  p.activation_seed = seed;
  fill_activations(p);
}

Elem weight_elem(const MoeConfig& c, Tensor t) {
  if (t == Tensor::W13 || t == Tensor::W2)
    return c.quant == Quant::W8A8Int8 ? Elem::I8 : is_fp8(c.quant) ? Elem::E4M3 : elem_of(c.dtype);
  return Elem::FP32;
}

int64_t expert_elems(const MoeConfig& c, Tensor t) {
  const int64_t H = c.hidden, I = c.local_intermediate(), N1 = c.gemm1_rows();
  // [E_loc, ...] -> the product of the dimensions after the first; an absent tensor has none.
  auto per_expert = [](const std::vector<int64_t>& shape) {
    if (shape.empty()) return int64_t{0};
    int64_t n = 1;
    for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
    return n;
  };
  switch (t) {
    case Tensor::W13:
      return N1 * H;
    case Tensor::W2:
      return H * I;
    case Tensor::W13Scale:
      return per_expert(quant_tensor_shapes(c).w13_scale);
    case Tensor::W2Scale:
      return per_expert(quant_tensor_shapes(c).w2_scale);
    case Tensor::ActSmooth:
      return per_expert(quant_tensor_shapes(c).act_smooth);
    case Tensor::W13Bias:
      return c.expert_bias ? N1 : 0;
    case Tensor::W2Bias:
      return c.expert_bias ? H : 0;
    default:
      return 0;
  }
}

void expert_bytes(const Problem& p, Tensor t, int global_expert, uint8_t* dst) {
  const Elem elem = weight_elem(p.config, t);
  const WeightGen gen = weight_gen(p, t, global_expert);
  const int64_t n = expert_elems(p.config, t);
  switch (elem) {  // one loop per storage type, no per-element dispatch
    case Elem::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = float_to_bf16(gen(i));
        std::memcpy(dst + 2 * i, &b, 2);
      }
      return;
    case Elem::FP16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = float_to_half(gen(i));
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case Elem::FP32:
      for (int64_t i = 0; i < n; ++i) {
        const float f = gen(i);
        std::memcpy(dst + 4 * i, &f, 4);
      }
      return;
    case Elem::I8:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(static_cast<int8_t>(gen(i)));
      return;
    case Elem::E4M3:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp8::encode_e4m3(gen(i));
      return;
  }
}

void expert_doubles(const Problem& p, Tensor t, int global_expert, double* dst) {
  const Elem elem = weight_elem(p.config, t);
  const WeightGen gen = weight_gen(p, t, global_expert);
  const int64_t n = expert_elems(p.config, t);
  for (int64_t i = 0; i < n; ++i) dst[i] = round_to(elem, gen(i));
}

int64_t weight_elements(const MoeConfig& c) {
  return static_cast<int64_t>(c.gemm_experts()) * (expert_elems(c, Tensor::W13) + expert_elems(c, Tensor::W2));
}

int global_expert_of_local(const MoeConfig& c, int local) {
  return local < c.local_experts() ? c.first_local_expert() + local : c.experts + (local - c.local_experts());
}

reference::Weights reference_weights(const Problem& p) {
  const MoeConfig& c = p.config;
  const int e_loc = c.gemm_experts();
  reference::Weights w;
  auto fill = [&](std::vector<double>& v, Tensor t) {
    const int64_t n = expert_elems(c, t);
    v.assign(static_cast<size_t>(e_loc * n), 0.0);
    parallel_for(e_loc, [&](int64_t b, int64_t e) {
      for (int64_t l = b; l < e; ++l)
        expert_doubles(p, t, global_expert_of_local(c, static_cast<int>(l)), v.data() + l * n);
    });
  };
  fill(w.w13, Tensor::W13);
  fill(w.w2, Tensor::W2);
  if (p.w8a8()) {
    fill(w.w13_scale, Tensor::W13Scale);
    fill(w.w2_scale, Tensor::W2Scale);
    fill(w.act_smooth, Tensor::ActSmooth);
    w.input_smooth.assign(p.input_smooth.begin(), p.input_smooth.end());
  }
  if (p.fp8()) {
    fill(w.w13_scale, Tensor::W13Scale);
    fill(w.w2_scale, Tensor::W2Scale);
  }
  if (c.expert_bias) {
    fill(w.w13_bias, Tensor::W13Bias);
    fill(w.w2_bias, Tensor::W2Bias);
  }
  return w;
}

// ---------------------------------------------------------------------------------------------
// Device side.
LayerInputs DeviceInputs::inputs() const {
  LayerInputs in;
  in.hidden = hidden.get();
  in.router_logits = gate_weight.get() ? nullptr : logits.get();
  in.gate_weight = gate_weight.get();
  in.gate_bias = gate_bias.get();
  in.w13 = w13.get();
  in.w2 = w2.get();
  in.e_score_correction_bias = bias.as<float>();
  in.w13_scale = w13_scale.as<float>();
  in.w2_scale = w2_scale.as<float>();
  in.input_smooth = input_smooth.as<float>();
  in.act_smooth = act_smooth.as<float>();
  in.residual = residual.get();
  in.w13_bias = w13_bias.as<float>();
  in.w2_bias = w2_bias.as<float>();
  return in;
}

namespace {

DeviceBuffer upload_bytes(const void* src, size_t bytes) {
  DeviceBuffer b(bytes);
  b.upload(src, bytes);
  return b;
}

}  // namespace

DeviceBuffer upload_tensor(const HostTensor& t) { return upload_bytes(t.bytes.data(), t.bytes.size()); }

namespace {

// One rank's slice of a per-expert tensor, generated expert by expert on every host core.
DeviceBuffer upload_weight(const Problem& p, Tensor t) {
  const MoeConfig& c = p.config;
  const int e_loc = c.gemm_experts();
  const size_t slice = static_cast<size_t>(expert_elems(c, t)) * elem_bytes(weight_elem(c, t));
  DeviceBuffer d(slice * e_loc);
  parallel_for(e_loc, [&](int64_t b, int64_t e) {
    std::vector<uint8_t> staging(slice);
    for (int64_t l = b; l < e; ++l) {
      expert_bytes(p, t, global_expert_of_local(c, static_cast<int>(l)), staging.data());
      d.upload(staging.data(), slice, l * slice);
    }
  });
  return d;
}

}  // namespace

DeviceInputs upload(const Problem& p) {
  DeviceInputs d;
  d.hidden = upload_bytes(p.hidden.bytes.data(), p.hidden.bytes.size());
  d.logits = upload_bytes(p.logits.bytes.data(), p.logits.bytes.size());
  if (p.residual.count) d.residual = upload_bytes(p.residual.bytes.data(), p.residual.bytes.size());
  if (p.noaux()) d.bias = upload_bytes(p.bias.data(), p.bias.size() * 4);
  d.w13 = upload_weight(p, Tensor::W13);
  d.w2 = upload_weight(p, Tensor::W2);
  if (p.w8a8()) {
    d.w13_scale = upload_weight(p, Tensor::W13Scale);
    d.w2_scale = upload_weight(p, Tensor::W2Scale);
    d.act_smooth = upload_weight(p, Tensor::ActSmooth);
    d.input_smooth = upload_bytes(p.input_smooth.data(), p.input_smooth.size() * 4);
  }
  if (p.fp8()) {
    d.w13_scale = upload_weight(p, Tensor::W13Scale);
    d.w2_scale = upload_weight(p, Tensor::W2Scale);
  }
  if (p.config.expert_bias) {
    d.w13_bias = upload_weight(p, Tensor::W13Bias);
    d.w2_bias = upload_weight(p, Tensor::W2Bias);
  }
  return d;
}

void upload_activations(const Problem& p, DeviceInputs& d, cudaStream_t stream) {
  auto copy = [&](DeviceBuffer& b, const HostTensor& h) {
    if (b.size() != h.bytes.size()) throw std::runtime_error("test harness: activation buffer size changed");
    if (!h.bytes.empty())
      CUDA_CHECK(cudaMemcpyAsync(b.get(), h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice, stream));
  };
  copy(d.hidden, p.hidden);
  copy(d.logits, p.logits);
  if (p.residual.count) copy(d.residual, p.residual);
}

double GpuRun::out_at(int64_t i) const {
  const Elem e = elem_of(config.dtype);
  return decode(e, out.data() + i * elem_bytes(e));
}

std::vector<uint8_t> GpuRun::raw(int64_t offset, size_t bytes) const {
  if (offset < 0) throw std::runtime_error("test harness: reading a workspace buffer this config does not have");
  if (!host_workspace.empty()) {
    if (static_cast<size_t>(offset) + bytes > host_workspace.size())
      throw std::runtime_error("test harness: read past the host workspace");
    return std::vector<uint8_t>(host_workspace.begin() + offset, host_workspace.begin() + offset + bytes);
  }
  std::vector<uint8_t> v(bytes);
  workspace_buffer.download(v.data(), bytes, static_cast<size_t>(offset));
  return v;
}

std::vector<double> GpuRun::rows_of(const char* which, int64_t begin, int64_t end) const {
  // Quantized layers keep the activation in fp32 (act_f32) for its re-quantization, unless GEMM 1
  // quantized it itself.
  const bool quantized = is_quantized(config.quant);
  const bool act = std::string(which) == "act";
  if (act && gemm1_quantized_act) {
    const int64_t cols = config.local_intermediate(), groups = activation_scale_groups(config, cols);
    const std::vector<uint8_t> q = raw(offsets.act_q + begin * cols, static_cast<size_t>((end - begin) * cols));
    const std::vector<uint8_t> s = raw(offsets.act_scale + begin * groups * 4, static_cast<size_t>((end - begin) * groups * 4));
    std::vector<double> v(static_cast<size_t>((end - begin) * cols));
    for (int64_t r = 0; r < end - begin; ++r)
      for (int64_t col = 0; col < cols; ++col) {
        float scale;
        std::memcpy(&scale, s.data() + (r * groups + col / kFp8BlockSize) * 4, 4);
        v[r * cols + col] = fp8::decode_e4m3(q[r * cols + col]) * static_cast<double>(scale);
      }
    return v;
  }
  const int64_t offset = act ? (quantized ? offsets.act_f32 : offsets.act) : offsets.y;
  if (offset < 0)
    throw std::runtime_error(
        fmt::format("workspace_offsets() gives no '{}' buffer for this config ({}); the test "
                    "reads it to check the stage",
                    act ? (quantized ? "act_f32" : "act") : "y", short_config(config)));
  const int64_t cols = act ? config.local_intermediate() : config.hidden;
  const Elem elem = act && quantized ? Elem::FP32 : elem_of(config.dtype);
  const int eb = elem_bytes(elem);
  std::vector<uint8_t> bytes = raw(offset + begin * cols * eb, static_cast<size_t>((end - begin) * cols * eb));
  std::vector<double> v(static_cast<size_t>((end - begin) * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = decode(elem, bytes.data() + i * eb);
  return v;
}

void download_results(GpuRun& r) {
  const MoeConfig& c = r.config;
  // The routing's [T, K]; the index's pairs and experts count the fused shared experts (K', E_loc + S).
  const int64_t M = r.tokens * c.topk, pairs = r.tokens * c.pair_slots();
  const int e_loc = c.gemm_experts();
  r.offsets = workspace_offsets(c, r.tokens);
  r.out.resize(r.out_bytes);
  r.out_buffer.download(r.out.data(), r.out_bytes);
  std::vector<uint8_t> guard(kGuardBytes);
  r.out_buffer.download(guard.data(), kGuardBytes, r.out_bytes);
  r.out_guard_intact = std::all_of(guard.begin(), guard.end(), [&](uint8_t b) { return b == r.poison; });
  r.workspace_buffer.download(guard.data(), kGuardBytes, r.workspace_bytes);
  r.workspace_guard_intact = std::all_of(guard.begin(), guard.end(), [&](uint8_t b) { return b == r.poison; });
  if (r.tokens == 0) return;
  auto ints = [&](int64_t offset, int64_t n) {
    std::vector<int> v(static_cast<size_t>(n));
    r.workspace_buffer.download(v.data(), n * 4, static_cast<size_t>(offset));
    return v;
  };
  r.topk_ids = ints(r.offsets.topk_ids, M);
  r.topk_weights.resize(M);
  r.workspace_buffer.download(r.topk_weights.data(), M * 4, static_cast<size_t>(r.offsets.topk_weights));
  r.counts = ints(r.offsets.expert_counts, e_loc);
  r.expert_offsets = ints(r.offsets.expert_offsets, e_loc + 1);
  r.sorted_pair = ints(r.offsets.sorted_pair, pairs);
  r.pair_pos = ints(r.offsets.pair_pos, pairs);
  const int64_t rows = r.expert_offsets[e_loc];
  r.rows = rows >= 0 && rows <= pairs ? rows : -1;
}

// Whether the layer's GEMM 1 quantizes its output at this token count (its bucket's tile).
bool gemm1_quantizes_act(const Layer& layer, int64_t tokens) {
  const Plan* plan = layer.plan();
  return plan != nullptr && tokens > 0 && gemm1_quantizes_output(layer.config(), plan->bucket_for(tokens).gemm1);
}

GpuRun run_forward(const Layer& layer, const DeviceInputs& in, int64_t tokens, cudaStream_t stream, uint8_t poison) {
  GpuRun r;
  r.config = layer.config();
  r.tokens = tokens;
  r.gemm1_quantized_act = gemm1_quantizes_act(layer, tokens);
  r.poison = poison;
  r.out_bytes = static_cast<size_t>(tokens * r.config.hidden * dtype_bytes(r.config.dtype));
  r.workspace_bytes = layer.workspace_bytes(tokens);
  r.out_buffer = DeviceBuffer(r.out_bytes + kGuardBytes);
  r.workspace_buffer = DeviceBuffer(r.workspace_bytes + kGuardBytes);
  // Poison everything, so an element the layer does not write reads as NaN (or -1).
  r.out_buffer.fill(poison, stream);
  r.workspace_buffer.fill(poison, stream);
  layer.forward(stream, tokens, in.inputs(), r.out_buffer.get(), r.workspace_buffer.get(), r.workspace_bytes);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaGetLastError());
  download_results(r);
  return r;
}

GpuRun run_experts(const Layer& layer, const DeviceInputs& in, int64_t tokens, const std::vector<int>& ids,
                   const std::vector<float>& weights, cudaStream_t stream) {
  GpuRun r;
  r.config = layer.config();
  r.tokens = tokens;
  r.gemm1_quantized_act = gemm1_quantizes_act(layer, tokens);
  r.out_bytes = static_cast<size_t>(tokens * r.config.hidden * dtype_bytes(r.config.dtype));
  r.workspace_bytes = layer.workspace_bytes(tokens);
  r.out_buffer = DeviceBuffer(r.out_bytes + kGuardBytes);
  r.workspace_buffer = DeviceBuffer(r.workspace_bytes + kGuardBytes);
  DeviceBuffer d_ids(ids.size() * 4), d_weights(weights.size() * 4);
  d_ids.upload(ids.data(), ids.size() * 4);
  d_weights.upload(weights.data(), weights.size() * 4);
  r.out_buffer.fill(r.poison, stream);
  r.workspace_buffer.fill(r.poison, stream);
  layer.experts(stream, tokens, d_ids.as<int>(), d_weights.as<float>(), in.inputs(), r.out_buffer.get(),
                r.workspace_buffer.get(), r.workspace_bytes);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaGetLastError());
  download_results(r);
  r.topk_ids = ids;  // the workspace's routing buffers are not used by experts()
  r.topk_weights = weights;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Checks.
Tolerances tolerances_for(const MoeConfig& c) {
  // SPEC.md: relative Frobenius error against float64 on the same rounded inputs. act and y are
  // stored in the model dtype, so for bf16/fp16 they carry one rounding each (about 2^-9
  // relative for bf16) and get the layer's tolerance; fp32 stores exact fp32 results.
  // Quantized: against the reference that quantizes the activations by the same rule (SPEC.md).
  if (c.quant == Quant::W8A8Int8) return {5e-2, 5e-2, 5e-2, 5e-2};
  // fp8_tensor's GEMMs keep an output's whole K in the tensor cores' accumulator (no promotion
  // into fp32 registers per K block as fp8_block's: the "fast accumulation" of the per-tensor fp8
  // GEMMs in vLLM and TensorRT-LLM), whose additions keep fewer bits than fp32, so the error grows
  // with K: y 2.14e-2 at H = 16400 on the H200 (Sanitize.QuantizeRowsPastTheRegisterPath, act
  // 4.4e-3). Past K = 8192 the tolerance grows as sqrt(K / 8192).
  if (c.quant == Quant::Fp8Tensor) {
    const double k = static_cast<double>(std::max(c.hidden, c.local_intermediate()));
    const double t = 2e-2 * std::max(1.0, std::sqrt(k / 8192.0));
    return {t, t, t, t};
  }
  if (is_fp8(c.quant)) return {2e-2, 2e-2, 2e-2, 2e-2};
  if (c.dtype == DType::FP32) return {1e-5, 1e-5, 1e-5, 1e-5};
  return {2e-2, 2e-2, 2e-2, 2e-2};
}

namespace {

// Collects failures of one check with a few examples each, and reports them with the problem.
class Failures {
 public:
  explicit Failures(const Problem& p) : context_(p.describe()) {}
  void add(const std::string& what) {
    ok_ = false;
    ADD_FAILURE() << what << "\n  problem: " << context_;
  }
  bool ok() const { return ok_; }

 private:
  std::string context_;
  bool ok_ = true;
};

struct Examples {
  int64_t count = 0;
  std::string text;
  void add(const std::string& example) {
    if (count++ < 4) text += "\n    " + example;
  }
};

std::string join(const int* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s + "]";
}

bool ids_in_range(const Problem& p, const GpuRun& run) {
  for (int id : run.topk_ids)
    if (id < 0 || id >= p.config.experts) return false;
  return true;
}

// Row quantization compared with the reference's (reference::quantize_row) on the same row:
// the scale must agree to fp32 rounding, and q may differ by one step only where x / scale lands
// within fp32 rounding of a .5 boundary, which is rare.
void compare_quantized(const std::vector<double>& x, const int8_t* q_gpu, float scale_gpu, const char* what,
                       int64_t pos, Examples& scale_bad, Examples& q_far, int64_t& q_off_by_one) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> q(n);
  double scale = 0;
  reference::quantize_row(x.data(), n, q.data(), &scale);
  if (!(std::fabs(scale_gpu - scale) <= 1e-6 * scale))
    scale_bad.add(fmt::format("{} row {}: scale {} vs reference {}", what, pos, scale_gpu, scale));
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(q_gpu[i] - q[i]);
    if (d > 1) q_far.add(fmt::format("{} row {} col {}: q {} vs reference {}", what, pos, i, int(q_gpu[i]), q[i]));
    if (d == 1) ++q_off_by_one;
  }
}

// An e4m3 code's place on the number line: the codes of one sign are ordered by magnitude, so the
// difference of two places counts the representable values between them (+0 and -0 are one).
int e4m3_place(uint8_t code) { return (code & 0x80) ? -(code & 0x7f) : (code & 0x7f); }

// The e4m3 steps between two codes; NaN matches only NaN.
int e4m3_steps(uint8_t a, uint8_t b) {
  const bool a_nan = (a & 0x7f) == 0x7f, b_nan = (b & 0x7f) == 0x7f;
  if (a_nan || b_nan) return a_nan && b_nan ? 0 : 1000;
  return std::abs(e4m3_place(a) - e4m3_place(b));
}

// fp8 quantization of one row (per `group` columns) compared with reference::quantize_fp8_row on
// the same values: the scales must agree to fp32 rounding (both compute max(amax, 1e-10) / 448 in
// fp32), and a code may be one e4m3 step off only where x / s lands within fp32 rounding of a
// rounding boundary (an approximate division), which is rare.
void compare_fp8(const std::vector<double>& x, const uint8_t* q_gpu, const float* scale_gpu, int64_t group,
                 const char* what, int64_t row, Examples& scale_bad, Examples& q_far, int64_t& q_off_by_one) {
  const int64_t n = static_cast<int64_t>(x.size()), groups = (n + group - 1) / group;
  std::vector<double> q(n), scale(groups);
  reference::quantize_fp8_row(x.data(), n, group, q.data(), scale.data());
  for (int64_t g = 0; g < groups; ++g)
    if (!(std::fabs(scale_gpu[g] - scale[g]) <= 1e-6 * scale[g]))
      scale_bad.add(fmt::format("{} row {} group {}: scale {} vs reference {}", what, row, g, scale_gpu[g], scale[g]));
  for (int64_t i = 0; i < n; ++i) {
    const int d = e4m3_steps(q_gpu[i], fp8::encode_e4m3(q[i]));
    if (d > 1)
      q_far.add(fmt::format("{} row {} col {}: q {} (0x{:02x}) vs reference {}", what, row, i,
                            fp8::decode_e4m3(q_gpu[i]), q_gpu[i], q[i]));
    if (d == 1) ++q_off_by_one;
  }
}

// A row the GPU computed and quantized itself (GEMM 1 quantizing its output), against the
// reference's row x of the same math: the GPU's values carry GEMM 1's fp32 error (about 1e-3 of a
// group's largest value, measured), so the scales are held within kScaleRel of x's, and each
// dequantized value within e4m3's rounding of |x| (2^-4 relative, 2^-10 of the scale for
// subnormals) plus kGemmRel of the group's amax.
void compare_fp8_near(const std::vector<double>& x, const uint8_t* q_gpu, const float* scale_gpu, int64_t group,
                      const char* what, int64_t row, Examples& scale_bad, Examples& q_far) {
  constexpr double kScaleRel = 5e-3, kGemmRel = 5e-3;
  const int64_t n = static_cast<int64_t>(x.size()), groups = (n + group - 1) / group;
  std::vector<double> q(n), scale(groups);
  reference::quantize_fp8_row(x.data(), n, group, q.data(), scale.data());
  for (int64_t g = 0; g < groups; ++g)
    if (!(std::fabs(scale_gpu[g] - scale[g]) <= kScaleRel * scale[g]))
      scale_bad.add(fmt::format("{} row {} group {}: scale {} vs reference {}", what, row, g, scale_gpu[g], scale[g]));
  for (int64_t i = 0; i < n; ++i) {
    const double s = scale_gpu[i / group], got = fp8::decode_e4m3(q_gpu[i]) * s;
    const double allowed = std::fabs(x[i]) / 16 + s / 1024 + kGemmRel * fp8::kE4m3Max * s;
    if (!(std::fabs(got - x[i]) <= allowed))
      q_far.add(fmt::format("{} row {} col {}: {} (q 0x{:02x} x scale {}) vs reference {}", what, row, i, got, q_gpu[i],
                            s, x[i]));
  }
}

std::vector<float> floats_of(const std::vector<uint8_t>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

}  // namespace

bool check_invariants(const Problem& p, const GpuRun& run, bool routed) {
  Failures f(p);
  const MoeConfig& c = p.config;
  const int K = c.topk, E = c.experts;
  if (!run.out_guard_intact) f.add("forward wrote past the end of the output (guard bytes changed)");
  if (!run.workspace_guard_intact)
    f.add(fmt::format("forward wrote past workspace_bytes({}) (guard bytes changed)", run.tokens));
  if (run.tokens == 0) return f.ok();
  Examples bad_ids, bad_weights;
  for (int64_t t = 0; t < run.tokens; ++t) {
    const int* ids = run.topk_ids.data() + t * K;
    bool row_ok = true;
    for (int j = 0; j < K && routed; ++j) {
      if (ids[j] < 0 || ids[j] >= E) row_ok = false;
      for (int i = 0; i < j; ++i)
        if (ids[i] == ids[j]) row_ok = false;
    }
    if (!row_ok) bad_ids.add(fmt::format("token {}: ids {}", t, join(ids, K)));
    for (int j = 0; j < K; ++j)
      if (!std::isfinite(run.topk_weights[t * K + j]))
        bad_weights.add(fmt::format("token {} slot {}: weight {}", t, j, run.topk_weights[t * K + j]));
  }
  if (bad_ids.count)
    f.add(fmt::format("topk_ids: {} tokens have an id outside [0, {}) or a repeated id:{}", bad_ids.count, E,
                      bad_ids.text));
  if (bad_weights.count) f.add(fmt::format("topk_weights: {} are not finite:{}", bad_weights.count, bad_weights.text));
  // Every output element written: the poison is NaN, and real outputs of finite inputs are finite.
  const int64_t n = run.tokens * c.hidden;
  std::mutex mutex;
  int64_t non_finite = 0, first = -1;
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        int64_t count = 0, where = -1;
        for (int64_t i = b; i < e; ++i)
          if (!std::isfinite(run.out_at(i))) {
            if (where < 0) where = i;
            ++count;
          }
        std::lock_guard lock(mutex);
        non_finite += count;
        if (where >= 0 && (first < 0 || where < first)) first = where;
      },
      1 << 20);
  if (non_finite)
    f.add(fmt::format("output: {} of {} elements are not finite (unwritten or NaN/inf), first at token {} column {}",
                      non_finite, n, first / c.hidden, first % c.hidden));
  return f.ok();
}

bool check_untouched(const GpuRun& run, const Problem& p) {
  Failures f(p);
  auto untouched = [&](const DeviceBuffer& b, const char* what) {
    const std::vector<uint8_t> bytes = b.download_all();
    const auto changed = std::find_if(bytes.begin(), bytes.end(), [&](uint8_t x) { return x != run.poison; });
    if (changed != bytes.end())
      f.add(fmt::format("{} byte {} of {} changed by a forward of {} tokens that must do nothing", what,
                        changed - bytes.begin(), bytes.size(), run.tokens));
  };
  untouched(run.out_buffer, "output");
  untouched(run.workspace_buffer, "workspace");
  return f.ok();
}

ReferenceExperts reference_experts(const Problem& p, const std::vector<int64_t>& tokens, const std::vector<int>& ids,
                                   const std::vector<double>& weights, const reference::Weights* full) {
  const MoeConfig& c = p.config;
  // Its per-pair rows are the routed slots' (K a token); FusedSharedExperts.* checks fused layers.
  if (c.shared_slots() > 0)
    throw std::runtime_error("test harness: the per-pair checks do not cover fused shared experts; use "
                             "check_fused_shared_experts (test_runtime.cpp)");
  const int K = c.topk;
  const int64_t H = c.hidden, I = c.local_intermediate(), N1 = c.gemm1_rows();
  const int64_t n = static_cast<int64_t>(tokens.size());

  // Compaction: a config whose experts are just the ones the listed tokens use, renumbered in
  // ascending order (so the expert-sorted order, and every row, is the same as with all
  // experts), with only those experts' weights; the routing fields do not matter to these stages.
  MoeConfig config = c;
  reference::Weights compact;
  std::vector<int> used;
  if (!full) {
    if (c.ep_size != 1) throw std::runtime_error("test harness: compacted reference weights need ep_size 1");
    for (int64_t t : tokens) used.insert(used.end(), ids.begin() + t * K, ids.begin() + (t + 1) * K);
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    const int64_t u = static_cast<int64_t>(used.size());
    config.experts = static_cast<int>(u);
    config.num_expert_group = 1;
    config.topk_group = 1;
    config.topk_method = TopkMethod::Greedy;
    compact.w13.resize(u * N1 * H);
    compact.w2.resize(u * H * I);
    if (p.w8a8()) {
      compact.w13_scale.resize(u * N1);
      compact.w2_scale.resize(u * H);
      compact.act_smooth.resize(u * I);
      compact.input_smooth.resize(u * H);
    }
    // (expert_elems is the same for config and c: per-expert sizes do not depend on E.)
    const int64_t s13 = expert_elems(c, Tensor::W13Scale), s2 = expert_elems(c, Tensor::W2Scale);
    if (p.fp8()) {
      compact.w13_scale.resize(u * s13);
      compact.w2_scale.resize(u * s2);
    }
    if (c.expert_bias) {
      compact.w13_bias.resize(u * N1);
      compact.w2_bias.resize(u * H);
    }
    parallel_for(u, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        expert_doubles(p, Tensor::W13, used[k], compact.w13.data() + k * N1 * H);
        expert_doubles(p, Tensor::W2, used[k], compact.w2.data() + k * H * I);
        if (c.expert_bias) {
          expert_doubles(p, Tensor::W13Bias, used[k], compact.w13_bias.data() + k * N1);
          expert_doubles(p, Tensor::W2Bias, used[k], compact.w2_bias.data() + k * H);
        }
        if (p.fp8()) {
          expert_doubles(p, Tensor::W13Scale, used[k], compact.w13_scale.data() + k * s13);
          expert_doubles(p, Tensor::W2Scale, used[k], compact.w2_scale.data() + k * s2);
        }
        if (!p.w8a8()) continue;
        expert_doubles(p, Tensor::W13Scale, used[k], compact.w13_scale.data() + k * N1);
        expert_doubles(p, Tensor::W2Scale, used[k], compact.w2_scale.data() + k * H);
        expert_doubles(p, Tensor::ActSmooth, used[k], compact.act_smooth.data() + k * I);
        for (int64_t h = 0; h < H; ++h) compact.input_smooth[k * H + h] = p.input_smooth[used[k] * H + h];
      }
    });
  }
  const reference::Weights& w = full ? *full : compact;

  ReferenceExperts r;
  r.out.assign(n * H, 0.0);
  r.act.assign(n * K * I, 0.0);
  r.y.assign(n * K * H, 0.0);
  r.local.assign(n * K, 0);
  parallel_for(n, [&](int64_t b, int64_t e) {
    const int64_t m = e - b;
    std::vector<double> hidden(m * H), residual, tw(m * K);
    std::vector<int> chunk_ids(m * K);
    if (p.residual.count) residual.resize(m * H);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = tokens[b + i];
      for (int64_t h = 0; h < H; ++h) hidden[i * H + h] = p.hidden.at(t * H + h);
      if (p.residual.count)
        for (int64_t h = 0; h < H; ++h) residual[i * H + h] = p.residual.at(t * H + h);
      for (int j = 0; j < K; ++j) {
        int id = ids[t * K + j];
        if (!full) id = static_cast<int>(std::lower_bound(used.begin(), used.end(), id) - used.begin());
        chunk_ids[i * K + j] = id;
        tw[i * K + j] = weights[t * K + j];
      }
    }
    const reference::Experts ex = reference::experts(config, m, hidden, chunk_ids, tw, w, residual);
    std::copy(ex.out.begin(), ex.out.end(), r.out.begin() + b * H);
    for (int64_t f = 0; f < m * K; ++f) {
      const int pos = ex.index.pair_pos[f];
      if (pos < 0) continue;
      const int64_t q = b * K + f;
      r.local[q] = 1;
      std::copy_n(ex.act.begin() + int64_t{pos} * I, I, r.act.begin() + q * I);
      std::copy_n(ex.y.begin() + int64_t{pos} * H, H, r.y.begin() + q * H);
    }
  });
  return r;
}

namespace {

// Stages 2-6 of `run` given its own routing (run.topk_ids / topk_weights): index, expert rows,
// output, and the w8a8 quantizations. With the reference routing `rr` (forward), also the output
// against the reference layer on the tokens without near ties.
bool check_stages(const Problem& p, const GpuRun& run, const CheckOptions& options, const reference::Routing* rr,
                  int64_t ties, Failures& f) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden, I = c.local_intermediate(), M = T * c.topk;
  const int K = c.topk, e_loc = c.local_experts();
  const Tolerances tol = tolerances_for(c);

  // Stage 2: index of the GPU's own ids (a stable counting sort, so exact).
  const reference::Index ri = reference::index(c, T, run.topk_ids);
  {
    Examples bad;
    for (int l = 0; l < e_loc; ++l)
      if (run.counts[l] != ri.counts[l])
        bad.add(fmt::format("expert_counts[{}] = {}, reference {}", l, run.counts[l], ri.counts[l]));
    for (int l = 0; l <= e_loc; ++l)
      if (run.expert_offsets[l] != ri.offsets[l])
        bad.add(fmt::format("expert_offsets[{}] = {}, reference {}", l, run.expert_offsets[l], ri.offsets[l]));
    for (int64_t x = 0; x < M; ++x)
      if (run.pair_pos[x] != ri.pair_pos[x])
        bad.add(fmt::format("pair_pos[{}] = {}, reference {}", x, run.pair_pos[x], ri.pair_pos[x]));
    const int64_t rows = ri.offsets[e_loc];
    for (int64_t x = 0; x < rows; ++x)
      if (run.sorted_pair[x] != ri.sorted_pair[x])
        bad.add(fmt::format("sorted_pair[{}] = {}, reference {}", x, run.sorted_pair[x], ri.sorted_pair[x]));
    if (bad.count) {
      f.add(fmt::format("index differs from reference::index of the GPU's ids in {} places:{}", bad.count, bad.text));
      return false;  // the expert rows below are compared by position
    }
  }
  const int64_t rows = run.rows;

  // Stages 3-6 given the GPU's routing, so a routing near tie cannot move them.
  std::vector<int64_t> sample = options.sample;
  const bool all_tokens = sample.empty();
  if (all_tokens) {
    sample.resize(T);
    std::iota(sample.begin(), sample.end(), 0);
  }
  const int64_t n = static_cast<int64_t>(sample.size());
  const std::vector<double> gpu_weights(run.topk_weights.begin(), run.topk_weights.end());
  std::unique_ptr<reference::Weights> full;
  if (weight_elements(c) <= kMaterializeLimit && !options.force_compaction)
    full = std::make_unique<reference::Weights>(reference_weights(p));
  const ReferenceExperts re = reference_experts(p, sample, run.topk_ids, gpu_weights, full.get());

  // The GPU's expert rows of the sampled local pairs, in the same order as the reference's.
  std::vector<int64_t> pair_q, pair_pos;  // index into re (i*K + j), GPU sorted position
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < K; ++j) {
      const int64_t q = i * K + j;
      const int pos = run.pair_pos[sample[i] * K + j];
      if (!re.local[q] || pos < 0) continue;
      pair_q.push_back(q);
      pair_pos.push_back(pos);
    }
  auto gpu_rows = [&](const char* which, int64_t cols) {
    std::vector<double> v(pair_pos.size() * cols);
    if (all_tokens) {
      const std::vector<double> block = run.rows_of(which, 0, rows);
      // Every row was written: the poison (NaN) would show.
      for (double x : block)
        if (!std::isfinite(x)) {
          f.add(fmt::format("workspace '{}': a row of the {} local pairs is not finite (unwritten?)", which, rows));
          break;
        }
      for (size_t k = 0; k < pair_pos.size(); ++k)
        std::copy_n(block.begin() + pair_pos[k] * cols, cols, v.begin() + k * cols);
    } else {
      for (size_t k = 0; k < pair_pos.size(); ++k) {
        const std::vector<double> row = run.rows_of(which, pair_pos[k], pair_pos[k] + 1);
        std::copy(row.begin(), row.end(), v.begin() + k * cols);
      }
    }
    return v;
  };
  auto ref_rows = [&](const std::vector<double>& src, int64_t cols) {
    std::vector<double> v(pair_q.size() * cols);
    for (size_t k = 0; k < pair_q.size(); ++k) std::copy_n(src.begin() + pair_q[k] * cols, cols, v.begin() + k * cols);
    return v;
  };
  const std::vector<double> gpu_act = gpu_rows("act", I);
  const double act_err = reference::relative_error(ref_rows(re.act, I), gpu_act);
  const double y_err = reference::relative_error(ref_rows(re.y, H), gpu_rows("y", H));
  std::vector<double> gpu_out(n * H);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h) gpu_out[i * H + h] = run.out_at(sample[i] * H + h);
  const double out_err = reference::relative_error(re.out, gpu_out);

  // The layer against the reference's own routing, on tokens without near ties (where the ids
  // agree, checked above): SPEC's combine with the reference weights over the reference's y rows
  // of the same (token, expert) pairs, which is reference::layer's arithmetic for those tokens
  // without running the GEMMs a second time.
  std::vector<double> layer_ref, layer_gpu;
  for (int64_t i = 0; rr && i < n; ++i) {
    const int64_t t = sample[i];
    if (rr->near_tie[t]) continue;
    for (int64_t h = 0; h < H; ++h) {
      double acc = p.residual.count ? p.residual.at(t * H + h) : 0.0;
      for (int j = 0; j < K; ++j)
        if (re.local[i * K + j]) acc += rr->weights[t * K + j] * re.y[(i * K + j) * H + h];
      layer_ref.push_back(acc);
      layer_gpu.push_back(gpu_out[i * H + h]);
    }
  }
  const double layer_err = reference::relative_error(layer_ref, layer_gpu);
  const std::string errors =
      fmt::format("relative errors: act {:.3g}, y {:.3g}, out {:.3g}, layer {:.3g} ({} near-tie tokens)", act_err,
                  y_err, out_err, layer_err, ties);
  // Where GEMM 1 quantized its output, "act" is act_q dequantized: e4m3 rounds each element by up to
  // 2^-4 of itself (the fp8 check below holds every element to one e4m3 step of the reference's).
  const double act_tol = run.gemm1_quantized_act ? 0.0625 : tol.act;
  if (!(act_err <= act_tol)) f.add(fmt::format("act (GEMM 1 + activation) exceeds {}; {}", act_tol, errors));
  if (!(y_err <= tol.y)) f.add(fmt::format("y (GEMM 2) exceeds {}; {}", tol.y, errors));
  if (!(out_err <= tol.out)) f.add(fmt::format("output given the GPU's routing exceeds {}; {}", tol.out, errors));
  if (rr && !(layer_err <= tol.layer))
    f.add(fmt::format("output against the reference layer exceeds {}; {}", tol.layer, errors));

  if (rr && options.reference_layer && full) {
    // The literal end-to-end reference (routing + experts), on tokens without near ties.
    std::vector<double> residual = p.residual.count ? p.residual.doubles() : std::vector<double>{};
    const reference::Layer rl = reference::layer(c, T, p.hidden.doubles(), p.logits.doubles(),
                                                 p.noaux() ? p.bias_doubles() : std::vector<double>{}, *full, residual);
    std::vector<double> a, b;
    for (int64_t t = 0; t < T; ++t) {
      if (rr->near_tie[t]) continue;
      for (int64_t h = 0; h < H; ++h) {
        a.push_back(rl.experts.out[t * H + h]);
        b.push_back(run.out_at(t * H + h));
      }
    }
    const double err = reference::relative_error(a, b);
    if (!(err <= tol.layer)) f.add(fmt::format("output against reference::layer exceeds {}: {:.3g}", tol.layer, err));
  }

  // A quantized workspace buffer of `count` rows: one copy of the whole buffer when every row is
  // checked, else the sampled rows one by one.
  auto reader = [&](int64_t offset, int64_t row_bytes, int64_t count = -1) {
    if (count < 0) count = rows;
    std::vector<uint8_t> whole = all_tokens ? run.raw(offset, count * row_bytes) : std::vector<uint8_t>{};
    return [&run, offset, row_bytes, whole = std::move(whole)](int64_t pos) {
      if (!whole.empty() || row_bytes == 0)
        return std::vector<uint8_t>(whole.begin() + pos * row_bytes, whole.begin() + (pos + 1) * row_bytes);
      return run.raw(offset + pos * row_bytes, row_bytes);
    };
  };
  if (p.w8a8()) {
    // Stage 3 (expand + quantize) and the re-quantization after GEMM 1, row by row.
    Examples scale_bad, q_far;
    int64_t off_by_one = 0, elements = 0;
    const auto a_q = reader(run.offsets.a_q, H), a_scale = reader(run.offsets.a_scale, 4);
    const auto act_q = reader(run.offsets.act_q, I), act_scale = reader(run.offsets.act_scale, 4);
    auto as_float = [](const std::vector<uint8_t>& b) {
      float v;
      std::memcpy(&v, b.data(), 4);
      return v;
    };
    for (size_t k = 0; k < pair_pos.size(); ++k) {
      const int64_t pos = pair_pos[k];
      const int64_t t = sample[pair_q[k] / K];
      const int e = run.topk_ids[t * K + pair_q[k] % K];
      std::vector<double> x(H);
      for (int64_t h = 0; h < H; ++h) x[h] = p.hidden.at(t * H + h) * static_cast<double>(p.input_smooth[e * H + h]);
      compare_quantized(x, reinterpret_cast<const int8_t*>(a_q(pos).data()), as_float(a_scale(pos)), "a_q", pos,
                        scale_bad, q_far, off_by_one);
      const std::vector<double> act_row(gpu_act.begin() + k * I, gpu_act.begin() + (k + 1) * I);
      compare_quantized(act_row, reinterpret_cast<const int8_t*>(act_q(pos).data()), as_float(act_scale(pos)), "act_q",
                        pos, scale_bad, q_far, off_by_one);
      elements += H + I;
    }
    if (scale_bad.count)
      f.add(fmt::format("w8a8 row scales differ from the reference {} times:{}", scale_bad.count, scale_bad.text));
    if (q_far.count)
      f.add(fmt::format("w8a8 quantized values differ by more than one step {} times:{}", q_far.count, q_far.text));
    if (off_by_one > std::max<int64_t>(8, elements / 1000))
      f.add(fmt::format("w8a8 quantized values differ by one step {} times in {} (rounding should make that rare)",
                        off_by_one, elements));
  }

  if (p.fp8()) {
    // Stage 3 quantizes each token's hidden row once (a_q [T, H], a_scale [T, groups(H)]); GEMM 1
    // reads the rows of tokens with a local pair, so those are checked (others may be skipped).
    // After GEMM 1 each expert row's act_f32 is quantized (act_q [T*K, I], act_scale [T*K,
    // groups(I)]); compared on the GPU's own act_f32, so GEMM 1's error does not enter. Where GEMM 1
    // quantized its output there is no act_f32: act_q is compared with the reference's act rows
    // (compare_fp8_near).
    const bool block = c.quant == Quant::Fp8Block;
    const int64_t groups_h = activation_scale_groups(c, H), groups_i = activation_scale_groups(c, I);
    Examples scale_bad, q_far;
    int64_t off_by_one = 0, elements = 0;
    const auto a_q = reader(run.offsets.a_q, H, T), a_scale = reader(run.offsets.a_scale, groups_h * 4, T);
    const auto act_q = reader(run.offsets.act_q, I), act_scale = reader(run.offsets.act_scale, groups_i * 4);
    for (int64_t i = 0; i < n; ++i) {
      bool used = false;
      for (int j = 0; j < K; ++j) used = used || re.local[i * K + j];
      if (!used) continue;
      const int64_t t = sample[i];
      compare_fp8(p.hidden.doubles(t * H, (t + 1) * H), a_q(t).data(), floats_of(a_scale(t)).data(),
                  block ? kFp8BlockSize : H, "a_q", t, scale_bad, q_far, off_by_one);
      elements += H;
    }
    for (size_t k = 0; k < pair_pos.size(); ++k) {
      const int64_t pos = pair_pos[k];
      if (run.gemm1_quantized_act) {
        const std::vector<double> act_row(re.act.begin() + pair_q[k] * I, re.act.begin() + (pair_q[k] + 1) * I);
        compare_fp8_near(act_row, act_q(pos).data(), floats_of(act_scale(pos)).data(), kFp8BlockSize, "act_q", pos,
                         scale_bad, q_far);
        continue;
      }
      const std::vector<double> act_row(gpu_act.begin() + k * I, gpu_act.begin() + (k + 1) * I);
      compare_fp8(act_row, act_q(pos).data(), floats_of(act_scale(pos)).data(), block ? kFp8BlockSize : I, "act_q",
                  pos, scale_bad, q_far, off_by_one);
      elements += I;
    }
    if (scale_bad.count)
      f.add(fmt::format("fp8 activation scales differ from the reference {} times:{}", scale_bad.count,
                        scale_bad.text));
    if (q_far.count)
      f.add(fmt::format("fp8 quantized values differ by more than one e4m3 step {} times:{}", q_far.count,
                        q_far.text));
    if (off_by_one > std::max<int64_t>(8, elements / 1000))
      f.add(fmt::format("fp8 quantized values differ by one e4m3 step {} times in {} (rounding should make that rare)",
                        off_by_one, elements));

    // SPEC.md: the error against the unquantized layer (the dequantized weights, activations not
    // quantized) is reported, not checked; on up to 64 of the checked tokens, small weights only.
    if (full && weight_elements(c) <= (int64_t{16} << 20)) {
      const int64_t m = std::min<int64_t>(n, 64);
      MoeConfig plain = c;
      plain.quant = Quant::None;
      std::vector<double> hidden(m * H), residual, tw(m * K);
      std::vector<int> ids(m * K);
      if (p.residual.count) residual.resize(m * H);
      for (int64_t i = 0; i < m; ++i) {
        const int64_t t = sample[i];
        for (int64_t h = 0; h < H; ++h) hidden[i * H + h] = p.hidden.at(t * H + h);
        if (p.residual.count)
          for (int64_t h = 0; h < H; ++h) residual[i * H + h] = p.residual.at(t * H + h);
        for (int j = 0; j < K; ++j) {
          ids[i * K + j] = run.topk_ids[t * K + j];
          tw[i * K + j] = gpu_weights[t * K + j];
        }
      }
      const reference::Experts unquantized =
          reference::experts(plain, m, hidden, ids, tw, reference::dequantized_fp8(c, *full), residual);
      const double err = reference::relative_error(
          unquantized.out, std::vector<double>(gpu_out.begin(), gpu_out.begin() + m * H));
      ::testing::Test::RecordProperty(fmt::format("fp8_error_vs_unquantized_T{}", T), fmt::format("{:.4g}", err));
    }
  }
  return f.ok();
}

}  // namespace

bool check_run(const Problem& p, const GpuRun& run, const CheckOptions& options) {
  Failures f(p);
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens;
  const int K = c.topk;
  const Tolerances tol = tolerances_for(c);
  const bool invariants = check_invariants(p, run);
  if (T == 0) return invariants;
  if (!ids_in_range(p, run)) return false;  // reported by check_invariants; the reference cannot index them

  // Stage 1: routing. Ids exactly, except for tokens where the reference saw two selection scores
  // within 1e-6 relative (SPEC.md). Weights to 1e-5 relative for every logit dtype: the reference
  // is given the same rounded logits the GPU read, so the only difference left is fp32 vs
  // float64 arithmetic in softmax/sigmoid and the renormalization, a few fp32 ulps (the softmax
  // sum over up to 1024 experts is the largest term, < 2e-6 relative).
  const reference::Routing rr =
      reference::route(c, T, p.logits.doubles(), p.noaux() ? p.bias_doubles() : std::vector<double>{});
  int64_t ties = 0;
  Examples id_bad, weight_bad;
  for (int64_t t = 0; t < T; ++t) {
    if (rr.near_tie[t]) {
      ++ties;
      continue;
    }
    const int* gi = run.topk_ids.data() + t * K;
    const int* ri = rr.ids.data() + t * K;
    if (!std::equal(gi, gi + K, ri)) {
      id_bad.add(fmt::format("token {}: gpu {} reference {}", t, join(gi, K), join(ri, K)));
      continue;
    }
    for (int j = 0; j < K; ++j) {
      const double g = run.topk_weights[t * K + j], r = rr.weights[t * K + j];
      if (!(std::fabs(g - r) <= tol.weight_rel * std::fabs(r) + 1e-9 * c.routed_scaling_factor))
        weight_bad.add(fmt::format("token {} slot {} (expert {}): gpu {:.9g} reference {:.9g}", t, j, gi[j], g, r));
    }
  }
  if (id_bad.count)
    f.add(
        fmt::format("topk_ids differ from the reference for {} tokens (not near ties):{}", id_bad.count, id_bad.text));
  if (weight_bad.count)
    f.add(fmt::format("topk_weights differ from the reference by more than {} relative, {} times:{}", tol.weight_rel,
                      weight_bad.count, weight_bad.text));
  // Guards the strictness of the check above: with distinct logits near ties are rare, so a
  // reference that called everything a tie would make the ids check vacuous.
  if (p.options.distinct_logits && T >= 8 && ties * 2 > T)
    f.add(fmt::format("the reference reports near ties for {} of {} tokens; the ids check would be vacuous", ties, T));

  return check_stages(p, run, options, &rr, ties, f) && invariants;
}

bool check_experts_run(const Problem& p, const GpuRun& run, const CheckOptions& options) {
  Failures f(p);
  const bool invariants = check_invariants(p, run, false);
  if (p.tokens == 0) return invariants;
  if (!ids_in_range(p, run)) {
    f.add(fmt::format("test harness: check_experts_run takes caller ids in [0, {}) only (its reference indexes "
                      "them)",
                      p.config.experts));
    return false;
  }
  return check_stages(p, run, options, nullptr, 0, f) && invariants;
}

}  // namespace moejit::test
