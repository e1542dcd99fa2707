"""The moejit layer benchmark behind bench/moe_bench.py (whose docstring documents it), one job a module:

  presets       the presets, token counts and the arithmetic of a point (bytes, FLOPs, experts hit)
  baselines     what moejit is compared with: torch routing, a torch._grouped_mm layer, the HF eager loop
  timing        CUDA-graph and eager timing, the read-bandwidth and matmul ceilings, the profiler breakdown
  read_kernel   the Triton read kernel, one of the read-bandwidth ceilings
  preset_bench  one preset's weights, inputs, checks, timed points, breakdowns and launch-chain probe
  quant         --quant in torch: the weights quantized, the _scaled_grouped_mm baseline, the fp8/int8 ceilings
  quant_bench   --quant: one preset's quantized layers (guard, timed points, their table), after its bf16 rows
  targets       --targets: issue 21's points and targets, a point's verdict, the summary, the saved tables
  targets_bench --targets on the device: per preset the moejit layer timed and judged at every point
  report        the report: its tables' columns and legends, number formats, the markdown writer
  dryrun        --dry-run: the plan and nominal floors (bf16, quantized, --targets), without CUDA or moejit
  cli           the command line and the driver (main)
"""
