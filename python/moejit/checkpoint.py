"""Expert weights from a Hugging Face safetensors checkpoint, packed as moejit's layer takes them.

``load_experts(model_dir, layer, ep_size=8, ep_rank=3)`` reads one MoE layer of the folder's
checkpoint (its index, one file or shards; the names of Qwen/DeepSeek, Mixtral and transformers 5.x
fused experts) for one rank: w13 [E_loc, 2I_loc, H] (gate rows, then up rows), w2 [E_loc, H, I_loc],
and per config the fp8 scales, the routing correction bias (fp32) and, with ``router_gemm=True``, the
router's gate_weight [E, H] in the model dtype (with ``router_bias=True``, gpt-oss's, its gate_bias [E]
too). The config is the folder's
config.json with the keyword arguments (moejit config fields) applied. The C++ reader checks every
file as untrusted input; a missing or malformed tensor raises ValueError naming it and its file.
"""

from __future__ import annotations

import json
import os
from typing import Optional, Union

import torch

from . import _ops  # noqa: F401  (registers the op library)


def load_experts(model_dir: Union[str, os.PathLike], layer: int, *, device: Optional[torch.device] = None,
                 **config_fields) -> dict:
    """The packed expert tensors of MoE layer ``layer`` (its index in the model), as a dict with "w13",
    "w2" and, where the config has them, "w13_scale", "w2_scale", "e_score_correction_bias", and (gpt-oss)
    "w13_bias", "w2_bias" in fp32; on ``device`` (default: CPU, where the reader puts them).

    With ``router_gemm=True`` (a layer that computes its router logits, ``MoELayer(..., gate_weight=...)``)
    it also returns "gate_weight": the router's weight [E, H] (``<layer>.mlp.gate.weight``, Mixtral's
    ``block_sparse_moe.gate.weight``, gpt-oss's ``mlp.router.weight``) in the model dtype, converted from
    the checkpoint's bf16, fp16 or fp32 with round-to-nearest-even as ``Tensor.to`` does; every expert's
    row on every rank, since routing is global. With ``router_bias=True`` too (gpt-oss's router, a linear
    with a bias; a gpt-oss config.json sets it with router_gemm) it returns "gate_bias": ``mlp.router.bias``
    [E], converted the same way. ValueError names the tensor and its file when it is missing or has the
    wrong shape or dtype, and refuses a router with a bias loaded for router_gemm without router_bias (the
    bias would be dropped)."""
    overrides = json.dumps({name: str(value).lower() if isinstance(value, bool) else str(value)
                            for name, value in config_fields.items()})
    tensors = dict(torch.ops.moejit.load_experts(os.fspath(model_dir), int(layer), overrides))
    return {name: t.to(device) for name, t in tensors.items()} if device is not None else tensors
