"""moejit: fused Mixture-of-Experts GPU kernels, compiled for each layer config at model load.

Importing the package loads the op library (torch.ops.moejit.moe_layer / route / experts / compile;
see moejit._ops for where it looks) and registers the "moejit" torch.compile backend.

    cfg = moejit.MoeConfig(experts=8, topk=2, hidden=4096, moe_intermediate=14336, dtype="bf16")
    moejit.compile(cfg, "cuda")                 # build + load the kernels now (CPU: validate only)
    layer = moejit.MoELayer(cfg, w13, w2)       # routing + experts: layer(hidden, router_logits)

    moejit.patch(model)                          # Hugging Face MoE model: experts run on moejit
    torch.compile(model, backend="moejit")       # or: rewrite the traced experts into moejit ops

The Hugging Face experts implementation is registered by patch() and register_hf(), and at import
when transformers is already imported. Logging goes to the "moejit" logger; set_log_level("info")
shows what the backend replaced and what patch() compiled.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Iterable, Union

import torch

from . import _ops

_ops.load_library()

from . import dynamo, hf, hf_blocks  # noqa: E402
from .checkpoint import load_experts  # noqa: E402
from .config import MoeConfig, activation_from_hf, check_hf_experts  # noqa: E402
from .layer import MoELayer  # noqa: E402

__version__ = "0.1.0"
__all__ = ["MoeConfig", "MoELayer", "load_experts", "compile", "patch", "register_hf", "set_log_level", "library_path",
           "__version__"]

log = logging.getLogger("moejit")

# The names MOEJIT_LOG takes in C++ (common/knobs.cpp) plus the standard ones. "off" still shows
# warnings, as the C++ side does.
_LEVELS = {"off": logging.WARNING, "error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO,
           "debug": logging.DEBUG}


def set_log_level(level: Union[str, int]) -> None:
    """Sets the "moejit" logger's level: "off" | "info" | "debug" (as MOEJIT_LOG spells them), or
    "warning" | "error" | a logging level number. Adds a stderr handler the first time."""
    if isinstance(level, str):
        if level.lower() not in _LEVELS:
            raise ValueError(f"moejit: log level {level!r} is not allowed; allowed: {', '.join(_LEVELS)}")
        level = _LEVELS[level.lower()]
    log.setLevel(level)
    if not any(getattr(h, "_moejit", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._moejit = True
        log.addHandler(handler)


# MOEJIT_LOG=info|debug (read by the C++ knobs, like every MOEJIT_* variable) turns the logger on,
# e.g. to see which graph regions the torch.compile backend replaced.
if hasattr(torch.ops.moejit, "log_level") and torch.ops.moejit.log_level() != "off":
    set_log_level(torch.ops.moejit.log_level())


def library_path():
    """Where the op library was loaded from (None when another copy had registered the ops first)."""
    return _ops.loaded_from()


def register_hf() -> None:
    """Registers the "moejit" experts implementation with transformers (idempotent)."""
    hf.register()


_DTYPE_ALIASES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                  "float16": torch.float16, "half": torch.float16, "fp32": torch.float32,
                  "float32": torch.float32, "float": torch.float32}


def _config_json(config) -> str:
    if isinstance(config, MoeConfig):
        return config.to_json()
    if isinstance(config, str):
        try:
            json.loads(config)
        except json.JSONDecodeError as e:
            raise ValueError(f"moejit: config is not valid JSON: {e}") from None
        return config
    raise TypeError(f"moejit: a config is a MoeConfig or its JSON string, got {type(config).__name__}")


def _validate_on_cpu(config_json: str) -> None:
    # The library parses and validates a config the first time an op sees it: a 0-token routing
    # call does exactly that and nothing else (ValueError naming the field for a bad config).
    d = json.loads(config_json)
    d = d if isinstance(d, dict) else {}
    experts = d.get("experts", 8) if isinstance(d.get("experts", 8), int) else 8
    dtype = _DTYPE_ALIASES.get(str(d.get("router_dtype", d.get("dtype", "bf16"))), torch.float32)
    bias = torch.zeros(max(experts, 0)) if d.get("topk_method") == "noaux_tc" else None
    torch.ops.moejit.route(torch.empty(0, max(experts, 0), dtype=dtype), bias, config_json)


def _describe(config_json: str) -> str:
    d = json.loads(config_json)
    return (f"E={d.get('experts')} K={d.get('topk')} H={d.get('hidden')} I={d.get('moe_intermediate')} "
            f"{d.get('activation', 'silu')} {d.get('dtype', 'bf16')}")


def _device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def compile(config: Union[MoeConfig, str, Iterable], device=None, progress: bool = True):  # noqa: A001
    """Builds and loads the kernels of one layer config, or of each config of an iterable, on a CUDA
    device (default: the current one when CUDA is available, else CPU), so nothing compiles later.
    On CPU, where the ops run ATen code, it only validates the configs.

    Returns a summary dict per config ({"kernels", "units", "arch", "device", "seconds"} on CUDA;
    {"device": "cpu", "kernels": 0} on CPU): one dict for one config, a list for an iterable.
    Raises ValueError for an invalid config (naming the field) and RuntimeError when a kernel fails to
    compile (with NVRTC's log). On CUDA it shows a progress bar (tqdm when installed, else a line per
    config on stderr) unless progress=False."""
    single = isinstance(config, (MoeConfig, str))
    configs = [_config_json(c) for c in ([config] if single else list(config))]
    dev = _device(device)
    results = []
    if dev.type == "cpu":
        for cfg in configs:
            _validate_on_cpu(cfg)
            results.append({"device": "cpu", "kernels": 0})
    elif dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        bar = None
        if progress and configs:
            try:
                from tqdm.auto import tqdm

                bar = tqdm(total=len(configs), desc=f"moejit: compiling on cuda:{index}", unit="config")
            except ImportError:
                bar = None
        try:
            for i, cfg in enumerate(configs):
                start = time.perf_counter()
                summary = json.loads(torch.ops.moejit.compile(cfg, index))
                summary.update(device=f"cuda:{index}", seconds=time.perf_counter() - start)
                results.append(summary)
                log.info("moejit: compiled %s on cuda:%d: %s kernels in %.2fs", _describe(cfg), index,
                         summary.get("kernels"), summary["seconds"])
                if bar is not None:
                    bar.update(1)
                elif progress:
                    print(f"moejit: compiled {i + 1}/{len(configs)} on cuda:{index}: {_describe(cfg)} "
                          f"({summary.get('kernels')} kernels, {summary['seconds']:.1f}s)", file=sys.stderr, flush=True)
        finally:
            if bar is not None:
                bar.close()
    else:
        raise ValueError(f"moejit: device {dev} is not supported; use a cuda device or cpu")
    return results[0] if single else results


def patch(model: torch.nn.Module, precompile: bool = True, progress: bool = True,
          whole_blocks: bool = True, fuse_shared_experts: bool = True) -> torch.nn.Module:
    """Makes a Hugging Face MoE model run its MoE layers on moejit: registers the "moejit" experts
    implementation, checks every experts module (ValueError for biased, transposed, interleaved or
    ungated experts other than gpt-oss's; NotImplementedError for an unsupported hidden_act) before
    changing anything, calls model.set_experts_implementation("moejit"), and with whole_blocks runs each
    MoE block whose math moejit covers (Mixtral, Qwen3-MoE, DeepSeek-V2/V3, GLM-4.5, Qwen3-Next,
    gpt-oss: hf_blocks) as one moejit call: routing, experts and combine; the others keep their own
    routing. gpt-oss's experts (GptOssExperts: biases, interleaved and transposed weights) run on a
    copy of their weights in moejit's layout, packed here once (a second copy of the experts' weights:
    hf_gpt_oss says why no view can serve). With fuse_shared_experts a
    whole block whose shared experts are one plain gated MLP (DeepSeek-V3, GLM-4.5: n_shared_experts 1)
    computes them in the same call, its weights moved into packed tensors that its parameters then
    view (no second copy; hf_blocks says what keeps them views); other shared experts are the call's
    residual. With precompile it compiles each distinct config on its device (validates it on CPU).
    Returns the model."""
    hf.register()
    modules = hf.find_experts_modules(model)
    if not modules:
        raise ValueError(f"moejit.patch: {type(model).__name__} has no experts modules that transformers' "
                         "ExpertsInterface dispatches (a transformers 5 MoE model is needed)")
    by_device: dict = {}
    for name, module in modules:
        if not hf.hf_gpt_oss.is_gpt_oss_experts(module):
            check_hf_experts(module)
            activation_from_hf(getattr(getattr(module, "config", None), "hidden_act", None))
        topk = hf.module_topk(module)
        if topk is None:
            log.info("moejit.patch: %s: top-k unknown (no num_experts_per_tok), compiled at its first call", name)
            continue
        cfg = hf.module_config_json(module, topk)
        by_device.setdefault(module.gate_up_proj.device, {}).setdefault(cfg, []).append(name)
    # gpt-oss's experts in moejit's layout now, outside any graph torch.compile traces later.
    for _, module in modules:
        if hf.hf_gpt_oss.is_gpt_oss_experts(module):
            hf.hf_gpt_oss.packed_weights(module)
    model.set_experts_implementation(hf.IMPLEMENTATION_NAME)
    if whole_blocks:
        for name, cfg in hf_blocks.patch_blocks(model, fuse_shared_experts=fuse_shared_experts).items():
            device = model.get_submodule(name).experts.gate_up_proj.device
            by_device.setdefault(device, {}).setdefault(cfg, []).append(name)
    if precompile:
        for device, configs in by_device.items():
            if device.type not in ("cuda", "cpu"):
                log.info("moejit.patch: weights on %s; nothing compiled now", device)
                continue
            for cfg, names in configs.items():
                log.info("moejit.patch: %d module(s) with %s on %s", len(names), _describe(cfg), device)
            compile(list(configs), device, progress=progress)
    return model


if "transformers" in sys.modules:
    try:
        hf.register()
    except ImportError:  # a transformers without the ExpertsInterface (< 5)
        pass

dynamo.register()
