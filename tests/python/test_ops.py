"""The op library as torch sees it: registration, opcheck, Meta kernels, math against a plain torch
reference, argument errors, MoeConfig and MoELayer."""

import dataclasses
import json

import pytest
import torch

import moejit
from moejit import MoeConfig, MoELayer

from conftest import TOLERANCE, rel_error

OPS = ("moe_layer", "moe_layer_gate", "route", "experts", "quantize_hidden", "compile", "hf_activations")


def small_config(**kw):
    base = dict(experts=8, topk=2, hidden=64, moe_intermediate=32, dtype="fp32")
    base.update(kw)
    return MoeConfig(**base)


def random_inputs(cfg: MoeConfig, tokens=5, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = cfg.torch_dtype
    t = dict(
        hidden=torch.randn(tokens, cfg.hidden, generator=g).to(dt),
        logits=torch.randn(tokens, cfg.experts, generator=g).to(cfg.router_torch_dtype),
        w13=(torch.randn(cfg.w13_shape(), generator=g) * 0.1).to(dt),
        w2=(torch.randn(cfg.w2_shape(), generator=g) * 0.1).to(dt),
        bias=torch.randn(cfg.experts, generator=g) * 0.1,
    )
    return {k: v.to(device) for k, v in t.items()}


def reference_experts(hidden, ids, weights, w13, w2, activation="silu"):
    """SPEC.md stages 2-6 in float64 (layout nk, gated, ids outside [0, E) contribute 0)."""
    E, two_i, _ = w13.shape
    I = two_i // 2
    act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
           "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}[activation]
    x, w13, w2 = hidden.double().cpu(), w13.double().cpu(), w2.double().cpu()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if not 0 <= e < E:
                continue
            g1 = w13[e] @ x[t]
            out[t] += float(weights[t, j]) * (w2[e] @ (act(g1[:I]) * g1[I:]))
    return out


def reference_route(logits, bias, cfg: MoeConfig):
    """SPEC.md stage 1 for finite logits (softmax/sigmoid, groups, noaux_tc bias, renorm, scale)."""
    x = logits.double().cpu()
    p = torch.softmax(x, -1) if cfg.scoring == "softmax" else torch.sigmoid(x)
    q = p + bias.double().cpu() if cfg.topk_method == "noaux_tc" else p.clone()
    if cfg.num_expert_group > 1:
        groups = q.view(q.shape[0], cfg.num_expert_group, -1)
        score = groups.topk(2, -1).values.sum(-1) if cfg.topk_method == "noaux_tc" else groups.max(-1).values
        keep = torch.zeros_like(score, dtype=torch.bool).scatter_(1, score.topk(cfg.topk_group, -1).indices, True)
        q = q.masked_fill(~keep.repeat_interleave(groups.shape[-1], 1), float("-inf"))
    ids = q.topk(cfg.topk, -1).indices
    w = p.gather(1, ids)
    if cfg.renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w * cfg.routed_scaling_factor, ids


# --- registration and library location -------------------------------------------------------------

def test_all_ops_registered():
    for op in OPS:
        assert hasattr(torch.ops.moejit, op), op
    assert moejit.library_path() is None or moejit.library_path().is_file()


def test_library_candidates_in_order():
    paths = moejit._ops.candidate_paths()
    assert paths[0].parts[-3:] == ("moejit", "lib", "libmoejit_torch.so")
    assert paths[1].parts[-4:] == ("build", "backends", "torch", "libmoejit_torch.so")


def test_missing_library_lists_where_it_looked(tmp_path):
    paths = [tmp_path / "a" / "libmoejit_torch.so", tmp_path / "b" / "libmoejit_torch.so"]
    with pytest.raises(ImportError) as info:
        moejit._ops.find_library(paths)
    for p in paths:
        assert str(p) in str(info.value)


# --- opcheck and Meta ------------------------------------------------------------------------------

def _op_args(cfg, device):
    t = random_inputs(cfg, device=device)
    bias = t["bias"] if cfg.topk_method == "noaux_tc" else None
    weights, ids = torch.ops.moejit.route(t["logits"], bias, cfg.to_json())
    j = cfg.to_json()
    return {
        "moe_layer": (t["hidden"], t["logits"], t["w13"], t["w2"], bias, None, None, None, None, None, j),
        "route": (t["logits"], bias, j),
        "experts": (t["hidden"], ids, weights, t["w13"], t["w2"], None, None, None, None, None, j),
    }


@pytest.mark.parametrize("op", ["moe_layer", "route", "experts"])
@pytest.mark.parametrize("routing", ["softmax", "noaux_tc"])
def test_opcheck(op, routing, device):
    kw = dict(scoring="sigmoid", topk_method="noaux_tc", num_expert_group=4, topk_group=2) if routing == "noaux_tc" else {}
    cfg = small_config(**kw)
    args = _op_args(cfg, device)[op]
    torch.library.opcheck(getattr(torch.ops.moejit, op).default, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_meta_shapes_and_dtypes(dtype):
    cfg = small_config(dtype=moejit.config.dtype_name(dtype), topk=3)
    j, T = cfg.to_json(), 11
    meta = dict(device="meta")
    hidden = torch.empty(T, cfg.hidden, dtype=dtype, **meta)
    logits = torch.empty(T, cfg.experts, dtype=dtype, **meta)
    w13 = torch.empty(cfg.w13_shape(), dtype=dtype, **meta)
    w2 = torch.empty(cfg.w2_shape(), dtype=dtype, **meta)
    weights, ids = torch.ops.moejit.route(logits, None, j)
    assert (weights.shape, weights.dtype, weights.device.type) == ((T, 3), torch.float32, "meta")
    assert (ids.shape, ids.dtype) == ((T, 3), torch.int32)
    out = torch.ops.moejit.experts(hidden, ids, weights, w13, w2, None, None, None, None, None, j)
    assert (out.shape, out.dtype, out.device.type) == ((T, cfg.hidden), dtype, "meta")
    out = torch.ops.moejit.moe_layer(hidden, logits, w13, w2, None, None, None, None, None, None, j)
    assert (out.shape, out.dtype, out.device.type) == ((T, cfg.hidden), dtype, "meta")


def test_fake_tensor_mode_with_symbolic_tokens():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    cfg = small_config()
    t = random_inputs(cfg)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        from torch._dynamo.source import ConstantSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
        hidden = mode.from_tensor(t["hidden"], symbolic_context=ctx, source=ConstantSource("hidden"))
        logits = mode.from_tensor(t["logits"], symbolic_context=ctx, source=ConstantSource("logits"))
        w13, w2 = mode.from_tensor(t["w13"]), mode.from_tensor(t["w2"])
        out = torch.ops.moejit.moe_layer(hidden, logits, w13, w2, None, None, None, None, None, None, cfg.to_json())
        assert out.shape[1] == cfg.hidden and out.shape[0] == hidden.shape[0] and out.dtype == hidden.dtype


# --- math ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("routing", [
    dict(),
    dict(renormalize=False),
    dict(scoring="sigmoid", topk_method="noaux_tc", num_expert_group=4, topk_group=2, routed_scaling_factor=2.5),
    dict(topk_method="group_limited_greedy", num_expert_group=2, topk_group=1),
])
def test_route_matches_reference(routing, device):
    cfg = small_config(topk=3, **routing)
    t = random_inputs(cfg, tokens=16, device=device)
    weights, ids = torch.ops.moejit.route(t["logits"], t["bias"] if cfg.topk_method == "noaux_tc" else None,
                                          cfg.to_json())
    ref_w, ref_ids = reference_route(t["logits"], t["bias"], cfg)
    assert torch.equal(ids.cpu().long(), ref_ids)
    assert rel_error(weights.cpu(), ref_w) < 1e-6


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_experts_and_layer_match_reference(activation, dtype, device):
    cfg = small_config(activation=activation, dtype=moejit.config.dtype_name(dtype))
    t = random_inputs(cfg, tokens=9, device=device)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(t["logits"], None, j)
    out = torch.ops.moejit.experts(t["hidden"], ids, weights, t["w13"], t["w2"], None, None, None, None, None, j)
    ref = reference_experts(t["hidden"], ids, weights, t["w13"], t["w2"], activation)
    assert out.dtype == dtype and out.shape == t["hidden"].shape
    assert rel_error(out.cpu(), ref) < TOLERANCE[dtype]
    layer = torch.ops.moejit.moe_layer(t["hidden"], t["logits"], t["w13"], t["w2"], None, None, None, None, None,
                                       None, j)
    if device == "cpu":
        assert torch.equal(layer, out)  # the layer is routing then experts
    else:  # the fused layer may tile differently from the separate stages
        assert rel_error(layer, out) < TOLERANCE[dtype]
    residual = torch.randn_like(t["hidden"])
    with_residual = torch.ops.moejit.experts(t["hidden"], ids, weights, t["w13"], t["w2"], None, None, None, None,
                                             residual, j)
    assert rel_error(with_residual.cpu(), ref + residual.double().cpu()) < TOLERANCE[dtype]


def test_ids_outside_range_contribute_nothing(device):
    cfg = small_config()
    t = random_inputs(cfg, tokens=6, device=device)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(t["logits"], None, j)
    sentinel_ids = ids.clone()
    sentinel_ids[::2, 1] = cfg.experts  # HF's expert-parallel sentinel
    sentinel_ids[1::3, 0] = -1
    out = torch.ops.moejit.experts(t["hidden"], sentinel_ids, weights, t["w13"], t["w2"], None, None, None, None,
                                   None, j)
    ref = reference_experts(t["hidden"], sentinel_ids.cpu(), weights.cpu(), t["w13"], t["w2"])
    assert rel_error(out.cpu(), ref) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_experts_with_more_slots_than_experts(ids_dtype, device):
    """A rank holding one expert of a top-4 model: experts-only calls take topk > experts (the other
    slots name other ranks' experts or -1); routing for such a config is refused by name."""
    cfg = small_config(experts=1, topk=4, hidden=40, moe_intermediate=24)
    j = cfg.to_json()
    t = random_inputs(cfg, tokens=7, device=device, seed=3)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(-1, 6, (7, 4), generator=g).to(ids_dtype)
    ids[0] = torch.tensor([0, 3, -1, 0])  # the local expert twice: two pairs
    ids[1] = torch.tensor([5, 2, 1, 4])   # no local pair: the token's output is 0
    ids[6] = torch.tensor([0, 0, 0, 0])
    weights = torch.rand(7, 4, generator=g)
    ids, weights = ids.to(device), weights.to(device)
    out = torch.ops.moejit.experts(t["hidden"], ids, weights, t["w13"], t["w2"], None, None, None, None, None, j)
    ref = reference_experts(t["hidden"], ids.cpu(), weights.cpu(), t["w13"], t["w2"])
    assert ref[0].abs().sum() > 0 and ref[1].abs().sum() == 0
    assert rel_error(out.cpu(), ref) < TOLERANCE[torch.float32]
    assert torch.all(out[1] == 0)
    # Tracing the experts-only call (Meta) takes the config too; routing on Meta refuses it.
    meta = torch.ops.moejit.experts(t["hidden"].to("meta"), ids.to("meta"), weights.to("meta"), t["w13"].to("meta"),
                                    t["w2"].to("meta"), None, None, None, None, None, j)
    assert meta.shape == (7, cfg.hidden) and meta.device.type == "meta"
    for dev in (device, "meta"):
        logits = torch.randn(7, 1, device=dev)
        with pytest.raises(ValueError, match=r"topk: 4 is more than experts \(1\).*experts-only calls"):
            torch.ops.moejit.route(logits, None, j)
        with pytest.raises(ValueError, match=r"topk: 4 is more than experts \(1\)"):
            torch.ops.moejit.moe_layer(t["hidden"].to(dev), logits, t["w13"].to(dev), t["w2"].to(dev), None, None,
                                       None, None, None, None, j)


@pytest.mark.parametrize("ep_rank", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_shared_experts_are_slots_of_weight_one(ep_rank, dtype, device):
    """fuse_shared_experts: the layer adds its n_shared_experts shared experts (the last experts of
    w13/w2) with weight 1 to every token, on expert-parallel rank 0 only; the same as the routed
    layer plus the shared experts' output passed as the residual."""
    cfg = small_config(experts=8, topk=3, hidden=48, moe_intermediate=40, ep_size=2, ep_rank=ep_rank,
                       n_shared_experts=2, fuse_shared_experts=True, dtype=moejit.config.dtype_name(dtype))
    assert cfg.w13_shape() == (4 + 2, 80, 48) and cfg.shared_slots == 2
    t = random_inputs(cfg, tokens=7, device=device, seed=5)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(t["logits"], None, j)
    assert ids.shape == (7, 3)  # the shared slots are implied, not routed
    out = torch.ops.moejit.experts(t["hidden"], ids, weights, t["w13"], t["w2"], None, None, None, None, None, j)
    # The routed experts alone, and the shared experts as a residual (SPEC.md's gated MLP).
    routed_cfg = dataclasses.replace(cfg, fuse_shared_experts=False)
    residual = torch.zeros_like(t["hidden"], dtype=torch.float32)
    if ep_rank == 0:
        x = t["hidden"].float()
        for s in range(2):
            g1 = x @ t["w13"][4 + s].float().t()
            residual += (torch.nn.functional.silu(g1[:, :40]) * g1[:, 40:]).to(dtype).float() @ t["w2"][4 + s].float().t()
    want = torch.ops.moejit.experts(t["hidden"], ids, weights, t["w13"][:4], t["w2"][:4], None, None, None, None,
                                    residual.to(dtype), routed_cfg.to_json())
    assert rel_error(out.cpu(), want.double().cpu()) < TOLERANCE[dtype]
    if ep_rank == 1:
        assert torch.equal(out, want)  # rank 1 computes no shared expert
    layer = torch.ops.moejit.moe_layer(t["hidden"], t["logits"], t["w13"], t["w2"], None, None, None, None, None,
                                       None, j)
    if device == "cpu":
        assert torch.equal(layer, out)
    # The weights' leading dim counts the shared experts: the routed-only shape is refused by name.
    with pytest.raises(ValueError, match="w13"):
        torch.ops.moejit.experts(t["hidden"], ids, weights, t["w13"][:4], t["w2"], None, None, None, None, None, j)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_experts_as_caller_slots_equal_the_fused_layer(dtype, device):
    """SGLang's form of fused shared experts: the caller's routing holds K + S slots, the last S naming
    experts E..E+S-1 (the shared ones, packed after the routed ones) with weight 1. An experts-only
    layer of E + S experts and top-k K + S takes it as it is, and computes what fuse_shared_experts
    computes from the K routed slots (the same pairs in the same order)."""
    E, K, S, T = 8, 3, 2, 7
    cfg = small_config(experts=E, topk=K, hidden=48, moe_intermediate=40, n_shared_experts=S,
                       fuse_shared_experts=True, dtype=moejit.config.dtype_name(dtype))
    t = random_inputs(cfg, tokens=T, device=device, seed=9)
    weights, ids = torch.ops.moejit.route(t["logits"], None, cfg.to_json())
    fused = torch.ops.moejit.experts(t["hidden"], ids, weights, t["w13"], t["w2"], None, None, None, None, None,
                                     cfg.to_json())
    slots = small_config(experts=E + S, topk=K + S, hidden=48, moe_intermediate=40,
                         dtype=moejit.config.dtype_name(dtype))
    shared_ids = torch.arange(E, E + S, dtype=ids.dtype, device=ids.device).expand(T, S)
    caller_ids = torch.cat([ids, shared_ids], dim=1).to(torch.int64)  # as torch.topk and SGLang hold them
    caller_weights = torch.cat([weights, torch.ones(T, S, dtype=weights.dtype, device=weights.device)], dim=1)
    out = torch.ops.moejit.experts(t["hidden"], caller_ids, caller_weights, t["w13"], t["w2"], None, None, None,
                                   None, None, slots.to_json())
    if device == "cpu":
        assert torch.equal(out, fused)
    else:
        assert rel_error(out.cpu(), fused.double().cpu()) < TOLERANCE[dtype]
    # Without the shared slots the two differ: the test sees the shared experts.
    routed_only = torch.ops.moejit.experts(t["hidden"], ids.to(torch.int64), weights, t["w13"][:E], t["w2"][:E], None,
                                           None, None, None, None,
                                           small_config(experts=E, topk=K, hidden=48, moe_intermediate=40,
                                                        dtype=moejit.config.dtype_name(dtype)).to_json())
    assert rel_error(routed_only.cpu(), fused.double().cpu()) > 10 * TOLERANCE[dtype]


# --- the router GEMM (router_gemm) -----------------------------------------------------------------

def random_gate(cfg: MoeConfig, device="cpu", seed=11):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(cfg.experts, cfg.hidden, generator=g) * (2 / cfg.hidden ** 0.5)).to(cfg.torch_dtype).to(device)


@pytest.mark.parametrize("router_dtype", ["fp32", None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_router_gemm_computes_the_logits(router_dtype, dtype, device):
    """router_gemm: moe_layer_gate computes logits = hidden @ gate_weight^T (fp32 sums rounded to
    router_dtype, as nn.Linear and Hugging Face's DeepSeek-V3 router compute them) and runs the
    layer on them: moe_layer on those logits gives the same output."""
    cfg = small_config(experts=16, topk=4, hidden=72, moe_intermediate=40, dtype=moejit.config.dtype_name(dtype),
                       router_dtype=router_dtype, router_gemm=True)
    t = random_inputs(cfg, tokens=9, device=device, seed=7)
    gate = random_gate(cfg, device)
    out = torch.ops.moejit.moe_layer_gate(t["hidden"], gate, t["w13"], t["w2"], None, None, None, None, None, None,
                                          cfg.to_json())
    logits = (t["hidden"].float() @ gate.float().t()).to(cfg.router_torch_dtype)
    plain = dataclasses.replace(cfg, router_gemm=False)
    want = torch.ops.moejit.moe_layer(t["hidden"], logits, t["w13"], t["w2"], None, None, None, None, None, None,
                                      plain.to_json())
    if device == "cpu":
        assert torch.equal(out, want)
    elif cfg.router_torch_dtype == torch.float32:
        # The device's sums run in another order: fp32 logits differ in their last bits, far from
        # changing a choice between these logits.
        assert rel_error(out.cpu(), want.double().cpu()) < TOLERANCE[dtype]
    else:
        # bf16 logits: the device's sum may round a logit to the other bf16 neighbour, which can flip
        # a near tie; most tokens must still match.
        close = [rel_error(out[i].cpu(), want[i].double().cpu()) < TOLERANCE[dtype] for i in range(9)]
        assert sum(close) >= 7, close
    # The logits matter: the layer on other logits differs from this output.
    other = torch.ops.moejit.moe_layer(t["hidden"], torch.flip(logits, [1]), t["w13"], t["w2"], None, None, None,
                                       None, None, None, plain.to_json())
    assert rel_error(other.cpu(), out.double().cpu()) > 10 * TOLERANCE[dtype]


def test_router_gemm_inputs_are_refused_by_name(device):
    cfg, plain = small_config(router_gemm=True), small_config()
    t = random_inputs(cfg, device=device)
    gate = random_gate(cfg, device)

    def gated(g, config):
        return torch.ops.moejit.moe_layer_gate(t["hidden"], g, t["w13"], t["w2"], None, None, None, None, None, None,
                                               config.to_json())

    with pytest.raises(ValueError, match="router_gemm true: the layer computes its router logits"):
        torch.ops.moejit.moe_layer(t["hidden"], t["logits"], t["w13"], t["w2"], None, None, None, None, None, None,
                                   cfg.to_json())
    with pytest.raises(ValueError, match="router_gemm false: the layer takes router_logits"):
        gated(gate, plain)
    with pytest.raises(ValueError, match="gate_weight"):
        gated(gate[:, :-1].contiguous(), cfg)
    with pytest.raises(ValueError, match="gate_weight"):
        gated(gate.to(torch.bfloat16), cfg)


def test_router_gemm_meta_and_layer_module():
    cfg = small_config(router_gemm=True, router_dtype="fp32", topk=3)
    meta = dict(device="meta")
    out = torch.ops.moejit.moe_layer_gate(torch.empty(11, 64, **meta), torch.empty(8, 64, **meta),
                                          torch.empty(cfg.w13_shape(), **meta), torch.empty(cfg.w2_shape(), **meta),
                                          None, None, None, None, None, None, cfg.to_json())
    assert (out.shape, out.device.type) == ((11, 64), "meta")
    with pytest.raises(ValueError, match="gate_weight"):
        torch.ops.moejit.moe_layer_gate(torch.empty(11, 64, **meta), torch.empty(8, 63, **meta),
                                        torch.empty(cfg.w13_shape(), **meta), torch.empty(cfg.w2_shape(), **meta),
                                        None, None, None, None, None, None, cfg.to_json())
    t = random_inputs(cfg)
    gate = random_gate(cfg)
    layer = MoELayer(cfg, t["w13"], t["w2"], gate_weight=gate)
    want = torch.ops.moejit.moe_layer_gate(t["hidden"], gate, t["w13"], t["w2"], None, None, None, None, None, None,
                                           cfg.to_json())
    assert torch.equal(layer(t["hidden"]), want)
    with pytest.raises(ValueError, match="router_logits given"):
        layer(t["hidden"], t["logits"])
    with pytest.raises(ValueError, match="router_gemm false"):
        MoELayer(small_config(), t["w13"], t["w2"], gate_weight=gate)


def test_fused_shared_experts_need_shared_experts():
    with pytest.raises(ValueError, match="fuse_shared_experts: true needs shared experts"):
        torch.ops.moejit.route(torch.zeros(1, 8), None, small_config(fuse_shared_experts=True).to_json())


# --- errors ----------------------------------------------------------------------------------------

def test_non_contiguous_weight_is_value_error(device):
    cfg = small_config(hidden=32, moe_intermediate=32)
    t = random_inputs(cfg, device=device)
    w2 = t["w2"].transpose(1, 2)  # [E, I, H] viewed as [E, H, I]: right shape, wrong strides
    assert w2.shape == t["w2"].shape and not w2.is_contiguous()
    with pytest.raises(ValueError, match="contiguous"):
        torch.ops.moejit.moe_layer(t["hidden"], t["logits"], t["w13"], w2, None, None, None, None, None, None,
                                   cfg.to_json())


@pytest.mark.parametrize("name", ["w13", "w2", "hidden"])
def test_wrong_shape_names_the_tensor(name, device):
    cfg = small_config()
    t = random_inputs(cfg, device=device)
    t[name] = t[name][..., :-1].contiguous()
    with pytest.raises(ValueError, match=name):
        torch.ops.moejit.moe_layer(t["hidden"], t["logits"], t["w13"], t["w2"], None, None, None, None, None, None,
                                   cfg.to_json())


def test_wrong_dtype_names_the_tensor():
    cfg = small_config()
    t = random_inputs(cfg)
    weights, ids = torch.ops.moejit.route(t["logits"], None, cfg.to_json())
    with pytest.raises(ValueError, match="topk_ids must be int32 or int64"):
        torch.ops.moejit.experts(t["hidden"], ids.short(), weights, t["w13"], t["w2"], None, None, None, None, None,
                                 cfg.to_json())
    with pytest.raises(ValueError, match="topk_weights must be float32, bfloat16 or float16"):
        torch.ops.moejit.experts(t["hidden"], ids, weights.double(), t["w13"], t["w2"], None, None, None, None, None,
                                 cfg.to_json())
    bias_cfg = small_config(scoring="sigmoid", topk_method="noaux_tc")
    with pytest.raises(ValueError, match="e_score_correction_bias must be float32, bfloat16 or float16"):
        torch.ops.moejit.route(t["logits"], t["bias"].double(), bias_cfg.to_json())


def test_routing_tensors_as_callers_have_them(device):
    """torch.topk's int64 ids, bf16 / fp16 top-k weights and correction bias (as vLLM and SGLang pass
    them) give what int32 and fp32 give, converted on the device; int64 ids far outside [0, E) still
    select nothing (they are not wrapped onto a valid id)."""
    cfg = small_config(scoring="sigmoid", topk_method="noaux_tc", num_expert_group=4, topk_group=2)
    t = random_inputs(cfg, tokens=7, device=device)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(t["logits"], t["bias"], j)
    for bias in (t["bias"].bfloat16(), t["bias"].half()):
        w2, i2 = torch.ops.moejit.route(t["logits"], bias, j)
        w_ref, i_ref = torch.ops.moejit.route(t["logits"], bias.float(), j)
        assert torch.equal(i2, i_ref) and torch.equal(w2, w_ref)
    args = (t["w13"], t["w2"], None, None, None, None, None, j)
    out = torch.ops.moejit.experts(t["hidden"], ids, weights, *args)
    assert torch.equal(torch.ops.moejit.experts(t["hidden"], ids.long(), weights, *args), out)
    for dtype in (torch.bfloat16, torch.float16):
        low = weights.to(dtype)
        assert torch.equal(torch.ops.moejit.experts(t["hidden"], ids, low, *args),
                           torch.ops.moejit.experts(t["hidden"], ids, low.float(), *args))
    far = ids.long()
    far[::2, 0] = 2**32 + 1  # wrapped to int32 this would be expert 1
    far[1::2, 0] = -(2**40)
    dropped = ids.clone()
    dropped[:, 0] = -1
    assert torch.equal(torch.ops.moejit.experts(t["hidden"], far, weights, *args),
                       torch.ops.moejit.experts(t["hidden"], dropped, weights, *args))


def test_noaux_tc_needs_the_bias():
    cfg = small_config(scoring="sigmoid", topk_method="noaux_tc")
    t = random_inputs(cfg)
    with pytest.raises(ValueError, match="e_score_correction_bias"):
        torch.ops.moejit.route(t["logits"], None, cfg.to_json())


def test_invalid_config_names_the_field():
    with pytest.raises(ValueError, match="topk"):
        moejit.compile(small_config(topk=40), "cpu")
    with pytest.raises(ValueError, match="activation"):
        moejit.compile(small_config(activation="relu"), "cpu")
    with pytest.raises(ValueError, match="JSON"):
        moejit.compile("{not json", "cpu")


def test_unsupported_hf_activation_is_not_implemented():
    with pytest.raises(NotImplementedError, match="relu"):
        moejit.config.activation_from_hf("relu")
    assert moejit.config.activation_from_hf("swish") == "silu"
    assert moejit.config.activation_from_hf("gelu_new") == "gelu_tanh"


def test_hf_activation_table_is_the_op_librarys():
    """compiler/hf_config.cpp holds the one hidden_act table; Python reads it through the op."""
    table = json.loads(torch.ops.moejit.hf_activations())
    assert table and set(table.values()) <= {"silu", "gelu", "gelu_tanh"}
    assert moejit.config.hf_activations() == table
    for name, activation in table.items():
        assert moejit.config.activation_from_hf(name) == activation, name
    # The mapping itself, pinned here too, so a change to the table is a visible change.
    assert table == {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                     "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}


@pytest.mark.parametrize("hidden_act", ["relu", "SiLU", "", None, 3])
def test_unknown_hf_activation_names_the_supported_ones(hidden_act):
    with pytest.raises(NotImplementedError) as info:
        moejit.config.activation_from_hf(hidden_act)
    message = str(info.value)
    assert repr(hidden_act) in message
    supported = message.split("supported: ")[-1]
    assert supported == ", ".join(sorted(json.loads(torch.ops.moejit.hf_activations())))


# --- MoeConfig, compile, MoELayer ------------------------------------------------------------------

def test_config_json_round_trip():
    cfg = small_config(scoring="sigmoid", topk_method="noaux_tc", num_expert_group=4, topk_group=2,
                       routed_scaling_factor=2.5, router_dtype="fp32")
    d = json.loads(cfg.to_json())
    assert d["experts"] == 8 and d["routed_scaling_factor"] == 2.5 and d["renormalize"] is True
    assert MoeConfig.from_json(cfg.to_json()) == cfg
    assert "router_dtype" not in json.loads(MoeConfig().to_json())  # tied to dtype, as in C++
    assert MoeConfig(dtype=torch.float16).dtype == "fp16"
    with pytest.raises(ValueError, match="unknown"):
        MoeConfig.from_json('{"expert": 8}')


def test_default_config_is_valid_in_the_library():
    assert moejit.compile(MoeConfig(), "cpu") == {"device": "cpu", "kernels": 0}
    assert moejit.compile([small_config(), small_config(topk=4)], "cpu") == [{"device": "cpu", "kernels": 0}] * 2


def test_moe_layer_module(device):
    cfg = small_config(scoring="sigmoid", topk_method="noaux_tc", num_expert_group=2, topk_group=1,
                       routed_scaling_factor=2.5)
    t = random_inputs(cfg, device=device)
    layer = MoELayer(cfg, t["w13"], t["w2"], e_score_correction_bias=t["bias"])
    residual = torch.randn_like(t["hidden"])
    out = layer(t["hidden"], t["logits"], residual)
    weights, ids = layer.route(t["logits"])
    ref_w, ref_ids = reference_route(t["logits"], t["bias"], cfg)
    assert torch.equal(ids.cpu().long(), ref_ids)
    ref = reference_experts(t["hidden"], ids.cpu(), weights.cpu(), t["w13"], t["w2"]) + residual.double().cpu()
    assert rel_error(out.cpu(), ref) < TOLERANCE[torch.float32]
    assert not layer.w13.requires_grad
    assert layer.precompile()["device"] == ("cpu" if device == "cpu" else f"cuda:{torch.cuda.current_device()}")


def test_moe_layer_allocates_its_tensors():
    layer = MoELayer(small_config(dtype="bf16", quant="w8a8_int8"))
    assert layer.w13.dtype == torch.int8 and layer.w13.shape == (8, 64, 64)
    assert layer.w2.shape == (8, 64, 32)
    assert layer.w13_scale.shape == (8, 64) and layer.act_smooth.shape == (8, 32)
    assert layer.input_smooth.shape == (8, 64) and layer.w2_scale.shape == (8, 64)
    assert layer.e_score_correction_bias is None
    kn = MoELayer(small_config(weight_layout="kn", ep_size=2, ep_rank=1, tp_size=2))
    assert kn.w13.shape == (4, 64, 32) and kn.w2.shape == (4, 16, 64)


def test_set_log_level():
    import logging

    moejit.set_log_level("info")
    assert logging.getLogger("moejit").level == logging.INFO
    moejit.set_log_level("off")
    assert logging.getLogger("moejit").level == logging.WARNING
    with pytest.raises(ValueError, match="allowed"):
        moejit.set_log_level("loud")


def test_moe_layer_w8a8(device):
    """int8 weights with per-channel scales and smooths: against SPEC.md's w8a8 math done in float64
    without the activations' int8 rounding (SPEC's w8a8 tolerance 5e-2 covers that rounding)."""
    cfg = small_config(dtype="bf16", quant="w8a8_int8")
    g = torch.Generator().manual_seed(3)
    E, H, I = cfg.experts, cfg.hidden, cfg.moe_intermediate
    w13 = torch.randint(-127, 128, (E, 2 * I, H), generator=g, dtype=torch.int8)
    w2 = torch.randint(-127, 128, (E, H, I), generator=g, dtype=torch.int8)
    w13_scale, w2_scale = torch.rand(E, 2 * I, generator=g) / 1000, torch.rand(E, H, generator=g) / 1000
    input_smooth, act_smooth = 0.5 + torch.rand(E, H, generator=g), 0.5 + torch.rand(E, I, generator=g)
    layer = MoELayer(cfg, w13.to(device), w2.to(device), w13_scale=w13_scale.to(device),
                     w2_scale=w2_scale.to(device), input_smooth=input_smooth.to(device),
                     act_smooth=act_smooth.to(device))
    hidden = torch.randn(7, H, generator=g).to(torch.bfloat16).to(device)
    logits = torch.randn(7, E, generator=g).to(torch.bfloat16).to(device)
    out = layer(hidden, logits)
    weights, ids = layer.route(logits)
    ref = torch.zeros(7, H, dtype=torch.float64)
    x = hidden.double().cpu()
    for t in range(7):
        for j in range(cfg.topk):
            e = int(ids[t, j])
            g1 = (w13[e].double() * w13_scale[e, :, None].double()) @ (x[t] * input_smooth[e].double())
            a = (torch.nn.functional.silu(g1[:I]) * g1[I:]) * act_smooth[e].double()
            ref[t] += float(weights[t, j]) * ((w2[e].double() * w2_scale[e, :, None].double()) @ a)
    assert out.dtype == torch.bfloat16
    assert rel_error(out.cpu(), ref) < 5e-2
