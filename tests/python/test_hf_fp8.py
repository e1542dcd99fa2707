"""The "moejit" FP8 experts implementation (moejit.hf_fp8) on tiny random fine-grained FP8 Hugging Face
models (DeepSeek-V3, Qwen3-MoE), on CPU.

The models are built without any download: a config with quantization_config {"quant_method": "fp8",
"weight_block_size": [128, 128], "activation_scheme": "dynamic"}, transformers' replace_with_fp8_linear
(what from_pretrained does for such a checkpoint), then random e4m3 weights and fp32 scales spanning a
few decades written into every FP8Linear / FP8Experts.

transformers' own FP8 kernels cannot run here: they are Triton (CUDA/XPU) builds that transformers
downloads from the Hugging Face Hub (kernels-community/finegrained-fp8, deep-gemm) at the first call.
So the comparison with transformers' FP8 path installs a pure-torch stand-in for them
(transformers.integrations.finegrained_fp8._FINEGRAINED_FP8, which short-circuits the download),
written below with the Triton kernels' math: per row and 128-column group s = amax / 448,
q = e4m3(x / max(s, 1e-12)) saturating, fp32 products of the dequantized operands, output rounded to
the activation dtype. transformers' experts functions (grouped_mm, eager) and every FP8Linear of the
model then run on it, and only the experts differ between the two runs.

The experts module is also checked against a float64 reference of SPEC.md's fp8 math written here
(activations quantized per row and 128 columns, or per row for per-tensor scales, with
s = max(amax, 1e-10) / 448; weights dequantized with their *_scale_inv; float64 products), within
SPEC's fp8 tolerance (2e-2 relative Frobenius).
"""

import pytest
import torch

import moejit

from conftest import rel_error

transformers = pytest.importorskip("transformers")
hf8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
if not hasattr(hf8, "ALL_FP8_EXPERTS_FUNCTIONS"):
    pytest.skip("this transformers has no FP8 experts interface", allow_module_level=True)

FP8_TOLERANCE = 2e-2
E4M3_MAX = 448.0
BLOCK = 128
VOCAB = 128
QUANTIZATION_CONFIG = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
FAMILIES = {"qwen3_moe": dict(hidden=256, intermediate=256), "deepseek_v3": dict(hidden=256, intermediate=128)}
MEASURED = {}  # name -> error, printed at the end with -s (the report quotes them)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rounded to e4m3, nearest even, saturating to +-448 (torch's cast makes NaN above 464)."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


# --- the tiny FP8 models ----------------------------------------------------------------------------

def fp8_config(family, hidden=256, intermediate=256, experts=4, quantization_config=QUANTIZATION_CONFIG, **kw):
    common = dict(hidden_size=hidden, moe_intermediate_size=intermediate, intermediate_size=2 * hidden,
                  num_experts_per_tok=2, vocab_size=VOCAB, num_attention_heads=4, max_position_embeddings=64,
                  quantization_config=dict(quantization_config))
    if family == "qwen3_moe":
        cfg = dict(common, num_experts=experts, num_hidden_layers=1, num_key_value_heads=2, head_dim=64,
                   norm_topk_prob=True)
        cls = transformers.Qwen3MoeConfig
    elif family == "deepseek_v3":
        # Layer 0 dense (FP8Linear MLP), layer 1 MoE: FP8Experts + FP8Linear shared expert.
        cfg = dict(common, n_routed_experts=experts, n_group=1, topk_group=1, n_shared_experts=1,
                   num_hidden_layers=2, first_k_dense_replace=1, num_key_value_heads=4, q_lora_rank=128,
                   kv_lora_rank=128, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
                   routed_scaling_factor=2.5)
        cls = transformers.DeepseekV3Config
    else:
        raise ValueError(family)
    cfg.update(kw)
    return cls(**cfg)


def fill_fp8_module(module, gen):
    """Random e4m3 weights (up to ~+-300) and fp32 scales spanning two decades (dequantized weights
    ~ 1e-3 .. 0.3) into a fresh FP8Linear / FP8Experts."""
    module.to_empty(device="cpu")
    with torch.no_grad():
        for name, p in module.named_parameters(recurse=False):
            if p.dtype == torch.float8_e4m3fn:
                p.copy_(e4m3(torch.randn(p.shape, generator=gen) * 64))
            elif name.endswith("scale_inv"):
                p.copy_(4e-4 * 10 ** (torch.rand(p.shape, generator=gen) * 2 - 1))
            elif p.is_floating_point():  # a bias (none in these models)
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def build_fp8_model(family, seed=0, experts_implementation=None, **kw):
    """A tiny random FP8 model of the family, bf16 activations, eval mode: what from_pretrained builds
    for an FP8 checkpoint (replace_with_fp8_linear), with random contents."""
    config = fp8_config(family, **kw)
    torch.manual_seed(seed)
    extra = {} if experts_implementation is None else {"experts_implementation": experts_implementation}
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, **extra)
    qcfg = transformers.FineGrainedFP8Config.from_dict(config.quantization_config)
    hf8.replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"], quantization_config=qcfg)
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (hf8.FP8Linear, hf8.FP8Experts)):
            fill_fp8_module(module, gen)
    return model.eval()


def fp8_experts(model):
    found = [m for m in model.modules() if isinstance(m, hf8.FP8Experts)]
    assert found, "no FP8Experts in the model"
    return found[0]


# --- transformers' FP8 kernels, in pure torch (the Hub's Triton builds need CUDA) ---------------------

def _act_dequant_triton(x: torch.Tensor, group: int) -> torch.Tensor:
    """As the finegrained-fp8 Triton kernels quantize activations inline: per row and K-group
    s = amax / 448, q = e4m3(x / max(s, 1e-12)) saturating; returns q * s in fp32."""
    x = x.float()
    out = torch.empty_like(x)
    for g in range(0, x.shape[1], group):
        part = x[:, g:g + group]
        s = part.abs().amax(1, keepdim=True) / E4M3_MAX
        out[:, g:g + group] = e4m3(part / s.clamp_min(1e-12)).float() * s
    return out


def _weight_dequant(w: torch.Tensor, ws: torch.Tensor, block_size) -> torch.Tensor:
    n, k = w.shape
    if block_size is None:
        return w.float() * ws.reshape(-1)[0].float()
    bn, bk = block_size
    full = ws.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return w.float() * full


def _standin_matmul(x, w, ws, block_size, out_dtype=None, activation_scale=None):
    assert activation_scale is None, "the stand-in does dynamic activation scales only"
    k = x.shape[-1]
    group = k if block_size is None else block_size[1]
    y = _act_dequant_triton(x.reshape(-1, k), group) @ _weight_dequant(w, ws, block_size).T
    return y.to(out_dtype or x.dtype).reshape(*x.shape[:-1], w.shape[0])


def _standin_batched(x, w, ws, block_size=None, expert_ids=None):
    out = torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype)
    for e in expert_ids.unique().tolist():
        if 0 <= e < w.shape[0]:  # sentinels (>= E) are left for the caller to mask
            rows = (expert_ids == e).nonzero().flatten()
            out[rows] = _standin_matmul(x[rows], w[e], ws[e], block_size)
    return out


def _standin_grouped(x, w, ws, offsets=None, tokens_per_expert=None, block_size=None):
    out = torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            out[start:end] = _standin_matmul(x[start:end], w[e], ws[e], block_size)
        start = end
    return out


@pytest.fixture
def hf_fp8_kernels(monkeypatch):
    """transformers' FP8 path runnable on CPU: the pure-torch stand-in as the loaded kernel bundle."""
    monkeypatch.setattr(hf8, "_FINEGRAINED_FP8", hf8.FineGrainedFP8(
        matmul=_standin_matmul, batched_matmul=_standin_batched, grouped_matmul=_standin_grouped))


# --- SPEC.md's fp8 math in float64 -----------------------------------------------------------------

def quantize_reference(x: torch.Tensor, group: int) -> torch.Tensor:
    """SPEC.md: per row and `group` columns s = max(amax, 1e-10) / 448 (fp32), q = e4m3(x / s); returns
    q * s in float64."""
    x = x.to(torch.float32)
    out = torch.empty(x.shape, dtype=torch.float64)
    for g in range(0, x.shape[1], group):
        part = x[:, g:g + group]
        s = part.abs().amax(1, keepdim=True).clamp_min(1e-10) / E4M3_MAX
        out[:, g:g + group] = e4m3(part / s).double() * s.double()
    return out


def dequantize_reference(w: torch.Tensor, scale_inv: torch.Tensor, block_size, gate_up: bool) -> torch.Tensor:
    """transformers' meaning of a *_scale_inv: W[n][k] = w[n][k] * scale_inv[n / 128][k / 128] for 128x128
    blocks; per tensor, the gate_up scale rows are the gate's and the up's scales."""
    w = w.double()
    if block_size is None:
        s = scale_inv.double().reshape(-1)
        if gate_up and s.numel() == 2:
            half = w.shape[0] // 2
            return torch.cat([w[:half] * s[0], w[half:] * s[1]])
        return w * s[0]
    n, k = w.shape
    return w * scale_inv.double().repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]


@torch.no_grad()
def reference_fp8_experts(module, hidden, ids, weights) -> torch.Tensor:
    """[T, H] float64: SPEC's fp8 experts over the module's own weights and scales."""
    E, I = module.num_experts, module.intermediate_dim
    per_tensor = module.block_size is None
    group_h = hidden.shape[1] if per_tensor else BLOCK
    group_i = I if per_tensor else BLOCK
    a = quantize_reference(hidden, group_h)
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for e in range(E):
        rows, slots = (ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        w13 = dequantize_reference(module.gate_up_proj[e], module.gate_up_proj_scale_inv[e], module.block_size, True)
        w2 = dequantize_reference(module.down_proj[e], module.down_proj_scale_inv[e], module.block_size, False)
        g1 = a[rows] @ w13.T
        act = torch.nn.functional.silu(g1[:, :I]) * g1[:, I:]
        y = quantize_reference(act.to(torch.float32), group_i) @ w2.T
        out.index_add_(0, rows, y * weights[rows, slots].double()[:, None])
    return out


def routing(module, tokens, weights_dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(tokens, module.hidden_dim, generator=g) * 3).to(torch.bfloat16)
    scores = torch.rand(tokens, module.num_experts, generator=g)
    w, ids = scores.topk(2, -1)
    return hidden, ids, (w / w.sum(-1, keepdim=True)).to(weights_dtype)


def tokens(seed=2):
    return torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed))


# --- registration ----------------------------------------------------------------------------------

def test_register_adds_moejit_to_both_registries_idempotently():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    moejit.hf.register()
    keys = (sorted(ALL_EXPERTS_FUNCTIONS.keys()), sorted(hf8.ALL_FP8_EXPERTS_FUNCTIONS.keys()))
    moejit.hf.register()
    moejit.register_hf()
    assert (sorted(ALL_EXPERTS_FUNCTIONS.keys()), sorted(hf8.ALL_FP8_EXPERTS_FUNCTIONS.keys())) == keys
    assert hf8.ALL_FP8_EXPERTS_FUNCTIONS["moejit"] is moejit.hf_fp8.moejit_fp8_experts_forward
    assert ALL_EXPERTS_FUNCTIONS["moejit"] is moejit.hf.moejit_experts_forward
    assert keys[1].count("moejit") == 1


# --- math ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_logits_match_transformers_fp8_path(family, hf_fp8_kernels):
    """The whole FP8 model: moejit experts vs transformers' grouped_mm and eager FP8 experts (stand-in kernels)."""
    model = build_fp8_model(family, **FAMILIES[family])
    moejit.hf.register()
    ids = tokens()
    with torch.no_grad():
        model.set_experts_implementation("moejit")
        out = model(ids).logits
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        for impl in ("grouped_mm", "eager"):
            model.set_experts_implementation(impl)
            ref = model(ids).logits
            err = MEASURED[f"logits {family} vs transformers {impl}"] = rel_error(out, ref)
            assert err < FP8_TOLERANCE, (impl, err)


@pytest.mark.parametrize("family,hidden,intermediate", [("qwen3_moe", 256, 256), ("deepseek_v3", 256, 128),
                                                        ("qwen3_moe", 256, 192)])  # 192: a partial block
def test_experts_module_matches_float64_reference(family, hidden, intermediate):
    model = build_fp8_model(family, hidden=hidden, intermediate=intermediate)
    module = fp8_experts(model)
    # Qwen3-MoE hands the experts bf16 routing weights, DeepSeek-V3 fp32.
    hidden_states, ids, weights = routing(module, 19, torch.bfloat16 if family == "qwen3_moe" else torch.float32)
    moejit.hf.register()
    model.set_experts_implementation("moejit")
    with torch.no_grad():
        out = module(hidden_states, ids, weights)
    assert out.dtype == torch.bfloat16 and out.shape == hidden_states.shape
    ref = reference_fp8_experts(module, hidden_states, ids, weights)
    err = MEASURED[f"experts {family} H={hidden} I={intermediate} vs float64"] = rel_error(out, ref)
    assert err < FP8_TOLERANCE


def test_small_intermediate_with_equal_gate_and_up_scale_rows():
    """2I <= 128: transformers allocates 2 gate_up scale rows (gate, up) where moejit takes 1 block;
    equal rows run, different rows are refused."""
    model = build_fp8_model("qwen3_moe", hidden=256, intermediate=64)
    module = fp8_experts(model)
    assert tuple(module.gate_up_proj_scale_inv.shape) == (4, 2, 2)
    hidden_states, ids, weights = routing(module, 11, torch.bfloat16)
    moejit.hf.register()
    model.set_experts_implementation("moejit")
    with torch.no_grad():
        with pytest.raises(ValueError, match="different gate and up scales"):
            module(hidden_states, ids, weights)
        module.gate_up_proj_scale_inv[:, 1] = module.gate_up_proj_scale_inv[:, 0]
        out = module(hidden_states, ids, weights)
    err = MEASURED["experts I=64 (padded scale rows) vs float64"] = \
        rel_error(out, reference_fp8_experts(module, hidden_states, ids, weights))
    assert err < FP8_TOLERANCE


def test_per_tensor_scales_run_as_fp8_tensor():
    """weight_block_size None: one scale per expert matrix (gate_up [E, 2, 1], down [E, 1, 1]) ->
    moejit's fp8_tensor, activations quantized per row."""
    per_tensor = dict(QUANTIZATION_CONFIG, weight_block_size=None)
    model = build_fp8_model("deepseek_v3", quantization_config=per_tensor)
    module = fp8_experts(model)
    assert module.block_size is None
    assert tuple(module.gate_up_proj_scale_inv.shape) == (4, 2, 1)
    assert tuple(module.down_proj_scale_inv.shape) == (4, 1, 1)
    hidden_states, ids, weights = routing(module, 13, torch.float32)
    moejit.hf.register()
    model.set_experts_implementation("moejit")
    with torch.no_grad():
        with pytest.raises(ValueError, match="different gate and up scales"):
            module(hidden_states, ids, weights)
        module.gate_up_proj_scale_inv[:, 1] = module.gate_up_proj_scale_inv[:, 0]
        out = module(hidden_states, ids, weights)
        assert '"quant":"fp8_tensor"' in moejit.hf.module_config_json(module, 2)
    err = MEASURED["experts per-tensor vs float64"] = \
        rel_error(out, reference_fp8_experts(module, hidden_states, ids, weights))
    assert err < FP8_TOLERANCE


def test_ue8m0_scales_are_widened():
    """scale_fmt "ue8m0" stores power-of-two scales as float8_e8m0fnu: the same result as fp32 ones."""
    if not hasattr(torch, "float8_e8m0fnu"):
        pytest.skip("no float8_e8m0fnu in this torch")
    model = build_fp8_model("qwen3_moe", **FAMILIES["qwen3_moe"])
    module = fp8_experts(model)
    hidden_states, ids, weights = routing(module, 9, torch.bfloat16)
    moejit.hf.register()
    model.set_experts_implementation("moejit")
    with torch.no_grad():
        for name in ("gate_up_proj_scale_inv", "down_proj_scale_inv"):
            p = getattr(module, name)
            p.copy_(torch.exp2(torch.round(torch.log2(p))))
        fp32_out = module(hidden_states, ids, weights)
        for name in ("gate_up_proj_scale_inv", "down_proj_scale_inv"):
            setattr(module, name, torch.nn.Parameter(getattr(module, name).to(torch.float8_e8m0fnu),
                                                     requires_grad=False))
        assert torch.equal(module(hidden_states, ids, weights), fp32_out)


def test_expert_parallel_sentinels_contribute_nothing():
    model = build_fp8_model("qwen3_moe", **FAMILIES["qwen3_moe"])
    module = fp8_experts(model)
    hidden_states, ids, weights = routing(module, 8, torch.bfloat16)
    moejit.hf.register()
    model.set_experts_implementation("moejit")
    with torch.no_grad():
        dropped = weights.clone()
        dropped[::2, 1] = 0
        sentinel_ids = ids.clone()
        sentinel_ids[::2, 1] = module.num_experts
        out = module(hidden_states, sentinel_ids, dropped)
        ref = module(hidden_states, ids, dropped)
    assert torch.equal(out, ref)


# --- selecting "moejit" ----------------------------------------------------------------------------

def test_model_built_with_moejit_experts_implementation(hf_fp8_kernels):
    moejit.hf.register()
    model = build_fp8_model("qwen3_moe", experts_implementation="moejit", **FAMILIES["qwen3_moe"])
    assert model.config._experts_implementation == "moejit"
    other = build_fp8_model("qwen3_moe", **FAMILIES["qwen3_moe"])
    other.set_experts_implementation("moejit")
    calls = []
    real = moejit.hf_fp8.moejit_fp8_experts_forward
    hf8.ALL_FP8_EXPERTS_FUNCTIONS["moejit"] = lambda *a: calls.append(1) or real(*a)
    try:
        with torch.no_grad():
            out, ref = model(tokens()).logits, other(tokens()).logits
    finally:
        hf8.ALL_FP8_EXPERTS_FUNCTIONS["moejit"] = real
    assert len(calls) == 2 and torch.equal(out, ref)  # same weights (same seed), both on moejit


def test_patch_fp8_model(hf_fp8_kernels):
    model = build_fp8_model("deepseek_v3", **FAMILIES["deepseek_v3"])
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(tokens()).logits
        assert moejit.patch(model) is model
        assert model.config._experts_implementation == "moejit"
        out = model(tokens()).logits
    assert rel_error(out, ref) < FP8_TOLERANCE


def test_bf16_model_still_works_with_moejit():
    from conftest import build_model

    moejit.hf.register()
    model = build_model("qwen3_moe", dtype=torch.bfloat16)
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(tokens()).logits
        model.set_experts_implementation("moejit")
        out = model(tokens()).logits
    assert rel_error(out, ref) < 2e-2


def test_compiles_into_one_graph():
    model = build_fp8_model("qwen3_moe", **FAMILIES["qwen3_moe"])
    module = fp8_experts(model)
    hidden_states, ids, weights = routing(module, 7, torch.bfloat16)
    moejit.hf.register()
    model.set_experts_implementation("moejit")
    with torch.no_grad():
        eager = module(hidden_states, ids, weights)
        compiled = torch.compile(module, backend="eager", fullgraph=True)(hidden_states, ids, weights)
    assert torch.equal(compiled, eager)


# --- refusals --------------------------------------------------------------------------------------

def _refused(module, match, exc=ValueError):
    hidden_states, ids, weights = routing(module, 4, torch.bfloat16)
    with torch.no_grad(), pytest.raises(exc, match=match):
        moejit.hf_fp8.moejit_fp8_experts_forward(module, hidden_states, ids, weights)


@pytest.fixture
def qwen_fp8():
    """A fresh model per test: the tests below break its experts module."""
    return build_fp8_model("qwen3_moe", **FAMILIES["qwen3_moe"])


def _replace(module, name, tensor):
    setattr(module, name, torch.nn.Parameter(tensor, requires_grad=False))


@pytest.mark.parametrize("attr,value,match", [
    ("block_size", [64, 64], r"block size is \[64, 64\].*\[128, 128\]"),
    ("block_size", [128, 64], r"block size is \[128, 64\]"),
    ("activation_scheme", "static", "static activation scales"),
    ("has_bias", True, "bias"),
    ("limit", 7.0, "SwiGLU"),
    ("has_gate", False, "no gate"),
])
def test_unsupported_modules_are_refused(qwen_fp8, attr, value, match):
    module = fp8_experts(qwen_fp8)
    setattr(module, attr, value)
    _refused(module, match)
    with pytest.raises(ValueError, match=match):
        moejit.patch(qwen_fp8)


def test_unsupported_activation_is_refused():
    model = build_fp8_model("qwen3_moe", hidden_act="relu2", **FAMILIES["qwen3_moe"])
    module = fp8_experts(model)
    _refused(module, "relu2", ValueError)
    _refused(module, "relu2", NotImplementedError)  # as the bf16 function raises


@pytest.mark.parametrize("name,shape,match", [
    ("gate_up_proj_scale_inv", (4, 3, 2), r"gate_up_proj_scale_inv is \[4, 3, 2\].*\[4, 4, 2\]"),
    ("down_proj_scale_inv", (4, 2, 1), r"down_proj_scale_inv is \[4, 2, 1\].*\[4, 2, 2\]"),
])
def test_wrong_scale_shapes_are_refused(qwen_fp8, name, shape, match):
    module = fp8_experts(qwen_fp8)
    _replace(module, name, torch.ones(shape))
    _refused(module, match)


def test_fp4_weights_are_refused(qwen_fp8):
    module = fp8_experts(qwen_fp8)
    E, N, H = module.gate_up_proj.shape
    _replace(module, "gate_up_proj", torch.zeros(E, N, H // 2, dtype=torch.int8))  # expert_dtype "fp4"
    _refused(module, "FP4")


def test_e5m2_weights_are_refused(qwen_fp8):
    module = fp8_experts(qwen_fp8)
    _replace(module, "down_proj", module.down_proj.to(torch.float8_e5m2))
    _refused(module, "down_proj is torch.float8_e5m2")


def test_bf16_weights_use_the_bf16_function(qwen_fp8):
    """A checkpoint transformers dequantized at load (FP8Experts holding bf16 weights) runs as bf16,
    as transformers' eager FP8Experts loop does (F.linear for weights wider than a byte)."""
    module = fp8_experts(qwen_fp8)
    hidden_states, ids, weights = routing(module, 6, torch.bfloat16)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            w, s = getattr(module, name), getattr(module, name + "_scale_inv")
            deq = torch.stack([dequantize_reference(w[e], s[e], module.block_size, False) for e in range(len(w))])
            _replace(module, name, deq.to(torch.bfloat16))
        moejit.hf.register()
        qwen_fp8.set_experts_implementation("eager")
        ref = module(hidden_states, ids, weights)
        qwen_fp8.set_experts_implementation("moejit")
        out = module(hidden_states, ids, weights)
    assert out.dtype == torch.bfloat16 and rel_error(out, ref) < 2e-2
    assert '"quant":"none"' in moejit.hf.module_config_json(module, 2)  # what patch() precompiles


def test_fp32_hidden_is_refused_by_the_op(qwen_fp8):
    module = fp8_experts(qwen_fp8)
    hidden_states, ids, weights = routing(module, 4, torch.float32)
    with torch.no_grad(), pytest.raises(ValueError, match="bf16 or fp16"):
        moejit.hf_fp8.moejit_fp8_experts_forward(module, hidden_states.float(), ids, weights)


def test_report_measured_errors():
    """Runs last (file order): prints what the math tests measured (pytest -s shows it)."""
    for name, err in MEASURED.items():
        print(f"measured: {name}: {err:.3e}")
