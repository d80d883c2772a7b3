// Device out-of-memory for real, on the GPU machine (issue 6): fills the GPU with live tensors until
// an allocation fails, then checks that
//   1. the failing allocation is a JS Error that says how much was asked for and how much is free;
//   2. an attention call on the full device fails the same way (its outputs cannot be allocated),
//      with nothing leaked;
//   3. after one block is freed the same call works, and after everything is freed memory() and the
//      device's free memory are back where they started and a call is correct.
// Not in Jest: a full device would starve the other test files that share it (test/faults.test.ts
// covers the single huge allocation and the sticky error there). Needs the built package (dist/)
// and a GPU. Usage, from the project root:
//     node scripts/gpu-faults.js [--block-gib N]      (default 4)
// Prints one line per step and "gpu-faults: OK" last; exits 1 on any failure.
'use strict';

const fa = require('../dist/lib');

const GiB = 2 ** 30;

function parseArgs(argv) {
  const opts = { blockGiB: 4 };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--block-gib' && Number(argv[i + 1]) > 0) opts.blockGiB = Number(argv[++i]);
    else throw new Error(`unknown argument ${JSON.stringify(argv[i])}; usage: node scripts/gpu-faults.js [--block-gib N]`);
  }
  return opts;
}

function check(ok, what) {
  if (!ok) throw new Error(what);
}

/** A small causal attention call on CUDA; returns max |out - float64 reference|. */
async function smallCall() {
  const data = Float32Array.from({ length: 17 * 2 * 16 }, (_, i) => Math.sin(i));
  const q = fa.Tensor.fromFloat32Array(data, [1, 17, 2, 16], { device: 'cuda', dtype: 'float32' });
  try {
    const r = fa.flashAttention(q, q, q, { causal: true });
    const out = await r.out.toFloat32Array();
    r.out.dispose();
    r.lse.dispose();
    const ref = fa.referenceAttention(data, data, data, { batch: 1, seqlenQ: 17, seqlenK: 17, headsQ: 2, headsKV: 2, headDim: 16 }, { causal: true });
    let err = 0;
    for (let i = 0; i < out.length; i++) err = Math.max(err, Math.abs(out[i] - ref.out[i]));
    return err;
  } finally {
    q.dispose();
  }
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const cuda = fa.backends().cuda;
  if (!cuda.available) throw new Error(`CUDA is not usable: ${cuda.reason}`);
  await fa.emptyCache('cuda');
  const free0 = fa.backends().cuda.device.freeMemoryBytes;
  const live0 = fa.memory().cuda;
  console.log(`gpu-faults: ${cuda.device.name}, ${(free0 / GiB).toFixed(1)} GiB free, blocks of ${opts.blockGiB} GiB`);

  // 1. Fill the device.
  const blocks = [];
  const blockElems = Math.floor((opts.blockGiB * GiB) / 2);
  let failure = null;
  const t0 = Date.now();
  while (!failure) {
    try {
      blocks.push(fa.Tensor.zeros([blockElems], { device: 'cuda', dtype: 'bfloat16' }));
    } catch (e) {
      failure = e;
    }
  }
  await fa.synchronize('cuda');
  const held = blocks.length * opts.blockGiB;
  console.log(`1. ${blocks.length} blocks (${held} GiB) allocated in ${Date.now() - t0} ms, then: ${failure.message}`);
  check(failure instanceof Error || failure.name === 'Error', 'the failure is not an Error');
  check(/^CUDA out of memory: tried to allocate \d+\.\d GiB \(\d+ bytes\) on .+ with .+ free of .+ in use by this process's pool\)$/.test(failure.message),
    `unexpected message: ${failure.message}`);

  // 2. An attention call on the full device fails the same way and leaks nothing.
  const shape = [4, 4096, 16, 128];
  let attnError = null;
  // Its inputs need memory too: free one block for them, then fill the rest again with small blocks.
  blocks.pop().dispose();
  await fa.synchronize('cuda');
  const x = fa.Tensor.zeros(shape, { device: 'cuda', dtype: 'bfloat16' });
  // Blocks of 128 MiB, then 1 MiB, then 64 KiB: the pool hands out the freed 4 GiB block's memory
  // too, so a fill with one size alone leaves a gap as large as that size (which held the call's
  // 65 MiB of outputs on the first H100 run).
  const small = [];
  for (const elems of [64 * 2 ** 20, 2 ** 19, 2 ** 15]) {
    for (;;) {
      try {
        small.push(fa.Tensor.zeros([elems], { device: 'cuda', dtype: 'bfloat16' }));
      } catch (e) {
        break;
      }
    }
  }
  const live2 = fa.memory().cuda;
  try {
    const r = fa.flashAttention(x, x, x, { causal: true });
    r.out.dispose();
    r.lse.dispose();
  } catch (e) {
    attnError = e;
  }
  await fa.synchronize('cuda');
  console.log(`2. attention [${shape}] bf16 on the full device: ${attnError ? attnError.message : 'ran'}`);
  check(attnError !== null && /out of memory/.test(attnError.message), 'the attention call on a full device did not fail with out of memory');
  check(fa.memory().cuda.tensors === live2.tensors && fa.memory().cuda.bytes === live2.bytes, 'the failed call left tensors behind');

  // 3. Free some memory: the same call works; free everything: back to the start.
  for (const t of small) t.dispose();
  await fa.synchronize('cuda');
  const r = fa.flashAttention(x, x, x, { causal: true });
  await r.out.toFloat32Array();
  r.out.dispose();
  r.lse.dispose();
  console.log('3. after freeing the small blocks the same call ran');
  x.dispose();
  for (const t of blocks) t.dispose();
  await fa.emptyCache('cuda');
  const live3 = fa.memory().cuda;
  const free3 = fa.backends().cuda.device.freeMemoryBytes;
  const err = await smallCall();
  console.log(`   everything freed: ${live3.tensors} tensors, ${live3.bytes} bytes live (start: ${live0.tensors}, ${live0.bytes}); `
    + `${(free3 / GiB).toFixed(1)} GiB free (start ${(free0 / GiB).toFixed(1)}); small call max error ${err.toExponential(2)}`);
  check(live3.tensors === live0.tensors && live3.bytes === live0.bytes, 'memory() did not come back to the start');
  check(free3 >= free0 - GiB, 'the device free memory did not come back (within 1 GiB)');
  check(err < 1e-3, 'the small call after the faults is wrong');
  console.log('gpu-faults: OK');
}

main().catch((e) => {
  console.error(`gpu-faults: FAIL ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
