// Codegen: from a Plan to CUDA translation units. A unit is a short file that includes the
// embedded templates, defines one Spec struct per kernel and one extern "C" entry point per
// kernel. The same plan always gives byte-identical text.
#pragma once

#include <string>
#include <vector>

#include "compiler/plan.h"

namespace moejit {

struct GeneratedUnit {
  std::string name;                  // "route", "experts", "combine"
  std::string source;                // the whole translation unit
  std::vector<std::string> entries;  // extern "C" kernels it defines
  std::vector<Stage> stages;         // stages it serves, in plan order
};

struct KernelSource {
  std::vector<GeneratedUnit> units;  // in plan order
};

KernelSource generate(const Plan& plan);

}  // namespace moejit
