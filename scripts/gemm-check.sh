#!/usr/bin/env bash
# Builds and runs the standalone CUDA GEMM check (test/native/gemm_check.cu): every path, layout,
# dtype and epilogue against a float64 reference, then TFLOP/s on the GPT's linear-layer products.
#   scripts/gemm-check.sh [seed] [--no-bench] [--bench-only] [--build-only]
# --build-only needs no GPU. SANITIZE=1 runs it under compute-sanitizer memcheck.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/native-check-build.sh"
native_check_main "$NATIVE_CHECK_ROOT/build/gemm-check" gemm_check \
  test/native/gemm_check.cu csrc/cuda/gemm/gemm.cu csrc/cuda/gemm/gemm_sm80.cu csrc/cuda/gemm/gemm_sm80_fp32.cu \
  csrc/cuda/gemm/gemm_sm90.cu csrc/cuda/copy.cu -- "$@"
