#!/usr/bin/env python3
"""torch.matmul (cuBLAS) on the GPT's linear-layer products, timed like test/native/gemm_check.cu.

Products (M = 16384 tokens = batch 64 x context 256, C = 384; x [M, in], W [out, in], dy [M, out]):
  fwd_<layer>: y  = x @ W.T        (M, out, in)
  dx_<layer>:  dx = dy @ W         (M, in, out)
  dw_<layer>:  dW = dy.T @ x       (out, in, M)   torch writes dW in the inputs' dtype; ours writes
                                                  float32 with beta = 1 (dW +=)
for the layers qkv (1152, 384), proj (384, 384), fc (1536, 384), fc2 (384, 1536), lm_head (65, 384);
bfloat16, float16 and float32 with TF32 on (torch.backends.cuda.matmul.allow_tf32). fwd_fc also as
gelu(linear(x, W, b), tanh) (bias_gelu: what our fused epilogue replaces), and with the pre-GELU
tensor kept (gelu_pre: the same ops; torch keeps `pre` anyway).

Timing (same as check_timing.h): 3 warm-up calls, then 20 calls each between its own pair of CUDA
events (median) and 5 rounds of 20 calls queued between one pair (the median round's mean); TFLOP/s
from the queued time. One disturbed round (seen: torch's 384 x 384 products at 1.5x their usual
time in one run of three) stays out of the median. Inputs are torch.randn, reused across calls as
in the native check (the fwd operands fit the 50 MiB L2 on both sides).

Usage: python3 bench/gemm_torch.py [--ours gemm.log] [--layers 6]
With --ours, the BENCH lines of scripts/gemm-check.sh's output are put beside torch's, with the
ratio torch_ms / ours_ms (> 1: ours faster) for the queued time and the median, their geometric
mean per dtype, and the GEMM time of one training step of a `--layers`-layer GPT on each side.
"""
import argparse
import re
import statistics
import sys

import torch
import torch.nn.functional as F

WARMUP = 3
TIMED = 20
ROUNDS = 5
TOKENS, C, VOCAB = 16384, 384, 65
LAYERS = [("qkv", 3 * C, C), ("proj", C, C), ("fc", 4 * C, C), ("fc2", C, 4 * C), ("lm_head", VOCAB, C)]
DTYPES = [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)]


def time_fn(fn):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(TIMED):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ms.append(s.elapsed_time(e))
    rounds = []
    for _ in range(ROUNDS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(TIMED):
            fn()
        e.record()
        e.synchronize()
        rounds.append(s.elapsed_time(e) / TIMED)
    return statistics.median(ms), statistics.median(rounds)


def products():
    for name, out, inp in LAYERS:
        yield f"fwd_{name}", TOKENS, out, inp
    for name, out, inp in LAYERS:
        yield f"dx_{name}", TOKENS, inp, out
    for name, out, inp in LAYERS:
        yield f"dw_{name}", out, inp, TOKENS


def run_torch():
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    rows = {}
    for dname, dt in DTYPES:
        for name, m, n, k in products():
            layer = name.split("_", 1)[1]
            out, inp = next((o, i) for (l, o, i) in LAYERS if l == layer)
            if name.startswith("fwd"):
                x = torch.randn(m, k, device="cuda", dtype=dt)
                w = torch.randn(n, k, device="cuda", dtype=dt)
                fns = {"plain": lambda x=x, w=w: torch.matmul(x, w.t())}
                if layer == "fc" and dt != torch.float32:
                    b = torch.randn(n, device="cuda", dtype=dt)
                    fns["bias_gelu"] = lambda x=x, w=w, b=b: F.gelu(F.linear(x, w, b), approximate="tanh")
                    fns["gelu_pre"] = fns["bias_gelu"]
            elif name.startswith("dx"):
                dy = torch.randn(m, out, device="cuda", dtype=dt)
                w = torch.randn(out, inp, device="cuda", dtype=dt)
                fns = {"plain": lambda dy=dy, w=w: torch.matmul(dy, w)}
            else:
                dy = torch.randn(k, out, device="cuda", dtype=dt)
                x = torch.randn(k, inp, device="cuda", dtype=dt)
                fns = {"plain": lambda dy=dy, x=x: torch.matmul(dy.t(), x)}
            for variant, fn in fns.items():
                med, queued = time_fn(fn)
                rows[(name, dname, variant)] = (m, n, k, med, queued)
    return rows


BENCH = re.compile(r"^BENCH\s+(\S+)\s+(\S+)\s+(\S+)\s+m\s+(\d+)\s+n\s+(\d+)\s+k\s+(\d+)\s+(\S+)\s+splits\s+(\d+)\s+"
                   r"median\s+([\d.]+)\s+ms\s+queued\s+([\d.]+)\s+ms")


def read_ours(path):
    ours = {}
    with open(path) as f:
        for line in f:
            mt = BENCH.match(line.strip())
            if mt:
                name, dname, variant = mt.group(1), mt.group(2), mt.group(3)
                ours[(name, dname, variant)] = (mt.group(7), int(mt.group(8)), float(mt.group(9)), float(mt.group(10)))
    return ours


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="output of scripts/gemm-check.sh with its BENCH lines")
    ap.add_argument("--layers", type=int, default=6, help="transformer layers of the per-step sum (default 6)")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {props.name} (sm_{props.major}{props.minor}), "
          f"warm-up {WARMUP}, median of {TIMED}, queued: median of {ROUNDS} rounds of {TIMED}; TF32 on for f32")
    rows = run_torch()
    ours = read_ours(args.ours) if args.ours else {}
    hdr = f"{'product':<12} {'dtype':<5} {'variant':<9} {'M':>6} {'N':>5} {'K':>6} | {'torch ms':>9} {'TFLOP/s':>7}"
    if ours:
        hdr += f" | {'ours ms':>9} {'TFLOP/s':>7} {'path':<11} {'sp':>2} | {'ratio q':>7} {'ratio med':>9}"
    print(hdr)
    ratios = {}
    for (name, dname, variant), (m, n, k, med, queued) in rows.items():
        flops = 2.0 * m * n * k
        line = f"{name:<12} {dname:<5} {variant:<9} {m:>6} {n:>5} {k:>6} | {queued:9.4f} {flops / queued / 1e9:7.1f}"
        o = ours.get((name, dname, variant))
        if o:
            path, splits, omed, oq = o
            rq, rm = queued / oq, med / omed
            ratios.setdefault(dname, []).append(rq)
            line += f" | {oq:9.4f} {flops / oq / 1e9:7.1f} {path:<11} {splits:>2} | {rq:7.2f} {rm:9.2f}"
        print(line)
    for dname, rs in ratios.items():
        gm = 1.0
        for r in rs:
            gm *= r
        gm **= 1.0 / len(rs)
        print(f"{dname}: geometric mean of torch/ours (queued) over {len(rs)} rows: {gm:.3f}; min {min(rs):.2f}")
        step = step_ms(rows, ours, dname, args.layers)
        if step:
            t, o = step
            print(f"{dname}: GEMM time of one training step ({args.layers} layers; fwd fc with bias, GELU and the "
                  f"pre-GELU output): torch {t:.3f} ms, ours {o:.3f} ms, ratio {t / o:.3f}")
    return 0


def step_ms(rows, ours, dname, layers):
    """Queued-mean sums over the products of one GPT training step: per layer the fwd, dx and dW
    products of qkv, proj, fc (its fwd as gelu_pre, what the model runs) and fc2; the lm head's once.
    None when a row is missing on either side."""
    t = o = 0.0
    for kind in ("fwd", "dx", "dw"):
        for name, _, _ in LAYERS:
            variant = "gelu_pre" if (kind, name) == ("fwd", "fc") else "plain"
            key = (f"{kind}_{name}", dname, variant)
            if key not in rows or key not in ours:
                return None
            times = 1 if name == "lm_head" else layers
            t += times * rows[key][4]
            o += times * ours[key][3]
    return t, o


if __name__ == "__main__":
    sys.exit(main())
