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
