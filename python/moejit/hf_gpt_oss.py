"""gpt-oss on moejit through Hugging Face transformers: its experts module (GptOssExperts) in the
"moejit" experts implementation (hf.py), and its whole MoE block (GptOssMLP) as one moejit call
(hf_blocks.py).

GptOssMLP routes with GptOssTopKRouter: logits = hidden @ router.weight^T + router.bias (a linear
with a bias), top-k of the logits, softmax over those k. That is moejit's softmax over all experts,
top-k, renormalized (``scoring softmax``, ``renormalize``): the same weights, exp(x_i - max) / sum over
the k of exp(x_j - max). Its experts add ``gate_up_proj_bias`` and ``down_proj_bias`` (``expert_bias``)
and apply the clamped SwiGLU (``activation swigluoai``, alpha 1.702, limit ``GptOssExperts.limit``)
whatever ``hidden_act`` says.

GptOssExperts stores gate_up_proj [E, H, 2I] with the gate and up columns interleaved (gate 2i, up
2i + 1) and down_proj [E, I, H]: moejit's layer takes w13 [E, 2I, H] (gate rows, then up rows) and w2
[E, H, I]. ``packed_weights`` repacks them once per module and keeps the copy on the module: a second
copy of the experts' weights (the size of the module's own). hf_blocks' shared-expert packing makes
the Hugging Face parameters views of the packed tensors instead; no view can serve here, since HF's
column c of gate_up_proj is packed row (c % 2) * I + c // 2, not an affine function of c (and the kn
layout, which would spare the transpose, still needs the de-interleave, and runs only the SIMT
GEMMs). In eager mode the copy is rebuilt when a parameter was replaced, moved,
converted or written in place (its version counter); under torch.compile the copy made before
tracing is used (``moejit.patch`` makes it), and a module without one is refused by name.

What may fail: ValueError from ``packed_weights`` under torch.compile for a module never packed, and
from the ops for tensors of the wrong shape or dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import MoeConfig, dtype_name

__all__ = ["is_gpt_oss_experts", "is_gpt_oss_block", "packed_weights", "layer_config", "config", "experts_forward",
           "block_rule", "whole_block_forward"]

# transformers' GptOssExperts: use_experts_implementation(is_concatenated=False, is_transposed=True,
# has_bias=True) -> (has_bias, is_transposed, has_gate, is_concatenated), as hf.py spells a layout.
LAYOUT = (True, True, True, False)
# GptOssExperts._apply_gate's alpha: swigluoai's (compiler/moe_config.h kSwigluOaiAlpha).
SWIGLU_ALPHA = 1.702
MAX_TOPK = 32  # the library's limit (compiler/moe_config.cpp)
_PARAMETERS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def is_gpt_oss_experts(module: torch.nn.Module) -> bool:
    """Whether the module is transformers' GptOssExperts (bf16/fp16/fp32 weights; the MXFP4 modules
    transformers swaps in for quantized checkpoints are other classes)."""
    layout = (getattr(module, "has_bias", False), getattr(module, "is_transposed", False),
              getattr(module, "has_gate", True), getattr(module, "is_concatenated", True))
    return (type(module).__name__ == "GptOssExperts" and layout == LAYOUT
            and all(isinstance(getattr(module, p, None), torch.Tensor) for p in _PARAMETERS)
            and getattr(module, "alpha", None) == SWIGLU_ALPHA and hasattr(module, "limit"))


def is_gpt_oss_block(block: torch.nn.Module) -> bool:
    """Whether the block is transformers' GptOssMLP (a router with a bias, GptOssExperts)."""
    return type(block).__name__ == "GptOssMLP" and hasattr(block, "router") and hasattr(block, "experts")


def sizes(module: torch.nn.Module) -> tuple:
    """(E, H, I) of a GptOssExperts module, from its weights."""
    E, H, two_i = module.gate_up_proj.shape
    return int(E), int(H), int(two_i) // 2


def layer_config(experts: int, topk: int, hidden: int, intermediate: int, limit: float,
                 dtype: torch.dtype) -> MoeConfig:
    """gpt-oss's moejit layer: its routing (softmax over the top-k logits), expert biases and clamped
    SwiGLU (plain values: hf.py calls it where torch.compile makes the result a constant)."""
    return MoeConfig(experts=int(experts), topk=int(topk), hidden=int(hidden), moe_intermediate=int(intermediate),
                     scoring="softmax", topk_method="greedy", renormalize=True, activation="swigluoai",
                     swiglu_limit=float(limit), expert_bias=True, dtype=dtype_name(dtype))


def config(module: torch.nn.Module, topk: int, dtype=None) -> MoeConfig:
    """The moejit layer of a GptOssExperts module; dtype: the hidden states' (default: the weights')."""
    E, H, I = sizes(module)
    return layer_config(E, topk, H, I, float(module.limit), dtype if dtype is not None else module.gate_up_proj.dtype)


def _version_key(module: torch.nn.Module) -> tuple:
    return tuple((p.data_ptr(), p._version, p.device, p.dtype, tuple(p.shape))
                 for p in (getattr(module, name) for name in _PARAMETERS))


def packed_weights(module: torch.nn.Module) -> tuple:
    """(w13 [E, 2I, H], w2 [E, H, I], w13_bias [E, 2I] fp32, w2_bias [E, H] fp32) of a GptOssExperts
    module in moejit's layout (the module docstring says when it is rebuilt); the weights keep their
    dtype, the biases are fp32 as the layer adds them, so no call converts them again."""
    cached = getattr(module, "_moejit_packed", None)
    if torch.compiler.is_compiling():
        if cached is None:
            raise ValueError(f"moejit: {type(module).__name__} has no weights packed for moejit; call "
                             "moejit.patch(model) before torch.compile (it packs them once, outside the graph)")
        return cached[1]
    key = _version_key(module)
    if cached is not None and cached[0] == key:
        return cached[1]
    E, H, I = sizes(module)
    with torch.no_grad():
        gate_up, bias = module.gate_up_proj.detach(), module.gate_up_proj_bias.detach()
        # One copy: gate columns [..., ::2] become rows 0..I-1, up columns [..., 1::2] rows I..2I-1.
        w13 = torch.empty(E, 2 * I, H, dtype=gate_up.dtype, device=gate_up.device)
        w13[:, :I].copy_(gate_up[..., 0::2].transpose(1, 2))
        w13[:, I:].copy_(gate_up[..., 1::2].transpose(1, 2))
        w13_bias = torch.cat([bias[:, 0::2], bias[:, 1::2]], dim=1).float().contiguous()
        w2 = module.down_proj.detach().transpose(1, 2).contiguous()
        w2_bias = module.down_proj_bias.detach().float().contiguous()
    tensors = (w13, w2, w13_bias, w2_bias)
    # A plain attribute, not a buffer: neither state_dict nor load_state_dict sees the copy.
    module._moejit_packed = (key, tensors)
    return tensors


def experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, config_json: str) -> torch.Tensor:
    """GptOssExperts on torch.ops.moejit.experts: [T, H] hidden, [T, K] ids and weights -> [T, H]."""
    w13, w2, w13_bias, w2_bias = packed_weights(module)
    return torch.ops.moejit.experts(
        hidden_states.contiguous(), top_k_index.to(torch.int32).contiguous(),
        top_k_weights.to(torch.float32).contiguous(), w13, w2, None, None, None, None, None, config_json,
        w13_bias=w13_bias, w2_bias=w2_bias)


def block_rule(block: torch.nn.Module, dtype=None):
    """(config JSON, None) when moejit can run the GptOssMLP block whole, else (None, why not)."""
    experts, router = block.experts, block.router
    if not is_gpt_oss_experts(experts):
        return None, (f"its experts module {type(experts).__name__} is not transformers' GptOssExperts in bf16, fp16 "
                      "or fp32 (an MXFP4 model's experts run through their own implementation)")
    if experts.gate_up_proj.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None, "the experts are quantized (they run through the experts implementation)"
    weight, bias = getattr(router, "weight", None), getattr(router, "bias", None)
    E, H, _ = sizes(experts)
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (E, H):
        return None, f"the router has no weight [{E}, {H}]"
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (E,):
        return None, f"the router has no bias [{E}] (GptOssTopKRouter's)"
    topk = int(getattr(router, "top_k", 0) or 0)
    if not 1 <= topk <= min(MAX_TOPK, E):
        return None, f"top-k {topk} is outside 1..{min(MAX_TOPK, E)}"
    return config(experts, topk, dtype).to_json(), None


def whole_block_forward(config_json: str, gate_json: str, model_config, max_tokens_in_call: int):
    """GptOssMLP.forward on one moejit call: the router's linear and its bias in the call
    (moe_layer_gate with gate_bias, ``gate_json``: router_gemm and router_bias) for T <=
    ``max_tokens_in_call``, torch's F.linear (with the bias) beside moe_layer above. Returns
    (out, None): GptOssMLP also returns its router scores, which GptOssDecoderLayer discards and this
    call does not compute (anyone observing the router gets the block's own forward, which
    hf_blocks.patch_blocks keeps on the block as ``_moejit_original_forward``)."""

    def forward(self, hidden_states: torch.Tensor):
        router = self.router
        # The block's own forward where moejit's call would lose something: training, gradients (the
        # moejit ops have no backward), and anyone observing the router (output_router_logits hooks it).
        wants_grad = torch.is_grad_enabled() and (hidden_states.requires_grad or router.weight.requires_grad)
        if self.training or wants_grad or router._forward_hooks or router._forward_pre_hooks or \
                getattr(model_config, "output_router_logits", False):
            return self._moejit_original_forward(hidden_states)
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1]).contiguous()
        w13, w2, w13_bias, w2_bias = packed_weights(self.experts)
        weight, bias = router.weight, router.bias
        # The layer takes the gate weight and bias in the model dtype; a router kept in another dtype
        # runs as its own module does, beside the call.
        if weight.dtype == x.dtype and bias.dtype == x.dtype and x.shape[0] <= max_tokens_in_call:
            out = torch.ops.moejit.moe_layer_gate(
                x, weight.contiguous(), w13, w2, None, None, None, None, None, None, gate_json,
                w13_bias=w13_bias, w2_bias=w2_bias, gate_bias=bias.contiguous())
        else:
            logits = F.linear(x, weight, bias)
            out = torch.ops.moejit.moe_layer(x, logits.contiguous(), w13, w2, None, None, None, None, None, None,
                                             config_json, w13_bias=w13_bias, w2_bias=w2_bias)
        return out.reshape(shape), None

    return forward
