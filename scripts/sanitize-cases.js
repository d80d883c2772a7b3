// The CUDA FlashAttention-2 forward and backward through the Node API on a small set of shapes chosen
// for compute-sanitizer: scripts/gpu-sanitize.sh runs this under memcheck, racecheck,
// initcheck and synccheck. Needs the built package (dist/, like scripts/gpu-smoke.js) and a GPU.
// Usage, from the project root:
//     node scripts/sanitize-cases.js [--set full|race] [--no-poison] [--list]
// --set full (default): tails (seqlen 1, 17, 97, 1025), seqlenQ != seqlenK both ways, causal with and
//   without empty rows, GQA 8:1, every specialised head dim (32 ... 256) and padded ones (40, 112, 200),
//   the persistent warp-specialized forward with more work items than SMs, float16 and bfloat16.
//   --set race: a smaller set for racecheck (every specialised head dim and one padded, short seqlens
//   that still span several key tiles).
// --no-poison: outputs are not NaN-filled before the kernels run (debug.poisonOutputs), so under
//   initcheck an element that a kernel did not write is an uninitialised read when it is copied back
//   (for kernels that write with ordinary stores: initcheck does not record TMA stores, so the Hopper
//   forward's out is reported too; scripts/gpu-sanitize.sh keeps the poison).
// --list: prints the cases and exits.
// Each forward case runs kernel 'flash' and kernel 'naive' on the same inputs and checks loosely that
// they agree (proof that the kernel ran and wrote its rows; the accuracy rule is in
// test/flash-forward.test.ts), and that empty causal rows give out 0 and lse +Infinity. Each backward
// case runs, after an FA2 forward, the FA2 backward (algorithm 'auto': the two kernels on Hopper,
// above head dim 128 on the wide dK/dV kernel; the single kernel atomic and deterministic: wgmma up to
// head dim 128 on Hopper (the warp-specialized kernel from 33), mma.sync above; the float32 kernel in TF32 and 3xTF32) and the naive one on the same
// inputs and checks loosely that they agree. Each non-finite case (causal) puts a NaN and a +Infinity
// in v and a -Infinity in k at keys inside tiles that cross the diagonal, so that the kernels' rare
// paths run under the tools (csrc/cuda/flash/nonfinite_pv.cuh zeroing and adding back, the backward's
// selects on hidden pairs): the forward's out and lse rows that see none of those keys must stay
// finite, and every backward variant must run. Prints a line per case and
// "sanitize-cases: OK (<n> cases)" last; exits 1 on any failure.
'use strict';

const fa = require('../dist/lib');
const { debug } = require('../dist/lib/testing');

// [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim, causal, dtype]
const FULL = [
  [2, 1, 1, 2, 2, 64, false, 'float16'], // seqlen 1
  [1, 17, 17, 2, 2, 32, true, 'bfloat16'], // seqlen 17
  [1, 97, 97, 8, 1, 96, true, 'float16'], // seqlen 97, GQA 8:1
  [1, 1025, 1025, 2, 2, 128, true, 'bfloat16'], // seqlen 1025: one row / key past the last full tile
  [1, 1025, 1023, 8, 1, 64, true, 'float16'], // 2 empty rows, GQA 8:1
  [1, 113, 203, 2, 2, 192, false, 'float16'], // seqlenQ < seqlenK; Hopper: the warp-specialized d192 kernel
  [2, 203, 113, 2, 2, 256, true, 'bfloat16'], // seqlenQ > seqlenK causal: 90 empty rows
  [1, 1, 239, 8, 1, 64, true, 'bfloat16'], // one query row, GQA 8:1
  [1, 799, 3, 2, 2, 128, true, 'float16'], // 796 empty rows
  [1, 97, 17, 4, 4, 40, true, 'float16'], // padded head dim 40 (runs as 64)
  [1, 17, 97, 2, 2, 200, false, 'bfloat16'], // padded head dim 200 (runs as 256; Hopper: warp-specialized)
  [2, 1100, 1100, 8, 2, 128, false, 'bfloat16'], // Hopper: the warp-specialized kernel, 144 work items (> SMs)
  [1, 203, 113, 2, 2, 112, false, 'float16'], // padded head dim 112: the warp-specialized kernel on Hopper
  [2, 1100, 1100, 8, 2, 80, false, 'bfloat16'], // padded head dim 80: the warp-specialized d96 kernel, 144 items
  [1, 4100, 4097, 2, 1, 128, true, 'bfloat16'], // causal from 4k: the warp-specialized kernel on Hopper
  [3, 1100, 1100, 8, 2, 64, false, 'float16'], // Hopper: the warp-specialized d64 kernel (three consumers), 144 items
  [1, 8200, 8193, 1, 1, 64, true, 'bfloat16'], // causal d64 from 8k: the warp-specialized kernel on Hopper
  [1, 8200, 8193, 1, 1, 80, true, 'float16'], // causal padded head dim 80 from 8k: the warp-specialized d96 kernel
  [1, 4100, 4097, 1, 1, 160, true, 'bfloat16'], // causal padded head dim 160 from 4k: the warp-specialized d192 kernel
  [1, 2100, 2049, 2, 1, 256, true, 'float16'], // causal d256 from 2k: the warp-specialized kernel on Hopper
];

const RACE = [
  [1, 97, 97, 2, 2, 32, true, 'float16'],
  [1, 113, 203, 8, 1, 64, false, 'bfloat16'],
  [1, 17, 129, 2, 2, 96, true, 'float16'],
  [1, 203, 113, 2, 2, 128, true, 'bfloat16'],
  [1, 65, 130, 1, 1, 192, false, 'float16'],
  [1, 130, 65, 1, 1, 256, true, 'bfloat16'],
  [1, 97, 17, 2, 2, 40, true, 'float16'],
  [1, 203, 300, 2, 2, 128, false, 'float16'], // the warp-specialized kernel on Hopper
  [1, 300, 203, 2, 2, 64, false, 'bfloat16'], // the warp-specialized d64 kernel (three consumers) on Hopper
];

// Backward cases: the FA2 backward (atomic and deterministic) against the naive one.
const BACKWARD = {
  full: [
    [1, 97, 113, 4, 2, 64, true, 'bfloat16'], // GQA 2:1, tails
    [1, 203, 113, 2, 2, 128, true, 'float16'], // 90 empty rows
    [1, 130, 65, 2, 2, 96, false, 'bfloat16'], // Hopper: two kernels and the warp-specialized kernel on d128 (padded)
    [1, 113, 97, 2, 1, 72, true, 'float16'], // padded head dim 72: on Hopper the two kernels on d128
    [1, 17, 97, 2, 1, 256, true, 'float16'], // Hopper: wide dK/dV kernel; single kernel mma.sync, head dim split
    [1, 130, 97, 2, 2, 160, false, 'bfloat16'], // padded head dim 160: on Hopper the wide d192 kernels
    [1, 1025, 1023, 2, 1, 40, false, 'bfloat16'], // padded head dim, 8 key tiles (deterministic: slices)
    [1, 1100, 1030, 4, 2, 120, false, 'float16'], // Hopper: 'auto' and 'single-kernel' the warp-specialized kernel
    [1, 1030, 1100, 2, 1, 64, false, 'float16'], // Hopper: 'auto' and 'single-kernel' the warp-specialized d64 kernel
    [1, 1030, 1100, 2, 1, 128, true, 'bfloat16'], // Hopper: 'auto' and 'single-kernel' the warp-specialized causal kernel
    [1, 203, 113, 4, 2, 64, true, 'float32'], // float32 kernel (TF32 and 3xTF32), 90 empty rows, GQA 2:1
    [1, 97, 130, 2, 2, 200, false, 'float32'], // float32, padded head dim 200 (runs as 256)
  ],
  race: [
    [1, 33, 47, 2, 1, 64, true, 'bfloat16'],
    [1, 130, 65, 1, 1, 96, true, 'float16'],
    [1, 65, 200, 1, 1, 128, false, 'bfloat16'], // Hopper: 'single-kernel' the warp-specialized kernel
    [1, 200, 130, 2, 1, 128, true, 'float16'], // Hopper: 'single-kernel' the warp-specialized causal kernel (empty rows)
    [1, 97, 70, 2, 1, 96, true, 'float32'],
    [1, 70, 130, 1, 1, 192, true, 'float16'], // Hopper: the wide dK/dV kernel
  ],
};

// Non-finite cases: poisoned keys near the middle of seqlenK (see the file comment).
const NONFINITE = {
  full: [
    [1, 203, 113, 2, 2, 64, true, 'bfloat16'], // 90 empty rows
    [1, 130, 130, 4, 1, 128, true, 'float16'], // GQA 4:1
    [1, 97, 161, 2, 2, 96, true, 'bfloat16'], // head dim 96: Hopper's d128 kernels (padded)
    [1, 130, 97, 2, 2, 64, true, 'float32'], // float32 kernels
    [1, 130, 113, 2, 1, 256, true, 'bfloat16'], // Hopper: the wide dK/dV kernel's rare paths
  ],
  race: [
    [1, 130, 65, 1, 1, 64, true, 'bfloat16'],
    [1, 97, 70, 1, 1, 64, true, 'float32'],
  ],
};

// Loose agreement of the two forwards for inputs in [-1, 1) (|out| <= 1): two bfloat16 ulps at 1 for
// out; for lse (float32, |lse| ~ 1-10) far above any rounding. Wrong rows or tiles miss by O(0.1).
const OUT_TOL = 2 ** -6;
const LSE_TOL = 1e-3;
// Loose agreement of the gradients, relative to max(1, max |naive gradient|).
const GRAD_TOL = 2 ** -5;

function parseArgs(argv) {
  const opts = { set: 'full', poison: true, list: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--set' && (argv[i + 1] === 'full' || argv[i + 1] === 'race')) opts.set = argv[++i];
    else if (a === '--no-poison') opts.poison = false;
    else if (a === '--list') opts.list = true;
    else throw new Error(`unknown argument ${JSON.stringify(a)}; usage: node scripts/sanitize-cases.js [--set full|race] [--no-poison] [--list]`);
  }
  return opts;
}

/** xorshift32 stream of floats in [-1, 1), seeded per case so every run sees the same inputs. */
function uniform(seed) {
  let s = (seed >>> 0) || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return (s / 4294967296) * 2 - 1;
  };
}

const label = ([B, Sq, Sk, Hq, Hkv, D, causal, dtype]) =>
  `B${B} ${Sq}x${Sk} Hq${Hq} Hkv${Hkv} d${D}${causal ? ' causal' : ''} ${dtype}`;

function makeInputs(c, seed, withDout, poison = undefined) {
  const [B, Sq, Sk, Hq, Hkv, D, , dtype] = c;
  const next = uniform(seed);
  const mk = (shape, name) => {
    const data = new Float32Array(shape.reduce((a, b) => a * b, 1));
    for (let i = 0; i < data.length; i++) data[i] = next();
    if (poison) poison(name, data);
    return fa.Tensor.fromFloat32Array(data, shape, { dtype, device: 'cuda' });
  };
  const t = { q: mk([B, Sq, Hq, D], 'q'), k: mk([B, Sk, Hkv, D], 'k'), v: mk([B, Sk, Hkv, D], 'v') };
  if (withDout) t.dout = mk([B, Sq, Hq, D], 'dout');
  return t;
}

/** The FA2 forward against the naive one on the same tensors; throws on disagreement. */
async function forwardCase(c, seed) {
  const [B, Sq, Sk, Hq, , D, causal] = c;
  const owned = [];
  try {
    const { q, k, v } = makeInputs(c, seed, false);
    owned.push(q, k, v);
    const flash = fa.flashAttention(q, k, v, { causal, kernel: 'flash' });
    owned.push(flash.out, flash.lse);
    if (flash.kernel !== 'flash') throw new Error(`kernel 'flash' ran ${flash.kernel}`);
    const naive = fa.flashAttention(q, k, v, { causal, kernel: 'naive' });
    owned.push(naive.out, naive.lse);
    const [fo, fl, no, nl] = await Promise.all([flash.out, flash.lse, naive.out, naive.lse].map((t) => t.toFloat32Array()));
    let outErr = 0;
    for (let i = 0; i < fo.length; i++) {
      const e = Math.abs(fo[i] - no[i]);
      if (!(e <= OUT_TOL)) throw new Error(`out[${i}] = ${fo[i]}, naive ${no[i]}`);
      outErr = Math.max(outErr, e);
    }
    let lseErr = 0;
    for (let i = 0; i < fl.length; i++) {
      if (fl[i] === nl[i]) continue; // +Infinity on both for an empty row
      const e = Math.abs(fl[i] - nl[i]);
      if (!(e <= LSE_TOL * Math.max(1, Math.abs(nl[i])))) throw new Error(`lse[${i}] = ${fl[i]}, naive ${nl[i]}`);
      lseErr = Math.max(lseErr, e);
    }
    const empty = causal ? Math.max(0, Sq - Sk) : 0;
    for (let b = 0; b < B; b++) {
      for (let h = 0; h < Hq; h++) {
        for (let i = 0; i < empty; i++) {
          if (fl[(b * Hq + h) * Sq + i] !== Infinity) throw new Error(`empty row ${i} (b ${b}, h ${h}): lse ${fl[(b * Hq + h) * Sq + i]}`);
          const base = ((b * Sq + i) * Hq + h) * D;
          for (let e = 0; e < D; e++) {
            if (fo[base + e] !== 0) throw new Error(`empty row ${i} (b ${b}, h ${h}): out[${e}] = ${fo[base + e]}`);
          }
        }
      }
    }
    return `max |flash - naive|: out ${outErr.toExponential(2)}, lse ${lseErr.toExponential(2)}`;
  } finally {
    for (const t of owned) t.dispose();
  }
}

/**
 * An FA2 forward, then the FA2 backward in each of its variants (algorithm 'auto', the single kernel
 * atomic and deterministic, float32 also 3xTF32) and the naive one on the same tensors; every
 * gradient finite and the FA2 ones within GRAD_TOL of the naive ones.
 */
async function backwardCase(c, seed) {
  const [, , , , , , causal] = c;
  const owned = [];
  try {
    const { q, k, v, dout } = makeInputs(c, seed, true);
    owned.push(q, k, v, dout);
    const f = fa.flashAttention(q, k, v, { causal });
    owned.push(f.out, f.lse);
    // [label, options]: 'auto' (two kernels where they exist), the single kernel atomic and
    // deterministic, float32 also in 3xTF32; the naive backward last, the baseline.
    const variants = [
      ['auto', {}],
      ['single-kernel', { algorithm: 'single-kernel' }],
      ['single-kernel deterministic', { algorithm: 'single-kernel', deterministic: true }],
      ...(c[7] === 'float32' ? [['highest', { float32Precision: 'highest' }]] : []),
    ];
    const runs = variants.map(([, o]) => fa.flashAttentionBackward(dout, q, k, v, f.out, f.lse, { causal, kernel: 'flash', ...o }));
    runs.push(fa.flashAttentionBackward(dout, q, k, v, f.out, f.lse, { causal, kernel: 'naive' }));
    for (const g of runs) owned.push(g.dq, g.dk, g.dv);
    const ran = runs.map((g) => `${g.kernel} ${g.algorithm}`);
    if (runs.some((g, i) => g.kernel !== (i < variants.length ? 'flash' : 'naive'))) throw new Error(`kernels ran: ${ran.join(', ')}`);
    let worst = 0;
    for (const name of ['dq', 'dk', 'dv']) {
      const xs = await Promise.all(runs.map((g) => g[name].toFloat32Array()));
      const n = xs[xs.length - 1];
      const scale = n.reduce((m, x) => Math.max(m, Math.abs(x)), 1);  // no spread: arrays past 100k elements
      for (const [j, [which]] of variants.entries()) {
        const x = xs[j];
        for (let i = 0; i < x.length; i++) {
          const e = Math.abs(x[i] - n[i]) / scale;
          if (!(e <= GRAD_TOL)) throw new Error(`${name}[${i}] (${which}) = ${x[i]}, naive ${n[i]}`);
          worst = Math.max(worst, e);
        }
      }
    }
    return `forward ${f.kernel}, backward ${ran.join(', ')}: max |flash - naive| / max(1, max |naive|) ${worst.toExponential(2)}`;
  } finally {
    for (const t of owned) t.dispose();
  }
}

/**
 * Causal, batch 0, kv head 0: NaN in v[j0][3], +Infinity in v[j0 + 1][5], -Infinity in k[j0 + 2][1],
 * j0 = floor(seqlenK / 2). The FA2 forward's out and lse rows that see none of these keys must be
 * finite (or out 0 / lse +Infinity for the rows that see no key); then every backward variant runs
 * (their values are not checked here: test/numerics.test.ts does that).
 */
async function nonfiniteCase(c, seed) {
  const [, Sq, Sk, Hq, Hkv, D, causal, dtype] = c;
  const j0 = Math.floor(Sk / 2);
  const owned = [];
  const poison = (name, data) => {
    const at = (j, col) => (j * Hkv + 0) * D + col; // batch 0, kv head 0
    if (name === 'v') {
      data[at(j0, 3)] = NaN;
      data[at(j0 + 1, 5)] = Infinity;
    } else if (name === 'k') {
      data[at(j0 + 2, 1)] = -Infinity;
    }
  };
  try {
    const { q, k, v, dout } = makeInputs(c, seed, true, poison);
    owned.push(q, k, v, dout);
    const f = fa.flashAttention(q, k, v, { causal, kernel: 'flash' });
    owned.push(f.out, f.lse);
    const [o, l] = await Promise.all([f.out.toFloat32Array(), f.lse.toFloat32Array()]);
    let contained = 0;
    for (let h = 0; h < Hq; h++) {
      for (let i = 0; i < Sq; i++) {
        const seen = i + Sk - Sq; // the last key row i sees
        if (seen >= j0 || Math.floor(h / (Hq / Hkv)) !== 0) continue; // sees a poisoned key, or another kv head
        const lse = l[h * Sq + i];
        if (!(Number.isFinite(lse) || (seen < 0 && lse === Infinity))) throw new Error(`lse row ${i} head ${h} = ${lse}`);
        for (let e = 0; e < D; e++) {
          const x = o[(i * Hq + h) * D + e];
          if (!Number.isFinite(x)) throw new Error(`out row ${i} head ${h} col ${e} = ${x}: a poisoned key reached a row that does not see it`);
        }
        contained++;
      }
    }
    const variants = [{}, { algorithm: 'single-kernel' }, { algorithm: 'single-kernel', deterministic: true }];
    if (dtype === 'float32') variants.push({ float32Precision: 'highest' });
    const runs = variants.map((o2) => fa.flashAttentionBackward(dout, q, k, v, f.out, f.lse, { causal, kernel: 'flash', ...o2 }));
    for (const g of runs) owned.push(g.dq, g.dk, g.dv);
    await Promise.all(runs.map((g) => g.dq.toFloat32Array()));
    return `${contained} rows that see no poisoned key stayed finite; backward ${runs.map((g) => g.algorithm).join(', ')} ran`;
  } finally {
    for (const t of owned) t.dispose();
  }
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const cases = opts.set === 'race' ? RACE : FULL;
  const backward = BACKWARD[opts.set];
  if (opts.list) {
    for (const c of cases) console.log(`forward  ${label(c)}`);
    for (const c of backward) console.log(`backward ${label(c)}`);
    for (const c of NONFINITE[opts.set]) console.log(`nonfinite ${label(c)}`);
    return;
  }
  const cuda = fa.backends().cuda;
  if (!cuda.available) throw new Error(`CUDA is not usable: ${cuda.reason}`);
  console.log(`sanitize-cases: set ${opts.set}, poison ${opts.poison ? 'on' : 'off'}, ${cuda.device.name} (sm_${cuda.device.computeCapability.replace('.', '')})`);
  debug.poisonOutputs(opts.poison);
  let n = 0;
  for (const [i, c] of cases.entries()) {
    const t0 = Date.now();
    const what = await forwardCase(c, 0x9e3779b9 ^ (i + 1));
    console.log(`ok forward  ${label(c)}: ${what} (${Date.now() - t0} ms)`);
    n++;
  }
  for (const [i, c] of backward.entries()) {
    const t0 = Date.now();
    console.log(`ok backward ${label(c)}: ${await backwardCase(c, 0x85ebca6b ^ (i + 1))} (${Date.now() - t0} ms)`);
    n++;
  }
  for (const [i, c] of NONFINITE[opts.set].entries()) {
    const t0 = Date.now();
    console.log(`ok nonfinite ${label(c)}: ${await nonfiniteCase(c, 0xc2b2ae35 ^ (i + 1))} (${Date.now() - t0} ms)`);
    n++;
  }
  await fa.synchronize('cuda');
  const live = fa.memory().cuda;
  if (live.tensors !== 0) throw new Error(`${live.tensors} CUDA tensors (${live.bytes} bytes) still live`);
  await fa.emptyCache('cuda'); // return the pool's cached blocks, so a leak check sees only real leaks
  console.log(`sanitize-cases: OK (${n} cases)`);
}

main().catch((e) => {
  console.error(`sanitize-cases: FAIL ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
