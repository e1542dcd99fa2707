"""Checkpoint loading against transformers: tiny random models of each MoE family built from a config
and saved with save_pretrained (one file, and sharded with an index), then `moejit inspect
--dump-experts` packs a layer for a rank; the packed w13 / w2 must be the slices of the model's own
expert tensors (transformers 5.x holds them fused: gate_up_proj [E, 2I, H], down_proj [E, H, I]).
An fp8 block-scaled checkpoint written with the safetensors package checks the scales' slicing.
"""

import dataclasses
import json
import pathlib
import subprocess

import pytest
import torch

from conftest import build_model, rel_error

safetensors_torch = pytest.importorskip("safetensors.torch")


def run_cli(cli, *args, check=True):
    result = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"moejit {' '.join(map(str, args))} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result


def experts_of(model):
    """{layer index: the experts module} of a transformers 5.x MoE model."""
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") and ".layers." in name:
            out[int(name.split(".layers.")[1].split(".")[0])] = module
    return out


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "deepseek_v3"])
@pytest.mark.parametrize("sharded", [False, True])
def test_dump_matches_the_models_experts(family, sharded, tmp_path, moejit_cli):
    model = build_model(family, dtype=torch.bfloat16)
    folder = tmp_path / "model"
    model.save_pretrained(folder, max_shard_size="40KB" if sharded else "10GB")
    assert (folder / "model.safetensors.index.json").exists() == sharded
    (layer, experts), = experts_of(model).items()
    E, two_i, H = experts.gate_up_proj.shape
    I = two_i // 2
    ep_size, tp_size = 2, 2
    for ep_rank in range(ep_size):
        for tp_rank in range(tp_size):
            out = tmp_path / f"dump_{ep_rank}_{tp_rank}.safetensors"
            report = run_cli(moejit_cli, "inspect", "--model", folder, "--layer", layer, "--dump-experts", out,
                             "--ep-size", ep_size, "--ep-rank", ep_rank, "--tp-size", tp_size, "--tp-rank", tp_rank)
            assert f"layer {layer}:" in report.stdout and "problem" not in report.stdout
            got = safetensors_torch.load_file(str(out))
            e0, e1 = ep_rank * E // ep_size, (ep_rank + 1) * E // ep_size
            i0, i1 = tp_rank * I // tp_size, (tp_rank + 1) * I // tp_size
            gate_up = experts.gate_up_proj.detach()
            want_w13 = torch.cat([gate_up[e0:e1, i0:i1], gate_up[e0:e1, I + i0:I + i1]], dim=1)
            assert got["w13"].dtype == torch.bfloat16
            assert torch.equal(got["w13"], want_w13)
            assert torch.equal(got["w2"], experts.down_proj.detach()[e0:e1, :, i0:i1])
            if family == "deepseek_v3":
                bias = dict(model.named_buffers())[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"]
                assert torch.equal(got["e_score_correction_bias"], bias.float())
            else:
                assert "e_score_correction_bias" not in got


def test_inspect_lists_the_layer_and_what_is_missing(tmp_path, moejit_cli):
    model = build_model("qwen3_moe", dtype=torch.bfloat16)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    report = run_cli(moejit_cli, "inspect", "--model", folder)
    assert "experts.*.gate_proj.weight" in report.stdout and "8/8" in report.stdout
    assert "gate.weight" in report.stdout  # the router, listed beside the experts
    # Drop one expert's up projection: inspect names it and exits 1.
    tensors = safetensors_torch.load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.0.mlp.experts.5.up_proj.weight"]
    safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    report = run_cli(moejit_cli, "inspect", "--model", folder, check=False)
    assert report.returncode == 1
    assert "7/8" in report.stdout
    assert "'model.layers.0.mlp.experts.5.up_proj.weight' missing" in report.stdout
    report = run_cli(moejit_cli, "inspect", "--model", folder, "--layer", 0, "--dump-experts", tmp_path / "x.safetensors",
                     check=False)
    assert report.returncode == 2 and "experts.5.up_proj.weight' missing" in report.stderr
    report = run_cli(moejit_cli, "inspect", "--model", folder, "--layer", 7, check=False)
    assert report.returncode == 2 and "not a MoE layer" in report.stderr


def fp8_checkpoint(folder: pathlib.Path, E=4, H=256, I=256, seed=0):
    """A DeepSeek-V3 fp8 checkpoint of one MoE layer, as the released one stores it: e4m3 weights,
    fp32 *_scale_inv per 128 x 128 block, the fp32 correction bias."""
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(hidden_size=H, moe_intermediate_size=I, intermediate_size=2 * I, n_routed_experts=E,
                              num_experts_per_tok=2, n_group=2, topk_group=1, num_hidden_layers=1,
                              first_k_dense_replace=0, vocab_size=64, num_attention_heads=4, num_key_value_heads=4)
    folder.mkdir()
    d = config.to_dict()
    d["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(d))
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for e in range(E):
        for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            w = (torch.randn(shape, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
            key = f"model.layers.0.mlp.experts.{e}.{name}.weight"
            tensors[key] = w
            tensors[key + "_scale_inv"] = torch.rand((shape[0] + 127) // 128, (shape[1] + 127) // 128, generator=g)
    tensors["model.layers.0.mlp.gate.e_score_correction_bias"] = torch.randn(E, generator=g)
    safetensors_torch.save_file(tensors, str(folder / "model.safetensors"))
    return tensors


def test_fp8_block_checkpoint_packs_weights_and_scales(tmp_path, moejit_cli):
    E, H, I = 4, 256, 256
    tensors = fp8_checkpoint(tmp_path / "model", E, H, I)
    out = tmp_path / "dump.safetensors"
    report = run_cli(moejit_cli, "inspect", "--model", tmp_path / "model", "--layer", 0, "--dump-experts", out,
                     "--tp-size", 2, "--tp-rank", 1, "--ep-size", 2, "--ep-rank", 1)
    assert "quant fp8_block" in report.stdout
    got = safetensors_torch.load_file(str(out))
    t = lambda e, name: tensors[f"model.layers.0.mlp.experts.{e}.{name}"]  # noqa: E731
    experts, rows = range(2, 4), slice(128, 256)  # ep_rank 1 of 2; tp_rank 1 of 2: I_loc = 128
    want_w13 = torch.stack([torch.cat([t(e, "gate_proj.weight")[rows], t(e, "up_proj.weight")[rows]]) for e in experts])
    assert got["w13"].dtype == torch.float8_e4m3fn
    assert torch.equal(got["w13"].view(torch.uint8), want_w13.view(torch.uint8))
    want_w2 = torch.stack([t(e, "down_proj.weight")[:, rows] for e in experts])
    assert torch.equal(got["w2"].view(torch.uint8), want_w2.view(torch.uint8))
    want_w13_scale = torch.stack([torch.cat([t(e, "gate_proj.weight_scale_inv")[1:2], t(e, "up_proj.weight_scale_inv")[1:2]])
                                  for e in experts])
    assert torch.equal(got["w13_scale"], want_w13_scale)
    assert torch.equal(got["w2_scale"], torch.stack([t(e, "down_proj.weight_scale_inv")[:, 1:2] for e in experts]))
    assert torch.equal(got["e_score_correction_bias"], tensors["model.layers.0.mlp.gate.e_score_correction_bias"])
    # A tensor-parallel slice that splits the 128-row scale blocks is refused, naming the rule.
    report = run_cli(moejit_cli, "inspect", "--model", tmp_path / "model", "--layer", 0, "--dump-experts", out,
                     "--tp-size", 4, "--tp-rank", 1, check=False)
    assert report.returncode == 2 and "multiple of 128" in report.stderr


def test_load_experts_from_python(tmp_path):
    """moejit.load_experts: the same packing as the CLI's dump, as torch tensors, for a rank."""
    from conftest import moejit

    model = build_model("deepseek_v3", dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    (layer, experts), = experts_of(model).items()
    E, two_i, H = experts.gate_up_proj.shape
    I = two_i // 2
    got = moejit.load_experts(tmp_path, layer, ep_size=2, ep_rank=1, tp_size=2, tp_rank=0)
    assert sorted(got) == ["e_score_correction_bias", "w13", "w2"]
    gate_up = experts.gate_up_proj.detach()
    e0, i1 = E // 2, I // 2
    assert torch.equal(got["w13"], torch.cat([gate_up[e0:, :i1], gate_up[e0:, I:I + i1]], dim=1))
    assert torch.equal(got["w2"], experts.down_proj.detach()[e0:, :, :i1])
    assert got["e_score_correction_bias"].dtype == torch.float32
    # The layer takes them as they come: the CPU op runs on the loaded tensors.
    cfg = moejit.MoeConfig(experts=E, topk=2, num_expert_group=2, topk_group=1, scoring="sigmoid",
                           topk_method="noaux_tc", renormalize=True, routed_scaling_factor=2.5, hidden=H,
                           moe_intermediate=I, dtype=torch.bfloat16, ep_size=2, ep_rank=1, tp_size=2, tp_rank=0)
    hidden = torch.randn(3, H, dtype=torch.bfloat16)
    logits = torch.randn(3, E, dtype=torch.bfloat16)
    out = torch.ops.moejit.moe_layer(hidden, logits, got["w13"], got["w2"], got["e_score_correction_bias"], None,
                                     None, None, None, None, cfg.to_json())
    assert out.shape == (3, H) and torch.isfinite(out.float()).all()
    with pytest.raises(ValueError, match="layer 5 has no expert tensors"):
        moejit.load_experts(tmp_path, 5)
    with pytest.raises(ValueError, match="multiple of|tp_size"):
        moejit.load_experts(tmp_path, layer, tp_size=3)
    with pytest.raises(ValueError, match="expert_bias: the config adds expert biases, but the layer has none"):
        moejit.load_experts(tmp_path, layer, expert_bias=True)


def test_fused_shared_experts_load_and_match_the_hf_block(tmp_path, moejit_cli):
    """fuse_shared_experts: DeepSeek's shared experts (one MLP n_shared_experts * I wide) are packed
    as n_shared_experts slices after the routed experts, each sliced for the tensor-parallel rank;
    the fused layer on the loaded tensors is the whole Hugging Face MoE block (routed + shared)."""
    from conftest import moejit

    model = build_model("deepseek_v3", dtype=torch.bfloat16, n_shared_experts=2)
    model.save_pretrained(tmp_path)
    (layer, experts), = experts_of(model).items()
    block = model.model.layers[layer].mlp
    E, two_i, H = experts.gate_up_proj.shape
    I = two_i // 2
    shared = block.shared_experts
    assert shared.gate_proj.weight.shape == (2 * I, H)
    for ep_rank, tp_rank in ((1, 1), (0, 0)):
        got = moejit.load_experts(tmp_path, layer, ep_size=2, ep_rank=ep_rank, tp_size=2, tp_rank=tp_rank,
                                  fuse_shared_experts=True)
        assert got["w13"].shape == (E // 2 + 2, I, H) and got["w2"].shape == (E // 2 + 2, H, I // 2)
        for s in range(2):
            rows = slice(s * I + tp_rank * I // 2, s * I + (tp_rank + 1) * I // 2)
            want13 = torch.cat([shared.gate_proj.weight.detach()[rows], shared.up_proj.weight.detach()[rows]])
            assert torch.equal(got["w13"][E // 2 + s], want13)
            assert torch.equal(got["w2"][E // 2 + s], shared.down_proj.weight.detach()[:, rows])
    # The CLI's dump and inspect see the shared experts too.
    dump = tmp_path / "dump.safetensors"
    report = run_cli(moejit_cli, "inspect", "--model", tmp_path, "--layer", layer, "--dump-experts", dump,
                     "--fuse-shared-experts", "true")
    assert "shared_experts.gate_proj.weight" in report.stdout
    assert safetensors_torch.load_file(str(dump))["w13"].shape == (E + 2, 2 * I, H)

    # One rank: the fused layer against the whole HF block (router in fp32, as transformers computes it).
    got = moejit.load_experts(tmp_path, layer, fuse_shared_experts=True)
    cfg = moejit.MoeConfig(experts=E, topk=2, num_expert_group=2, topk_group=1, scoring="sigmoid",
                           topk_method="noaux_tc", renormalize=True, routed_scaling_factor=2.5, hidden=H,
                           moe_intermediate=I, dtype=torch.bfloat16, router_dtype=torch.float32,
                           n_shared_experts=2, fuse_shared_experts=True)
    hidden = torch.randn(1, 9, H, dtype=torch.bfloat16)
    with torch.no_grad():
        want = block(hidden)
        want = want[0] if isinstance(want, tuple) else want
        logits = torch.nn.functional.linear(hidden.view(-1, H).float(), block.gate.weight.float())
        out = torch.ops.moejit.moe_layer(hidden.view(-1, H), logits, got["w13"], got["w2"],
                                         got["e_score_correction_bias"], None, None, None, None, None, cfg.to_json())
    assert rel_error(out, want.view(-1, H)) < 2e-2
    # Without its shared experts the layer is far from the block: the test sees them.
    routed_cfg = dataclasses.replace(cfg, fuse_shared_experts=False)
    routed = torch.ops.moejit.moe_layer(hidden.view(-1, H), logits, got["w13"][:E], got["w2"][:E],
                                        got["e_score_correction_bias"], None, None, None, None, None,
                                        routed_cfg.to_json())
    assert rel_error(routed, want.view(-1, H)) > 0.2
    # Families without shared experts refuse it by name.
    mixtral = build_model("mixtral", dtype=torch.bfloat16)
    mixtral.save_pretrained(tmp_path / "mixtral")
    with pytest.raises(ValueError, match="fuse_shared_experts"):
        moejit.load_experts(tmp_path / "mixtral", 0, fuse_shared_experts=True)


def test_gpt_oss_checkpoint_loads_de_interleaved_with_biases(tmp_path, moejit_cli):
    """A tiny bf16 gpt-oss model saved by transformers (gate_up_proj [E, H, 2I] with gate and up
    interleaved, down_proj [E, I, H], their biases): moejit packs a rank's share into the layer's
    nk layout with fp32 biases, and the experts op on them computes what GptOssExperts computes."""
    from conftest import moejit

    transformers = pytest.importorskip("transformers")
    E, H, I = 4, 64, 48  # H != 2I, so a transposed tensor cannot pass for the other layout by shape
    config = transformers.GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=2,
                                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       vocab_size=64, max_position_embeddings=64, layer_types=["full_attention"])
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model = model.to(torch.bfloat16)
    folder = tmp_path / "gpt-oss"
    model.save_pretrained(folder)
    experts = model.model.layers[0].mlp.experts
    gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
    b13, b2 = experts.gate_up_proj_bias.detach(), experts.down_proj_bias.detach()
    report = run_cli(moejit_cli, "inspect", "--model", folder)
    assert "gpt-oss fused gate_up_proj/down_proj with biases" in report.stdout and "problem" not in report.stdout
    for ep_rank, tp_rank in [(0, 0), (1, 1)]:
        got = moejit.load_experts(folder, 0, ep_size=2, ep_rank=ep_rank, tp_size=2, tp_rank=tp_rank)
        assert sorted(got) == ["w13", "w13_bias", "w2", "w2_bias"]
        e0, e1, i0, i1 = ep_rank * 2, ep_rank * 2 + 2, tp_rank * I // 2, (tp_rank + 1) * I // 2
        gate, up = gate_up[e0:e1, :, 0::2][..., i0:i1], gate_up[e0:e1, :, 1::2][..., i0:i1]  # [2, H, I/2]
        assert torch.equal(got["w13"], torch.cat([gate, up], dim=2).transpose(1, 2))
        assert torch.equal(got["w2"], down[e0:e1, i0:i1].transpose(1, 2))
        assert got["w13_bias"].dtype == torch.float32
        assert torch.equal(got["w13_bias"], torch.cat([b13[e0:e1, 0::2][:, i0:i1], b13[e0:e1, 1::2][:, i0:i1]], 1).float())
        assert torch.equal(got["w2_bias"], b2[e0:e1].float())
    # The whole layer on one rank against transformers' experts, through the CPU op.
    got = moejit.load_experts(folder, 0)
    cfg = moejit.MoeConfig(experts=E, topk=2, hidden=H, moe_intermediate=I, activation="swigluoai", expert_bias=True,
                           dtype=torch.bfloat16)
    x = torch.randn(5, H, dtype=torch.bfloat16)
    ids = torch.tensor([[0, 3], [1, 2], [2, 0], [3, 1], [1, 0]])
    weights = torch.rand(5, 2)
    out = torch.ops.moejit.experts(x, ids, weights, got["w13"], got["w2"], None, None, None, None, None, cfg.to_json(),
                                   w13_bias=got["w13_bias"], w2_bias=got["w2_bias"])
    with torch.no_grad():
        want = experts.float()(x.float(), ids, weights)
    assert rel_error(out, want) < 2e-2
    # A config that disagrees with the checkpoint is refused by name.
    with pytest.raises(ValueError, match="gpt-oss experts .* expert_bias true"):
        moejit.load_experts(folder, 0, expert_bias="false")


def gate_bits(t):
    """A 16-bit tensor's bits, so that equality is bitwise (NaN and -0.0 included)."""
    return t.view(torch.int16)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_router_gemm_returns_the_models_gate_weight(family, tmp_path):
    """router_gemm: load_experts returns the router's gate weight [E, H] in the model dtype, whole on
    every rank, bit for bit what transformers loads (save_pretrained writes Qwen's and DeepSeek's
    mlp.gate.weight, Mixtral's block_sparse_moe.gate.weight); without router_gemm it is not read."""
    from conftest import moejit

    transformers = pytest.importorskip("transformers")
    model = build_model(family, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    (layer, _), = experts_of(model).items()
    block = "block_sparse_moe" if family == "mixtral" else "mlp"
    assert f"model.layers.{layer}.{block}.gate.weight" in safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    want = loaded.model.layers[layer].mlp.gate.weight.detach()
    assert torch.equal(gate_bits(want), gate_bits(model.model.layers[layer].mlp.gate.weight.detach()))
    for ep_rank, tp_rank in ((0, 0), (1, 1)):
        got = moejit.load_experts(tmp_path, layer, ep_size=2, ep_rank=ep_rank, tp_size=2, tp_rank=tp_rank,
                                  router_gemm=True)
        assert got["gate_weight"].dtype == torch.bfloat16 and got["gate_weight"].shape == want.shape
        assert torch.equal(gate_bits(got["gate_weight"]), gate_bits(want))
    assert "gate_weight" not in moejit.load_experts(tmp_path, layer)
    if family == "deepseek_v3":
        return  # its router scores in fp32 with groups and a bias: the layer test of test_ops covers the op
    # The layer computes its own logits from the loaded gate: the whole HF block, within bf16's tolerance.
    got = moejit.load_experts(tmp_path, layer, router_gemm=True)
    E, H = want.shape
    cfg = moejit.MoeConfig(experts=E, topk=2, hidden=H, moe_intermediate=got["w2"].shape[2], dtype=torch.bfloat16,
                           renormalize=True, router_gemm=True)
    hidden = torch.randn(1, 9, H, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want_out = model.model.layers[layer].mlp(hidden)
        want_out = want_out[0] if isinstance(want_out, tuple) else want_out
    out = torch.ops.moejit.moe_layer_gate(hidden.view(-1, H), got["gate_weight"], got["w13"], got["w2"], None, None,
                                          None, None, None, None, cfg.to_json())
    assert rel_error(out, want_out.view(-1, H)) < 2e-2
    # The gate matters: the layer on another router's weight is far from the block.
    other = torch.ops.moejit.moe_layer_gate(hidden.view(-1, H), torch.flip(got["gate_weight"], [0]), got["w13"],
                                            got["w2"], None, None, None, None, None, None, cfg.to_json())
    assert rel_error(other, want_out.view(-1, H)) > 0.2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_router_gemm_rounds_an_fp32_gate_as_transformers_does(dtype, tmp_path):
    """A router kept in fp32 beside bf16 / fp16 experts is rounded once to the model dtype, to nearest
    even: bit for bit Tensor.to and what from_pretrained(dtype=...) holds, ties included."""
    from conftest import moejit

    transformers = pytest.importorskip("transformers")
    build_model("qwen3_moe", dtype=dtype).save_pretrained(tmp_path)
    path, name = tmp_path / "model.safetensors", "model.layers.0.mlp.gate.weight"
    tensors = safetensors_torch.load_file(str(path))
    gate = torch.randn(tensors[name].shape, generator=torch.Generator().manual_seed(5)) * 0.1
    # Halfway between two bf16 values (1 + 2^-8, 1 + 3 * 2^-8) and two halves (1 + 2^-11, 1 + 3 * 2^-11).
    gate[0, :4] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, 1 + 3 * 2 ** -11])
    tensors[name] = gate
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    got = moejit.load_experts(tmp_path, 0, router_gemm=True, ep_size=2, ep_rank=1)["gate_weight"]
    assert got.dtype == dtype
    assert torch.equal(gate_bits(got), gate_bits(gate.to(dtype)))
    assert not torch.equal(got.float(), gate)  # the rounding did happen
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype)
    assert torch.equal(gate_bits(got), gate_bits(loaded.model.layers[0].mlp.gate.weight.detach()))


def test_router_gemm_fused_names_and_inspect(tmp_path, moejit_cli):
    """transformers 5.x's module-tree names (fused experts, the router at mlp.gate.weight, as
    Mixtral's state_dict has them) load too; inspect lists the gate weight for router_gemm and
    names it when it is missing; --dump-experts writes it."""
    from conftest import moejit

    model = build_model("mixtral", dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)  # config.json
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state and "model.layers.0.mlp.gate.weight" in state
    (tmp_path / "model.safetensors").unlink()
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    got = moejit.load_experts(tmp_path, 0, router_gemm=True, tp_size=2, tp_rank=1)
    assert torch.equal(gate_bits(got["gate_weight"]), gate_bits(state["model.layers.0.mlp.gate.weight"]))

    report = run_cli(moejit_cli, "inspect", "--model", tmp_path, "--router-gemm", "true")
    line, = [ln for ln in report.stdout.splitlines() if ln.strip().startswith("gate.weight")]
    assert "1/1" in line and "[4, 64] BF16" in line and "router_gemm true" in report.stdout
    plain = run_cli(moejit_cli, "inspect", "--model", tmp_path)
    line, = [ln for ln in plain.stdout.splitlines() if ln.strip().startswith("gate.weight")]
    assert "1/1" not in line  # listed beside the experts, not needed
    dump = tmp_path / "dump.safetensors"
    run_cli(moejit_cli, "inspect", "--model", tmp_path, "--layer", 0, "--dump-experts", dump, "--router-gemm", "true")
    assert torch.equal(safetensors_torch.load_file(str(dump))["gate_weight"], got["gate_weight"])
    del state["model.layers.0.mlp.gate.weight"]
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    report = run_cli(moejit_cli, "inspect", "--model", tmp_path, "--router-gemm", "true", check=False)
    assert report.returncode == 1 and "0/1" in report.stdout
    assert "problem: 'model.layers.0.mlp.gate.weight' missing" in report.stdout
    assert run_cli(moejit_cli, "inspect", "--model", tmp_path).returncode == 0  # not needed without router_gemm


def test_router_gemm_refusals(tmp_path, moejit_cli):
    """A missing or misshapen gate weight is named with its file; gpt-oss's router, which adds a bias,
    is refused for router_gemm without router_bias by the config reader and by the loader."""
    from conftest import moejit

    transformers = pytest.importorskip("transformers")
    build_model("qwen3_moe", dtype=torch.bfloat16).save_pretrained(tmp_path / "qwen")
    path, name = tmp_path / "qwen" / "model.safetensors", "model.layers.0.mlp.gate.weight"
    tensors = safetensors_torch.load_file(str(path))
    gate = tensors.pop(name)
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"tensor '{name}' missing"):
        moejit.load_experts(tmp_path / "qwen", 0, router_gemm=True)
    assert sorted(moejit.load_experts(tmp_path / "qwen", 0)) == ["w13", "w2"]
    tensors[name] = gate[:, :-1].contiguous()
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"'{name}' is \[8, 63\] BF16 in '.*model.safetensors'; the router's gate "
                                         rf"weight \(router_gemm; converted to BF16\) must be \[8, 64\]"):
        moejit.load_experts(tmp_path / "qwen", 0, router_gemm=True)
    tensors[name] = gate.to(torch.int8)
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"'{name}' is \[8, 64\] I8 in '.*model.safetensors'"):
        moejit.load_experts(tmp_path / "qwen", 0, router_gemm=True)

    E, H, I = 4, 64, 48
    folder = tmp_path / "gpt-oss"
    _gpt_oss_model(E, H, I).save_pretrained(folder)
    assert "gate_weight" not in moejit.load_experts(folder, 0)
    # gpt-oss's router adds a bias: a layer computing its logits adds it too (router_bias, which its
    # config.json sets with router_gemm), and one that would drop it is refused.
    with pytest.raises(ValueError, match="router_bias: false, but gpt_oss's router adds a bias"):
        moejit.load_experts(folder, 0, router_gemm=True, router_bias=False)
    # The same checkpoint under a moejit config (no model_type to say gpt_oss): the loader refuses it.
    (folder / "config.json").write_text(json.dumps({"experts": E, "topk": 2, "hidden": H, "moe_intermediate": I,
                                                    "activation": "swigluoai", "expert_bias": True, "dtype": "bf16"}))
    assert "w13_bias" in moejit.load_experts(folder, 0)
    with pytest.raises(ValueError, match=r"router_bias: false, but this router adds a bias to its logits \(gpt-oss's "
                                         r"'model.layers.0.mlp.router.bias'\)"):
        moejit.load_experts(folder, 0, router_gemm=True)
    assert "gate_bias" in moejit.load_experts(folder, 0, router_gemm=True, router_bias=True)
    report = run_cli(moejit_cli, "inspect", "--model", folder, "--router-gemm", "true", check=False)
    assert report.returncode == 1 and "problem: router_bias: false, but this router adds a bias" in report.stdout
    assert run_cli(moejit_cli, "inspect", "--model", folder).returncode == 0
    assert run_cli(moejit_cli, "inspect", "--model", folder, "--router-gemm", "true", "--router-bias",
                   "true").returncode == 0


def _gpt_oss_model(E, H, I, seed=0):
    """A tiny random GptOssForCausalLM in bf16: every weight N(0, 0.3), the router's bias N(0, 3), as
    large as its logits, so that it moves the routing."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=2,
                                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       vocab_size=64, max_position_embeddings=64, layer_types=["full_attention"],
                                       rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        model.model.layers[0].mlp.router.bias.mul_(10.0)
    return model.to(torch.bfloat16)


def test_router_bias_returns_gpt_oss_router_bias(tmp_path, moejit_cli):
    """gpt-oss (router_gemm, and router_bias, which its config.json sets with it): load_experts returns
    the router's weight and bias (mlp.router.weight, mlp.router.bias), bit for bit what transformers
    loads, whole on every rank; the layer computing its own logits from them equals transformers'
    GptOssMLP. A missing or misshapen bias is named with its file; inspect and --dump-experts list it."""
    from conftest import moejit

    transformers = pytest.importorskip("transformers")
    E, H, I = 8, 64, 32
    model = _gpt_oss_model(E, H, I)
    model.save_pretrained(tmp_path)
    state = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    weight_name, bias_name = "model.layers.0.mlp.router.weight", "model.layers.0.mlp.router.bias"
    assert weight_name in state and bias_name in state
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).model.layers[0].mlp
    for ep_rank, tp_rank in ((0, 0), (1, 1)):
        got = moejit.load_experts(tmp_path, 0, router_gemm=True, ep_size=2, ep_rank=ep_rank, tp_size=2, tp_rank=tp_rank)
        assert got["gate_bias"].dtype == torch.bfloat16 and got["gate_bias"].shape == (E,)
        assert torch.equal(gate_bits(got["gate_bias"]), gate_bits(loaded.router.bias.detach()))
        assert torch.equal(gate_bits(got["gate_weight"]), gate_bits(loaded.router.weight.detach()))
    assert "gate_bias" not in moejit.load_experts(tmp_path, 0)
    # The whole block from the loaded tensors, against transformers' GptOssMLP.
    got = moejit.load_experts(tmp_path, 0, router_gemm=True)
    cfg = moejit.MoeConfig(experts=E, topk=2, hidden=H, moe_intermediate=I, activation="swigluoai", expert_bias=True,
                           dtype=torch.bfloat16, router_gemm=True, router_bias=True)
    hidden = torch.randn(9, H, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, _ = loaded(hidden.view(1, 9, H))
    args = (got["w13"], got["w2"], None, None, None, None, None, None, cfg.to_json())
    out = torch.ops.moejit.moe_layer_gate(hidden, got["gate_weight"], *args, w13_bias=got["w13_bias"],
                                          w2_bias=got["w2_bias"], gate_bias=got["gate_bias"])
    assert rel_error(out, want.view(-1, H)) < 2e-2
    # The bias matters: without it (a layer that adds a bias of zeros) the routing is another one.
    zero = torch.ops.moejit.moe_layer_gate(hidden, got["gate_weight"], *args, w13_bias=got["w13_bias"],
                                           w2_bias=got["w2_bias"], gate_bias=torch.zeros_like(got["gate_bias"]))
    assert rel_error(zero, want.view(-1, H)) > 0.1

    report = run_cli(moejit_cli, "inspect", "--model", tmp_path, "--router-gemm", "true")
    line, = [ln for ln in report.stdout.splitlines() if ln.strip().startswith("router.bias")]
    assert "1/1" in line and "[8] BF16" in line and "router_bias true" in report.stdout
    dump = tmp_path / "dump.safetensors"
    run_cli(moejit_cli, "inspect", "--model", tmp_path, "--layer", 0, "--dump-experts", dump, "--router-gemm", "true")
    assert torch.equal(safetensors_torch.load_file(str(dump))["gate_bias"], got["gate_bias"])

    path = tmp_path / "model.safetensors"
    bias = state.pop(bias_name)
    safetensors_torch.save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"tensor '{bias_name}' missing"):
        moejit.load_experts(tmp_path, 0, router_gemm=True)
    report = run_cli(moejit_cli, "inspect", "--model", tmp_path, "--router-gemm", "true", check=False)
    assert report.returncode == 1 and f"problem: '{bias_name}' missing" in report.stdout
    state[bias_name] = bias[:-1].contiguous()
    safetensors_torch.save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"'{bias_name}' is \[7\] BF16 in '.*model.safetensors'; the router's bias "
                                         rf"\(router_bias; converted to BF16\) must be \[8\]"):
        moejit.load_experts(tmp_path, 0, router_gemm=True)
