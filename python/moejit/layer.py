"""MoELayer: one whole MoE layer (routing + experts) as a torch module over torch.ops.moejit.moe_layer."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import expert_parallel
from .config import MoeConfig

__all__ = ["MoELayer"]


class MoELayer(nn.Module):
    """Routing and routed experts of one layer, as SPEC.md defines them.

    Holds w13 [E_loc, 2I, H] (gate rows first, then up) and w2 [E_loc, H, I] (layout nk; kn stores
    their transposes), e_score_correction_bias [E] fp32 for topk_method noaux_tc, and the fp32
    tensors of a quantized layer (SPEC.md "Quantized experts"; MoeConfig.quant_tensor_shapes):
      w8a8_int8   int8 weights; w13_scale [E_loc, 2I], w2_scale [E_loc, H], input_smooth [E, H],
                  act_smooth [E_loc, I]
      fp8_block   float8_e4m3fn weights; w13_scale [E_loc, ceil(2I/128), ceil(H/128)],
                  w2_scale [E_loc, ceil(H/128), ceil(I/128)] (a checkpoint's *_scale_inv: they multiply)
      fp8_tensor  float8_e4m3fn weights; w13_scale [E_loc], w2_scale [E_loc]
    fp8 takes no input_smooth or act_smooth. A layer with expert_bias (gpt-oss) holds w13_bias
    [E_loc, N1] (gate then up) and w2_bias [E_loc, H] (given in fp32, bf16 or fp16; kept in fp32).
    Tensors not given are allocated on `device` (default: w13's): zeros, and ones for the scales and
    smooths.

    forward(hidden [T, H], router_logits [T, E], residual [T, H] or None) -> [T, H] in hidden's dtype.
    With config.router_gemm the layer holds the router's gate_weight [E, H] (dtype) and computes the
    logits itself (docs/LAYER_MATH.md "Router GEMM"): forward(hidden, residual=residual), no router_logits;
    with config.router_bias too (gpt-oss's router) it holds gate_bias [E] (dtype) and adds it to them.
    The op checks every tensor and raises ValueError naming the one with a wrong shape, dtype or
    strides, and ValueError for an invalid config. There is no backward.

    Expert parallel (ep_size > 1, or tp_size > 1): without a process_group the layer returns its
    rank's part, which the caller sums over the ranks. With one (torch.distributed; NCCL for CUDA
    tensors, gloo for CPU ones) every rank gets the whole output, by ep_mode (expert_parallel.py):
    "all_reduce" (every rank the same tokens; the group holds each (ep_rank, tp_rank) once; the
    residual is added once) or "all_to_all" (every rank its own tokens; group rank == ep_rank, tp_size
    1; max_tokens_per_rank C: fixed slabs of C rows per pair of ranks, no host sync, at most C tokens a
    call; None: splits that follow the routing, one host sync a call). Building the layer is then a
    collective of the group.
    """

    def __init__(self, config: MoeConfig, w13: Optional[torch.Tensor] = None, w2: Optional[torch.Tensor] = None, *,
                 e_score_correction_bias: Optional[torch.Tensor] = None, w13_scale: Optional[torch.Tensor] = None,
                 w2_scale: Optional[torch.Tensor] = None, input_smooth: Optional[torch.Tensor] = None,
                 act_smooth: Optional[torch.Tensor] = None, w13_bias: Optional[torch.Tensor] = None,
                 w2_bias: Optional[torch.Tensor] = None, gate_weight: Optional[torch.Tensor] = None,
                 gate_bias: Optional[torch.Tensor] = None, device=None, process_group=None,
                 ep_mode: str = "all_reduce", max_tokens_per_rank: Optional[int] = None):
        super().__init__()
        if isinstance(config, str):
            config = MoeConfig.from_json(config)
        self.config = config
        self._config_json = config.to_json()
        if process_group is not None:
            expert_parallel.check_group(config, process_group, ep_mode, max_tokens_per_rank)
        self.process_group, self.ep_mode, self.max_tokens_per_rank = process_group, ep_mode, max_tokens_per_rank
        # all_reduce mode adds the residual on the group's rank 0 alone (the others' are summed in).
        self._adds_residual = process_group is None or torch.distributed.get_rank(process_group) == 0
        if device is None and w13 is not None:
            device = w13.device
        weight_dtype = config.weight_torch_dtype
        quant_shapes = config.quant_tensor_shapes()

        def given(t, shape, dtype, fill=0.0):
            return t if t is not None else torch.full(shape, fill, dtype=dtype, device=device)

        self.w13 = nn.Parameter(given(w13, config.w13_shape(), weight_dtype), requires_grad=False)
        self.w2 = nn.Parameter(given(w2, config.w2_shape(), weight_dtype), requires_grad=False)
        # The per-expert tensors hold the fused shared experts after the routed ones (E_loc + S, E + S).
        E, E_loc, H, I = config.experts, config.gemm_experts, config.hidden, config.local_intermediate
        rows = config.w13_shape()[1] if config.weight_layout == "nk" else config.w13_shape()[2]
        needs_bias = config.topk_method == "noaux_tc"
        self.register_buffer("e_score_correction_bias",
                             given(e_score_correction_bias, (E,), torch.float32) if needs_bias or
                             e_score_correction_bias is not None else None)
        # The quantization's tensors, ones when not given. An unquantized layer keeps one only when
        # given (in the w8a8_int8 shapes, which the op checks and ignores).
        unquantized = {"w13_scale": (E_loc, rows), "w2_scale": (E_loc, H), "input_smooth": (E + config.shared_slots, H),
                       "act_smooth": (E_loc, I)}
        for name, t in (("w13_scale", w13_scale), ("w2_scale", w2_scale), ("input_smooth", input_smooth),
                        ("act_smooth", act_smooth)):
            if quant_shapes and name not in quant_shapes and t is not None:
                # The op would refuse it on every call; say so once, here.
                raise ValueError(f"moejit: {name} must not be given for quant {config.quant}: it quantizes the "
                                 f"activations without smoothing (only quant w8a8_int8 takes {name}); pass None")
            shape = quant_shapes.get(name) or unquantized[name]
            self.register_buffer(name, given(t, shape, torch.float32, 1.0)
                                 if name in quant_shapes or t is not None else None)

        # The router's weight: exactly when the layer computes the logits (router_gemm).
        if gate_weight is not None and not config.router_gemm:
            raise ValueError("moejit: gate_weight is given, but the config has router_gemm false (the layer takes "
                             "router_logits); set router_gemm=True to compute the logits in the layer")
        self.gate_weight = (nn.Parameter(given(gate_weight, (E, H), config.torch_dtype), requires_grad=False)
                            if config.router_gemm else None)
        # The router's bias: exactly when the layer adds it (router_bias; the op refuses one it would not).
        if gate_bias is not None and not config.router_bias:
            raise ValueError("moejit: gate_bias is given, but the config has router_bias false (its router has no "
                             "bias); set router_bias=True (with router_gemm=True) to add it to the logits")
        self.gate_bias = (nn.Parameter(given(gate_bias, (E,), config.torch_dtype), requires_grad=False)
                          if config.router_bias else None)

        # Expert biases: exactly when the config has them (the op refuses one it would not add).
        for name, t, shape in (("w13_bias", w13_bias, (E_loc, rows)), ("w2_bias", w2_bias, (E_loc, H))):
            if t is not None and not config.expert_bias:
                raise ValueError(f"moejit: {name} is given, but the config has no expert biases "
                                 "(expert_bias false)")
            # Kept in fp32, the layer's dtype for them, so that no call converts them again.
            self.register_buffer(name, given(t, shape, torch.float32).to(torch.float32)
                                 if config.expert_bias else None)

    def forward(self, hidden: torch.Tensor, router_logits: Optional[torch.Tensor] = None,
                residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.process_group is None:
            return self._local_forward(hidden, router_logits, residual)
        if self.ep_mode == "all_to_all":
            if router_logits is None:
                raise ValueError("moejit: router_logits is required (router_gemm false)")
            return expert_parallel.dispatch_combine(self, hidden, router_logits, residual, self.process_group,
                                                    self.max_tokens_per_rank)
        out = self._local_forward(hidden, router_logits, residual if self._adds_residual else None)
        return expert_parallel.all_reduce_output(out, self.process_group)

    def _local_forward(self, hidden, router_logits, residual):
        """This rank's part of the layer: its local experts (its slice of I), plus `residual`."""
        if self.config.router_gemm:
            if router_logits is not None:
                raise ValueError("moejit: router_logits given, but this layer computes them from its gate_weight "
                                 "(router_gemm true); call forward(hidden, residual=...)")
            return torch.ops.moejit.moe_layer_gate(hidden, self.gate_weight, self.w13, self.w2,
                                                   self.e_score_correction_bias, self.w13_scale, self.w2_scale,
                                                   self.input_smooth, self.act_smooth, residual, self._config_json,
                                                   w13_bias=self.w13_bias, w2_bias=self.w2_bias,
                                                   gate_bias=self.gate_bias)
        if router_logits is None:
            raise ValueError("moejit: router_logits is required (router_gemm false)")
        return torch.ops.moejit.moe_layer(hidden, router_logits, self.w13, self.w2, self.e_score_correction_bias,
                                          self.w13_scale, self.w2_scale, self.input_smooth, self.act_smooth,
                                          residual, self._config_json, w13_bias=self.w13_bias, w2_bias=self.w2_bias)

    def experts_only(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     hidden_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Stages 2-6 of this rank on a given routing (topk_ids [T, K] int32 global experts, topk_weights
        [T, K] fp32): the weighted sum of the row's local experts; other ranks' experts contribute 0.
        fp8 layers also take hidden already quantized (float8_e4m3fn, with hidden_scale as
        quantize_hidden returns it)."""
        return torch.ops.moejit.experts(hidden, topk_ids, topk_weights, self.w13, self.w2, self.w13_scale,
                                        self.w2_scale, self.input_smooth, self.act_smooth, None, self._config_json,
                                        w13_bias=self.w13_bias, w2_bias=self.w2_bias, hidden_scale=hidden_scale)

    def quantize_hidden(self, hidden: torch.Tensor):
        """An fp8 layer's stage 3 alone: (q float8_e4m3fn [T, H], scale fp32 [T, groups]), the rows
        experts_only takes with hidden_scale."""
        return torch.ops.moejit.quantize_hidden(hidden, self._config_json)

    def route(self, router_logits: torch.Tensor):
        """(topk_weights [T, K] fp32, topk_ids [T, K] int32) of SPEC.md stage 1."""
        return torch.ops.moejit.route(router_logits, self.e_score_correction_bias, self._config_json)

    def precompile(self, device=None) -> dict:
        """Builds and loads this layer's kernels on its (or the given) CUDA device; validates on CPU."""
        from . import compile as compile_configs

        return compile_configs(self.config, device if device is not None else self.w13.device)

    def extra_repr(self) -> str:
        c = self.config
        return (f"experts={c.experts}, topk={c.topk}, hidden={c.hidden}, moe_intermediate={c.moe_intermediate}, "
                f"dtype={c.dtype}, quant={c.quant}")
