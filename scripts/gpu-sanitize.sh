#!/usr/bin/env bash
# Runs scripts/sanitize-cases.js (the CUDA FlashAttention-2 forward and backward, atomic and
# deterministic, through the Node API on tail, cross-length, causal and GQA shapes, every specialised
# head dim plus padded ones, fp16 and bf16) under the four compute-sanitizer tools, and fails on any
# finding:
#   memcheck --leak-check full  out-of-bounds / misaligned accesses, device memory leaks   full set
#   initcheck                   reads of uninitialised device memory                        full set
#   synccheck                   invalid barrier / synchronisation use                      full set
#   racecheck                   shared-memory hazards (slow: a smaller set, --set race)    race set
# Every tool runs with the outputs poisoned (NaN-filled before the kernels run): initcheck (2025.3)
# does not record the writes of TMA stores (cp.async.bulk.tensor), with which the Hopper forward writes
# out, and reports every read of an unpoisoned out as uninitialised. An element that no kernel wrote
# stays NaN and fails the driver's element-wise comparison with the naive kernel.
# Usage, on the GPU machine, from any directory (node must be on PATH: `source .gpu/env.sh` from the
# project root first; dist/ and a CUDA build of the addon must exist, as for scripts/gpu-smoke.js):
#     bash scripts/gpu-sanitize.sh [log dir]          (default /tmp)
# TOOLS="memcheck racecheck" runs some of the tools; SANITIZER overrides compute-sanitizer's path.
# Logs: <log dir>/sanitize-<tool>.log (the tool's report and the driver's output). A tool passes when
# compute-sanitizer exits 0, every summary line reports 0 errors (racecheck: 0 hazards, 0 errors and 0
# warnings; memcheck: and 0 bytes leaked when it prints a leak summary), and the driver printed its
# "sanitize-cases: OK" line (a crashed driver can leave a clean-looking summary behind). The driver
# itself checks that no CUDA tensor is left live and empties the memory pool before it exits.
# Exit status: 0 all clean, 1 otherwise.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log_dir="${1:-/tmp}"
tools="${TOOLS:-memcheck initcheck synccheck racecheck}"

fail_setup() {
  echo "gpu-sanitize: $*" >&2
  exit 1
}

node_bin="$(command -v node || true)"
[[ -n "$node_bin" ]] || fail_setup "node is not on PATH: run 'source .gpu/env.sh' from the project root first"
sanitizer="${SANITIZER:-$(command -v compute-sanitizer || true)}"
if [[ -z "$sanitizer" ]]; then
  for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if [[ -x "$candidate" ]]; then
      sanitizer="$candidate"
      break
    fi
  done
fi
[[ -n "$sanitizer" && -x "$sanitizer" ]] || fail_setup "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin); set SANITIZER"
[[ -f "$root/dist/lib/index.js" ]] || fail_setup "$root/dist/lib/index.js is missing: build the package (npm run build:ts)"
mkdir -p "$log_dir" || fail_setup "cannot create the log directory $log_dir"

# Exit status compute-sanitizer returns when the tool found errors (distinct from the driver's 1).
readonly FINDINGS_STATUS=86

# run_tool <tool>: runs the driver under the tool, then judges the log. Prints one PASS/FAIL line.
run_tool() {
  local tool="$1" log="$log_dir/sanitize-$1.log" args=() driver_args=() status start problems=()
  case "$tool" in
    memcheck) args=(--leak-check full) ;;
    initcheck) ;;
    synccheck) ;;
    racecheck) driver_args=(--set race) ;;
    *) echo "FAIL $tool: unknown tool (use memcheck, initcheck, synccheck, racecheck)"; return 1 ;;
  esac
  start=$SECONDS
  (cd "$root" && FLASH_ATTN_NODE_QUIET=1 "$sanitizer" --tool "$tool" ${args[@]+"${args[@]}"} \
    --error-exitcode "$FINDINGS_STATUS" "$node_bin" scripts/sanitize-cases.js ${driver_args[@]+"${driver_args[@]}"}) > "$log" 2>&1
  status=$?

  if [[ "$status" == "$FINDINGS_STATUS" ]]; then
    problems+=("compute-sanitizer reported errors")
  elif [[ "$status" != 0 ]]; then
    problems+=("exit status $status")
  fi
  grep -q '^sanitize-cases: OK' "$log" || problems+=("the driver did not finish (no 'sanitize-cases: OK')")
  if [[ "$tool" == racecheck ]]; then
    grep -Eq 'RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)' "$log" \
      || problems+=("racecheck summary is not '0 hazards displayed (0 errors, 0 warnings)'")
  else
    grep -Eq 'ERROR SUMMARY: 0 errors' "$log" || problems+=("summary is not 'ERROR SUMMARY: 0 errors'")
  fi
  # Every summary line must be clean, should there be several (one per process or context).
  if grep -E '(ERROR|RACECHECK) SUMMARY:' "$log" | grep -Ev '(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\))' >/dev/null; then
    problems+=("a summary line reports findings")
  fi
  if [[ "$tool" == memcheck ]] && grep -q 'LEAK SUMMARY' "$log" && ! grep -Eq 'LEAK SUMMARY: 0 bytes leaked in 0 allocations' "$log"; then
    problems+=("device memory leaked")
  fi

  if [[ ${#problems[@]} -eq 0 ]]; then
    echo "PASS $tool ($((SECONDS - start)) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1 | sed 's/^=* *//')"
    return 0
  fi
  local joined
  joined="$(printf '%s; ' "${problems[@]}")"
  echo "FAIL $tool ($((SECONDS - start)) s): ${joined%; } -- see $log"
  grep -E '^=========' "$log" | head -n 20 | sed 's/^/    /'
  return 1
}

echo "gpu-sanitize: $("$sanitizer" --version 2>/dev/null | grep -m1 -i version || echo "$sanitizer"); node $("$node_bin" --version); logs in $log_dir"
failed=0
for tool in $tools; do
  run_tool "$tool" || failed=1
done
exit "$failed"
