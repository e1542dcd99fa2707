// The workspace of one layer call: a pure function of (spec, max_tokens) (DESIGN.md decision 6),
// so a caller can allocate it once and every rank of a group needs the same size.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/moe_config.h"

namespace moejit {

struct WorkspaceBuffer {
  std::string name;
  int64_t offset = 0;
  int64_t bytes = 0;
  std::string what;
};

struct WorkspaceLayout {
  int64_t max_tokens = 0;
  int64_t total_bytes = 0;
  std::vector<WorkspaceBuffer> buffers;

  // Throws Error when the buffer is not part of this layout.
  const WorkspaceBuffer& at(std::string_view name) const;
};

// The most tokens one call of the layer takes: T * topk pairs below 2^31, since the kernels index
// pairs in int32 (every workspace size then stays far inside int64).
int64_t max_layer_tokens(const LayerSpec& spec);
// Throws InvalidInput naming `field` and the allowed range when tokens is outside 0..max_layer_tokens.
void check_token_count(const LayerSpec& spec, int64_t tokens, const char* field);

// Throws InvalidInput when max_tokens is outside 0..max_layer_tokens or the spec is invalid.
WorkspaceLayout plan_workspace(const LayerSpec& spec, int64_t max_tokens);

// The same layout as byte offsets, computed without allocating or validating (a layer call
// computes it per call). Buffers the spec does not use are -1.
struct WorkspaceOffsets {
  int64_t topk_weights = -1, topk_ids = -1, block_counts = -1, expert_counts = -1, expert_offsets = -1,
          sorted_pair = -1, pair_pos = -1, tile_expert = -1, tile_row = -1, num_tiles = -1;
  int64_t act = -1, y = -1;                                               // unquantized act; y always
  int64_t router_logits = -1;                                             // router_gemm
  int64_t a_q = -1, a_scale = -1, act_f32 = -1, act_q = -1, act_scale = -1;  // w8a8, fp8
  int64_t total_bytes = 0;
};
WorkspaceOffsets workspace_offsets(const LayerSpec& spec, int64_t tokens);

}  // namespace moejit
