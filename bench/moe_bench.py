#!/usr/bin/env python3
"""moejit layer benchmark: moejit vs a torch._grouped_mm layer vs the Hugging Face eager loop.

One process, random bf16 weights (per preset, freed before the next), uniform random routing (iid
normal router logits), fresh random inputs for every timed call, CUDA-graph timing. Per point it
prints ms, TB/s of the expert weights actually touched, TFLOP/s and the ratio to the floor

    floor = max(touched expert bytes / read bandwidth, 6*T*K*H*I / bf16 matmul rate)

with both ceilings measured at the start of the same run (a large read-only reduction; an 8192^3
bf16 matmul). Also a per-kernel time breakdown (torch.profiler) at three points.

Usage (from the repository root, after scripts/build.sh):

    PYTHONPATH=python python3 bench/moe_bench.py                       # full: 3 presets x 7 token counts
    PYTHONPATH=python python3 bench/moe_bench.py --quick               # T in {1,16,256,4096}, ~2-4 min
    PYTHONPATH=python python3 bench/moe_bench.py --presets deepseek-v3 --tokens 1 64 --out /tmp/r.md
    python3 bench/moe_bench.py --dry-run                               # the plan only: no CUDA, no moejit
    PYTHONPATH=python python3 bench/moe_bench.py --self-test           # tiny shapes; checks the math
                                                                       # (runs on CPU with moejit's CPU ops)

What each timing includes (every timing starts from inputs already in device memory):
  moejit ms          torch.ops.moejit.moe_layer(hidden, router_logits, ...): the whole layer = routing from
                     the bf16 logits + index + experts + combine. CUDA graph of n calls, median ms per call.
  moejit experts ms  torch.ops.moejit.experts(hidden, topk_ids, topk_weights, ...): stages 2-6 only, the
                     ids/weights precomputed (outside the timed region) by torch.ops.moejit.route.
  grouped_mm ms      a torch layer on the same precomputed ids/weights: stable sort of the pairs by expert,
                     row gather, per-expert offsets (searchsorted, int32), torch._grouped_mm with w13^T,
                     silu(gate)*up, torch._grouped_mm with w2^T, weighting, unsort, sum over K (fp32).
                     CUDA graph of n calls, median per call.
  HF eager ms        transformers' MixtralExperts eager forward (a Python loop over the experts hit, with
                     .nonzero()/torch.where host syncs; the loop is the same for Qwen3-MoE and DeepSeek-V3)
                     on the same precomputed ids (int64) and weights. Not graph-capturable: timed eagerly,
                     CUDA events around each single call (host syncs included), median.
  launch chain       per preset, the moejit layer with H=256, I=128 and the preset's experts, top-k and
                     scoring, at the run's T <= 16: its routing, launches and dependencies with almost no
                     weight bytes, i.e. what a decode call costs besides streaming its weights.
Baselines exclude routing; "moejit/grouped_mm" therefore compares experts-only with grouped_mm.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import types

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------------
# Presets: SPEC.md's table (routed experts only; shared experts are a dense MLP outside this benchmark).
# Keys are moejit.MoeConfig fields.
PRESETS = {
    "mixtral-8x7b": dict(experts=8, topk=2, scoring="softmax", topk_method="greedy", renormalize=True,
                         routed_scaling_factor=1.0, hidden=4096, moe_intermediate=14336),
    "qwen3-30b-a3b": dict(experts=128, topk=8, scoring="softmax", topk_method="greedy", renormalize=True,
                          routed_scaling_factor=1.0, hidden=2048, moe_intermediate=768),
    "deepseek-v3": dict(experts=256, topk=8, num_expert_group=8, topk_group=4, scoring="sigmoid",
                        topk_method="noaux_tc", renormalize=True, routed_scaling_factor=2.5, hidden=7168,
                        moe_intermediate=2048),
    "qwen3-235b-a22b": dict(experts=128, topk=8, scoring="softmax", topk_method="greedy", renormalize=True,
                            routed_scaling_factor=1.0, hidden=4096, moe_intermediate=1536),
    "deepseek-v2-lite": dict(experts=64, topk=6, scoring="softmax", topk_method="greedy", renormalize=False,
                             routed_scaling_factor=1.0, hidden=2048, moe_intermediate=1408),
    "kimi-k2": dict(experts=384, topk=8, num_expert_group=1, topk_group=1, scoring="sigmoid",
                    topk_method="noaux_tc", renormalize=True, routed_scaling_factor=2.827, hidden=7168,
                    moe_intermediate=2048),
    "qwen3-next-80b-a3b": dict(experts=512, topk=10, scoring="softmax", topk_method="greedy", renormalize=True,
                               routed_scaling_factor=1.0, hidden=2048, moe_intermediate=512),
    "glm-4.5-air": dict(experts=128, topk=8, num_expert_group=1, topk_group=1, scoring="sigmoid",
                        topk_method="noaux_tc", renormalize=True, routed_scaling_factor=1.0, hidden=4096,
                        moe_intermediate=1408),
}
DEFAULT_PRESETS = ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"]

# --self-test: the same routing/expert structure at tiny sizes (runs on CPU with moejit's CPU ops).
TINY_PRESETS = {
    "tiny-mixtral": dict(PRESETS["mixtral-8x7b"], hidden=128, moe_intermediate=256),
    "tiny-qwen3": dict(PRESETS["qwen3-30b-a3b"], hidden=64, moe_intermediate=32),
    "tiny-deepseek": dict(PRESETS["deepseek-v3"], hidden=128, moe_intermediate=64),
}
TINY_TOKENS = [1, 7, 64]

FULL_TOKENS = [1, 4, 16, 64, 256, 1024, 4096]
QUICK_TOKENS = [1, 16, 256, 4096]
DEFAULT_BREAKDOWN = "qwen3-30b-a3b:16,mixtral-8x7b:4096,deepseek-v3:64"
NOMINAL_H200 = (4.8e12, 989e12)  # datasheet HBM3e B/s and dense bf16 FLOP/s; only --dry-run uses these
BF16_BYTES = 2

COLUMNS = ["T", "moejit ms", "moejit experts-only ms", "grouped_mm ms", "HF eager ms", "TB/s (moejit)",
           "TFLOP/s (moejit)", "floor ms", "moejit/floor", "moejit/grouped_mm", "experts hit",
           "rel.err grouped_mm / HF"]

LEGEND = """\
Columns (every timing starts from inputs already in GPU memory; each timed call sees fresh random inputs):
- moejit ms: torch.ops.moejit.moe_layer from bf16 router logits = routing + index + experts + combine
  (the whole layer). CUDA graph of n back-to-back calls, each on its own input buffer; median ms per call.
- moejit experts-only ms: torch.ops.moejit.experts (stages 2-6) on ids/weights precomputed by
  torch.ops.moejit.route outside the timed region. CUDA graph, as above.
- grouped_mm ms: torch layer on the same precomputed ids/weights: stable sort of the pairs, row gather,
  int32 offsets, torch._grouped_mm(x, w13^T), silu(gate)*up, torch._grouped_mm(act, w2^T), weighting, unsort,
  fp32 sum over K. CUDA graph, as above.
- HF eager ms: transformers' MixtralExperts eager forward (loop over the experts hit; the same loop as
  Qwen3-MoE's and DeepSeek-V3's) on the same precomputed ids/weights. It syncs the host (.nonzero(),
  torch.where), so it cannot be graph-captured: CUDA events around each single eager call, median.
- A "(eager)" mark on a graph column means its capture failed and it was timed like HF eager.
- TB/s, TFLOP/s: of the moejit layer (moejit ms). Touched bytes = distinct experts hit per call (measured
  from the ids of every timed input, mean) * 3*H*I*2; FLOPs = 6*T*K*H*I.
- floor ms = max(touched bytes / read bandwidth, FLOPs / bf16 matmul rate), the ceilings measured above.
- moejit/floor = moejit ms / floor ms (the whole layer, routing included, against an experts-only floor).
- moejit/grouped_mm = moejit experts-only ms / grouped_mm ms (both exclude routing; < 1 means moejit is faster).
- rel.err: ||out - out_moejit||_F / ||out_moejit||_F of grouped_mm and HF eager against the moejit layer,
  on one input, same routing (a check that the three compute the same math; bf16 tolerance 2e-2)."""


# ---------------------------------------------------------------------------------------------------
# Small helpers


def preset_line(name, p):
    groups = f" groups {p.get('num_expert_group', 1)}/{p.get('topk_group', 1)}" if p.get("num_expert_group", 1) > 1 else ""
    return (f"E={p['experts']} K={p['topk']}{groups} {p['scoring']} {p['topk_method']} "
            f"renorm={'yes' if p['renormalize'] else 'no'} scale={p['routed_scaling_factor']} "
            f"H={p['hidden']} I={p['moe_intermediate']}")


def expert_bytes(p):
    return 3 * p["hidden"] * p["moe_intermediate"] * BF16_BYTES


def weight_bytes(p):
    return p["experts"] * expert_bytes(p)


def layer_flops(p, tokens):
    return 6 * tokens * p["topk"] * p["hidden"] * p["moe_intermediate"]


def expected_hit(p, tokens):
    # Uniform routing: every expert is in a token's top-k with probability K/E (also with DeepSeek's
    # group limit, by symmetry); tokens are independent.
    e, k = p["experts"], p["topk"]
    return e * (1.0 - (1.0 - k / e) ** tokens)


def hf_skip_reason(p, tokens, args):
    if args.no_hf:
        return "skipped (--no-hf)"
    if not args.hf_all and p["experts"] >= 256 and tokens >= 1024:
        return "skipped"  # 256+ experts x thousands of tokens: the Python loop takes too long for this run
    return None


def fmt_ms(x):
    if x is None:
        return "-"
    if x < 0.1:
        return f"{x:.4f}"
    if x < 10:
        return f"{x:.3f}"
    return f"{x:.2f}"


def fmt_num(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_err(x):
    return "-" if x is None else f"{x:.1e}"


def short_error(e):
    msg = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    return msg if len(msg) < 300 else msg[:297] + "..."


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


def git_revision():
    """The tree's commit. A copy of a working tree (the device machine's) can carry stale git metadata,
    so MOEJIT_BENCH_COMMIT, set by whoever knows what was copied, comes first."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        found = (rev + ("+dirty" if dirty else "")) if rev else "unknown"
    except Exception:  # noqa: BLE001
        found = "unknown"
    named = os.environ.get("MOEJIT_BENCH_COMMIT", "").strip()
    return f"{named} (MOEJIT_BENCH_COMMIT; the copy's git metadata says {found})" if named else found


class Report:
    """Prints every line as it comes (flushed) and mirrors it to --out."""

    def __init__(self, path=None):
        self.file = open(path, "w") if path else None

    def emit(self, line=""):
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()

    def row(self, cells):
        self.emit("| " + " | ".join(str(c) for c in cells) + " |")

    def close(self):
        if self.file:
            self.file.close()


# ---------------------------------------------------------------------------------------------------
# The math of the baselines


def torch_route(logits, bias, p):
    """SPEC.md stage 1 in torch (a cross-check of moejit's routing ids; ties may order differently)."""
    x = logits.float()
    s = torch.softmax(x, dim=-1) if p["scoring"] == "softmax" else torch.sigmoid(x)
    noaux = p["topk_method"] == "noaux_tc"
    q = s + bias if noaux else s
    groups = p.get("num_expert_group", 1)
    if groups > 1:
        t, e = q.shape
        qg = q.view(t, groups, e // groups)
        gscore = qg.topk(2, dim=-1).values.sum(-1) if noaux else qg.amax(-1)
        keep = gscore.topk(p["topk_group"], dim=-1).indices
        allowed = torch.zeros(t, groups, dtype=torch.bool, device=q.device).scatter_(1, keep, True)
        q = q.masked_fill(~allowed.repeat_interleave(e // groups, dim=1), float("-inf"))
    ids = q.topk(p["topk"], dim=-1).indices
    w = s.gather(1, ids)
    if p["renormalize"]:
        total = w.sum(-1, keepdim=True)
        w = torch.where(total > 0, w / total, w)
    return w * p["routed_scaling_factor"], ids


def grouped_mm_experts(hidden, ids, weights, w13, w2):
    """Routed experts with torch._grouped_mm (what transformers' "grouped_mm" implementation does, made
    CUDA-graph safe: no host syncs). ids [T,K] int32, weights [T,K] fp32."""
    tokens, hid = hidden.shape
    k = ids.shape[1]
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    sorted_ids, perm = torch.sort(ids.reshape(-1), stable=True)
    x = hidden.index_select(0, perm // k)
    bounds = torch.arange(experts, device=ids.device, dtype=sorted_ids.dtype)
    offs = torch.searchsorted(sorted_ids, bounds, right=True).to(torch.int32)  # inclusive cumsum of counts
    g = torch._grouped_mm(x, w13.transpose(-2, -1), offs=offs)  # [M, 2I]
    act = F.silu(g[:, :inter]) * g[:, inter:]
    y = torch._grouped_mm(act, w2.transpose(-2, -1), offs=offs)  # [M, H]
    yw = y * weights.reshape(-1)[perm].to(y.dtype).unsqueeze(1)
    unsorted = torch.empty_like(yw).index_copy_(0, perm, yw)
    return unsorted.view(tokens, k, hid).sum(dim=1, dtype=torch.float32).to(hidden.dtype)


def _hf_eager_copy(self, hidden_states, top_k_index, top_k_weights):
    # transformers 5.17 MixtralExperts.forward (the eager implementation), verbatim but for names;
    # used only when transformers cannot be imported.
    final_hidden_states = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts)
        expert_mask = expert_mask.permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:
        expert_idx = expert_idx[0]
        if expert_idx == self.num_experts:
            continue
        top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
        current_state = hidden_states[token_idx]
        gate, up = torch.nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
        current_hidden_states = self.act_fn(gate) * up
        current_hidden_states = torch.nn.functional.linear(current_hidden_states, self.down_proj[expert_idx])
        current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
    return final_hidden_states


def hf_eager_forward():
    """(function(self, hidden, top_k_index, top_k_weights), description): transformers' own eager
    MixtralExperts.forward (unwrapped from the experts-implementation dispatcher), else a copy."""
    try:
        import transformers
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts

        fn = getattr(MixtralExperts.forward, "__wrapped__", None)
        if fn is not None:
            return fn, f"transformers {transformers.__version__} MixtralExperts.forward (eager loop)"
    except Exception:  # noqa: BLE001
        pass
    return _hf_eager_copy, "a copy of transformers 5.17 MixtralExperts eager forward (transformers not importable)"


def rel_err(a, b):
    a, b = a.float(), b.float()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30)).item()


# ---------------------------------------------------------------------------------------------------
# Timing

Timing = collections.namedtuple("Timing", "ms mode calls reps")


class Device:
    """Timing primitives: CUDA graphs + events on CUDA; perf_counter on CPU (--self-test only)."""

    def __init__(self, device, args):
        self.dev = device
        self.cuda = device.type == "cuda"
        self.args = args
        self.scrub_buf = None
        if self.cuda:
            # Written before each timed replay so that nothing of the previous call stays in L2.
            self.scrub_buf = torch.empty(256 << 20, dtype=torch.uint8, device=device)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def scrub(self):
        if self.scrub_buf is not None:
            self.scrub_buf.zero_()

    def _events(self):
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def eager_once_ms(self, call, slot=0):
        self.sync()
        t0 = time.perf_counter()
        call(slot)
        self.sync()
        return (time.perf_counter() - t0) * 1e3

    def time_graph(self, call, fill, max_calls):
        """Median ms per call of a CUDA graph of n calls (call(i) reads input buffer i); every replay
        sees freshly filled buffers (filled outside the timed region). n and the replay count adapt to
        the call's eager time so that slow points stay within --budget-s."""
        args = self.args
        if not self.cuda:
            return self.time_eager(call, fill)
        fill(max_calls)
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):
            for i in range(min(2, max_calls)):
                call(i)
        torch.cuda.current_stream(self.dev).wait_stream(side)
        est = min(self.eager_once_ms(call, 0), self.eager_once_ms(call, 0))
        n = max(1, min(max_calls, int(args.graph_target_ms / max(est, 1e-3))))
        reps = max(args.min_replays, min(args.replays, int(args.budget_s * 1e3 / max(n * est, 1e-3))))
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream(self.dev)
        try:
            with torch.cuda.graph(graph):
                outs = [call(i) for i in range(n)]
        except Exception as e:  # noqa: BLE001
            del graph
            torch.cuda.set_stream(stream)  # in case the failed capture left its side stream current
            self.sync()
            t = self.time_eager(call, fill)
            return Timing(t.ms, f"eager (capture failed: {short_error(e)})", t.calls, t.reps)
        start, end = self._events()
        times = []
        for _ in range(reps):
            fill(n)
            self.scrub()
            self.sync()
            torch.cuda._sleep(200_000)  # keeps the GPU busy while the replay is enqueued
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / n)
        del outs, graph
        return Timing(statistics.median(times), "graph", n, reps)

    def time_eager(self, call, fill):
        """Median ms of single eager calls, each on a freshly filled buffer (CUDA events; perf_counter on CPU)."""
        args = self.args
        fill(1)
        call(0)  # warm-up
        est = self.eager_once_ms(call, 0)
        reps = max(args.min_replays, min(args.replays, int(args.budget_s * 1e3 / max(est, 1e-3))))
        times = []
        for _ in range(reps):
            fill(1)
            self.scrub()
            self.sync()
            if self.cuda:
                start, end = self._events()
                start.record()
                call(0)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                times.append(self.eager_once_ms(call, 0))
        return Timing(statistics.median(times), "eager", 1, reps)

    def ceilings(self, bw_gib):
        """(read bandwidth B/s, bf16 matmul FLOP/s, details): a large read-only reduction and an 8192^3
        bf16 matmul on random data, medians of 10 timed runs."""
        if not self.cuda:  # --self-test on CPU: small sizes, just so the arithmetic runs
            x = torch.randn(16 << 20, dtype=torch.bfloat16)
            t = min(self._cpu_ms(lambda: x.sum()) for _ in range(3))
            a = torch.randn(512, 512, dtype=torch.bfloat16)
            tm = min(self._cpu_ms(lambda: a @ a) for _ in range(3))
            bw, mm = x.numel() * 2 / (t * 1e-3), 2 * 512 ** 3 / (tm * 1e-3)
            return bw, mm, f"CPU: sum of 32 MiB bf16, 512^3 matmul"
        details = []
        numel = int(bw_gib * (1 << 30)) // BF16_BYTES // 2 * 2  # even: also read as fp32
        x = torch.empty(numel, dtype=torch.bfloat16, device=self.dev).normal_()
        best_bw = 0.0
        for label, view in (("bf16 torch.sum", x), ("fp32-view torch.sum", x.view(torch.float32))):
            ms = self._cuda_median_ms(lambda v=view: torch.sum(v, dtype=torch.float32), warm=2, reps=10)
            bw = numel * BF16_BYTES / (ms * 1e-3)
            details.append(f"{label} over {bw_gib:g} GiB: {ms:.3f} ms = {bw / 1e12:.3f} TB/s")
            best_bw = max(best_bw, bw)
        del x
        n = 8192
        a = torch.randn(n, n, dtype=torch.bfloat16, device=self.dev)
        b = torch.randn(n, n, dtype=torch.bfloat16, device=self.dev)
        c = torch.empty(n, n, dtype=torch.bfloat16, device=self.dev)
        ms = self._cuda_median_ms(lambda: torch.matmul(a, b, out=c), warm=5, reps=10)
        mm = 2 * n ** 3 / (ms * 1e-3)
        details.append(f"bf16 torch.matmul {n}^3 (random data): {ms:.3f} ms = {mm / 1e12:.1f} TFLOP/s")
        del a, b, c
        torch.cuda.empty_cache()
        return best_bw, mm, "; ".join(details)

    def _cpu_ms(self, fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def _cuda_median_ms(self, fn, warm, reps):
        for _ in range(warm):
            fn()
        self.sync()
        times = []
        for _ in range(reps):
            start, end = self._events()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def kernel_breakdown(self, call, fill, iters):
        """{kernel name: (launches, total us)} over `iters` eager calls (CPU: top-level operators)."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        fill(iters)
        call(0)
        self.sync()
        activities = [ProfilerActivity.CUDA] if self.cuda else [ProfilerActivity.CPU]
        with profile(activities=activities) as prof:
            for i in range(iters):
                call(i)
            self.sync()
        stats = collections.defaultdict(lambda: [0, 0.0])
        for evt in prof.events():
            if self.cuda:
                if evt.device_type != DeviceType.CUDA:
                    continue
                dur = evt.time_range.elapsed_us()
            else:
                if evt.cpu_parent is not None:
                    continue
                dur = evt.cpu_time_total
            stats[evt.name][0] += 1
            stats[evt.name][1] += dur
        return dict(stats)


# ---------------------------------------------------------------------------------------------------
# One preset


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

    # -- inputs: `slots` buffers, each [T, ...]; call(i) reads buffer i
    def make_inputs(self, tokens, slots):
        p, device = self.p, self.d.dev
        e, k, h = p["experts"], p["topk"], p["hidden"]
        buf = types.SimpleNamespace(
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
        timings, modes = {}, []
        for key in ("moejit", "experts", "grouped_mm", "hf"):
            if key == "hf" and hf_skip is not None:
                timings[key] = hf_skip
                continue
            try:
                t = self.d.time_eager(calls[key], fill) if key == "hf" else \
                    self.d.time_graph(calls[key], fill, args.calls)
                timings[key] = t
                modes.append(f"{key} {t.mode.split(' ')[0]} {t.calls}x{t.reps}")
                if t.mode.startswith("eager (capture failed"):
                    self.notes.append(f"T={tokens} {key}: {t.mode}")
            except Exception as e:  # noqa: BLE001
                timings[key] = "ERR"  # (not the exception: its traceback would keep the point's tensors alive)
                self.notes.append(f"T={tokens} {key}: {short_error(e)}")
                self.failed.append(self.notes[-1])
                traceback.print_exc(file=sys.stderr)
                if self.d.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
        hit = (buf.hit_sum / max(buf.fills, 1)).item()
        del buf, calls
        if self.d.cuda:
            torch.cuda.empty_cache()
        self.notes.append(f"T={tokens} calls per graph x replays: {', '.join(modes)}")

        def ms_of(key):
            t = timings.get(key)
            return t.ms if isinstance(t, Timing) else None

        def cell(key, graph_expected=True):
            t = timings.get(key)
            if isinstance(t, str):
                return t
            mark = " (eager)" if graph_expected and t.mode != "graph" and self.d.cuda else ""
            return fmt_ms(t.ms) + mark

        touched = hit * expert_bytes(p)
        flops = layer_flops(p, tokens)
        floor_ms = max(touched / ceil_bw, flops / ceil_mm) * 1e3
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

    def breakdown(self, tokens, measured_ms):
        args = self.args
        buf, fill = self.make_inputs(tokens, args.profile_iters)
        calls = self.calls(buf)
        fill(1)
        calls["moejit"](0)  # first eager call at this T outside the profiler
        self.r.emit(f"#### Per-kernel breakdown: {self.name} T={tokens} ({args.profile_iters} eager calls, "
                    f"{'CUDA kernels' if self.d.cuda else 'CPU operators'}, torch.profiler)")
        if (self.d.cuda and torch.cuda.get_device_capability()[0] >= 9
                and os.environ.get("MOEJIT_PDL", "1") not in ("0", "false", "off", "no")):
            # moejit launches a call's kernels after the first with programmatic dependent launch
            # (sm_90+): a kernel's span then starts while the previous one still runs.
            self.r.emit("")
            self.r.emit("moejit's kernel spans overlap (programmatic dependent launch; MOEJIT_PDL=0 separates "
                        "them): a kernel after the first includes time spent waiting for its predecessor.")
        for key, label in (("moejit", "moejit layer (moe_layer)"), ("grouped_mm", "grouped_mm layer (experts only)")):
            try:
                stats = self.d.kernel_breakdown(calls[key], fill, args.profile_iters)
            except Exception as e:  # noqa: BLE001
                self.r.emit(f"- {label}: profiler failed: {short_error(e)}")
                continue
            total = sum(v[1] for v in stats.values()) / args.profile_iters
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
                self.r.row([f"`{short.replace('|', '/')}`", f"{count / args.profile_iters:g}", f"{us / count:.1f}",
                            f"{us / args.profile_iters:.1f}", f"{100 * us / args.profile_iters / max(total, 1e-9):.1f}%"])
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
            chain_ms = dev.time_graph(probe.calls(buf)["moejit"], fill, args.calls).ms
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


# ---------------------------------------------------------------------------------------------------
# Driver


def build_parser():
    ap = argparse.ArgumentParser(
        description="Benchmark moejit's fused MoE layer against a torch._grouped_mm layer and the Hugging Face "
                    "eager loop (CUDA-graph timing, uniform random routing, fresh inputs, measured ceilings).",
        epilog="Run from the repository root as PYTHONPATH=python python3 bench/moe_bench.py [...].\n\n" +
               __doc__[__doc__.index("What each timing includes"):],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=None, metavar="PRESET",
                    help=f"presets to run (default: {' '.join(DEFAULT_PRESETS)}; known: {', '.join(PRESETS)})")
    ap.add_argument("--tokens", nargs="+", type=int, default=None, metavar="T",
                    help=f"token counts (default {FULL_TOKENS}; with --quick {QUICK_TOKENS})")
    ap.add_argument("--quick", action="store_true",
                    help="T in {1,16,256,4096}, fewer replays and a smaller time budget per timing (~2-4 min on an H200)")
    ap.add_argument("--dry-run", action="store_true", help="print the planned points and exit (no CUDA, no moejit)")
    ap.add_argument("--self-test", action="store_true",
                    help="run the whole benchmark on tiny shapes (CPU when there is no GPU) and check that moejit, "
                         "grouped_mm and the HF loop agree; exit status 1 on a mismatch (presets: "
                         + ", ".join(TINY_PRESETS) + f"; T {TINY_TOKENS})")
    ap.add_argument("--out", metavar="FILE.md", help="also write the report (markdown) to this file")
    ap.add_argument("--calls", type=int, default=10, help="max layer calls captured per CUDA graph (default 10)")
    ap.add_argument("--replays", type=int, default=None, help="max timed replays per timing (default 20; --quick 5)")
    ap.add_argument("--min-replays", type=int, default=3, help="min timed replays per timing (default 3)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="rough time budget per timing, seconds: limits calls x replays for slow points "
                         "(default 3; --quick 1)")
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
        args.presets = list(TINY_PRESETS) if args.self_test else list(DEFAULT_PRESETS)
    unknown = [p for p in args.presets if p not in presets]
    if unknown:
        raise SystemExit(f"unknown preset(s) {unknown}; known: {', '.join(presets)}")
    if args.tokens is None:
        args.tokens = TINY_TOKENS if args.self_test else (QUICK_TOKENS if args.quick else FULL_TOKENS)
    if any(t < 1 for t in args.tokens):
        raise SystemExit("--tokens must be >= 1")
    if args.replays is None:
        args.replays = 5 if (args.quick or args.self_test) else 20
    if args.budget_s is None:
        args.budget_s = 0.2 if args.self_test else (1.0 if args.quick else 3.0)
    args.min_replays = max(1, min(args.min_replays, args.replays))
    args.calls = max(1, args.calls)
    args.breakdown_points = parse_breakdown(args.breakdown)
    if args.self_test and args.breakdown == DEFAULT_BREAKDOWN:
        args.breakdown_points = [("tiny-qwen3", 7)]
    return presets


def dry_run(args, presets):
    bw, mm = NOMINAL_H200
    print(f"moe_bench dry run (no CUDA, no moejit; torch {torch.__version__}): {len(args.presets)} preset(s) x "
          f"{len(args.tokens)} token count(s)")
    print(f"timing: CUDA graphs of <= {args.calls} calls, <= {args.replays} replays (>= {args.min_replays}), "
          f"~{args.budget_s:g} s budget per timing; ceilings measured first: torch.sum over {args.bw_gib:g} GiB bf16, "
          "8192^3 bf16 matmul")
    print(f"floor below uses nominal H200 numbers ({bw / 1e12:g} TB/s, {mm / 1e12:g} TFLOP/s) and the expected "
          "distinct experts of uniform routing; the real run measures both")
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
    print()
    bd = [f"{n} T={t}" for n, t in args.breakdown_points if n in args.presets]
    print(f"per-kernel breakdown (torch.profiler, {args.profile_iters} eager calls): {', '.join(bd) or 'none'}")
    print(f"report file: {args.out or '(none; pass --out FILE.md)'}")
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
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

    import moejit  # loads the op library (ImportError lists where it looked)

    hf_fn, hf_desc = (None, "not run (--no-hf)") if args.no_hf else hf_eager_forward()
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
    report.emit(f"# moejit layer benchmark{' (self-test, tiny shapes)' if args.self_test else ''}")
    report.emit("")
    report.emit(f"- Date: {now}; commit {git_revision()}; host {platform.node()}")
    report.emit(f"- GPU: {gpu}")
    report.emit(f"- torch {torch.__version__}, CUDA {torch.version.cuda}, moejit {getattr(moejit, '__version__', '?')} "
                f"from {moejit.library_path()}; HF eager: {hf_desc}")
    report.emit(f"- Command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    timing = (f"CUDA graphs of <= {args.calls} calls (each on its own input buffer), <= {args.replays} replays, "
              "fresh random inputs copied in and a 256 MiB L2 scrub before each replay (not timed); median per call"
              if dev.cuda else f"CPU self-test: eager calls timed with perf_counter, <= {args.replays} each; median")
    report.emit(f"- Timing: {timing}. Weights bf16 random; router logits bf16 iid normal; zero correction bias.")
    t0 = time.perf_counter()
    bw, mm, details = dev.ceilings(args.bw_gib)
    report.emit(f"- Ceilings (measured now): read bandwidth {bw / 1e12:.3f} TB/s, bf16 matmul {mm / 1e12:.1f} TFLOP/s "
                f"({details}; {time.perf_counter() - t0:.1f} s)")
    report.emit("")
    report.emit(LEGEND)
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
        if dev.cuda and not args.self_test and not args.no_chain_probe:
            chain_probe(name, p, dev, args, report, moejit, measured)
        report.emit("")
        for bname, btokens in args.breakdown_points:
            if bname != name:
                continue
            try:
                bench.breakdown(btokens, measured.get(btokens))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc(file=sys.stderr)
                report.emit(f"breakdown {name} T={btokens} failed: {short_error(e)}")
                report.emit("")
        bench.free()
        del bench
        if dev.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

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


if __name__ == "__main__":
    sys.exit(main())
