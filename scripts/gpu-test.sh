#!/usr/bin/env bash
# Builds and runs the GPU test tier (ctest label "gpu": gpu.all, and gpu.memcheck / gpu.racecheck
# when compute-sanitizer is installed), prints pass/fail counts, and leaves the gtest XML reports
# (plus the log) in $OUT when it is set, so the results come back from a device machine.
#   BUILD_DIR               build folder (default: build/)
#   OUT                     where gpu-tests.xml, gpu-<sanitizer>.xml and gpu-tests.log go
#   MOEJIT_GPU_TEST_SEED    base seed of the random inputs (default 0; "random" for a new one)
#   GPU_TEST_SANITIZERS=0   skip the compute-sanitizer runs
#   GTEST_FILTER, GTEST_TOTAL_SHARDS + GTEST_SHARD_INDEX
#                           passed through to gpu.all (gtest reads them), to split a run that would
#                           not fit one time limit, e.g. GTEST_FILTER='Draw/*' or 3 shards
# Not -e: every step runs and reports even after a failure; the exit status says if any failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
out="${OUT:-}"
report_dir="${out:-$(mktemp -d)}"
mkdir -p "$report_dir"
log="$report_dir/gpu-tests.log"
: >"$log"
say() { echo "$@" | tee -a "$log"; }

say "== GPU"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  say "gpu-test: nvidia-smi not found; this machine has no usable NVIDIA driver, so the GPU tier cannot run"
  exit 2
fi
if ! nvidia-smi -L 2>&1 | tee -a "$log"; then
  say "gpu-test: nvidia-smi -L failed; no GPU to run the GPU tier on"
  exit 2
fi

say "== build ($build)"
cuda_home="${MOEJIT_CUDA_HOME:-${CUDA_HOME:-/usr/local/cuda}}"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUDAToolkit_ROOT="$cuda_home" 2>&1 | tee -a "$log" | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || { say "gpu-test: cmake configure failed"; exit 1; }
fi
if ! cmake --build "$build" --target moejit_gpu_tests -j "$(nproc)" 2>&1 | tee -a "$log" | tail -5; then
  say "gpu-test: the build failed"
  exit 1
fi

# One ctest run per test, each with its own gtest XML (the three run the same binary, so one
# GTEST_OUTPUT file would be overwritten).
status=0
run_one() {  # test name, xml file [extra env assignments]
  local name="$1" xml="$report_dir/$2"
  shift 2
  say "== ctest $name"
  env "$@" GTEST_OUTPUT="xml:$xml" ctest --test-dir "$build" -L gpu -R "^${name//./\\.}\$" --output-on-failure \
    --output-junit "$report_dir/ctest-$name.xml" 2>&1 | tee -a "$log"
  local rc="${PIPESTATUS[0]}"
  [ "$rc" -eq 0 ] || status=1
  if [ -f "$xml" ]; then
    # The root <testsuites> element carries the totals.
    local totals
    totals="$(grep -m1 -o '<testsuites [^>]*' "$xml" | grep -o '\(tests\|failures\|disabled\|errors\|skipped\)="[0-9]*"' | tr '\n' ' ')"
    say "$name: gtest totals: $totals(xml: $xml)"
  else
    say "$name: no gtest XML was written (the binary did not start or was killed); ctest exit status $rc"
  fi
  return 0
}

run_one gpu.all gpu-tests.xml
if [ "${GPU_TEST_SANITIZERS:-1}" != "0" ]; then
  for tool in memcheck racecheck; do
    if ctest --test-dir "$build" -N -R "^gpu\\.$tool\$" | grep -q "Total Tests: 1"; then
      # The sanitizers run their own three tests whatever shard of gpu.all was asked for.
      run_one "gpu.$tool" "gpu-$tool.xml" -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX
    else
      say "gpu.$tool: not registered (compute-sanitizer was not found at configure time)"
    fi
  done
fi

# Pass/fail per test case across the reports: gtest writes <failure> inside failed <testcase>s.
say "== summary"
for xml in "$report_dir"/gpu-*.xml; do
  [ -f "$xml" ] || continue
  failed="$(python3 - "$xml" 2>/dev/null <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
passed = failed = skipped = 0
lines = []
for suite in root.iter("testsuite"):
    for c in suite.iter("testcase"):
        failure = c.find("failure")
        if failure is not None:
            failed += 1
            name = f"{c.get('classname')}.{c.get('name')}" if c.get("name") else f"({suite.get('name')}: global set-up)"
            message = (failure.get("message") or "").replace("\n", " ")[:300]
            lines.append(f"\n  FAILED {name}: {message}")
        elif c.get("result") == "skipped" or c.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped" + "".join(lines))
EOF
)"
  say "$(basename "$xml"): ${failed:-could not parse}"
done
[ -n "$out" ] && say "reports in $out"
if [ "$status" -eq 0 ]; then say "gpu-test: PASSED"; else say "gpu-test: FAILED"; fi
exit "$status"
