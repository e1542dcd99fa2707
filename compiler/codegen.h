// Codegen: from a Plan to CUDA translation units. A unit is a short file that includes the
// embedded templates, defines one Spec struct per kernel and one extern "C" entry point per
// kernel. The same plan always gives byte-identical text.
#pragma once

#include <string>
#include <vector>

#include "compiler/plan.h"

namespace moejit {

struct GeneratedUnit {
  std::string name;                  // "routing", "index", "quantize", "gemm1", "gemm2", "combine"
  std::string source;                // the whole translation unit
  std::vector<std::string> entries;  // extern "C" kernels it defines
  std::vector<Stage> stages;         // stages it serves, in plan order
  // A rough NVRTC cost estimate, so the layer compiler starts the slowest units first and the
  // light ones fill the other threads meanwhile. Measured on NVRTC 13.0: CUB's headers ~1.2 s
  // a unit, a grouped-GEMM instance ~0.15 s, any other kernel ~0.05-0.2 s.
  int cost_hint = 0;
};

struct KernelSource {
  std::vector<GeneratedUnit> units;  // in plan order
};

KernelSource generate(const Plan& plan);

}  // namespace moejit
