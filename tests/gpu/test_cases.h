// The configurations the layer tests sweep: SPEC.md's presets (scaled and full size) and the
// random draws. Pure functions of the base seed, so the compile prefetch (test_layer.cpp) and
// the tests agree on what will run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/moe_config.h"

namespace moejit::test {

struct PresetCase {
  std::string preset;
  DType dtype = DType::BF16;
  Quant quant = Quant::None;
  bool full_size = false;  // else hidden and moe_intermediate are divided by 8
};
MoeConfig preset_config(const PresetCase& pc);
std::vector<int64_t> preset_tokens(const PresetCase& pc);
std::string preset_case_name(const PresetCase& pc);  // e.g. "deepseek_v3_bf16"
std::vector<PresetCase> scaled_preset_cases();       // every preset x {bf16, fp16, fp32}
std::vector<PresetCase> w8a8_preset_cases();         // three presets, w8a8 int8
std::vector<PresetCase> full_size_preset_cases();    // every preset, bf16, full E, H and I

constexpr int kRandomConfigs = 200;
struct RandomCase {
  MoeConfig config;
  int64_t tokens = 0;
  bool residual = false;
};
// Draw i of the random sweep (valid by construction: invalid draws are redrawn).
RandomCase random_case(int i);

}  // namespace moejit::test
