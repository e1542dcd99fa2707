// The compile step: (spec, arch, tiles) -> CompiledLayer (plan + binaries): plan -> source ->
// (cache | NVRTC), units in parallel. Needs no GPU. `moejit compile` calls it directly and the
// runtime at model load (runtime/layer.cpp), which then loads the binaries onto a device; after
// it, nothing compiles.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_key.h"
#include "cache/kernel_cache.h"
#include "compiler/codegen.h"
#include "compiler/nvrtc_compiler.h"
#include "compiler/plan.h"
#include "compiler/planner.h"

namespace moejit {

struct UnitResult {
  std::string unit;
  std::string key;
  std::shared_ptr<const CachedBinary> binary;
  CacheOutcome outcome = CacheOutcome::Built;
  double seconds = 0;  // time this request spent on the unit (compile, disk load or lookup)
};

struct CompiledLayer {
  Plan plan;
  KernelSource source;
  std::vector<UnitResult> units;  // in source order
  double wall_seconds = 0;
};

// Called once per unit as it finishes, from the compiling thread (calls are serialized).
using UnitProgress = std::function<void(const UnitResult&, size_t done, size_t total)>;

// Compile options for `arch` from knobs() (CUDA home, lineinfo, PCH, repro folder).
CompileOptions compile_options_for(const std::string& arch);

// The labeled fields of a unit's cache key (DESIGN.md decision 5), in a fixed order.
CacheKeyBuilder unit_cache_key(const GeneratedUnit& unit, const CompileOptions& options);

// The plan compile_layer builds: make_plan with `tiles` (an autotuned choice), then the MOEJIT_TILES
// overrides, which win.
Plan plan_layer(const LayerSpec& spec, const std::string& arch, const std::vector<TileOverride>& tiles = {});

// Validates the spec (InvalidInput), checks the arch (InvalidInput), then compiles or loads
// every unit. A CompileError from any unit is rethrown after the others finish.
CompiledLayer compile_layer(const LayerSpec& spec, const std::string& arch, KernelCache& cache,
                            const UnitProgress& progress = {}, const std::vector<TileOverride>& tiles = {});

// The same for a plan made elsewhere (the all_to_all exchange's, compiler/families/exchange.h):
// checks its arch, then compiles or loads its units.
CompiledLayer compile_plan(Plan plan, KernelCache& cache, const UnitProgress& progress = {});

}  // namespace moejit
