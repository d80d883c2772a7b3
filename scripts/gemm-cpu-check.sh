#!/usr/bin/env bash
# Builds and runs the standalone CPU GEMM check (test/native/gemm_cpu_check.cc) with g++.
#   scripts/gemm-cpu-check.sh          optimised build (the addon's flags: -O3, no -march), checks + GFLOP/s
#   scripts/gemm-cpu-check.sh --asan   AddressSanitizer + UBSan build, correctness only
# Extra arguments go to the program (--seed N, --verbose). Exit code nonzero on failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

mode="release"
if [[ "${1:-}" == "--asan" ]]; then
  mode="asan"
  shift
fi

out="build/gemm-cpu-check"
mkdir -p "$out"
sources=(test/native/gemm_cpu_check.cc csrc/cpu/thread_pool.cc csrc/cpu/gemm/gemm_cpu.cc)
flags=(-std=c++17 -O3 -pthread -Icsrc -Itest/native -Wall -Wextra)
args=()
if [[ "$mode" == "asan" ]]; then
  flags+=(-g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined)
  args+=(--no-perf)
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi

bin="$out/gemm_cpu_check_$mode"
echo "+ g++ ${flags[*]} ${sources[*]} -o $bin"
g++ "${flags[@]}" "${sources[@]}" -o "$bin"
"$bin" ${args[@]+"${args[@]}"} "$@"
