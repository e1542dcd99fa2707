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
#   GPU_TEST_JOBS=N         N test processes at once on the one GPU: gpu.all as N gtest shards, each
#                           sanitizer as one process per Sanitize test, N at a time (the binary
#                           directly, with ctest's environment; the processes' XML merged into one
#                           report). The tests assert results, never times, so sharing the GPU changes
#                           nothing they check. On the H200 (2026-12-03) the whole tier took ~190 s
#                           as 4 shards but did not finish in 400 s as one process, and racecheck over
#                           the 16 Sanitize tests 24 s at once but did not finish in 290 s as one.
#   GPU_TEST_TIMEOUT        seconds each of those processes may run (default 1800, ctest's limit)
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

# GPU_TEST_JOBS > 1: test processes side by side on the one GPU, each with its own log and XML in a
# scratch folder; only the merged report and the failures' output reach $OUT (a device call returns
# only a few files of it).
jobs="${GPU_TEST_JOBS:-1}"
binary="$build/tests/gpu/moejit_gpu_tests"
scratch=""
run_process() {  # scratch folder, label, command...: one process under the time limit
  local dir="$1" label="$2"
  shift 2
  timeout "${GPU_TEST_TIMEOUT:-1800}" env GTEST_OUTPUT="xml:$dir/$label.xml" "$@" >"$dir/$label.log" 2>&1
  echo "$label $?"
}
export -f run_process
# Not at the end of a pipeline (a subshell there would lose `status`): stdin through a redirection.
run_parallel() {  # report name, xml file; stdin: one process a line, "label command..."
  local name="$1" xml="$report_dir/$2" dir="$scratch/$1" started
  started=$(date +%s)
  mkdir -p "$dir"
  say "== $name: $jobs processes at once (time limit ${GPU_TEST_TIMEOUT:-1800} s each)"
  xargs -P "$jobs" -L 1 bash -c 'run_process "$@"' _ "$dir" >"$dir/exits.txt"
  while read -r label rc; do
    # A process passed when it exited 0 and gtest printed its verdict (not killed on the way).
    if [ "$rc" != "0" ] || ! grep -q "^\[  PASSED  \]" "$dir/$label.log"; then
      status=1
      say "-- $label: exit status $rc (124: stopped at the time limit); its failures and reports:"
      grep -B2 -A14 "Failure$\|^\[  FAILED  \]\|^========= [A-Z]" "$dir/$label.log" | head -80 | tee -a "$log"
      # A process stopped at the time limit prints no failure: the test it was in and the log's end.
      say "-- $label: last test started: $(grep "^\[ RUN      \]" "$dir/$label.log" | tail -1); the log's last lines:"
      tail -6 "$dir/$label.log" | tee -a "$log"
    fi
  done <"$dir/exits.txt"
  python3 - "$xml" "$dir"/*.xml <<'PY' || say "$name: no per-process XML report to merge"
import sys, xml.etree.ElementTree as ET
if len(sys.argv) < 3 or sys.argv[2].endswith("*.xml"):
    sys.exit(1)
merged = ET.Element("testsuites", name="AllTests")
totals = dict(tests=0, failures=0, disabled=0, errors=0)
for path in sys.argv[2:]:
    root = ET.parse(path).getroot()
    for key in totals:
        totals[key] += int(root.get(key, 0))
    merged.extend(root.findall("testsuite"))
for key, value in totals.items():
    merged.set(key, str(value))
ET.ElementTree(merged).write(sys.argv[1])
PY
  local totals=""
  [ -f "$xml" ] && totals="$(grep -m1 -o '<testsuites [^>]*' "$xml" | grep -o '\(tests\|failures\|disabled\|errors\)="[0-9]*"' | tr '\n' ' ')"
  say "$name: gtest totals over $(wc -l <"$dir/exits.txt") processes: ${totals:-none} ($(( $(date +%s) - started )) s; xml: $xml)"
}

if [ "$jobs" -gt 1 ]; then
  scratch="$(mktemp -d)"
  # What ctest's gpu.all sets (tests/gpu/CMakeLists.txt).
  export MOEJIT_CACHE_DIR="$build/test-cache"
  run_parallel gpu.all gpu-tests.xml < <(
    for ((i = 0; i < jobs; i++)); do
      echo "shard-$i env GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$i $binary"
    done)
else
  run_one gpu.all gpu-tests.xml
fi
if [ "${GPU_TEST_SANITIZERS:-1}" != "0" ]; then
  for tool in memcheck racecheck; do
    if ! ctest --test-dir "$build" -N -R "^gpu\\.$tool\$" | grep -q "Total Tests: 1"; then
      say "gpu.$tool: not registered (compute-sanitizer was not found at configure time)"
    elif [ "$jobs" -gt 1 ]; then
      # The sanitizer ctest runs, one process per Sanitize test (the tests ctest's command names).
      sanitizer="$(ctest --test-dir "$build" -N -V -R "^gpu\\.$tool\$" | sed -n 's/^[0-9]*: Test command: \([^ ]*\) .*/\1/p' | head -1)"
      run_parallel "gpu.$tool" "gpu-$tool.xml" < <(
        env -u GTEST_FILTER "$binary" --gtest_list_tests --gtest_filter='Sanitize.*' | awk '/^  / {print $1}' |
          while read -r test; do
            echo "$test env -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX -u GTEST_FILTER MOEJIT_GPU_TEST_PREFETCH=0 $sanitizer --tool $tool --error-exitcode 1 $binary --gtest_filter=Sanitize.$test"
          done)
    else
      # The sanitizers run their own tests whatever shard of gpu.all was asked for.
      run_one "gpu.$tool" "gpu-$tool.xml" -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX
    fi
  done
fi
[ -n "$scratch" ] && rm -rf "$scratch"

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
