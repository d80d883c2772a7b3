#!/usr/bin/env bash
# Builds and runs the GPU check + timing of the float32 FA2 backward (test/native/flash_bwd_fp32_check.cu
# with csrc/cuda/flash/flash_bwd_fp32.cu; the float32 forward csrc/cuda/flash/flash_fwd_fp32.cu gives the
# backward's out and lse; csrc/cuda/naive_attention.cu is the full-fp32 comparison).
# Usage, from any directory:
#     bash scripts/flash-bwd-fp32-check.sh [--build-only] [seed] [--no-bench]
# --build-only: compile and link only (no GPU needed). seed reruns a previous run's inputs.
# SANITIZE=1 runs the check (no bench) under compute-sanitizer memcheck. NVCC overrides the compiler.
# Build output goes to build/flash-bwd-fp32-check/. Exit status: 0 all PASS, 1 any FAIL.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/native-check-build.sh"
native_check_main "$NATIVE_CHECK_ROOT/build/flash-bwd-fp32-check" flash_bwd_fp32_check \
  csrc/cuda/flash/flash_bwd_fp32.cu csrc/cuda/flash/flash_fwd_fp32.cu csrc/cuda/naive_attention.cu \
  test/native/flash_bwd_fp32_check.cu -- "$@"
