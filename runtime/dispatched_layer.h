// The all_to_all mode of expert parallel for the C++ API and the C ABI (LayerOptions::ep_mode
// AllToAll): each rank passes its own tokens; a call routes them, sends each token's hidden row (and
// its top-k ids and weights) once to every rank that holds one of its experts, runs this rank's
// experts on the rows that arrived, sends the weighted sums back (each in the model dtype), and adds
// each token's returns to its residual in rank order in fp32, rounded to the model dtype, so the
// output is the whole layer's for this rank's tokens and a call is bitwise reproducible. fp8 layers send the rows quantized (e4m3 with
// their scales, by the layer's own stage-3 kernel: what the receiving rank's GEMM 1 would have
// quantized itself), about half the bytes of bf16; the sums return in the model dtype.
//
// The exchanges are NCCL grouped sends and receives on the caller's stream, in fixed slabs of C =
// max_tokens_per_rank rows per pair of ranks: no count leaves the device, so a call never
// synchronizes and is CUDA-graph capturable (DeepEP's low-latency kernels make the same trade: every
// rank moves ep_size x C rows each way whatever the routing; right for decode within a node). Rows
// past a rank's tokens carry ids -1, which select no expert. The kernels around the exchanges are
// templates/exchange.cuh's. The communicator stays the caller's, as in the all_reduce mode.
//
// Collective: every rank of the group must make each call (forward or experts, the same on every
// rank), with its own T in [0, C]. A rank given T outside [0, C] still serves the other ranks' rows
// (sending none of its own), so that their calls complete, then throws InvalidInput.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/exchange_kernels.h"
#include "runtime/layer.h"

namespace moejit {

// Throws InvalidInput when the layer cannot run all_to_all over the communicator: max_tokens_per_rank
// not in 1..max_layer_tokens / ep_size (the local experts run on ep_size * C rows), tp_size != 1,
// router_gemm or fused shared experts (not supported in this mode), ncclCommCount != ep_size,
// ncclCommUserRank != ep_rank (rank r's slab goes to the rank holding experts r * E_loc..), or
// ncclCommCuDevice != `ordinal`. Loads NCCL (Error when it cannot).
void check_dispatch_group(const MoeConfig& config, void* nccl_comm, int ordinal, int64_t max_tokens_per_rank);

// The workspace of one all_to_all call, a function of the config and C only (T <= C), in bytes from
// the workspace's start; every buffer 256-byte aligned.
struct DispatchWorkspace {
  int64_t inner = 0;                     // the local experts' call on ep_size * C rows (at 0)
  int64_t inner_bytes = 0;
  int64_t topk_weights = 0, topk_ids = 0;  // [C, K]: forward's routing of this rank's tokens
  int64_t quantized = 0, quantized_scale = 0;  // fp8: [C, H] e4m3 and [C, G] fp32, the rank's rows
                                               // quantized (G = exchange_scale_groups; empty otherwise)
  int64_t slot_of = 0;                   // [C, ep_size]
  int64_t source = 0;                    // [ep_size * C]
  int64_t send_rows = 0, send_ids = 0, send_weights = 0, send_scales = 0;  // [ep_size * C, H | K | K | G];
                                    // send_rows then receives the returned sums (model dtype rows)
  int64_t recv_rows = 0, recv_ids = 0, recv_weights = 0, recv_scales = 0;
  int64_t partial = 0;                   // [ep_size * C, H]: the local experts' sums, sent back
  int64_t total_bytes = 0;
};
DispatchWorkspace dispatch_workspace(const MoeConfig& config, int64_t capacity, size_t inner_bytes);

// `layer` (a JIT layer: it runs experts()) run in all_to_all mode over `nccl_comm` (checked by
// check_dispatch_group) with `kernels` (exchange_plan's, loaded on the layer's device).
std::unique_ptr<Layer> dispatch_over_group(std::unique_ptr<Layer> layer, void* nccl_comm, int64_t max_tokens_per_rank,
                                           std::unique_ptr<ExchangeKernels> kernels);

}  // namespace moejit
