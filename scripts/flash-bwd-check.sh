#!/usr/bin/env bash
# Builds and runs the GPU check + timing of the FA2 backward (test/native/flash_bwd_check.cu with
# csrc/cuda/flash/flash_bwd.cu; the forward csrc/cuda/flash/flash_fwd.cu and its Hopper path give the
# backward's out and lse; csrc/cuda/naive_attention.cu is the reference).
# Usage, from any directory:
#     bash scripts/flash-bwd-check.sh [--build-only] [seed] [--no-bench]
# --build-only: compile and link only (no GPU needed). seed reruns a previous run's inputs.
# SANITIZE=1 runs the check (no bench) under compute-sanitizer memcheck. NVCC overrides the compiler.
# Build output goes to build/flash-bwd-check/. Exit status: 0 all PASS, 1 any FAIL.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/native-check-build.sh"
native_check_main "$NATIVE_CHECK_ROOT/build/flash-bwd-check" flash_bwd_check \
  csrc/cuda/flash/flash_bwd.cu csrc/cuda/flash/hopper/flash_bwd_sm90.cu csrc/cuda/flash/flash_fwd.cu \
  csrc/cuda/flash/hopper/flash_fwd_sm90.cu csrc/cuda/naive_attention.cu test/native/flash_bwd_check.cu \
  -- "$@"
