"""bench/router_bench.py runs (a small layer on CPU) and the router GEMM in the layer agrees with the
router linear beside it: the benchmark the GPU session runs for issue 20's router GEMM."""

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_self_test_agrees(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("router_bench", ROOT / "bench" / "router_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.md"
    assert bench.main(["--self-test", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| small (self-test) |")]
    assert len(rows) == 2
    # DeepSeek-V3-style routers get fp32 logits, the others the model dtype.
    assert bench.preset_config("deepseek-v3", "bf16").router_dtype == "fp32"
    assert bench.preset_config("qwen3-30b-a3b", "bf16").router_dtype == "bf16"
