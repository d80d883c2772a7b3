// Long-run soak (issue 6): a training-like loop for a few minutes on the GPU (or the CPU), with
// constant memory. Each step draws one of a few shapes (bf16 / fp16, head dims 64 and 128, causal or
// not, GQA), runs flashAttentionWithGrad + ctx.backward with fresh random inputs, reads a small part
// of the results, and disposes everything; one step in 16 also runs a fixed problem with
// `deterministic: true` and compares its gradients' bits with the first run's.
// Every 10 s it prints a line: steps, steps/s, TFLOP/s (FA2's count), live tensors and bytes,
// the pool's used bytes and the device's free memory. At the end it checks that memory() is where
// it started, that the device's free memory came back (within 256 MiB, after emptyCache), and that
// the fixed problem never changed. Not in CI. Needs the built package (dist/). Usage:
//     node scripts/soak.js [--seconds N] [--device cuda|cpu]      (default 180 s, cuda when usable)
// Exit status: 0 with "soak: OK" last, 1 on any failure.
'use strict';

const fa = require('../dist/lib');

const MiB = 2 ** 20;
const GiB = 2 ** 30;

function parseArgs(argv) {
  const opts = { seconds: 180, device: fa.backends().cuda.available ? 'cuda' : 'cpu' };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--seconds' && Number(argv[i + 1]) > 0) opts.seconds = Number(argv[++i]);
    else if (argv[i] === '--device' && ['cuda', 'cpu'].includes(argv[i + 1])) opts.device = argv[++i];
    else throw new Error(`unknown argument ${JSON.stringify(argv[i])}; usage: node scripts/soak.js [--seconds N] [--device cuda|cpu]`);
  }
  return opts;
}

// [batch, seqlen, headsQ, headsKV, headDim, causal, dtype]: a training mix (CUDA); a small one on the CPU.
const CUDA_SHAPES = [
  [4, 2048, 16, 16, 64, true, 'bfloat16'],
  [2, 4096, 16, 4, 128, true, 'bfloat16'],
  [8, 1024, 32, 8, 64, false, 'float16'],
  [1, 8192, 8, 8, 128, true, 'float16'],
  [16, 512, 16, 16, 64, false, 'bfloat16'],
];
const CPU_SHAPES = [
  [1, 256, 4, 4, 64, true, 'float32'],
  [2, 128, 4, 2, 32, false, 'bfloat16'],
];
const FIXED = [1, 300, 4, 2, 64, true, 'bfloat16'];

/** Deterministic pseudo-random floats in [-1, 1) (xorshift), `n` of them. */
function randomData(n, seed) {
  let x = (seed * 2654435761) >>> 0 || 1;
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    a[i] = ((x >>> 0) / 2 ** 32) * 2 - 1;
  }
  return a;
}

function flops([b, s, hq, , d, causal]) {
  return 3.5 * 4 * b * hq * s * s * d * (causal ? 0.5 : 1);  // forward + backward, FA2's count
}

/** One training step of shape `c`; returns the gradients' bits when `keepBits`. */
async function step(c, device, seed, options, keepBits) {
  const [b, s, hq, hkv, d, causal, dtype] = c;
  const o = { device, dtype };
  const made = [];
  try {
    const q = fa.Tensor.fromFloat32Array(randomData(b * s * hq * d, seed), [b, s, hq, d], o);
    made.push(q);
    const k = fa.Tensor.fromFloat32Array(randomData(b * s * hkv * d, seed + 1), [b, s, hkv, d], o);
    made.push(k);
    const v = fa.Tensor.fromFloat32Array(randomData(b * s * hkv * d, seed + 2), [b, s, hkv, d], o);
    made.push(v);
    const dout = fa.Tensor.fromFloat32Array(randomData(b * s * hq * d, seed + 3), [b, s, hq, d], o);
    made.push(dout);
    const ctx = fa.flashAttentionWithGrad(q, k, v, { causal, ...options });
    made.push(ctx.out, ctx.lse);
    const g = ctx.backward(dout);
    made.push(g.dq, g.dk, g.dv);
    if (keepBits) return Promise.all([g.dq, g.dk, g.dv].map((t) => t.toBits()));
    const dq = await g.dq.toFloat32Array();
    if (!Number.isFinite(dq[0])) throw new Error(`non-finite dq for shape [${c}]`);
    return null;
  } finally {
    for (const t of made) t.dispose();
  }
}

/** "312.4 TFLOP/s" or "18.2 GFLOP/s". */
function rate(flopsPerSecond) {
  return flopsPerSecond >= 1e12 ? `${(flopsPerSecond / 1e12).toFixed(1)} TFLOP/s` : `${(flopsPerSecond / 1e9).toFixed(1)} GFLOP/s`;
}

function sameBits(a, b) {
  return a.every((x, i) => x.length === b[i].length && x.every((v, j) => v === b[i][j]));
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const { device } = opts;
  const shapes = device === 'cuda' ? CUDA_SHAPES : CPU_SHAPES;
  const cudaInfo = () => (device === 'cuda' ? fa.backends().cuda.device : null);
  if (device === 'cuda') await fa.emptyCache('cuda');
  const start = fa.memory()[device];
  const free0 = device === 'cuda' ? cudaInfo().freeMemoryBytes : 0;
  console.log(`soak: ${opts.seconds} s on ${device}${device === 'cuda' ? ` (${cudaInfo().name}, ${(free0 / GiB).toFixed(1)} GiB free)` : ''}, `
    + `${shapes.length} shapes, node ${process.version}, ${new Date().toISOString()}`);

  const fixed0 = await step(FIXED, device, 7, { deterministic: true }, true);
  const t0 = Date.now();
  let steps = 0;
  let work = 0;
  let lastReport = t0;
  let maxBytes = 0;
  let maxTensors = 0;
  let changed = 0;
  while (Date.now() - t0 < opts.seconds * 1000) {
    const c = shapes[steps % shapes.length];
    await step(c, device, 1000 + steps * 4, {}, false);
    work += flops(c);
    steps++;
    if (steps % 16 === 0) {
      const bits = await step(FIXED, device, 7, { deterministic: true }, true);
      if (!sameBits(bits, fixed0)) changed++;
    }
    const m = fa.memory()[device];
    maxBytes = Math.max(maxBytes, m.bytes);
    maxTensors = Math.max(maxTensors, m.tensors);
    const now = Date.now();
    if (now - lastReport >= 10000) {
      lastReport = now;
      const s = (now - t0) / 1000;
      const dev = device === 'cuda'
        ? `, pool ${((m.poolUsedBytes ?? 0) / MiB).toFixed(1)} MiB, device free ${(cudaInfo().freeMemoryBytes / GiB).toFixed(2)} GiB` : '';
      console.log(`  ${s.toFixed(0)} s: ${steps} steps (${(steps / s).toFixed(1)}/s, ${rate(work / s)}), `
        + `${m.tensors} tensors / ${m.bytes} bytes live${dev}`);
    }
  }
  await fa.synchronize(device);
  const elapsed = (Date.now() - t0) / 1000;
  const end = fa.memory()[device];
  let free1 = 0;
  if (device === 'cuda') {
    await fa.emptyCache('cuda');
    free1 = cudaInfo().freeMemoryBytes;
  }
  console.log(`soak: ${steps} steps in ${elapsed.toFixed(0)} s (${(steps / elapsed).toFixed(1)} steps/s, `
    + `${rate(work / elapsed)} fwd+bwd); peak live between steps ${maxTensors} tensors / ${(maxBytes / MiB).toFixed(1)} MiB; `
    + `end ${end.tensors} tensors / ${end.bytes} bytes (start ${start.tensors} / ${start.bytes}); finalized without dispose ${fa.memory().finalizedWithoutDispose}`
    + (device === 'cuda' ? `; device free ${(free1 / GiB).toFixed(2)} GiB (start ${(free0 / GiB).toFixed(2)})` : '')
    + `; fixed deterministic problem changed ${changed} times`);
  const failures = [];
  if (end.tensors !== start.tensors || end.bytes !== start.bytes) failures.push('memory() did not return to the start');
  if (maxTensors > start.tensors) failures.push(`tensors were live between steps (${maxTensors})`);
  if (device === 'cuda' && free1 < free0 - 256 * MiB) failures.push('the device free memory dropped by more than 256 MiB');
  if (changed > 0) failures.push('the deterministic problem changed');
  if (failures.length > 0) throw new Error(failures.join('; '));
  console.log('soak: OK');
}

main().catch((e) => {
  console.error(`soak: FAIL ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
