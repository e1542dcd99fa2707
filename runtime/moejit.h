/* moejit C ABI: compile an MoE layer at model load and run it on raw device pointers.
 * For engines in other languages and ctypes. Every function returns 0 on success, 2 when an
 * argument or the configuration is invalid, 1 on any other failure; moejit_last_error() then
 * returns the message (per thread, valid until the next call on that thread). */
#ifndef MOEJIT_H
#define MOEJIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moejit_layer moejit_layer;

/* Device pointers of one call; SPEC.md gives the shapes. Unused entries are NULL.
 * w13/w2 are int8 for quant w8a8_int8 and float8_e4m3fn for fp8_block / fp8_tensor.
 * w13_scale, w2_scale (fp32): every quantized layer; w8a8_int8 per output channel ([E_loc, N1],
 * [E_loc, H]), fp8_block per 128 x 128 block ([E_loc, ceil(N1/128), ceil(H/128)],
 * [E_loc, ceil(H/128), ceil(I/128)]), fp8_tensor one per matrix ([E_loc], [E_loc]).
 * input_smooth [E, H], act_smooth [E_loc, I] (fp32): w8a8_int8 only.
 * w13_bias [E_loc, N1], w2_bias [E_loc, H] (fp32): layers with expert_bias (gpt-oss) only.
 * With fuse_shared_experts, E_loc above is E_loc + n_shared_experts (the shared experts after the
 * routed ones) and E in input_smooth is E + n_shared_experts.
 * Zero-initialize the struct (moejit_inputs in = {0};) so that entries added later stay NULL.
 * Entries are only ever appended; a caller built against an older header (or a ctypes mirror of it)
 * must be rebuilt (or given the new fields), since the library reads the whole struct. */
typedef struct moejit_inputs {
  const void* hidden;
  const void* router_logits;
  const void* w13;
  const void* w2;
  const float* e_score_correction_bias;
  const float* w13_scale;
  const float* w2_scale;
  const float* input_smooth;
  const float* act_smooth;
  const void* residual;
  const float* w13_bias;
  const float* w2_bias;
  /* router_gemm layers: the router's weight [E, H] (dtype), from which moejit_layer_forward
   * computes the logits; router_logits is then NULL (moejit_layer_route still takes logits). */
  const void* gate_weight;
  /* router_bias layers (router_gemm with a biased router, gpt-oss): the router's bias [E] (dtype),
   * added to the logits before they are rounded; NULL for every other layer. */
  const void* gate_bias;
} moejit_inputs;

/* config: a preset name ("deepseek-v3"), a path to a config file or model folder, or a JSON text
 * (moejit format or Hugging Face config.json), chosen by its first character ('{' means JSON).
 * overrides_json: NULL or a JSON object of field overrides, e.g. {"ep_size": 8, "ep_rank": 3}. */
int moejit_layer_create(const char* config, const char* overrides_json, moejit_layer** out);
/* As moejit_layer_create, for a rank of an expert- and tensor-parallel group: nccl_comm is an
 * ncclComm_t the caller owns (it must outlive the layer), of the ep_size * tp_size ranks whose
 * outputs make the layer's, on the layer's device. moejit_layer_forward and moejit_layer_experts
 * then end with the sum of the output over it (ncclAllReduce on the call's stream; the residual is
 * added on the communicator's rank 0 only). NCCL is loaded at run time and must be the one that made
 * the communicator: MOEJIT_NCCL_LIBRARY, else the NCCL the process exports, else libnccl.so.2
 * (runtime/nccl.h); a communicator of another size or device is refused (2). NULL nccl_comm: as
 * moejit_layer_create. */
int moejit_layer_create_in_group(const char* config, const char* overrides_json, void* nccl_comm,
                                 moejit_layer** out);
/* As moejit_layer_create_in_group, in the all_to_all mode of expert parallel: each rank passes its
 * own tokens (T in [0, max_tokens_per_rank], which may differ by rank), and moejit_layer_forward /
 * moejit_layer_experts send each token's row to the ranks holding its experts and add the returned
 * sums, so the output is the whole layer's for this rank's tokens. Every rank of the communicator
 * must make each call. nccl_comm has ep_size ranks, rank i being the layer's ep_rank i; tp_size 1;
 * max_tokens_per_rank (the same on every rank) sizes the exchange's fixed slabs and the workspace
 * (runtime/dispatched_layer.h). A rank given more tokens serves the others, then returns 2. */
int moejit_layer_create_all_to_all(const char* config, const char* overrides_json, void* nccl_comm,
                                   int64_t max_tokens_per_rank, moejit_layer** out);
void moejit_layer_destroy(moejit_layer* layer);

/* Workspace bytes for up to max_tokens tokens. */
int moejit_layer_workspace_bytes(const moejit_layer* layer, int64_t max_tokens, size_t* bytes);

/* Asynchronous on stream (a CUstream / cudaStream_t; NULL = legacy default stream). */
int moejit_layer_forward(const moejit_layer* layer, void* stream, int64_t tokens, const moejit_inputs* inputs,
                         void* output, void* workspace, size_t workspace_bytes);

/* Stage 1 alone: topk_weights [T, K] fp32 and topk_ids [T, K] int32 (device pointers) from
 * inputs->router_logits (and e_score_correction_bias for noaux_tc). Refused (2) for a layer whose
 * topk exceeds its experts: such a layer serves moejit_layer_experts only. */
int moejit_layer_route(const moejit_layer* layer, void* stream, int64_t tokens, const moejit_inputs* inputs,
                       float* topk_weights, int* topk_ids);

/* Stages 2-6 given the caller's routing (topk_ids [T, K] int32, topk_weights [T, K] fp32, device
 * pointers; an id outside [0, experts) contributes nothing); router_logits and the correction bias
 * are not read. */
int moejit_layer_experts(const moejit_layer* layer, void* stream, int64_t tokens, const int* topk_ids,
                         const float* topk_weights, const moejit_inputs* inputs, void* output, void* workspace,
                         size_t workspace_bytes);

/* The layer's configuration as moejit JSON; the string lives as long as the layer. */
const char* moejit_layer_config_json(const moejit_layer* layer);

/* One MoE layer's expert tensors from a model folder's safetensors checkpoint, in device memory.
 * moejit_experts_load reads layer `layer` (its index in the model) for the rank that overrides_json
 * names (the folder's config.json with the overrides, as moejit_layer_create takes them: tp_size /
 * tp_rank, ep_size / ep_rank), packs it as a layer call takes it (w13 gate rows then up rows, w2,
 * the rank's experts and slice of the intermediate size, fp8 scales, the correction bias, gpt-oss's
 * expert biases, and for router_gemm the router's gate_weight [E, H] in the model dtype, whole on
 * every rank, with router_bias its gate_bias [E]) and copies it to CUDA device `device` (synchronously; freed by
 * moejit_experts_destroy, which must come before the process drops the device). A missing or
 * malformed file or tensor is 2, naming the file and the tensor. */
typedef struct moejit_experts moejit_experts;
int moejit_experts_load(const char* model_dir, int layer, const char* overrides_json, int device,
                        moejit_experts** out);
void moejit_experts_destroy(moejit_experts* experts);
/* Sets inputs->w13, w2 and, where the layer has them, w13_scale, w2_scale, e_score_correction_bias,
 * w13_bias, w2_bias, gate_weight and gate_bias to the device copies; the other entries are left as
 * they are. */
int moejit_experts_fill_inputs(const moejit_experts* experts, moejit_inputs* inputs);
/* Device bytes held. */
int moejit_experts_bytes(const moejit_experts* experts, size_t* bytes);

const char* moejit_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MOEJIT_H */
