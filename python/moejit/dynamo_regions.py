"""The Hugging Face experts regions of a dynamo FX graph: finding them, checking each against the
pattern moejit computes (its structure, then its numbers), and replacing a region that passes by one
torch.ops.moejit.experts node. moejit.dynamo, the torch.compile backend, drives these steps.

A region is the call nodes whose nn_module_stack holds a module class named *Experts (not a shared
expert). How it is read (all of it from the graph; the model object is not available here):
  inputs   exactly five tensors: hidden [T, H] (floating), ids [T, K] (integer), weights [T, K]
           (floating), gate_up_proj [E, 2I, H] and down_proj [E, H, I] (graph inputs named
           *gate_up_proj_ / *down_proj_); plus any SymInt inputs (dynamic shapes)
  output   exactly one node used outside the region, [T, H] in hidden's dtype
  gate     act(gate) * up with gate, up = chunk(x, 2, dim=-1): HF's _default_apply_gate
  act      the activation, from the act_fn submodule: a single F.silu / F.gelu node (approximate
           "none" or "tanh") is read directly; otherwise the act_fn class is matched against
           transformers' ACT2CLS for silu/swish, gelu, gelu_pytorch_tanh/gelu_new/gelu_fast
  effects  no in-place write reaches a tensor from outside the region that is used again
  autograd the region's output needs no gradient (moejit ops have no backward): under
           torch.no_grad()/inference_mode, or with frozen weights
  numbers  the region, run once on random routing of its own shapes with its real expert weights,
           agrees with torch.ops.moejit.experts (verify_region; catches math the structure does not pin)
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx

from .config import hf_activations
from .hf import experts_config_json

__all__ = ["Mismatch", "RegionMatch", "moejit_op_name", "find_experts_regions", "match_region", "verify_region",
           "replace_region"]


def moejit_op_name(target) -> "str | None":
    """'experts' for torch.ops.moejit.experts (packet) or .default (overload); None otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::", 1)[1] if target.namespace == "moejit" else None
    if isinstance(target, torch._ops.OpOverloadPacket):
        qualified = target._qualified_op_name
        return qualified.split("::", 1)[1] if qualified.startswith("moejit::") else None
    return None


def _value(node):
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None


def _is_tensor(node) -> bool:
    return isinstance(_value(node), torch.Tensor)


def _stack_entries(node) -> list:
    """[(path, class name)] of the node's nn_module_stack, outermost first."""
    out = []
    for value in (node.meta.get("nn_module_stack") or {}).values():
        path, cls = value[0], value[1]
        name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
        out.append((str(path), name))
    return out


def _short(class_name: str) -> str:
    return class_name.rsplit(".", 1)[-1]


def find_experts_regions(gm: torch.fx.GraphModule) -> dict:
    """{module path: [call nodes]} of the routed experts modules, in graph order."""
    regions: dict = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        for path, cls in _stack_entries(node):
            if _short(cls).endswith("Experts") and "shared" not in path.lower():
                regions.setdefault(path, []).append(node)
                break
    return regions


# Methods and functions whose result may alias their first argument (conservative).
_VIEW_METHODS = {
    "view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "expand_as", "flatten",
    "unflatten", "t", "view_as", "reshape_as", "narrow", "select", "as_strided", "split", "chunk", "unbind",
    "diagonal", "movedim", "swapaxes", "swapdims", "contiguous", "to", "type_as", "detach", "float", "half",
    "bfloat16", "int", "long", "__getitem__",
}
_VIEW_FUNCTIONS = {torch.reshape, torch.transpose, torch.permute, torch.unsqueeze, torch.squeeze, torch.flatten,
                   torch.narrow, torch.select, torch.split, torch.chunk, torch.unbind, torch.movedim}


def _index_is_tensor(index) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(_is_tensor(i) for i in items)


def _alias_base(node):
    """The node whose storage `node` may share: walks back through views and tuple elements."""
    while isinstance(node, torch.fx.Node) and node.args:
        first = node.args[0]
        if node.op == "call_method" and node.target in _VIEW_METHODS:
            node = first
        elif node.op == "call_function" and node.target in _VIEW_FUNCTIONS:
            node = first
        elif node.op == "call_function" and node.target is operator.getitem:
            if _is_tensor(first) and _index_is_tensor(node.args[1]):
                return node  # advanced indexing: a copy
            node = first
        else:
            return node
    return node


def _writes_in_place(node) -> bool:
    if node.op == "call_function" and node.target is operator.setitem:
        return True
    if "out" in node.kwargs:
        return True
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return isinstance(name, str) and name.endswith("_") and not name.startswith("__")


_SILU_FNS = {torch.nn.functional.silu, getattr(torch, "silu", torch.nn.functional.silu)}
_GELU_FNS = {torch.nn.functional.gelu}


def _activation_of_op(node) -> "str | None":
    if node.op == "call_function" and node.target in _SILU_FNS:
        return "silu"
    if node.op == "call_method" and node.target == "silu":
        return "silu"
    if node.op == "call_function" and node.target in _GELU_FNS:
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    return None


_ACTIVATION_CLASSES: "dict | None" = None


def _activation_classes() -> dict:
    """{qualified class name: moejit activation} for the act_fn classes transformers builds."""
    global _ACTIVATION_CLASSES
    if _ACTIVATION_CLASSES is None:
        table = {}
        try:
            from transformers.activations import ACT2CLS
        except ImportError:
            ACT2CLS = {}
        for hf_name, ours in hf_activations().items():
            entry = ACT2CLS.get(hf_name)
            cls = entry[0] if isinstance(entry, tuple) else entry
            if cls is not None:
                table[f"{cls.__module__}.{cls.__qualname__}"] = ours
        _ACTIVATION_CLASSES = table
    return _ACTIVATION_CLASSES


class Mismatch(Exception):
    """The region is not the pattern moejit replaces; the message says why."""


def _is_chunk_in_two(node) -> bool:
    if node.op == "call_method" and node.target == "chunk":
        args = list(node.args[1:]) + [None, None]
        chunks = node.kwargs.get("chunks", args[0])
        dim = node.kwargs.get("dim", args[1] if args[1] is not None else 0)
    elif node.op == "call_function" and node.target is torch.chunk:
        args = list(node.args[1:]) + [None, None]
        chunks = node.kwargs.get("chunks", args[0])
        dim = node.kwargs.get("dim", args[1] if args[1] is not None else 0)
    else:
        return False
    value = _value(node.args[0])
    last = value.dim() - 1 if isinstance(value, torch.Tensor) else None
    return chunks == 2 and (dim == -1 or dim == last)


def _is_getitem(node, source, index) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is operator.getitem
            and node.args[0] is source and node.args[1] == index)


def _is_mul(node) -> bool:
    return ((node.op == "call_function" and node.target in (operator.mul, torch.mul))
            or (node.op == "call_method" and node.target == "mul"))


def _read_activation(path: str, nodes: list) -> str:
    """The activation of the region's gate, checking act(gate) * up with gate, up = chunk(x, 2, -1)."""
    in_region = set(nodes)
    act_path = path + ".act_fn"
    act_nodes = [n for n in nodes if any(p == act_path or p.startswith(act_path + ".") for p, _ in _stack_entries(n))]
    act_class = None
    if act_nodes:
        act_class = next(cls for p, cls in _stack_entries(act_nodes[0]) if p == act_path)
    else:  # act_fn is a plain function: the activation call itself
        act_nodes = [n for n in nodes if _activation_of_op(n) is not None]
    if not act_nodes:
        raise Mismatch("no activation (act_fn) found in the region")
    act_set = set(act_nodes)
    act_inputs = {a for n in act_nodes for a in n.all_input_nodes if a not in act_set}
    act_outputs = [n for n in act_nodes if any(u not in act_set for u in n.users)]
    if len(act_inputs) != 1 or len(act_outputs) != 1:
        raise Mismatch(f"the activation is applied {len(act_outputs)} time(s) to {len(act_inputs)} input(s); "
                       "expected once, to the gate")
    (gate,), (act_out,) = tuple(act_inputs), act_outputs
    if not (gate in in_region and gate.op == "call_function" and gate.target is operator.getitem
            and isinstance(gate.args[0], torch.fx.Node) and _is_chunk_in_two(gate.args[0]) and gate.args[1] == 0):
        raise Mismatch("the activation's input is not the first half of chunk(gate_up, 2, dim=-1) "
                       "(interleaved gate/up rows or a custom _apply_gate)")
    chunk = gate.args[0]
    users = list(act_out.users)
    if len(users) != 1 or not _is_mul(users[0]):
        raise Mismatch("the activation's output is not multiplied by the up half (custom _apply_gate)")
    mul = users[0]
    others = [a for a in mul.args if a is not act_out]
    if len(mul.args) != 2 or len(others) != 1 or not _is_getitem(others[0], chunk, 1):
        raise Mismatch("the activation's output is not multiplied by the up half (custom _apply_gate)")

    if len(act_nodes) == 1 and _activation_of_op(act_nodes[0]) is not None:
        return _activation_of_op(act_nodes[0])
    if act_class is not None and act_class in _activation_classes():
        return _activation_classes()[act_class]
    raise Mismatch(f"activation {_short(act_class) if act_class else act_nodes[0].target} is not one moejit "
                   "supports (silu, gelu, gelu_tanh)")


@dataclasses.dataclass
class RegionMatch:
    path: str
    nodes: list
    hidden: torch.fx.Node
    ids: torch.fx.Node
    weights: torch.fx.Node
    gate_up: torch.fx.Node
    down: torch.fx.Node
    output: torch.fx.Node
    config: str
    device: torch.device


def match_region(gm: torch.fx.GraphModule, path: str, nodes: list) -> RegionMatch:
    """Checks one experts region against the pattern; raises Mismatch saying what differs."""
    in_region = set(nodes)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    inputs = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in in_region and a not in inputs:
                inputs.append(a)
    tensors = [a for a in inputs if _is_tensor(a)]
    others = [a for a in inputs if not _is_tensor(a) and not isinstance(_value(a), (torch.SymInt, int))]
    if others:
        raise Mismatch(f"unexpected non-tensor inputs {[a.name for a in others]}")

    def weight(suffix):
        found = [a for a in tensors if a.op in ("placeholder", "get_attr") and
                 (a.name.endswith(suffix + "_") or str(a.target).endswith(suffix))]
        if len(found) != 1:
            raise Mismatch(f"expected one {suffix} parameter input, found {len(found)}")
        return found[0]

    gate_up, down = weight("gate_up_proj"), weight("down_proj")
    acts = [a for a in tensors if a is not gate_up and a is not down]
    if len(acts) != 3:
        raise Mismatch(f"expected 5 tensor inputs (hidden, ids, weights, gate_up_proj, down_proj), got "
                       f"{len(tensors)}: {[a.name for a in tensors]}")
    ints = [a for a in acts if not _value(a).is_floating_point()]
    floats = [a for a in acts if _value(a).is_floating_point()]
    if len(ints) != 1 or len(floats) != 2:
        raise Mismatch("expected one integer (ids) and two floating (hidden, weights) inputs")
    ids = ints[0]
    wv, dv, iv = _value(gate_up), _value(down), _value(ids)
    if wv.dim() != 3 or dv.dim() != 3 or iv.dim() != 2:
        raise Mismatch("gate_up_proj/down_proj must be 3-D and the ids 2-D")
    E, two_i, H = (int(s) for s in wv.shape)
    if tuple(int(s) for s in dv.shape) != (E, H, two_i // 2) or two_i % 2:
        raise Mismatch(f"weights are not gate_up_proj [E, 2I, H] and down_proj [E, H, I]: {tuple(wv.shape)}, "
                       f"{tuple(dv.shape)} (transposed, biased or ungated experts)")
    if not (wv.is_contiguous() and dv.is_contiguous()):
        raise Mismatch("gate_up_proj/down_proj are not contiguous")
    hidden_candidates = [a for a in floats if _value(a).dim() == 2 and _value(a).shape[-1] == H]
    weight_candidates = [a for a in floats if _value(a).dim() == 2 and _value(a).shape == iv.shape]
    if len(hidden_candidates) == 2 and len(weight_candidates) == 2:  # K == H: tell them apart by dtype
        hidden_candidates = [a for a in hidden_candidates if _value(a).dtype == wv.dtype]
        weight_candidates = [a for a in weight_candidates if a not in hidden_candidates]
    if len(hidden_candidates) != 1 or len(weight_candidates) != 1 or hidden_candidates[0] is weight_candidates[0]:
        raise Mismatch("could not tell hidden [T, H] from the routing weights [T, K]")
    hidden, weights = hidden_candidates[0], weight_candidates[0]
    hv = _value(hidden)
    if hv.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise Mismatch(f"hidden is {hv.dtype}; moejit takes bfloat16, float16 or float32")
    if hv.dtype != wv.dtype:
        raise Mismatch(f"hidden is {hv.dtype} but the weights are {wv.dtype}")
    K = iv.shape[1]
    if not isinstance(K, int):
        raise Mismatch("the top-k (ids' second dim) is dynamic")

    outputs = [n for n in nodes if any(u not in in_region for u in n.users)]
    if len(outputs) != 1:
        raise Mismatch(f"expected one node used outside the region, found {[n.name for n in outputs]}")
    output = outputs[0]
    ov = _value(output)
    if not isinstance(ov, torch.Tensor) or ov.dtype != hv.dtype or ov.dim() != 2 or ov.shape[-1] != H:
        raise Mismatch("the region's output is not [T, H] in hidden's dtype")
    if ov.requires_grad:
        raise Mismatch("its output needs a gradient and moejit ops have no backward (run under "
                       "torch.no_grad()/torch.inference_mode() or freeze the weights)")
    if any(order[a] > order[output] for a in tensors):
        raise Mismatch("an input is computed after the region's output")

    # In-place writes must stay inside the region (HF's grouped_mm writes only tensors it made).
    first = min(order[n] for n in nodes)
    for n in nodes:
        if _writes_in_place(n) and n.args:
            base = _alias_base(n.args[0])
            if isinstance(base, torch.fx.Node) and base not in in_region:
                used_later = [u for u in base.users if u not in in_region and order[u] > first]
                if base.op == "placeholder" or used_later:
                    raise Mismatch(f"{n.name} writes in place to {base.name}, which is used outside the region")

    activation = _read_activation(path, nodes)
    config = experts_config_json(E, K, H, two_i // 2, activation, hv.dtype)
    return RegionMatch(path, nodes, hidden, ids, weights, gate_up, down, output, config, hv.device)


# Numerical check of a matched region: the structure above pins the inputs, the output, the gate and
# the activation, but not every op in between (a custom experts class could scale or mask its
# output). So each matched region runs once, on random ids and weights of its own shapes and its
# real expert weights, next to torch.ops.moejit.experts; a region that computes something else is
# left alone. moejit.dynamo.VERIFY = False skips this (e.g. when the regions are known to be HF's).
_VERIFY_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-4, torch.bfloat16: 3e-2, torch.float16: 3e-2}


def _hint(value):
    # The value the symbol had when dynamo traced (no guard is added).
    if isinstance(value, torch.SymInt):
        return value.node.require_hint()
    return value


def _real_weight(gm, node, example_inputs):
    if node.op == "get_attr":
        obj = gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        return obj
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if example_inputs is None or len(example_inputs) != len(placeholders):
        raise Mismatch("cannot verify: the example inputs do not match the graph inputs")
    value = example_inputs[placeholders.index(node)]
    if not isinstance(value, torch.Tensor) or isinstance(value, torch._subclasses.FakeTensor):
        raise Mismatch("cannot verify: the expert weights are not real tensors")
    return value


def verify_region(gm: torch.fx.GraphModule, m: "RegionMatch", example_inputs) -> None:
    """Runs the region and moejit.experts on the same random routing; raises Mismatch if they differ."""
    in_region = set(m.nodes)
    inputs = []
    for n in m.nodes:
        for a in n.all_input_nodes:
            if a not in in_region and a not in inputs:
                inputs.append(a)
    graph = torch.fx.Graph()
    env = {a: graph.placeholder(a.name) for a in inputs}
    for n in m.nodes:
        env[n] = graph.node_copy(n, lambda x: env[x])
    graph.output(env[m.output])
    region = torch.fx.GraphModule(gm, graph)

    hv, iv, wv = _value(m.hidden), _value(m.ids), _value(m.weights)
    T, H = (_hint(s) for s in hv.shape)
    K = int(iv.shape[1])
    E = int(_value(m.gate_up).shape[0])
    device = hv.device
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        hidden = torch.randn(T, H, device=device, generator=g).to(hv.dtype)
        scores = torch.rand(T, E, device=device, generator=g)
        weights, ids = scores.topk(K, -1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(wv.dtype)
        ids = ids.to(iv.dtype)
        gate_up, down = _real_weight(gm, m.gate_up, example_inputs), _real_weight(gm, m.down, example_inputs)
        values = {m.hidden: hidden, m.ids: ids, m.weights: weights, m.gate_up: gate_up, m.down: down}
        args = [values[a] if a in values else _hint(_value(a)) for a in inputs]
        try:
            ref = region(*[a.clone() if isinstance(a, torch.Tensor) and a is not gate_up and a is not down else a
                           for a in args])
        except Exception as e:  # noqa: BLE001 (any failure means: do not touch this region)
            raise Mismatch(f"cannot verify: running the region failed: {type(e).__name__}: {e}") from None
        out = torch.ops.moejit.experts(hidden, ids.to(torch.int32), weights.to(torch.float32), gate_up, down,
                                       None, None, None, None, None, m.config)
    if not isinstance(ref, torch.Tensor) or ref.shape != out.shape:
        raise Mismatch("cannot verify: the region's output has another shape than moejit's")
    ref64, out64 = ref.double(), out.double()
    err = float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30))
    tol = _VERIFY_TOLERANCE.get(hv.dtype, 3e-2)
    if not err <= tol:
        raise Mismatch(f"it computes something else than moejit.experts (relative difference {err:.3g} "
                       f"> {tol:g} on random routing)")


def _fake(fn, *values):
    try:
        return fn(*values)
    except Exception:  # meta is best effort: inductor re-traces the graph with its own fakes
        return None


def replace_region(gm: torch.fx.GraphModule, m: RegionMatch) -> None:
    """Replaces the matched region's nodes by one torch.ops.moejit.experts node (ids to int32, weights to
    fp32, inputs made contiguous, in the graph); the caller lints and recompiles gm."""
    graph = gm.graph
    meta_stack = m.output.meta.get("nn_module_stack")

    def add(op, target, args, value):
        node = graph.create_node(op, target, args, {})
        if value is not None:
            node.meta["example_value"] = value
        if meta_stack is not None:
            node.meta["nn_module_stack"] = dict(meta_stack)
        return node

    with graph.inserting_before(m.output):
        hv, iv, wv = _value(m.hidden), _value(m.ids), _value(m.weights)
        hidden = add("call_method", "contiguous", (m.hidden,), _fake(lambda t: t.contiguous(), hv))
        ids32 = add("call_method", "to", (m.ids, torch.int32), _fake(lambda t: t.to(torch.int32), iv))
        ids = add("call_method", "contiguous", (ids32,), _value(ids32))
        w32 = add("call_method", "to", (m.weights, torch.float32), _fake(lambda t: t.to(torch.float32), wv))
        weights = add("call_method", "contiguous", (w32,), _value(w32))
        args = (hidden, ids, weights, m.gate_up, m.down, None, None, None, None, None, m.config)
        out_value = _fake(lambda *a: torch.ops.moejit.experts.default(*a), _value(hidden), _value(ids),
                          _value(weights), _value(m.gate_up), _value(m.down), None, None, None, None, None, m.config)
        out = add("call_function", torch.ops.moejit.experts.default, args,
                  out_value if out_value is not None else _value(m.output))
    m.output.replace_all_uses_with(out)
    for node in reversed(m.nodes):
        graph.erase_node(node)

