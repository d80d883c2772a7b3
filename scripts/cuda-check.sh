#!/usr/bin/env bash
# Builds and runs the GPU check of the naive CUDA reference attention (test/native/cuda_check.cu with
# csrc/cuda/naive_attention.cu and csrc/cuda/fill.cu), with the project's nvcc flags.
# Usage, on a machine with a GPU, from any directory:
#     bash scripts/cuda-check.sh [seed] [--quick]
# seed: reruns a previous run's inputs (each run prints its seed); --quick skips the two large cases.
# SANITIZE=1 runs the --quick set under compute-sanitizer memcheck. NVCC overrides the compiler path.
# Build output goes to build/cuda-check/ (git-ignored). Exit status: 0 all PASS, 1 any FAIL.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/native-check-build.sh"
native_check_build "$NATIVE_CHECK_ROOT/build/cuda-check" cuda_check \
  csrc/cuda/naive_attention.cu csrc/cuda/fill.cu test/native/cuda_check.cu

if [[ "${SANITIZE:-0}" == 1 ]]; then
  exec compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 "$NATIVE_CHECK_BIN" --quick "$@"
fi
exec "$NATIVE_CHECK_BIN" "$@"
