#!/usr/bin/env bash
# Installs what the build needs, by package name, where a package manager is there to do it.
# On the GPU machine (no registry) the libraries are already in /usr/include: nothing to do.
set -euo pipefail

debian_packages=(cmake ninja-build g++ libfmt-dev libcli11-dev nlohmann-json3-dev libssl-dev libgtest-dev llvm-14-tools)

missing=()
if command -v dpkg-query >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  for p in "${debian_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cuda_home="${MOEJIT_CUDA_HOME:-${CUDA_HOME:-/usr/local/cuda}}"
if [ ! -x "$cuda_home/bin/nvcc" ] && ! command -v nvcc >/dev/null 2>&1; then
  echo "setup: no CUDA toolkit at $cuda_home; install CUDA 12.8+ and set CUDA_HOME" >&2
  exit 1
fi
