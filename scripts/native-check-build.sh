# Sourced by the native check scripts (scripts/*-check.sh): builds a standalone CUDA check
# program with the flags of the addon's CUDA build (sm_80 and sm_90a SASS, sm_80 PTX; ptxas warns
# on spills), compiling the sources in parallel and linking once.
#   native_check_build <output dir> <program name> <source relative to the repo root>...
# Sets NATIVE_CHECK_BIN to the program's path. NVCC overrides the compiler. Exits 1 on a failed build.
NATIVE_CHECK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
NATIVE_CHECK_FLAGS=(-std=c++17 -O3 -Xcompiler -fPIC -I"$NATIVE_CHECK_ROOT/csrc" -I"$NATIVE_CHECK_ROOT/test/native" -DFA_HAS_SM90A=1
                    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
                    -gencode arch=compute_80,code=compute_80)

native_check_build() {
  local out="$1" name="$2"
  shift 2
  mkdir -p "$out"
  local objects=() pids=() src obj pid ok=1
  for src in "$@"; do
    obj="$out/$(basename "$src" .cu).o"
    "$NVCC" "${NATIVE_CHECK_FLAGS[@]}" -Xptxas -warn-spills -c "$NATIVE_CHECK_ROOT/$src" -o "$obj" &
    pids+=("$!")
    objects+=("$obj")
  done
  for pid in "${pids[@]}"; do wait "$pid" || ok=0; done
  if [[ "$ok" != 1 ]]; then
    echo "FAIL build: nvcc failed (see above)"
    exit 1
  fi
  "$NVCC" "${NATIVE_CHECK_FLAGS[@]}" "${objects[@]}" -o "$out/$name"
  NATIVE_CHECK_BIN="$out/$name"
}

# The whole of a check script: native_check_main <output dir> <program name> <sources...> -- "$@"
# Flags of the script: --build-only compiles and links only (no GPU needed) and prints the program's
# path; every other argument goes to the program (a seed, --no-bench). SANITIZE=1 runs the program
# (with --no-bench) under compute-sanitizer memcheck. Otherwise the program runs; its exit status is
# the script's.
native_check_main() {
  local out="$1" name="$2"
  shift 2
  local sources=()
  while [[ $# -gt 0 && "$1" != -- ]]; do
    sources+=("$1")
    shift
  done
  [[ $# -gt 0 ]] && shift  # the --
  local build_only=0 a
  local args=()
  for a in "$@"; do
    if [[ "$a" == --build-only ]]; then build_only=1; else args+=("$a"); fi
  done
  native_check_build "$out" "$name" "${sources[@]}"
  if [[ "$build_only" == 1 ]]; then
    echo "built $NATIVE_CHECK_BIN"
    exit 0
  fi
  if [[ "${SANITIZE:-0}" == 1 ]]; then
    exec compute-sanitizer --tool memcheck --error-exitcode 1 "$NATIVE_CHECK_BIN" --no-bench ${args[@]+"${args[@]}"}
  fi
  exec "$NATIVE_CHECK_BIN" ${args[@]+"${args[@]}"}
}
