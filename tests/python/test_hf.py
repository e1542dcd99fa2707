"""The "moejit" experts implementation and moejit.patch on tiny random Hugging Face MoE models."""

import logging

import pytest
import torch

import moejit

from conftest import TOLERANCE, build_model, moe_layer_count, rel_error

pytest.importorskip("transformers")


def experts_module(model):
    return moejit.hf.find_experts_modules(model)[0][1]


def random_routing(module, tokens, topk, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, module.hidden_dim, generator=g).to(device=device, dtype=dtype)
    scores = torch.rand(tokens, module.num_experts, generator=g)
    weights, ids = scores.topk(topk, -1)
    return hidden, ids.to(device), (weights / weights.sum(-1, keepdim=True)).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_experts_module_matches_eager(family, dtype, device):
    """Same experts module, same ids and weights: moejit vs transformers' eager loop."""
    model = build_model(family, dtype=dtype, device=device)
    module = experts_module(model)
    hidden, ids, weights = random_routing(module, tokens=13, topk=2, dtype=dtype, device=device)
    # Qwen3-MoE/Qwen3-Next hand the experts weights in the model dtype, Mixtral/DeepSeek-V3 in fp32.
    weights = weights.to(dtype) if family.startswith("qwen3") else weights
    moejit.register_hf()
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = module(hidden, ids, weights)
        model.set_experts_implementation("moejit")
        out = module(hidden, ids, weights)
    assert out.dtype == dtype and out.shape == hidden.shape
    # Eager rounds each expert's product to bf16 before summing; moejit sums in fp32 (SPEC stage 6).
    assert rel_error(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_with_moejit_experts_matches_eager(family, dtype, device, tokens):
    model = build_model(family, dtype=dtype, device=device)
    moejit.register_hf()
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(tokens.to(device)).logits
        model.set_experts_implementation("moejit")
        out = model(tokens.to(device)).logits
    assert rel_error(out, ref) < TOLERANCE[dtype]


def test_model_built_with_moejit_implementation(tokens):
    moejit.register_hf()
    model = build_model("mixtral", experts_implementation="moejit")
    assert model.config._experts_implementation == "moejit"
    ref_model = build_model("mixtral", experts_implementation="eager")
    with torch.no_grad():
        assert rel_error(model(tokens).logits, ref_model(tokens).logits) < TOLERANCE[torch.float32]


def test_patch(family, device, tokens, caplog):
    model = build_model(family, device=device)
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(tokens.to(device)).logits
        with caplog.at_level(logging.INFO, logger="moejit"):
            assert moejit.patch(model) is model
        assert model.config._experts_implementation == "moejit"
        out = model(tokens.to(device)).logits
    assert rel_error(out, ref) < TOLERANCE[torch.float32]
    # One distinct experts config (and one whole-block config) per model here, compiled (CPU: validated)
    # once for all its layers.
    assert any(f"{moe_layer_count(model)} module(s)" in r.getMessage() for r in caplog.records)


def test_forward_builds_the_config_once(monkeypatch, tokens):
    model = moejit.patch(build_model("qwen3_next"))
    calls = []
    real = moejit.hf.experts_config_json
    monkeypatch.setattr(moejit.hf, "experts_config_json", lambda *a: calls.append(a) or real(*a))
    with torch.no_grad():
        model(tokens)
        model(tokens[:, :3])
    assert calls == []  # patch() built it; both layers and both calls reuse the cached string


def test_expert_parallel_sentinels(device):
    """Ids >= num_experts (HF's expert-parallel sentinel) with weight 0 contribute nothing."""
    model = build_model("qwen3_moe", device=device)
    module = experts_module(model)
    hidden, ids, weights = random_routing(module, tokens=8, topk=2, dtype=torch.float32, device=device)
    moejit.register_hf()
    model.set_experts_implementation("moejit")
    with torch.no_grad():
        sentinel_ids, dropped = ids.clone(), weights.clone()
        sentinel_ids[::2, 1] = module.num_experts
        dropped[::2, 1] = 0
        out = module(hidden, sentinel_ids, dropped)
        model.set_experts_implementation("eager")
        ref = module(hidden, ids, dropped)
    assert rel_error(out, ref) < TOLERANCE[torch.float32]


def test_patch_refuses_unsupported_activation_before_changing_anything():
    model = build_model("mixtral", hidden_act="relu")
    with pytest.raises(NotImplementedError, match="relu"):
        moejit.patch(model)
    assert model.config._experts_implementation != "moejit"


def test_unsupported_activation_in_forward_is_not_implemented():
    model = build_model("qwen3_moe", hidden_act="relu2")
    module = experts_module(model)
    hidden, ids, weights = random_routing(module, 4, 2, torch.float32, "cpu")
    with pytest.raises(NotImplementedError, match="relu2"):
        moejit.hf.moejit_experts_forward(module, hidden, ids, weights)


@pytest.mark.parametrize("attr,value,message", [
    ("has_bias", True, "bias"),
    ("is_transposed", True, "transposed"),
    ("has_gate", False, "gate"),
    ("is_concatenated", False, "interleaved"),
])
def test_unsupported_layouts_are_refused(attr, value, message):
    model = build_model("mixtral")
    module = experts_module(model)
    setattr(module, attr, value)
    hidden, ids, weights = random_routing(module, 4, 2, torch.float32, "cpu")
    with pytest.raises(ValueError, match=message):
        moejit.hf.moejit_experts_forward(module, hidden, ids, weights)
    with pytest.raises(ValueError, match=message):
        moejit.patch(model)


def test_non_contiguous_expert_weight_is_value_error():
    model = build_model("mixtral")
    module = experts_module(model)
    with torch.no_grad():
        # Right shape [E, H, I], transposed strides.
        E, H, I = module.down_proj.shape
        module.down_proj = torch.nn.Parameter(torch.randn(E, I, H).transpose(1, 2))
    hidden, ids, weights = random_routing(module, 4, 2, torch.float32, "cpu")
    with pytest.raises(ValueError, match="contiguous"):
        moejit.hf.moejit_experts_forward(module, hidden, ids, weights)


def test_wrong_weight_shape_names_the_tensor():
    model = build_model("mixtral")
    module = experts_module(model)
    with torch.no_grad():
        module.down_proj = torch.nn.Parameter(module.down_proj[:, :-1].contiguous())
    hidden, ids, weights = random_routing(module, 4, 2, torch.float32, "cpu")
    with pytest.raises(ValueError, match="w2"):
        moejit.hf.moejit_experts_forward(module, hidden, ids, weights)


def test_config_from_hf_experts():
    model = build_model("deepseek_v3", dtype=torch.bfloat16)
    cfg = moejit.MoeConfig.from_hf_experts(experts_module(model), top_k=2)
    assert (cfg.experts, cfg.topk, cfg.hidden, cfg.moe_intermediate, cfg.activation, cfg.dtype) == \
        (8, 2, 64, 32, "silu", "bf16")
    assert moejit.compile(cfg, "cpu")["kernels"] == 0


def test_patch_needs_experts_modules():
    with pytest.raises(ValueError, match="no experts modules"):
        moejit.patch(torch.nn.Linear(4, 4))
