#!/usr/bin/env bash
# Checks that a refactoring changed no generated code: `moejit dump-source --plan --ptx` of every
# preset x {sm_80, sm_90a} x {bf16, fp16, w8a8_int8} (plus an expert-parallel rank and a tile
# override) must be byte-identical between a base revision and the working tree.
#
#   scripts/check-codegen.sh [BASE_REV]    default BASE_REV: origin/main if it exists, else HEAD
#   NO_PTX=1        plan and source only (seconds instead of minutes; for iterating)
#   JOBS=N          parallel dumps (default: nproc)
#
# The base revision is built once in its own worktree under ${TMPDIR:-/tmp}/moejit-codegen-base,
# and its dumps are kept there per revision, so a second check against the same base only
# dumps the working tree. The working tree's `moejit` target is built in build/ (BUILD_DIR
# overrides).
# Exit 0: identical; 1: a difference (the first lines of each diff are printed); 2: usage.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
base_rev="${1:-}"
if [ -z "$base_rev" ]; then
  if git rev-parse -q --verify origin/main >/dev/null; then base_rev=origin/main; else base_rev=HEAD; fi
fi
base_sha="$(git rev-parse --verify "$base_rev^{commit}" 2>/dev/null)" || { echo "check-codegen: '$base_rev' is no commit" >&2; exit 2; }
work="${TMPDIR:-/tmp}/moejit-codegen-base"
mode=$([ "${NO_PTX:-0}" = "1" ] && echo "noptx" || echo "ptx")
jobs="${JOBS:-$(nproc)}"

# Base: a worktree at the base commit, built once per commit.
base_tree="$work/tree-$base_sha"
base_build="$work/build-$base_sha"
if [ ! -x "$base_build/moejit" ]; then
  rm -rf "$base_tree"
  git worktree prune
  git worktree add --detach "$base_tree" "$base_sha" >/dev/null
  cmake -S "$base_tree" -B "$base_build" -DMOEJIT_BUILD_TESTS=OFF -DMOEJIT_WITH_TORCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$base_build" --target moejit -j "$jobs" >/dev/null
fi
head_build="${BUILD_DIR:-$root/build}"
if [ ! -f "$head_build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$head_build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$head_build" --target moejit -j "$jobs" >/dev/null
head_bin="$head_build/moejit"

# The cases: one line each, the dump-source arguments after --preset.
cases=()
# Every preset the base knows (its refusal of an unknown name lists them).
presets="$({ "$base_build/moejit" dump-source --preset '?' 2>&1 || true; } | sed -n 's/.*allowed values: //p' | tr -d ',')"
[ -n "$presets" ] || { echo "check-codegen: could not read the base's preset names" >&2; exit 2; }
for preset in $presets; do
  for arch in sm_80 sm_90a; do
    cases+=("$preset --arch $arch")
    cases+=("$preset --arch $arch --dtype fp16")
    cases+=("$preset --arch $arch --quant w8a8_int8")
  done
done
cases+=("deepseek-v3 --arch sm_90a --ep-size 8 --ep-rank 3 --tp-size 2 --tp-rank 1")
cases+=("qwen3-30b-a3b --arch sm_90a --weight-layout kn")
cases+=("mixtral-8x7b --arch sm_90a --activation gelu --gated false")

dump() {  # binary out-dir case
  local bin="$1" dir="$2" args="$3"
  local name
  name="$(echo "$args" | tr ' ' '_' | tr -d '-')"
  local flags=(--plan)
  [ "$mode" = "ptx" ] && flags+=(--ptx)
  # shellcheck disable=SC2086
  env MOEJIT_TILES="${TILES:-}" MOEJIT_DISK_CACHE=0 "$bin" dump-source --preset $args "${flags[@]}" \
    >"$dir/$name.out" 2>"$dir/$name.err" || echo "exit $?" >>"$dir/$name.err"
}
export -f dump
export mode

base_out="$work/out-$base_sha-$mode"
head_out="$(mktemp -d "${TMPDIR:-/tmp}/moejit-codegen-head.XXXXXX")"
trap 'rm -rf "$head_out"' EXIT
if [ ! -f "$base_out/.complete" ]; then
  rm -rf "$base_out" && mkdir -p "$base_out"
  printf '%s\n' "${cases[@]}" | xargs -P "$jobs" -I{} bash -c 'dump "$0" "$1" "$2"' "$base_build/moejit" "$base_out" {}
  touch "$base_out/.complete"
fi
printf '%s\n' "${cases[@]}" | xargs -P "$jobs" -I{} bash -c 'dump "$0" "$1" "$2"' "$head_bin" "$head_out" {}

different=0
for f in "$base_out"/*.out "$base_out"/*.err; do
  name="$(basename "$f")"
  if ! cmp -s "$f" "$head_out/$name"; then
    different=$((different + 1))
    echo "DIFFERENT: $name"
    diff "$f" "$head_out/$name" | head -20 || true
  fi
done
total=$(ls "$base_out"/*.out | wc -l)
bytes=$(cat "$base_out"/*.out | wc -c)
if [ "$different" -gt 0 ]; then
  echo "check-codegen: $different of $((total * 2)) outputs differ from $base_rev ($base_sha, $mode)"
  exit 1
fi
echo "check-codegen: $total cases ($mode, $bytes bytes of plan, source$([ "$mode" = ptx ] && echo " and PTX")) identical to $base_rev ($base_sha)"
