"""Fixtures of the moejit Python tests: devices, tiny random Hugging Face MoE models, tolerances.

Run from the repository root: PYTHONPATH=python python3 -m pytest -q tests/python
ctest (label cpu) runs it with --moejit-library=<the build's libmoejit_torch.so>, so a build folder
other than build/ tests its own library. CUDA cases run only where torch.cuda.is_available().
"""

import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "python"))

import torch._inductor.config  # noqa: E402

# Inductor's CPU path compiles C++; on a 2-core machine a pool of compile workers and SIMD variants
# only add start-up time for these tiny graphs.
torch._inductor.config.compile_threads = 1
torch._inductor.config.cpp.vec_isa_ok = False

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# SPEC.md: relative Frobenius error against a reference. fp32 is SPEC's 1e-5 (the CPU kernel sums in
# a different order than eager's matmuls, which moves fp32 results by ~1e-7); bf16 is SPEC's 2e-2.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}

FAMILIES = ["mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe", "deepseek_v2", "qwen3_next"]
# Families whose MoE block moejit runs whole (hf_blocks): gpt-oss too, whose experts module is not
# the [E, 2I, H] layout the FAMILIES tests take (biases, interleaved, transposed: hf_gpt_oss).
BLOCK_FAMILIES = FAMILIES + ["gpt_oss"]

HIDDEN, MOE_INTERMEDIATE, VOCAB = 64, 32, 128


def pytest_addoption(parser):
    parser.addoption("--moejit-library", default=None,
                     help="load this libmoejit_torch.so before importing moejit (default: where moejit looks)")
    parser.addoption("--moejit-cli", default=str(ROOT / "build" / "moejit"),
                     help="the moejit command the CLI tests run (default: build/moejit)")


@pytest.fixture
def moejit_cli(request):
    path = pathlib.Path(request.config.getoption("--moejit-cli"))
    if not path.is_file():
        pytest.skip(f"no moejit command at {path} (build it, or pass --moejit-cli)")
    return path


def pytest_configure(config):
    path = config.getoption("--moejit-library")
    if path:
        # moejit then finds the ops registered and loads no other copy.
        torch.ops.load_library(str(pathlib.Path(path).resolve()))
    global moejit
    import moejit  # noqa: F401  (loads the op library; an ImportError here lists where it looked)


moejit = None  # imported by pytest_configure, after --moejit-library


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _config(family: str, **overrides):
    transformers = pytest.importorskip("transformers")
    common = dict(hidden_size=HIDDEN, vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64)
    if family == "mixtral":
        kw = dict(common, intermediate_size=MOE_INTERMEDIATE, num_local_experts=4, num_experts_per_tok=2,
                  num_hidden_layers=1)
        cls, model_cls = transformers.MixtralConfig, transformers.MixtralForCausalLM
    elif family == "qwen3_moe":
        kw = dict(common, intermediate_size=96, moe_intermediate_size=MOE_INTERMEDIATE, num_experts=8,
                  num_experts_per_tok=2, num_hidden_layers=1, head_dim=16, norm_topk_prob=True)
        cls, model_cls = transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM
    elif family == "deepseek_v3":
        kw = dict(common, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=MOE_INTERMEDIATE,
                  n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=0,
                  n_shared_experts=1, num_hidden_layers=1, q_lora_rank=None, kv_lora_rank=16,
                  qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, routed_scaling_factor=2.5)
        cls, model_cls = transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM
    elif family == "glm4_moe":
        kw = dict(common, intermediate_size=96, moe_intermediate_size=MOE_INTERMEDIATE, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=0, n_shared_experts=1,
                  num_hidden_layers=1, head_dim=16, routed_scaling_factor=2.5)
        cls, model_cls = transformers.Glm4MoeConfig, transformers.Glm4MoeForCausalLM
    elif family == "deepseek_v2":
        # DeepSeek-V2's router: softmax, groups scored by their best expert, no renormalization; two
        # shared experts, as DeepSeek-V2 and V2-Lite have (so the shared MLP stays the residual).
        kw = dict(common, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=MOE_INTERMEDIATE,
                  n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                  topk_method="group_limited_greedy", first_k_dense_replace=0, n_shared_experts=2, num_hidden_layers=1,
                  q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                  routed_scaling_factor=1.5)
        cls, model_cls = transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM
    elif family == "gpt_oss":
        kw = dict(common, intermediate_size=MOE_INTERMEDIATE, num_local_experts=8, num_experts_per_tok=2,
                  num_hidden_layers=1, head_dim=16, layer_types=["full_attention"],
                  # Plain RoPE: GptOssConfig's YaRN defaults are for 131072 positions, not 64.
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0))
        cls, model_cls = transformers.GptOssConfig, transformers.GptOssForCausalLM
    elif family == "qwen3_next":
        kw = dict(common, intermediate_size=96, moe_intermediate_size=MOE_INTERMEDIATE,
                  shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                  head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                  linear_value_head_dim=16,
                  # The MoE block is the same after either attention; the linear-attention reference
                  # code is slow to run and to compile on CPU.
                  layer_types=["full_attention", "full_attention"])
        cls, model_cls = transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM
    else:
        raise ValueError(family)
    kw.update(overrides)
    return cls(**kw), model_cls


def build_model(family: str, dtype=torch.float32, device="cpu", seed=0, **overrides):
    """A tiny random model of the family in eval mode: hidden 64, moe_intermediate 32, 4-8 experts,
    1-2 layers, weights ~ N(0, 0.1) so every expert contributes visibly."""
    config, model_cls = _config(family, **overrides)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
    return model.to(device=device, dtype=dtype)


def moe_layer_count(model) -> int:
    return len(moejit.hf.find_experts_modules(model))


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every test compiles from scratch and sees only its own counters and backend reports."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    moejit.dynamo.clear_reports()
    yield
    torch._dynamo.reset()
