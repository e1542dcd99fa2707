"""The "moejit" torch.compile backend.

    torch.compile(model, backend="moejit", fullgraph=True, mode=..., options=...)

For each dynamo graph it
  (a) counts the nodes that already call torch.ops.moejit.* (a model patched with moejit.patch);
  (b) finds every Hugging Face experts region (the call nodes whose nn_module_stack holds a module
      class named *Experts, not a shared expert) traced from an experts implementation such as the
      default grouped_mm, checks that it is exactly the gated, bias-free pattern moejit computes, and
      replaces it by one torch.ops.moejit.experts node (ids to int32, weights to fp32, in the graph);
  (c) hands the graph to inductor (compile_fx, with `mode`/`options` as torch.compile gives them).
A region that does not match is left to inductor as it is, and the reason is logged (logger "moejit";
moejit.set_log_level("info") shows what was replaced). Every compiled graph leaves a GraphReport in
reports().

How a region is found, read and checked (inputs, output, gate, activation, effects, autograd and a
numerical check, VERIFY) is moejit.dynamo_regions; this module drives it and keeps the reports.
On CUDA the layer's kernels are built while the backend runs, before any CUDA graph capture.
"""

from __future__ import annotations

import collections
import dataclasses
import logging

import torch
import torch.fx

from . import _ops
from .dynamo_regions import (Mismatch, find_experts_regions, match_region, moejit_op_name, replace_region,
                             verify_region)

__all__ = ["moejit_backend", "GraphReport", "reports", "clear_reports", "register"]

log = logging.getLogger("moejit")

BACKEND_NAME = "moejit"

# Whether rewrite() runs each matched region once next to torch.ops.moejit.experts and leaves a region
# that computes something else alone (dynamo_regions.verify_region: the structure does not pin every
# op). False skips this, e.g. when the regions are known to be HF's.
VERIFY = True


@dataclasses.dataclass
class GraphReport:
    """What the backend did with one dynamo graph."""

    moejit_calls: dict = dataclasses.field(default_factory=dict)  # op name -> nodes already calling it
    replaced: list = dataclasses.field(default_factory=list)  # (module path, config JSON)
    skipped: list = dataclasses.field(default_factory=list)  # (module path, reason)


_REPORTS: collections.deque = collections.deque(maxlen=256)


def reports() -> list:
    """GraphReports of the graphs compiled with the backend, oldest first (the last 256)."""
    return list(_REPORTS)


def clear_reports() -> None:
    _REPORTS.clear()


def rewrite(gm: torch.fx.GraphModule, example_inputs=None, verify: "bool | None" = None) -> GraphReport:
    """Steps (a) and (b) on gm, in place; returns what was done. `example_inputs` (the real graph
    inputs dynamo hands a backend) lets it verify each region numerically (see VERIFY)."""
    verify = VERIFY if verify is None else verify
    report = GraphReport()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            name = moejit_op_name(node.target)
            if name is not None:
                report.moejit_calls[name] = report.moejit_calls.get(name, 0) + 1
    regions = find_experts_regions(gm)
    matches = []
    for path, nodes in regions.items():
        if any(moejit_op_name(n.target) for n in nodes if n.op == "call_function"):
            log.debug("moejit backend: %s already calls moejit", path)
            continue
        try:
            m = match_region(gm, path, nodes)
            if verify:
                verify_region(gm, m, example_inputs)
            if m.device.type == "cuda":  # build the kernels now (a no-op after verify_region), before any capture
                index = m.device.index if m.device.index is not None else torch.cuda.current_device()
                torch.ops.moejit.compile(m.config, index)
            matches.append(m)
        except Exception as e:  # noqa: BLE001 (a region moejit cannot take stays inductor's)
            reason = str(e) if isinstance(e, Mismatch) else f"{type(e).__name__}: {e}"
            report.skipped.append((path, reason))
            log.warning("moejit backend: left %s to inductor: %s", path, reason)
    for m in matches:
        replace_region(gm, m)
        report.replaced.append((m.path, m.config))
        log.info("moejit backend: replaced %s (%d nodes) with moejit.experts %s", m.path, len(m.nodes), m.config)
    if matches:
        gm.graph.lint()
        gm.recompile()
    if report.moejit_calls:
        log.info("moejit backend: graph already calls %s", report.moejit_calls)
    return report


def moejit_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None):
    """torch.compile backend: replaces HF experts regions by moejit ops, then compiles with inductor."""
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    _ops.load_library()
    _REPORTS.append(rewrite(gm, example_inputs))
    patches = dict(options or {})
    if mode:
        patches.update(list_mode_options(mode))
    return compile_fx(gm, example_inputs, config_patches=patches)


def register() -> None:
    """Registers the backend name "moejit" with dynamo unless it is known already: an installed
    package registers it through its torch_dynamo_backends entry point, which dynamo loads itself
    (registering it here too would trip dynamo's duplicate-name assertion)."""
    import torch._dynamo

    if BACKEND_NAME not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(moejit_backend, name=BACKEND_NAME)
