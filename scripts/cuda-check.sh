#!/usr/bin/env bash
# Builds and runs the GPU check of the naive CUDA reference attention (test/native/cuda_check.cu with
# csrc/cuda/naive_attention.cu and csrc/cuda/fill.cu), with the project's nvcc flags.
# Usage, on a machine with a GPU, from any directory:
#     bash scripts/cuda-check.sh [seed] [--quick]
# seed: reruns a previous run's inputs (each run prints its seed); --quick skips the two large cases.
# SANITIZE=1 runs the --quick set under compute-sanitizer memcheck. NVCC overrides the compiler path.
# Build output goes to build/cuda-check/ (git-ignored). Exit status: 0 all PASS, 1 any FAIL.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
OUT="$ROOT/build/cuda-check"
FLAGS=(-std=c++17 -O3 -Xcompiler -fPIC -I"$ROOT/csrc"
       -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
       -gencode arch=compute_80,code=compute_80)
SOURCES=(csrc/cuda/naive_attention.cu csrc/cuda/fill.cu test/native/cuda_check.cu)

mkdir -p "$OUT"
objects=()
pids=()
for src in "${SOURCES[@]}"; do  # compile in parallel, link once
  obj="$OUT/$(basename "$src" .cu).o"
  "$NVCC" "${FLAGS[@]}" -c "$ROOT/$src" -o "$obj" &
  pids+=("$!")
  objects+=("$obj")
done
build_ok=1
for pid in "${pids[@]}"; do wait "$pid" || build_ok=0; done
if [[ "$build_ok" != 1 ]]; then
  echo "FAIL build: nvcc failed (see above)"
  exit 1
fi
"$NVCC" "${FLAGS[@]}" "${objects[@]}" -o "$OUT/cuda_check"

if [[ "${SANITIZE:-0}" == 1 ]]; then
  exec compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 "$OUT/cuda_check" --quick "$@"
fi
exec "$OUT/cuda_check" "$@"
