"""The "moejit" experts implementation for transformers' FP8 experts (FP8ExpertsInterface, 5.x).

transformers' fine-grained FP8 models (``quantization_config: {"quant_method": "fp8", ...}``: DeepSeek-V3,
Qwen3-MoE FP8 checkpoints) replace every experts module by ``FP8Experts`` and dispatch its forward
through ``ALL_FP8_EXPERTS_FUNCTIONS``. ``moejit.hf.register()`` adds this function there under
"moejit", so ``model.set_experts_implementation("moejit")`` or ``from_pretrained(...,
experts_implementation="moejit")`` runs the experts on ``torch.ops.moejit.experts``:

  FP8Experts                                      moejit (SPEC.md "Quantized experts")
  block_size [128, 128]                           quant fp8_block
    gate_up_proj [E, 2I, H] float8_e4m3fn          w13
    gate_up_proj_scale_inv [E, cdiv(2I,128), cdiv(H,128)]   w13_scale
    down_proj [E, H, I], down_proj_scale_inv [E, cdiv(H,128), cdiv(I,128)]   w2, w2_scale
  block_size None (per tensor)                    quant fp8_tensor
    gate_up_proj_scale_inv [E, 2, 1] (gate, up)    w13_scale [E] (the two must be equal)
    down_proj_scale_inv [E, 1, 1]                  w2_scale [E]

Scales stored as float8_e8m0fnu (scale_fmt "ue8m0") are widened to fp32 (exact). Weights that
transformers left dequantized (bf16) go to the bf16 "moejit" function. Activations are quantized
dynamically, per row and 128 columns (fp8_block) or per row (fp8_tensor), as transformers' kernels do.

Refused with ValueError naming the problem, at the call: block sizes other than 128x128, static
activation scales (activation_scheme "static"), biases, ungated/transposed/interleaved experts, the
clamped SwiGLU (swiglu_limit / swiglu_alpha), FP4 or other non-e4m3 weights, scale shapes other than
the above, and hidden activations moejit lacks (that error is also a NotImplementedError, as the bf16
function raises). transformers allocates ``max(cdiv(2I,128), 2)`` gate_up scale rows, so for
2I <= 128 it holds separate gate and up scales where moejit takes one block: moejit uses them when
they are equal and refuses otherwise. That value check (like the per-tensor gate == up check) runs in
eager calls, once per scale tensor version; a torch.compile'd forward trusts an earlier eager call.
"""

from __future__ import annotations

import torch

from . import _ops
from .config import FP8_BLOCK_SIZE, MoeConfig, activation_from_hf, check_hf_experts, dtype_name

__all__ = ["moejit_fp8_experts_forward", "register", "fp8_experts_quant", "fp8_experts_scales",
           "is_fp8_experts", "module_config_json", "UnsupportedActivationError"]

IMPLEMENTATION_NAME = "moejit"
_FP8 = torch.float8_e4m3fn
_SCALE_DTYPES = (torch.float32,) + ((torch.float8_e8m0fnu,) if hasattr(torch, "float8_e8m0fnu") else ())

_CONFIG_JSON: dict = {}


class UnsupportedActivationError(ValueError, NotImplementedError):
    """An experts module's hidden activation that moejit does not compute. Both a ValueError (what
    every other refusal of the FP8 function is) and a NotImplementedError (what the bf16 function raises
    for the same problem)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _refuse(module, problem: str) -> ValueError:
    return ValueError(f"moejit: FP8 experts module {type(module).__name__} is not supported: {problem}; use "
                      "another experts implementation (e.g. grouped_mm) for this model")


def _dequantized(weight) -> bool:
    return weight is not None and weight.is_floating_point() and weight.element_size() > 1


def is_fp8_experts(module: torch.nn.Module) -> bool:
    """Whether module is transformers' FP8Experts (its *_proj_scale_inv and activation_scheme) holding
    quantized weights (not ones transformers dequantized at load, which run as bf16)."""
    return hasattr(module, "down_proj_scale_inv") and hasattr(module, "activation_scheme") and \
        not _dequantized(getattr(module, "gate_up_proj", None))


def _hidden_act(module):
    cfg = getattr(module, "config", None)
    act = getattr(cfg, "hidden_activation", None)  # FP8Experts reads hidden_activation first
    return act if act is not None else getattr(cfg, "hidden_act", None)


def fp8_experts_quant(module: torch.nn.Module) -> str:
    """moejit's quant for an FP8Experts module: "fp8_block" (block_size [128, 128]) or "fp8_tensor"
    (block_size None). ValueError for everything else that moejit cannot compute (static checks only:
    attributes, dtypes and shapes)."""
    check_hf_experts(module)  # biases, transposed, interleaved or ungated weights
    weight = module.gate_up_proj
    if weight.dtype != _FP8:
        kind = "FP4-packed int8 (expert_dtype fp4)" if weight.dtype == torch.int8 else str(weight.dtype)
        raise _refuse(module, f"its expert weights are {kind}; moejit's fp8 quantizations take float8_e4m3fn")
    if module.down_proj.dtype != _FP8:
        raise _refuse(module, f"down_proj is {module.down_proj.dtype}; moejit takes float8_e4m3fn")
    scheme = getattr(module, "activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise _refuse(module, f"activation_scheme is {scheme!r} (static activation scales); moejit quantizes "
                              "activations dynamically only (activation_scheme 'dynamic')")
    for attr in ("swiglu_alpha", "swiglu_limit", "limit"):
        if getattr(module, attr, None) is not None:
            raise _refuse(module, f"it clamps its SwiGLU ({attr}={getattr(module, attr)}); moejit computes "
                                  "act(gate) * up without clamping")
    block = getattr(module, "block_size", None)
    if block is None:
        return "fp8_tensor"
    if tuple(int(b) for b in block) == (FP8_BLOCK_SIZE, FP8_BLOCK_SIZE):
        return "fp8_block"
    raise _refuse(module, f"its weight block size is {list(block)}; moejit takes [128, 128] block scales "
                          "(quant fp8_block) or per-tensor scales (block_size None, quant fp8_tensor)")


def _check_scale_dtype(module, name: str, scale: torch.Tensor) -> None:
    if scale.dtype not in _SCALE_DTYPES:
        raise _refuse(module, f"{name} is {scale.dtype}; moejit takes float32 scales (or float8_e8m0fnu, "
                              "which it widens to float32)")


def _rows_equal_checked(module, name: str, scale: torch.Tensor, takes: str) -> None:
    """Data check that every row along dim 1 of scale [E, R, C] equals row 0 (gate and up scales that
    moejit must share). Eager only, once per tensor version; torch.compile traces skip it."""
    if torch.compiler.is_compiling():
        return
    key = (id(scale), scale.data_ptr(), scale._version)
    checked = module.__dict__.setdefault("_moejit_fp8_checked", {})
    if checked.get(name) == key:
        return
    values = scale.to(torch.float32)
    if scale.device.type != "meta" and not torch.equal(values, values[:, :1].expand_as(values)):
        raise _refuse(module, f"{name} {list(scale.shape)} holds different gate and up scales (its rows along "
                              f"dim 1); moejit takes {takes}, one scale shared by the gate and up rows")
    checked[name] = key


def fp8_experts_scales(module: torch.nn.Module, quant: str):
    """(w13_scale, w2_scale): the module's scale_inv tensors in the fp32 shapes moejit takes for quant
    (views where they already are). ValueError naming the tensor for a shape moejit cannot use."""
    E, H, I = int(module.num_experts), int(module.hidden_dim), int(module.intermediate_dim)
    s13, s2 = module.gate_up_proj_scale_inv, module.down_proj_scale_inv
    _check_scale_dtype(module, "gate_up_proj_scale_inv", s13)
    _check_scale_dtype(module, "down_proj_scale_inv", s2)
    shape13, shape2 = tuple(s13.shape), tuple(s2.shape)
    if quant == "fp8_block":
        want13 = (E, _cdiv(2 * I, FP8_BLOCK_SIZE), _cdiv(H, FP8_BLOCK_SIZE))
        want2 = (E, _cdiv(H, FP8_BLOCK_SIZE), _cdiv(I, FP8_BLOCK_SIZE))
        if shape13 == (E, 2, want13[2]) and want13[1] == 1:
            # transformers keeps room for separate gate and up scales when 2I <= 128 (min_sf_out=2);
            # moejit's one block covers both halves.
            _rows_equal_checked(module, "gate_up_proj_scale_inv", s13,
                                f"w13_scale [E, cdiv(2I,128), cdiv(H,128)] = {list(want13)}")
            s13 = s13[:, :1]
        elif shape13 != want13:
            raise _refuse(module, f"gate_up_proj_scale_inv is {list(shape13)}; moejit's fp8_block takes "
                                  f"[E, cdiv(2I,128), cdiv(H,128)] = {list(want13)} (one scale per 128x128 block of "
                                  "the fused [gate; up] rows)")
        if shape2 != want2:
            raise _refuse(module, f"down_proj_scale_inv is {list(shape2)}; moejit's fp8_block takes "
                                  f"[E, cdiv(H,128), cdiv(I,128)] = {list(want2)}")
    else:
        if s13.dim() == 3 and shape13[0] == E and shape13[1:] == (2, 1):
            # [gate; up] per-tensor scales
            _rows_equal_checked(module, "gate_up_proj_scale_inv", s13, "w13_scale [E] for quant fp8_tensor")
            s13 = s13[:, 0, 0]
        elif s13.numel() == E and shape13[:1] == (E,):
            s13 = s13.reshape(E)
        else:
            raise _refuse(module, f"gate_up_proj_scale_inv is {list(shape13)}; moejit's fp8_tensor takes one scale "
                                  "per expert: [E], [E, 1, 1] or [E, 2, 1] with equal gate and up scales")
        if s2.numel() == E and shape2[:1] == (E,):
            s2 = s2.reshape(E)
        else:
            raise _refuse(module, f"down_proj_scale_inv is {list(shape2)}; moejit's fp8_tensor takes one scale "
                                  "per expert: [E] or [E, 1, 1]")
    return s13.to(torch.float32).contiguous(), s2.to(torch.float32).contiguous()


@torch.compiler.assume_constant_result
def _config_json(experts: int, topk: int, hidden: int, intermediate: int, hidden_act, dtype: torch.dtype,
                 quant: str) -> str:
    # As hf._config_json: plain values in, a constant string out under torch.compile.
    key = (experts, topk, hidden, intermediate, hidden_act, dtype, quant)
    cfg = _CONFIG_JSON.get(key)
    if cfg is None:
        try:
            activation = activation_from_hf(hidden_act)
        except NotImplementedError as e:
            raise UnsupportedActivationError(f"{e}; the FP8 experts cannot run on moejit") from None
        cfg = MoeConfig(experts=experts, topk=topk, hidden=hidden, moe_intermediate=intermediate,
                        activation=activation, dtype=dtype_name(dtype), quant=quant).to_json()
        _CONFIG_JSON[key] = cfg
    return cfg


def module_config_json(module: torch.nn.Module, topk: int, dtype=None) -> str:
    """The JSON the FP8 function will use for this module with hidden states of dtype (default: the
    model's config.dtype, else bf16); checks the module as a call would (values aside)."""
    quant = fp8_experts_quant(module)
    fp8_experts_scales(module, quant)
    if dtype is None:
        dtype = getattr(getattr(module, "config", None), "dtype", None)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, None)
        if dtype not in (torch.bfloat16, torch.float16):
            dtype = torch.bfloat16
    return _config_json(int(module.num_experts), int(topk), int(module.hidden_dim), int(module.intermediate_dim),
                        _hidden_act(module), dtype, quant)


def moejit_fp8_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                               top_k_weights: torch.Tensor) -> torch.Tensor:
    """FP8ExpertsInterface implementation: [T, H] bf16/fp16 hidden, [T, K] ids (ids outside [0, E)
    contribute 0) and [T, K] weights (bf16 or fp32) -> [T, H] weighted sum, hidden's dtype."""
    from . import hf

    if _dequantized(getattr(self, "gate_up_proj", None)):
        # transformers dequantized this checkpoint at load (e.g. no fp8-capable GPU): plain weights.
        return hf.moejit_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    quant = fp8_experts_quant(self)
    w13_scale, w2_scale = fp8_experts_scales(self, quant)
    cfg = _config_json(self.num_experts, hf._static_topk(top_k_index, self), self.hidden_dim, self.intermediate_dim,
                       _hidden_act(self), hidden_states.dtype, quant)
    return torch.ops.moejit.experts(
        hidden_states.contiguous(),
        top_k_index.to(torch.int32).contiguous(),
        top_k_weights.to(torch.float32).contiguous(),
        self.gate_up_proj,
        self.down_proj,
        w13_scale,
        w2_scale,
        None, None, None,
        cfg,
    )


def register() -> bool:
    """Adds "moejit" to transformers' ALL_FP8_EXPERTS_FUNCTIONS (idempotent). False, doing nothing,
    where transformers has no FP8 experts interface."""
    try:
        from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS
    except ImportError:
        return False
    _ops.load_library()
    if ALL_FP8_EXPERTS_FUNCTIONS.get(IMPLEMENTATION_NAME) is not moejit_fp8_experts_forward:
        ALL_FP8_EXPERTS_FUNCTIONS[IMPLEMENTATION_NAME] = moejit_fp8_experts_forward
    return True
