"""The moejit layer benchmark behind bench/moe_bench.py (whose docstring documents it), one job a module:

  presets       the presets, token counts and the arithmetic of a point (bytes, FLOPs, experts hit)
  baselines     what moejit is compared with: torch routing, a torch._grouped_mm layer, the HF eager loop
  timing        CUDA-graph and eager timing, the read-bandwidth and matmul ceilings, the profiler breakdown
  preset_bench  one preset's weights, inputs, checks, timed points, breakdowns and launch-chain probe
  report        the report: its table's columns and legend, number formats, the markdown writer
  cli           the command line, the dry run and the driver (main)
"""
