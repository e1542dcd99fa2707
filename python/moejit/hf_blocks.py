"""Whole Hugging Face MoE blocks on one moejit call: the router's linear (below), routing, experts,
combine and, where they are one plain gated MLP, the shared experts, in
``torch.ops.moejit.moe_layer_gate`` or ``moe_layer``.

``moejit.patch(model)`` replaces the forward of each block whose math SPEC.md covers; the experts of
every other block still run on moejit through the experts implementation (hf.py). The router's
linear (the gate weight times the hidden states, in the precision the model uses: fp32 for
DeepSeek-V2/V3 and GLM-4.5, whose routers cast both to fp32, the model dtype for the others) runs in
the same call (``torch.ops.moejit.moe_layer_gate``) where the layer's router GEMM was the faster on
the H200 (bench/RESULTS.md, session 18): at decode (T <= ROUTER_IN_LAYER_MAX_TOKENS) for every
router, at every T for an fp32 router in a bf16/fp16 model (DeepSeek-V3: torch casts the gate to fp32
on each call). Elsewhere it stays a torch matmul beside the call: the layer's tensor-core router tiles
were 0.5-2.5% slower there, and an fp32 model's router GEMM has no tensor-core tiles. Under
torch.compile the T bound is a guard: a batch on the other side of it compiles a second graph.

  block                    routing moejit computes                           shared experts
  MixtralSparseMoeBlock    softmax, top-k, renormalize                       -
  Qwen3MoeSparseMoeBlock   softmax, top-k, renormalize if norm_topk_prob     -
  DeepseekV3MoE,           sigmoid, correction bias, groups (noaux_tc),      in the call if S = 1 (both
  Glm4MoeMoE                 renormalize if norm_topk_prob,                    families' checkpoints), else
                             routed_scaling_factor                             residual shared_experts(x)
  DeepseekV2Moe            softmax, top-k (greedy or group_limited_greedy),  as DeepseekV3MoE (its
                             routed_scaling_factor, never renormalized (its    checkpoints have S = 2:
                             router ignores norm_topk_prob)                    residual)
  Qwen3NextSparseMoeBlock  softmax, top-k, renormalize if norm_topk_prob     residual sigmoid(shared_expert_gate(x))
                                                                               * shared_expert(x)
  GptOssMLP                the router's bias (router_bias), softmax over      -
                             the top-k logits (= softmax, top-k, renormalize)
                             (hf_gpt_oss: its experts' biases, clamped SwiGLU, repacked weights)

Shared experts fused (``fuse_shared_experts``, docs/LAYER_MATH.md): a block whose shared experts are
one plain gated MLP (gate_proj, up_proj, down_proj without biases, the model's activation),
n_shared_experts (S) * moe_intermediate wide, runs them in the layer's own grouped GEMMs as S more
experts of weight 1 (bench/RESULTS.md session 17: 4 launches instead of 9 at decode). The layer takes
them after the routed experts in one w13 [E + S, 2I, H] and one w2 [E + S, H, I], so at patch time the
block's weights move into those two packed tensors, once, and the Hugging Face parameters become views
of them: experts.gate_up_proj = w13[:E], experts.down_proj = w2[:E], and the shared MLP's gate_proj,
up_proj and down_proj weights = w13[E, :I], w13[E, I:] and w2[E]. No weight is held twice, and the
block's own forward (the fallbacks below), optimizer steps and load_state_dict read and write the same
memory the fused call reads. Only S == 1 is fused: for S > 1 the shared MLP's down_proj [H, S*I] is not
a view of w2's [S, H, I] rows (nor gate_proj [S*I, H] of w13's interleaved gate and up rows), and a
copy of the shared weights would go stale the moment anything updated the parameters in place (a
training step on the fallback path, load_state_dict): such blocks (DeepSeek-V2 and V2-Lite have S = 2)
keep the shared MLP in torch as the call's residual, and MOEJIT_LOG=info says so.

What keeps the views true: model.to()/cuda()/half() convert the packed tensors and point the
parameters at the result before converting each parameter (which is then a no-op); a conversion that
copies every tensor anyway (to_empty) or a load_state_dict(assign=True), deepcopy or a parameter
replaced by hand leaves parameters that no longer alias the packed tensors, and the block packs them
again (at once after _apply and load_state_dict, else at its next eager forward; under torch.compile
the check is not traced, so replace parameters before compiling). model.state_dict() holds the same
keys and values as before patching; its tensors of a packed block alias the parameters' memory
without sharing one storage object between keys, so save_pretrained and safetensors write them as
they are (transformers would otherwise clone every tensor it finds sharing a storage before writing).

A patched block falls back to its own forward while training (router jitter, auxiliary losses), when
gradients are wanted (the moejit ops have no backward) and when anything observes its router
(output_router_logits hooks it), which only its own router serves.
``MOEJIT_LOG=info`` says which blocks were taken whole, whether their shared experts were fused, and
why not.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import types
from typing import Callable, Optional

import torch
import torch.nn.functional as F
import torch.utils.dlpack

from . import hf_gpt_oss
from .config import MoeConfig, activation_from_hf, check_hf_experts, dtype_name

log = logging.getLogger("moejit")

__all__ = ["block_rule", "shared_experts_rule", "patch_blocks"]

MAX_TOPK = 32  # the library's limit (compiler/moe_config.cpp)
# The decode bucket's last T (compiler/heuristics/buckets.cpp), where the router GEMM runs its SIMT
# kernel; if the bucket moves, this only moves where the faster path is taken, not what is computed.
ROUTER_IN_LAYER_MAX_TOKENS = 32


def _routing(block: torch.nn.Module) -> Optional[dict]:
    """The MoeConfig routing fields of the block's class, or None when moejit has no rule for it.
    ValueError (why) for a router variant of a known class that moejit does not compute."""
    kind = type(block).__name__
    gate = getattr(block, "gate", None)
    if kind == "MixtralSparseMoeBlock":
        return dict(scoring="softmax", topk_method="greedy", renormalize=True)
    if kind in ("Qwen3MoeSparseMoeBlock", "Qwen3NextSparseMoeBlock"):
        return dict(scoring="softmax", topk_method="greedy", renormalize=bool(getattr(gate, "norm_topk_prob", False)))
    if kind in ("DeepseekV3MoE", "Glm4MoeMoE"):  # the same router code (DeepseekV3TopkRouter, Glm4MoeTopkRouter)
        return dict(scoring="sigmoid", topk_method="noaux_tc", num_expert_group=int(gate.num_group),
                    topk_group=int(gate.topk_group), renormalize=bool(gate.norm_topk_prob),
                    routed_scaling_factor=float(gate.routed_scaling_factor), router_dtype="fp32")
    if kind == "DeepseekV2Moe":
        # DeepseekV2TopkRouter: fp32 logits, softmax, top-k of the scores (group_limited_greedy: groups
        # scored by their best expert, the others' scores set to 0, which SPEC's exclusion matches:
        # an excluded expert could only be picked with weight 0), times routed_scaling_factor; it
        # never renormalizes, whatever norm_topk_prob says.
        method = gate.topk_method
        common = dict(scoring="softmax", renormalize=False, routed_scaling_factor=float(gate.routed_scaling_factor),
                      router_dtype="fp32")
        if method == "greedy":
            return dict(common, topk_method="greedy")
        if method == "group_limited_greedy":
            return dict(common, topk_method="group_limited_greedy", num_expert_group=int(gate.num_group),
                        topk_group=int(gate.topk_group))
        raise ValueError(f"topk_method {method!r} is not one DeepseekV2TopkRouter computes (greedy, group_limited_greedy)")
    return None


# Blocks whose shared experts are one plain gated MLP, n_shared_experts * moe_intermediate wide, with
# the model's activation, added to the routed output: block.shared_experts(x).
_PLAIN_SHARED_MLP = ("DeepseekV3MoE", "Glm4MoeMoE", "DeepseekV2Moe")


def _residual(block: torch.nn.Module) -> Callable:
    """The block's shared-expert output for the [T, H] hidden states, or None."""
    kind = type(block).__name__
    if kind in _PLAIN_SHARED_MLP:
        return lambda x: block.shared_experts(x)
    if kind == "Qwen3NextSparseMoeBlock":
        return lambda x: torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    return lambda x: None


def shared_experts_rule(block: torch.nn.Module):
    """(S, None) when the layer can compute the block's S shared experts in its own GEMMs with the
    block's weights as views of the packed tensors (module docstring); (0, why not) when it has shared
    experts the layer does not compute; (0, None) when it has none."""
    kind = type(block).__name__
    if kind == "Qwen3NextSparseMoeBlock":
        return 0, "its shared expert is gated per token (shared_expert_gate), which the layer does not compute"
    if kind not in _PLAIN_SHARED_MLP:
        return 0, None
    experts, shared = block.experts, getattr(block, "shared_experts", None)
    S = getattr(getattr(block, "config", None), "n_shared_experts", None)
    if shared is None or not isinstance(S, int) or S < 1:
        return 0, None
    linears = [getattr(shared, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(m, torch.nn.Linear) for m in linears):
        return 0, "its shared MLP's projections are not plain nn.Linear (quantized?)"
    if any(m.bias is not None for m in linears):
        return 0, "its shared MLP has biases (mlp_bias), which the layer's experts do not take"
    H, I = int(experts.hidden_dim), int(experts.intermediate_dim)
    gate, up, down = (m.weight for m in linears)
    if tuple(gate.shape) != (S * I, H) or tuple(up.shape) != (S * I, H) or tuple(down.shape) != (H, S * I):
        return 0, f"its shared MLP is not n_shared_experts ({S}) * moe_intermediate ({I}) wide"
    if getattr(getattr(shared, "config", None), "hidden_act", None) != getattr(experts.config, "hidden_act", None):
        return 0, "its shared MLP's activation is not the experts'"
    routed = experts.gate_up_proj
    if any(w.dtype != routed.dtype or w.device != routed.device for w in (gate, up, down, experts.down_proj)):
        return 0, "its shared MLP's weights are not in the experts' dtype and device"
    if S != 1:
        return 0, (f"n_shared_experts is {S}: the shared MLP's down_proj [H, {S}*I] cannot be a view of the packed "
                   "w2 [E+S, H, I], and a copy of the shared weights would go stale when they are updated in place")
    return S, None


def block_rule(block: torch.nn.Module, dtype: Optional[torch.dtype] = None, fuse_shared_experts: bool = False):
    """(config JSON, None) when moejit can run the whole block, else (None, why not). With
    fuse_shared_experts the config computes the block's shared experts where shared_experts_rule
    allows it (n_shared_experts S, fuse_shared_experts true: w13/w2 then hold E + S experts)."""
    if hf_gpt_oss.is_gpt_oss_block(block):  # no shared experts
        return hf_gpt_oss.block_rule(block, dtype)
    try:
        routing = _routing(block)
    except AttributeError as e:  # a class of that name from other modeling code (trust_remote_code)
        return None, f"{type(block).__name__} is not transformers' own ({e})"
    except ValueError as e:
        return None, str(e)
    if routing is None:
        return None, f"no whole-block rule for {type(block).__name__} (its experts still run on moejit)"
    experts, gate = getattr(block, "experts", None), getattr(block, "gate", None)
    if experts is None or gate is None or getattr(gate, "weight", None) is None:
        return None, "the block has no experts module or no router weight"
    try:
        check_hf_experts(experts)
    except ValueError as e:
        return None, str(e)
    weights = getattr(experts, "gate_up_proj", None)
    if weights is None or weights.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None, "the experts are quantized (they run through the experts implementation)"
    config = getattr(experts, "config", None)
    try:
        activation = activation_from_hf(getattr(config, "hidden_act", None))
    except NotImplementedError as e:
        return None, str(e)
    topk = int(getattr(gate, "top_k", 0) or 0)
    if not 1 <= topk <= min(MAX_TOPK, int(experts.num_experts)):
        return None, f"top-k {topk} is outside 1..{min(MAX_TOPK, int(experts.num_experts))}"
    dtype = dtype if dtype is not None else experts.gate_up_proj.dtype
    fields = dict(experts=int(experts.num_experts), topk=topk, hidden=int(experts.hidden_dim),
                  moe_intermediate=int(experts.intermediate_dim), activation=activation, dtype=dtype_name(dtype))
    fields.update(routing)
    groups, kept = fields.get("num_expert_group", 1), fields.get("topk_group", 1)
    if groups > 1 and topk > kept * (fields["experts"] // groups):
        # Transformers would pick excluded experts then (with weight 0, or DeepSeek-V3's with their
        # score); routing picks K distinct allowed experts and refuses such a config.
        return None, f"top-k {topk} is more than the experts in the {kept} kept group(s) of {groups}"
    if fields.get("router_dtype") is None:
        fields["router_dtype"] = dtype_name(dtype)
    if fuse_shared_experts:
        shared, _ = shared_experts_rule(block)
        if shared:
            fields.update(n_shared_experts=shared, fuse_shared_experts=True)
    return MoeConfig(**fields).to_json(), None


# The packed shared-expert weights (S == 1). _PACKED_PARAMS names each Hugging Face parameter that
# becomes a view, with the view it becomes of (w13, w2) for E routed experts and width I.
_PACKED_PARAMS = (
    (("experts", "gate_up_proj"), lambda w13, w2, E, I: w13[:E]),
    (("experts", "down_proj"), lambda w13, w2, E, I: w2[:E]),
    (("shared_experts", "gate_proj", "weight"), lambda w13, w2, E, I: w13[E, :I]),
    (("shared_experts", "up_proj", "weight"), lambda w13, w2, E, I: w13[E, I:]),
    (("shared_experts", "down_proj", "weight"), lambda w13, w2, E, I: w2[E]),
)


def _param(block: torch.nn.Module, path: tuple) -> torch.nn.Parameter:
    module = block
    for name in path[:-1]:
        module = getattr(module, name)
    return module._parameters[path[-1]]


def _views(block: torch.nn.Module, w13: torch.Tensor, w2: torch.Tensor):
    E, I = w13.shape[0] - 1, w2.shape[2]
    return [(_param(block, path), view(w13, w2, E, I)) for path, view in _PACKED_PARAMS]


def _point_params_at(block: torch.nn.Module, w13: torch.Tensor, w2: torch.Tensor) -> None:
    """Makes the block's parameters views of w13 and w2 (the same Parameter objects, so optimizers
    and anything else holding them keep working) and keeps w13 and w2 for the fused call."""
    for param, view in _views(block, w13, w2):
        param.data = view
    block._moejit_w13, block._moejit_w2 = w13, w2
    block._moejit_ptrs = _param_ptrs(block)


def _param_ptrs(block: torch.nn.Module) -> tuple:
    # Spelled out rather than walking _PACKED_PARAMS: the forward checks these on every eager call.
    experts, shared = block.experts, block.shared_experts
    return (experts.gate_up_proj.data_ptr(), experts.down_proj.data_ptr(), shared.gate_proj.weight.data_ptr(),
            shared.up_proj.weight.data_ptr(), shared.down_proj.weight.data_ptr())


def _pack_shared_experts(block: torch.nn.Module):
    """Copies the routed experts' and the shared MLP's weights into one w13 [E + 1, 2I, H] and one
    w2 [E + 1, H, I] and points the parameters at them; the old tensors are freed once nothing else
    holds them (the block's weights are held twice only while it copies)."""
    experts, shared = block.experts, block.shared_experts
    with torch.no_grad():
        w13 = torch.cat([experts.gate_up_proj, torch.cat([shared.gate_proj.weight, shared.up_proj.weight])[None]])
        w2 = torch.cat([experts.down_proj, shared.down_proj.weight[None]])
    _point_params_at(block, w13, w2)
    return w13, w2


def _aliases_packed(block: torch.nn.Module) -> bool:
    """Whether every parameter is still its view of the packed tensors (where _point_params_at put it)."""
    return _param_ptrs(block) == block._moejit_ptrs


def _packed_weights(block: torch.nn.Module):
    # Outside torch.compile (data_ptr is not traceable) the call checks that the parameters still
    # alias the packed tensors and packs again where they do not (module docstring).
    if not torch.compiler.is_compiling() and not _aliases_packed(block):
        log.info("moejit: %s's parameters were replaced; packing its experts and shared MLP again",
                 type(block).__name__)
        return _pack_shared_experts(block)
    return block._moejit_w13, block._moejit_w2


def _packed_apply(self, fn, recurse=True):
    """nn.Module._apply for a block with packed weights: converts the packed tensors and points the
    parameters at the result first, so that their own conversion is a no-op and no second copy of the
    weights outlives the conversion; a conversion that copies every tensor anyway is packed again."""
    with torch.no_grad():
        w13, w2 = fn(self._moejit_w13), fn(self._moejit_w2)
    _point_params_at(self, w13, w2)
    result = torch.nn.Module._apply(self, fn, recurse)
    if not _aliases_packed(self):
        _pack_shared_experts(self)
    return result


def _repack_after_load(block: torch.nn.Module, incompatible_keys) -> None:
    """load_state_dict post-hook: loading copies into the views in place; assign=True replaces the
    parameters instead, and then the block packs them again."""
    if not _aliases_packed(block):
        _pack_shared_experts(block)


def _state_dict_own_storages(block: torch.nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict post-hook: the tensors of the packed parameters share one storage, which
    transformers' save_pretrained takes for weights tied at runtime: it clones each such tensor before
    writing, every packed block's weights then twice in memory. Each gets a tensor of its own storage
    over the same memory (a DLPack capsule: no copy, no stream handshake), which savers write as it
    is. keep_vars=True asks for the Parameters themselves: those stay."""
    for path, _ in _PACKED_PARAMS:
        key = prefix + ".".join(path)
        t = state_dict.get(key)
        if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and t.device.type in ("cpu", "cuda"):
            state_dict[key] = torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(t))


def _fuse_shared_experts(block: torch.nn.Module) -> None:
    _pack_shared_experts(block)
    block._apply = types.MethodType(_packed_apply, block)
    block.register_load_state_dict_post_hook(_repack_after_load)
    block.register_state_dict_post_hook(_state_dict_own_storages)


def _whole_block_forward(config_json: str, model_config) -> Callable:
    config = json.loads(config_json)
    fp32_router = config["router_dtype"] == "fp32"  # the router's matmul in the precision moejit routes from
    cast_router = fp32_router and config["dtype"] != "fp32"  # torch would cast the gate to fp32 each call
    with_bias = config["topk_method"] == "noaux_tc"
    fused_shared = config["fuse_shared_experts"]
    gate_json = dataclasses.replace(MoeConfig.from_json(config_json), router_gemm=True).to_json()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # The block's own forward where moejit's one call would lose something: training (router
        # jitter, auxiliary losses), gradients (the moejit ops have no backward), and anyone observing
        # the router: output_router_logits, passed to forward or set in the config, hooks the gate.
        # (The original forward is kept on the block, not in this closure, so that a deepcopy of the
        # block falls back to its own.)
        wants_grad = torch.is_grad_enabled() and (hidden_states.requires_grad or self.gate.weight.requires_grad)
        if self.training or wants_grad or self.gate._forward_hooks or self.gate._forward_pre_hooks or \
                getattr(model_config, "output_router_logits", False):
            return self._moejit_original_forward(hidden_states)
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        weight = self.gate.weight
        bias = self.gate.e_score_correction_bias if with_bias else None
        if fused_shared:
            (w13, w2), residual = _packed_weights(self), None
        else:
            w13, w2 = self.experts.gate_up_proj, self.experts.down_proj
            residual = _residual(self)(x)
            residual = residual.contiguous() if residual is not None else None
        # The router in the call where it was faster (module docstring); a gate weight kept in
        # another dtype than the model's (the layer takes it in the model dtype) stays beside it.
        if weight.dtype == x.dtype and (cast_router or x.shape[0] <= ROUTER_IN_LAYER_MAX_TOKENS):
            out = torch.ops.moejit.moe_layer_gate(
                x.contiguous(), weight.contiguous(), w13, w2, bias, None, None, None, None, residual, gate_json)
        else:
            logits = F.linear(x.float(), weight.float()) if fp32_router else F.linear(x, weight)
            out = torch.ops.moejit.moe_layer(
                x.contiguous(), logits.contiguous(), w13, w2, bias, None, None, None, None, residual, config_json)
        return out.reshape(shape)

    return forward


def patch_blocks(model: torch.nn.Module, fuse_shared_experts: bool = True) -> dict:
    """Replaces the forward of every block moejit can run whole (module instances only); returns
    {block name: config JSON} of those taken. With fuse_shared_experts the blocks shared_experts_rule
    allows compute their shared experts in the call, their weights packed (module docstring). Blocks
    not taken, and shared experts not fused, are logged with the reason."""
    taken = {}
    model_config = getattr(model, "config", None)
    for name, module in model.named_modules():
        if not (hasattr(module, "experts") and (hasattr(module, "gate") or hf_gpt_oss.is_gpt_oss_block(module))):
            continue
        if getattr(module, "_moejit_whole_block", None) is not None:  # patched before
            taken[name] = module._moejit_whole_block
            continue
        config_json, why = block_rule(module, fuse_shared_experts=fuse_shared_experts)
        if config_json is None:
            log.info("moejit.patch: %s (%s) not taken whole: %s", name, type(module).__name__, why)
            continue
        if hf_gpt_oss.is_gpt_oss_block(module):
            # The router joins the call with its bias (router_gemm, router_bias) as any router does.
            gate_json = dataclasses.replace(MoeConfig.from_json(config_json), router_gemm=True,
                                            router_bias=True).to_json()
            module._moejit_original_forward = module.forward
            module.forward = types.MethodType(
                hf_gpt_oss.whole_block_forward(config_json, gate_json, model_config, ROUTER_IN_LAYER_MAX_TOKENS),
                module)
            module._moejit_whole_block = config_json
            taken[name] = config_json
            log.info("moejit.patch: %s (%s) runs whole on moejit (routing with its router's bias, experts and "
                     "combine in one call; its experts' weights repacked)", name, type(module).__name__)
            continue
        S, why_not = shared_experts_rule(module)
        if json.loads(config_json)["fuse_shared_experts"]:
            _fuse_shared_experts(module)
            shared = f"; its {S} shared expert(s) fused in the call"
        elif (S or why_not) and not fuse_shared_experts:
            shared = "; its shared experts as the call's residual (fuse_shared_experts=False)"
        elif why_not:
            shared = f"; its shared experts as the call's residual: {why_not}"
        else:
            shared = ""
        module._moejit_original_forward = module.forward
        module.forward = types.MethodType(_whole_block_forward(config_json, model_config), module)
        module._moejit_whole_block = config_json
        taken[name] = config_json
        log.info("moejit.patch: %s (%s) runs whole on moejit (routing, experts and combine in one call%s)", name,
                 type(module).__name__, shared)
    return taken
