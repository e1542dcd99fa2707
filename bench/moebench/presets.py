"""The benchmark's presets and token counts, and the arithmetic of one point: expert bytes, FLOPs,
the distinct experts uniform routing hits, and which points skip the Hugging Face eager loop."""

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

# Quantized experts (SPEC.md "Quantized experts"): the --quant values besides "none", the matmul each
# one's floor is computed with, and the datasheet's dense H200 rates of those (--dry-run only).
QUANTS = ("fp8_block", "fp8_tensor", "w8a8_int8")
QUANT_MATMUL = {"fp8_block": "fp8", "fp8_tensor": "fp8", "w8a8_int8": "int8"}
NOMINAL_H200_QUANT = {"fp8": 1979e12, "int8": 1979e12}  # dense e4m3 FLOP/s, dense int8 OPS
FP8_BLOCK = 128


def preset_line(name, p):
    groups = f" groups {p.get('num_expert_group', 1)}/{p.get('topk_group', 1)}" if p.get("num_expert_group", 1) > 1 else ""
    return (f"E={p['experts']} K={p['topk']}{groups} {p['scoring']} {p['topk_method']} "
            f"renorm={'yes' if p['renormalize'] else 'no'} scale={p['routed_scaling_factor']} "
            f"H={p['hidden']} I={p['moe_intermediate']}")


def expert_bytes(p):
    return 3 * p["hidden"] * p["moe_intermediate"] * BF16_BYTES


def quant_scale_bytes(p, quant):
    """fp32 bytes of one expert's scales (and, for w8a8_int8, its smoothing factors: input_smooth is
    indexed by the global expert, so a touched expert reads its row too)."""
    h, i = p["hidden"], p["moe_intermediate"]
    if quant == "fp8_block":
        def blocks(n):
            return -(-n // FP8_BLOCK)

        return 4 * (blocks(2 * i) * blocks(h) + blocks(h) * blocks(i))
    if quant == "fp8_tensor":
        return 4 * 2
    if quant == "w8a8_int8":
        return 4 * (2 * i + h + h + i)  # w13_scale, w2_scale, input_smooth, act_smooth
    raise ValueError(f"unknown quant {quant!r}")


def quant_expert_bytes(p, quant):
    """One expert's bytes in a quantized layer: 1 byte per weight element plus its scale bytes."""
    return 3 * p["hidden"] * p["moe_intermediate"] + quant_scale_bytes(p, quant)


def weight_bytes(p):
    return p["experts"] * expert_bytes(p)


def layer_flops(p, tokens):
    return 6 * tokens * p["topk"] * p["hidden"] * p["moe_intermediate"]


def expected_hit(p, tokens):
    # Uniform routing: every expert is in a token's top-k with probability K/E (also with DeepSeek's
    # group limit, by symmetry); tokens are independent.
    e, k = p["experts"], p["topk"]
    return e * (1.0 - (1.0 - k / e) ** tokens)


def input_slot_bytes(p, tokens):
    """Device bytes of one timed call's inputs (PresetBench.make_inputs): bf16 hidden and router logits,
    the routing as int32 ids, int64 ids and fp32 weights."""
    return tokens * (p["hidden"] * BF16_BYTES + p["experts"] * BF16_BYTES + p["topk"] * (4 + 8 + 4))


def input_slots(p, tokens, wanted, cap_bytes):
    """How many input buffers (= calls per CUDA graph at most) a point gets: `wanted`, fewer where they
    would exceed cap_bytes (at T=32768, H=7168 one is 0.5 GB), at least one."""
    return max(1, min(wanted, cap_bytes // input_slot_bytes(p, tokens)))


def hf_skip_reason(p, tokens, args):
    if args.no_hf:
        return "skipped (--no-hf)"
    if not args.hf_all and p["experts"] >= 256 and tokens >= 1024:
        return "skipped"  # 256+ experts x thousands of tokens: the Python loop takes too long for this run
    return None
