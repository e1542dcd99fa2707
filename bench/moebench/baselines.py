"""What moejit is compared with: SPEC.md's routing in torch (a cross-check of moejit's ids), a
torch._grouped_mm experts layer, and transformers' Hugging Face eager experts loop; rel_err compares
their outputs."""

import torch
import torch.nn.functional as F


def torch_route(logits, bias, p):
    """SPEC.md stage 1 in torch (a cross-check of moejit's routing ids; ties may order differently)."""
    x = logits.float()
    s = torch.softmax(x, dim=-1) if p["scoring"] == "softmax" else torch.sigmoid(x)
    noaux = p["topk_method"] == "noaux_tc"
    q = s + bias if noaux else s
    groups = p.get("num_expert_group", 1)
    if groups > 1:
        t, e = q.shape
        qg = q.view(t, groups, e // groups)
        gscore = qg.topk(2, dim=-1).values.sum(-1) if noaux else qg.amax(-1)
        keep = gscore.topk(p["topk_group"], dim=-1).indices
        allowed = torch.zeros(t, groups, dtype=torch.bool, device=q.device).scatter_(1, keep, True)
        q = q.masked_fill(~allowed.repeat_interleave(e // groups, dim=1), float("-inf"))
    ids = q.topk(p["topk"], dim=-1).indices
    w = s.gather(1, ids)
    if p["renormalize"]:
        total = w.sum(-1, keepdim=True)
        w = torch.where(total > 0, w / total, w)
    return w * p["routed_scaling_factor"], ids


def grouped_mm_experts(hidden, ids, weights, w13, w2):
    """Routed experts with torch._grouped_mm (what transformers' "grouped_mm" implementation does, made
    CUDA-graph safe: no host syncs). ids [T,K] int32, weights [T,K] fp32."""
    tokens, hid = hidden.shape
    k = ids.shape[1]
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    sorted_ids, perm = torch.sort(ids.reshape(-1), stable=True)
    x = hidden.index_select(0, perm // k)
    bounds = torch.arange(experts, device=ids.device, dtype=sorted_ids.dtype)
    offs = torch.searchsorted(sorted_ids, bounds, right=True).to(torch.int32)  # inclusive cumsum of counts
    g = torch._grouped_mm(x, w13.transpose(-2, -1), offs=offs)  # [M, 2I]
    act = F.silu(g[:, :inter]) * g[:, inter:]
    y = torch._grouped_mm(act, w2.transpose(-2, -1), offs=offs)  # [M, H]
    yw = y * weights.reshape(-1)[perm].to(y.dtype).unsqueeze(1)
    unsorted = torch.empty_like(yw).index_copy_(0, perm, yw)
    return unsorted.view(tokens, k, hid).sum(dim=1, dtype=torch.float32).to(hidden.dtype)


def _hf_eager_copy(self, hidden_states, top_k_index, top_k_weights):
    # transformers 5.17 MixtralExperts.forward (the eager implementation), verbatim but for names;
    # used only when transformers cannot be imported.
    final_hidden_states = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts)
        expert_mask = expert_mask.permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:
        expert_idx = expert_idx[0]
        if expert_idx == self.num_experts:
            continue
        top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
        current_state = hidden_states[token_idx]
        gate, up = torch.nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
        current_hidden_states = self.act_fn(gate) * up
        current_hidden_states = torch.nn.functional.linear(current_hidden_states, self.down_proj[expert_idx])
        current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
    return final_hidden_states


def hf_eager_forward():
    """(function(self, hidden, top_k_index, top_k_weights), description): transformers' own eager
    MixtralExperts.forward (unwrapped from the experts-implementation dispatcher), else a copy."""
    try:
        import transformers
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts

        fn = getattr(MixtralExperts.forward, "__wrapped__", None)
        if fn is not None:
            return fn, f"transformers {transformers.__version__} MixtralExperts.forward (eager loop)"
    except Exception:  # noqa: BLE001
        pass
    return _hf_eager_copy, "a copy of transformers 5.17 MixtralExperts eager forward (transformers not importable)"


def rel_err(a, b):
    a, b = a.float(), b.float()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30)).item()
