#!/usr/bin/env bash
# The main job on the default preset: set up, build, then validate, plan, generate and compile
# every kernel of the layer, printing the plan, the kernels, compile times and the cache.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build="${BUILD_DIR:-$root/build}"
preset="${MOEJIT_PRESET:-qwen3-30b-a3b}"
"$build/moejit" compile --preset "$preset" --plan "$@"
# With a GPU: run the layer on random data against the float64 reference, and time it.
"$build/bench/moejit_layer_check" --preset "$preset" --tokens "${MOEJIT_TOKENS:-64}"
