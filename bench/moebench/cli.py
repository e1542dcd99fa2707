"""The command line of bench/moe_bench.py: its options, their defaults, the dry run (the plan without
CUDA or moejit) and the driver that runs every preset and writes the report."""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback

import torch

from .baselines import hf_eager_forward
from .dryrun import dry_run
from .preset_bench import PresetBench, chain_probe
from .presets import (DEFAULT_BREAKDOWN, DEFAULT_PRESETS, FULL_TOKENS, PRESETS, QUANT_MATMUL, QUANTS, QUICK_TOKENS,
                      TINY_PRESETS, TINY_TOKENS, expert_bytes, preset_line, weight_bytes)
from .quant import quant_matmul_ceilings
from .quant_bench import run_quant_variants
from .report import COLUMNS, LEGEND, QUANT_LEGEND, Report, fmt_rate, git_revision, short_error
from .targets import (DEFAULT_NOISE_MARGIN_PCT, DEFAULT_TABLE, DEFAULT_TABLE_SHOWN, TARGET_PRESETS, TARGET_TOKENS,
                      TARGETS_BUDGET_S)
from .targets_bench import TargetsRun
from .timing import Device


def parse_breakdown(text):
    if not text or text.strip().lower() in ("none", "off", ""):
        return []
    points = []
    for item in text.split(","):
        name, _, tokens = item.strip().rpartition(":")
        if not name or not tokens.isdigit():
            raise SystemExit(f"--breakdown: expected PRESET:T[,PRESET:T...], got {item!r}")
        points.append((name, int(tokens)))
    return points


def build_parser(doc):
    """The options; `doc` is bench/moe_bench.py's docstring, whose part from "What each timing includes"
    on is the help's epilog."""
    ap = argparse.ArgumentParser(
        description="Benchmark moejit's fused MoE layer against a torch._grouped_mm layer and the Hugging Face "
                    "eager loop (CUDA-graph timing, uniform random routing, fresh inputs, measured ceilings).",
        epilog="Run from the repository root as PYTHONPATH=python python3 bench/moe_bench.py [...].\n\n" +
               doc[doc.index("What each timing includes"):],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=None, metavar="PRESET",
                    help=f"presets to run (default: {' '.join(DEFAULT_PRESETS)}; with --targets "
                         f"{' '.join(TARGET_PRESETS)}; known: {', '.join(PRESETS)})")
    ap.add_argument("--tokens", nargs="+", type=int, default=None, metavar="T",
                    help=f"token counts (default {FULL_TOKENS}; with --quick {QUICK_TOKENS}; with --targets "
                         f"{' '.join(map(str, TARGET_TOKENS))})")
    ap.add_argument("--quick", action="store_true",
                    help="T in {1,16,256,4096}, fewer replays and a smaller time budget per timing (~2-4 min on an H200)")
    ap.add_argument("--dry-run", action="store_true", help="print the planned points and exit (no CUDA, no moejit)")
    ap.add_argument("--self-test", action="store_true",
                    help="run the whole benchmark on tiny shapes (CPU when there is no GPU) and check that moejit, "
                         "grouped_mm and the HF loop agree; exit status 1 on a mismatch (presets: "
                         + ", ".join(TINY_PRESETS) + f"; T {TINY_TOKENS})")
    ap.add_argument("--targets", action="store_true",
                    help=f"issue 21's points ({len(TARGET_PRESETS)} presets x {len(TARGET_TOKENS)} token counts unless "
                         "--presets/--tokens say otherwise): the moejit layer alone per point, each judged against its "
                         "targets, a summary, and the saved run's times beside this run's (see --compare); ~1.5-2 "
                         "min on an H200 (--dry-run --targets estimates it)")
    ap.add_argument("--grouped-mm", action="store_true",
                    help="with --targets: also time the torch._grouped_mm layer at every point (off by default there)")
    ap.add_argument("--save-table", nargs="?", const=DEFAULT_TABLE, default=None, metavar="PATH",
                    help="with --targets: write this run's moejit ms per point as JSON "
                         "{meta, points: {preset: {T: ms}}} "
                         f"to PATH (default {DEFAULT_TABLE_SHOWN}), after every preset; the file then holds this "
                         "run's points only")
    ap.add_argument("--compare", default=None, metavar="PATH",
                    help="with --targets: the saved table to compare with (default "
                         f"{DEFAULT_TABLE_SHOWN}; 'none': no comparison); each row gets its prev ms and new/prev, "
                         "points slower by more than --noise-margin are flagged; a missing file is reported, not an "
                         "error")
    ap.add_argument("--noise-margin", type=float, default=DEFAULT_NOISE_MARGIN_PCT, metavar="PCT",
                    help=f"with --compare: slower than the saved run by more than this %% is flagged "
                         f"(default {DEFAULT_NOISE_MARGIN_PCT:g})")
    ap.add_argument("--quant", nargs="+", default=["none"], metavar="Q", choices=("none",) + QUANTS,
                    help="quantized layers to run after each preset's bf16 rows, on its weights quantized: any of "
                         f"{', '.join(QUANTS)} (default none: bf16 only). The bf16 rows always run: the quantized "
                         "rows are compared with them")
    ap.add_argument("--moejit-library", metavar="LIB.so",
                    help="load this libmoejit_torch.so before importing moejit (default: where moejit looks, "
                         "python/moejit/lib/ then build/backends/torch/)")
    ap.add_argument("--out", metavar="FILE.md", help="also write the report (markdown) to this file")
    ap.add_argument("--calls", type=int, default=10, help="max layer calls captured per CUDA graph (default 10)")
    ap.add_argument("--input-gib", type=float, default=2.0, metavar="GIB",
                    help="max GiB of input buffers per point (a call's hidden, logits and routing, one buffer per "
                         "call of a graph): fewer calls per graph where --calls of them would not fit (T=32768 at "
                         "H=7168: 4 buffers of 0.5 GB) (default 2)")
    ap.add_argument("--replays", type=int, default=None, help="max timed replays per timing (default 20; --quick 5)")
    ap.add_argument("--min-replays", type=int, default=3, help="min timed replays per timing (default 3)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="rough time budget per timing, seconds: limits calls x replays for slow points "
                         f"(default 3; --quick 1; --targets {TARGETS_BUDGET_S:g})")
    ap.add_argument("--graph-target-ms", type=float, default=50.0,
                    help="calls per graph = min(--calls, this / eager ms of one call) (default 50)")
    ap.add_argument("--no-hf", action="store_true", help="skip the HF eager loop everywhere")
    ap.add_argument("--hf-all", action="store_true",
                    help="also run the HF eager loop for 256+ experts at T >= 1024 (skipped by default: too slow)")
    ap.add_argument("--breakdown", default=DEFAULT_BREAKDOWN, metavar="PRESET:T,...",
                    help=f"per-kernel breakdown points (default {DEFAULT_BREAKDOWN}; 'none' to skip); "
                         "only points of presets that run")
    ap.add_argument("--no-chain-probe", action="store_true",
                    help="skip the launch-chain probe (each preset's layer at H=256, I=128, timed at T <= 16)")
    ap.add_argument("--profile-iters", type=int, default=5, help="eager calls profiled per breakdown (default 5)")
    ap.add_argument("--bw-gib", type=float, default=4.0, help="size of the read-bandwidth reduction, GiB (default 4)")
    ap.add_argument("--device", default="cuda", help="CUDA device (default cuda, i.e. the current one)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def resolve_args(args):
    presets = TINY_PRESETS if args.self_test else PRESETS
    if args.presets is None:
        args.presets = list(TINY_PRESETS if args.self_test else TARGET_PRESETS if args.targets else DEFAULT_PRESETS)
    unknown = [p for p in args.presets if p not in presets]
    if unknown:
        raise SystemExit(f"unknown preset(s) {unknown}; known: {', '.join(presets)}")
    if args.tokens is None:
        args.tokens = (TINY_TOKENS if args.self_test else TARGET_TOKENS if args.targets else
                       QUICK_TOKENS if args.quick else FULL_TOKENS)
    if any(t < 1 for t in args.tokens):
        raise SystemExit("--tokens must be >= 1")
    if args.replays is None:
        args.replays = 5 if (args.quick or args.self_test) else 20
    if args.budget_s is None:
        args.budget_s = 0.2 if args.self_test else (TARGETS_BUDGET_S if args.targets else 1.0 if args.quick else 3.0)
    resolve_targets_args(args)
    if args.input_gib <= 0:
        raise SystemExit("--input-gib must be > 0")
    args.min_replays = max(1, min(args.min_replays, args.replays))
    args.calls = max(1, args.calls)
    args.quants = list(dict.fromkeys(q for q in args.quant if q != "none"))
    args.breakdown_points = parse_breakdown(args.breakdown)
    if args.self_test and args.breakdown == DEFAULT_BREAKDOWN:
        args.breakdown_points = [("tiny-qwen3", 7)]
    return presets


def resolve_targets_args(args):
    """--targets' defaults (no breakdowns unless asked; compare with the default saved table) and the
    options that only --targets takes."""
    if not args.targets:
        given = [flag for flag, value in (("--grouped-mm", args.grouped_mm), ("--save-table", args.save_table),
                                          ("--compare", args.compare)) if value]
        if given:
            raise SystemExit(f"{', '.join(given)}: only with --targets")
        return
    if args.quant != ["none"]:
        raise SystemExit("--targets times the bf16 layers only; run --quant without --targets")
    if args.breakdown == DEFAULT_BREAKDOWN:
        args.breakdown = "none"  # the defaults' points are no targets; --breakdown P:T still adds one
    if args.compare is None:
        args.compare = DEFAULT_TABLE
    if args.compare.strip().lower() == "none":
        args.compare = None
    if args.noise_margin < 0:
        raise SystemExit("--noise-margin must be >= 0")


def main(argv=None, *, doc):
    """Runs the benchmark (argv: sys.argv[1:] by default; doc: bench/moe_bench.py's docstring); returns
    the exit status."""
    args = build_parser(doc).parse_args(argv)
    presets = resolve_args(args)
    if args.dry_run:
        return dry_run(args, presets)

    if args.self_test and not torch.cuda.is_available():
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            print("moe_bench: CUDA is not available (use --dry-run or --self-test here)", file=sys.stderr)
            return 2
        device = torch.device(args.device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)

    if args.moejit_library:
        # moejit then finds the ops registered and loads no other copy (as tests/python/conftest.py does).
        torch.ops.load_library(os.path.abspath(args.moejit_library))
    import moejit  # loads the op library (ImportError lists where it looked)

    hf_fn, hf_desc = ((None, "not run (--targets)") if args.targets else
                      (None, "not run (--no-hf)") if args.no_hf else hf_eager_forward())
    report = Report(args.out)
    dev = Device(device, args)
    torch.manual_seed(args.seed)

    # -- header
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    if dev.cuda:
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", None)
        gpu = (f"{props.name} ({props.total_memory / 2 ** 30:.0f} GiB, {props.multi_processor_count} SMs"
               + (f", L2 {l2 / 2 ** 20:.0f} MiB" if l2 else "") + ")")
    else:
        l2, gpu = None, f"none: CPU ({platform.processor() or platform.machine()}), moejit's CPU ops"
    command = " ".join([os.path.basename(sys.executable)]
                       + (sys.argv if argv is None else ["bench/moe_bench.py"] + list(argv)))
    report.emit(f"# moejit layer benchmark{': issue 21 targets' if args.targets else ''}"
                f"{' (self-test, tiny shapes)' if args.self_test else ''}")
    report.emit("")
    commit = git_revision()
    report.emit(f"- Date: {now}; commit {commit}; host {platform.node()}")
    report.emit(f"- GPU: {gpu}")
    report.emit(f"- torch {torch.__version__}, CUDA {torch.version.cuda}, moejit {getattr(moejit, '__version__', '?')} "
                f"from {moejit.library_path()}; HF eager: {hf_desc}")
    report.emit(f"- Command: {command}")
    timing = (f"CUDA graphs of <= {args.calls} calls (each on its own input buffer; the buffers <= "
              f"{args.input_gib:g} GiB a point), <= {args.replays} replays, "
              "fresh random inputs copied in and a 256 MiB L2 scrub before each replay (not timed); median per call"
              if dev.cuda else f"CPU self-test: eager calls timed with perf_counter, <= {args.replays} each; median")
    report.emit(f"- Timing: {timing}. Weights bf16 random; router logits bf16 iid normal; zero correction bias.")
    t0 = time.perf_counter()
    bw, mm, details = dev.ceilings(args.bw_gib)
    report.emit(f"- Ceilings (measured now): read bandwidth {bw / 1e12:.3f} TB/s, bf16 matmul {mm / 1e12:.1f} TFLOP/s "
                f"({details}; {time.perf_counter() - t0:.1f} s)")
    meta = {"commit": commit, "date": now, "device": gpu, "command": command,
            "ceilings": {"read_tb_s": float(f"{bw / 1e12:.4g}"), "matmul_tflop_s": float(f"{mm / 1e12:.4g}"),
                         "details": details}}
    if args.targets:
        failures = TargetsRun(args, presets, dev, report, moejit, (bw, mm), meta).run()
    else:
        failures = run_presets(args, presets, dev, report, moejit, hf_fn, (bw, mm), l2)
    if dev.cuda and not args.self_test:
        bw2, mm2, _ = dev.ceilings(args.bw_gib)
        report.emit(f"Ceilings re-measured at the end (drift check; not used): {bw2 / 1e12:.3f} TB/s, "
                    f"{mm2 / 1e12:.1f} TFLOP/s")
    if args.self_test:
        report.emit("self-test: " + ("PASS" if not failures else "FAIL"))
    for f in failures:
        report.emit(f"- problem: {f}")
    report.close()
    return 1 if (args.self_test and failures) else 0


def run_presets(args, presets, dev, report, moejit, hf_fn, ceilings, l2):
    """The default, --quick and --quant runs: per preset its bf16 table (moejit, experts-only, grouped_mm,
    HF eager), its quantized tables, the launch-chain probe and the breakdowns; returns the problems."""
    bw, mm = ceilings
    device = dev.dev
    rates = {}
    if args.quants:
        t0 = time.perf_counter()
        rates = quant_matmul_ceilings(dev, {QUANT_MATMUL[q] for q in args.quants})
        report.emit(f"- Quantized matmul ceilings (measured now; --quant {' '.join(args.quants)}): "
                    + "; ".join(f"{kind} {fmt_rate(r)} {'TFLOP/s' if kind == 'fp8' else 'TOPS'} ({d})"
                                for kind, (r, d) in sorted(rates.items()))
                    + f" ({time.perf_counter() - t0:.1f} s)")
    report.emit("")
    report.emit(LEGEND)
    report.emit("")
    if args.quants:
        report.emit(QUANT_LEGEND)
        report.emit("")

    failures = []
    for name in args.presets:
        p = presets[name]
        report.emit(f"## {name}: {preset_line(name, p)}")
        report.emit("")
        wbytes = weight_bytes(p)
        if dev.cuda:
            free = torch.cuda.mem_get_info(device)[0]
            if wbytes * 1.1 + (2 << 30) > free:
                report.emit(f"skipped: expert weights {wbytes / 1e9:.1f} GB do not fit in {free / 1e9:.1f} GB free")
                report.emit("")
                continue
        bench = None
        try:
            t0 = time.perf_counter()
            bench = PresetBench(name, p, dev, args, report, moejit, hf_fn)
            summary = moejit.compile(bench.cfg, device, progress=False)
            l2_note = ""
            if l2 and wbytes < 4 * l2:
                l2_note = f" WARNING: weights are less than 4x the L2 ({l2 / 2 ** 20:.0f} MiB)"
            report.emit(f"expert weights {wbytes / 1e9:.2f} GB ({expert_bytes(p) / 1e6:.1f} MB per expert), allocated "
                        f"and compiled in {time.perf_counter() - t0:.1f} s; moejit.compile: "
                        f"{json.dumps({k: v for k, v in summary.items() if k != 'seconds'})}{l2_note}")
            report.emit(f"config: `{bench.cfg_json}`")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
            report.emit(f"preset failed before its first point: {short_error(e)}")
            report.emit("")
            failures.append(f"{name}: {short_error(e)}")
            if bench is not None:
                bench.free()
            del bench
            if dev.cuda:
                torch.cuda.empty_cache()
            continue
        report.emit("")
        report.row(COLUMNS)
        report.row(["---"] * len(COLUMNS))
        measured = {}
        for tokens in args.tokens:
            try:
                row, result = bench.point(tokens, bw, mm)
                measured[tokens] = result
                errs = result["errs"]
                for key in ("grouped_mm", "hf", "experts"):
                    if errs.get(key) is not None and errs[key] > 2e-2:
                        failures.append(f"{name} T={tokens}: {key} rel.err {errs[key]:.2e} against the moejit layer")
            except Exception as e:  # noqa: BLE001
                traceback.print_exc(file=sys.stderr)
                row = [tokens] + ["ERR"] * (len(COLUMNS) - 1)
                bench.notes.append(f"T={tokens}: {short_error(e)}")
                failures.append(f"{name} T={tokens}: {short_error(e)}")
                if dev.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            report.row(row)
        report.emit("")
        if bench.route_agree:
            agree = statistics.mean(bench.route_agree)
            report.emit(f"- routing cross-check: moejit's ids equal torch's top-k (as sets) in {100 * agree:.2f}% of "
                        "the checked rows (bf16 logits can tie; the baselines use moejit's ids, so this does not "
                        "affect the comparison)")
            if agree < 0.9:
                failures.append(f"{name}: routing ids agree with torch in only {100 * agree:.1f}% of rows")
        for note in bench.notes:
            report.emit(f"- {note}")
        failures.extend(f"{name} {f}" for f in bench.failed)
        if args.quants:
            report.emit("")
            failures.extend(f"{name} {f}" for f in run_quant_variants(bench, args.quants, bw, rates, measured, report,
                                                                    moejit))
        if dev.cuda and not args.self_test and not args.no_chain_probe:
            chain_probe(name, p, dev, args, report, moejit, measured)
        report.emit("")
        bench.finish(measured.get)
        del bench
    return failures
