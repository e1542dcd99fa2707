"""Timing on the device: CUDA graphs of n calls with CUDA events (perf_counter on CPU, --self-test
only), single eager calls, the read-bandwidth (torch.sum and a Triton read kernel, the best) and bf16
matmul ceilings the floor is computed from, and the per-kernel breakdown with torch.profiler."""

import collections
import statistics
import time

import torch

from .presets import BF16_BYTES
from .report import short_error

# One timing: ms per call, how it was timed ("graph", "eager", ...), calls per graph, replays.
Timing = collections.namedtuple("Timing", "ms mode calls reps")


def graph_shape(est_ms, max_calls, args):
    """(calls per graph, replays) for a call of about est_ms: calls up to --graph-target-ms of work (at
    most max_calls, the input buffers), replays up to --budget-s of work (between --min-replays and
    --replays). The dry run's time estimate uses it too."""
    n = max(1, min(max_calls, int(args.graph_target_ms / max(est_ms, 1e-3))))
    reps = max(args.min_replays, min(args.replays, int(args.budget_s * 1e3 / max(n * est_ms, 1e-3))))
    return n, reps


class Device:
    """Timing primitives: CUDA graphs + events on CUDA; perf_counter on CPU (--self-test only)."""

    def __init__(self, device, args):
        self.dev = device
        self.cuda = device.type == "cuda"
        self.args = args
        self.scrub_buf = None
        self.read_kernel = None  # the Triton read kernel, built at the first ceilings
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
        n, reps = graph_shape(est, max_calls, args)
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
        """(read bandwidth B/s, bf16 matmul FLOP/s, details): the best of large read-only reductions
        (torch.sum of the bf16 buffer and of its fp32 view; the Triton read kernel's launches) and an
        8192^3 bf16 matmul on random data, medians of 10 timed runs; details lists each one."""
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
        reads = []  # (B/s, label)
        for label, view in (("bf16 torch.sum", x), ("fp32-view torch.sum", x.view(torch.float32))):
            ms = self._cuda_median_ms(lambda v=view: torch.sum(v, dtype=torch.float32), warm=2, reps=10)
            bw = numel * BF16_BYTES / (ms * 1e-3)
            details.append(f"{label} over {bw_gib:g} GiB: {ms:.3f} ms = {bw / 1e12:.3f} TB/s")
            reads.append((bw, label))
        triton_reads, why_not = self._triton_reads(x)
        if triton_reads:
            (bw, ms, label), others = triton_reads[0], triton_reads[1:]
            details.append(f"Triton vectorized read over {bw_gib:g} GiB: {ms:.3f} ms = {bw / 1e12:.3f} TB/s ({label}"
                           + (f"; its other launches {', '.join(f'{o[0] / 1e12:.3f}' for o in others)} TB/s"
                              if others else "") + ")")
            reads.append((bw, "Triton read"))
        else:
            details.append(f"Triton vectorized read: not run ({why_not})")
        best_bw, best_label = max(reads)
        details.append(f"read ceiling = {best_label}")
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

    def _triton_reads(self, x):
        """([(B/s, ms, launch label)], fastest first; None) of the Triton read kernel over x, one entry per
        launch configuration, each checked first on a buffer of ones; ([], why) when it cannot run."""
        try:
            from .read_kernel import LAUNCHES, ReadProbe, build_kernel, check_probe

            if self.read_kernel is None:
                self.read_kernel = build_kernel()
            kernel = self.read_kernel
            sms = torch.cuda.get_device_properties(self.dev).multi_processor_count
            results = []
            for block, warps, per_sm in LAUNCHES:
                check_probe(kernel, self.dev, block, warps, per_sm, sms)
                probe = ReadProbe(kernel, x, block, warps, per_sm, sms)
                ms = self._cuda_median_ms(probe, warm=2, reps=10)
                results.append((probe.bytes / (ms * 1e-3), ms, probe.label))
                del probe
            return sorted(results, reverse=True), None
        except Exception as e:  # noqa: BLE001  (no Triton, no compiler for its launcher, a failed check)
            return [], short_error(e)

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
            # the GPU stays busy while fn is enqueued, so its launch cost (Triton's launcher: tens of us)
            # is not timed as an idle GPU
            torch.cuda._sleep(200_000)
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
