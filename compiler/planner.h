// The planner: from a validated LayerSpec and an arch to the Plan of one layer. It composes the
// kernel families (compiler/families/), takes the buckets and tiles from the per-arch heuristics
// (compiler/heuristics/) and applies tile overrides. Everything is a closed-form function of its
// inputs: the same spec always gives the same plan and the same generated source.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/heuristics/heuristics.h"
#include "compiler/plan.h"
#include "compiler/tiles.h"

namespace moejit {

// Validates the spec (InvalidInput) and plans every kernel. Overrides replace the planner's tiles;
// an override that names no bucket, does not fit the spec, or gives the two GEMMs of a bucket
// different row tiles is refused (InvalidInput).
Plan make_plan(const LayerSpec& spec, const std::string& arch, const std::vector<TileOverride>& overrides = {});

// Human-readable plan (buckets, kernels with launch rules, workspace for max_tokens), for the rank
// at `placement` (the first line names its first local expert and tensor-parallel rank).
std::string describe(const Plan& plan, const Placement& placement, int64_t max_tokens);

}  // namespace moejit
