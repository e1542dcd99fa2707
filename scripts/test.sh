#!/usr/bin/env bash
# Set up, build, and run the tests: the CPU tier always; the GPU tier too when a GPU is present.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build="${BUILD_DIR:-$root/build}"
# The tests use a private cache so they never touch the user's.
export MOEJIT_CACHE_DIR="$build/test-cache"
if [ "${CI:-}" = "true" ] && ! ctest --test-dir "$build" -N -R filecheck | grep -q "Total Tests: [1-9]"; then
  echo "test: CI must run the generated-source (FileCheck) tests, and none are configured" >&2
  exit 1
fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -L cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  if ctest --test-dir "$build" -N -L gpu | grep -q "Total Tests: [1-9]"; then
    ctest --test-dir "$build" --output-on-failure -L gpu
  else
    echo "test: a GPU is present but this build has no GPU tests yet"
  fi
else
  echo "test: no GPU here; the GPU tier was not run"
fi
