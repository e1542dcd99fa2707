"""bench/hf_model_bench.py runs (a tiny model on CPU) and its variants agree: the benchmark the GPU
session runs for whole blocks against experts-only and transformers' grouped_mm."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_tiny_run_agrees(tmp_path):
    spec = importlib.util.spec_from_file_location("hf_model_bench", ROOT / "bench" / "hf_model_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.md"
    assert bench.main(["--tiny", "--no-compile", "--out", str(out)]) == 0
    report = out.read_text()
    for variant in ("transformers batched_mm", "moejit experts (HF routing)", "moejit whole blocks"):
        assert f"| {variant} |" in report
