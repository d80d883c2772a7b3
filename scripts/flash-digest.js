#!/usr/bin/env node
// Prints a digest of the CUDA FlashAttention-2 outputs (forward out and lse; backward dq, dk, dv) for
// fixed inputs over head dims, causal or not, GQA and awkward lengths, one line per case and
// dtype. Two builds whose kernels should compute the same bits (a refactor of the kernel
// architecture) must print the same lines: run it with each build's addon in build/Release and
// compare the outputs.
//   node scripts/flash-digest.js [--dtype float32,float16,bfloat16] [--pass fwd,bwd]
'use strict';
const crypto = require('node:crypto');
const fa = require('../dist/lib');

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1].split(',') : fallback;
}
const dtypes = arg('--dtype', ['float32', 'float16', 'bfloat16']);
const passes = arg('--pass', ['fwd', 'bwd']);

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

(async () => {
  for (const dtype of dtypes) {
    for (const c of cases) {
      const seed = c.d * 7 + (c.causal ? 1 : 0) + c.sq;
      const opts = { device: 'cuda', dtype };
      const q = fa.Tensor.fromFloat32Array(values(c.b * c.sq * c.hq * c.d, seed), [c.b, c.sq, c.hq, c.d], opts);
      const k = fa.Tensor.fromFloat32Array(values(c.b * c.sk * c.hk * c.d, seed + 1), [c.b, c.sk, c.hk, c.d], opts);
      const v = fa.Tensor.fromFloat32Array(values(c.b * c.sk * c.hk * c.d, seed + 2), [c.b, c.sk, c.hk, c.d], opts);
      const name = `${dtype} b${c.b} sq${c.sq} sk${c.sk} h${c.hq}/${c.hk} d${c.d}${c.causal ? ' causal' : ''}`;
      const ctx = fa.flashAttentionWithGrad(q, k, v, { causal: c.causal, kernel: 'flash' });
      if (passes.includes('fwd')) console.log(`fwd ${name} ${await digest([ctx.out, ctx.lse])}`);
      if (passes.includes('bwd')) {
        const dout = fa.Tensor.fromFloat32Array(values(c.b * c.sq * c.hq * c.d, seed + 3), [c.b, c.sq, c.hq, c.d], opts);
        const g = ctx.backward(dout, { deterministic: true });  // atomic dq adds would vary run to run
        console.log(`bwd ${name} ${await digest([g.dq, g.dk, g.dv])}`);
        for (const t of [dout, g.dq, g.dk, g.dv]) t.dispose();
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
