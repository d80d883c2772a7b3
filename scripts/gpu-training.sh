#!/usr/bin/env bash
# The training stack on a GPU machine, in two parts that each fit one device call:
#
#   scripts/gpu-training.sh check [LOGDIR]   ops-check (every CUDA op kernel against float64, then
#                                            its GB/s) and the Jest suites of the tensors, ops, layers,
#                                            safetensors and the GPT example, on CUDA
#   scripts/gpu-training.sh twin  [LOGDIR]   examples/gpt against its PyTorch twin: fp32 loss curves
#                                            (50 steps, TF32 off both sides), then bf16 tokens/s of
#                                            Node and PyTorch eager on the same batches (1000 Node
#                                            steps: memory must stay flat)
#
# Needs the addon built with CUDA (build/), node on PATH (`source .gpu/env.sh`), and for `twin`
# python3 with PyTorch. Logs go to LOGDIR (default $OUT, else ./gpu-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-check}
logs=${2:-${OUT:-./gpu-logs}}
mkdir -p "$logs"
export FLASH_ATTN_NODE_QUIET=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
status=0

case "$mode" in
  check)
    bash scripts/ops-check.sh > "$logs/ops-check.log" 2>&1 || status=1
    grep -E "FAIL|ops_check:" "$logs/ops-check.log" | tail -20
    grep -E "GB/s" "$logs/ops-check.log" | tail -30
    npx jest --ci test/ops-train.test.ts test/ops-train-validation.test.ts test/ops-nn.test.ts \
      test/ops-nn-validation.test.ts test/tensor-views.test.ts test/attention-strided.test.ts test/scope.test.ts \
      test/interop.test.ts test/tensor.test.ts test/safetensors.test.ts test/nn.test.ts test/gpt.test.ts \
      > "$logs/jest-training.log" 2>&1 || status=1
    grep -E "^(PASS|FAIL)|✕|^Tests:" "$logs/jest-training.log" | head -60
    ;;
  twin)
    run=$(mktemp -d)
    node examples/gpt/train.js --device cuda --dtype float32 --fp32-precision highest --steps 50 --log-every 1 \
      --json --out "$run/fp32" > "$logs/node-fp32.jsonl" 2> "$logs/node-fp32.err" || status=1
    python3 examples/gpt/twin.py --run "$run/fp32" --mode fp32 --steps 50 --compare "$run/fp32/log.jsonl" \
      > "$logs/twin-fp32.txt" 2>&1 || status=1
    tail -3 "$logs/twin-fp32.txt"
    node examples/gpt/train.js --device cuda --steps "${BF16_STEPS:-1000}" --json --out "$run/bf16" \
      > "$logs/node-bf16.jsonl" 2> "$logs/node-bf16.err" || status=1
    python3 examples/gpt/twin.py --run "$run/bf16" --mode bf16 --log-every 10 \
      > "$logs/torch-bf16.jsonl" 2> "$logs/torch-bf16.err" || status=1
    tail -1 "$logs/node-bf16.jsonl"
    tail -2 "$logs/torch-bf16.jsonl"
    cp "$run/bf16/loss.svg" "$logs/loss-bf16.svg" 2>/dev/null
    head -c 600 "$run/bf16/sample.txt" 2>/dev/null; echo
    ;;
  *)
    echo "usage: scripts/gpu-training.sh check|twin [LOGDIR]" >&2
    exit 2
    ;;
esac
exit $status
