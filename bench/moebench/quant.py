"""Quantized experts in torch (SPEC.md "Quantized experts"): the bf16 weights quantized for moejit's
fp8_block / fp8_tensor / w8a8_int8 layers and, per output row, for the torch._scaled_grouped_mm
baseline layer; that baseline; and the quantized matmul ceilings (torch._scaled_mm, torch._int_mm).
Weights are quantized on their own device a few experts at a time, so that the fp32 temporaries stay
within QUANT_CHUNK_BYTES."""

import torch
import torch.nn.functional as F

from .presets import FP8_BLOCK

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value; converting a larger value gives NaN, hence the clamps
INT8_MAX = 127.0
AMAX_MIN = 1e-10  # as SPEC.md's activations: an all-zero block or row gets a tiny scale, not a 0 division
QUANT_CHUNK_BYTES = 512 << 20  # fp32 bytes of the experts quantized at once (a few times that at peak)


def _chunks(w):
    """Ranges [a, b) of experts of w [E, N, K] whose fp32 copy fits QUANT_CHUNK_BYTES (at least one)."""
    step = max(1, QUANT_CHUNK_BYTES // (w[0].numel() * 4))
    return [(a, min(a + step, w.shape[0])) for a in range(0, w.shape[0], step)]


def fp8_block(w):
    """w [E, N, K] -> (e4m3 [E, N, K], fp32 scales [E, ceil(N/128), ceil(K/128)]): one scale per
    128x128 block (partial blocks at the edges over the elements that exist) = its amax / 448."""
    e, n, k = w.shape
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    scale = torch.empty(e, nb, kb, dtype=torch.float32, device=w.device)
    for a, b in _chunks(w):
        x = F.pad(w[a:b].to(torch.float32, copy=True), (0, kb * FP8_BLOCK - k, 0, nb * FP8_BLOCK - n))
        blocks = x.view(b - a, nb, FP8_BLOCK, kb, FP8_BLOCK)
        s = blocks.abs().amax(dim=(2, 4)).clamp_min_(AMAX_MIN).div_(FP8_MAX)
        scale[a:b] = s
        x = blocks.div_(s[:, :, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).view(b - a, nb * FP8_BLOCK, kb * FP8_BLOCK)
        q[a:b] = x[:, :n, :k].to(FP8)
        del x, blocks, s
    return q, scale


def fp8_tensor(w):
    """w [E, N, K] -> (e4m3 [E, N, K], fp32 scales [E]): one scale per expert matrix = its amax / 448."""
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    for a, b in _chunks(w):
        x = w[a:b].to(torch.float32, copy=True)
        s = x.abs().amax(dim=(1, 2)).clamp_min_(AMAX_MIN).div_(FP8_MAX)
        scale[a:b] = s
        q[a:b] = x.div_(s[:, None, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
        del x, s
    return q, scale


def per_row(w, qmax, dtype, smooth=None):
    """w [E, N, K] (divided by smooth [E, K] first when given) -> (dtype [E, N, K], fp32 scales [E, N]):
    one scale per output row = its amax / qmax; int8 rounds to nearest even, fp8 converts (both clamp)."""
    q = torch.empty(w.shape, dtype=dtype, device=w.device)
    scale = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
    for a, b in _chunks(w):
        x = w[a:b].to(torch.float32, copy=True)
        if smooth is not None:
            x.div_(smooth[a:b, None, :])
        s = x.abs().amax(dim=2).clamp_min_(AMAX_MIN).div_(qmax)
        scale[a:b] = s
        x.div_(s[:, :, None])
        if dtype == torch.int8:
            x.round_()
        q[a:b] = x.clamp_(-qmax, qmax).to(dtype)
        del x, s
    return q, scale


def quantize_layer(w13, w2, quant, gen):
    """moejit's tensors of a quantized layer with the math of the bf16 layer (w13, w2) as closely as the
    quantization allows: {w13, w2, w13_scale, w2_scale, input_smooth, act_smooth} (None where unused).
    w8a8_int8's smoothing factors are uniform in [0.5, 2]; moejit multiplies the activations by them,
    so the weights are divided by them (per input channel) before the per-channel int8 rounding."""
    t = dict(input_smooth=None, act_smooth=None)
    if quant == "fp8_block":
        (t["w13"], t["w13_scale"]), (t["w2"], t["w2_scale"]) = fp8_block(w13), fp8_block(w2)
    elif quant == "fp8_tensor":
        (t["w13"], t["w13_scale"]), (t["w2"], t["w2_scale"]) = fp8_tensor(w13), fp8_tensor(w2)
    elif quant == "w8a8_int8":
        e, h, i = w2.shape
        dev = w13.device
        t["input_smooth"] = torch.empty(e, h, dtype=torch.float32, device=dev).uniform_(0.5, 2.0, generator=gen)
        t["act_smooth"] = torch.empty(e, i, dtype=torch.float32, device=dev).uniform_(0.5, 2.0, generator=gen)
        t["w13"], t["w13_scale"] = per_row(w13, INT8_MAX, torch.int8, t["input_smooth"])
        t["w2"], t["w2_scale"] = per_row(w2, INT8_MAX, torch.int8, t["act_smooth"])
    else:
        raise ValueError(f"unknown quant {quant!r}")
    return t


def rowwise_fp8_weights(w13, w2, quant, qt):
    """(w13 e4m3, w13 scales [E, 2I], w2 e4m3, w2 scales [E, H]) for the _scaled_grouped_mm baseline,
    which takes only per-row scales: fp8_tensor's own tensors (its scale repeated over the rows: the
    same math), else the bf16 weights quantized per output row (amax / 448)."""
    if quant == "fp8_tensor":
        e, n13, _ = qt["w13"].shape
        n2 = qt["w2"].shape[1]
        return (qt["w13"], qt["w13_scale"][:, None].expand(e, n13).contiguous(),
                qt["w2"], qt["w2_scale"][:, None].expand(e, n2).contiguous())
    (a, sa), (b, sb) = per_row(w13, FP8_MAX, FP8), per_row(w2, FP8_MAX, FP8)
    return a, sa, b, sb


def fp8_rows(x):
    """x [M, K] -> (e4m3 [M, K], fp32 scales [M]): dynamic per-row activation quantization (amax / 448)."""
    xf = x.float()
    s = xf.abs().amax(dim=1).clamp_min_(AMAX_MIN).div_(FP8_MAX)
    return xf.div_(s[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8), s


def scaled_grouped_mm_experts(hidden, ids, weights, w13q, s13, w2q, s2):
    """Routed experts with torch._scaled_grouped_mm (fp8 e4m3, per-row activation scales x per-channel
    weight scales, bf16 out): grouped_mm_experts' pipeline with each GEMM's input quantized per row
    first, inside the call. ids [T,K] int32, weights [T,K] fp32."""
    tokens, hid = hidden.shape
    k = ids.shape[1]
    experts, two_i, _ = w13q.shape
    inter = two_i // 2
    sorted_ids, perm = torch.sort(ids.reshape(-1), stable=True)
    x = hidden.index_select(0, perm // k)
    bounds = torch.arange(experts, device=ids.device, dtype=sorted_ids.dtype)
    offs = torch.searchsorted(sorted_ids, bounds, right=True).to(torch.int32)  # inclusive cumsum of counts
    xq, xs = fp8_rows(x)
    g = torch._scaled_grouped_mm(xq, w13q.transpose(-2, -1), xs, s13, offs=offs, out_dtype=torch.bfloat16)
    act = F.silu(g[:, :inter]) * g[:, inter:]
    aq, as_ = fp8_rows(act)
    y = torch._scaled_grouped_mm(aq, w2q.transpose(-2, -1), as_, s2, offs=offs, out_dtype=torch.bfloat16)
    yw = y * weights.reshape(-1)[perm].to(y.dtype).unsqueeze(1)
    unsorted = torch.empty_like(yw).index_copy_(0, perm, yw)
    return unsorted.view(tokens, k, hid).sum(dim=1, dtype=torch.float32).to(hidden.dtype)


def quant_matmul_ceilings(dev, kinds):
    """{"fp8" / "int8": (ops per second, details)} for the kinds asked: torch._scaled_mm on n^3 e4m3
    (bf16 out; per-row scales and per-tensor scales, the faster counts) and torch._int_mm on n^3 int8
    (int32 out); random data, medians of 10 runs. n = 8192 on CUDA, 512 on CPU (--self-test: just so
    the arithmetic runs). A kind whose every probe fails gets (None, why)."""
    n = 8192 if dev.cuda else 512
    d = dev.dev
    out = {}
    if "fp8" in kinds:
        a = torch.randn(n, n, device=d).to(FP8)
        b = torch.randn(n, n, device=d).to(FP8)  # used as b.t(): the column-major operand _scaled_mm wants
        probes = {"per-row scales": (torch.ones(n, 1, device=d), torch.ones(1, n, device=d)),
                  "per-tensor scales": (torch.ones((), device=d), torch.ones((), device=d))}
        out["fp8"] = _probe(dev, n, {label: (lambda sa=sa, sb=sb: torch._scaled_mm(
            a, b.t(), sa, sb, out_dtype=torch.bfloat16)) for label, (sa, sb) in probes.items()},
            "torch._scaled_mm e4m3", "TFLOP/s")
        del a, b
    if "int8" in kinds:
        a = torch.randint(-127, 128, (n, n), dtype=torch.int8, device=d)
        b = torch.randint(-127, 128, (n, n), dtype=torch.int8, device=d)
        out["int8"] = _probe(dev, n, {"int32 out": lambda: torch._int_mm(a, b.t())}, "torch._int_mm int8", "TOPS")
        del a, b
    if dev.cuda:
        torch.cuda.empty_cache()
    return out


def _probe(dev, n, fns, what, unit):
    from .report import fmt_rate, short_error

    best, parts = None, []
    for label, fn in fns.items():
        try:
            ms = dev._cuda_median_ms(fn, warm=5, reps=10) if dev.cuda else min(dev._cpu_ms(fn) for _ in range(3))
            rate = 2 * n ** 3 / (ms * 1e-3)
            parts.append(f"{what} {n}^3 {label}: {ms:.3f} ms = {fmt_rate(rate)} {unit}")
            best = rate if best is None else max(best, rate)
        except Exception as e:  # noqa: BLE001
            parts.append(f"{what} {n}^3 {label}: failed ({short_error(e)[:120]})")
    return best, "; ".join(parts)
