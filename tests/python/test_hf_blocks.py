"""Whole Hugging Face MoE blocks on one moejit call (hf_blocks): after moejit.patch the blocks of every
family SPEC.md covers compute routing, experts, combine and the shared experts (in the layer's GEMMs,
or as its residual) in one torch.ops.moejit.moe_layer_gate (the router's linear too) or moe_layer,
equal to transformers' own forward; training falls back to the block's own forward."""

import copy
import json
import logging

import pytest
import torch

from conftest import BLOCK_FAMILIES, FAMILIES, HIDDEN, TOLERANCE, VOCAB, build_model, moe_layer_count, rel_error


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


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
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


@pytest.mark.parametrize("family, router_in_call_above_decode",
                         [("qwen3_moe", False), ("deepseek_v3", True), ("gpt_oss", False)])
def test_router_linear_joins_the_call_where_it_was_faster(family, router_in_call_above_decode):
    """bf16: the router's linear runs in the call (moe_layer_gate) at decode, beside it (torch's linear,
    then moe_layer) above; DeepSeek-V3's fp32 router in the call at every T; gpt-oss's router with its
    bias (gate_bias) as the others. Both equal transformers."""
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


# Families whose shared experts are one plain gated MLP that the layer computes (n_shared_experts 1);
# DeepSeek-V2 with its two shared experts keeps them as the residual (hf_blocks' docstring says why).
FUSED = [("deepseek_v3", {}), ("glm4_moe", {}), ("deepseek_v2", {"n_shared_experts": 1})]


def moe_blocks(model):
    return [m for _, m in model.named_modules() if getattr(m, "_moejit_whole_block", None)]


def storage_bytes(model) -> int:
    """Bytes of the distinct storages behind the model's parameters."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())


@pytest.fixture
def refuse_shared_mlp():
    """Makes every shared MLP of a model fail if called: a fused block computes it in the layer."""
    handles = []

    def install(model):
        def refuse(module, args):
            raise AssertionError("the shared MLP was called")

        for block in moe_blocks(model):
            handles.append(block.shared_experts.register_forward_pre_hook(refuse))

    yield install
    for h in handles:
        h.remove()


@pytest.mark.parametrize("family, overrides", FUSED, ids=[f for f, _ in FUSED])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_experts_fused_in_the_call(family, overrides, dtype, caplog, refuse_shared_mlp):
    """One call per block computes routed and shared experts (no torch shared MLP, no residual), equal
    to transformers at T = 1, 7 and 33: both ops (moe_layer_gate at decode and for the bf16 models' fp32
    routers, moe_layer above decode in fp32)."""
    moejit = moejit_module()
    bound = moejit.hf_blocks.ROUTER_IN_LAYER_MAX_TOKENS
    model = build_model(family, dtype=dtype, **overrides)
    g = torch.Generator().manual_seed(5)
    batches = {T: torch.randint(0, VOCAB, (1, T), generator=g) for T in (1, 7, bound + 1)}
    with torch.no_grad():
        model.set_experts_implementation("eager")
        refs = {T: model(ids).logits.float() for T, ids in batches.items()}
        with caplog.at_level(logging.INFO, logger="moejit"):
            moejit.patch(model)
        blocks = moe_blocks(model)
        assert len(blocks) == moe_layer_count(model)
        for block in blocks:
            config = json.loads(block._moejit_whole_block)
            assert config["fuse_shared_experts"] and config["n_shared_experts"] == 1
        assert sum("1 shared expert(s) fused in the call" in r.getMessage() for r in caplog.records) == len(blocks)
        refuse_shared_mlp(model)
        for T, ids in batches.items():
            ops, out = _moejit_ops_run(model, ids)
            gate_in_call = T <= bound or dtype != torch.float32
            assert ops == ({"moejit::moe_layer_gate"} if gate_in_call else {"moejit::moe_layer"}), (T, ops)
            assert rel_error(out, refs[T]) < TOLERANCE[dtype], T


@pytest.mark.parametrize("T", [0, 1, 5, 33])
def test_fused_block_at_any_token_count(T):
    """The block alone on [T, H] and [1, T, H] hidden states, T = 0 included, against its own forward."""
    moejit = moejit_module()
    model = build_model("deepseek_v3")
    block = model.model.layers[0].mlp
    x = torch.randn(T, HIDDEN, generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        ref = block(x)
        moejit.patch(model)
        assert json.loads(block._moejit_whole_block)["fuse_shared_experts"]
        out, out3 = block(x), block(x[None])
    assert out.shape == (T, HIDDEN) and out3.shape == (1, T, HIDDEN)
    if T:
        assert rel_error(out, ref) < TOLERANCE[torch.float32]
        assert torch.equal(out3[0], out)


def test_packed_weights_are_views_not_copies():
    """Patching moves each block's routed and shared weights into w13 [E+1, 2I, H] and w2 [E+1, H, I]:
    the parameters view them (same Parameter objects, same values), no byte is held twice."""
    moejit = moejit_module()
    model = build_model("deepseek_v3")
    block = model.model.layers[0].mlp
    params_before = dict(model.named_parameters())
    values_before = {k: v.detach().clone() for k, v in params_before.items()}
    bytes_before = storage_bytes(model)
    moejit.patch(model)
    assert storage_bytes(model) == bytes_before
    assert dict(model.named_parameters()) == params_before  # the same objects, re-pointed
    assert all(torch.equal(p, values_before[k]) for k, p in model.named_parameters())
    w13, w2 = block._moejit_w13, block._moejit_w2
    E, I = block.experts.num_experts, block.experts.intermediate_dim
    assert w13.shape == (E + 1, 2 * I, HIDDEN) and w2.shape == (E + 1, HIDDEN, I)
    for param, start in ((block.experts.gate_up_proj, w13[0]), (block.shared_experts.gate_proj.weight, w13[E, :I]),
                         (block.shared_experts.up_proj.weight, w13[E, I:]), (block.experts.down_proj, w2[0]),
                         (block.shared_experts.down_proj.weight, w2[E])):
        assert param.untyped_storage().data_ptr() in (w13.untyped_storage().data_ptr(),
                                                      w2.untyped_storage().data_ptr())
        assert param.data_ptr() == start.data_ptr()


def test_fallback_forward_uses_the_views(tokens):
    """With gradients on, a fused block runs its own forward on the re-pointed parameters: equal to
    transformers, gradients land on them; an in-place update of them (an optimizer step) is what the
    fused call computes with next."""
    moejit = moejit_module()
    model = build_model("deepseek_v3")
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(tokens).logits
    moejit.patch(model)
    out = model(tokens).logits  # gradients on: the block's own forward
    assert rel_error(out, ref) < TOLERANCE[torch.float32]
    out.square().mean().backward()
    block = model.model.layers[0].mlp
    params = [block.experts.gate_up_proj, block.experts.down_proj, block.shared_experts.gate_proj.weight,
              block.shared_experts.up_proj.weight, block.shared_experts.down_proj.weight]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    torch.optim.SGD(model.parameters(), lr=5.0).step()
    with torch.no_grad():
        fused = model(tokens).logits
    assert rel_error(fused, ref) > 1e-3  # the step changed the model ...
    assert rel_error(fused, model(tokens).logits.detach()) < TOLERANCE[torch.float32]  # ... for both paths


def test_state_dict_and_save_pretrained_after_fusing(tmp_path, tokens):
    """state_dict keeps its keys and values; its tensors alias the parameters without sharing a storage
    between keys, so save_pretrained writes them without cloning; the saved model loads into
    transformers and into a patched model (in place, and with assign=True: packed again)."""
    from transformers.pytorch_utils import id_tensor_storage

    moejit = moejit_module()
    model = build_model("deepseek_v3")
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(tokens).logits
        keys_before = list(model.state_dict())
        moejit.patch(model)
        state = model.state_dict()
        assert list(state) == keys_before
        params = dict(model.named_parameters())
        assert all(state[k].data_ptr() == p.data_ptr() for k, p in params.items())
        storages = [id_tensor_storage(t) for t in state.values()]
        assert len(set(storages)) == len(storages)
        model.save_pretrained(tmp_path)
        reloaded = type(model).from_pretrained(tmp_path).eval()
        assert rel_error(reloaded(tokens).logits, ref) < TOLERANCE[torch.float32]

        other = moejit.patch(build_model("deepseek_v3", seed=1))
        block = other.model.layers[0].mlp
        w13 = block._moejit_w13
        other.load_state_dict(model.state_dict())
        assert block._moejit_w13 is w13  # copied into the views
        assert rel_error(other(tokens).logits, ref) < TOLERANCE[torch.float32]

        assigned = moejit.patch(build_model("deepseek_v3", seed=1))
        assigned.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
        assert moejit.hf_blocks._aliases_packed(assigned.model.layers[0].mlp)
        assert rel_error(assigned(tokens).logits, ref) < TOLERANCE[torch.float32]


def test_conversions_and_copies_keep_one_packed_copy(tokens):
    """model.to(dtype) converts the packed tensors and keeps the parameters their views (half the bytes,
    nothing held twice); a conversion that copies every tensor, and a deepcopy, are packed again; a
    deepcopy's fallback runs its own block."""
    moejit = moejit_module()
    model = moejit.patch(build_model("deepseek_v3"))
    block = model.model.layers[0].mlp
    bytes_fp32 = storage_bytes(model)
    half = copy.deepcopy(model).to(torch.bfloat16)
    half_block = half.model.layers[0].mlp
    assert moejit.hf_blocks._aliases_packed(half_block) and half_block._moejit_w13.dtype == torch.bfloat16
    assert storage_bytes(half) == bytes_fp32 // 2

    model._apply(lambda t: t.clone())
    assert moejit.hf_blocks._aliases_packed(block) and storage_bytes(model) == bytes_fp32

    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.model.layers[0].mlp.shared_experts.down_proj.weight.mul_(2)
        fused = twin(tokens).logits  # packs the twin's (deep-copied) parameters again
        assert rel_error(fused, model(tokens).logits) > 1e-3
    assert moejit.hf_blocks._aliases_packed(twin.model.layers[0].mlp)
    assert rel_error(twin(tokens).logits.detach(), fused) < TOLERANCE[torch.float32]  # its own fallback


def test_shared_experts_the_layer_does_not_compute_stay_the_residual(caplog, tokens):
    """Two shared experts (DeepSeek-V2's and V2-Lite's), a biased shared MLP (mlp_bias) and
    fuse_shared_experts=False keep the block whole with the shared MLP as the residual, each logged
    with the reason."""
    moejit = moejit_module()
    cases = [("deepseek_v2", {}, True, "n_shared_experts is 2"),
             ("deepseek_v3", {"n_shared_experts": 2}, True, "n_shared_experts is 2"),
             ("deepseek_v2", {"n_shared_experts": 1, "mlp_bias": True}, True, "biases"),
             ("deepseek_v3", {}, False, "fuse_shared_experts=False")]
    for family, overrides, fuse, why in cases:
        model = build_model(family, **overrides)
        with torch.no_grad():
            model.set_experts_implementation("eager")
            ref = model(tokens).logits
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="moejit"):
                moejit.patch(model, fuse_shared_experts=fuse)
            (block,) = moe_blocks(model)
            assert not json.loads(block._moejit_whole_block)["fuse_shared_experts"], (family, why)
            assert not hasattr(block, "_moejit_w13")
            assert any("runs whole" in r.getMessage() and "residual" in r.getMessage() and why in r.getMessage()
                       for r in caplog.records), (family, why)
            assert rel_error(model(tokens).logits, ref) < TOLERANCE[torch.float32], (family, why)


@pytest.mark.parametrize("topk_method", ["greedy", "group_limited_greedy"])
def test_deepseek_v2_routing(topk_method, tokens):
    """DeepSeek-V2's router (softmax; greedy or groups by their best expert; scaled, never
    renormalized, even with norm_topk_prob set) in the call equals transformers'."""
    moejit = moejit_module()
    model = build_model("deepseek_v2", topk_method=topk_method, norm_topk_prob=True, n_shared_experts=1)
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(tokens).logits
        moejit.patch(model)
        config = json.loads(moe_blocks(model)[0]._moejit_whole_block)
        assert config["topk_method"] == topk_method and not config["renormalize"]
        assert rel_error(model(tokens).logits, ref) < TOLERANCE[torch.float32]


def test_deepseek_v2_router_variant_without_a_rule_is_not_taken():
    moejit = moejit_module()
    block = build_model("deepseek_v2").model.layers[0].mlp
    block.gate.topk_method = "noaux_tc"  # DeepseekV2TopkRouter computes only greedy and group_limited_greedy
    config, why = moejit.hf_blocks.block_rule(block)
    assert config is None and "topk_method 'noaux_tc'" in why


def test_top_k_beyond_the_kept_groups_is_not_taken():
    """4 of 8 experts in the one kept group of 2, top-5: routing could not pick 5 distinct allowed
    experts (transformers picks an excluded one), so the block keeps its own routing."""
    moejit = moejit_module()
    block = build_model("deepseek_v3").model.layers[0].mlp
    block.gate.top_k = 5
    config, why = moejit.hf_blocks.block_rule(block)
    assert config is None and "top-k 5 is more than the experts in the 1 kept group(s) of 2" in why


def test_gpt_oss_block_is_one_call_with_its_router_bias(tokens):
    """GptOssMLP taken whole: the router's weight and bias and the repacked experts in one moe_layer_gate
    call at decode; the block returns (out, None) (GptOssDecoderLayer drops the router scores); the
    bias is part of the call (zeroing it in the model changes the output); a changed weight is
    repacked; the fallbacks give the block's own (out, scores)."""
    moejit = moejit_module()
    model = build_model("gpt_oss")
    block = model.model.layers[0].mlp
    with torch.no_grad():
        block.router.bias.mul_(20.0)  # routes the bias decides
        model.set_experts_implementation("eager")
        ref = model(tokens).logits
        moejit.patch(model)
        config = json.loads(block._moejit_whole_block)
        assert (config["activation"], config["expert_bias"], config["router_gemm"]) == ("swigluoai", True, False)
        ops, out = _moejit_ops_run(model, tokens)
        assert ops == {"moejit::moe_layer_gate"}
        assert rel_error(out, ref) < TOLERANCE[torch.float32]
        x = torch.randn(1, 5, 64)
        got, scores = block(x)
        assert scores is None and got.shape == x.shape
        saved = block.router.bias.clone()
        block.router.bias.zero_()
        zeroed = model(tokens).logits
        assert rel_error(zeroed, ref) > 1e-2
        block.router.bias.copy_(saved)
        # A weight written in place is repacked before the next call (its version counter moved).
        before = block.experts._moejit_packed[1][0]
        block.experts.gate_up_proj.mul_(1.0)
        assert rel_error(model(tokens).logits, ref) < TOLERANCE[torch.float32]
        assert block.experts._moejit_packed[1][0] is not before
        # The fallbacks: the block's own forward, router scores included.
        model.config.output_router_logits = True
        own_out, own_scores = block(x)
        model.config.output_router_logits = False
    assert own_scores is not None and own_scores.shape == (5, 2)
    assert rel_error(own_out, got) < TOLERANCE[torch.float32]


def test_gpt_oss_experts_run_on_moejit(tokens):
    """Without whole blocks, GptOssExperts runs on torch.ops.moejit.experts (hf.py) from its repacked
    weights, as transformers' eager experts compute."""
    moejit = moejit_module()
    model = build_model("gpt_oss", dtype=torch.bfloat16)
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(tokens).logits.float()
        moejit.patch(model, whole_blocks=False)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = model(tokens).logits.float()
    assert "moejit::experts" in {e.name for e in prof.events()}
    assert rel_error(out, ref) < TOLERANCE[torch.bfloat16]


def test_gpt_oss_under_torch_compile(tokens):
    """A patched gpt-oss block traces whole (its weights packed at patch, outside the graph)."""
    moejit = moejit_module()
    model = moejit.patch(build_model("gpt_oss"))
    with torch.no_grad():
        eager = model(tokens).logits
        compiled = torch.compile(model, backend="moejit", fullgraph=True)
        out = compiled(tokens).logits
    assert rel_error(out, eager) < TOLERANCE[torch.float32]
