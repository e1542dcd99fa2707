// The argument checks every backend's layer call makes before any launch (runtime/layer.h states
// them): token range, null and misaligned pointers, workspace size. Each throws InvalidInput
// naming the argument.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compiler/layer_call.h"

namespace moejit {

// `p` is non-null and `alignment`-byte aligned.
void check_pointer(const void* p, const char* name, size_t alignment);

// 0 <= tokens and tokens * topk < 2^31.
void check_tokens(const LayerSpec& spec, int64_t tokens);

// Stage 1's inputs: the logits (element-aligned) and, for noaux_tc, the correction bias.
void check_routing_arguments(const LayerSpec& spec, int64_t tokens, const void* logits, const float* bias);

// A layer belongs to the device it was created for: a call on a stream of another device's
// context is refused (InvalidInput naming both), not run with that device's memory and tiles.
// forward()'s routing inputs: router_logits (router_gemm false) or gate_weight (router_gemm true),
// never both; gate_bias exactly for router_bias layers (element-aligned); the correction bias; no
// hidden_scale (quantized rows are for experts()).
void check_forward_routing_arguments(const LayerSpec& spec, int64_t tokens, const LayerInputs& in);

void check_call_device(int layer_device, int stream_device);

// Stages 2-6's inputs, output and workspace. Returns the workspace layout for `tokens` (which the
// size check computes anyway; empty for tokens == 0). With no tokens the per-token pointers
// (hidden, output, residual, workspace) may be null; the weights and scales are checked always;
// hidden_scale only for fp8 layers.
WorkspaceOffsets check_expert_arguments(const LayerSpec& spec, int64_t tokens, const LayerInputs& in,
                                        const void* output, const void* workspace, size_t workspace_size);

}  // namespace moejit
