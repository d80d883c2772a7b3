#!/usr/bin/env bash
# Builds and runs the GPU check + timing of the training ops' CUDA kernels (test/native/ops_check.cu
# with csrc/cuda/ops/*.cu): every kernel against a float64 host reference on awkward sizes and every
# dtype, then the GPT's shapes timed against the device's peak bandwidth.
# Usage, from any directory:
#     bash scripts/ops-check.sh [--build-only] [seed] [--no-bench] [--bench-only]
# --build-only: compile and link only (no GPU needed). seed reruns a previous run's inputs.
# SANITIZE=1 runs the check (no bench) under compute-sanitizer memcheck. NVCC overrides the compiler.
# Build output goes to build/ops-check/. Exit status: 0 all ok, 1 any FAIL.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/native-check-build.sh"
native_check_main "$NATIVE_CHECK_ROOT/build/ops-check" ops_check \
  csrc/cuda/ops/embedding.cu csrc/cuda/ops/norm.cu csrc/cuda/ops/rope.cu csrc/cuda/ops/activation.cu \
  csrc/cuda/ops/cross_entropy.cu csrc/cuda/ops/adamw.cu csrc/cuda/ops/reduce.cu test/native/ops_check.cu \
  -- "$@"
