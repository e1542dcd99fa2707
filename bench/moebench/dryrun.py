"""--dry-run: the plan without CUDA or moejit: every preset's points with their bytes, FLOPs and a
floor from nominal H200 numbers, and with --quant the quantized layers' floors (nominal too); with
--targets each point's bound and targets, and an estimate of the run's wall time."""

import json
import os

import torch

from .quant_bench import GUARD_LIMIT, GUARD_TOKENS
from .presets import (NOMINAL_H200, NOMINAL_H200_QUANT, QUANT_MATMUL, expected_hit, expert_bytes, hf_skip_reason,
                      input_slot_bytes, input_slots, layer_flops, preset_line, quant_expert_bytes, quant_scale_bytes,
                      weight_bytes)
from .targets import floor_and_bound, targets_of
from .targets_bench import describe_targets
from .timing import graph_shape

# The wall-time model of a --targets run on an H200 (rough; the run itself prints when each preset is done).
ASSUMED_CALL_VS_NOMINAL_FLOOR = 1.6  # moejit's ms / the nominal floor: 1.0-1.9 in sessions 11-18's runs
CALL_FIXED_MS = 0.005                # launches a call cannot hide even at T=1
CHECK_AND_WARM_CALLS = 5             # per point: the finite-output check, 2 warm-up calls, 2 eager estimates
POINT_HOST_S = 0.03                  # per point: buffers allocated, capture + instantiate, empty_cache
FILL_HOST_MS = 0.15                  # per input buffer filled: normal_, the route op, copies (host side)
FILL_RATE = 1e12                     # B/s of random inputs written by normal_
REPLAY_EXTRA_MS = 0.17               # per replay: the 256 MiB L2 scrub and the 200k-cycle GPU sleep
PRESET_S = 5.0                       # per preset: a cold moejit.compile (2.3-3.7 s on 2 cores, session 18) and
                                     # the random weights (<= 34 GB)
RUN_S = 25.0                         # python, torch and moejit imports, the CUDA context, the ceilings at the start
                                     # (3 Triton compiles) and the drift check at the end


def dry_run(args, presets):
    if args.targets:
        return targets_plan(args, presets)
    bw, mm = NOMINAL_H200
    print(f"moe_bench dry run (no CUDA, no moejit; torch {torch.__version__}): {len(args.presets)} preset(s) x "
          f"{len(args.tokens)} token count(s)")
    print(f"timing: CUDA graphs of <= {args.calls} calls, <= {args.replays} replays (>= {args.min_replays}), "
          f"~{args.budget_s:g} s budget per timing; ceilings measured first: the best of torch.sum and a Triton read "
          f"kernel over {args.bw_gib:g} GiB bf16, 8192^3 bf16 matmul")
    print(f"floor below uses nominal H200 numbers ({bw / 1e12:g} TB/s, {mm / 1e12:g} TFLOP/s) and the expected "
          "distinct experts of uniform routing; the real run measures both")
    if args.quants:
        kinds = sorted({QUANT_MATMUL[q] for q in args.quants})
        probes = {"fp8": "torch._scaled_mm 8192^3 e4m3 (per-row and per-tensor scales)", "int8": "torch._int_mm 8192^3"}
        print(f"quantized layers {' '.join(args.quants)}: after each preset's bf16 rows, on its weights quantized; "
              f"quantized matmul rates measured first: {'; '.join(probes[k] for k in kinds)}; guard: moejit "
              f"quantized vs moejit bf16 at T={GUARD_TOKENS} (flagged above {GUARD_LIMIT:g})")
        print(f"quantized floors below: qfloor = max(touched bytes / {bw / 1e12:g} TB/s, 6*T*K*H*I / rate) with NOMINAL "
              f"H200 datasheet rates: fp8 dense {NOMINAL_H200_QUANT['fp8'] / 1e12:g} TFLOP/s, int8 dense "
              f"{NOMINAL_H200_QUANT['int8'] / 1e12:g} TOPS; touched bytes = 1 B per weight element + fp32 scales")
    for name in args.presets:
        p = presets[name]
        cfg = dict(p, dtype="bf16")
        print()
        print(f"### {name}: {preset_line(name, p)}")
        print(f"    expert weights {weight_bytes(p) / 1e9:.2f} GB bf16 ({expert_bytes(p) / 1e6:.1f} MB per expert); "
              f"moejit.MoeConfig(**{json.dumps(cfg, separators=(',', ':'))})")
        print("    | T | pairs | experts hit (exp.) | touched GB | GFLOP | nominal floor ms | bound | HF eager |")
        print("    |---|---|---|---|---|---|---|---|")
        for t in args.tokens:
            hit = expected_hit(p, t)
            touched = hit * expert_bytes(p)
            flops = layer_flops(p, t)
            floor_ms, bound = floor_and_bound(touched, flops, bw, mm)
            print(f"    | {t} | {t * p['topk']} | {hit:.1f} | {touched / 1e9:.3f} | {flops / 1e9:.1f} | "
                  f"{floor_ms:.4f} | {bound} | "
                  f"{hf_skip_reason(p, t, args) or 'run (eager)'} |")
        if args.quants:
            quant_plan(args, p, bw)
    print()
    bd = [f"{n} T={t}" for n, t in args.breakdown_points if n in args.presets]
    print(f"per-kernel breakdown (torch.profiler, {args.profile_iters} eager calls): {', '.join(bd) or 'none'}")
    print(f"report file: {args.out or '(none; pass --out FILE.md)'}")
    return 0


def quant_plan(args, p, bw):
    """The quantized floors of one preset: per --quant variant and T, touched GB and the floor from
    nominal numbers (bandwidth and the datasheet's dense fp8 / int8 rates)."""
    print("    quantized layers (--quant), floors from NOMINAL rates (above):")
    for q in args.quants:
        print(f"      {q}: expert weights {p['experts'] * quant_expert_bytes(p, q) / 1e9:.2f} GB "
              f"({quant_expert_bytes(p, q) / 1e6:.2f} MB per expert: 1 B per element + "
              f"{_size(quant_scale_bytes(p, q))} of fp32 scales{' and smooths' if q == 'w8a8_int8' else ''})")
    print("    | T | " + " | ".join(f"{q} touched GB | {q} nominal qfloor ms | bound" for q in args.quants) + " |")
    print("    |---|" + "---|---|---|" * len(args.quants))
    for t in args.tokens:
        hit, flops = expected_hit(p, t), layer_flops(p, t)
        cells = []
        for q in args.quants:
            touched = hit * quant_expert_bytes(p, q)
            floor_ms, bound = floor_and_bound(touched, flops, bw, NOMINAL_H200_QUANT[QUANT_MATMUL[q]])
            cells.append(f"{touched / 1e9:.3f} | {floor_ms:.4f} | {bound}")
        print(f"    | {t} | " + " | ".join(cells) + " |")


def _size(nbytes):
    return (f"{nbytes} B" if nbytes < 1000 else f"{nbytes / 1e3:.1f} kB" if nbytes < 1e6 else
            f"{nbytes / 1e6:.1f} MB")


def estimate_point_s(p, tokens, floor_ms, args):
    """(seconds, calls per graph, replays) the model above expects a --targets point to take."""
    call_ms = ASSUMED_CALL_VS_NOMINAL_FLOOR * floor_ms + CALL_FIXED_MS
    slots = input_slots(p, tokens, args.calls, int(args.input_gib * (1 << 30)))
    n, reps = graph_shape(call_ms, slots, args)
    filled = slots + reps * n
    per_call = 2 if args.grouped_mm else 1  # grouped_mm: about as slow again (its own graph, its own check)
    gpu_ms = per_call * ((CHECK_AND_WARM_CALLS + reps * n) * call_ms + filled * input_slot_bytes(p, tokens) / FILL_RATE
                         * 1e3 + reps * REPLAY_EXTRA_MS)
    host_ms = per_call * (POINT_HOST_S * 1e3 + filled * FILL_HOST_MS)
    return (gpu_ms + host_ms) / 1e3, n, reps


def targets_plan(args, presets):
    """--dry-run --targets: every point's expected touched bytes, FLOPs, nominal floor, bound and targets,
    its input buffers and expected graph shape, and the run's estimated wall time."""
    bw, mm = NOMINAL_H200
    points = len(args.presets) * len(args.tokens)
    print(f"moe_bench dry run, --targets (issue 21; no CUDA, no moejit; torch {torch.__version__}): "
          f"{len(args.presets)} preset(s) x {len(args.tokens)} token count(s) = {points} points")
    print(f"timed per point: the moejit layer (CUDA graph of <= {args.calls} calls, each on its own input buffer, the "
          f"buffers <= {args.input_gib:g} GiB; <= {args.replays} replays (>= {args.min_replays}), ~{args.budget_s:g} s "
          f"budget); grouped_mm: {'timed too' if args.grouped_mm else 'not timed (--grouped-mm times it)'}; HF eager, "
          "experts-only, the launch-chain probe: not run")
    print(f"ceilings measured first: read = the best of torch.sum (bf16, fp32 view) and a Triton vectorized read "
          f"over {args.bw_gib:g} GiB bf16; matmul = 8192^3 bf16")
    print(f"targets: {describe_targets()}")
    print(f"floors and bounds below: NOMINAL H200 ({bw / 1e12:g} TB/s, {mm / 1e12:g} TFLOP/s) and the expected "
          "distinct experts of uniform routing; the run uses the measured ceilings (sessions 11-18: 4.1-4.3 TB/s, "
          "750-770 TFLOP/s), which moves the bandwidth/compute crossover to a lower T. 'target ms': the slowest "
          "time that meets every target at the nominal ceilings")
    if args.compare:
        state = "exists" if os.path.exists(args.compare) else "does not exist yet: the run will say so and go on"
        print(f"compare with: {args.compare} ({state}); noise margin {args.noise_margin:g}%")
    else:
        print("compare with: nothing (--compare none)")
    print(f"save this run's table to: {args.save_table or '(nowhere; --save-table [PATH])'}")
    total_s = RUN_S
    for name in args.presets:
        p = presets[name]
        print()
        print(f"### {name}: {preset_line(name, p)}")
        print(f"    expert weights {weight_bytes(p) / 1e9:.2f} GB bf16 ({expert_bytes(p) / 1e6:.1f} MB per expert), "
              "allocated once for all its points")
        print("    | T | experts hit (exp.) | touched GB | GFLOP | nominal floor ms | bound | target | target ms | "
              "input buffers | graph (est.) |")
        print("    |---|---|---|---|---|---|---|---|---|---|")
        preset_s = PRESET_S
        bounds = {}
        for t in args.tokens:
            touched, flops = expected_hit(p, t) * expert_bytes(p), layer_flops(p, t)
            floor_ms, bound = floor_and_bound(touched, flops, bw, mm)
            targets = targets_of(name, t, bound)
            target_ms = min(floor_ms * x.limit if x.kind == "ratio" else x.limit if x.kind == "ms"
                            else flops / x.limit * 1e3 for x in targets)
            slots = input_slots(p, t, args.calls, int(args.input_gib * (1 << 30)))
            seconds, n, reps = estimate_point_s(p, t, floor_ms, args)
            preset_s += seconds
            bounds.setdefault(bound, []).append(t)
            print(f"    | {t} | {expected_hit(p, t):.1f} | {touched / 1e9:.3f} | {flops / 1e9:.1f} | {floor_ms:.4f} | "
                  f"{bound} | {', '.join(x.label for x in targets)} | {target_ms:.4f} | "
                  f"{slots} x {_size(input_slot_bytes(p, t))} | {n} x {reps} |")
        print("    " + "; ".join(f"{b}-bound at T in {_ranges(ts)}" for b, ts in bounds.items())
              + f"; estimated {preset_s:.0f} s")
        total_s += preset_s
    print()
    print(f"estimated wall: ~{total_s:.0f} s ({total_s / 60:.1f} min) after the build, if moejit runs at "
          f"{ASSUMED_CALL_VS_NOMINAL_FLOOR:g}x the nominal floor (the model: bench/moebench/dryrun.py)")
    print(f"report file: {args.out or '(none; pass --out FILE.md)'}")
    return 0


def _ranges(tokens):
    return f"{tokens[0]}..{tokens[-1]}" if len(tokens) > 1 else str(tokens[0])
