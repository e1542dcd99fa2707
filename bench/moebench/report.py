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
