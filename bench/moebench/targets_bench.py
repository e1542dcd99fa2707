"""--targets: issue 21's points timed and judged. Per preset: its random weights (allocated once, freed
before the next preset), the moejit layer at each T (grouped_mm too with --grouped-mm), one row per point
with its verdict and, with a saved table, the saved run's time; then the run's summary. --save-table
writes this run's times after every preset (so a run cut short keeps what it measured). --self-test
runs it all twice on tiny presets: the first pass saves a table, the second compares with it."""

import os
import sys
import tempfile
import time
import traceback

import torch

from .preset_bench import PresetBench, timing_cell, timing_ms
from .presets import expert_bytes, layer_flops, preset_line, weight_bytes
from .report import TARGETS_LEGEND, fmt_ms, fmt_num, short_error, target_columns
from .targets import (BANDWIDTH_LIMIT, LATENCY_MS, OTHER_LIMIT, PREFILL_RATE, compare_cells, compare_point,
                      comparison_lines, judge, load_table, save_table, summary_lines)


def describe_targets():
    """Issue 21's targets in one line (the header's and the dry run's)."""
    latency = "; ".join(f"{name} T={t} <= {ms * 1e3:g} us" for (name, t), ms in LATENCY_MS.items())
    prefill = "; ".join(f"{name} T >= {t}: >= {rate / 1e12:g} TFLOP/s" for name, (t, rate) in PREFILL_RATE.items())
    return (f"moejit/floor <= {BANDWIDTH_LIMIT:g} where the floor is bandwidth-bound, <= {OTHER_LIMIT:g} elsewhere; "
            f"{latency}; {prefill}; no point slower than the saved run (beyond the noise margin)")


class TargetsRun:
    """One --targets run: the measured ceilings, the report, and what every pass collects."""

    def __init__(self, args, presets, dev, report, moejit, ceilings, meta):
        self.args, self.presets, self.d, self.r, self.moejit = args, presets, dev, report, moejit
        self.bw, self.mm = ceilings
        self.meta = meta
        self.failures = []

    def run(self):
        """Emits the targets' header lines, the legend, every pass and its summary; returns the problems
        found (errors; with --self-test also a table that does not round-trip)."""
        args, r = self.args, self.r
        r.emit(f"- Targets (issue 21): {describe_targets()}")
        r.emit(f"- Timed per point: the moejit layer{' and grouped_mm' if args.grouped_mm else ''} (HF eager, "
               "experts-only, the launch-chain probe: not run in --targets)")
        if args.self_test:
            self.self_test()
            return self.failures
        table, table_line = (None, None)
        if args.compare:
            table, table_line = load_table(args.compare)
            r.emit(f"- Compared with the saved run: {table_line}; noise margin {args.noise_margin:g}%")
        if args.save_table:
            r.emit(f"- This run's times are written to {args.save_table} after every preset")
        r.emit("")
        r.emit(TARGETS_LEGEND)
        r.emit("")
        self.run_pass(compare=bool(args.compare), table=table, table_line=table_line, save_path=args.save_table)
        return self.failures

    def self_test(self):
        """Two passes over the tiny presets: the first saves its table (--save-table, else a temporary
        file), the second compares with it; the saved table must hold exactly the first pass's times."""
        args, r = self.args, self.r
        tmp = None
        path = args.save_table
        if not path:
            tmp = tempfile.TemporaryDirectory(prefix="moe_bench_targets_")
            path = os.path.join(tmp.name, "targets.json")
        r.emit(f"- Self-test: pass 1 saves its table to {path}, pass 2 compares with it")
        r.emit("")
        r.emit(TARGETS_LEGEND)
        r.emit("")
        try:
            r.emit("# Pass 1: save")
            r.emit("")
            saved = self.run_pass(compare=False, table=None, table_line=None, save_path=path)
            table, table_line = load_table(path)
            if table is None:
                self.failures.append(f"saved table: {table_line}")
                return
            if table["points"] != saved:
                self.failures.append(f"saved table {path} does not hold the times pass 1 measured")
            r.emit("# Pass 2: compare with pass 1")
            r.emit("")
            self.run_pass(compare=True, table=table, table_line=table_line, save_path=None, expect_prev=True)
        finally:
            if tmp is not None:
                tmp.cleanup()

    def run_pass(self, compare, table, table_line, save_path, expect_prev=False):
        """Every preset's rows and the summary; returns this pass's times {preset: {T: ms}}.
        compare: the rows get the saved run's columns (table may be None: a missing file shows '-');
        expect_prev: every measured point must find its saved time (--self-test's second pass)."""
        args = self.args
        verdicts, comparisons, unmeasured, points = [], [], [], {}
        for name in args.presets:
            times = self.run_preset(name, compare, table, verdicts, comparisons, unmeasured)
            if times:
                points[name] = times
            if save_path and points:
                save_table(save_path, self.meta, points)
        r = self.r
        r.emit("### Summary")
        r.emit("")
        for line in summary_lines(verdicts, unmeasured):
            r.emit(f"- {line}")
        if compare:
            if table is None:
                r.emit(f"- Not compared: {table_line}")
            else:
                for line in comparison_lines(comparisons, args.noise_margin, table_line, self.meta, table["meta"]):
                    r.emit(f"- {line}")
        if save_path:
            r.emit(f"- Saved this run's {sum(len(t) for t in points.values())} points to {save_path}")
        if expect_prev:
            lost = [f"{n} T={t}" for n, t, c in comparisons if c.ratio is None]
            if lost:
                self.failures.append(f"compare found no saved time for {', '.join(lost)}")
        r.emit("")
        return points

    def run_preset(self, name, compare, table, verdicts, comparisons, unmeasured):
        """One preset's table; appends to the pass's lists; returns its times {T: ms}."""
        args, r, dev, p = self.args, self.r, self.d, self.presets[name]
        r.emit(f"## {name}: {preset_line(name, p)}")
        r.emit("")
        wbytes = weight_bytes(p)
        if dev.cuda:
            free = torch.cuda.mem_get_info(dev.dev)[0]
            if wbytes * 1.1 + (2 << 30) > free:
                r.emit(f"skipped: expert weights {wbytes / 1e9:.1f} GB do not fit in {free / 1e9:.1f} GB free")
                r.emit("")
                unmeasured.extend(f"{name} T={t}" for t in args.tokens)
                return {}
        bench = None
        try:
            t0 = time.perf_counter()
            bench = PresetBench(name, p, dev, args, r, self.moejit, None)
            summary = self.moejit.compile(bench.cfg, dev.dev, progress=False)
            r.emit(f"expert weights {wbytes / 1e9:.2f} GB ({expert_bytes(p) / 1e6:.1f} MB per expert), allocated "
                   f"and compiled in {time.perf_counter() - t0:.1f} s ({summary.get('kernels', '?')} kernels)")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
            r.emit(f"preset failed before its first point: {short_error(e)}")
            r.emit("")
            self.failures.append(f"{name}: {short_error(e)}")
            unmeasured.extend(f"{name} T={t}" for t in args.tokens)
            if bench is not None:
                bench.free()
            del bench
            if dev.cuda:
                torch.cuda.empty_cache()
            return {}
        r.emit("")
        columns = target_columns(args.grouped_mm, compare)
        r.row(columns)
        r.row(["---"] * len(columns))
        times, shapes = {}, []
        for tokens in args.tokens:
            try:
                timings, modes, hit, _ = bench.layer_point(tokens, args.grouped_mm)
                shapes.append(f"T={tokens} {' / '.join(modes) or '-'}")
            except Exception as e:  # noqa: BLE001
                traceback.print_exc(file=sys.stderr)
                bench.notes.append(f"T={tokens}: {short_error(e)}")
                self.failures.append(f"{name} T={tokens}: {short_error(e)}")
                timings, hit = {"moejit": "ERR"}, None
                if dev.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            ms = timing_ms(timings.get("moejit"))
            row = [tokens, timing_cell(timings.get("moejit"), dev.cuda)]
            if ms is None:
                unmeasured.append(f"{name} T={tokens}")
                row += ["-"] * (len(target_columns(False, False)) - len(row))
            else:
                times[tokens] = ms
                touched, flops = hit * expert_bytes(p), layer_flops(p, tokens)
                v = judge(name, tokens, ms, touched, flops, self.bw, self.mm)
                verdicts.append((name, tokens, v))
                row += [fmt_num(touched / (ms * 1e-3) / 1e12, 3), fmt_num(v.rate / 1e12, 1), f"{hit:.1f}",
                        fmt_ms(v.floor_ms), v.bound, fmt_num(v.ratio, 2), v.target_cell(), v.met_cell()]
            if args.grouped_mm:
                gm = timing_ms(timings.get("grouped_mm"))
                row += [timing_cell(timings.get("grouped_mm"), dev.cuda), fmt_num(ms / gm, 2) if ms and gm else "-"]
            if compare:
                cmp = compare_point(table, name, tokens, ms, args.noise_margin)
                comparisons.append((name, tokens, cmp))
                row += compare_cells(cmp)
            r.row(row)
        r.emit("")
        if shapes:
            r.emit(f"- calls per graph x replays: {', '.join(shapes)}")
        for note in bench.notes:
            r.emit(f"- {note}")
        self.failures.extend(f"{name} {f}" for f in bench.failed)
        r.emit("")
        bench.finish(lambda t: {"moejit": times.get(t)})
        del bench
        return times
