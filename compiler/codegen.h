// Codegen: from a Plan to CUDA translation units. A unit is a short file that includes the
// embedded templates, defines one Spec struct per kernel and one extern "C" entry point per
// kernel. The same plan always gives byte-identical text.
#pragma once

#include <string>
#include <vector>

#include "compiler/plan.h"

namespace moejit {

struct GeneratedUnit {
  std::string name;                  // "routing", "index", "quantize", "experts", "combine"
  std::string source;                // the whole translation unit
  std::vector<std::string> entries;  // extern "C" kernels it defines
  std::vector<Stage> stages;         // stages it serves, in plan order
  // Includes CUB, whose headers take NVRTC most of a second and more; the layer compiler starts
  // such units first so the light ones fill the other threads meanwhile.
  bool includes_cub = false;
};

struct KernelSource {
  std::vector<GeneratedUnit> units;  // in plan order
};

KernelSource generate(const Plan& plan);

}  // namespace moejit
