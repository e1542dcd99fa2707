#include "compiler/families/combine.h"

#include <fmt/format.h>

#include "compiler/families/spec_text.h"

namespace moejit {
namespace {

constexpr int kCombineThreads = 128;

}  // namespace

KernelPlan combine_kernel(const LayerSpec& c) {
  // 16-byte accesses when the hidden size splits into them.
  const int vec_full = 16 / static_cast<int>(dtype_bytes(c.dtype));
  const int vec = c.hidden % vec_full == 0 ? vec_full : 1;
  KernelPlan k;
  k.stage = Stage::Combine;
  k.role = KernelRole::Combine;
  k.entry = fmt::format("moejit_combine_h{}_k{}{}_{}", c.hidden, c.topk, spec_text::shared_suffix(c), to_string(c.dtype));
  k.unit = "combine";
  k.device_function = "moejit::combine_tokens";
  k.args_type = "moejit::CombineArgs";
  k.header = "moejit/combine.cuh";
  k.spec = {
      {"using", "Y", spec_text::device_type(c.dtype)},
      {"using", "Out", spec_text::device_type(c.dtype)},
      {"int", "kHidden", std::to_string(c.hidden)},
      {"int", "kTopk", std::to_string(c.topk)},
      {"int", "kThreads", std::to_string(kCombineThreads)},
      {"int", "kVec", std::to_string(vec)},
      {"int", "kSharedSlots", std::to_string(c.shared_slots())},
  };
  k.launch = {GridRule::TokensByColumns, kCombineThreads, int64_t{kCombineThreads} * vec, 0, c.hidden};
  // The token's slots (pair_pos, topk_weights) come from kernels two or more launches back, so the
  // combine reads them while GEMM 2 still runs and waits for it only before Y's loads.
  k.waits_in_body = true;
  return k;
}

CombineArgs combine_args(const CallContext& x) {
  const CallBuffers& b = x.buffers;
  return CombineArgs{b.at<char>(b.offsets.y), b.topk_weights,  b.at<int>(b.offsets.pair_pos),
                     b.in.residual,           b.output,        x.call.tokens};
}

}  // namespace moejit
