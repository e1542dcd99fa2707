// SPEC.md stage 1 (routing) written with ATen tensor ops only, so it runs on whatever device the
// logits are on: the Iluvatar GPU through CoreX's torch, or the CPU in the tests. The ILU backend
// uses it for every routing that ixformer's topk_softmax cannot compute as SPEC.md says: sigmoid
// scoring, expert groups, the noaux_tc correction bias, a route scale other than 1.
//
// Same math as SPEC.md and the CPU kernel of moejit::route (fp32 throughout): non-finite logits
// mapped to +-FLT_MAX first; softmax or sigmoid; selection score q = p (+ bias for noaux_tc);
// groups scored by their max q (sum of the two best for noaux_tc) and the topk_group best kept;
// the K best allowed experts by q, ties to the lower index (stable sorts), ordered by descending q;
// weights = unbiased p, renormalized when asked (a zero sum leaves them), then times the route scale.
// No host synchronization; one stable sort over E per token (and one over G with groups).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "compiler/moe_config.h"

namespace moejit::ilu {

// logits [T, E] (any float dtype); bias [E] fp32, required for noaux_tc and ignored otherwise.
// Returns (topk_weights [T, K] fp32, topk_ids [T, K] int32) on the logits' device.
std::tuple<at::Tensor, at::Tensor> route_portable(const MoeConfig& config, const at::Tensor& logits,
                                                  const std::optional<at::Tensor>& bias);

// SPEC.md's map of non-finite values: NaN -> -FLT_MAX, +inf -> +FLT_MAX, -inf -> -FLT_MAX (fp32).
at::Tensor sanitize_logits(const at::Tensor& x);

}  // namespace moejit::ilu
