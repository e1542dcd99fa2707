#!/usr/bin/env bash
# Times candidate GEMM tiles (MOEJIT_TILES) against the planner's choice with bench/moe_bench.py,
# one benchmark process per candidate. Each line of the candidate file ($1, else $SWEEP_FILE, else
# the list below; bench/sweeps/ holds the ones run) is
#   label | presets | token counts | MOEJIT_TILES value (empty: the planner's tiles) [| VAR=value ...]
# (the optional last field: more environment for that process, e.g. MOEJIT_PDL=0), and lines
# starting with # are comments.
# Results: $OUT/sweep-<label>.md and a one-table summary on stdout.
#   SWEEP_ARGS     moe_bench.py's mode (default "--quick --no-hf"; "--targets --compare none" times the moejit
#                  layer alone, several times faster)
#   SWEEP_COLUMNS  the report's columns the summary shows (default 2,3,5,8,10,11: T, moejit ms, grouped_mm ms,
#                  TFLOP/s, moejit/floor, moejit/grouped_mm in the --quick table; "2,3,9" for --targets: T, ms, x floor)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
cd "$root"
candidates="${1:-${SWEEP_FILE:-}}"
default_candidates='
planner-prefill | qwen3-30b-a3b mixtral-8x7b | 4096 |
prefill-128x256 | qwen3-30b-a3b mixtral-8x7b | 4096 | prefill.gemm1=tc:128x128x64:s3:w2x4,prefill.gemm2=tc:128x256x64:s3:w2x4
prefill-2cta | qwen3-30b-a3b mixtral-8x7b | 4096 | prefill.gemm1=tc:128x64x64:s3:w2x4,prefill.gemm2=tc:128x128x64:s3:w2x4
mid-64x256 | mixtral-8x7b | 256 | mid.gemm1=tc:64x128x64:s3:w2x4,mid.gemm2=tc:64x256x64:s3:w2x4
decode-narrow | qwen3-30b-a3b mixtral-8x7b | 1 16 | decode.gemm1=tc:16x16x64:s8:w1x2,decode.gemm2=tc:16x32x64:s8:w1x2
'
list="${candidates:+$(cat "$candidates")}"
list="${list:-$default_candidates}"
echo "$list" | grep -v '^[[:space:]]*#' | while IFS='|' read -r label presets tokens tiles environment; do
  label="$(echo "$label" | xargs)"
  [ -z "$label" ] && continue
  echo "== $label: MOEJIT_TILES='$(echo "$tiles" | xargs)' $(echo "$environment" | xargs)"
  # shellcheck disable=SC2086
  env $environment MOEJIT_TILES="$(echo "$tiles" | xargs)" PYTHONPATH=python timeout "${SWEEP_TIMEOUT:-120}" python3 bench/moe_bench.py \
    ${SWEEP_ARGS:---quick --no-hf} --presets $presets --tokens $tokens --out "$out/sweep-$label.md" >/dev/null 2>&1 \
    || echo "   (failed or timed out: status $?)"
  grep -E "^## |^\| [0-9]+ \|" "$out/sweep-$label.md" 2>/dev/null | cut -d'|' -f"${SWEEP_COLUMNS:-2,3,5,8,10,11}" | sed 's/^/   /'
done
