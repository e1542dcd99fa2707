#!/usr/bin/env bash
# Configures and builds everything into build/ (BUILD_DIR overrides).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
cuda_home="${MOEJIT_CUDA_HOME:-${CUDA_HOME:-/usr/local/cuda}}"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUDAToolkit_ROOT="$cuda_home" >/dev/null
fi
cmake --build "$build" -j "$(nproc)"
# The Python package loads the op library from python/moejit/lib/ (also what `pip install ./python`
# ships); copy it on every build so the copy is never stale.
if [ -f "$build/backends/torch/libmoejit_torch.so" ]; then
  mkdir -p "$root/python/moejit/lib"
  cp "$build/backends/torch/libmoejit_torch.so" "$root/python/moejit/lib/"
fi
