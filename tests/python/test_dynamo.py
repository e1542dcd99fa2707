"""The "moejit" torch.compile backend: HF experts regions rewritten into moejit ops, the rest to inductor.

Inductor's C++ compile costs ~10 s per tiny model on a 2-core CPU, so most cases check the rewrite
with the `inductor_off` fixture (the rewritten graph runs as FX code); the test_inductor_* cases run
the whole path through inductor.
"""

import logging

import pytest
import torch
import torch._dynamo
from torch import nn

import moejit
from moejit import dynamo as mdynamo

from conftest import TOLERANCE, build_model, moe_layer_count, rel_error

pytest.importorskip("transformers")


def compiled_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def moejit_nodes(gm) -> int:
    return sum(n.op == "call_function" and n.target == torch.ops.moejit.experts.default for n in gm.graph.nodes)


@pytest.fixture
def inductor_off(monkeypatch):
    """Replaces inductor's compile_fx with running the graph the backend hands it; yields the
    (graph, config_patches) it was given, first call first."""
    import torch._inductor.compile_fx as cfx

    handed = []

    def run_graph(gm, example_inputs, config_patches=None, **kw):
        handed.append((gm, dict(config_patches or {})))
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", run_graph)
    return handed


def _lengths(tokens, *lengths):
    for n in lengths:
        x = tokens[:, :n].contiguous()
        torch._dynamo.mark_dynamic(x, 1)  # dynamic sequence length, so T = batch * length is symbolic
        yield x


def test_backend_is_registered():
    assert "moejit" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("moejit") is mdynamo.moejit_backend


# --- Hugging Face models ---------------------------------------------------------------------------

def test_grouped_mm_regions_become_moejit_ops(family, device, tokens, inductor_off, caplog):
    """Default experts implementation (grouped_mm): one graph, and the graph handed on has one
    moejit op per MoE layer and no grouped_mm left; the output matches eager."""
    model = build_model(family, device=device)
    assert model.config._experts_implementation == "grouped_mm"
    x = tokens.to(device)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="moejit"):
        ref = model(x).logits
        out = torch.compile(model, backend="moejit", fullgraph=True)(x).logits
    assert compiled_graphs() == 1
    layers = moe_layer_count(model)
    (report,) = mdynamo.reports()
    assert len(report.replaced) == layers and report.skipped == []
    assert all(path.endswith("mlp.experts") for path, _ in report.replaced)
    ((gm, _),) = inductor_off
    assert moejit_nodes(gm) == layers
    assert not any("grouped_mm" in str(n.target) for n in gm.graph.nodes)
    assert sum("replaced" in r.getMessage() for r in caplog.records) == layers
    assert rel_error(out, ref) < TOLERANCE[torch.float32]


def test_bf16_regions(device, tokens, inductor_off):
    model = build_model("qwen3_moe", dtype=torch.bfloat16, device=device)
    x = tokens.to(device)
    with torch.no_grad():
        model.set_experts_implementation("eager")
        ref = model(x).logits
        model.set_experts_implementation("grouped_mm")
        out = torch.compile(model, backend="moejit", fullgraph=True)(x).logits
    (report,) = mdynamo.reports()
    assert len(report.replaced) == 1 and '"dtype":"bf16"' in report.replaced[0][1]
    assert rel_error(out, ref) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_next"])
@pytest.mark.parametrize("whole_blocks", [True, False])
def test_patched_model_keeps_its_moejit_ops(family, whole_blocks, tokens, inductor_off):
    """A patched model's moejit ops (whole blocks: moe_layer_gate, the fp32 router in the call; the
    experts implementation: experts): the backend counts the op nodes and has nothing to replace."""
    model = moejit.patch(build_model(family), whole_blocks=whole_blocks)
    with torch.no_grad():
        ref = model(tokens).logits
        out = torch.compile(model, backend="moejit", fullgraph=True)(tokens).logits
    assert compiled_graphs() == 1
    (report,) = mdynamo.reports()
    assert report.moejit_calls == {"moe_layer_gate" if whole_blocks else "experts": moe_layer_count(model)}
    assert report.replaced == [] and report.skipped == []
    assert rel_error(out, ref) < TOLERANCE[torch.float32]


def test_dynamic_token_count(tokens, inductor_off):
    model = build_model("deepseek_v3")
    compiled = torch.compile(model, backend="moejit", fullgraph=True)
    with torch.no_grad():
        for x in _lengths(tokens, 7, 3, 5):
            assert rel_error(compiled(x).logits, model(x).logits) < TOLERANCE[torch.float32]
    assert compiled_graphs() == 1
    (report,) = mdynamo.reports()
    assert len(report.replaced) == 1


def test_inductor_grouped_mm_dynamic(tokens):
    """The whole path: rewrite, then inductor compiles the rest and calls the op with a symbolic T."""
    model = build_model("qwen3_moe")
    compiled = torch.compile(model, backend="moejit", fullgraph=True)
    with torch.no_grad():
        for x in _lengths(tokens, 7, 4):
            assert rel_error(compiled(x).logits, model(x).logits) < TOLERANCE[torch.float32]
    assert compiled_graphs() == 1
    (report,) = mdynamo.reports()
    assert len(report.replaced) == 1 and report.skipped == []


def test_inductor_patched_model(tokens):
    model = build_model("mixtral")
    with torch.no_grad():
        ref = model(tokens).logits
        moejit.patch(model)
        out = torch.compile(model, backend="moejit", fullgraph=True)(tokens).logits
    assert compiled_graphs() == 1
    (report,) = mdynamo.reports()
    assert report.moejit_calls == {"moe_layer_gate": 1}  # the whole block with its router (hf_blocks)
    assert rel_error(out, ref) < TOLERANCE[torch.float32]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("patched", [False, True])
def test_inductor_reduce_overhead_has_no_cudagraph_skips(patched, tokens):
    model = build_model("qwen3_moe", dtype=torch.bfloat16, device="cuda")
    if patched:
        moejit.patch(model)
    x = tokens.cuda()
    compiled = torch.compile(model, backend="moejit", fullgraph=True, mode="reduce-overhead")
    with torch.no_grad():
        ref = model(x).logits
        for _ in range(3):  # warm-up, record, replay
            out = compiled(x).logits.clone()
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0
    (report,) = mdynamo.reports()
    assert len(report.replaced) + sum(report.moejit_calls.values()) == 1
    assert rel_error(out, ref) < TOLERANCE[torch.bfloat16]


# --- the pattern, on hand-written experts modules (no transformers model) ----------------------------

class ToyExperts(nn.Module):
    """Gated experts as HF stores them, computed densely with a pluggable gate."""

    def __init__(self, E=4, H=16, I=8, act=None, gate="default"):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * I, H, generator=g) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(E, H, I, generator=g) * 0.2)
        self.act_fn, self.gate = act if act is not None else nn.SiLU(), gate

    def forward(self, hidden, ids, weights):
        g1 = torch.einsum("th,tknh->tkn", hidden, self.gate_up_proj[ids])  # [T, K, 2I]
        gate, up = g1.chunk(2, dim=-1)
        act = self.act_fn(gate) * up if self.gate == "default" else self.act_fn(gate) * up * 2.0
        y = torch.einsum("tki,tkhi->tkh", act, self.down_proj[ids])
        return (y * weights.unsqueeze(-1)).sum(1).to(hidden.dtype)


class ToyBlock(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.router = nn.Linear(16, 4, bias=False)
        self.experts = ToyExperts(**kw)

    def forward(self, x):
        w, ids = self.router(x).softmax(-1).topk(2, -1)
        return self.experts(x, ids, w) + x


@pytest.mark.parametrize("act,replaced", [
    (nn.SiLU(), True),
    (nn.GELU(), True),
    (nn.GELU(approximate="tanh"), True),
    (nn.ReLU(), False),
])
def test_toy_experts_activation(act, replaced, inductor_off):
    block = ToyBlock(act=act).requires_grad_(False)
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(2))
    out = torch.compile(block, backend="moejit", fullgraph=True)(x)
    (report,) = mdynamo.reports()
    assert len(report.replaced) == int(replaced)
    if not replaced:
        assert "activation" in report.skipped[0][1]
    assert moejit_nodes(inductor_off[0][0]) == int(replaced)
    assert rel_error(out, block(x)) < TOLERANCE[torch.float32]


def test_toy_experts_with_a_custom_gate_are_left_alone(inductor_off):
    block = ToyBlock(gate="scaled").requires_grad_(False)
    x = torch.randn(6, 16)
    out = torch.compile(block, backend="moejit", fullgraph=True)(x)
    (report,) = mdynamo.reports()
    # The structure matches (act(gate) * up); the numerical check catches the extra factor.
    assert report.replaced == [] and "something else" in report.skipped[0][1]
    assert moejit_nodes(inductor_off[0][0]) == 0
    assert rel_error(out, block(x)) < TOLERANCE[torch.float32]


def test_region_needing_grad_is_left_alone(caplog, inductor_off):
    block = ToyBlock()  # trainable weights, grad mode on: moejit has no backward
    x = torch.randn(6, 16)
    with caplog.at_level(logging.WARNING, logger="moejit"):
        out = torch.compile(block, backend="moejit", fullgraph=True)(x)
    (report,) = mdynamo.reports()
    assert report.replaced == [] and "gradient" in report.skipped[0][1]
    assert any("left" in r.getMessage() and "gradient" in r.getMessage() for r in caplog.records)
    out.sum().backward()
    assert block.experts.gate_up_proj.grad is not None


def test_mode_and_options_reach_inductor(inductor_off):
    block = ToyBlock().requires_grad_(False)
    x = torch.randn(6, 16)
    torch.compile(block, backend="moejit", fullgraph=True, options={"max_autotune": False})(x)
    torch._dynamo.reset()
    torch.compile(block, backend="moejit", fullgraph=True, mode="max-autotune-no-cudagraphs")(x)
    torch._dynamo.reset()
    torch.compile(block, backend="moejit", fullgraph=True, mode="reduce-overhead")(x)
    patches = [p for _, p in inductor_off]
    assert patches[0] == {"max_autotune": False}
    assert patches[1]["max_autotune"] is True and not patches[1].get("triton.cudagraphs")
    assert patches[2] == {"triton.cudagraphs": True}
    assert [len(r.replaced) for r in mdynamo.reports()] == [1, 1, 1]


def test_inductor_toy_block():
    block = ToyBlock(act=nn.GELU(approximate="tanh")).requires_grad_(False)
    x = torch.randn(5, 16)
    out = torch.compile(block, backend="moejit", fullgraph=True)(x)
    (report,) = mdynamo.reports()
    assert len(report.replaced) == 1 and '"activation":"gelu_tanh"' in report.replaced[0][1]
    assert rel_error(out, block(x)) < TOLERANCE[torch.float32]


def test_moejit_log_reports_replaced_regions(request):
    """MOEJIT_LOG=info (read by the C++ knobs) makes the backend say which regions it replaced."""
    import os
    import subprocess
    import sys

    library = request.config.getoption("--moejit-library", default=None)
    script = (
        # The op library named by --moejit-library loads before moejit, as conftest does, so moejit
        # finds the ops registered and loads no second copy.
        "import sys; sys.path.insert(0, {tests!r}); import torch\n"
        "{load}"
        "import moejit\n"
        "from conftest import build_model\n"
        "model = build_model('mixtral')\n"
        "ids = torch.randint(0, model.config.vocab_size, (1, 5))\n"
        "with torch.no_grad():\n"
        "    torch.compile(model, backend='moejit', fullgraph=True)(ids)\n"
    ).format(tests=os.path.dirname(__file__),
             load=f"torch.ops.load_library({str(library)!r})\n" if library else "")
    env = dict(os.environ, MOEJIT_LOG="info")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "..", "python"),
                                         env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "moejit backend: replaced" in result.stderr, result.stderr[-3000:]


def test_patched_model_across_the_decode_bound(inductor_off):
    """A whole block takes the router in the call at decode and torch's linear above it (hf_blocks):
    compiled with a dynamic token count on both sides of the bound, it matches eager on both."""
    model = moejit.patch(build_model("qwen3_moe"))
    bound = moejit.hf_blocks.ROUTER_IN_LAYER_MAX_TOKENS
    tokens = torch.randint(0, 128, (2, bound), generator=torch.Generator().manual_seed(4))
    compiled = torch.compile(model, backend="moejit", fullgraph=True)
    with torch.no_grad():
        for n in (7, bound // 2 + 4):  # T = 14 (decode) and T = 2 * (bound / 2 + 4) > bound
            x = tokens[:, :n].contiguous()
            torch._dynamo.mark_dynamic(x, 1)
            assert rel_error(compiled(x).logits, model(x).logits) < TOLERANCE[torch.float32], n
