"""bench/moe_bench.py --targets (issue 21's points) without a GPU: the dry run's plan, the verdict of a
point, the summary, the saved table written, read back and compared, and the whole --self-test --targets
on tiny presets (CPU when there is no GPU). The Triton read kernel compiles to 16-byte loads for sm_90."""

import importlib.util
import json
import math
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from moebench import targets  # noqa: E402

# A point's arithmetic, in round numbers: 1 GB touched at 4 TB/s = 0.25 ms; 100 TFLOP at 800 TFLOP/s.
BW, MM = 4e12, 800e12


def plan_rows(output, preset):
    """{T: [cells]} of one preset's table in the dry run's output."""
    section = output.split(f"### {preset}:")[1].split("###")[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0].isdigit():
            rows[int(cells[0])] = cells
    return rows


def test_dry_run_targets_plans_every_point():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "moe_bench.py"), "--dry-run", "--targets"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "5 preset(s) x 19 token count(s) = 95 points" in out
    for preset in targets.TARGET_PRESETS:
        rows = plan_rows(out, preset)
        assert sorted(rows) == targets.TARGET_TOKENS
        # decode reads weights, the largest prefill computes
        assert rows[1][5] == "bandwidth" and rows[1][6].startswith("<=1.15x bw")
        assert rows[32768][5] == "compute" and rows[32768][6].startswith("<=1.25x")
    assert plan_rows(out, "qwen3-30b-a3b")[1][6] == "<=1.15x bw, <=21 us"
    assert plan_rows(out, "mixtral-8x7b")[2048][6] == "<=1.25x"
    assert plan_rows(out, "mixtral-8x7b")[4096][6] == "<=1.25x, >=680 TF/s"
    assert plan_rows(out, "deepseek-v3")[8192][6] == "<=1.25x, >=620 TF/s"
    assert plan_rows(out, "kimi-k2")[32768][6] == "<=1.25x"  # no prefill rate named for Kimi-K2
    # T=32768 at H=7168: 0.5 GB of inputs a call, so 4 buffers within the default 2 GiB
    assert plan_rows(out, "kimi-k2")[32768][8].startswith("4 x ")
    assert re.search(r"estimated wall: ~\d+ s", out)


def test_targets_need_targets():
    for flags in (["--save-table", "x.json"], ["--compare", "x.json"], ["--grouped-mm"]):
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "moe_bench.py"), "--dry-run", *flags],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode != 0 and "only with --targets" in done.stderr


def test_bandwidth_bound_point():
    v = targets.judge("deepseek-v3", 64, 0.25 * 1.10, 1e9, 1e9, BW, MM)
    assert (v.bound, round(v.floor_ms, 6), v.met, v.target_cell()) == ("bandwidth", 0.25, True, "<=1.15x bw")
    v = targets.judge("deepseek-v3", 64, 0.25 * 1.20, 1e9, 1e9, BW, MM)
    assert not v.met and v.missed == ["limit 1.15x"] and v.met_cell() == "MISSED"


def test_compute_bound_point_and_prefill_rate():
    flops = 100e12 / 1e3  # 0.125 ms at 800 TFLOP/s, more than 1 MB's read time
    v = targets.judge("kimi-k2", 16384, 0.125 * 1.20, 1e6, flops, BW, MM)
    assert (v.bound, v.met, v.target_cell()) == ("compute", True, "<=1.25x")
    # Mixtral at T >= 4096: within 1.25x of the floor, yet under 680 TFLOP/s
    v = targets.judge("mixtral-8x7b", 4096, 0.125 * 1.20, 1e6, flops, BW, MM)
    assert v.target_cell() == "<=1.25x, >=680 TF/s"
    assert v.missed == [f"{flops / (0.15e-3) / 1e12:.0f} TF/s < 680 TF/s"]
    assert targets.judge("mixtral-8x7b", 2048, 0.125 * 1.20, 1e6, flops, BW, MM).met  # no rate target below 4096
    assert targets.judge("qwen3-30b-a3b", 8192, 0.125 * 1.20, 1e6, flops, BW, MM).met  # 667 TFLOP/s >= 620


def test_qwen3_decode_latency():
    # 75 MB at 4 TB/s: an 18.75 us floor; 20.5 us is within 1.15x of it and within 21 us, 22 us neither
    v = targets.judge("qwen3-30b-a3b", 1, 0.0205, 75e6, 1e6, BW, MM)
    assert v.met and v.target_cell() == "<=1.15x bw, <=21 us"
    v = targets.judge("qwen3-30b-a3b", 1, 0.0220, 75e6, 1e6, BW, MM)
    assert v.missed == ["limit 1.15x", "22.0 us > 21 us"]
    # at a floor of 15 us (a faster machine) 1.15x allows 17.25 us: 17 us meets both
    assert targets.judge("qwen3-30b-a3b", 1, 0.0170, 60e6, 1e6, BW, MM).met
    # the tiny self-test presets take the rules of the presets they shrink
    assert targets.judge("tiny-qwen3", 1, 0.0220, 75e6, 1e6, BW, MM).target_cell() == "<=1.15x bw, <=21 us"


def test_summary_counts_lists_and_means():
    verdicts = [("a", 1, targets.judge("a", 1, 0.25 * r, 1e9, 1e6, BW, MM)) for r in (1.0, 1.1)]
    verdicts.append(("b", 8, targets.judge("b", 8, 0.25 * 1.6, 1e9, 1e6, BW, MM)))
    lines = targets.summary_lines(verdicts, unmeasured=["b T=16"])
    assert lines[0] == "Targets: 2 of 3 measured points met; 1 not measured: b T=16"
    assert lines[1] == "Missed (1): b T=8: 1.60x floor (limit 1.15x)"
    assert lines[2] == (f"Geometric mean of moejit/floor: a {math.sqrt(1.1):.3f} (2 points), b 1.600 (1 point); "
                        f"overall {(1.1 * 1.6) ** (1 / 3):.3f} (3 points)")


def test_saved_table_round_trip_and_compare(tmp_path):
    path = tmp_path / "saved" / "h200_targets.json"
    meta = {"commit": "abc1234", "date": "2026-12-04", "device": "NVIDIA H200", "command": "python3 ...",
            "ceilings": {"read_tb_s": 4.3, "matmul_tflop_s": 760.0, "details": "..."}}
    points = {"qwen3-30b-a3b": {1: 0.0299, 4096: 0.7298}, "kimi-k2": {32768: 45.125}}
    targets.save_table(str(path), meta, points)
    on_disk = json.loads(path.read_text())
    assert on_disk["points"]["qwen3-30b-a3b"] == {"1": 0.0299, "4096": 0.7298}
    table, line = targets.load_table(str(path))
    assert table["points"] == points and table["meta"] == meta
    assert "3 points, commit abc1234" in line

    same = targets.compare_point(table, "qwen3-30b-a3b", 1, 0.0299 * 1.02, 3.0)
    assert not same.slower and targets.compare_cells(same) == ["0.0299", "1.020"]
    slower = targets.compare_point(table, "qwen3-30b-a3b", 4096, 0.7298 * 1.05, 3.0)
    assert slower.slower and targets.compare_cells(slower) == ["0.7298", "1.050 SLOWER"]
    missing = targets.compare_point(table, "qwen3-30b-a3b", 2, 0.05, 3.0)
    assert targets.compare_cells(missing) == ["-", "-"]
    lines = targets.comparison_lines([("qwen3-30b-a3b", 1, same), ("qwen3-30b-a3b", 4096, slower),
                                      ("qwen3-30b-a3b", 2, missing)], 3.0, line,
                                     dict(meta, ceilings={"read_tb_s": 4.214, "matmul_tflop_s": 760.0}), meta)
    assert "Slower than the saved run by more than 3% (1 of 2 compared points): qwen3-30b-a3b T=4096" in lines[2]
    assert lines[1] == ("Ceilings, this run vs the saved run: read 4.214 vs 4.3 TB/s (x0.980); matmul 760 vs 760 "
                        "TFLOP/s (x1.000)")
    assert lines[-1] == "1 point of this run is not in the saved table."


def test_missing_or_broken_table_is_reported_not_raised(tmp_path):
    table, line = targets.load_table(str(tmp_path / "none.json"))
    assert table is None and "does not exist" in line
    assert targets.compare_cells(targets.compare_point(table, "kimi-k2", 1, 0.2, 3.0)) == ["-", "-"]
    broken = tmp_path / "broken.json"
    broken.write_text('{"points": {"kimi-k2": {"1": "fast"}}}')
    table, line = targets.load_table(str(broken))
    assert table is None and "could not be read" in line


def test_self_test_targets_saves_and_compares(tmp_path):
    """The whole --targets path on tiny presets: pass 1 saves the table, pass 2 compares every point."""
    spec = importlib.util.spec_from_file_location("moe_bench", ROOT / "bench" / "moe_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out, table = tmp_path / "r.md", tmp_path / "t.json"
    status = bench.main(["--self-test", "--targets", "--tokens", "1", "7", "--save-table", str(table),
                         "--out", str(out)], doc=bench.__doc__)
    report = out.read_text()
    assert status == 0, report
    assert "self-test: PASS" in report and "# Pass 2: compare with pass 1" in report
    saved = json.loads(table.read_text())
    assert sorted(saved["points"]) == ["tiny-deepseek", "tiny-mixtral", "tiny-qwen3"]
    assert all(sorted(map(int, t)) == [1, 7] for t in saved["points"].values())
    pass2 = report.split("# Pass 2")[1]
    rows = [line for line in pass2.splitlines() if re.match(r"\| (1|7) \|", line)]
    assert len(rows) == 6 and all(line.split("|")[-2].strip() != "-" for line in rows)  # every new/prev found
    assert "<=21 us |" in report  # tiny-qwen3 T=1 takes Qwen3-30B-A3B's rules


def test_read_kernel_compiles_to_16_byte_loads():
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from moebench.read_kernel import build_kernel

    source = ASTSource(fn=build_kernel(), signature={"x_ptr": "*bf16", "partial_ptr": "*fp32", "iters": "i32",
                                                     "BLOCK": "constexpr"},
                       constexprs={"BLOCK": 8192}, attrs={(0,): [["tt.divisibility", 16]],
                                                          (1,): [["tt.divisibility", 16]]})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
    loads = set(re.findall(r"ld\.global[\w.:]*", ptx))
    assert loads and all(".v4.b32" in load for load in loads), loads
