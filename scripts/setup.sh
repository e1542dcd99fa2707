#!/usr/bin/env bash
# Installs what the build needs, by Debian package name, when it is missing. A package counts as
# present when the file it provides is there, however it got there: the GPU machine has these
# libraries in /usr/include already and no package registry, so nothing is installed there.
set -euo pipefail

# package : a file that shows it is present
requirements=(
  "cmake:$(command -v cmake || echo /usr/bin/cmake)"
  "g++:$(command -v g++ || echo /usr/bin/g++)"
  "libfmt-dev:/usr/include/fmt/format.h"
  "libcli11-dev:/usr/include/CLI/CLI.hpp"
  "nlohmann-json3-dev:/usr/include/nlohmann/json.hpp"
  "libssl-dev:/usr/include/openssl/evp.h"
  "libgtest-dev:/usr/include/gtest/gtest.h"
)
# FileCheck runs the generated-source tests; a machine without it (the GPU machine has no
# registry) builds and runs everything else, and scripts/test.sh insists on it under CI.
optional=("llvm-14-tools:/usr/lib/llvm-14/bin/FileCheck")
missing=()
for r in "${requirements[@]}"; do
  package="${r%%:*}" file="${r#*:}"
  [ -e "$file" ] || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: missing ${missing[*]} and no apt-get to install them" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
for r in "${optional[@]}"; do
  package="${r%%:*}" file="${r#*:}"
  if [ ! -e "$file" ] && ! command -v FileCheck >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1; }; then
      sudo_cmd=""
      [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
      { $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$package"; } \
        >/dev/null 2>&1 || echo "setup: could not install $package; its tests will be skipped"
    else
      echo "setup: $package is missing; its tests will be skipped"
    fi
  fi
done
command -v ninja >/dev/null 2>&1 || echo "setup: ninja not found; building with make"

# The torch side (op library, Python package, its tests) builds against the GPU machine's versions.
# Where python3 lacks them and pip can reach PyPI, install those pins (CI does this; the GPU
# machine has them and no registry).
# safetensors writes the checkpoint tests' files (transformers needs it too; named so it is there).
python_pins=("torch==2.11.0" "transformers==5.17.0" "safetensors" "pytest" "wheel")
if command -v python3 >/dev/null 2>&1; then
  if ! python3 -c "import torch, transformers, safetensors, pytest, wheel" >/dev/null 2>&1; then
    echo "setup: installing ${python_pins[*]} with pip"
    python3 -m pip install -q "${python_pins[@]}" \
      || echo "setup: could not install the torch side; the op library and its tests will be skipped"
  fi
fi

cuda_home="${MOEJIT_CUDA_HOME:-${CUDA_HOME:-/usr/local/cuda}}"
if [ ! -e "$cuda_home/include/nvrtc.h" ]; then
  echo "setup: no CUDA toolkit at $cuda_home (nvrtc.h missing); install CUDA 12.8+ and set CUDA_HOME" >&2
  exit 1
fi
