#!/usr/bin/env python3
"""PyTorch twin of examples/gpt/main.ts.

Builds the same GPT (nanoGPT's architecture, with the options the Node run recorded in run.json),
loads the Node run's initial weights (init.safetensors, step 0), trains on the exact batches the
Node run used (tokens.bin) with the same AdamW settings and learning-rate schedule, and prints one
JSON object per step (step, loss, tokensPerSecond), like `train.js --json`.

    python3 examples/gpt/twin.py --run gpt-out --mode fp32 --steps 50 > torch.jsonl
    python3 examples/gpt/twin.py --run gpt-out --mode fp32 --steps 50 --compare gpt-out/log.jsonl
    python3 examples/gpt/twin.py --run gpt-out --mode bf16 --log-every 10     # tokens/s, SDPA, autocast

Modes:
  fp32  float32 everywhere with TF32 off (matmul and cuDNN); compare with a Node run made with
        `--dtype float32 --fp32-precision highest`. The loss curves agree within --tol (default
        1e-3 relative) over the first 50 steps.
  bf16  float32 parameters with bfloat16 autocast (PyTorch's usual mixed precision),
        scaled_dot_product_attention and fused AdamW: the eager baseline for the tokens/s comparison. Its curve
        tracks a Node bf16 run within the noise (Node keeps bf16 parameters with float32 masters).

The math matches lib/nn: GELU is the tanh approximation (GPT-2's), LayerNorm/RMSNorm eps 1e-5,
RoPE pairs x[i] with x[i + D/2] (rotate-half), attention scale 1/sqrt(head_dim), the LM head is the
token embedding (tied: its gradient accumulates both uses), weight decay applies to parameters with
2 or more dims, gradient clipping is clip_grad_norm_ (scale min(1, max / (norm + 1e-6))), and the
schedule is nanoGPT's linear warm-up then cosine decay (learningRate in main.ts).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_safetensors(path):
    """Tensors of a safetensors file: PyTorch's `safetensors` when installed, else a numpy reader."""
    try:
        from safetensors.torch import load_file
        return load_file(path), 'safetensors'
    except ImportError:
        pass
    dtypes = {'F32': np.float32, 'F16': np.float16, 'I32': np.int32}
    with open(path, 'rb') as f:
        n = int.from_bytes(f.read(8), 'little')
        header = json.loads(f.read(n).decode('utf-8'))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == '__metadata__':
            continue
        b, end = e['data_offsets']
        raw = data[b:end]
        if e['dtype'] == 'BF16':
            bits = np.frombuffer(raw, dtype='<u2').astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(dtypes[e['dtype']]).newbyteorder('<'))
        out[name] = torch.from_numpy(arr.copy().reshape(e['shape']))
    return out, 'numpy reader (safetensors not installed)'


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def make_norm(cfg):
    if cfg['norm'] == 'rmsnorm':
        return RMSNorm(cfg['dModel'])
    return nn.LayerNorm(cfg['dModel'], eps=1e-5, bias=cfg['bias'])


def rope_tables(seqlen, head_dim, base, device):
    """cos and sin [seqlen, head_dim / 2] as lib/ops/rope computes them (float32 angles)."""
    half = head_dim // 2
    theta = torch.tensor([base ** (-2.0 * i / head_dim) for i in range(half)], dtype=torch.float64).float()
    pos = torch.arange(seqlen, dtype=torch.float32)
    angle = pos[:, None] * theta[None, :]
    return angle.cos().to(device), angle.sin().to(device)


def apply_rope(x, cos, sin):
    """x [B, S, H, D]: (x_i, x_{i+D/2}) -> (x_i cos - x_{i+D/2} sin, x_i sin + x_{i+D/2} cos)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half].float(), x[..., half:].float()
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg['dModel']
        self.heads = cfg['heads']
        self.c_attn = nn.Linear(c, 3 * c, bias=cfg['bias'])
        self.c_proj = nn.Linear(c, c, bias=cfg['bias'])
        self.rope = cfg['positions'] == 'rope'

    def forward(self, x, rope=None):
        B, S, C = x.shape
        H = self.heads
        qkv = self.c_attn(x).view(B, S, 3, H, C // H)
        q, k, v = qkv.unbind(2)  # [B, S, H, D]
        if self.rope:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, S, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.swiglu = cfg['mlp'] == 'swiglu'
        hidden = cfg['mlpHidden']
        self.c_fc = nn.Linear(cfg['dModel'], 2 * hidden if self.swiglu else hidden, bias=cfg['bias'])
        self.c_proj = nn.Linear(hidden, cfg['dModel'], bias=cfg['bias'])

    def forward(self, x):
        u = self.c_fc(x)
        if self.swiglu:
            a, b = u.chunk(2, dim=-1)  # gate first, value second (lib/ops/activation swiglu)
            h = F.silu(a) * b
        else:
            h = F.gelu(u, approximate='tanh')
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x, rope=None):
        x = x + self.attn(self.ln_1(x), rope)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        t = {'wte': nn.Embedding(cfg['vocabSize'], cfg['dModel'])}
        if cfg['positions'] == 'learned':
            t['wpe'] = nn.Embedding(cfg['blockSize'], cfg['dModel'])
        t['h'] = nn.ModuleList([Block(cfg) for _ in range(cfg['layers'])])
        t['ln_f'] = make_norm(cfg)
        self.transformer = nn.ModuleDict(t)

    def forward(self, idx, targets):
        B, S = idx.shape
        x = self.transformer.wte(idx)
        rope = None
        if 'wpe' in self.transformer:
            x = x + self.transformer.wpe(torch.arange(S, device=idx.device))
        else:
            head_dim = self.cfg['dModel'] // self.cfg['heads']
            rope = rope_tables(S, head_dim, 10000.0, idx.device)
        for block in self.transformer.h:
            x = block(x, rope)
        x = self.transformer.ln_f(x)
        logits = F.linear(x, self.transformer.wte.weight)  # the LM head, tied to wte
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def learning_rate(step, o):
    """main.ts learningRate: 1-based step, linear warm-up, cosine decay to minLr at the last step."""
    it = step - 1
    if it < o['warmup']:
        return o['lr'] * (it + 1) / (o['warmup'] + 1)
    span = max(1, o['steps'] - o['warmup'])
    ratio = min(1.0, (it - o['warmup']) / span)
    return o['minLr'] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (o['lr'] - o['minLr'])


def read_jsonl(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith('{'):
                continue
            r = json.loads(line)
            if 'step' in r and 'loss' in r:
                rows[int(r['step'])] = float(r['loss'])
    return rows


def compare(node, torch_losses, steps, tol):
    """Prints the per-step relative differences; returns whether all are within tol."""
    worst = 0.0
    print('step  node_loss      torch_loss     rel_diff', file=sys.stderr)
    for step in range(1, steps + 1):
        if step not in node or step not in torch_losses:
            print(f'step {step} missing from a log', file=sys.stderr)
            return False
        a, b = node[step], torch_losses[step]
        rel = abs(a - b) / max(abs(b), 1e-12)
        worst = max(worst, rel)
        print(f'{step:4d}  {a:.7f}  {b:.7f}  {rel:.2e}', file=sys.stderr)
    ok = worst <= tol
    print(json.dumps({'compare': True, 'steps': steps, 'maxRelDiff': worst, 'tol': tol, 'ok': ok}))
    return ok


def profile_steps(n, windows, model, opt, autocast, opt_cfg, dev):
    """Runs n training steps under torch.profiler and prints the CUDA kernels' time per step (stderr)."""
    from torch.profiler import ProfilerActivity, profile

    def step(w):
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = model(w[:, :-1], w[:, 1:])
        loss.backward()
        if opt_cfg['gradClip'] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg['gradClip'])
        opt.step()

    for i in range(3):
        step(windows[i % len(windows)])
    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            step(windows[i % len(windows)])
        torch.cuda.synchronize(dev)
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / n
    print(f'twin profile: {n} steps, CUDA kernel time {total / 1000:.3f} ms per step, '
          f'{sum(e.count for e in rows) / n:.0f} kernels per step', file=sys.stderr)
    for e in rows[:40]:
        print(f'  {e.device_time_total / n:9.1f} us/step {e.count / n:5.0f}x  {e.key[:110]}', file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--run', default='gpt-out', help='the Node run\'s --out directory')
    ap.add_argument('--mode', choices=['fp32', 'bf16'], default='fp32')
    ap.add_argument('--steps', type=int, default=None, help='steps to train (default: all in tokens.bin)')
    ap.add_argument('--log-every', type=int, default=1, help='read the loss back every N steps (timing)')
    ap.add_argument('--compare', default=None, help='a Node log (train.js --json output or log.jsonl)')
    ap.add_argument('--compare-steps', type=int, default=50)
    ap.add_argument('--tol', type=float, default=1e-3)
    ap.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    ap.add_argument('--profile', type=int, default=0,
                    help='after training, profile N more steps (torch.profiler) and print the CUDA kernels by time')
    args = ap.parse_args()

    with open(os.path.join(args.run, 'run.json')) as f:
        run = json.load(f)
    cfg, opt_cfg = run['model'], run['optimizer']
    steps_in_file, B, S1 = run['tokens']['shape']
    steps = min(args.steps or steps_in_file, steps_in_file)
    tokens = np.fromfile(os.path.join(args.run, run['tokens']['file']), dtype='<i4').reshape(steps_in_file, B, S1)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision('highest')
    dev = torch.device(args.device)

    model = GPT(cfg)
    state, reader = read_safetensors(os.path.join(args.run, 'init.safetensors'))
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise SystemExit(f'checkpoint mismatch: missing {missing}, unexpected {unexpected}')
    model.to(dev)
    print(f'twin: {sum(p.numel() for p in model.parameters())} parameters, weights read by {reader}, '
          f'{steps} steps of batch {B} x {S1 - 1}, mode {args.mode}, torch {torch.__version__} on {dev}', file=sys.stderr)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{'params': decay, 'weight_decay': opt_cfg['weightDecay']}, {'params': no_decay, 'weight_decay': 0.0}],
        lr=opt_cfg['lr'], betas=(opt_cfg['beta1'], opt_cfg['beta2']), eps=opt_cfg['eps'],
        # fp32: the plain per-tensor loop (the reference numerics); bf16: the fused CUDA kernel, the
        # fastest eager AdamW (as nanoGPT uses), for the tokens/s comparison.
        **({'fused': True} if args.mode == 'bf16' and dev.type == 'cuda' else {'foreach': False}))
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=args.mode == 'bf16')

    # Every batch on the device before timing starts (no host copies inside the loop).
    windows = torch.from_numpy(tokens[:steps].astype(np.int64)).to(dev)
    losses, pending = {}, []
    if dev.type == 'cuda':
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        w = windows[step - 1]
        x, y = w[:, :-1], w[:, 1:]
        lr = learning_rate(step, opt_cfg)
        for g in opt.param_groups:
            g['lr'] = lr
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = model(x, y)
        loss.backward()
        if opt_cfg['gradClip'] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg['gradClip'])
        opt.step()
        pending.append((step, loss.detach(), lr))
        if step % args.log_every == 0 or step == steps:
            values = [p[1].item() for p in pending]  # synchronises, as main.ts does at its log points
            seconds = time.perf_counter() - t0
            tps = len(pending) * B * (S1 - 1) / seconds
            for (s, _, lr_s), v in zip(pending, values):
                losses[s] = v
                print(json.dumps({'step': s, 'loss': v, 'lr': lr_s, 'tokensPerSecond': tps}))
            pending = []
            t0 = time.perf_counter()

    if args.profile > 0:
        profile_steps(args.profile, windows, model, opt, autocast, opt_cfg, dev)

    if args.compare:
        n = min(args.compare_steps, steps)
        if not compare(read_jsonl(args.compare), losses, n, args.tol):
            sys.exit(1)


if __name__ == '__main__':
    main()
