// The index family (templates/index.cuh, SPEC.md stage 2): a stable counting sort of the T*K
// (token, slot) pairs by local expert, and the GEMM row-tile schedule, in two kernels (count, then
// scatter blocks that each sum the count table themselves).
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

constexpr int kPairsPerIndexBlock = 1024;
// Warps of an index_count / index_scatter block (each scatter warp places a slice of 128 pairs).
constexpr int kIndexWarps = 8;
// Every index_scatter block reads the whole count table (index.cuh); this cap keeps those reads
// linear in T*K. Up to 128 * 1024 pairs each scatter block places one count block's pairs.
constexpr int64_t kMaxIndexScatterBlocks = 128;

// index_count and index_scatter, in launch order (one Spec struct for both).
std::vector<KernelPlan> index_kernels(const LayerSpec& spec);

// Their arguments (shared): the call's topk_ids in; counts, offsets, positions and the tile
// schedule of the bucket's row tile height out, in the workspace. The first local expert is the
// placement's (a run-time argument, so every rank shares one binary).
IndexArgs index_args(const CallContext& context);

}  // namespace moejit
