"""The router GEMM computed by the layer against the router linear beside it (issue 20, item 1).

For each preset, at each token count, in one process on one device (CUDA graphs of several calls,
L2 scrubbed before each replay, moebench's timing):
  fused      one moe_layer_gate call (router_gemm): the layer computes logits = hidden @ gate^T in
             its own first launch, and its routing reads them
  separate   the router as the model computes it in torch (F.linear in the model dtype for Mixtral
             and Qwen3; in fp32 on fp32 copies for DeepSeek-V3-style routers, as Hugging Face's
             DeepseekV3TopkRouter does), then moe_layer on its logits
  routed     moe_layer on logits computed beforehand (the layer without any router: the floor the
             router adds to)
and per variant: kernel launches of one eager call and the router kernels' own time (torch.profiler,
eager). The fused output is compared with the separate one (their logits differ by the fp32 sum
order, so a bf16 logit may round the other way and flip a near tie: the error is reported).

  PYTHONPATH=python python3 bench/router_bench.py --presets qwen3-30b-a3b mixtral-8x7b deepseek-v3 --tokens 1 16 256 4096
  python3 bench/router_bench.py --self-test   # a small layer on CPU: exit 1 if fused and separate disagree
"""

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from moebench.presets import PRESETS  # noqa: E402
from moebench.timing import Device  # noqa: E402
from moebench.variants import parse_args, profile_kernels, rel_error, rows_apart, write_report  # noqa: E402

import moejit  # noqa: E402

# Routers whose Hugging Face module computes the logits in fp32 from fp32 copies of hidden and the
# weight (DeepseekV3TopkRouter and the models built on it); the others are an nn.Linear in the model dtype.
FP32_ROUTERS = {"deepseek-v3", "kimi-k2", "glm-4.5-air", "deepseek-v2-lite"}


def preset_config(name, dtype):
    return moejit.MoeConfig(**PRESETS[name], dtype=dtype, router_dtype="fp32" if name in FP32_ROUTERS else dtype)


def small_config():
    return moejit.MoeConfig(experts=8, topk=2, hidden=64, moe_intermediate=32, dtype="fp32")


class Variants:
    def __init__(self, cfg, device, seed=0):
        gated = dataclasses.replace(cfg, router_gemm=True)
        plain = dataclasses.replace(cfg, router_gemm=False)
        g = torch.Generator(device="cpu").manual_seed(seed)
        dt = cfg.torch_dtype
        H, I = cfg.hidden, cfg.local_intermediate

        def randn(*shape, scale):
            return (torch.randn(*shape, generator=g) * scale).to(dt).to(device)

        self.w13 = randn(*cfg.w13_shape(), scale=H ** -0.5)
        self.w2 = randn(*cfg.w2_shape(), scale=I ** -0.5)
        self.gate = randn(cfg.experts, H, scale=2 * H ** -0.5)
        self.bias = (torch.randn(cfg.experts, generator=g) * 0.1).to(device) \
            if cfg.topk_method == "noaux_tc" else None
        self.fp32_router = cfg.router_torch_dtype == torch.float32 and dt != torch.float32
        self.gated_json, self.plain_json = gated.to_json(), plain.to_json()

    def router(self, x):
        if self.fp32_router:
            return torch.nn.functional.linear(x.float(), self.gate.float())
        return torch.nn.functional.linear(x, self.gate)

    def fused(self, x, logits):
        return torch.ops.moejit.moe_layer_gate(x, self.gate, self.w13, self.w2, self.bias, None, None, None, None,
                                               None, self.gated_json)

    def separate(self, x, logits):
        return torch.ops.moejit.moe_layer(x, self.router(x), self.w13, self.w2, self.bias, None, None, None, None,
                                          None, self.plain_json)

    def routed(self, x, logits):
        return torch.ops.moejit.moe_layer(x, logits, self.w13, self.w2, self.bias, None, None, None, None, None,
                                          self.plain_json)


def profile_call(fn, x, logits):
    """(kernel launches of one eager call, microseconds in its router kernels: moejit's router GEMM,
    or every kernel that is not moejit's, i.e. torch's casts and GEMM)."""
    kernels = profile_kernels(fn, x, logits)
    router_us = sum(e.device_time for e in kernels
                    if "router_gemm" in e.name or not e.name.startswith("moejit_"))
    return len(kernels), router_us


def run(args):
    cuda = torch.cuda.is_available() and not args.self_test
    device = torch.device("cuda" if cuda else "cpu")
    timer = Device(device, args)
    configs = [("small (self-test)", small_config())] if args.self_test else \
        [(name, preset_config(name, args.dtype)) for name in args.presets]
    lines = ["| preset | router | T | fused ms | separate ms | routed ms | fused / separate | "
             "router cost fused / separate ms | router kernels fused / separate us | launches fused / separate / routed | "
             "rel. error fused vs separate | tokens apart (> 1%) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for name, cfg in configs:
        v = Variants(cfg, device, seed=args.seed)
        for T in args.tokens:
            g = torch.Generator(device="cpu").manual_seed(T)
            xs = [torch.randn(T, cfg.hidden, generator=g).to(cfg.torch_dtype).to(device) for _ in range(args.calls)]
            with torch.no_grad():
                ls = [v.router(x).to(cfg.router_torch_dtype) for x in xs]
                fused_out, separate_out = v.fused(xs[0], ls[0]), v.separate(xs[0], ls[0])
                err, apart = rel_error(fused_out, separate_out), rows_apart(fused_out, separate_out)
            worst = max(worst, err)
            ms, launches, router_us = {}, {}, {}
            for key in ("fused", "separate", "routed"):
                fn = getattr(v, key)
                ms[key] = timer.time_graph(lambda i, fn=fn: fn(xs[i], ls[i]), lambda n: None, args.calls).ms
                launches[key], router_us[key] = profile_call(fn, xs[0], ls[0]) if cuda else ("-", 0.0)
            router = "fp32" if v.fp32_router else cfg.dtype
            lines.append(f"| {name} | {router} | {T} | {ms['fused']:.4f} | {ms['separate']:.4f} | {ms['routed']:.4f} | "
                         f"{ms['fused'] / ms['separate']:.3f} | {ms['fused'] - ms['routed']:.4f} / "
                         f"{ms['separate'] - ms['routed']:.4f} | {router_us['fused']:.1f} / {router_us['separate']:.1f} | "
                         f"{launches['fused']} / {launches['separate']} / {launches['routed']} | {err:.2e} | {apart} |")
            print(lines[-1], flush=True)
        del v
    write_report(lines, args.out)
    # On CPU both variants run the same fp32 matmul: they must agree. On the GPU the sums' order
    # differs, and a near tie in rounded logits may route one token differently: reported, not failed.
    if args.self_test and worst > 1e-5:
        print(f"router_bench: fused and separate disagree: relative error {worst:.2e}", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    args = parse_args(__doc__.split("\n\n")[0], argv, sorted(PRESETS), ["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3"],
                      [1, 16, 256, 4096])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
