#!/usr/bin/env bash
# A/B on the device in one call: the same benchmark on a baseline tree and on this tree, each built
# in its own folder and timed in its own process, back to back on the same GPU, so that a change
# is judged against its baseline in one run rather than against numbers from another day.
#   BASE_TAR     tar of the baseline tree (default .carry/base.tar; made here with
#                `mkdir -p .carry && git archive -o .carry/base.tar <rev>`, and carried)
#   AB_ARGS      arguments of bench/moe_bench.py for both runs (default: decode and mid points)
#   ROUNDS       base/this alternations (default 2: base, this, base, this; clocks drift under load)
# Reports: $OUT/ab-base-<round>.md and $OUT/ab-this-<round>.md (the tables also print).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
base_tar="${BASE_TAR:-$root/.carry/base.tar}"
args="${AB_ARGS:---quick --no-hf --presets qwen3-30b-a3b mixtral-8x7b deepseek-v3 --tokens 1 4 16 64 256}"
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }

build_tree() {  # tree build-dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$2.log" 2>&1 &&
    cmake --build "$2" --target moejit_torch moejit >>"$2.log" 2>&1 &&
    mkdir -p "$1/python/moejit/lib" && cp "$2/backends/torch/libmoejit_torch.so" "$1/python/moejit/lib/" ||
    { grep -E "error|Error" "$2.log" | head -20; return 1; }
}

base=/tmp/ab-base
rm -rf "$base" && mkdir -p "$base" && tar -xf "$base_tar" -C "$base" || { echo "ab_run: no baseline tree at $base_tar"; exit 1; }
stamp "build baseline and this tree"
build_tree "$base" /tmp/ab-base-build || exit 1
build_tree "$root" /tmp/ab-this-build || exit 1
status=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in base this; do
    tree=$([ "$side" = base ] && echo "$base" || echo "$root")
    stamp "round $round: $side"
    # Each side's own cache folder: the two generators may emit the same key for different kernels
    # only if the version was not bumped; separate folders rule that out.
    # shellcheck disable=SC2086
    (cd "$tree" && MOEJIT_CACHE_DIR="/tmp/ab-cache-$side" PYTHONPATH=python python3 bench/moe_bench.py $args \
      --out "$out/ab-$side-$round.md" 2>&1 | grep -E "^\| [0-9]|^## |Ceilings" | head -60) || status=1
  done
done
stamp "done"
exit "$status"
