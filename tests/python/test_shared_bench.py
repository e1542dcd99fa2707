"""bench/shared_bench.py runs (a small layer on CPU) and the fused shared experts agree with the
shared MLP computed beside the layer: the benchmark the GPU session runs for issue 20's fused
shared experts."""

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_self_test_agrees(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("shared_bench", ROOT / "bench" / "shared_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.md"
    assert bench.main(["--self-test", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| small (self-test) |")]
    assert len(rows) == 2
    # The preset table is SPEC.md's: the shared-expert presets build valid fused configs.
    for name in bench.SHARED_EXPERTS:
        cfg = bench.preset_config(name, "bf16")
        assert cfg.n_shared_experts == bench.SHARED_EXPERTS[name]
