"""Shared experts fused into the layer's launches against the shared experts beside it (issue 20).

For the presets with shared experts, at each token count, in one process on one device (CUDA graphs of
several calls, L2 scrubbed before each replay, moebench's timing):
  fused      one moe_layer call with fuse_shared_experts: the shared experts are S more slots of every
             token (weight 1) in the same grouped-GEMM launches
  separate   the shared MLP in torch as an engine runs it (one gate_up GEMM, SiLU x up, one down
             GEMM) passed as the routed layer's residual
  routed     the routed layer alone (what the shared experts cost on top of it)
and each variant's kernel launches per call (torch.profiler over one eager call). The fused layer's
output is checked against the separate one before timing.

  PYTHONPATH=python python3 bench/shared_bench.py --presets deepseek-v3 glm-4.5-air --tokens 1 16 128 1024 4096
  python3 bench/shared_bench.py --self-test   # a small layer on CPU: exit 1 if fused and separate disagree
"""

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from moebench.presets import PRESETS  # noqa: E402
from moebench.timing import Device  # noqa: E402
from moebench.variants import parse_args, profile_kernels, rel_error, write_report  # noqa: E402

import moejit  # noqa: E402

# SPEC.md's presets with shared experts, and how many (moebench's table holds the routed experts only).
SHARED_EXPERTS = {"deepseek-v3": 1, "kimi-k2": 1, "glm-4.5-air": 1, "deepseek-v2-lite": 2}


def preset_config(name, dtype):
    return moejit.MoeConfig(**PRESETS[name], dtype=dtype, n_shared_experts=SHARED_EXPERTS[name])


def small_config():
    return moejit.MoeConfig(experts=8, topk=2, num_expert_group=2, topk_group=1, scoring="sigmoid",
                            topk_method="noaux_tc", renormalize=True, routed_scaling_factor=2.5, hidden=64,
                            moe_intermediate=32, dtype="fp32", n_shared_experts=2)


class Variants:
    """Random weights of one layer (scaled so every expert and the shared MLP contribute) and the three calls."""

    def __init__(self, cfg, device, seed=0):
        fused = dataclasses.replace(cfg, fuse_shared_experts=True)
        routed = dataclasses.replace(cfg, fuse_shared_experts=False)
        g = torch.Generator(device="cpu").manual_seed(seed)
        dt = cfg.torch_dtype
        E, S, H, I = cfg.local_experts, cfg.n_shared_experts, cfg.hidden, cfg.local_intermediate

        def randn(*shape, scale):
            return (torch.randn(*shape, generator=g) * scale).to(dt).to(device)

        self.w13 = randn(*fused.w13_shape(), scale=H ** -0.5)
        self.w2 = randn(*fused.w2_shape(), scale=I ** -0.5)
        self.bias = (torch.randn(cfg.experts, generator=g) * 0.1).to(device) \
            if cfg.topk_method == "noaux_tc" else None
        # The shared MLP as torch holds it (S * I wide): the same numbers as the fused slices.
        self.shared_gate_up = torch.cat([torch.cat([self.w13[E + s, :I] for s in range(S)]),
                                         torch.cat([self.w13[E + s, I:] for s in range(S)])])
        self.shared_down = torch.cat([self.w2[E + s] for s in range(S)], dim=1)
        self.routed_w13, self.routed_w2 = self.w13[:E], self.w2[:E]
        self.fused_json, self.routed_json = fused.to_json(), routed.to_json()
        self.width = S * I
        self.cfg = cfg

    def shared_mlp(self, x):
        gu = torch.nn.functional.linear(x, self.shared_gate_up)
        return torch.nn.functional.linear(torch.nn.functional.silu(gu[:, :self.width]) * gu[:, self.width:],
                                          self.shared_down)

    def fused(self, x, logits):
        return torch.ops.moejit.moe_layer(x, logits, self.w13, self.w2, self.bias, None, None, None, None, None,
                                          self.fused_json)

    def separate(self, x, logits):
        return torch.ops.moejit.moe_layer(x, logits, self.routed_w13, self.routed_w2, self.bias, None, None, None,
                                          None, self.shared_mlp(x), self.routed_json)

    def routed(self, x, logits):
        return torch.ops.moejit.moe_layer(x, logits, self.routed_w13, self.routed_w2, self.bias, None, None, None,
                                          None, None, self.routed_json)


def kernel_launches(fn, x, logits):
    """CUDA kernels one eager call launches (torch.profiler)."""
    return len(profile_kernels(fn, x, logits))


def run(args):
    cuda = torch.cuda.is_available() and not args.self_test
    device = torch.device("cuda" if cuda else "cpu")
    timer = Device(device, args)
    configs = [("small (self-test)", small_config())] if args.self_test else \
        [(name, preset_config(name, args.dtype)) for name in args.presets]
    lines = ["| preset | T | fused ms | separate ms | routed ms | fused / separate | fused - routed (shared cost) ms | "
             "launches fused / separate / routed | rel. error fused vs separate |",
             "|---|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for name, cfg in configs:
        v = Variants(cfg, device, seed=args.seed)
        for T in args.tokens:
            g = torch.Generator(device="cpu").manual_seed(T)
            xs = [torch.randn(T, cfg.hidden, generator=g).to(cfg.torch_dtype).to(device) for _ in range(args.calls)]
            ls = [torch.randn(T, cfg.experts, generator=g).to(cfg.torch_dtype).to(device) for _ in range(args.calls)]
            with torch.no_grad():
                err = rel_error(v.fused(xs[0], ls[0]), v.separate(xs[0], ls[0]))
            worst = max(worst, err)
            ms, launches = {}, {}
            for key in ("fused", "separate", "routed"):
                fn = getattr(v, key)
                ms[key] = timer.time_graph(lambda i, fn=fn: fn(xs[i], ls[i]), lambda n: None, args.calls).ms
                launches[key] = kernel_launches(fn, xs[0], ls[0]) if cuda else "-"
            lines.append(f"| {name} | {T} | {ms['fused']:.4f} | {ms['separate']:.4f} | {ms['routed']:.4f} | "
                         f"{ms['fused'] / ms['separate']:.3f} | {ms['fused'] - ms['routed']:.4f} | "
                         f"{launches['fused']} / {launches['separate']} / {launches['routed']} | {err:.2e} |")
            print(lines[-1], flush=True)
        del v
    write_report(lines, args.out)
    tolerance = 1e-5 if args.self_test else 2e-2
    if worst > tolerance:
        print(f"shared_bench: fused and separate disagree: relative error {worst:.2e} > {tolerance:g}", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    args = parse_args(__doc__.split("\n\n")[0], argv, sorted(SHARED_EXPERTS), ["deepseek-v3", "glm-4.5-air"],
                      [1, 16, 128, 1024, 4096])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
