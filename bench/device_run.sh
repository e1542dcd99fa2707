#!/usr/bin/env bash
# One device-machine session in one call: build (with the torch op), run the GPU test tier, then
# the performance benchmark. Everything it reports lands in $OUT (or ./device-out).
#   BUILD_DIR      build folder (default /tmp/moejit-build)
#   GPU_TESTS=0    skip the GPU tier; GTEST_FILTER narrows it (passed through)
#   BENCH_ARGS     arguments of bench/moe_bench.py (default: the quick run of two presets)
#   BENCH=0        skip the benchmark
#   SWEEP=1        then time the candidate tiles of bench/tile_sweep.sh (SWEEP_FILE: its list)
#   AUTOTUNE="p1 p2"  before the benchmark, `moejit compile --autotune --preset p` for each preset
#                  (the benchmark's layers then use the stored tiles)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-/tmp/moejit-build}"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
cd "$root"
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }

stamp "configure + build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
cmake --build "$build" --target moejit_gpu_tests moejit_torch moejit_layer_check moejit >>"$out/build.log" 2>&1 \
  || { grep -E "error|Error" "$out/build.log" | head -30; exit 1; }
mkdir -p python/moejit/lib && cp "$build/backends/torch/libmoejit_torch.so" python/moejit/lib/
status=0
if [ "${GPU_TESTS:-1}" != "0" ]; then
  stamp "GPU tier"
  GPU_TEST_SANITIZERS="${GPU_TEST_SANITIZERS:-0}" BUILD_DIR="$build" OUT="$out" bash scripts/gpu-test.sh | tail -25 || status=1
fi
for preset in ${AUTOTUNE:-}; do
  stamp "autotune $preset"
  "$build/moejit" compile --autotune --preset "$preset" 2>&1 | grep -v "^\[" | tee -a "$out/autotune.log" || status=1
done
if [ "${BENCH:-1}" != "0" ]; then
  stamp "benchmark"
  # shellcheck disable=SC2086
  PYTHONPATH=python python3 bench/moe_bench.py ${BENCH_ARGS:---quick --presets qwen3-30b-a3b mixtral-8x7b --no-hf --breakdown qwen3-30b-a3b:16} \
    --out "$out/bench.md" 2>&1 | tail -60 || status=1
fi
if [ "${SWEEP:-0}" = "1" ]; then
  stamp "tile sweep"
  bash bench/tile_sweep.sh || status=1
fi
stamp "done"
exit "$status"
