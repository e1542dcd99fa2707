"""fp8 experts (SPEC.md "Quantized experts": fp8_block, fp8_tensor) through the ops: the math against
a float64 reference written here, argument errors, the Meta kernels and MoELayer.

The reference quantizes the activations with SPEC.md's rule (per row and 128-column group, or per
row: s = max(amax, 1e-10) / 448 in fp32, q = e4m3(x / s) rounding to nearest even and saturating),
dequantizes both operands and multiplies in float64; so only accumulation order, the fp32 epilogue
and the rounding of Y to the model dtype differ from the op (SPEC's fp8 tolerance, 2e-2).
"""

import pytest
import torch

import moejit
from moejit import MoeConfig, MoELayer

from conftest import rel_error

FP8_TOLERANCE = 2e-2
E4M3_MAX = 448.0
BLOCK = 128


def fp8_config(quant="fp8_block", **kw):
    base = dict(experts=4, topk=2, hidden=200, moe_intermediate=72, dtype="bf16", quant=quant)
    base.update(kw)
    return MoeConfig(**base)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rounded to e4m3 as SPEC.md rounds (nearest even, saturating to +-448), as fp32.
    torch's conversion rounds to nearest even but overflows to NaN, hence the clamp."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def quantize_reference(x: torch.Tensor, group: int):
    """SPEC.md's activation quantization of x [rows, cols] in fp32 -> (dequantized float64 values,
    scales [rows, groups] fp32)."""
    x = x.to(torch.float32)
    rows, cols = x.shape
    groups = -(-cols // group)
    deq = torch.empty(rows, cols, dtype=torch.float64)
    scales = torch.empty(rows, groups, dtype=torch.float32)
    for g in range(groups):
        part = x[:, g * group:(g + 1) * group]
        s = part.abs().amax(1, keepdim=True).clamp_min(1e-10) / E4M3_MAX  # fp32, as the spec says
        scales[:, g] = s[:, 0]
        deq[:, g * group:(g + 1) * group] = e4m3(part / s).double() * s.double()
    return deq, scales


def dequantize_weight(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """W[n][k] = w[n][k] * scale[n / 128][k / 128] (a block scale) or * scale (a per-tensor one), float64."""
    w = w.to(torch.float64)
    if scale.dim() == 0:
        return w * scale.double()
    n, k = w.shape
    full = scale.double().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:n, :k]
    return w * full


def reference_fp8_experts(cfg: MoeConfig, hidden, ids, weights, w13, w2, w13_scale, w2_scale):
    """SPEC.md stages 2-6 for fp8 in float64 (layout nk, the config's activation, gated or not); ids
    outside the local experts contribute 0."""
    I, H = cfg.local_intermediate, cfg.hidden
    act_fn = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
              "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[cfg.activation]
    x = hidden.cpu().to(torch.float32)
    ids, weights = ids.cpu(), weights.cpu()
    first = cfg.ep_rank * cfg.local_experts
    group_h = BLOCK if cfg.quant == "fp8_block" else H
    group_i = BLOCK if cfg.quant == "fp8_block" else I
    a, _ = quantize_reference(x, group_h)
    out = torch.zeros(x.shape[0], H, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - first
            if not 0 <= e < cfg.local_experts:
                continue
            g1 = dequantize_weight(w13[e].cpu(), w13_scale[e].cpu()) @ a[t]
            act = act_fn(g1[:I]) * g1[I:] if cfg.gated else act_fn(g1)
            act_q, _ = quantize_reference(act.to(torch.float32)[None], group_i)
            y = dequantize_weight(w2[e].cpu(), w2_scale[e].cpu()) @ act_q[0]
            out[t] += float(weights[t, j]) * y
    return out


def fp8_weights(cfg: MoeConfig, seed=0):
    """Random e4m3 weights and fp32 scales of the config's shapes: the weights fill e4m3's range the
    way a checkpoint's do (values up to ~448 times a small scale)."""
    g = torch.Generator().manual_seed(seed)
    shapes = cfg.quant_tensor_shapes()
    w13 = e4m3(torch.randn(cfg.w13_shape(), generator=g) * 100).to(torch.float8_e4m3fn)
    w2 = e4m3(torch.randn(cfg.w2_shape(), generator=g) * 100).to(torch.float8_e4m3fn)
    w13_scale = (0.5 + torch.rand(shapes["w13_scale"], generator=g)) * 1e-3
    w2_scale = (0.5 + torch.rand(shapes["w2_scale"], generator=g)) * 1e-3
    return dict(w13=w13, w2=w2, w13_scale=w13_scale, w2_scale=w2_scale)


def inputs(cfg: MoeConfig, tokens, seed=1):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(tokens, cfg.hidden, generator=g) * 2).to(cfg.torch_dtype)
    logits = torch.randn(tokens, cfg.experts, generator=g).to(cfg.router_torch_dtype)
    return hidden, logits


def to(device, *tensors):
    return [t.to(device) for t in tensors]


# --- math ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
@pytest.mark.parametrize("sizes", [dict(hidden=200, moe_intermediate=72),  # partial blocks in H and I
                                   dict(hidden=256, moe_intermediate=128),  # whole blocks
                                   dict(hidden=384, moe_intermediate=200, experts=8, topk=3)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fp8_experts_match_reference(quant, sizes, dtype, device):
    cfg = fp8_config(quant, dtype=dtype, **sizes)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=13)
    j = cfg.to_json()
    hidden, logits = to(device, hidden, logits)
    w13, w2, w13_scale, w2_scale = to(device, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
    weights, ids = torch.ops.moejit.route(logits, None, j)
    out = torch.ops.moejit.experts(hidden, ids, weights, w13, w2, w13_scale, w2_scale, None, None, None, j)
    ref = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
    assert out.dtype == cfg.torch_dtype and out.shape == hidden.shape and out.device == hidden.device
    assert rel_error(out.cpu(), ref) < FP8_TOLERANCE
    layer = torch.ops.moejit.moe_layer(hidden, logits, w13, w2, None, w13_scale, w2_scale, None, None, None, j)
    if device == "cpu":
        assert torch.equal(layer, out)  # the layer is routing then experts
    else:
        assert rel_error(layer.cpu(), ref) < FP8_TOLERANCE
    residual = torch.randn_like(hidden)
    with_residual = torch.ops.moejit.experts(hidden, ids, weights, w13, w2, w13_scale, w2_scale, None, None,
                                             residual, j)
    assert rel_error(with_residual.cpu(), ref + residual.double().cpu()) < FP8_TOLERANCE


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
@pytest.mark.parametrize("activation,gated", [("gelu", True), ("gelu_tanh", False), ("silu", False)])
def test_fp8_activations_and_ungated(quant, activation, gated):
    cfg = fp8_config(quant, activation=activation, gated=gated, hidden=264, moe_intermediate=136)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=10)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(logits, None, j)
    out = torch.ops.moejit.experts(hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None,
                                   None, None, j)
    ref = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
    assert rel_error(out, ref) < FP8_TOLERANCE


def test_fp8_reference_sees_the_activation_quantization():
    """The check above is only as good as the reference: unquantized activations (the same dequantized
    weights) differ from it by clearly more than the op does, so the op quantizes activations."""
    cfg = fp8_config("fp8_block")
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=32)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(logits, None, j)
    out = torch.ops.moejit.experts(hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None,
                                   None, None, j)
    ref = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
    I = cfg.local_intermediate
    plain = torch.zeros_like(ref)
    for t in range(hidden.shape[0]):
        for k in range(cfg.topk):
            e = int(ids[t, k])
            g1 = dequantize_weight(w["w13"][e], w["w13_scale"][e]) @ hidden[t].double()
            act = torch.nn.functional.silu(g1[:I]) * g1[I:]
            plain[t] += float(weights[t, k]) * (dequantize_weight(w["w2"][e], w["w2_scale"][e]) @ act)
    err_op, err_plain = rel_error(out, ref), rel_error(plain, ref)
    assert err_plain > 1e-2 and err_op < err_plain / 2, (err_op, err_plain)


def test_fp8_block_scales_apply_per_block():
    """A scale block that differs from its neighbours (in N and in K of both GEMMs) moves the output as
    the reference says: a transposed or shifted block index would not match."""
    cfg = fp8_config("fp8_block", hidden=300, moe_intermediate=136)
    w = fp8_weights(cfg, seed=5)
    g = torch.Generator().manual_seed(9)
    w["w13_scale"] = torch.rand(w["w13_scale"].shape, generator=g) * 4e-3
    w["w2_scale"] = torch.rand(w["w2_scale"].shape, generator=g) * 4e-3
    hidden, logits = inputs(cfg, tokens=9)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(logits, None, j)
    out = torch.ops.moejit.experts(hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None,
                                   None, None, j)
    ref = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
    assert rel_error(out, ref) < FP8_TOLERANCE
    # The tolerance tells the blocks apart: w13_scale [4, 3, 3] transposed and w2_scale's H blocks
    # reversed (shapes the checks cannot catch) give far larger errors.
    assert w["w13_scale"].shape == (4, 3, 3)
    transposed = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"].transpose(1, 2),
                                       w["w2_scale"])
    flipped = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"],
                                    w["w2_scale"].flip(1))
    assert rel_error(transposed, ref) > 5 * FP8_TOLERANCE and rel_error(flipped, ref) > 5 * FP8_TOLERANCE


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
@pytest.mark.parametrize("tokens", [0, 1])
def test_fp8_zero_and_one_token(quant, tokens, device):
    cfg = fp8_config(quant)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=tokens)
    j = cfg.to_json()
    args = to(device, hidden, logits, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
    out = torch.ops.moejit.moe_layer(*args[:4], None, *args[4:], None, None, None, j)
    assert out.shape == (tokens, cfg.hidden) and out.dtype == torch.bfloat16
    if tokens:
        weights, ids = torch.ops.moejit.route(args[1], None, j)
        ref = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
        assert rel_error(out.cpu(), ref) < FP8_TOLERANCE


def test_fp8_expert_parallel_rank_computes_its_experts_only():
    cfg = fp8_config("fp8_block", experts=8, ep_size=2, ep_rank=1)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=11)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(logits, None, j)
    out = torch.ops.moejit.experts(hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None,
                                   None, None, j)
    ref = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
    assert ref.abs().sum() > 0 and (ids < 4).any()  # some pairs belong to the other rank
    assert rel_error(out, ref) < FP8_TOLERANCE


def test_fp8_zero_rows_and_a_dominant_column():
    """An all-zero row has the 1e-10 floor as its scale and gives exactly 0, not NaN; a row with one
    huge column (per-row scale) quantizes the rest to e4m3's small and subnormal values."""
    cfg = fp8_config("fp8_tensor", hidden=128, moe_intermediate=64)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=4)
    hidden[1] = 0
    hidden[2, 5] = 1e4  # one huge column: the rest of the row quantizes to tiny or zero values
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(logits, None, j)
    out = torch.ops.moejit.experts(hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None,
                                   None, None, j)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    ref = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
    assert rel_error(out, ref) < FP8_TOLERANCE


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
def test_fp8_non_finite_row_leaves_other_rows(quant):
    """SPEC.md: a NaN or inf in one row may make that row non-finite; no other row changes."""
    cfg = fp8_config(quant)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=6)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(logits, None, j)
    args = (w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None, None, None, j)
    clean = torch.ops.moejit.experts(hidden, ids, weights, *args)
    bad = hidden.clone()
    bad[2, 7] = float("nan")
    bad[4, 150] = float("inf")
    out = torch.ops.moejit.experts(bad, ids, weights, *args)
    others = [0, 1, 3, 5]
    assert torch.equal(out[others], clean[others])


# --- argument errors -------------------------------------------------------------------------------

def _layer_args(cfg, **replace):
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=3)
    args = dict(hidden=hidden, router_logits=logits, w13=w["w13"], w2=w["w2"], e_score_correction_bias=None,
                w13_scale=w["w13_scale"], w2_scale=w["w2_scale"], input_smooth=None, act_smooth=None, residual=None)
    args.update(replace)
    return list(args.values()) + [cfg.to_json()]


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
@pytest.mark.parametrize("name", ["w13", "w2"])
@pytest.mark.parametrize("wrong", [torch.bfloat16, torch.int8, torch.float8_e5m2])
def test_fp8_weight_dtype_names_the_tensor(quant, name, wrong):
    cfg = fp8_config(quant)
    shape = cfg.w13_shape() if name == "w13" else cfg.w2_shape()
    with pytest.raises(ValueError, match=rf"{name} must be Float8_e4m3fn"):
        torch.ops.moejit.moe_layer(*_layer_args(cfg, **{name: torch.zeros(shape).to(wrong)}))


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
@pytest.mark.parametrize("name", ["w13_scale", "w2_scale"])
def test_fp8_scale_shape_dtype_and_presence(quant, name):
    cfg = fp8_config(quant)
    good = cfg.quant_tensor_shapes()[name]
    shape = rf"{name} must have shape \[{', '.join(str(d) for d in good)}\]"
    # A per-channel (w8a8) shape, a block count off by one, and a missing dimension.
    wrong_shapes = [(cfg.local_experts, cfg.hidden), good[:-1] + (good[-1] + 1,)] if len(good) > 1 else \
        [(cfg.local_experts, 1), (cfg.local_experts + 1,)]
    for wrong in wrong_shapes:
        with pytest.raises(ValueError, match=shape):
            torch.ops.moejit.moe_layer(*_layer_args(cfg, **{name: torch.ones(wrong)}))
    with pytest.raises(ValueError, match=rf"{name} must be Float, got BFloat16"):
        torch.ops.moejit.moe_layer(*_layer_args(cfg, **{name: torch.ones(good, dtype=torch.bfloat16)}))
    with pytest.raises(ValueError, match=rf"{name} is required for quant {quant}"):
        torch.ops.moejit.moe_layer(*_layer_args(cfg, **{name: None}))


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
@pytest.mark.parametrize("name", ["input_smooth", "act_smooth"])
def test_fp8_refuses_smooth_tensors(quant, name):
    cfg = fp8_config(quant)
    smooth = torch.ones((cfg.experts, cfg.hidden) if name == "input_smooth" else
                        (cfg.local_experts, cfg.local_intermediate))
    message = rf"{name} must not be given for quant {quant}: .*without smoothing"
    with pytest.raises(ValueError, match=message):
        torch.ops.moejit.moe_layer(*_layer_args(cfg, **{name: smooth}))
    args = _layer_args(cfg, **{name: smooth})
    hidden, logits = args[0], args[1]
    weights, ids = torch.ops.moejit.route(logits, None, cfg.to_json())
    with pytest.raises(ValueError, match=message):  # experts checks the same way
        torch.ops.moejit.experts(hidden, ids, weights, *args[2:4], *args[5:])
    with pytest.raises(ValueError, match=message):  # and MoELayer, when it is built
        MoELayer(cfg, **{name: smooth})


def test_fp8_config_refuses_fp32_and_kn():
    with pytest.raises(ValueError, match="quant: fp8_block needs dtype bf16 or fp16"):
        moejit.compile(fp8_config("fp8_block", dtype="fp32"), "cpu")
    with pytest.raises(ValueError, match="weight_layout: kn is not allowed with quant fp8_tensor"):
        moejit.compile(fp8_config("fp8_tensor", weight_layout="kn"), "cpu")


# --- Meta kernels and MoELayer ---------------------------------------------------------------------

@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
def test_fp8_meta_shapes(quant):
    cfg = fp8_config(quant)
    j, T = cfg.to_json(), 7
    meta = dict(device="meta")
    shapes = cfg.quant_tensor_shapes()
    hidden = torch.empty(T, cfg.hidden, dtype=torch.bfloat16, **meta)
    logits = torch.empty(T, cfg.experts, dtype=torch.bfloat16, **meta)
    w13 = torch.empty(cfg.w13_shape(), dtype=torch.float8_e4m3fn, **meta)
    w2 = torch.empty(cfg.w2_shape(), dtype=torch.float8_e4m3fn, **meta)
    w13_scale = torch.empty(shapes["w13_scale"], **meta)
    w2_scale = torch.empty(shapes["w2_scale"], **meta)
    weights, ids = torch.ops.moejit.route(logits, None, j)
    out = torch.ops.moejit.experts(hidden, ids, weights, w13, w2, w13_scale, w2_scale, None, None, None, j)
    assert (out.shape, out.dtype, out.device.type) == ((T, cfg.hidden), torch.bfloat16, "meta")
    out = torch.ops.moejit.moe_layer(hidden, logits, w13, w2, None, w13_scale, w2_scale, None, None, None, j)
    assert (out.shape, out.dtype, out.device.type) == ((T, cfg.hidden), torch.bfloat16, "meta")
    # Meta checks the static shapes and dtypes as the real kernels do.
    with pytest.raises(ValueError, match="w2_scale must have shape"):
        torch.ops.moejit.moe_layer(hidden, logits, w13, w2, None, w13_scale, torch.empty(cfg.local_experts, 3, 3,
                                   **meta), None, None, None, j)
    with pytest.raises(ValueError, match="w13 must be Float8_e4m3fn"):
        torch.ops.moejit.experts(hidden, ids, weights, w13.to(torch.bfloat16), w2, w13_scale, w2_scale, None, None,
                                 None, j)


def test_fp8_fake_tensor_mode_with_symbolic_tokens():
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    cfg = fp8_config("fp8_block")
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=5)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
        hidden = mode.from_tensor(hidden, symbolic_context=ctx, source=ConstantSource("hidden"))
        logits = mode.from_tensor(logits, symbolic_context=ctx, source=ConstantSource("logits"))
        fake = {k: mode.from_tensor(v) for k, v in w.items()}
        out = torch.ops.moejit.moe_layer(hidden, logits, fake["w13"], fake["w2"], None, fake["w13_scale"],
                                         fake["w2_scale"], None, None, None, cfg.to_json())
        assert out.shape[1] == cfg.hidden and out.shape[0] == hidden.shape[0] and out.dtype == torch.bfloat16


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
def test_fp8_opcheck(quant):
    """opcheck without its schema test, whose mutation check cannot compare float8 tensors in torch
    2.11 ("mul_cpu_reduced_float" not implemented for Float8_e4m3fn); the weights' bytes are compared
    here instead."""
    cfg = fp8_config(quant)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=5)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(logits, None, j)
    before = {k: v.view(torch.uint8).clone() if v.dtype == torch.float8_e4m3fn else v.clone() for k, v in w.items()}
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.moejit.experts.default,
                          (hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None, None, None,
                           j), test_utils=utils)
    torch.library.opcheck(torch.ops.moejit.moe_layer.default,
                          (hidden, logits, w["w13"], w["w2"], None, w["w13_scale"], w["w2_scale"], None, None, None,
                           j), test_utils=utils)
    for k, v in w.items():
        assert torch.equal(v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v, before[k]), k


def test_fp8_moe_layer_allocates_its_tensors():
    block = MoELayer(fp8_config("fp8_block", hidden=200, moe_intermediate=72))
    assert block.w13.dtype == torch.float8_e4m3fn and block.w13.shape == (4, 144, 200)
    assert block.w2.dtype == torch.float8_e4m3fn and block.w2.shape == (4, 200, 72)
    assert block.w13_scale.shape == (4, 2, 2) and block.w2_scale.shape == (4, 2, 1)
    assert block.w13_scale.dtype == torch.float32 and bool((block.w13_scale == 1).all())
    assert block.input_smooth is None and block.act_smooth is None
    tensor = MoELayer(fp8_config("fp8_tensor", experts=8, ep_size=2))
    assert tensor.w13_scale.shape == (4,) and tensor.w2_scale.shape == (4,)
    assert tensor.input_smooth is None and tensor.act_smooth is None
    assert "quant=fp8_tensor" in repr(tensor)


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
def test_fp8_moe_layer_module(quant, device):
    cfg = fp8_config(quant, scoring="sigmoid", topk_method="noaux_tc", num_expert_group=2, topk_group=1,
                     routed_scaling_factor=2.5)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=8)
    bias = torch.randn(cfg.experts, generator=torch.Generator().manual_seed(2)) * 0.1
    layer = MoELayer(cfg, *to(device, w["w13"], w["w2"]), e_score_correction_bias=bias.to(device),
                     w13_scale=w["w13_scale"].to(device), w2_scale=w["w2_scale"].to(device))
    hidden_d, logits_d = to(device, hidden, logits)
    residual = torch.randn_like(hidden_d)
    out = layer(hidden_d, logits_d, residual)
    weights, ids = layer.route(logits_d)
    ref = reference_fp8_experts(cfg, hidden, ids, weights, w["w13"], w["w2"], w["w13_scale"], w["w2_scale"])
    assert out.dtype == torch.bfloat16
    assert rel_error(out.cpu(), ref + residual.double().cpu()) < FP8_TOLERANCE
    state = layer.state_dict()
    assert state["w13"].dtype == torch.float8_e4m3fn and "input_smooth" not in state


def test_fp8_quant_tensor_shapes_are_the_librarys():
    """MoeConfig.quant_tensor_shapes (which MoELayer allocates from) agrees with the op's checks: a
    layer allocated from it runs, for gated and ungated experts."""
    for quant in ("fp8_block", "fp8_tensor", "w8a8_int8"):
        for gated in (True, False):
            cfg = fp8_config(quant, gated=gated, hidden=136, moe_intermediate=264)
            hidden, logits = inputs(cfg, tokens=2)
            out = MoELayer(cfg)(hidden, logits)
            assert out.shape == hidden.shape, (quant, gated)


@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
def test_fp8_experts_on_quantized_rows_is_experts(quant):
    """quantize_hidden is the layer's stage 3 alone: experts() given its rows (hidden_scale, what expert
    parallel's fp8 dispatch sends) computes exactly what it computes from hidden, and the Meta kernels
    agree on the shapes and dtypes."""
    cfg = fp8_config(quant, hidden=256, moe_intermediate=128, experts=8, ep_size=2, ep_rank=1)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=13)
    hidden[3] = 0  # a zero row: the 1e-10 scale floor
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(logits, None, j)
    args = (w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None, None, None, j)
    q, scale = torch.ops.moejit.quantize_hidden(hidden, j)
    groups = 2 if quant == "fp8_block" else 1
    assert q.dtype == torch.float8_e4m3fn and q.shape == (13, 256)
    assert scale.dtype == torch.float32 and scale.shape == (13, groups)
    _, ref_scale = quantize_reference(hidden, BLOCK if quant == "fp8_block" else cfg.hidden)
    assert torch.equal(scale, ref_scale)
    out = torch.ops.moejit.experts(hidden, ids, weights, *args)
    given = torch.ops.moejit.experts(q, ids, weights, *args, hidden_scale=scale)
    assert given.dtype == torch.bfloat16 and torch.equal(given, out)
    layer = MoELayer(cfg, w["w13"], w["w2"], w13_scale=w["w13_scale"], w2_scale=w["w2_scale"])
    again_q, again_scale = layer.quantize_hidden(hidden)
    assert torch.equal(again_q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(again_scale, scale)
    assert torch.equal(layer.experts_only(q, ids, weights, hidden_scale=scale), out)
    meta = torch.ops.moejit.experts(q.to("meta"), ids.to("meta"), weights.to("meta"),
                                    *[t.to("meta") if isinstance(t, torch.Tensor) else t for t in args],
                                    hidden_scale=scale.to("meta"))
    assert meta.shape == (13, 256) and meta.dtype == torch.bfloat16
    mq, ms = torch.ops.moejit.quantize_hidden(hidden.to("meta"), j)
    assert mq.dtype == torch.float8_e4m3fn and mq.shape == q.shape and ms.shape == scale.shape


def test_fp8_quantized_rows_are_refused_where_they_do_not_belong():
    cfg = fp8_config("fp8_block", hidden=256, moe_intermediate=128)
    w = fp8_weights(cfg)
    hidden, logits = inputs(cfg, tokens=5)
    j = cfg.to_json()
    weights, ids = torch.ops.moejit.route(logits, None, j)
    args = (w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None, None, None, j)
    q, scale = torch.ops.moejit.quantize_hidden(hidden, j)
    with pytest.raises(ValueError, match=r"hidden_scale must have shape \[5, 2\]"):
        torch.ops.moejit.experts(q, ids, weights, *args, hidden_scale=scale[:, :1])
    with pytest.raises(ValueError, match=r"hidden \(quantized rows, with hidden_scale\) must be .*Float8_e4m3fn"):
        torch.ops.moejit.experts(hidden, ids, weights, *args, hidden_scale=scale)
    plain = MoeConfig(experts=4, topk=2, hidden=256, moe_intermediate=128, dtype="bf16")
    w13 = torch.randn(plain.w13_shape()).to(torch.bfloat16)
    w2 = torch.randn(plain.w2_shape()).to(torch.bfloat16)
    with pytest.raises(ValueError, match="only fp8 layers take quantized hidden rows"):
        torch.ops.moejit.experts(q, ids, weights, w13, w2, None, None, None, None, None, plain.to_json(),
                                 hidden_scale=scale)
    with pytest.raises(ValueError, match="quantize_hidden is an fp8 layer's stage 3"):
        torch.ops.moejit.quantize_hidden(hidden, plain.to_json())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("quant", ["fp8_block", "fp8_tensor"])
def test_fp8_quantized_rows_on_cuda_are_the_layers_own(quant):
    """On the GPU: quantize_hidden (ATen on the device) gives the CPU kernel's bytes and scales, and
    the JIT's experts() given them equals its experts() on hidden bit for bit (its own stage 3 makes
    the same rows)."""
    cfg = fp8_config(quant, hidden=256, moe_intermediate=128, experts=8)
    w = {k: t.cuda() for k, t in fp8_weights(cfg).items()}
    hidden, logits = inputs(cfg, tokens=37)
    hidden[5] = 0
    j = cfg.to_json()
    q_cpu, scale_cpu = torch.ops.moejit.quantize_hidden(hidden, j)
    hidden, logits = hidden.cuda(), logits.cuda()
    q, scale = torch.ops.moejit.quantize_hidden(hidden, j)
    assert torch.equal(q.cpu().view(torch.uint8), q_cpu.view(torch.uint8)) and torch.equal(scale.cpu(), scale_cpu)
    weights, ids = torch.ops.moejit.route(logits, None, j)
    args = (w["w13"], w["w2"], w["w13_scale"], w["w2_scale"], None, None, None, j)
    out = torch.ops.moejit.experts(hidden, ids, weights, *args)
    assert torch.equal(torch.ops.moejit.experts(q, ids, weights, *args, hidden_scale=scale), out)
