#include "compiler/families/quantize.h"

#include <algorithm>

#include <fmt/format.h>

#include "compiler/families/spec_text.h"

namespace moejit {
namespace {

constexpr int kQuantizeMaxThreads = 256;

// Threads per row (one block per row): about 4 of the row's 16-byte chunks a thread, which
// quantize.cuh's RowChunks then holds in registers (a warp at least, kQuantizeMaxThreads at most).
// Rows that are not whole 16-byte chunks, and fp8_block's warps per 128-column group, take the
// most threads.
int quantize_threads(int64_t cols, int src_bytes, bool per_group) {
  if (per_group || (cols * src_bytes) % 16 != 0) return kQuantizeMaxThreads;
  const int64_t chunks = cols * src_bytes / 16;
  const int64_t threads = (chunks + 4 * 32 - 1) / (4 * 32) * 32;
  return static_cast<int>(std::clamp<int64_t>(threads, 32, kQuantizeMaxThreads));
}

}  // namespace

std::vector<KernelPlan> quantize_kernels(const LayerSpec& c) {
  const bool fp8 = is_fp8(c.quant);
  std::vector<KernelPlan> out;
  auto make = [&](bool expand) {
    KernelPlan k;
    k.stage = expand ? Stage::Expand : Stage::Gemm1;
    k.role = expand ? KernelRole::QuantizeExpand : KernelRole::QuantizeAct;
    const int64_t cols = expand ? c.hidden : c.local_intermediate();
    if (fp8) {
      // "fp8_block" / "fp8_tensor" in the names: the two group sizes are different kernels.
      k.entry = expand ? fmt::format("moejit_quantize_tokens_h{}_{}_{}", cols, to_string(c.quant), to_string(c.dtype))
                       : fmt::format("moejit_quantize_act_i{}_e{}_{}", cols, c.gemm_experts(), to_string(c.quant));
    } else {
      k.entry = expand ? fmt::format("moejit_quantize_expand_h{}_k{}{}_e{}_{}", cols, c.topk,
                                     spec_text::shared_suffix(c), c.gemm_experts(), to_string(c.dtype))
                       : fmt::format("moejit_quantize_act_i{}_e{}", cols, c.gemm_experts());
    }
    k.unit = "quantize";
    k.device_function = fp8 ? "moejit::quantize_fp8_rows" : "moejit::quantize_rows";
    k.args_type = "moejit::QuantizeArgs";
    k.header = "moejit/quantize.cuh";
    const std::string src = expand ? spec_text::device_type(c.dtype) : "float";
    const int src_bytes = expand ? dtype_bytes(c.dtype) : 4;
    const int threads = quantize_threads(cols, src_bytes, c.quant == Quant::Fp8Block);
    if (fp8) {
      const int64_t group = c.quant == Quant::Fp8Block ? kFp8BlockSize : cols;
      k.spec = {
          {"using", "Src", src},
          {"long long", "kCols", std::to_string(cols)},
          {"long long", "kGroupCols", std::to_string(group)},
          {"int", "kThreads", std::to_string(threads)},
          {"int", "kLocalExperts", std::to_string(c.gemm_experts())},
          {"bool", "kSorted", spec_text::boolean(!expand)},
      };
      // Stage 3 quantizes a token's row once; the re-quantization a sorted row (pair) each.
      k.launch = {expand ? GridRule::TokensPerBlock : GridRule::SortedRows, threads, 1};
      return k;
    }
    k.spec = {
        {"using", "Src", src},
        {"int", "kCols", std::to_string(cols)},
        {"int", "kThreads", std::to_string(threads)},
        {"int", "kTopk", std::to_string(c.topk)},
        {"int", "kLocalExperts", std::to_string(c.gemm_experts())},
        {"bool", "kGather", spec_text::boolean(expand)},
        {"int", "kSharedSlots", std::to_string(c.shared_slots())},
        {"int", "kExperts", std::to_string(c.experts)},
    };
    k.launch = {GridRule::SortedRows, threads, 1};
    return k;
  };
  out.push_back(make(true));
  out.push_back(make(false));
  return out;
}

QuantizeArgs quantize_expand_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  const WorkspaceOffsets& o = b.offsets;
  return QuantizeArgs{b.in.hidden,
                      b.at<int>(o.sorted_pair),
                      b.topk_ids,
                      b.at<int>(o.expert_offsets),
                      first_local_expert(x.spec, x.placement),
                      x.spec.quant == Quant::W8A8Int8 ? b.in.input_smooth : nullptr,
                      b.at<signed char>(o.a_q),
                      b.at<float>(o.a_scale)};
}

QuantizeArgs quantize_act_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  const WorkspaceOffsets& o = b.offsets;
  return QuantizeArgs{b.at<char>(o.act_f32),
                      b.at<int>(o.sorted_pair),
                      b.topk_ids,
                      b.at<int>(o.expert_offsets),
                      first_local_expert(x.spec, x.placement),
                      nullptr,
                      b.at<signed char>(o.act_q),
                      b.at<float>(o.act_scale)};
}

}  // namespace moejit
