#!/usr/bin/env python3
"""moejit layer benchmark: moejit vs a torch._grouped_mm layer vs the Hugging Face eager loop.

One process, random bf16 weights (per preset, freed before the next), uniform random routing (iid
normal router logits), fresh random inputs for every timed call, CUDA-graph timing. Per point it
prints ms, TB/s of the expert weights actually touched, TFLOP/s and the ratio to the floor

    floor = max(touched expert bytes / read bandwidth, 6*T*K*H*I / bf16 matmul rate)

with both ceilings measured at the start of the same run: the read bandwidth is the best of torch.sum
over a 4 GiB bf16 buffer (as bf16 and as an fp32 view) and a vectorized Triton read kernel over it
(16-byte loads, an fp32 sum per program; bench/moebench/read_kernel.py), each printed; the matmul rate an
8192^3 bf16 matmul. Also a per-kernel time breakdown (torch.profiler) at three points.

With --quant, each preset's quantized layers (fp8_block, fp8_tensor, w8a8_int8; SPEC.md "Quantized
experts") run right after its bf16 rows, in the same process, on its bf16 weights quantized on the GPU
(fp8_block: one scale per 128x128 block, amax/448; fp8_tensor: one per expert matrix; w8a8_int8: smoothing
factors uniform in [0.5, 2] divided out of the weights, then one scale per output channel, amax/127). Their
table gives ms, TB/s, TFLOP/s, the ratio to moejit bf16 at the same T and the ratio to the quantized floor

    qfloor = max((touched expert bytes at 1 byte per element + their scale bytes) / read bandwidth,
                 6*T*K*H*I / quantized matmul rate)

with the rate measured at the start of the same run (fp8: torch._scaled_mm on 8192^3 e4m3, per-row or
per-tensor scales, bf16 out, the faster; int8: torch._int_mm on 8192^3). A guard compares each quantized
layer with the bf16 one on one input at T=64 (quantization error on these random weights: ~5e-2..8e-2
for e4m3, ~2e-2..4e-2 for int8; flagged above 0.1).

Usage (from the repository root, after scripts/build.sh):

    PYTHONPATH=python python3 bench/moe_bench.py                       # full: 3 presets x 7 token counts
    PYTHONPATH=python python3 bench/moe_bench.py --quick               # T in {1,16,256,4096}, ~2-4 min
    PYTHONPATH=python python3 bench/moe_bench.py --presets deepseek-v3 --tokens 1 64 --out /tmp/r.md
    python3 bench/moe_bench.py --dry-run                               # the plan only: no CUDA, no moejit
    PYTHONPATH=python python3 bench/moe_bench.py --self-test           # tiny shapes; checks the math
                                                                       # (runs on CPU with moejit's CPU ops)
    PYTHONPATH=python python3 bench/moe_bench.py --quant fp8_block fp8_tensor w8a8_int8   # + quantized layers
    python3 bench/moe_bench.py --dry-run --quant fp8_block w8a8_int8   # also the quantized floors (nominal)
    ... --moejit-library /tmp/b/backends/torch/libmoejit_torch.so      # another build's op library
    PYTHONPATH=python python3 bench/moe_bench.py --targets --save-table /tmp/t.json --out /tmp/t.md
                                      # issue 21's 95 points judged, compared with bench/saved/h200_targets.json
    python3 bench/moe_bench.py --dry-run --targets                     # their plan: floors, bounds, targets, wall

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
Quantized layers (--quant; the same inputs, routing and CUDA-graph timing):
  moejit ms,         the two ops above with the quantized weights and their fp32 scales (w8a8_int8: and
  moejit experts ms  smoothing factors); moejit quantizes the activations itself, inside the call.
  scaled_grouped_mm  fp8 only: the grouped_mm layer above with torch._scaled_grouped_mm (e4m3, per-row x
    ms               per-channel scales, bf16 out), each GEMM's input quantized per row (amax/448) inside
                     the timed call; weights: fp8_tensor's own (the same math as moejit), for fp8_block the
                     bf16 weights quantized per output row (coarser than 128x128 blocks: a speed reference).
                     A cell that is not a time says why (int8: no torch grouped int8 matmul; CPU; failed).
  HF eager runs for bf16 only. rel.err of a quantized row: against the moejit bf16 layer, same input.

--targets (issue 21): mixtral-8x7b, qwen3-30b-a3b, deepseek-v3, qwen3-next-80b-a3b and kimi-k2 at T = 1, 2,
4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192, 16384, 32768 (--presets/--tokens pick
a subset). Per point only `moejit ms` as above (CUDA graph; grouped_mm too with --grouped-mm; no HF eager,
experts-only, launch-chain probe or breakdowns), --budget-s 1 by default: ~1.5-2 min on an H200 after the
build (--dry-run --targets prints the estimate and its model). Each row: the floor and its bound
("bandwidth" where touched bytes / read ceiling >= FLOPs / matmul ceiling, else "compute"), its targets
(moejit/floor <= 1.15 at bandwidth-bound points, <= 1.25 elsewhere; qwen3-30b-a3b T=1 <= 21 us; >= 680
TFLOP/s for mixtral-8x7b at T >= 4096, >= 620 for qwen3-30b-a3b and deepseek-v3 at T >= 8192) and "met" or
"MISSED"; the summary lists the points missed with their ratios and the geometric mean of moejit/floor per
preset and overall.
  Saved tables: --save-table [PATH] writes {"meta": {commit, date, device, command, ceilings}, "points":
  {preset: {"T": moejit ms}}} after every preset (default PATH bench/saved/h200_targets.json, the H200's
  recorded run). --targets compares with bench/saved/h200_targets.json unless --compare PATH names another
  table or --compare none: each row gets the saved ms and new/prev, "SLOWER" beyond --noise-margin (3%),
  and the summary lists those points and how the two runs' ceilings compare. A missing table is reported
  and the run goes on. On the device machine write the table under $OUT (bench/device_run.sh:
  BENCH_ARGS="--targets --save-table $OUT/h200_targets.json") and commit it as bench/saved/h200_targets.json
  when it is the run to beat.
  --self-test --targets runs the tiny presets twice (on CPU without a GPU): the first pass saves a table,
  the second compares with it.
"""

# The code is the moebench package beside this file (bench/moebench/: presets, baselines, timing, one
# preset's points, its quantized layers, the report, the dry run, the command line); this file stays the
# command and its documentation.
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
