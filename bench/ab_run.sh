#!/usr/bin/env bash
# A/B on the device in one call: the same benchmark on a baseline tree and on this tree, each built
# in its own folder and timed in its own process, back to back on the same GPU, so that a change
# is judged against its baseline in one run rather than against numbers from another day.
#   VARIANTS     "name=tar ..." other trees to time before this one (default "base=.carry/base.tar", "": none;
#                a tar made here with `mkdir -p .carry && git archive -o .carry/base.tar <rev>`, or
#                `tar --exclude=.git -cf .carry/x.tar -C <worktree> .`; .carry travels in `carry`)
#   PATCHES      "name=file.patch ..." variants made by applying a patch (`git diff main exp > .carry/x.patch`)
#                to this tree and rebuilding this tree's build folder incrementally: much faster than a tree
#                each when a patch touches a few files (a template: one library rebuilt). Each is timed
#                through its own copy of the op library (moe_bench --moejit-library) with this tree's Python.
#   AB_ARGS      arguments of bench/moe_bench.py for every run (default: decode and mid points)
#   ROUNDS       alternations over the variants and this tree (default 2; clocks drift under load)
#   THIS_BUILD   build folder of this tree (default /tmp/ab-this-build; name device_run.sh's BUILD_DIR
#                to reuse the build a GPU test run just made)
# Reports: $OUT/ab-<name>-<round>.md, this tree's as name "this" (the tables also print).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
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

variants="${VARIANTS-base=$root/.carry/base.tar}"
names=()
this_build="${THIS_BUILD:-/tmp/ab-this-build}"
declare -A library=()
for v in ${PATCHES:-}; do
  name="${v%%=*}" patch="${v#*=}"
  stamp "build $name (this tree + $patch)"
  (cd "$root" && git apply "$patch") || { echo "ab_run: $patch does not apply"; exit 1; }
  build_tree "$root" "$this_build" && cp "$this_build/backends/torch/libmoejit_torch.so" "/tmp/ab-$name.so"
  built=$?
  (cd "$root" && git apply -R "$patch") || { echo "ab_run: $patch does not revert"; exit 1; }
  [ "$built" = 0 ] || exit 1
  library[$name]="/tmp/ab-$name.so"
  names+=("$name")
done
for v in $variants; do
  name="${v%%=*}" tar="${v#*=}"
  rm -rf "/tmp/ab-$name" && mkdir -p "/tmp/ab-$name" && tar -xf "$tar" -C "/tmp/ab-$name" ||
    { echo "ab_run: no tree at $tar"; exit 1; }
  stamp "build $name"
  build_tree "/tmp/ab-$name" "/tmp/ab-$name-build" || exit 1
  names+=("$name")
done
stamp "build this tree"
build_tree "$root" "$this_build" || exit 1
names+=(this)
status=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  for name in "${names[@]}"; do
    tree=$([ "$name" = this ] || [ -n "${library[$name]:-}" ] && echo "$root" || echo "/tmp/ab-$name")
    lib_args=${library[$name]:+--moejit-library ${library[$name]}}
    stamp "round $round: $name"
    # A cache folder per tree: a generator whose version was not bumped could otherwise share keys.
    # shellcheck disable=SC2086
    (cd "$tree" && MOEJIT_CACHE_DIR="/tmp/ab-cache-$name" PYTHONPATH=python python3 bench/moe_bench.py $args $lib_args \
      --out "$out/ab-$name-$round.md" 2>&1 | grep -E "^\| [0-9]|^## |Ceilings" | head -60) || status=1
  done
done
stamp "done"
exit "$status"
