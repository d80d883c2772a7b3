#!/usr/bin/env bash
# Builds and runs the standalone CPU backend check (test/native/cpu_check.cc) with g++.
#   scripts/cpu-check.sh            optimised build (the addon's flags: -O3, no -march), full check + timings
#   scripts/cpu-check.sh --asan     AddressSanitizer + UBSan build, correctness only
# Extra arguments after the mode go to the program (e.g. --seed 123). Exit code nonzero on failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

mode="release"
if [[ "${1:-}" == "--asan" ]]; then
  mode="asan"
  shift
fi

out="build/cpu-check"
mkdir -p "$out"
sources=(
  test/native/cpu_check.cc
  csrc/cpu/thread_pool.cc
  csrc/cpu/flash_fwd_cpu.cc
  csrc/cpu/flash_bwd_cpu.cc
)
flags=(-std=c++17 -O3 -pthread -Icsrc -Wall -Wextra)
args=()
if [[ "$mode" == "asan" ]]; then
  flags+=(-g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined)
  args+=(--no-perf)
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi

bin="$out/cpu_check_$mode"
echo "+ g++ ${flags[*]} ${sources[*]} -o $bin"
g++ "${flags[@]}" "${sources[@]}" -o "$bin"
"$bin" "${args[@]}" "$@"
