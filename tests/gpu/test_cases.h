// The configurations the layer tests sweep: SPEC.md's presets (scaled and full size) and the
// random draws. Pure functions of the base seed, so the compile prefetch (test_layer.cpp) and
// the tests agree on what will run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/moe_config.h"
#include "harness.h"

namespace moejit::test {

struct PresetCase {
  std::string preset;
  DType dtype = DType::BF16;
  Quant quant = Quant::None;
  bool full_size = false;  // else hidden and moe_intermediate are divided by 8
};
MoeConfig preset_config(const PresetCase& pc);
std::vector<int64_t> preset_tokens(const PresetCase& pc);
std::string preset_case_name(const PresetCase& pc);  // e.g. "deepseek_v3_bf16", "mixtral_8x7b_bf16_fp8_block"
std::vector<PresetCase> scaled_preset_cases();       // every preset x {bf16, fp16, fp32}
std::vector<PresetCase> w8a8_preset_cases();         // three presets, w8a8 int8
std::vector<PresetCase> fp8_preset_cases();          // every preset fp8_block, three fp8_tensor
std::vector<PresetCase> full_size_preset_cases();    // every preset, bf16, full E, H and I
// The presets whose published checkpoints are fp8 block-scaled (deepseek-v3, kimi-k2), full size.
std::vector<PresetCase> fp8_full_size_preset_cases();

constexpr int kRandomConfigs = 200;
struct RandomCase {
  MoeConfig config;
  int64_t tokens = 0;
  bool residual = false;
  // fp8 draws (bf16 only) whose weight scales span 1e-6..1e4 (ProblemOptions::fp8_scale_min); 0:
  // the default scales.
  double fp8_scale_min = 0, fp8_scale_max = 0;
  // What make_problem needs of the draw beyond config and tokens (residual, fp8 scales).
  ProblemOptions options() const {
    return {.residual = residual, .fp8_scale_min = fp8_scale_min, .fp8_scale_max = fp8_scale_max};
  }
};
// Draw i of the random sweep (valid by construction: invalid draws are redrawn).
RandomCase random_case(int i);

}  // namespace moejit::test
