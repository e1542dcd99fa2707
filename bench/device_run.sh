#!/usr/bin/env bash
# One device-machine session in one call: build (with the torch op), run the GPU test tier, then
# the performance benchmark. Everything it reports lands in $OUT (or ./device-out).
#   BUILD_DIR      build folder (default /tmp/moejit-build)
#   GPU_TESTS=0    skip the GPU tier; GTEST_FILTER narrows it (passed through)
#   GPU_TEST_JOBS  test processes at once on the GPU (default 4; scripts/gpu-test.sh says how): the
#                  whole tier in one process no longer fits one 600 s call
#   BENCH_ARGS     arguments of bench/moe_bench.py (default: the quick run of two presets); issue 21's
#                  targets: BENCH_ARGS="--targets --save-table $OUT/h200_targets.json" (~1.5-2 min after
#                  the build; compared with bench/saved/h200_targets.json when the tree has one)
#   BENCH=0        skip the benchmark
#   SWEEP=1        then time the candidate tiles of bench/tile_sweep.sh (SWEEP_FILE: its list)
#   AUTOTUNE="p1 p2"  before the benchmark, `moejit compile --autotune --preset p` for each preset
#                  (the benchmark's layers then use the stored tiles)
#   NCU="preset:tokens:kernel-regex ..."  Nsight Compute on moejit_layer_check's kernels matching the
#                  regex (--clock-control none: the clocks stay as found); report in $OUT/ncu-<n>.txt.
#                  NCU_COUNT kernels per probe (default 3), NCU_SECTIONS the sections (default five:
#                  SpeedOfLight LaunchStats Occupancy WarpStateStats SchedulerStats), NCU_LAYER_ARGS more
#                  moejit_layer_check flags (e.g. "--router-gemm true" for the router GEMM's kernels). A prefill kernel of a
#                  large layer (deepseek-v3 at T=4096) did not finish within 330 s with the defaults
#                  (the layer's setup plus a replay per section pass, not measured apart); try NCU_COUNT=1
#                  NCU_SECTIONS=SpeedOfLight there.
#   MOEJIT_BENCH_COMMIT  the commit this tree is, for the benchmark headers (the device machine's
#                  copy can carry stale git metadata: name the commit in the command, e.g.
#                  MOEJIT_BENCH_COMMIT=af2f932 bash bench/device_run.sh)
#   EP_BENCH=1     then bench/ep_bench.cpp (expert parallel across the machine's GPUs, both modes;
#                  says so and does nothing below two GPUs): EP_BENCH_ARGS its flags (default: all of
#                  issue 23's points), table in $OUT/ep_bench.md
#   SMI=1          log SM clock, power and throttle reasons every 200 ms during the benchmark
#                  ($OUT/smi.csv) and print their range
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
cmake --build "$build" --target moejit_gpu_tests moejit_torch moejit_layer_check moejit_ep_bench moejit >>"$out/build.log" 2>&1 \
  || { grep -E "error|Error" "$out/build.log" | head -30; exit 1; }
mkdir -p python/moejit/lib && cp "$build/backends/torch/libmoejit_torch.so" python/moejit/lib/
status=0
if [ "${GPU_TESTS:-1}" != "0" ]; then
  stamp "GPU tier"
  GPU_TEST_JOBS="${GPU_TEST_JOBS:-4}" GPU_TEST_SANITIZERS="${GPU_TEST_SANITIZERS:-0}" BUILD_DIR="$build" OUT="$out" bash scripts/gpu-test.sh | tail -25 || status=1
fi
for preset in ${AUTOTUNE:-}; do
  stamp "autotune $preset"
  "$build/moejit" compile --autotune --preset "$preset" 2>&1 | grep -v "^\[" | tee -a "$out/autotune.log" || status=1
done
n=0
for probe in ${NCU:-}; do
  IFS=: read -r preset tokens kernel <<<"$probe"
  n=$((n + 1))
  stamp "ncu $preset T=$tokens kernels ~ $kernel"
  sections=()
  for section in ${NCU_SECTIONS:-SpeedOfLight LaunchStats Occupancy WarpStateStats SchedulerStats}; do
    sections+=(--section "$section")
  done
  ncu --clock-control none -k "regex:$kernel" -c "${NCU_COUNT:-3}" "${sections[@]}" \
    "$build/bench/moejit_layer_check" --preset "$preset" --tokens "$tokens" --iters 3 ${NCU_LAYER_ARGS:-} >"$out/ncu-$n.txt" 2>&1 || status=1
  grep -E "^  [a-z_]+.*\(|Duration|Elapsed Cycles|Registers Per|Threads|Warp Cycles Per Issued|Stall|Achieved Occupancy" \
    "$out/ncu-$n.txt" | head -40
done
if [ "${SMI:-0}" = "1" ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,noheader,nounits -lms 200 >"$out/smi.csv" 2>/dev/null &
  smi_pid=$!
fi
if [ "${BENCH:-1}" != "0" ]; then
  stamp "benchmark"
  # shellcheck disable=SC2086
  PYTHONPATH=python python3 bench/moe_bench.py ${BENCH_ARGS:---quick --presets qwen3-30b-a3b mixtral-8x7b --no-hf --breakdown qwen3-30b-a3b:16} \
    --out "$out/bench.md" 2>&1 | tail -60 || status=1
fi
if [ -n "${smi_pid:-}" ]; then
  kill "$smi_pid" 2>/dev/null
  # SM clock MHz, power W: min / median / max over the samples taken while the GPU was busy.
  awk -F', ' '$3 > 150 {print $2, $3, $5}' "$out/smi.csv" | sort -n | awk '
    {clk[NR] = $1; pw[NR] = $2; if ($2 > maxp) maxp = $2; reason[$3]++}
    END {if (NR) {printf "nvidia-smi busy samples: %d; SM clock MHz min %s median %s max %s; power max %s W; throttle reasons:", NR, clk[1], clk[int((NR + 1) / 2)], clk[NR], maxp;
         for (r in reason) printf " %s x%d", r, reason[r]; print ""}}'
fi
if [ "${EP_BENCH:-0}" = "1" ]; then
  stamp "expert-parallel benchmark"
  # shellcheck disable=SC2086
  "$build/bench/moejit_ep_bench" ${EP_BENCH_ARGS:-} --out "$out/ep_bench.md" 2>&1 | tail -80 || status=1
fi
if [ "${SWEEP:-0}" = "1" ]; then
  stamp "tile sweep"
  bash bench/tile_sweep.sh || status=1
fi
stamp "done"
exit "$status"
