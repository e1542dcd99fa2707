"""Whole Hugging Face MoE blocks on one moejit call: the router's linear (below), routing, experts and
combine in ``torch.ops.moejit.moe_layer_gate`` or ``moe_layer``, the shared experts' output as its
residual.

``moejit.patch(model)`` replaces the forward of each block whose math SPEC.md covers; the experts of
every other block still run on moejit through the experts implementation (hf.py). The router's
linear (the gate weight times the hidden states, in the precision the model uses: fp32 for
DeepSeek-V3, whose router casts both to fp32, the model dtype for the others) runs in the same call
(``torch.ops.moejit.moe_layer_gate``) where the layer's router GEMM was the faster on the H200
(bench/RESULTS.md, session 18): at decode (T <= ROUTER_IN_LAYER_MAX_TOKENS) for every router, at
every T for an fp32 router in a bf16/fp16 model (DeepSeek-V3: torch casts the gate to fp32 on each
call). Elsewhere it stays a torch matmul beside the call: the layer's tensor-core router tiles were
0.5-2.5% slower there, and an fp32 model's router GEMM has no tensor-core tiles. Under
torch.compile the T bound is a guard: a batch on the other side of it compiles a second graph.

  block                    routing moejit computes                          residual
  MixtralSparseMoeBlock    softmax, top-k, renormalize                      -
  Qwen3MoeSparseMoeBlock   softmax, top-k, renormalize if norm_topk_prob    -
  DeepseekV3MoE            sigmoid, correction bias, groups (noaux_tc),     shared_experts(x)
                           renormalize if norm_topk_prob, routed_scaling_factor
  Qwen3NextSparseMoeBlock  softmax, top-k, renormalize if norm_topk_prob    sigmoid(shared_expert_gate(x)) * shared_expert(x)

A patched block falls back to its own forward while training (router jitter, auxiliary losses), when
gradients are wanted (the moejit ops have no backward) and when anything observes its router
(output_router_logits hooks it), which only its own router serves.
``MOEJIT_LOG=info`` says which blocks were taken whole and why any was not.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import types
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .config import MoeConfig, activation_from_hf, check_hf_experts, dtype_name

log = logging.getLogger("moejit")

__all__ = ["block_rule", "patch_blocks"]

MAX_TOPK = 32  # the library's limit (compiler/moe_config.cpp)
# The decode bucket's last T (compiler/heuristics/buckets.cpp), where the router GEMM runs its SIMT
# kernel; if the bucket moves, this only moves where the faster path is taken, not what is computed.
ROUTER_IN_LAYER_MAX_TOKENS = 32


def _routing(block: torch.nn.Module) -> Optional[dict]:
    """The MoeConfig routing fields of the block's class, or None when moejit has no rule for it."""
    kind = type(block).__name__
    gate = getattr(block, "gate", None)
    if kind == "MixtralSparseMoeBlock":
        return dict(scoring="softmax", topk_method="greedy", renormalize=True)
    if kind in ("Qwen3MoeSparseMoeBlock", "Qwen3NextSparseMoeBlock"):
        return dict(scoring="softmax", topk_method="greedy", renormalize=bool(getattr(gate, "norm_topk_prob", False)))
    if kind == "DeepseekV3MoE":
        return dict(scoring="sigmoid", topk_method="noaux_tc", num_expert_group=int(gate.num_group),
                    topk_group=int(gate.topk_group), renormalize=bool(gate.norm_topk_prob),
                    routed_scaling_factor=float(gate.routed_scaling_factor), router_dtype="fp32")
    return None


def _residual(block: torch.nn.Module) -> Callable:
    """The block's shared-expert output for the [T, H] hidden states, or None."""
    kind = type(block).__name__
    if kind == "DeepseekV3MoE":
        return lambda x: block.shared_experts(x)
    if kind == "Qwen3NextSparseMoeBlock":
        return lambda x: torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    return lambda x: None


def block_rule(block: torch.nn.Module, dtype: Optional[torch.dtype] = None):
    """(config JSON, None) when moejit can run the whole block, else (None, why not)."""
    try:
        routing = _routing(block)
    except AttributeError as e:  # a class of that name from other modeling code (trust_remote_code)
        return None, f"{type(block).__name__} is not transformers' own ({e})"
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
    if fields.get("router_dtype") is None:
        fields["router_dtype"] = dtype_name(dtype)
    return MoeConfig(**fields).to_json(), None


def _whole_block_forward(original: Callable, config_json: str, model_config) -> Callable:
    config = json.loads(config_json)
    fp32_router = config["router_dtype"] == "fp32"  # the router's matmul in the precision moejit routes from
    cast_router = fp32_router and config["dtype"] != "fp32"  # torch would cast the gate to fp32 each call
    with_bias = config["topk_method"] == "noaux_tc"
    gate_json = dataclasses.replace(MoeConfig.from_json(config_json), router_gemm=True).to_json()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # The block's own forward where moejit's one call would lose something: training (router
        # jitter, auxiliary losses), gradients (the moejit ops have no backward), and anyone observing
        # the router: output_router_logits, passed to forward or set in the config, hooks the gate.
        wants_grad = torch.is_grad_enabled() and (hidden_states.requires_grad or self.gate.weight.requires_grad)
        if self.training or wants_grad or self.gate._forward_hooks or self.gate._forward_pre_hooks or \
                getattr(model_config, "output_router_logits", False):
            return original(hidden_states)
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        weight = self.gate.weight
        bias = self.gate.e_score_correction_bias if with_bias else None
        residual = _residual(self)(x)
        residual = residual.contiguous() if residual is not None else None
        # The router in the call where it was faster (module docstring); a gate weight kept in
        # another dtype than the model's (the layer takes it in the model dtype) stays beside it.
        if weight.dtype == x.dtype and (cast_router or x.shape[0] <= ROUTER_IN_LAYER_MAX_TOKENS):
            out = torch.ops.moejit.moe_layer_gate(
                x.contiguous(), weight.contiguous(), self.experts.gate_up_proj, self.experts.down_proj,
                bias, None, None, None, None, residual, gate_json)
        else:
            logits = F.linear(x.float(), weight.float()) if fp32_router else F.linear(x, weight)
            out = torch.ops.moejit.moe_layer(
                x.contiguous(), logits.contiguous(), self.experts.gate_up_proj, self.experts.down_proj,
                bias, None, None, None, None, residual, config_json)
        return out.reshape(shape)

    return forward


def patch_blocks(model: torch.nn.Module) -> dict:
    """Replaces the forward of every block moejit can run whole (module instances only); returns
    {block name: config JSON} of those taken. Blocks not taken are logged with the reason."""
    taken = {}
    model_config = getattr(model, "config", None)
    for name, module in model.named_modules():
        if not (hasattr(module, "experts") and hasattr(module, "gate")):
            continue
        if getattr(module, "_moejit_whole_block", None) is not None:  # patched before
            taken[name] = module._moejit_whole_block
            continue
        config_json, why = block_rule(module)
        if config_json is None:
            log.info("moejit.patch: %s (%s) not taken whole: %s", name, type(module).__name__, why)
            continue
        original = module.forward
        module.forward = types.MethodType(_whole_block_forward(original, config_json, model_config), module)
        module._moejit_whole_block = config_json
        taken[name] = config_json
        log.info("moejit.patch: %s (%s) runs whole on moejit (routing, experts and combine in one call)", name,
                 type(module).__name__)
    return taken
