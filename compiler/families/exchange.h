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

// The kernels in unit "exchange", in call order, for `spec`'s H, K, E_loc, ep_size, dtype and quant on
// `arch`: an fp8 layer's stage-3 quantization of the rank's rows (role QuantizeExpand, the layer's
// own kernel), then slots, pack (fp8: e4m3 rows and their scales), combine; no token buckets.
// Rank-less, as a layer's plan is: every rank of the group shares the binary.
Plan exchange_plan(const LayerSpec& spec, const std::string& arch);

// The scales each sent row carries: an fp8 layer's per-row groups (ceil(H/128) for fp8_block, 1 for
// fp8_tensor), 0 for every other layer (rows travel in the model dtype).
int64_t exchange_scale_groups(const LayerSpec& spec);

// The grid of one of those kernels for `tokens` tokens (pack: the ep_size * capacity send rows; the
// quantization and the combine: a block per token, by column blocks for the combine).
Grid exchange_grid(const KernelPlan& kernel, int ranks, int64_t capacity, int64_t tokens);

}  // namespace moejit
