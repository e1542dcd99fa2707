"""The "moejit" experts implementation for Hugging Face transformers (5.x `ExpertsInterface`).

``model.set_experts_implementation("moejit")`` (or ``moejit.patch(model)``) makes every experts module
(MixtralExperts, Qwen3MoeExperts, DeepseekV3Experts, Qwen3NextExperts, GptOssExperts, ...) call
``torch.ops.moejit.experts`` with the ids and weights the model's own router chose. Routing and shared
experts stay Hugging Face's. The forward traces into one call node under torch.compile. GptOssExperts
(biases, interleaved and transposed weights, the clamped SwiGLU) runs on a repacked copy of its
weights (hf_gpt_oss).

What may fail, at the first call for a module config:
  ValueError           the module has biases, transposed or interleaved weights, or no gate (other than
                       gpt-oss's, which hf_gpt_oss takes)
  NotImplementedError  config.hidden_act is not silu/swish/gelu/gelu_pytorch_tanh/gelu_new/gelu_fast
and at every call, from the op: ValueError naming a tensor with the wrong shape, dtype or strides.

register() also adds "moejit" to transformers' FP8 experts registry (ALL_FP8_EXPERTS_FUNCTIONS), so the
same name runs fine-grained FP8 models' FP8Experts on moejit's fp8_block / fp8_tensor ops: see hf_fp8.
"""

from __future__ import annotations

import torch

from . import _ops, hf_fp8, hf_gpt_oss
from .config import MoeConfig, activation_from_hf, check_hf_experts, dtype_name

__all__ = ["IMPLEMENTATION_NAME", "moejit_experts_forward", "register", "experts_config_json", "find_experts_modules"]

IMPLEMENTATION_NAME = "moejit"
MAX_TOPK = 32  # the library's limit (compiler/moe_config.cpp)

# JSON per module config, so a forward does no JSON work after the first call for that config.
_CONFIG_JSON: dict = {}


@torch.compiler.assume_constant_result
def _config_json(experts: int, topk: int, hidden: int, intermediate: int, hidden_act, dtype: torch.dtype,
                 layout: tuple) -> str:
    # Called at trace time under torch.compile (its result becomes a constant of the graph): only
    # plain values come in, so the guards dynamo installs on them cover the cache key.
    key = (experts, topk, hidden, intermediate, hidden_act, dtype, layout)
    cfg = _CONFIG_JSON.get(key)
    if cfg is None:
        cfg = experts_config_json(experts, topk, hidden, intermediate, activation_from_hf(hidden_act), dtype)
        _CONFIG_JSON[key] = cfg
    return cfg


@torch.compiler.assume_constant_result
def _gpt_oss_config_json(experts: int, topk: int, hidden: int, intermediate: int, limit: float,
                         dtype: torch.dtype) -> str:
    # As _config_json: plain values in, a constant of the graph out.
    key = ("gpt_oss", experts, topk, hidden, intermediate, limit, dtype)
    cfg = _CONFIG_JSON.get(key)
    if cfg is None:
        cfg = hf_gpt_oss.layer_config(experts, topk, hidden, intermediate, limit, dtype).to_json()
        _CONFIG_JSON[key] = cfg
    return cfg


def experts_config_json(experts: int, topk: int, hidden: int, intermediate: int, activation: str,
                        dtype: torch.dtype) -> str:
    """The experts-only config JSON that the experts implementation, patch() and the torch.compile
    backend all use for one experts shape, so they share one compiled layer in the op library."""
    return MoeConfig(experts=experts, topk=topk, hidden=hidden, moe_intermediate=intermediate,
                     activation=activation, dtype=dtype_name(dtype)).to_json()


def _static_topk(top_k_index: torch.Tensor, module: torch.nn.Module) -> int:
    # K is part of the config. Under torch.compile with dynamic shapes the column count can be a
    # SymInt, which cannot go into a constant string: specialize it (one guard) by comparison,
    # trying the model's num_experts_per_tok first.
    k = top_k_index.shape[1]
    if not torch.compiler.is_compiling():
        return int(k)
    expected = getattr(getattr(module, "config", None), "num_experts_per_tok", None)
    candidates = ((expected,) if isinstance(expected, int) else ()) + tuple(range(1, MAX_TOPK + 1))
    for c in candidates:
        if k == c:
            return c
    raise ValueError(f"moejit: top_k_index has {k} columns; moejit takes 1..{MAX_TOPK}")


def moejit_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """ExpertsInterface implementation: [T, H] hidden, [T, K] ids (ids outside [0, E) contribute 0,
    as HF's expert-parallel sentinels need) and [T, K] weights -> [T, H] weighted sum, hidden's dtype."""
    layout = (getattr(self, "has_bias", False), getattr(self, "is_transposed", False),
              getattr(self, "has_gate", True), getattr(self, "is_concatenated", True))
    if layout == hf_gpt_oss.LAYOUT and hf_gpt_oss.is_gpt_oss_experts(self):
        E, H, I = hf_gpt_oss.sizes(self)
        cfg = _gpt_oss_config_json(E, _static_topk(top_k_index, self), H, I, float(self.limit), hidden_states.dtype)
        return hf_gpt_oss.experts_forward(self, hidden_states, top_k_index, top_k_weights, cfg)
    if layout != (False, False, True, True) or not hasattr(self, "gate_up_proj"):
        check_hf_experts(self)  # raises ValueError explaining what is unsupported
    hidden_act = getattr(getattr(self, "config", None), "hidden_act", None)
    cfg = _config_json(self.num_experts, _static_topk(top_k_index, self), self.hidden_dim, self.intermediate_dim,
                       hidden_act, hidden_states.dtype, layout)
    return torch.ops.moejit.experts(
        hidden_states.contiguous(),
        top_k_index.to(torch.int32).contiguous(),
        top_k_weights.to(torch.float32).contiguous(),
        self.gate_up_proj,
        self.down_proj,
        None, None, None, None, None,
        cfg,
    )


def register() -> None:
    """Adds "moejit" to transformers' ALL_EXPERTS_FUNCTIONS and, where transformers has it, to
    ALL_FP8_EXPERTS_FUNCTIONS (FP8 models; hf_fp8.moejit_fp8_experts_forward). Idempotent. Must run
    before a model is built with experts_implementation="moejit" or switched with
    set_experts_implementation."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    _ops.load_library()
    if ALL_EXPERTS_FUNCTIONS.get(IMPLEMENTATION_NAME) is not moejit_experts_forward:
        ALL_EXPERTS_FUNCTIONS[IMPLEMENTATION_NAME] = moejit_experts_forward
    hf_fp8.register()


def find_experts_modules(model: torch.nn.Module) -> list:
    """(name, module) of every experts module that the ExpertsInterface dispatches (the classes
    decorated with transformers' use_experts_implementation), in model order."""
    found = []
    for name, module in model.named_modules():
        if all(hasattr(module, a) for a in ("has_gate", "has_bias", "is_transposed", "is_concatenated")) and \
                hasattr(module, "num_experts"):
            found.append((name, module))
    return found


def module_topk(module: torch.nn.Module):
    """The top-k an experts module will be called with, from its model config; None when unknown."""
    cfg = getattr(module, "config", None)
    for attr in ("num_experts_per_tok", "moe_topk", "top_k"):
        k = getattr(cfg, attr, None)
        if isinstance(k, int) and k > 0:
            return k
    return None


def module_config_json(module: torch.nn.Module, topk: int, dtype=None) -> str:
    """The JSON the experts implementation will use for this module (same string, same cache entry).
    For an FP8Experts module, dtype is the hidden states' (default: the model's) and the JSON is the
    fp8 one (hf_fp8.module_config_json)."""
    if hf_fp8.is_fp8_experts(module):
        return hf_fp8.module_config_json(module, topk, dtype)
    if hf_gpt_oss.is_gpt_oss_experts(module):
        E, H, I = hf_gpt_oss.sizes(module)
        return _gpt_oss_config_json(E, int(topk), H, I, float(module.limit),
                                    dtype if dtype is not None else module.gate_up_proj.dtype)
    check_hf_experts(module)
    dtype = dtype if dtype is not None else module.gate_up_proj.dtype
    layout = (module.has_bias, module.is_transposed, module.has_gate, module.is_concatenated)
    hidden_act = getattr(getattr(module, "config", None), "hidden_act", None)
    return _config_json(int(module.num_experts), int(topk), int(module.hidden_dim), int(module.intermediate_dim),
                        hidden_act, dtype, layout)
