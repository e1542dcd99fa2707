"""The variant benchmarks the GPU sessions run for issue 20 (bench/shared_bench.py: the shared experts
in the layer against the shared MLP beside it; bench/router_bench.py: the router GEMM in the layer
against the router linear beside it) run on CPU with a small layer, and their variants agree."""

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(name):
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["shared_bench", "router_bench"])
def test_self_test_agrees(name, tmp_path):
    bench = load(name)
    out = tmp_path / "r.md"
    assert bench.main(["--self-test", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| small (self-test) |")]
    assert len(rows) == 2


def test_preset_configs():
    shared = load("shared_bench")
    # SPEC.md's presets with shared experts build valid fused configs.
    for name, count in shared.SHARED_EXPERTS.items():
        assert shared.preset_config(name, "bf16").n_shared_experts == count
    router = load("router_bench")
    # DeepSeek-V3-style routers get fp32 logits, the others the model dtype.
    assert router.preset_config("deepseek-v3", "bf16").router_dtype == "fp32"
    assert router.preset_config("qwen3-30b-a3b", "bf16").router_dtype == "bf16"
