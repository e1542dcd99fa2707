#!/usr/bin/env python3
"""A Hugging Face MoE model's forward with its MoE layers on transformers' grouped_mm, on moejit's
experts implementation (routing stays transformers'), and on moejit's whole blocks (routing, experts
and combine in one call: python/moejit/hf_blocks.py), eager and under torch.compile, in one process.

The model is built from a config (random weights, no download), with --layers decoder layers, bf16:
  --model qwen3_moe    (default) Qwen3-30B-A3B's MoE shape: hidden 2048, 128 experts, top-8,
                       moe_intermediate 768
  --model deepseek_v3  DeepSeek-V3's MoE shape: hidden 7168, 256 experts, top-8 of 8 groups (best 4),
                       moe_intermediate 2048, one shared expert, every layer MoE; attention kept cheap
                       (8 heads, no q LoRA). Its whole blocks run twice: the shared expert fused in the
                       call (moejit.patch's default) and as the call's residual (torch's shared MLP,
                       fuse_shared_experts=False), to measure what the fusion saves.
Each variant builds its own model from the same seed (the same weights), on the device, and is freed
before the next is built: a 2-layer DeepSeek-V3-shaped model is 45 GB. Timing: CUDA events around
single forwards (the eager HF paths sync the host, so no CUDA graphs), median of --iters after
--warmup; logits' relative error against the grouped_mm variant's on one input.

  PYTHONPATH=python python3 bench/hf_model_bench.py --tokens 1 64 2048 --out $OUT/hf_model.md
  PYTHONPATH=python python3 bench/hf_model_bench.py --model deepseek_v3 --no-compile --tokens 1 16 128 2048
  python3 bench/hf_model_bench.py --tiny [--model deepseek_v3]   # CPU, a tiny model: the variants agree
"""

import argparse
import gc
import statistics
import sys
import time

import torch

MODELS = {"qwen3_moe": "Qwen3-MoE", "deepseek_v3": "DeepSeek-V3"}


def model_config(args):
    """(config, model class) of --model at its published MoE shape, or a tiny one with --tiny."""
    import transformers

    positions = dict(vocab_size=args.vocab, num_hidden_layers=args.layers, max_position_embeddings=max(args.tokens) + 8)
    if args.model == "deepseek_v3":
        if args.tiny:
            shape = dict(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                         n_group=2, topk_group=1, num_attention_heads=4, kv_lora_rank=16, qk_rope_head_dim=8,
                         qk_nope_head_dim=8, v_head_dim=16)
        else:  # DeepSeek-V3's published MoE shape; its attention (128 heads, q LoRA) is not what is measured
            shape = dict(hidden_size=7168, moe_intermediate_size=2048, n_routed_experts=256, num_experts_per_tok=8,
                         n_group=8, topk_group=4, num_attention_heads=8, kv_lora_rank=512, qk_rope_head_dim=64,
                         qk_nope_head_dim=128, v_head_dim=128)
        config = transformers.DeepseekV3Config(
            **positions, **shape, num_key_value_heads=shape["num_attention_heads"], q_lora_rank=None,
            n_shared_experts=1, first_k_dense_replace=0, routed_scaling_factor=2.5, norm_topk_prob=True)
        return config, transformers.DeepseekV3ForCausalLM
    if args.tiny:
        shape = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                     num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    else:  # Qwen3-30B-A3B's published config, with fewer layers
        shape = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                     num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128)
    return transformers.Qwen3MoeConfig(**positions, **shape, norm_topk_prob=True), transformers.Qwen3MoeForCausalLM


def build_model(args, device):
    """The model on the device in its dtype (fp32 for --tiny, else bf16), weights ~ N(0, std) (and
    DeepSeek's correction bias) drawn from a generator on the device seeded 0: every call builds the
    same weights. std 0.02; 0.1 for --tiny, whose MoE output would otherwise be too small to move the
    fp32 logits at all (its check would pass with any experts)."""
    config, model_cls = model_config(args)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    std = 0.1 if args.tiny else 0.02
    with torch.device(device):
        model = model_cls._from_config(config, dtype=dtype).eval()
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std, generator=gen)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, std, generator=gen)
    return model


def variants(args, device, compile_too):
    """(name, build the eager model, compiled variant's name or None, torch.compile arguments), each
    build on a fresh copy of the same weights."""
    import moejit

    impl = "grouped_mm" if device.type == "cuda" else "batched_mm"

    def transformers_impl():
        model = build_model(args, device)
        model.set_experts_implementation(impl)
        return model

    def patched(**kwargs):
        return lambda: moejit.patch(build_model(args, device), progress=False, **kwargs)

    out = [(f"transformers {impl}", transformers_impl, f"transformers {impl}, inductor", dict(fullgraph=False)),
           ("moejit experts (HF routing)", patched(whole_blocks=False), "moejit experts, compiled",
            dict(backend="moejit"))]
    if args.model == "deepseek_v3":
        out += [("moejit whole blocks, shared experts fused", patched(),
                 "moejit whole blocks, shared experts fused, compiled", dict(backend="moejit")),
                ("moejit whole blocks, shared experts as residual", patched(fuse_shared_experts=False),
                 "moejit whole blocks, shared experts as residual, compiled", dict(backend="moejit"))]
    else:
        out.append(("moejit whole blocks", patched(), "moejit whole blocks, compiled", dict(backend="moejit")))
    return [(name, build, cname if compile_too else None, ckw) for name, build, cname, ckw in out]


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


def measure(model, args, device, cuda):
    """[(ms, logits)] per --tokens T."""
    row = []
    for T in args.tokens:
        ids = torch.randint(0, args.vocab, (1, T), generator=torch.Generator().manual_seed(T)).to(device)
        with torch.no_grad():
            logits = model(ids).logits.float()
        row.append((time_forward(model, ids, args, cuda), logits))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen3_moe", help="the MoE shape (module docstring)")
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
    eager, compiled, results = [], [], {}
    for name, build, compiled_name, compile_kwargs in variants(args, device, compile_too=not args.no_compile):
        model = build()
        eager.append(name)
        results[name] = measure(model, args, device, cuda)
        if compiled_name is not None:
            compiled.append(compiled_name)
            results[compiled_name] = measure(torch.compile(model, **compile_kwargs), args, device, cuda)
        # One model at a time on the device; each compiled variant starts from an empty dynamo cache.
        del model
        torch._dynamo.reset()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    names = eager + compiled
    where = "bf16 on " + torch.cuda.get_device_name() if cuda else "fp32 on CPU"
    lines = [f"# HF model forward: {MODELS[args.model]}-shaped, {args.layers} layers, {where}",
             "", f"Command: {' '.join(sys.argv)}", "",
             "| variant | " + " | ".join(f"T={T} ms (rel.err)" for T in args.tokens) + " |",
             "|---|" + "---|" * len(args.tokens)]
    worst = 0.0
    for name in names:
        cells = []
        for (ms, logits), (_, ref) in zip(results[name], results[names[0]]):
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
