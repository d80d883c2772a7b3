#!/usr/bin/env node
// Prints a digest of the CUDA FlashAttention-2 outputs (forward out and lse; backward dq, dk, dv,
// deterministic, with the algorithm 'auto' picks and with the single kernel) for fixed inputs over
// head dims, causal or not, GQA, awkward lengths and inputs holding NaN / ±Inf (the containment
// paths), one line per case and dtype. Two builds whose kernels should compute the same bits (a refactor of the kernel
// architecture) must print the same lines: run it with each build's addon in build/Release and
// compare the outputs.
//   node scripts/flash-digest.js [--dtype float32,float16,bfloat16] [--pass fwd,bwd] [--device cuda|cpu]
'use strict';
const crypto = require('node:crypto');
const fa = require('../dist/lib');

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1].split(',') : fallback;
}
const dtypes = arg('--dtype', ['float32', 'float16', 'bfloat16']);
const passes = arg('--pass', ['fwd', 'bwd']);
const device = arg('--device', ['cuda'])[0];

// Deterministic inputs: a fixed-seed xorshift, values in [-1, 1).
function values(n, seed) {
  let s = (seed * 2654435761) >>> 0 || 1;
  const a = new Float32Array(n);
  for (let i = 0; i < n; ++i) {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    a[i] = (s / 2 ** 31) - 1;
  }
  return a;
}

async function digest(tensors) {
  const h = crypto.createHash('sha256');
  for (const t of tensors) h.update(Buffer.from((await t.toFloat32Array()).buffer));
  return h.digest('hex').slice(0, 16);
}

const cases = [];
for (const d of [32, 64, 96, 128, 192, 256])
  for (const causal of [false, true]) cases.push({ b: 2, sq: 257, sk: 257, hq: 4, hk: 4, d, causal });
cases.push({ b: 1, sq: 1000, sk: 513, hq: 8, hk: 2, d: 64, causal: true });
cases.push({ b: 3, sq: 77, sk: 1031, hq: 6, hk: 3, d: 128, causal: false });
// NaN / ±Inf in q, k, v and dout near the causal diagonal: the rare paths of the forward (V) and the
// backward (Q, K, dO).
for (const d of [64, 128, 256]) cases.push({ b: 1, sq: 200, sk: 230, hq: 2, hk: 1, d, causal: true, nonfinite: true });
cases.push({ b: 1, sq: 200, sk: 230, hq: 2, hk: 1, d: 64, causal: false, nonfinite: true });

// Writes NaN, +Inf and -Inf into a few fixed elements of a [b, s, h, d] buffer (rows spread over the
// sequence, so that some sit on tiles that cross the diagonal).
function poison(a, s, h, d, salt) {
  const bad = [NaN, Infinity, -Infinity];
  for (let i = 0; i < 6; ++i) {
    const row = (37 * i + 11 * salt) % s, head = i % h, col = (13 * i + salt) % d;
    a[(row * h + head) * d + col] = bad[(i + salt) % 3];
  }
  return a;
}

(async () => {
  for (const dtype of dtypes) {
    for (const c of cases) {
      const seed = c.d * 7 + (c.causal ? 1 : 0) + c.sq;
      const opts = { device, dtype };
      const input = (s, h, salt) => {
        const a = values(c.b * s * h * c.d, seed + salt);
        return fa.Tensor.fromFloat32Array(c.nonfinite ? poison(a, s, h, c.d, salt) : a, [c.b, s, h, c.d], opts);
      };
      const q = input(c.sq, c.hq, 0);
      const k = input(c.sk, c.hk, 1);
      const v = input(c.sk, c.hk, 2);
      const name = `${dtype} b${c.b} sq${c.sq} sk${c.sk} h${c.hq}/${c.hk} d${c.d}${c.causal ? ' causal' : ''}` +
        `${c.nonfinite ? ' nonfinite' : ''}`;
      const ctx = fa.flashAttentionWithGrad(q, k, v, { causal: c.causal, kernel: 'flash' });
      if (passes.includes('fwd')) console.log(`fwd ${name} ${await digest([ctx.out, ctx.lse])}`);
      if (passes.includes('bwd')) {
        const dout = input(c.sq, c.hq, 3);
        // Deterministic: atomic dq adds would vary run to run.
        const g = fa.flashAttentionBackward(dout, q, k, v, ctx.out, ctx.lse, { causal: c.causal, deterministic: true });
        console.log(`bwd ${name} ${g.algorithm} ${await digest([g.dq, g.dk, g.dv])}`);
        if (g.algorithm !== 'single-kernel') {
          const s = fa.flashAttentionBackward(dout, q, k, v, ctx.out, ctx.lse,
            { causal: c.causal, deterministic: true, algorithm: 'single-kernel' });
          console.log(`bwd ${name} single-kernel ${await digest([s.dq, s.dk, s.dv])}`);
          for (const t of [s.dq, s.dk, s.dv]) t.dispose();
        }
        for (const t of [dout, g.dq, g.dk, g.dv]) t.dispose();
        ctx.dispose();
      } else {
        ctx.dispose();
      }
      for (const t of [q, k, v, ctx.out, ctx.lse]) t.dispose();
    }
  }
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
