"""What the variant benchmarks (shared_bench.py, router_bench.py) share: one layer computed several
ways, each timed in CUDA graphs, its kernel launches counted, its output compared with another's."""

import argparse

import torch


def rel_error(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def rows_apart(a, b, tolerance=1e-2):
    """Rows (tokens) of a whose relative error against b's exceeds the tolerance: a token routed to
    other experts (a near tie in the rounded logits) shows here, rounding alone does not."""
    a, b = a.double().reshape(a.shape[0], -1), b.double().reshape(b.shape[0], -1)
    return int(((a - b).norm(dim=1) > tolerance * b.norm(dim=1).clamp_min(1e-30)).sum())


def profile_kernels(fn, *args):
    """The CUDA kernels one eager call of fn(*args) runs (torch.profiler events), after a warm call."""
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def parse_args(description, argv, presets, default_presets, default_tokens):
    """The options every variant benchmark takes; --self-test shrinks the run to a small CPU layer."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--presets", nargs="+", default=default_presets, choices=presets)
    ap.add_argument("--tokens", nargs="+", type=int, default=default_tokens)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--calls", type=int, default=10, help="max layer calls captured per CUDA graph (default 10)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--min-replays", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=2.0, help="timing budget per variant and point, seconds")
    ap.add_argument("--graph-target-ms", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--self-test", action="store_true", help="a small layer on CPU; exit 1 if the variants disagree")
    ap.add_argument("--out", help="also write the markdown table here")
    args = ap.parse_args(argv)
    if args.self_test:
        args.tokens, args.calls, args.replays, args.min_replays, args.budget_s = [1, 7], 2, 2, 1, 0.1
    return args


def write_report(lines, path):
    if path:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
