"""Whole Hugging Face MoE blocks on one moejit call (hf_blocks): after moejit.patch the blocks of every
family SPEC.md covers compute routing, experts, combine and the shared experts' residual in one
torch.ops.moejit.moe_layer_gate (the router's linear too) or moe_layer, equal to transformers' own
forward; training falls back to the block's own forward."""

import logging

import pytest
import torch

from conftest import FAMILIES, TOLERANCE, VOCAB, build_model, moe_layer_count, rel_error


def moejit_module():
    from conftest import moejit

    return moejit


@pytest.fixture
def raising_experts_implementation():
    """An experts implementation that fails if called: a whole block never calls its experts module."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    def refuse(self, *args, **kwargs):
        raise AssertionError("the experts module was called")

    ALL_EXPERTS_FUNCTIONS["moejit_test_refuse"] = refuse
    yield "moejit_test_refuse"
    del ALL_EXPERTS_FUNCTIONS["moejit_test_refuse"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_whole_blocks_match_transformers(family, dtype, device, tokens, caplog, raising_experts_implementation):
    moejit = moejit_module()
    model = build_model(family, dtype=dtype, device=device)
    tokens = tokens.to(device)
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(tokens).logits.float()
        with caplog.at_level(logging.INFO, logger="moejit"):
            moejit.patch(model)
        blocks = [m for _, m in model.named_modules() if getattr(m, "_moejit_whole_block", None)]
        assert len(blocks) == moe_layer_count(model)
        assert sum("runs whole on moejit" in r.getMessage() for r in caplog.records) == len(blocks)
        # Every block runs whole: the experts modules are not called at all.
        model.set_experts_implementation(raising_experts_implementation)
        out = model(tokens).logits.float()
    # The logits pass the whole model after the MoE layers: bf16 rounding of the top-k weights
    # (transformers rounds Qwen's to bf16, moejit keeps fp32) moves them within bf16's tolerance.
    assert rel_error(out, ref) < TOLERANCE[dtype]


def test_training_falls_back_to_the_blocks_own_forward(tokens, raising_experts_implementation):
    moejit = moejit_module()
    model = moejit.patch(build_model("deepseek_v3"))
    model.set_experts_implementation(raising_experts_implementation)
    model.train()
    with pytest.raises(AssertionError, match="the experts module was called"):
        model(tokens)
    model.eval()
    with torch.no_grad():
        model(tokens)


def test_router_logits_requested_fall_back(tokens):
    """output_router_logits, in the config or as a forward argument, gets transformers' router logits
    and auxiliary loss (the block runs its own router, which records them)."""
    moejit = moejit_module()
    model = build_model("mixtral")
    with torch.no_grad():
        ref = model(tokens, output_router_logits=True)
        moejit.patch(model)
        out = model(tokens, output_router_logits=True)
        assert len(out.router_logits) == len(ref.router_logits) and torch.allclose(out.aux_loss, ref.aux_loss)
        model.config.output_router_logits = True
        assert len(model(tokens).router_logits) == len(ref.router_logits)


def test_gradients_fall_back(tokens, raising_experts_implementation):
    moejit = moejit_module()
    model = moejit.patch(build_model("qwen3_moe"))
    model.set_experts_implementation(raising_experts_implementation)
    with pytest.raises(AssertionError, match="the experts module was called"):
        model(tokens)  # eval mode, but gradients on: the block's own forward


def test_blocks_without_a_rule_are_logged_and_keep_their_routing(caplog):
    moejit = moejit_module()
    model = build_model("qwen3_moe")
    block = dict(model.named_modules())["model.layers.0.mlp"]

    class CustomMoeBlock(torch.nn.Module):  # a block of a family moejit has no whole-block rule for
        def __init__(self, inner):
            super().__init__()
            self.gate, self.experts = inner.gate, inner.experts

        def forward(self, x):
            return x

    custom = CustomMoeBlock(block)
    config, why = moejit.hf_blocks.block_rule(custom)
    assert config is None and "no whole-block rule for CustomMoeBlock" in why
    model.model.layers[0].mlp = custom
    with caplog.at_level(logging.INFO, logger="moejit"):
        moejit.patch(model, precompile=False)
    assert any("CustomMoeBlock) not taken whole" in r.getMessage() for r in caplog.records)
    assert getattr(custom, "_moejit_whole_block", None) is None


def test_patch_without_whole_blocks_keeps_hf_routing(tokens):
    moejit = moejit_module()
    model = moejit.patch(build_model("qwen3_moe"), whole_blocks=False)
    assert not any(getattr(m, "_moejit_whole_block", None) for m in model.modules())


@pytest.mark.parametrize("backend", ["moejit", "inductor"])
def test_whole_blocks_under_torch_compile(backend, tokens):
    """A patched block traces into one moejit node; compiled output equals eager."""
    moejit = moejit_module()
    model = moejit.patch(build_model("deepseek_v3"))
    with torch.no_grad():
        eager = model(tokens).logits
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        out = compiled(tokens).logits
    assert rel_error(out, eager) < TOLERANCE[torch.float32]


def _moejit_ops_run(model, ids):
    """The moejit layer ops one forward runs (torch.profiler's CPU op events), and its logits."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = model(ids).logits.float()
    return {e.name for e in prof.events() if e.name.startswith("moejit::moe_layer")}, out


@pytest.mark.parametrize("family, router_in_call_above_decode", [("qwen3_moe", False), ("deepseek_v3", True)])
def test_router_linear_joins_the_call_where_it_was_faster(family, router_in_call_above_decode):
    """bf16: the router's linear runs in the call (moe_layer_gate) at decode, beside it (torch's linear,
    then moe_layer) above; DeepSeek-V3's fp32 router in the call at every T. Both equal transformers."""
    moejit = moejit_module()
    hf_blocks = moejit.hf_blocks
    model = build_model(family, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    batches = {T: torch.randint(0, VOCAB, (1, T), generator=g)
               for T in (1, hf_blocks.ROUTER_IN_LAYER_MAX_TOKENS, hf_blocks.ROUTER_IN_LAYER_MAX_TOKENS + 1)}
    with torch.no_grad():
        model.set_experts_implementation("eager")
        refs = {T: model(ids).logits.float() for T, ids in batches.items()}
        moejit.patch(model)
        for T, ids in batches.items():
            ops, out = _moejit_ops_run(model, ids)
            in_call = T <= hf_blocks.ROUTER_IN_LAYER_MAX_TOKENS or router_in_call_above_decode
            assert ops == ({"moejit::moe_layer_gate"} if in_call else {"moejit::moe_layer"}), (T, ops)
            assert rel_error(out, refs[T]) < TOLERANCE[torch.bfloat16], T
