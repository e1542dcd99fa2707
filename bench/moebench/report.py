"""The benchmark report: the table's columns and legend, number and error formats, the tree's commit,
and Report, which prints each line as it comes and mirrors it to --out."""

import os
import subprocess

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


QUANT_COLUMNS = ["T", "quant", "moejit ms", "moejit experts-only ms", "scaled_grouped_mm ms", "TB/s (moejit)",
                 "TFLOP/s (moejit)", "qfloor ms", "moejit/qfloor", "moejit/moejit bf16", "moejit/scaled_grouped_mm",
                 "rel.err vs moejit bf16: moejit / scaled_grouped_mm"]

QUANT_LEGEND = """\
Quantized tables (--quant; per preset, right after its bf16 rows, on the same random bf16 weights quantized
on the GPU; inputs, routing and timing as above; moejit quantizes the activations itself, SPEC.md):
- weights: fp8_block = e4m3 with one fp32 scale per 128x128 block (block amax / 448); fp8_tensor = e4m3 with
  one scale per expert matrix (amax / 448); w8a8_int8 = smoothing factors uniform in [0.5, 2] (input_smooth
  [E,H], act_smooth [E,I]), the weights divided by them per input channel, then int8 per output channel
  (amax / 127).
- moejit ms, moejit experts-only ms: the ops of the bf16 table with the quantized weights and their scales.
- scaled_grouped_mm ms (fp8 only; the speed reference): the grouped_mm layer with torch._scaled_grouped_mm:
  sort, gather, offsets, each GEMM's input quantized to e4m3 per row (amax / 448) inside the timed call,
  weights e4m3 with per-output-row scales. fp8_tensor: its own weights (the same math as moejit's);
  fp8_block: the bf16 weights quantized per row (coarser than 128x128 blocks). A cell that is not a time
  says why (int8: torch has no grouped int8 matmul; a failure: its error, in full in the notes).
- TB/s, TFLOP/s: of the moejit layer. Touched bytes = experts hit * (3*H*I*1 + the expert's fp32 scale
  bytes; w8a8_int8: also its input_smooth and act_smooth rows); FLOPs = 6*T*K*H*I (int8: operations).
- qfloor ms = max(touched bytes / read bandwidth, FLOPs / quantized matmul rate), the rates measured above
  (fp8: torch._scaled_mm 8192^3, the faster of per-row and per-tensor scales; int8: torch._int_mm 8192^3).
- moejit/moejit bf16 = quantized moejit ms / bf16 moejit ms at the same T in this run (< 1: faster).
- moejit/scaled_grouped_mm = moejit experts-only ms / scaled_grouped_mm ms (both exclude routing).
- rel.err: ||out - out_bf16||_F / ||out_bf16||_F against the moejit bf16 layer on one input, same routing
  (quantization error: ~5e-2..8e-2 for e4m3, ~2e-2..4e-2 for int8 on these random weights; the guard at
  T=64 and every row flag it above 0.1, rows at T < 16 above 0.2)."""


def target_columns(with_grouped_mm, with_compare):
    """The --targets table's columns: grouped_mm's with --grouped-mm, the saved run's with a table to compare."""
    return (["T", "moejit ms", "TB/s", "TFLOP/s", "experts hit", "floor ms", "bound", "moejit/floor", "target", "met"]
            + (["grouped_mm ms", "moejit/grouped_mm"] if with_grouped_mm else [])
            + (["prev ms", "new/prev"] if with_compare else []))


TARGETS_LEGEND = """\
Columns (--targets: issue 21's points; every timed call sees fresh random inputs already in GPU memory):
- moejit ms: torch.ops.moejit.moe_layer from bf16 router logits (routing + index + experts + combine, the whole
  layer). CUDA graph of n back-to-back calls, each on its own input buffer; median ms per call.
- TB/s, TFLOP/s: of moejit ms. Touched bytes = distinct experts hit per call (measured from the ids of every
  timed input, mean: "experts hit") * 3*H*I*2; FLOPs = 6*T*K*H*I.
- floor ms = max(touched bytes / read ceiling, FLOPs / matmul ceiling), the ceilings measured above; bound:
  "bandwidth" where the read term is the larger, else "compute".
- target: moejit/floor <= 1.15 at bandwidth-bound points, <= 1.25 at the others, and where issue 21 names them
  a latency (qwen3-30b-a3b T=1: <= 21 us) and a prefill rate (FLOPs / moejit ms, TF/s); met: every target of the
  row holds (MISSED: see the summary for which).
- grouped_mm ms (--grouped-mm): the torch._grouped_mm layer on moejit's routing, experts only (no routing), CUDA
  graph as above; moejit/grouped_mm = moejit ms (with routing) / grouped_mm ms.
- prev ms, new/prev: the saved run's moejit ms at this point and this run's over it; SLOWER: more than the noise
  margin above it ("-": the saved table has no such point)."""


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


def fmt_rate(x):
    """A rate in units of 1e12 per second (TB/s, TFLOP/s, TOPS): one decimal, more below 1 (CPU self-test)."""
    return "-" if x is None else (f"{x / 1e12:.1f}" if x >= 1e12 else f"{x / 1e12:.2g}")


def fmt_err(x):
    return "-" if x is None else f"{x:.1e}"


def short_error(e):
    msg = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    return msg if len(msg) < 300 else msg[:297] + "..."


def git_revision():
    """The tree's commit. A copy of a working tree (the device machine's) can carry stale git metadata,
    so MOEJIT_BENCH_COMMIT, set by whoever knows what was copied, comes first."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/moebench/ -> root
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
