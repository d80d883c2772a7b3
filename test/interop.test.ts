/**
 * Zero-copy interop (lib/interop.ts) against a stand-in for another native addon
 * (test/fixtures/interop/owner_addon.c, built here with the system C compiler): memory it owns is
 * read and written in place through an imported Tensor, and our memory is read and written in place
 * by it through an exported pointer. The ownership and ordering rules of lib/interop.ts are what the
 * steps follow (synchronize before the other side reads, dispose + synchronize before freeing).
 */

import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

import { exportTensor, importTensor } from '../lib/interop';
import { binding, DEVICE_CODE, DTYPE_CODE } from '../lib/native';
import { Device, synchronize, Tensor } from '../lib/tensor';
import { describeEachDevice, HAS_CUDA, liveMemory, synchronizeAll, trackMemory } from './helpers/backend';

trackMemory();

interface Owner {
  alloc(n: number, cuda: boolean): bigint;
  read(ptr: bigint, n: number, cuda: boolean): Float32Array;
  fill(ptr: bigint, n: number, value: number, cuda: boolean): void;
  stream(): bigint;
  release(ptr: bigint, cuda: boolean): void;
}

const CC = ['cc', 'gcc', 'clang'].find((c) => {
  try {
    execFileSync(c, ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
});
const NODE_INCLUDE = path.join(path.dirname(path.dirname(process.execPath)), 'include', 'node');
// node-api-headers (cmake-js's dependency) carries node_api.h where Node's own headers are absent
// (a GPU machine with a bundled node binary).
const API_HEADERS = ((): string | undefined => {
  try {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    return (require('node-api-headers') as { include_dir: string }).include_dir;
  } catch {
    return undefined;
  }
})();
const HEADERS = ['/usr/include/node', NODE_INCLUDE, API_HEADERS].find((d) => d && fs.existsSync(path.join(d, 'node_api.h')));
const SKIP = !CC ? 'no C compiler (cc, gcc, clang) to build the owner addon'
  : !HEADERS ? "Node's headers (node_api.h) are not installed" : '';

let owner: Owner;
beforeAll(() => {
  if (SKIP) return;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-interop-'));
  const out = path.join(dir, 'owner.node');
  const src = path.join(__dirname, 'fixtures/interop/owner_addon.c');
  const cudaHome = process.env.CUDA_HOME ?? '/usr/local/cuda';
  const cuda = HAS_CUDA ? ['-DOWNER_WITH_CUDA', `-I${cudaHome}/include`, `-L${cudaHome}/lib64`, '-lcudart'] : [];
  execFileSync(CC!, ['-shared', '-fPIC', `-I${HEADERS}`, '-o', out, src, ...cuda]);
  const mod = { exports: {} as Owner };
  process.dlopen(mod, out);
  owner = mod.exports;
});

describeEachDevice('interop', (device: Device) => {
  const cuda = device === 'cuda';
  const t = SKIP ? test.skip : test;

  t(`import: a tensor over the owner's memory reads and writes it in place${SKIP ? ` (skipped: ${SKIP})` : ''}`, async () => {
    const n = 24;
    const ptr = owner.alloc(n, cuda);
    const stream = cuda ? owner.stream() : 0n;
    // The owner queues a write on its stream; importing with that stream orders our reads after it.
    owner.fill(ptr, n, 1.25, cuda);
    const before = liveMemory();
    const x = importTensor(ptr, [4, 6], { dtype: 'float32', device, stream });
    expect(liveMemory()).toEqual(before); // not our allocation: not counted
    expect(Array.from(await x.toFloat32Array())).toEqual(new Array(n).fill(1.25));
    // Writes through a view land in the owner's memory, once our queued work is done.
    const col = x.select(1, 2);
    col.fill(-3);
    await synchronize(device);
    const seen = owner.read(ptr, n, cuda);
    expect(Array.from(seen)).toEqual(Array.from({ length: n }, (_, i) => (i % 6 === 2 ? -3 : 1.25)));
    // A strided import: every other element.
    const every2 = importTensor(ptr, [12], { dtype: 'float32', device, strides: [2] });
    expect(Array.from(await every2.toFloat32Array())).toEqual(Array.from({ length: 12 }, (_, i) => ((2 * i) % 6 === 2 ? -3 : 1.25)));
    for (const v of [x, col, every2]) v.dispose();
    await synchronize(device);
    owner.release(ptr, cuda);
  });

  t(`export: the owner reads and writes our memory in place${SKIP ? ` (skipped: ${SKIP})` : ''}`, async () => {
    const data = Float32Array.from({ length: 30 }, (_, i) => i - 7.5);
    const base = Tensor.fromFloat32Array(data, [5, 6], { device });
    const rows = base.narrow(0, 2, 3); // contiguous view at element offset 12
    const e = exportTensor(rows);
    expect([e.shape, e.strides, e.dtype, e.device]).toEqual([[3, 6], [6, 1], 'float32', device]);
    expect(e.stream === 0n).toBe(!cuda);
    await synchronize(device);
    expect(Array.from(owner.read(e.ptr, 18, cuda))).toEqual(Array.from(data.subarray(12)));
    owner.fill(e.ptr, 6, 9, cuda);
    if (cuda) {
      // The owner's write is ordered on its stream: import that stream's order before reading.
      importTensor(e.ptr, [1], { dtype: 'float32', device, stream: owner.stream() }).dispose();
    }
    expect(Array.from(await base.toFloat32Array({ offset: 10, length: 10 }))).toEqual([2.5, 3.5, 9, 9, 9, 9, 9, 9, 10.5, 11.5]);
    // The export keeps the storage alive after every tensor is disposed, until release().
    const live = liveMemory()[device].tensors;
    base.dispose();
    rows.dispose();
    await synchronizeAll();
    expect(liveMemory()[device].tensors).toBe(live);
    expect(owner.read(e.ptr, 1, cuda)[0]).toBe(9);
    e.release();
    e.release();
    await synchronizeAll();
    expect(liveMemory()[device].tensors).toBe(live - 1);
  });

  test('bad imports are refused with exact messages and allocate nothing', () => {
    const b = binding();
    const before = liveMemory();
    expect(() => importTensor(4096 as unknown as bigint, [4], { dtype: 'float32', device }))
      .toThrow('Expected ptr to be a bigint but received 4096 of type number');
    expect(() => importTensor(4096n, [4], { dtype: 'float32', device, strides: [0] }))
      .toThrow('Expected options.strides to address distinct elements (each stride larger than the span of the dims with smaller strides) but received [0]');
    expect(() => importTensor(4096n, [4], { dtype: 'float32', device, pinned: true } as never))
      .toThrow("Expected options to have only the keys 'dtype', 'device', 'strides' and 'stream' but received unknown key 'pinned'");
    expect(() => b.importPointer(DEVICE_CODE[device], DTYPE_CODE.float32, 0n, 4, 0n))
      .toThrow('Expected ptr to be a non-null address aligned to 4 bytes (the size of a float32 element) but received 0');
    expect(() => b.importPointer(DEVICE_CODE[device], DTYPE_CODE.float16, 4097n, 4, 0n))
      .toThrow('Expected ptr to be a non-null address aligned to 2 bytes (the size of a float16 element) but received 4097');
    expect(() => b.importPointer(DEVICE_CODE[device], DTYPE_CODE.float32, -8n, 4, 0n))
      .toThrow('Expected ptr to be a bigint in [0, 2^64) but received -8');
    expect(() => b.importPointer(DEVICE_CODE[device], DTYPE_CODE.float32, 4096n, 0, 0n))
      .toThrow('Expected numel to be an integer in [1, 9007199254740991] but received 0 of type number');
    if (device === 'cpu') {
      expect(() => b.importPointer(DEVICE_CODE.cpu, DTYPE_CODE.float32, 4096n, 4, 7n)).toThrow(
        'Expected stream to be 0n for a cpu pointer (order host memory by finishing the producer\'s writes before the import) but received 7');
    } else {
      expect(() => b.importPointer(DEVICE_CODE.cuda, DTYPE_CODE.float32, 4096n, 4, 0n))
        .toThrow('Expected ptr to be device (or managed) memory of CUDA device 0 but it is not');
    }
    expect(liveMemory()).toEqual(before);
  });
});
