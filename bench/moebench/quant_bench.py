"""One preset's quantized layers (--quant), run right after its bf16 rows: each variant's tensors
derived from the preset's bf16 weights, the guard against moejit bf16, the timed points (one row
each of the preset's quantized table) and the driver that runs the variants one after the other."""

import json
import sys
import time
import traceback

import torch

from .baselines import rel_err
from .preset_bench import timing_cell, timing_ms
from .presets import QUANT_MATMUL, layer_flops, quant_expert_bytes
from .quant import QUANT_CHUNK_BYTES, quantize_layer, rowwise_fp8_weights, scaled_grouped_mm_experts
from .report import QUANT_COLUMNS, fmt_err, fmt_ms, fmt_num, short_error

GUARD_TOKENS = 64  # the guard's one input: moejit quantized against moejit bf16
GUARD_LIMIT = 0.1  # above this the run flags the quantization error
# What the guard finds on these random weights (e4m3 keeps 3 mantissa bits: ~2.7% rms per rounding, four
# roundings per layer; int8 with per-row/channel scales: ~1%); --self-test measured 6-7e-2 and 2-3e-2.
EXPECTED = {"fp8_block": "fp8 quantization error, ~5e-2..8e-2 expected", "fp8_tensor": "fp8 quantization error, "
            "~5e-2..8e-2 expected", "w8a8_int8": "int8 quantization error, ~2e-2..4e-2 expected"}


class QuantBench:
    """One quantized variant of a PresetBench (`base`, whose bf16 weights, bias, inputs and timing it
    uses): moejit's quantized tensors and, for fp8 on CUDA, the _scaled_grouped_mm baseline's."""

    def __init__(self, base, quant, moejit):
        self.base, self.quant = base, quant
        self.cfg = moejit.MoeConfig(dtype="bf16", quant=quant, **base.p)
        self.cfg_json = self.cfg.to_json()
        self.notes, self.failed = [], []
        self.t = quantize_layer(base.w13, base.w2, quant, base.gen)
        self.sgmm, self.sgmm_skip = None, None
        if QUANT_MATMUL[quant] != "fp8":
            self.sgmm_skip = "n/a (no torch int8 grouped mm)"
        elif not base.d.cuda:
            self.sgmm_skip = "skipped: CPU (_scaled_grouped_mm is CUDA-only)"
        elif not hasattr(torch, "_scaled_grouped_mm"):
            self.sgmm_skip = f"n/a: torch {torch.__version__} has no _scaled_grouped_mm"
        else:
            try:
                self.sgmm = rowwise_fp8_weights(base.w13, base.w2, quant, self.t)
            except Exception as e:  # noqa: BLE001  (e.g. out of memory: moejit's rows still run)
                self.notes.append(f"{quant} scaled_grouped_mm weights: {short_error(e)}")
                self.sgmm_skip = "failed: its weights (see the notes)"

    def free(self):
        del self.t, self.sgmm

    def calls(self, buf):
        t, cfg, bias = self.t, self.cfg_json, self.base.bias
        q = (t["w13_scale"], t["w2_scale"], t["input_smooth"], t["act_smooth"])
        ops = torch.ops.moejit
        calls = {
            "moejit": lambda s: ops.moe_layer(buf.hidden[s], buf.logits[s], t["w13"], t["w2"], bias, *q, None, cfg),
            "experts": lambda s: ops.experts(buf.hidden[s], buf.ids[s], buf.weights[s], t["w13"], t["w2"], *q, None,
                                             cfg),
        }
        if self.sgmm is not None:
            w13q, s13, w2q, s2 = self.sgmm
            calls["sgmm"] = lambda s: scaled_grouped_mm_experts(buf.hidden[s], buf.ids[s], buf.weights[s], w13q, s13,
                                                                w2q, s2)
        return calls

    def check(self, buf, fill, calls):
        """One input, eager: moejit quantized against moejit bf16 ("bf16"), experts-only against the
        quantized layer ("experts"), the baseline against both ("sgmm_bf16", "sgmm_q"); a baseline that
        fails leaves its short reason in "sgmm_fail" (and the whole error in the notes, once)."""
        fill(1)
        ref = self.base.calls(buf)["moejit"](0)
        out = calls["moejit"](0)
        errs = {"bf16": rel_err(out, ref), "experts": rel_err(calls["experts"](0), out)}
        if "sgmm" in calls:
            try:
                y = calls["sgmm"](0)
                errs["sgmm_bf16"], errs["sgmm_q"] = rel_err(y, ref), rel_err(y, out)
            except Exception as e:  # noqa: BLE001
                msg = short_error(e)
                note = f"{self.quant} scaled_grouped_mm failed: {msg}"
                if note not in self.notes:
                    self.notes.append(note)
                errs["sgmm_fail"] = "failed: " + (msg if len(msg) <= 60 else msg[:57] + "...")
                if self.base.d.cuda:
                    torch.cuda.synchronize()
        return errs

    def guard(self):
        """moejit quantized against moejit bf16 at T=GUARD_TOKENS (one input); a note, flagged above GUARD_LIMIT."""
        buf, fill = self.base.make_inputs(GUARD_TOKENS, 1)
        errs = self.check(buf, fill, self.calls(buf))
        del buf, fill
        line = (f"{self.quant} guard (T={GUARD_TOKENS}, one input): moejit {self.quant} vs moejit bf16 rel.err "
                f"{errs['bf16']:.2e} ({EXPECTED[self.quant]}); experts-only vs the layer "
                f"{errs['experts']:.1e}")
        if "sgmm_bf16" in errs:
            line += (f"; scaled_grouped_mm vs moejit bf16 {errs['sgmm_bf16']:.2e}, vs moejit {self.quant} "
                     f"{errs['sgmm_q']:.2e}")
        self.notes.append(line)
        for what, err, limit in (("moejit", errs["bf16"], GUARD_LIMIT), ("experts-only", errs["experts"], 2e-2),
                                 ("scaled_grouped_mm", errs.get("sgmm_bf16"), GUARD_LIMIT)):
            if err is not None and err > limit:
                self.notes.append(f"FLAG: {self.quant} guard: {what} rel.err {err:.2e} > {limit:g}")
                self.failed.append(self.notes[-1])

    def point(self, tokens, ceil_bw, rate, bf16_ms):
        """One row of the quantized table at `tokens`; bf16_ms: moejit bf16's ms at this T (this run)."""
        base, p, quant = self.base, self.base.p, self.quant
        buf, fill = base.make_inputs(tokens, base.args.calls)
        calls = self.calls(buf)
        errs = self.check(buf, fill, calls)
        skip = {} if "sgmm" in calls and "sgmm_fail" not in errs else {"sgmm": errs.get("sgmm_fail", self.sgmm_skip)}
        timings, modes = base.time_calls(tokens, calls, fill, ("moejit", "experts", "sgmm"), skip=skip,
                                         tag=f" {quant}", log=self, max_calls=buf.slots)
        hit = (buf.hit_sum / max(buf.fills, 1)).item()
        del buf, calls, fill
        if base.d.cuda:
            torch.cuda.empty_cache()
        self.notes.append(f"T={tokens} {quant} calls per graph x replays: {', '.join(modes)}")
        touched = hit * quant_expert_bytes(p, quant)
        flops = layer_flops(p, tokens)
        floor_ms = max(touched / ceil_bw, flops / rate if rate else 0.0) * 1e3
        m, ex, sg = (timing_ms(timings.get(k)) for k in ("moejit", "experts", "sgmm"))
        cuda = base.d.cuda
        row = [
            tokens, quant, timing_cell(timings["moejit"], cuda), timing_cell(timings["experts"], cuda),
            timing_cell(timings["sgmm"], cuda),
            fmt_num(touched / (m * 1e-3) / 1e12, 3) if m else "-",
            fmt_num(flops / (m * 1e-3) / 1e12, 1) if m else "-",
            fmt_ms(floor_ms),
            fmt_num(m / floor_ms, 2) if m else "-",
            fmt_num(m / bf16_ms, 2) if m and bf16_ms else "-",
            fmt_num(ex / sg, 2) if ex and sg else "-",
            f"{fmt_err(errs['bf16'])} / {fmt_err(errs.get('sgmm_bf16'))}",
        ]
        limit = GUARD_LIMIT if tokens >= 16 else 2 * GUARD_LIMIT  # a few rows' error is noisier
        if errs["bf16"] > limit:
            self.notes.append(f"FLAG: T={tokens} {quant}: moejit rel.err {errs['bf16']:.2e} against moejit bf16 "
                              f"> {limit:g}")
            self.failed.append(self.notes[-1])
        if errs["experts"] > 2e-2:
            self.notes.append(f"T={tokens} {quant}: moejit experts-only differs from the layer: rel.err "
                              f"{errs['experts']:.2e}")
            self.failed.append(self.notes[-1])
        return row


def quant_bytes_needed(p, quant, cuda):
    """Device bytes a variant adds to the preset's bf16 weights: its weights (and the baseline's
    per-row copy for fp8_block), the quantizer's temporaries and 2 GiB for inputs and workspace."""
    e = p["experts"]
    weights = e * quant_expert_bytes(p, quant)
    if cuda and quant == "fp8_block":
        weights *= 2
    return weights + 4 * QUANT_CHUNK_BYTES + (2 << 30)


def run_quant_variants(bench, quants, ceil_bw, rates, measured, report, moejit):
    """The preset's quantized table (one row per variant and T, variants in --quant order) and its
    notes; each variant is built from `bench`'s bf16 weights, compiled, guarded, timed and freed before
    the next (or, where --breakdown names this preset, after its per-kernel tables, which follow the
    table). Returns the problems (for the run's list)."""
    name, p, dev, args = bench.name, bench.p, bench.d, bench.args
    report.emit(f"### {name}: quantized layers ({', '.join(quants)})")
    report.emit("")
    report.row(QUANT_COLUMNS)
    report.row(["---"] * len(QUANT_COLUMNS))
    notes, failed, kept = [], [], []
    # --breakdown's points of this preset: each variant's per-kernel table too (after the quantized
    # table; the variants' weights stay on the device until then).
    points = [tokens for bname, tokens in args.breakdown_points if bname == name]
    for quant in quants:
        qb = None
        try:
            if dev.cuda:
                free, need = torch.cuda.mem_get_info(dev.dev)[0], quant_bytes_needed(p, quant, dev.cuda)
                if need > free:
                    notes.append(f"{quant} skipped: it needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")
                    continue
            t0 = time.perf_counter()
            rate = rates[QUANT_MATMUL[quant]][0]
            qb = QuantBench(bench, quant, moejit)
            dev.sync()
            t1 = time.perf_counter()
            summary = moejit.compile(qb.cfg, dev.dev, progress=False)
            compiled = {k: v for k, v in summary.items() if k != "seconds"} if isinstance(summary, dict) else summary
            qb.notes.append(f"{quant}: expert weights {p['experts'] * quant_expert_bytes(p, quant) / 1e9:.2f} GB with "
                            f"scales, quantized from the bf16 ones in {t1 - t0:.1f} s; compiled in "
                            f"{time.perf_counter() - t1:.1f} s; moejit.compile: {json.dumps(compiled)}")
            if rate is None:
                qb.notes.append(f"{quant}: no {QUANT_MATMUL[quant]} matmul rate (its probes failed): qfloor is the "
                                "bandwidth term alone")
            qb.guard()
            for tokens in args.tokens:
                try:
                    row = qb.point(tokens, ceil_bw, rate, (measured.get(tokens) or {}).get("moejit"))
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc(file=sys.stderr)
                    row = [tokens, quant] + ["ERR"] * (len(QUANT_COLUMNS) - 2)
                    qb.notes.append(f"T={tokens} {quant}: {short_error(e)}")
                    qb.failed.append(qb.notes[-1])
                    if dev.cuda:
                        torch.cuda.synchronize()
                report.row(row)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
            notes.append(f"{quant} failed before its first point: {short_error(e)}")
            failed.append(notes[-1])
        finally:
            if qb is not None:
                notes.extend(qb.notes)
                failed.extend(qb.failed)
                if points and not qb.failed:
                    kept.append(qb)
                else:
                    qb.free()
            del qb
            if dev.cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    report.emit("")
    for note in notes:
        report.emit(f"- {note}")
    report.emit("")
    # The breakdowns after the table (their weights were kept for them).
    for qb in kept:
        for tokens in points:
            try:
                bench.breakdown(tokens, None, calls_of=qb.calls, quant=qb.quant)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc(file=sys.stderr)
                report.emit(f"breakdown {name} {qb.quant} T={tokens} failed: {short_error(e)}")
                report.emit("")
        qb.free()
        if dev.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return failed
