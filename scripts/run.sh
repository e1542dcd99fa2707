#!/usr/bin/env bash
# The main job on the default preset: set up, build, then validate, plan, generate and compile
# every kernel of the layer, printing the plan, the kernels, compile times and the cache.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build="${BUILD_DIR:-$root/build}"
"$build/moejit" compile --preset "${MOEJIT_PRESET:-qwen3-30b-a3b}" --plan "$@"
