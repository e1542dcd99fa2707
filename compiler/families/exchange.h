// The all_to_all exchange family (templates/exchange.cuh): the kernels around the two NCCL
// exchanges of expert parallel's all_to_all mode (runtime/dispatched_layer.h). Planned beside a
// layer's plan, as a plan of its own, since only a layer built for that mode needs them.
#pragma once

#include <cstdint>
#include <string>

#include "compiler/layer_call.h"
#include "compiler/plan.h"

namespace moejit {

// Threads of the slots kernel's one block per destination rank (tokens are counted a chunk of this
// many at a time) and of the pack and combine blocks.
constexpr int kExchangeSlotsThreads = 256;
constexpr int kExchangeRowThreads = 128;

// The three kernels (slots, pack, combine, in that order) in unit "exchange", for `spec`'s H, K,
// E_loc, ep_size and dtype on `arch`; no token buckets. Rank-less, as a layer's plan is: every rank
// of the group shares the binary.
Plan exchange_plan(const LayerSpec& spec, const std::string& arch);

// The grid of one of those kernels for `tokens` tokens (pack: the ep_size * capacity send rows).
Grid exchange_grid(const KernelPlan& kernel, int ranks, int64_t capacity, int64_t tokens);

}  // namespace moejit
