"""gpt-oss's experts (biases, the clamped SwiGLU) and routing through the moejit ops, against
transformers' own GptOssExperts / GptOssMLP on random weights: the independent reference here is
Hugging Face's code, whose weights are stored [E, H, 2I] with gate and up interleaved; moejit takes
them de-interleaved (gate rows, then up rows) in either layout."""

import pytest
import torch

from moejit import MoeConfig, MoELayer

from conftest import DEVICES, TOLERANCE, rel_error

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

E, K, H, I = 6, 2, 48, 40  # I not a multiple of 16 or of a 32-column tile; the whole-layer test takes 64 / 32


def hf_modules(hidden=H, inter=I, experts=E, seed=0, dtype=torch.float32):
    config = transformers.GptOssConfig(hidden_size=hidden, intermediate_size=inter, num_local_experts=experts,
                                       num_experts_per_tok=K, num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, vocab_size=64)
    torch.manual_seed(seed)
    mlp = modeling_gpt_oss.GptOssMLP(config)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        # Large enough that some gates pass the limit (7) and some ups leave [-7, 7].
        mlp.experts.gate_up_proj.mul_(4.0)
    return config, mlp.to(dtype)


def moejit_tensors(experts, layout="nk"):
    """HF's [E, H, 2I] interleaved weights as moejit's w13 / w2 and biases."""
    gate_up = experts.gate_up_proj.detach()                       # [E, H, 2I], gate = [..., ::2]
    w13_kn = torch.cat([gate_up[..., ::2], gate_up[..., 1::2]], dim=2)  # [E, H, 2I], gate then up
    b = experts.gate_up_proj_bias.detach()
    w13_bias = torch.cat([b[..., ::2], b[..., 1::2]], dim=1)
    down = experts.down_proj.detach()                              # [E, I, H]
    if layout == "kn":
        w13, w2 = w13_kn.contiguous(), down.contiguous()
    else:
        w13, w2 = w13_kn.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
    return w13, w2, w13_bias.contiguous(), experts.down_proj_bias.detach().contiguous()


def gpt_oss_config(dtype, layout="nk", hidden=H, inter=I, experts=E, **kw):
    return MoeConfig(experts=experts, topk=K, hidden=hidden, moe_intermediate=inter, activation="swigluoai",
                     expert_bias=True, dtype=dtype, weight_layout=layout, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("tokens", [0, 1, 7])
def test_experts_match_hf_gpt_oss_experts(device, dtype, layout, tokens):
    _, mlp = hf_modules(dtype=dtype)
    mlp = mlp.to(device)
    x = torch.randn(tokens, H, dtype=dtype, device=device)
    with torch.no_grad():
        logits = torch.nn.functional.linear(x, mlp.router.weight, mlp.router.bias)
    top, ids = torch.topk(logits, K, dim=-1)
    weights = torch.softmax(top.float(), dim=-1).to(dtype)
    with torch.no_grad():
        want = mlp.experts(x, router_indices=ids, routing_weights=weights)
    w13, w2, b13, b2 = moejit_tensors(mlp.experts, layout)
    cfg = gpt_oss_config(dtype, layout)
    # torch.topk's int64 ids and the model-dtype weights and biases, as a caller has them.
    got = torch.ops.moejit.experts(x, ids, weights, w13, w2, None, None, None, None, None, cfg.to_json(),
                                   w13_bias=b13, w2_bias=b2)
    assert got.shape == want.shape and got.dtype == dtype
    if tokens:
        assert rel_error(got, want) < TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
def test_whole_layer_matches_hf_gpt_oss_mlp(device):
    # GptOssTopKRouter: top-k of the logits, then softmax over those k; moejit: softmax over all
    # experts, top-k, renormalized. The same weights.
    _, mlp = hf_modules(hidden=64, inter=32, experts=8)
    mlp = mlp.to(device)
    x = torch.randn(1, 9, 64, device=device)
    with torch.no_grad():
        want, _ = mlp(x)
    w13, w2, b13, b2 = moejit_tensors(mlp.experts)
    layer = MoELayer(gpt_oss_config(torch.float32, hidden=64, inter=32, experts=8), w13, w2,
                     w13_bias=b13, w2_bias=b2)
    flat = x.reshape(-1, 64)
    with torch.no_grad():
        logits = torch.nn.functional.linear(flat, mlp.router.weight, mlp.router.bias)
    got = layer(flat, logits).reshape_as(want)
    assert rel_error(got, want) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_parallel_ranks_sum_to_the_whole_layer(device):
    # I split over two ranks: GEMM 1's rows and biases sliced, GEMM 2's bias added by rank 0 only.
    _, mlp = hf_modules()
    mlp = mlp.to(device)
    x = torch.randn(5, H, device=device)
    ids = torch.randint(0, E, (5, K), device=device)
    weights = torch.rand(5, K, device=device)
    w13, w2, b13, b2 = moejit_tensors(mlp.experts)
    whole = torch.ops.moejit.experts(x, ids, weights, w13, w2, None, None, None, None, None,
                                     gpt_oss_config(torch.float32).to_json(), w13_bias=b13, w2_bias=b2)
    half = I // 2
    total = torch.zeros_like(whole)
    for rank in range(2):
        rows = torch.cat([torch.arange(rank * half, (rank + 1) * half), I + torch.arange(rank * half, (rank + 1) * half)])
        rows = rows.to(device)
        cfg = gpt_oss_config(torch.float32, tp_size=2, tp_rank=rank)
        total += torch.ops.moejit.experts(
            x, ids, weights, w13[:, rows].contiguous(), w2[:, :, rank * half:(rank + 1) * half].contiguous(), None,
            None, None, None, None, cfg.to_json(), w13_bias=b13[:, rows].contiguous(), w2_bias=b2)
    assert rel_error(total, whole) < 1e-5


def test_biases_are_required_exactly_when_the_config_has_them():
    _, mlp = hf_modules()
    w13, w2, b13, b2 = moejit_tensors(mlp.experts)
    x = torch.randn(3, H)
    ids = torch.zeros(3, K, dtype=torch.int32)
    weights = torch.ones(3, K)
    with pytest.raises(ValueError, match="w13_bias is required"):
        torch.ops.moejit.experts(x, ids, weights, w13, w2, None, None, None, None, None,
                                 gpt_oss_config(torch.float32).to_json())
    plain = MoeConfig(experts=E, topk=K, hidden=H, moe_intermediate=I, dtype=torch.float32)
    with pytest.raises(ValueError, match="w2_bias is given, but this layer has no expert biases"):
        torch.ops.moejit.experts(x, ids, weights, w13, w2, None, None, None, None, None, plain.to_json(),
                                 w2_bias=b2)
    with pytest.raises(ValueError, match="w13_bias must have shape"):
        torch.ops.moejit.experts(x, ids, weights, w13, w2, None, None, None, None, None,
                                 gpt_oss_config(torch.float32).to_json(), w13_bias=b13[:, :-1], w2_bias=b2)
    with pytest.raises(ValueError, match="expert_bias false"):
        MoELayer(plain, w13, w2, w13_bias=b13)
    # MoELayer keeps bf16 biases in fp32, so that no forward converts them.
    layer = MoELayer(gpt_oss_config(torch.float32), w13, w2, w13_bias=b13.bfloat16(), w2_bias=b2.bfloat16())
    assert layer.w13_bias.dtype == torch.float32 and layer.w2_bias.dtype == torch.float32
    with pytest.raises(ValueError, match="gated"):
        torch.ops.moejit.experts(x, ids, weights, w13[:, :I], w2, None, None, None, None, None,
                                 gpt_oss_config(torch.float32, gated=False).to_json(), w13_bias=b13[:, :I],
                                 w2_bias=b2)


def test_meta_kernel_checks_the_biases():
    cfg = gpt_oss_config(torch.bfloat16)
    with torch.device("meta"):
        x = torch.empty(4, H, dtype=torch.bfloat16)
        ids = torch.empty(4, K, dtype=torch.int32)
        weights = torch.empty(4, K)
        w13 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16)
        w2 = torch.empty(E, H, I, dtype=torch.bfloat16)
        out = torch.ops.moejit.experts(x, ids, weights, w13, w2, None, None, None, None, None, cfg.to_json(),
                                       w13_bias=torch.empty(E, 2 * I), w2_bias=torch.empty(E, H))
        assert out.shape == (4, H)
        with pytest.raises(ValueError, match="w2_bias is required"):
            torch.ops.moejit.experts(x, ids, weights, w13, w2, None, None, None, None, None, cfg.to_json(),
                                     w13_bias=torch.empty(E, 2 * I))


def test_opcheck_with_biases():
    cfg = gpt_oss_config(torch.float32)
    _, mlp = hf_modules()
    w13, w2, b13, b2 = moejit_tensors(mlp.experts)
    x = torch.randn(5, H)
    ids = torch.randint(0, E, (5, K), dtype=torch.int32)
    weights = torch.rand(5, K)
    torch.library.opcheck(torch.ops.moejit.experts.default,
                          (x, ids, weights, w13, w2, None, None, None, None, None, cfg.to_json()),
                          {"w13_bias": b13, "w2_bias": b2})


# gpt-oss's router in the layer (router_gemm, router_bias): logits = hidden @ weight^T + bias, the fp32
# sums and the bias rounded once to router_dtype, then the layer as above.

def float64_layer(x, gate, bias, w13, w2, b13, b2, router_dtype, topk=K, limit=7.0):
    """The whole gpt-oss layer in float64 on the rounded inputs (docs/LAYER_MATH.md "Router GEMM", SPEC.md):
    the logits rounded once to router_dtype, softmax over all experts, top-k, renormalized; GEMM 1 with
    its bias, the clamped SwiGLU, the activation rounded to the model dtype (the layer stores it so),
    GEMM 2 with its bias; the weighted sum. Also returns the top-k ids."""
    dtype = x.dtype
    logits = (x.double() @ gate.double().t() + bias.double()).to(router_dtype).double()
    p = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(p, topk, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        for j in range(topk):
            e = int(ids[t, j])
            g1 = w13[e].double() @ x[t].double() + b13[e].double()
            g = g1[:inter].clamp(max=limit)
            u = g1[inter:].clamp(-limit, limit)
            act = ((u + 1) * g * torch.sigmoid(1.702 * g)).to(dtype).double()
            y = (w2[e].double() @ act + b2[e].double()).to(dtype).double()
            out[t] += w[t, j] * y
    return out, ids


def router_bias_case(dtype, tokens, seed=0):
    """Random gpt-oss layer inputs: the router's bias as large as its logits, so that it decides routes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, generator=g).to(dtype)
    gate = (torch.randn(E, H, generator=g) / H ** 0.5).to(dtype)
    bias = (torch.randn(E, generator=g) * 2).to(dtype)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.3).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) * 0.3).to(dtype)
    b13 = torch.randn(E, 2 * I, generator=g) * 0.3
    b2 = torch.randn(E, H, generator=g) * 0.3
    return x, gate, bias, w13, w2, b13, b2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, router_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                 (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("tokens", [0, 1, 7])
def test_router_bias_layer_matches_float64_reference(device, dtype, router_dtype, tokens):
    case = router_bias_case(dtype, tokens)
    x, gate, bias, w13, w2, b13, b2 = (t.to(device) for t in case)
    cfg = gpt_oss_config(dtype, router_gemm=True, router_bias=True, router_dtype=router_dtype)
    got = torch.ops.moejit.moe_layer_gate(x, gate, w13, w2, None, None, None, None, None, None, cfg.to_json(),
                                          w13_bias=b13, w2_bias=b2, gate_bias=bias)
    assert got.shape == (tokens, H) and got.dtype == dtype and got.device == x.device
    if not tokens:
        return
    want, ids = float64_layer(*case, router_dtype)
    assert rel_error(got.cpu(), want) < TOLERANCE[dtype]
    # The bias decides routes here: without it the tokens go elsewhere, and the layer is far off.
    _, unbiased_ids = float64_layer(case[0], case[1], torch.zeros_like(case[2]), *case[3:], router_dtype)
    assert not torch.equal(ids, unbiased_ids)
    zero = torch.ops.moejit.moe_layer_gate(x, gate, w13, w2, None, None, None, None, None, None, cfg.to_json(),
                                           w13_bias=b13, w2_bias=b2, gate_bias=torch.zeros_like(bias))
    assert rel_error(zero.cpu(), want) > 0.1
    # MoELayer holds the bias and passes it.
    layer = MoELayer(cfg, w13, w2, w13_bias=b13, w2_bias=b2, gate_weight=gate, gate_bias=bias)
    assert torch.equal(layer(x), got)


@pytest.mark.parametrize("device", DEVICES)
def test_router_bias_layer_matches_hf_gpt_oss_mlp(device):
    """moe_layer_gate with the router's weight and bias equals transformers' GptOssMLP, whose router is
    F.linear(hidden, weight, bias)."""
    _, mlp = hf_modules(hidden=64, inter=32, experts=8)
    with torch.no_grad():
        mlp.router.bias.mul_(5.0)  # routes the bias decides
    mlp = mlp.to(device)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        want, _ = mlp(x.view(1, 9, 64))
    w13, w2, b13, b2 = moejit_tensors(mlp.experts)
    cfg = gpt_oss_config(torch.float32, hidden=64, inter=32, experts=8, router_gemm=True, router_bias=True)
    got = torch.ops.moejit.moe_layer_gate(x, mlp.router.weight.detach(), w13, w2, None, None, None, None, None, None,
                                          cfg.to_json(), w13_bias=b13, w2_bias=b2,
                                          gate_bias=mlp.router.bias.detach())
    assert rel_error(got, want.view(9, 64)) < TOLERANCE[torch.float32]


def test_router_bias_arguments_are_checked_by_name():
    x, gate, bias, w13, w2, b13, b2 = router_bias_case(torch.bfloat16, 3)
    biased = gpt_oss_config(torch.bfloat16, router_gemm=True, router_bias=True).to_json()
    plain = gpt_oss_config(torch.bfloat16, router_gemm=True).to_json()

    def call(cfg, **kw):
        return torch.ops.moejit.moe_layer_gate(x, gate, w13, w2, None, None, None, None, None, None, cfg,
                                               w13_bias=b13, w2_bias=b2, **kw)

    with pytest.raises(ValueError, match=r"gate_bias is required: this config has router_bias true \(the router's "
                                         rf"bias \[{E}\]"):
        call(biased)
    with pytest.raises(ValueError, match="gate_bias is given, but this config has router_bias false"):
        call(plain, gate_bias=bias)
    with pytest.raises(ValueError, match=rf"gate_bias must be \[{E}\] BFloat16 \(the model dtype, as gate_weight\), "
                                         r"got \[6\] Float"):
        call(biased, gate_bias=bias.float())
    with pytest.raises(ValueError, match=rf"gate_bias must be \[{E}\] BFloat16 .*got \[1, 6\]"):
        call(biased, gate_bias=bias.view(1, E))
    with pytest.raises(ValueError, match=rf"gate_bias must be \[{E}\] BFloat16 .*got \[5\]"):
        call(biased, gate_bias=bias[:5])
    with pytest.raises(ValueError, match="gate_bias must be contiguous"):
        call(biased, gate_bias=torch.stack([bias, bias], 1)[:, 0])
    # The config: router_bias needs router_gemm (the caller's logits carry the bias already).
    with pytest.raises(ValueError, match="router_bias: true needs router_gemm true"):
        torch.ops.moejit.moe_layer(x, torch.zeros(3, E, dtype=torch.bfloat16), w13, w2, None, None, None, None, None,
                                   None, gpt_oss_config(torch.bfloat16, router_bias=True).to_json(), w13_bias=b13,
                                   w2_bias=b2)
    with pytest.raises(ValueError, match="gate_bias is given, but the config has router_bias false"):
        MoELayer(gpt_oss_config(torch.bfloat16, router_gemm=True), w13, w2, w13_bias=b13, w2_bias=b2,
                 gate_weight=gate, gate_bias=bias)
    # Meta: shapes and dtypes checked while tracing.
    with torch.device("meta"):
        m = [torch.empty_like(t, device="meta") for t in (x, gate, bias, w13, w2, b13, b2)]
    out = torch.ops.moejit.moe_layer_gate(m[0], m[1], m[3], m[4], None, None, None, None, None, None, biased,
                                          w13_bias=m[5], w2_bias=m[6], gate_bias=m[2])
    assert out.shape == x.shape and out.device.type == "meta"
    with pytest.raises(ValueError, match="gate_bias is required"):
        torch.ops.moejit.moe_layer_gate(m[0], m[1], m[3], m[4], None, None, None, None, None, None, biased,
                                        w13_bias=m[5], w2_bias=m[6])
    with pytest.raises(ValueError, match=rf"gate_bias must be \[{E}\]"):
        torch.ops.moejit.moe_layer_gate(m[0], m[1], m[3], m[4], None, None, None, None, None, None, biased,
                                        w13_bias=m[5], w2_bias=m[6], gate_bias=m[2][:3])


def test_opcheck_with_router_bias():
    x, gate, bias, w13, w2, b13, b2 = router_bias_case(torch.float32, 5)
    cfg = gpt_oss_config(torch.float32, router_gemm=True, router_bias=True)
    torch.library.opcheck(torch.ops.moejit.moe_layer_gate.default,
                          (x, gate, w13, w2, None, None, None, None, None, None, cfg.to_json()),
                          {"w13_bias": b13, "w2_bias": b2, "gate_bias": bias})
