#!/usr/bin/env python3
"""moejit layer benchmark: moejit vs a torch._grouped_mm layer vs the Hugging Face eager loop.

One process, random bf16 weights (per preset, freed before the next), uniform random routing (iid
normal router logits), fresh random inputs for every timed call, CUDA-graph timing. Per point it
prints ms, TB/s of the expert weights actually touched, TFLOP/s and the ratio to the floor

    floor = max(touched expert bytes / read bandwidth, 6*T*K*H*I / bf16 matmul rate)

with both ceilings measured at the start of the same run (a large read-only reduction; an 8192^3
bf16 matmul). Also a per-kernel time breakdown (torch.profiler) at three points.

Usage (from the repository root, after scripts/build.sh):

    PYTHONPATH=python python3 bench/moe_bench.py                       # full: 3 presets x 7 token counts
    PYTHONPATH=python python3 bench/moe_bench.py --quick               # T in {1,16,256,4096}, ~2-4 min
    PYTHONPATH=python python3 bench/moe_bench.py --presets deepseek-v3 --tokens 1 64 --out /tmp/r.md
    python3 bench/moe_bench.py --dry-run                               # the plan only: no CUDA, no moejit
    PYTHONPATH=python python3 bench/moe_bench.py --self-test           # tiny shapes; checks the math
                                                                       # (runs on CPU with moejit's CPU ops)

What each timing includes (every timing starts from inputs already in device memory):
  moejit ms          torch.ops.moejit.moe_layer(hidden, router_logits, ...): the whole layer = routing from
                     the bf16 logits + index + experts + combine. CUDA graph of n calls, median ms per call.
  moejit experts ms  torch.ops.moejit.experts(hidden, topk_ids, topk_weights, ...): stages 2-6 only, the
                     ids/weights precomputed (outside the timed region) by torch.ops.moejit.route.
  grouped_mm ms      a torch layer on the same precomputed ids/weights: stable sort of the pairs by expert,
                     row gather, per-expert offsets (searchsorted, int32), torch._grouped_mm with w13^T,
                     silu(gate)*up, torch._grouped_mm with w2^T, weighting, unsort, sum over K (fp32).
                     CUDA graph of n calls, median per call.
  HF eager ms        transformers' MixtralExperts eager forward (a Python loop over the experts hit, with
                     .nonzero()/torch.where host syncs; the loop is the same for Qwen3-MoE and DeepSeek-V3)
                     on the same precomputed ids (int64) and weights. Not graph-capturable: timed eagerly,
                     CUDA events around each single call (host syncs included), median.
  launch chain       per preset, the moejit layer with H=256, I=128 and the preset's experts, top-k and
                     scoring, at the run's T <= 16: its routing, launches and dependencies with almost no
                     weight bytes, i.e. what a decode call costs besides streaming its weights.
Baselines exclude routing; "moejit/grouped_mm" therefore compares experts-only with grouped_mm.
"""

# The code is the moebench package beside this file (bench/moebench/: presets, baselines, timing, one
# preset's points, the report, the command line); this file stays the command and its documentation.
# `python3 bench/moe_bench.py` puts bench/ first on sys.path already; the insert covers other ways in
# (python -P, runpy).
import os
import sys

_BENCH = os.path.dirname(os.path.abspath(__file__))
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)

from moebench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(doc=__doc__))
