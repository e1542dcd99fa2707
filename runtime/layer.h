// The C++ API an inference engine calls: compile a layer at model load, then run it on raw device
// pointers, on the caller's stream, with no host synchronization and no allocation per call.
//
//   auto layer = moejit::Layer::create(moejit::preset("deepseek-v3"));   // compiles + loads
//   size_t bytes = layer->workspace_bytes(max_tokens);                   // caller allocates
//   layer->forward(stream, tokens, inputs, output, workspace, bytes);    // asynchronous
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/layer_call.h"
#include "compiler/moe_config.h"
#include "compiler/plan.h"
#include "compiler/tiles.h"

namespace moejit {

// LayerInputs (the device pointers of one call, SPEC.md's shapes) is in compiler/layer_call.h.

// How a layer with an NCCL communicator finishes its output over the group (docs/EXPERT_PARALLEL.md).
enum class ExpertParallelMode {
  AllReduce,  // every rank holds the same tokens; its part of the output is summed over the group
  AllToAll,   // every rank holds its own tokens, sent to the ranks holding their experts and back
};

struct LayerOptions {
  std::string arch;      // empty: the current device's
  int device = -1;       // -1: the current context's device, else device 0
  // GEMM tiles instead of the planner's (MOEJIT_TILES still wins). Empty: the tiles `moejit compile
  // --autotune` stored for this config and device, if any, else the planner's.
  std::vector<TileOverride> tiles;
  // An ncclComm_t the caller owns, of the ep_size * tp_size ranks whose outputs make the layer's:
  // forward() and experts() then end with their sum over it (expert parallel's all_reduce mode,
  // runtime/reduced_layer.h), on the caller's stream. Null: the output is this rank's part alone.
  void* nccl_comm = nullptr;
  // With nccl_comm: AllReduce (above), or AllToAll (runtime/dispatched_layer.h): forward() and
  // experts() take this rank's own tokens (T may differ by rank, 0 included, and every rank of the
  // group must make each call), send each token's row to the ranks that hold its experts, run the
  // local experts on what arrives and add the returned sums, so the output is the whole layer's for
  // this rank's tokens. The communicator then has ep_size ranks, rank i being ep_rank i; tp_size 1.
  ExpertParallelMode ep_mode = ExpertParallelMode::AllReduce;
  // AllToAll: the most tokens a call may take on any rank (C, the same on every rank): each rank
  // sends every other one a slab of C rows whatever the routing (no host synchronization). Required
  // (> 0) for AllToAll, 0 otherwise.
  int64_t max_tokens_per_rank = 0;
};

class Layer {
 public:
  // Validates the config (InvalidInput) and picks the device's backend (runtime/backend_select.h:
  // the JIT, or ixformer on Iluvatar devices). The JIT compiles or loads every kernel (cache) for
  // the config's spec, and loads the modules into the current context (creating device's primary
  // context if none is current). Throws Error when there is no usable GPU, when the device's
  // backend is not in this process, or when called while a stream on this thread's context is
  // being captured ("warm up before graph capture").
  static std::unique_ptr<Layer> create(const MoeConfig& config, const LayerOptions& options = {});

  virtual ~Layer() = default;

  virtual const MoeConfig& config() const = 0;
  // The JIT's plan (kernels, buckets, arch); null for a backend that plans no kernels (ixformer).
  virtual const Plan* plan() const = 0;

  // Workspace a forward of up to max_tokens tokens needs; monotonic in max_tokens (0 for a backend
  // that needs none). Throws InvalidInput when max_tokens < 0.
  virtual size_t workspace_bytes(int64_t max_tokens) const;

  // What the backend built, as a JSON object: the JIT's kernels, units and arch; another backend's
  // name and what it computes how (the torch op moejit::compile returns it).
  virtual std::string describe() const = 0;

  // Runs the layer on `stream` (a CUstream / cudaStream_t; null = legacy default stream).
  // Checks, before any launch, that tokens is in [0, 2^31 / topk), every pointer the config needs
  // is non-null and aligned (16 bytes for hidden, weights, output and residual; 256 for the
  // workspace; the element size for router_logits and gate_bias; 4 for fp32 arrays), and workspace_size >=
  // workspace_bytes(tokens); throws InvalidInput naming the
  // argument otherwise. tokens == 0 returns at once (the per-token pointers, hidden, logits,
  // residual, output, workspace and the top-k arrays, may then be null, as an empty tensor's
  // are). Never synchronizes or allocates; graph
  // capturable once the layer's modules are loaded in the stream's context. A stream of another
  // context on the layer's device loads the modules there on first use; one on another device is
  // refused (InvalidInput): a layer per device.
  virtual void forward(void* stream, int64_t tokens, const LayerInputs& inputs, void* output, void* workspace,
                       size_t workspace_size) const = 0;

  // Stage 1 alone: topk_weights [T, K] fp32 and topk_ids [T, K] int32 from the router logits
  // (and the correction bias for noaux_tc). Same checks and guarantees as forward.
  virtual void route(void* stream, int64_t tokens, const void* router_logits, const float* e_score_correction_bias,
                     float* topk_weights, int* topk_ids) const = 0;

  // Stages 2-6 given a routing: what a model whose router runs elsewhere (Hugging Face's experts
  // modules) calls. topk_ids [T, K] int32 in [0, experts), topk_weights [T, K] fp32; in `inputs`
  // router_logits and e_score_correction_bias are ignored. Same checks and guarantees as forward.
  virtual void experts(void* stream, int64_t tokens, const int* topk_ids, const float* topk_weights,
                       const LayerInputs& inputs, void* output, void* workspace, size_t workspace_size) const = 0;

  // Number of kernel launches forward makes for `tokens` tokens (the JIT's; 0 for a backend that
  // does not launch moejit kernels).
  virtual int launches(int64_t tokens) const = 0;
};

}  // namespace moejit
