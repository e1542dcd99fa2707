"""One preset: its random weights, fresh inputs per timed call, the correctness checks, the timed
points (one table row each), the per-kernel breakdowns and the launch-chain probe."""

import os
import sys
import traceback
import types

import torch
import torch.nn.functional as F

from .baselines import grouped_mm_experts, rel_err, torch_route
from .presets import expert_bytes, hf_skip_reason, input_slots, layer_flops
from .report import fmt_err, fmt_ms, fmt_num, short_error
from .targets import floor_and_bound
from .timing import Timing


def timing_ms(t):
    """ms of a Timing; None for a cell that holds a reason instead."""
    return t.ms if isinstance(t, Timing) else None


def timing_cell(t, cuda, graph_expected=True):
    """A table cell: the reason it was not timed, or its ms ("(eager)" when a graph capture failed)."""
    if t is None or isinstance(t, str):
        return t or "-"
    mark = " (eager)" if graph_expected and t.mode != "graph" and cuda else ""
    return fmt_ms(t.ms) + mark


class PresetBench:
    def __init__(self, name, p, dev, args, report, moejit, hf_fn):
        self.name, self.p, self.d, self.args, self.r = name, p, dev, args, report
        self.moejit = moejit
        self.hf_fn = hf_fn
        self.cfg = moejit.MoeConfig(dtype="bf16", **p)
        self.cfg_json = self.cfg.to_json()
        e, h, i = p["experts"], p["hidden"], p["moe_intermediate"]
        device = dev.dev
        gen = torch.Generator(device=device)
        gen.manual_seed(args.seed)
        # uniform-ish random weights, scaled so that activations stay O(1)
        self.w13 = torch.randn(e, 2 * i, h, dtype=torch.bfloat16, device=device, generator=gen).mul_(h ** -0.5)
        self.w2 = torch.randn(e, h, i, dtype=torch.bfloat16, device=device, generator=gen).mul_(i ** -0.5)
        # zero correction bias keeps DeepSeek-style routing uniform
        self.bias = torch.zeros(e, dtype=torch.float32, device=device) if p["topk_method"] == "noaux_tc" else None
        self.hf_self = types.SimpleNamespace(num_experts=e, gate_up_proj=self.w13, down_proj=self.w2, act_fn=F.silu)
        self.gen = gen
        self.route_agree = []
        self.notes = []
        self.failed = []  # per-method errors (also in notes); make --self-test fail

    def free(self):
        del self.w13, self.w2, self.hf_self

    def finish(self, measured_at):
        """The --breakdown points of this preset (measured_at(T): what breakdown() takes as the point's
        timed result; a failure is reported, not raised), then the preset's weights and cached GPU memory
        back, before the next preset allocates its own."""
        for bname, btokens in self.args.breakdown_points:
            if bname != self.name:
                continue
            try:
                self.breakdown(btokens, measured_at(btokens))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc(file=sys.stderr)
                self.r.emit(f"breakdown {self.name} T={btokens} failed: {short_error(e)}")
                self.r.emit("")
        self.free()
        if self.d.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    # -- inputs: `slots` buffers (fewer where they would exceed --input-gib), each [T, ...]; call(i)
    # reads buffer i; buf.slots says how many there are
    def make_inputs(self, tokens, slots):
        p, device = self.p, self.d.dev
        e, k, h = p["experts"], p["topk"], p["hidden"]
        slots = input_slots(p, tokens, slots, int(self.args.input_gib * (1 << 30)))
        buf = types.SimpleNamespace(
            slots=slots,
            hidden=torch.empty(slots, tokens, h, dtype=torch.bfloat16, device=device),
            logits=torch.empty(slots, tokens, e, dtype=torch.bfloat16, device=device),
            ids=torch.empty(slots, tokens, k, dtype=torch.int32, device=device),
            ids64=torch.empty(slots, tokens, k, dtype=torch.int64, device=device),
            weights=torch.empty(slots, tokens, k, dtype=torch.float32, device=device),
            hit_sum=torch.zeros((), dtype=torch.float64, device=device),
            fills=0,
        )

        def fill(n):
            # fresh random hidden states and router logits (iid normal: uniform random routing), and the
            # routing the baselines use, computed by moejit's own route op; all outside any timed region
            buf.hidden[:n].normal_(generator=self.gen)
            buf.logits[:n].normal_(generator=self.gen)
            for s in range(n):
                w, ids = torch.ops.moejit.route(buf.logits[s], self.bias, self.cfg_json)
                buf.ids[s].copy_(ids)
                buf.weights[s].copy_(w)
            buf.ids64[:n].copy_(buf.ids[:n])
            hit = torch.zeros(n, e, device=device).scatter_(1, buf.ids64[:n].view(n, -1), 1.0)
            buf.hit_sum += hit.sum(dtype=torch.float64)
            buf.fills += n

        return buf, fill

    def calls(self, buf):
        w13, w2, bias, cfg = self.w13, self.w2, self.bias, self.cfg_json
        ops = torch.ops.moejit
        return {
            "moejit": lambda s: ops.moe_layer(buf.hidden[s], buf.logits[s], w13, w2, bias, None, None, None, None,
                                              None, cfg),
            "experts": lambda s: ops.experts(buf.hidden[s], buf.ids[s], buf.weights[s], w13, w2, None, None, None,
                                             None, None, cfg),
            "grouped_mm": lambda s: grouped_mm_experts(buf.hidden[s], buf.ids[s], buf.weights[s], w13, w2),
            "hf": lambda s: self.hf_fn(self.hf_self, buf.hidden[s], buf.ids64[s], buf.weights[s]),
        }

    def check(self, buf, fill, calls, hf_skip):
        """One input, eager: every implementation against the moejit layer (also the first eager moejit
        call at this T, so nothing is loaded inside a capture); routing ids against torch's routing."""
        fill(1)
        ref = calls["moejit"](0)
        errs = {"experts": rel_err(calls["experts"](0), ref)}
        try:
            errs["grouped_mm"] = rel_err(calls["grouped_mm"](0), ref)
        except Exception as e:  # noqa: BLE001
            errs["grouped_mm"] = None
            self.notes.append(f"T={buf.hidden.shape[1]} grouped_mm check: {short_error(e)}")
            self.failed.append(self.notes[-1])
        if hf_skip is None:
            try:
                errs["hf"] = rel_err(calls["hf"](0), ref)
            except Exception as e:  # noqa: BLE001
                errs["hf"] = None
                self.notes.append(f"T={buf.hidden.shape[1]} HF check: {short_error(e)}")
                self.failed.append(self.notes[-1])
        try:
            _, tids = torch_route(buf.logits[0], self.bias, self.p)
            same = (tids.sort(-1).values == buf.ids64[0].sort(-1).values).all(-1).float().mean().item()
            self.route_agree.append(same)
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"routing cross-check: {short_error(e)}")
        return errs

    def point(self, tokens, ceil_bw, ceil_mm):
        args, p = self.args, self.p
        hf_skip = hf_skip_reason(p, tokens, args)
        buf, fill = self.make_inputs(tokens, args.calls)
        calls = self.calls(buf)
        errs = self.check(buf, fill, calls, hf_skip)
        timings, modes = self.time_calls(tokens, calls, fill, ("moejit", "experts", "grouped_mm", "hf"),
                                         eager=("hf",), skip={"hf": hf_skip} if hf_skip else {},
                                         max_calls=buf.slots)
        hit = (buf.hit_sum / max(buf.fills, 1)).item()
        del buf, calls
        if self.d.cuda:
            torch.cuda.empty_cache()
        self.notes.append(f"T={tokens} calls per graph x replays: {', '.join(modes)}")

        def ms_of(key):
            return timing_ms(timings.get(key))

        def cell(key, graph_expected=True):
            return timing_cell(timings.get(key), self.d.cuda, graph_expected)

        touched = hit * expert_bytes(p)
        flops = layer_flops(p, tokens)
        floor_ms, _ = floor_and_bound(touched, flops, ceil_bw, ceil_mm)
        m, ex, gm = ms_of("moejit"), ms_of("experts"), ms_of("grouped_mm")
        row = [
            tokens, cell("moejit"), cell("experts"), cell("grouped_mm"), cell("hf", graph_expected=False),
            fmt_num(touched / (m * 1e-3) / 1e12, 3) if m else "-",
            fmt_num(flops / (m * 1e-3) / 1e12, 1) if m else "-",
            fmt_ms(floor_ms),
            fmt_num(m / floor_ms, 2) if m else "-",
            fmt_num(ex / gm, 2) if ex and gm else "-",
            f"{hit:.1f}",
            f"{fmt_err(errs.get('grouped_mm'))} / {fmt_err(errs.get('hf')) if hf_skip is None else '-'}",
        ]
        if errs["experts"] > 1e-2:
            self.notes.append(f"T={tokens}: moejit experts-only differs from the layer: rel.err {errs['experts']:.2e}")
        return row, {"moejit": m, "experts": ex, "grouped_mm": gm, "errs": errs}

    def layer_point(self, tokens, with_grouped_mm=False):
        """--targets at `tokens`: the moejit layer timed alone (and grouped_mm when asked), after one eager
        call whose output must be finite (grouped_mm's is compared with it). Returns ({key: Timing or the
        reason there is none}, ["key mode callsxreps", ...], experts hit per call (the mean over every
        input timed), grouped_mm's rel.err or None)."""
        buf, fill = self.make_inputs(tokens, self.args.calls)
        calls = self.calls(buf)
        fill(1)
        out = calls["moejit"](0)  # also the first call at this T, outside any capture
        if not torch.isfinite(out).all().item():
            self.notes.append(f"T={tokens}: the moejit layer's output is not finite")
            self.failed.append(self.notes[-1])
        keys, skip, err = ["moejit"], {}, None
        if with_grouped_mm:
            keys.append("grouped_mm")
            try:
                err = rel_err(calls["grouped_mm"](0), out)
                if err > 2e-2:
                    self.notes.append(f"T={tokens}: grouped_mm rel.err {err:.2e} against the moejit layer")
                    self.failed.append(self.notes[-1])
            except Exception as e:  # noqa: BLE001
                skip["grouped_mm"] = "ERR"
                self.notes.append(f"T={tokens} grouped_mm check: {short_error(e)}")
                self.failed.append(self.notes[-1])
        del out
        timings, modes = self.time_calls(tokens, calls, fill, keys, skip=skip, max_calls=buf.slots)
        hit = (buf.hit_sum / max(buf.fills, 1)).item()
        del buf, calls, fill
        if self.d.cuda:
            torch.cuda.empty_cache()
        return timings, modes, hit, err

    def time_calls(self, tokens, calls, fill, keys, eager=(), skip=None, tag="", log=None, max_calls=None):
        """({key: Timing, or a string saying why there is none}, ["key mode callsxreps", ...]): each of
        `keys` timed as a CUDA graph of <= max_calls calls (the input buffers; default --calls), those in
        `eager` as single eager calls; `skip` {key: reason}. Problems go to log.notes and log.failed (log:
        this bench by default)."""
        log = log or self
        timings, modes = {}, []
        for key in keys:
            if skip and key in skip:
                timings[key] = skip[key]
                continue
            try:
                t = self.d.time_eager(calls[key], fill) if key in eager else \
                    self.d.time_graph(calls[key], fill, max_calls or self.args.calls)
                timings[key] = t
                modes.append(f"{key} {t.mode.split(' ')[0]} {t.calls}x{t.reps}")
                if t.mode.startswith("eager (capture failed"):
                    log.notes.append(f"T={tokens}{tag} {key}: {t.mode}")
            except Exception as e:  # noqa: BLE001
                timings[key] = "ERR"  # (not the exception: its traceback would keep the point's tensors alive)
                log.notes.append(f"T={tokens}{tag} {key}: {short_error(e)}")
                log.failed.append(log.notes[-1])
                traceback.print_exc(file=sys.stderr)
                if self.d.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
        return timings, modes

    def breakdown(self, tokens, measured_ms, calls_of=None, quant=None):
        """The per-kernel table at `tokens` of moejit's layer and grouped_mm's; with `calls_of` (a
        QuantBench's calls) and `quant`, of that quantized moejit layer alone."""
        args = self.args
        buf, fill = self.make_inputs(tokens, args.profile_iters)
        iters = buf.slots  # --profile-iters, fewer where their inputs would exceed --input-gib
        calls = (calls_of or self.calls)(buf)
        fill(1)
        calls["moejit"](0)  # first eager call at this T outside the profiler
        self.r.emit(f"#### Per-kernel breakdown: {self.name}{f' {quant}' if quant else ''} T={tokens} "
                    f"({iters} eager calls, "
                    f"{'CUDA kernels' if self.d.cuda else 'CPU operators'}, torch.profiler)")
        if (self.d.cuda and torch.cuda.get_device_capability()[0] >= 9
                and os.environ.get("MOEJIT_PDL", "1") not in ("0", "false", "off", "no")):
            # moejit launches a call's kernels after the first with programmatic dependent launch
            # (sm_90+): a kernel's span then starts while the previous one still runs.
            self.r.emit("")
            self.r.emit("moejit's kernel spans overlap (programmatic dependent launch; MOEJIT_PDL=0 separates "
                        "them): a kernel after the first includes time spent waiting for its predecessor.")
        layers = ((("moejit", f"moejit {quant} layer (moe_layer)"),) if quant else
                  (("moejit", "moejit layer (moe_layer)"), ("grouped_mm", "grouped_mm layer (experts only)")))
        for key, label in layers:
            try:
                stats = self.d.kernel_breakdown(calls[key], fill, iters)
            except Exception as e:  # noqa: BLE001
                self.r.emit(f"- {label}: profiler failed: {short_error(e)}")
                continue
            total = sum(v[1] for v in stats.values()) / iters
            graph_ms = measured_ms.get(key) if measured_ms else None
            self.r.emit("")
            self.r.emit(f"{label}: kernels sum to {total:.1f} us per call"
                        + (f" (timed at this point: {graph_ms * 1e3:.1f} us per call"
                           f"{', CUDA graph' if self.d.cuda else ''})" if graph_ms else ""))
            self.r.emit("")
            self.r.row(["kernel", "launches/call", "us/launch", "us/call", "share"])
            self.r.row(["---"] * 5)
            for name, (count, us) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
                short = name if len(name) <= 100 else name[:97] + "..."
                self.r.row([f"`{short.replace('|', '/')}`", f"{count / iters:g}", f"{us / count:.1f}",
                            f"{us / iters:.1f}", f"{100 * us / iters / max(total, 1e-9):.1f}%"])
        self.r.emit("")
        del buf, calls
        if self.d.cuda:
            torch.cuda.empty_cache()


# Decode's fixed cost: the layer with the preset's routing, launches and dependencies, but weights so
# small that streaming them takes well under a microsecond.
CHAIN_PROBE_DIMS = dict(hidden=256, moe_intermediate=128)
CHAIN_PROBE_MAX_TOKENS = 16


def chain_probe(name, p, dev, args, report, moejit, measured):
    """Times the moejit layer of `p` shrunk to CHAIN_PROBE_DIMS (same experts, top-k, scoring) at the
    run's decode token counts and emits one line: what a decode call costs besides its weight bytes."""
    tokens = [t for t in args.tokens if t <= CHAIN_PROBE_MAX_TOKENS]
    if not tokens:
        return
    probe = None
    try:
        probe = PresetBench(name, dict(p, **CHAIN_PROBE_DIMS), dev, args, report, moejit, None)
        moejit.compile(probe.cfg, dev.dev, progress=False)
        cells = []
        for t in tokens:
            buf, fill = probe.make_inputs(t, args.calls)
            chain_ms = dev.time_graph(probe.calls(buf)["moejit"], fill, buf.slots).ms
            full_ms = (measured.get(t) or {}).get("moejit")
            cells.append(f"T={t} {chain_ms * 1e3:.1f} us" +
                         (f" ({100 * chain_ms / full_ms:.0f}% of the layer's {full_ms * 1e3:.1f} us)" if full_ms else ""))
            del buf, fill
        report.emit(f"- launch chain: the same layer at H={CHAIN_PROBE_DIMS['hidden']}, "
                    f"I={CHAIN_PROBE_DIMS['moe_intermediate']} (the same routing, launches and dependencies, "
                    f"almost no weight bytes; CUDA graph): {', '.join(cells)}")
    except Exception as e:  # noqa: BLE001
        traceback.print_exc(file=sys.stderr)
        report.emit(f"- launch chain probe failed: {short_error(e)}")
    finally:
        if probe is not None:
            probe.free()
        del probe
        torch.cuda.empty_cache()
