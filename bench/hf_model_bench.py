#!/usr/bin/env python3
"""A Hugging Face MoE model's forward with its MoE layers on transformers' grouped_mm, on moejit's
experts implementation (routing stays transformers'), and on moejit's whole blocks (routing, experts
and combine in one call: python/moejit/hf_blocks.py), eager and under torch.compile, in one process.

The model is built from a config (random weights, no download): by default Qwen3-30B-A3B's MoE shape
(hidden 2048, 128 experts, top-8, moe_intermediate 768) with 2 decoder layers, bf16. Each variant
gets its own copy of the same weights. Timing: CUDA events around single forwards (the eager HF
paths sync the host, so no CUDA graphs), median of --iters after --warmup; logits' relative error
against the grouped_mm variant's on one input.

  PYTHONPATH=python python3 bench/hf_model_bench.py --tokens 1 64 2048 --out $OUT/hf_model.md
  python3 bench/hf_model_bench.py --tiny        # CPU, a tiny model: checks that the variants agree
"""

import argparse
import copy
import statistics
import sys
import time

import torch


def build_model(args, device):
    import transformers

    if args.tiny:
        shape = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                     num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    else:  # Qwen3-30B-A3B's published config, with fewer layers
        shape = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                     num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128)
    config = transformers.Qwen3MoeConfig(vocab_size=args.vocab, num_hidden_layers=args.layers, norm_topk_prob=True,
                                         max_position_embeddings=max(args.tokens) + 8, **shape)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    return model.to(device=device, dtype=dtype)


def variants(base, compile_too):
    """(name, model) per variant, each on its own copy of the weights."""
    import moejit

    out = []
    grouped = copy.deepcopy(base)
    grouped.set_experts_implementation("grouped_mm" if next(base.parameters()).is_cuda else "batched_mm")
    out.append(("transformers " + grouped.config._experts_implementation, grouped))
    experts = moejit.patch(copy.deepcopy(base), whole_blocks=False, progress=False)
    out.append(("moejit experts (HF routing)", experts))
    whole = moejit.patch(copy.deepcopy(base), progress=False)
    out.append(("moejit whole blocks", whole))
    if compile_too:
        out.append(("transformers " + grouped.config._experts_implementation + ", inductor",
                    torch.compile(grouped, fullgraph=False)))
        out.append(("moejit experts, compiled", torch.compile(experts, backend="moejit")))
        out.append(("moejit whole blocks, compiled", torch.compile(whole, backend="moejit")))
    return out


def time_forward(model, ids, args, cuda):
    with torch.no_grad():
        for _ in range(args.warmup):
            model(ids)
        times = []
        for _ in range(args.iters):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                model(ids)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                model(ids)
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 2048])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024, help="vocabulary (small: the LM head is not what is measured)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="eager variants only")
    ap.add_argument("--tiny", action="store_true", help="a tiny fp32 model on CPU; exit 1 if the variants disagree")
    ap.add_argument("--out", help="also write the markdown report here")
    args = ap.parse_args(argv)
    if args.tiny:
        args.tokens, args.iters, args.warmup = [1, 5], 2, 1
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    base = build_model(args, device)
    rows, worst = [], 0.0
    names = []
    for name, model in variants(base, compile_too=not args.no_compile):
        names.append(name)
        row = []
        for T in args.tokens:
            ids = torch.randint(0, args.vocab, (1, T), generator=torch.Generator().manual_seed(T)).to(device)
            with torch.no_grad():
                logits = model(ids).logits.float()
            row.append((time_forward(model, ids, args, cuda), logits))
        rows.append(row)
    lines = [f"# HF model forward: Qwen3-MoE-shaped, {args.layers} layers, {'bf16 on ' + torch.cuda.get_device_name() if cuda else 'fp32 on CPU'}",
             "", f"Command: {' '.join(sys.argv)}", "",
             "| variant | " + " | ".join(f"T={T} ms (rel.err)" for T in args.tokens) + " |",
             "|---|" + "---|" * len(args.tokens)]
    for name, row in zip(names, rows):
        cells = []
        for (ms, logits), (_, ref) in zip(row, rows[0]):
            err = float((logits - ref).norm() / ref.norm().clamp_min(1e-30))
            worst = max(worst, err)
            cells.append(f"{ms:.3f} ({err:.1e})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    tolerance = 1e-4 if args.tiny else 5e-2
    if worst > tolerance:
        print(f"hf_model_bench: variants disagree (rel.err {worst:.2e} > {tolerance})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
