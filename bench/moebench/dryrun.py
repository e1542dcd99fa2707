"""--dry-run: the plan without CUDA or moejit: every preset's points with their bytes, FLOPs and a
floor from nominal H200 numbers, and with --quant the quantized layers' floors (nominal too)."""

import json

import torch

from .quant_bench import GUARD_LIMIT, GUARD_TOKENS
from .presets import (NOMINAL_H200, NOMINAL_H200_QUANT, QUANT_MATMUL, expected_hit, expert_bytes, hf_skip_reason,
                      layer_flops, preset_line, quant_expert_bytes, quant_scale_bytes, weight_bytes)


def dry_run(args, presets):
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
            fb, fc = touched / bw, flops / mm
            print(f"    | {t} | {t * p['topk']} | {hit:.1f} | {touched / 1e9:.3f} | {flops / 1e9:.1f} | "
                  f"{max(fb, fc) * 1e3:.4f} | {'memory' if fb >= fc else 'compute'} | "
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
            fb, fc = touched / bw, flops / NOMINAL_H200_QUANT[QUANT_MATMUL[q]]
            cells.append(f"{touched / 1e9:.3f} | {max(fb, fc) * 1e3:.4f} | {'memory' if fb >= fc else 'compute'}")
        print(f"    | {t} | " + " | ".join(cells) + " |")


def _size(nbytes):
    return f"{nbytes} B" if nbytes < 1000 else f"{nbytes / 1e3:.1f} kB"
