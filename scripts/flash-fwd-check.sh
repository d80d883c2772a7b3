#!/usr/bin/env bash
# Builds and runs the GPU check + timing of the FA2 forward (test/native/flash_fwd_check.cu with
# csrc/cuda/flash/flash_fwd.cu and, as the reference, csrc/cuda/naive_attention.cu).
# Usage, from any directory:
#     bash scripts/flash-fwd-check.sh [--build-only] [seed] [--no-bench]
# --build-only: compile and link only (no GPU needed). seed reruns a previous run's inputs.
# SANITIZE=1 runs the check (no bench) under compute-sanitizer memcheck. NVCC overrides the compiler.
# Build output goes to build/flash-fwd-check/. Exit status: 0 all PASS, 1 any FAIL.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
OUT="$ROOT/build/flash-fwd-check"
FLAGS=(-std=c++17 -O3 -Xcompiler -fPIC -I"$ROOT/csrc"
       -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
       -gencode arch=compute_80,code=compute_80)
SOURCES=(csrc/cuda/flash/flash_fwd.cu csrc/cuda/naive_attention.cu test/native/flash_fwd_check.cu)

build_only=0
args=()
for a in "$@"; do
  if [[ "$a" == --build-only ]]; then build_only=1; else args+=("$a"); fi
done

mkdir -p "$OUT"
objects=()
pids=()
for src in "${SOURCES[@]}"; do  # compile in parallel, link once
  obj="$OUT/$(basename "$src" .cu).o"
  extra=()
  [[ "$src" == csrc/cuda/flash/* ]] && extra=(-Xptxas -warn-spills)
  "$NVCC" "${FLAGS[@]}" "${extra[@]}" -c "$ROOT/$src" -o "$obj" &
  pids+=("$!")
  objects+=("$obj")
done
build_ok=1
for pid in "${pids[@]}"; do wait "$pid" || build_ok=0; done
if [[ "$build_ok" != 1 ]]; then
  echo "FAIL build: nvcc failed (see above)"
  exit 1
fi
"$NVCC" "${FLAGS[@]}" "${objects[@]}" -o "$OUT/flash_fwd_check"
if [[ "$build_only" == 1 ]]; then
  echo "built $OUT/flash_fwd_check"
  exit 0
fi

if [[ "${SANITIZE:-0}" == 1 ]]; then
  exec compute-sanitizer --tool memcheck --error-exitcode 1 "$OUT/flash_fwd_check" --no-bench ${args[@]+"${args[@]}"}
fi
exec "$OUT/flash_fwd_check" ${args[@]+"${args[@]}"}
