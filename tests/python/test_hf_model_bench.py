"""bench/hf_model_bench.py runs (a tiny model on CPU) and its variants agree: the benchmark the GPU
session runs for whole blocks against experts-only and transformers' grouped_mm, and for DeepSeek-V3's
whole blocks with the shared expert fused against the shared MLP as the residual."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

VARIANTS = {
    "qwen3_moe": ["transformers batched_mm", "moejit experts (HF routing)", "moejit whole blocks"],
    "deepseek_v3": ["transformers batched_mm", "moejit experts (HF routing)",
                    "moejit whole blocks, shared experts fused", "moejit whole blocks, shared experts as residual"],
}


@pytest.mark.parametrize("model", sorted(VARIANTS))
def test_tiny_run_agrees(model, tmp_path):
    spec = importlib.util.spec_from_file_location("hf_model_bench", ROOT / "bench" / "hf_model_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.md"
    assert bench.main(["--tiny", "--model", model, "--no-compile", "--out", str(out)]) == 0
    report = out.read_text()
    rows = [line.split(" | ")[0].lstrip("| ") for line in report.splitlines() if line.startswith("| ")][1:]
    assert rows == VARIANTS[model]
