#include "test_cases.h"

#include <cctype>
#include <random>
#include <stdexcept>

#include "harness.h"

namespace moejit::test {

MoeConfig preset_config(const PresetCase& pc) {
  MoeConfig c = preset(pc.preset);
  c.dtype = pc.dtype;
  c.router_dtype = pc.dtype;
  c.quant = pc.quant;
  if (!pc.full_size) {
    // Routing (E, K, groups, scoring, bias, scale) stays the preset's; only the GEMMs shrink, so
    // the float64 reference stays affordable at prefill token counts.
    c.hidden /= 8;
    c.moe_intermediate /= 8;
  }
  validate(c);
  return c;
}

std::vector<int64_t> preset_tokens(const PresetCase& pc) {
  // Full size: 3 tokens (the reference's cost is T*K*3*H*I*2 flops, 14 G for kimi-k2 at T=3).
  // Scaled: one token count per tile range (decode <= 32 < mid <= 512 < the prefill buckets; 600
  // lands in "short", "wide" or "prefill" depending on the scaled config's rows per expert).
  if (pc.full_size) return {3};
  return {3, 40, 600};
}

std::string preset_case_name(const PresetCase& pc) {
  std::string name = pc.preset + "_" + std::string(to_string(pc.dtype));
  if (pc.quant == Quant::W8A8Int8) name += "_w8a8";
  if (is_fp8(pc.quant)) name += "_" + std::string(to_string(pc.quant));
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

std::vector<PresetCase> scaled_preset_cases() {
  std::vector<PresetCase> v;
  for (const auto& name : preset_names())
    for (DType d : {DType::BF16, DType::FP16, DType::FP32}) v.push_back({name, d, Quant::None, false});
  return v;
}

std::vector<PresetCase> w8a8_preset_cases() {
  return {{"deepseek-v3", DType::BF16, Quant::W8A8Int8, false},
          {"qwen3-30b-a3b", DType::FP16, Quant::W8A8Int8, false},
          {"mixtral-8x7b", DType::BF16, Quant::W8A8Int8, false}};
}

std::vector<PresetCase> fp8_preset_cases() {
  // Block scaling (the published fp8 checkpoints' kind) for every preset, mostly bf16; the scaled
  // sizes leave partial last blocks where I / 8 is not a multiple of 128 (qwen3-30b-a3b 96,
  // deepseek-v2-lite and glm-4.5-air 176, qwen3-next 64). Per-tensor scaling for three.
  std::vector<PresetCase> v;
  for (const auto& name : preset_names()) {
    const bool fp16 = name == "qwen3-30b-a3b" || name == "glm-4.5-air";
    v.push_back({name, fp16 ? DType::FP16 : DType::BF16, Quant::Fp8Block, false});
  }
  v.push_back({"mixtral-8x7b", DType::BF16, Quant::Fp8Tensor, false});
  v.push_back({"qwen3-30b-a3b", DType::FP16, Quant::Fp8Tensor, false});
  v.push_back({"deepseek-v3", DType::BF16, Quant::Fp8Tensor, false});
  return v;
}

std::vector<PresetCase> full_size_preset_cases() {
  std::vector<PresetCase> v;
  for (const auto& name : preset_names()) v.push_back({name, DType::BF16, Quant::None, true});
  return v;
}

std::vector<PresetCase> fp8_full_size_preset_cases() {
  return {{"deepseek-v3", DType::BF16, Quant::Fp8Block, true}, {"kimi-k2", DType::BF16, Quant::Fp8Block, true}};
}

RandomCase random_case(int i) {
  std::mt19937_64 rng(mix_seed(mix_seed(base_seed(), fnv1a("RandomConfig")), static_cast<uint64_t>(i)));
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  auto pick = [&](const auto& list) { return list[uniform(0, static_cast<int64_t>(std::size(list)) - 1)]; };

  // The categories every sweep must cover cycle with the index (so any 200 draws cover them,
  // whatever the seed); the rest is random.
  static const int64_t kTokens[] = {0, 1, 3, 17, 32, 33, 64, 257, 512, 513, 1000, 4097};
  static const DType kDTypes[] = {DType::BF16, DType::FP16, DType::FP32};
  static const int kExperts[] = {1,  2,  3,  5,  6,   7,   8,   12,  16,  20,  24,  40,
                                 60, 64, 72, 96, 100, 128, 160, 256, 320, 384, 500, 512};
  static const int64_t kSizes[] = {1, 7, 72, 100, 200, 333, 520, 1408, 2880};
  static const double kScales[] = {2.5, 2.827, 0.5, 16.0};
  static const Activation kActivations[] = {Activation::Silu, Activation::Gelu, Activation::GeluTanh};
  const int64_t T = kTokens[i % std::size(kTokens)];
  const DType dtype = kDTypes[i % 3];
  const bool w8a8 = dtype != DType::FP32 && i % 7 == 3;
  // fp8 (16-bit dtypes only): block scaling two draws in three, per-tensor the third; weight
  // scales spanning 1e-6..1e4 in every other bf16 draw (fp16 outputs could leave fp16's range).
  const bool fp8 = dtype != DType::FP32 && i % 7 == 5;
  // (i / 21: the fp8 draws of one dtype are 21 apart, so i / 7 would tie the choice to the dtype.)
  const Quant fp8_quant = (i / 21) % 3 == 1 ? Quant::Fp8Tensor : Quant::Fp8Block;
  const bool wide_scales = fp8 && dtype == DType::BF16 && (i / 21) % 2 == 0;
  const int ep_size = i % 4 == 1 ? 2 : 1;

  for (int attempt = 0; attempt < 100000; ++attempt) {
    MoeConfig c;
    c.experts = coin(0.5) ? pick(kExperts) : static_cast<int>(uniform(1, 512));
    if (ep_size == 2 && c.experts % 2) c.experts += c.experts < 512 ? 1 : -1;
    c.num_expert_group = 1;
    c.topk_group = 1;
    c.topk_method = coin(0.3) ? TopkMethod::NoauxTc : TopkMethod::Greedy;
    if (c.experts >= 4 && coin(0.35)) {
      std::vector<int> divisors;
      for (int g = 2; g <= c.experts / 2; ++g)
        if (c.experts % g == 0) divisors.push_back(g);
      if (!divisors.empty()) {
        c.num_expert_group = pick(divisors);
        c.topk_group = static_cast<int>(uniform(1, c.num_expert_group));
        c.topk_method = coin(0.5) ? TopkMethod::GroupLimitedGreedy : TopkMethod::NoauxTc;
      }
    }
    const int max_k = std::min({c.experts, 16, c.topk_group * (c.experts / c.num_expert_group)});
    c.topk = static_cast<int>(uniform(1, max_k));
    c.scoring = coin(0.5) ? Scoring::Softmax : Scoring::Sigmoid;
    c.renormalize = coin(0.7);
    c.routed_scaling_factor = coin(0.5) ? 1.0 : pick(kScales);
    c.dtype = dtype;
    c.router_dtype = coin(0.5) ? dtype : DType::FP32;
    c.quant = w8a8 ? Quant::W8A8Int8 : fp8 ? fp8_quant : Quant::None;
    c.activation = pick(kActivations);
    c.gated = coin(0.75);
    // gpt-oss's clamped SwiGLU (gated only) with limits from tight to loose, and expert biases.
    if (c.gated && coin(0.2)) {
      c.activation = Activation::SwigluOai;
      c.swiglu_limit = coin(0.5) ? 7.0 : pick(kScales);
    }
    c.expert_bias = coin(0.25);
    c.weight_layout = coin(0.5) ? WeightLayout::NK : WeightLayout::KN;
    if (fp8) c.weight_layout = WeightLayout::NK;  // the only fp8 layout
    c.ep_size = ep_size;
    c.ep_rank = static_cast<int>(uniform(0, ep_size - 1));
    c.tp_size = coin(0.15) ? 2 : 1;
    c.tp_rank = static_cast<int>(uniform(0, c.tp_size - 1));
    c.hidden = coin(0.5) ? pick(kSizes) : uniform(1, 3000);
    const int64_t inter = coin(0.5) ? pick(kSizes) : uniform(1, 3000);
    c.moe_intermediate = inter * c.tp_size;
    if (!validation_errors(c).empty()) continue;
    // Budgets: the rank's weights (device, and float64 on the host) and the reference's flops
    // (T*K pairs x (N1*H + H*I) multiply-adds), so a sweep stays a few minutes on 16 cores.
    const int64_t per_pair = c.gemm1_rows() * c.hidden + c.hidden * c.local_intermediate();
    if (weight_elements(c) > (int64_t{48} << 20)) continue;
    if (2.0 * T * c.topk * per_pair > 4e9) continue;
    // ... and the expert rows the check holds as doubles (act and y, T*K*(I+H) values, a few
    // copies each).
    if (T * c.topk * (c.hidden + c.local_intermediate()) > (int64_t{24} << 20)) continue;
    RandomCase rc{c, T, coin(0.4)};
    if (wide_scales) {
      rc.fp8_scale_min = 1e-6;
      rc.fp8_scale_max = 1e4;
    }
    return rc;
  }
  throw std::runtime_error("random_case: no valid draw within the budgets");
}

}  // namespace moejit::test
