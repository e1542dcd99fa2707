#include "compiler/workspace.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "compiler/families/grouped_gemm.h"
#include "compiler/families/index.h"

namespace moejit {
namespace {

constexpr int64_t kWorkspaceAlign = 256;

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// The one list of workspace buffers: calls add(name, bytes, what, member) in layout order.
template <typename Add>
void visit_workspace(const LayerSpec& c, int64_t tokens, Add&& add) {
  const int64_t routed_pairs = tokens * c.topk;
  // Pairs and experts past routing include the fused shared experts (K' slots a token, E_loc + S);
  // the descriptions below say K and E_loc for those (K' = K, E_loc + S = E_loc without them).
  const int64_t pairs = tokens * c.pair_slots();
  const int64_t e_loc = c.gemm_experts();
  const int64_t inter = c.local_intermediate();
  const int64_t elem = dtype_bytes(c.dtype);
  // Sized for the shortest row tile any plan may use (16, also with MOEJIT_TILES), so the layout
  // stays a function of (spec, tokens) alone.
  const int64_t tiles = max_row_tiles(c, tokens, kMinRowTile);
  const int64_t index_blocks = (pairs + kPairsPerIndexBlock - 1) / kPairsPerIndexBlock;
  using W = WorkspaceOffsets;
  add("topk_weights", routed_pairs * 4, "[T, K] fp32", &W::topk_weights);
  add("topk_ids", routed_pairs * 4, "[T, K] int32", &W::topk_ids);
  add("block_counts", index_blocks * e_loc * 4, "[ceil(T*K'/1024), E_loc] int32", &W::block_counts);
  add("expert_counts", e_loc * 4, "[E_loc] int32", &W::expert_counts);
  add("expert_offsets", (e_loc + 1) * 4, "[E_loc + 1] int32", &W::expert_offsets);
  add("sorted_pair", pairs * 4, "[T*K'] int32", &W::sorted_pair);
  add("pair_pos", pairs * 4, "[T*K'] int32", &W::pair_pos);
  add("tile_expert", tiles * 4, "[max_row_tiles] int32", &W::tile_expert);
  add("tile_row", tiles * 4, "[max_row_tiles] int32", &W::tile_row);
  add("num_tiles", 4, "[1] int32", &W::num_tiles);
  if (c.quant == Quant::W8A8Int8) {
    add("a_q", pairs * c.hidden, "[T*K, H] int8", &W::a_q);
    add("a_scale", pairs * 4, "[T*K] fp32", &W::a_scale);
    add("act_f32", pairs * inter * 4, "[T*K, I] fp32", &W::act_f32);
    add("act_q", pairs * inter, "[T*K, I] int8", &W::act_q);
    add("act_scale", pairs * 4, "[T*K] fp32", &W::act_scale);
  } else if (is_fp8(c.quant)) {
    // fp8 quantizes each token's hidden row once (no per-expert smoothing), GEMM 1 gathers it.
    const int64_t hidden_groups = activation_scale_groups(c, c.hidden);
    const int64_t act_groups = activation_scale_groups(c, inter);
    const bool block = c.quant == Quant::Fp8Block;
    add("a_q", tokens * c.hidden, "[T, H] e4m3", &W::a_q);
    add("a_scale", tokens * hidden_groups * 4, block ? "[T, ceil(H/128)] fp32" : "[T] fp32", &W::a_scale);
    add("act_f32", pairs * inter * 4, "[T*K, I] fp32", &W::act_f32);
    add("act_q", pairs * inter, "[T*K, I] e4m3", &W::act_q);
    add("act_scale", pairs * act_groups * 4, block ? "[T*K, ceil(I/128)] fp32" : "[T*K] fp32", &W::act_scale);
  } else {
    add("act", pairs * inter * elem, "[T*K, I] model dtype", &W::act);
  }
  add("y", pairs * c.hidden * elem, "[T*K, H] model dtype", &W::y);
  // Last, so that a layer without the router GEMM keeps the offsets it had.
  if (c.router_gemm)
    add("router_logits", tokens * c.experts * dtype_bytes(c.router_dtype), "[T, E] router_dtype",
        &W::router_logits);
}

}  // namespace

const WorkspaceBuffer& WorkspaceLayout::at(std::string_view name) const {
  for (const auto& b : buffers)
    if (b.name == name) return b;
  throw Error(fmt::format("moejit internal error: the workspace has no buffer named {}", name));
}

WorkspaceOffsets workspace_offsets(const LayerSpec& c, int64_t tokens) {
  WorkspaceOffsets offsets;
  visit_workspace(c, tokens, [&](const char*, int64_t bytes, const char*, int64_t WorkspaceOffsets::*member) {
    offsets.*member = offsets.total_bytes;
    offsets.total_bytes = align_up(offsets.total_bytes + bytes, kWorkspaceAlign);
  });
  return offsets;
}

int64_t max_layer_tokens(const LayerSpec& c) { return ((int64_t{1} << 31) - 1) / std::max(c.pair_slots(), 1); }

void check_token_count(const LayerSpec& c, int64_t tokens, const char* field) {
  if (tokens < 0 || tokens > max_layer_tokens(c))
    throw InvalidInput(fmt::format(
        "{}: {} is out of range; allowed 0..{} (tokens x {} below 2^31)", field, tokens, max_layer_tokens(c),
        c.shared_slots() > 0 ? fmt::format("{} pairs a token (topk and the fused shared experts)", c.pair_slots())
                             : fmt::format("topk {}", c.topk)));
}

WorkspaceLayout plan_workspace(const LayerSpec& c, int64_t max_tokens) {
  validate(c);
  check_token_count(c, max_tokens, "max_tokens");
  WorkspaceLayout layout;
  layout.max_tokens = max_tokens;
  visit_workspace(c, max_tokens, [&](const char* name, int64_t bytes, const char* what, auto) {
    layout.buffers.push_back({name, layout.total_bytes, bytes, what});
    layout.total_bytes = align_up(layout.total_bytes + bytes, kWorkspaceAlign);
  });
  return layout;
}

}  // namespace moejit
