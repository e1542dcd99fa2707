"""MoeConfig: one MoE layer's configuration in moejit's JSON format (SPEC.md names every field).

The C++ library is the authority on what is valid: ``MoeConfig.validate()`` and every op call parse
the JSON there and raise ``ValueError`` naming the field, the value and the rule. This class only
holds the values, spells them as JSON and reads them off Hugging Face experts modules.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

import torch

from . import _ops

__all__ = ["MoeConfig", "activation_from_hf", "hf_activations", "dtype_name"]

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}

# SPEC.md "Quantized experts": the stored weights' dtype per quantization, and the edge of an fp8
# block scale (compiler/moe_config.h's kFp8BlockSize).
_QUANT_WEIGHT_DTYPES = {"w8a8_int8": torch.int8, "fp8_block": torch.float8_e4m3fn,
                        "fp8_tensor": torch.float8_e4m3fn}
FP8_BLOCK_SIZE = 128

# Hugging Face `hidden_act` names -> moejit activations (SPEC.md stage 4): the op library's table
# (compiler/hf_config.cpp, the one config.json's reader uses), read once, on first use.
_HF_ACTIVATIONS: "dict | None" = None


def hf_activations() -> dict:
    """{Hugging Face hidden_act: moejit activation}, as torch.ops.moejit.hf_activations gives it."""
    global _HF_ACTIVATIONS
    if _HF_ACTIVATIONS is None:
        _ops.load_library()
        _HF_ACTIVATIONS = json.loads(torch.ops.moejit.hf_activations())
    return dict(_HF_ACTIVATIONS)


def dtype_name(dtype: torch.dtype) -> str:
    """moejit's name of a torch dtype ("bf16", "fp16", "fp32"); TypeError for any other."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"moejit: dtype {dtype} is not supported; allowed: bfloat16, float16, float32") from None


def activation_from_hf(hidden_act: Any) -> str:
    """moejit's activation for a Hugging Face ``hidden_act``; NotImplementedError naming any other."""
    table = hf_activations()
    if isinstance(hidden_act, str) and hidden_act in table:
        return table[hidden_act]
    raise NotImplementedError(
        f"moejit: hidden_act {hidden_act!r} is not supported; supported: {', '.join(sorted(table))}"
    )


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """One MoE layer. Defaults are the C++ defaults (compiler/moe_config.h), except ``router_dtype``:
    None means "same as dtype", as in config_from_json."""

    experts: int = 8
    topk: int = 2
    num_expert_group: int = 1
    topk_group: int = 1
    scoring: str = "softmax"  # softmax | sigmoid
    topk_method: str = "greedy"  # greedy | group_limited_greedy | noaux_tc
    renormalize: bool = True
    routed_scaling_factor: float = 1.0
    hidden: int = 4096
    moe_intermediate: int = 14336
    activation: str = "silu"  # silu | gelu | gelu_tanh | swigluoai (gpt-oss's clamped SwiGLU, gated only)
    gated: bool = True
    swiglu_limit: float = 7.0  # swigluoai's clamp
    expert_bias: bool = False  # w13_bias [E_loc, N1] and w2_bias [E_loc, H] (gpt-oss)
    dtype: str = "bf16"  # bf16 | fp16 | fp32
    router_dtype: Optional[str] = None  # None: same as dtype
    # The layer computes its router logits from the gate weight [E, H] (dtype): hidden @ gate^T with
    # fp32 sums rounded to router_dtype (torch.ops.moejit.moe_layer_gate; MoELayer(gate_weight=...)).
    router_gemm: bool = False
    # With router_gemm: the router is a linear with a bias (gpt-oss), gate_bias [E] (dtype), added to the
    # fp32 sums before their rounding (moe_layer_gate(..., gate_bias=...); MoELayer(gate_bias=...)).
    router_bias: bool = False
    quant: str = "none"  # none | w8a8_int8 | fp8_block | fp8_tensor (SPEC.md "Quantized experts")
    ep_size: int = 1
    ep_rank: int = 0
    tp_size: int = 1
    tp_rank: int = 0
    n_shared_experts: int = 0
    # The layer computes the n_shared_experts shared experts in its grouped GEMMs: every token visits
    # them with weight 1; their weights follow the routed experts' in w13/w2 (and every per-expert
    # tensor), and expert-parallel rank 0 computes them. False: pass their output as ``residual``.
    fuse_shared_experts: bool = False
    weight_layout: str = "nk"  # nk: w13 [E_loc, 2I, H]; kn: w13 [E_loc, H, 2I]

    def __post_init__(self):
        # Accept torch dtypes for the two dtype fields; everything else is checked by the library.
        if isinstance(self.dtype, torch.dtype):
            object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if isinstance(self.router_dtype, torch.dtype):
            object.__setattr__(self, "router_dtype", dtype_name(self.router_dtype))

    # Derived sizes (SPEC.md notation).
    @property
    def local_experts(self) -> int:
        return self.experts // self.ep_size

    @property
    def local_intermediate(self) -> int:
        return self.moe_intermediate // self.tp_size

    @property
    def shared_slots(self) -> int:
        """S: the shared experts the layer computes (0 unless fuse_shared_experts)."""
        return self.n_shared_experts if self.fuse_shared_experts else 0

    @property
    def gemm_experts(self) -> int:
        """E_loc + S: the leading dim of w13, w2 and their per-expert tensors."""
        return self.local_experts + self.shared_slots

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def router_torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.router_dtype or self.dtype]

    def w13_shape(self) -> tuple:
        rows = (2 if self.gated else 1) * self.local_intermediate
        nk = self.weight_layout == "nk"
        return (self.gemm_experts, rows, self.hidden) if nk else (self.gemm_experts, self.hidden, rows)

    def w2_shape(self) -> tuple:
        nk = self.weight_layout == "nk"
        i = self.local_intermediate
        return (self.gemm_experts, self.hidden, i) if nk else (self.gemm_experts, i, self.hidden)

    @property
    def weight_torch_dtype(self) -> torch.dtype:
        """The dtype w13 and w2 are stored in: int8 (w8a8_int8), float8_e4m3fn (fp8_block, fp8_tensor),
        else the model dtype."""
        return _QUANT_WEIGHT_DTYPES.get(self.quant) or self.torch_dtype

    def quant_tensor_shapes(self) -> dict:
        """{name: shape} of the fp32 tensors the quantization takes (SPEC.md "Quantized experts"; the
        op library's quant_tensor_shapes, compiler/moe_config.cpp): w13_scale and w2_scale, and for
        w8a8_int8 input_smooth and act_smooth too. Empty for quant none; an unknown quant gets {} here
        and a ValueError from the library."""
        # The fused shared experts' tensors follow the routed experts' (E_loc + S, E + S).
        E, E_loc = self.experts + self.shared_slots, self.gemm_experts
        H, I = self.hidden, self.local_intermediate
        n1 = (2 if self.gated else 1) * I
        if self.quant == "w8a8_int8":
            return {"w13_scale": (E_loc, n1), "w2_scale": (E_loc, H), "input_smooth": (E, H), "act_smooth": (E_loc, I)}
        if self.quant == "fp8_block":
            def blocks(n):
                return -(-n // FP8_BLOCK_SIZE)

            return {"w13_scale": (E_loc, blocks(n1), blocks(H)), "w2_scale": (E_loc, blocks(H), blocks(I))}
        if self.quant == "fp8_tensor":
            return {"w13_scale": (E_loc,), "w2_scale": (E_loc,)}
        return {}

    def to_json(self) -> str:
        """The JSON string the ops take. Deterministic: equal configs give equal strings, so the
        op library's per-config registry (keyed by this string) compiles each config once."""
        d = dataclasses.asdict(self)
        if d["router_dtype"] is None:
            del d["router_dtype"]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "MoeConfig":
        d = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"moejit: unknown config field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_hf_experts(cls, module: torch.nn.Module, top_k: int, dtype: Optional[torch.dtype] = None) -> "MoeConfig":
        """The experts-only config of a Hugging Face experts module (MixtralExperts, Qwen3MoeExperts,
        DeepseekV3Experts, Qwen3NextExperts, ...). Routing fields keep their defaults: the model routes
        itself and hands moejit the chosen ids and weights. Raises ValueError for a layout moejit
        does not take and NotImplementedError for an unsupported activation."""
        check_hf_experts(module)
        return cls(
            experts=int(module.num_experts),
            topk=int(top_k),
            hidden=int(module.hidden_dim),
            moe_intermediate=int(module.intermediate_dim),
            activation=activation_from_hf(getattr(module.config, "hidden_act", None)),
            dtype=dtype_name(dtype if dtype is not None else module.gate_up_proj.dtype),
        )


def check_hf_experts(module: torch.nn.Module) -> None:
    """Refuses experts modules whose weights are not moejit's [E, 2I, H] gate-then-up layout."""
    name = type(module).__name__
    problems = []
    if getattr(module, "has_bias", False):
        problems.append("it has biases (has_bias=True)")
    if getattr(module, "is_transposed", False):
        problems.append("its weights are transposed (is_transposed=True)")
    if not getattr(module, "has_gate", True):
        problems.append("it has no gate (has_gate=False)")
    if not getattr(module, "is_concatenated", True):
        problems.append("its gate and up rows are interleaved (is_concatenated=False)")
    if not (hasattr(module, "gate_up_proj") and hasattr(module, "down_proj")):
        problems.append("it has no gate_up_proj/down_proj parameters")
    if problems:
        raise ValueError(
            f"moejit: experts module {name} is not supported: {'; '.join(problems)}. moejit takes gated, "
            "bias-free experts with gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I]; "
            "use another experts implementation for this model"
        )
