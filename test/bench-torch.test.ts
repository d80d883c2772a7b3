/**
 * The PyTorch SDPA bridge (bench/torch.ts) against a fake interpreter
 * (test/fixtures/fake-python/python3, behaviour chosen by FAKE_PYTHON_MODE), and the real
 * bench/torch_sdpa.py as far as this machine's python3 (no PyTorch, no GPU) can run it.
 */
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { findTorchScript, runTorchBaselines, TorchCell, TorchResult, validateTorchOutput } from '../bench/torch';

const root = path.resolve(__dirname, '..');
const fake = path.join(__dirname, 'fixtures', 'fake-python', 'python3');
const script = path.join(root, 'bench', 'torch_sdpa.py');
fs.chmodSync(fake, 0o755); // a checkout may lose the executable bit

const cells: TorchCell[] = [
  { id: 'a', batch: 2, seqlenQ: 128, seqlenK: 128, headsQ: 8, headsKV: 8, headDim: 64, causal: true, dtype: 'bfloat16', pass: 'fwd' },
  { id: 'b', batch: 1, seqlenQ: 64, seqlenK: 256, headsQ: 8, headsKV: 2, headDim: 128, causal: true, dtype: 'float32', pass: 'bwd' },
];

/** Runs the bridge with the fake interpreter in `mode`, with FAKE_PYTHON_* set only for this call. */
async function withFake(mode: string, extra: Partial<Parameters<typeof runTorchBaselines>[1]> = {}, record?: string): Promise<TorchResult> {
  const saved = { mode: process.env.FAKE_PYTHON_MODE, record: process.env.FAKE_PYTHON_RECORD };
  process.env.FAKE_PYTHON_MODE = mode;
  if (record !== undefined) process.env.FAKE_PYTHON_RECORD = record;
  try {
    return await runTorchBaselines(cells, { backends: ['flash', 'cudnn'], warmup: 2, repeats: 20, python: fake, ...extra });
  } finally {
    for (const [k, v] of [['FAKE_PYTHON_MODE', saved.mode], ['FAKE_PYTHON_RECORD', saved.record]] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

function reasonOf(r: TorchResult): string {
  if (r.available) throw new Error('expected an unavailable result');
  return r.reason;
}

let tmp: string;
beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-torch-'));
});
afterAll(() => {
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('runTorchBaselines with a fake python', () => {
  test('parses an answer: env, one row per cell and backend, error rows with NaN timings', async () => {
    const record = path.join(tmp, 'record.json');
    const r = await withFake('ok', { seed: 7 }, record);
    if (!r.available) throw new Error(`unavailable: ${r.reason}`);
    expect(r.env).toEqual({
      torch: '2.11.0+cu130', cuda: '13.0', cudnn: '9.19.0', device: 'NVIDIA H100 80GB HBM3', capability: '9.0',
      driver: '580.95.05', python: '3.12.3',
    });
    expect(r.rows.map((x) => `${x.id}/${x.backend}`)).toEqual(['a/flash', 'a/cudnn', 'b/flash', 'b/cudnn']);
    expect(r.rows[0]).toEqual({ id: 'a', backend: 'flash', msMedian: 1.5, msMin: 1, msMax: 2, peakBytes: 1000, mask: 'causal', error: null });
    expect(r.rows[3]).toMatchObject({ msMedian: 4.5, peakBytes: 4000, mask: 'lower_right_fused', error: null });
    const failed = r.rows[2];
    expect(failed.error).toMatch(/^No available kernel/);
    expect(failed.msMedian).toBeNaN();
    expect(failed.peakBytes).toBeNaN();

    // What the script received: its own path, and the request as the contract spells it.
    const seen = JSON.parse(fs.readFileSync(record, 'utf8')) as { argv: string[]; request: unknown };
    expect(seen.argv).toEqual([script]);
    expect(seen.request).toEqual({ cells, backends: ['flash', 'cudnn'], warmup: 2, warmupMs: 0, repeats: 20, seed: 7, allowMaterializedMask: false });
  });

  test('takes the interpreter from FLASH_ATTN_BENCH_PYTHON when opts.python is not given', async () => {
    const saved = process.env.FLASH_ATTN_BENCH_PYTHON;
    process.env.FLASH_ATTN_BENCH_PYTHON = fake;
    try {
      const r = await withFake('ok', { python: undefined });
      expect(r.available).toBe(true);
    } finally {
      if (saved === undefined) delete process.env.FLASH_ATTN_BENCH_PYTHON;
      else process.env.FLASH_ATTN_BENCH_PYTHON = saved;
    }
  });

  test('a missing python3 on PATH is reported plainly', async () => {
    const saved = { path: process.env.PATH, py: process.env.FLASH_ATTN_BENCH_PYTHON };
    process.env.PATH = tmp; // an empty directory: no python3
    delete process.env.FLASH_ATTN_BENCH_PYTHON;
    try {
      const r = await runTorchBaselines(cells, { backends: ['flash'], warmup: 1, repeats: 1 });
      expect(reasonOf(r)).toBe('python3 was not found (set FLASH_ATTN_BENCH_PYTHON)');
    } finally {
      process.env.PATH = saved.path;
      if (saved.py !== undefined) process.env.FLASH_ATTN_BENCH_PYTHON = saved.py;
    }
  });

  test('a missing explicit interpreter is named', async () => {
    const r = await withFake('ok', { python: path.join(tmp, 'no-such-python') });
    expect(reasonOf(r)).toBe(`${path.join(tmp, 'no-such-python')} was not found (set FLASH_ATTN_BENCH_PYTHON)`);
  });

  test('exit 3 gives the script\'s own reason', async () => {
    expect(reasonOf(await withFake('exit3'))).toBe('PyTorch is not installed for /usr/bin/python3');
  });

  test('garbage on stdout is malformed output, with the first stderr lines', async () => {
    const reason = reasonOf(await withFake('garbage'));
    expect(reason).toMatch(/^torch_sdpa\.py gave malformed output: output is not JSON/);
    expect(reason).toContain('Traceback (most recent call last):');
    expect(reason).toContain('libcudnn.so.9');
  });

  test('a crash gives the exit status and stderr', async () => {
    const reason = reasonOf(await withFake('crash'));
    expect(reason).toContain('exited with status 1');
    expect(reason).toContain('illegal memory access');
  });

  test('an answer missing a row, or with a mistyped field, is rejected', async () => {
    expect(reasonOf(await withFake('missing-row'))).toMatch(/1 cell\/backend pair\(s\) have no row, e\.g\. \(b, cudnn\)/);
    expect(reasonOf(await withFake('bad-row'))).toMatch(/rows\[0\]\.msMedian is not a number/);
  });

  test('progress lines reach onProgress (also when split across writes); other lines reach onLog', async () => {
    const progress: Array<[number, number]> = [];
    const logged: string[] = [];
    const r = await withFake('progress', { onProgress: (d, t) => progress.push([d, t]), onLog: (l) => logged.push(l) });
    expect(r.available).toBe(true);
    expect(progress).toEqual([[0, 4], [1, 4], [2, 4], [3, 4], [4, 4]]);
    expect(logged).toEqual(['torch_sdpa: starting', 'UserWarning: something 1', 'UserWarning: something 2', 'UserWarning: something 3', 'UserWarning: something 4']);
  });

  test('a run past timeoutMs is killed and reported', async () => {
    const progress: number[] = [];
    const t0 = Date.now();
    const r = await withFake('hang', { timeoutMs: 1500, onProgress: (d) => progress.push(d) });
    expect(Date.now() - t0).toBeLessThan(10000);
    expect(reasonOf(r)).toMatch(/^torch_sdpa\.py did not finish within 1500 ms/);
    expect(progress).toEqual([0]);
  });
});

describe('validateTorchOutput', () => {
  const env = { torch: '2.11', cuda: '13.0', cudnn: null, device: 'GPU', capability: '9.0', driver: null, python: '3.12' };
  const row = { id: 'a', backend: 'math', msMedian: 1, msMin: 1, msMax: 1, peakBytes: 0, mask: 'causal', error: null };
  const one = [cells[0]];

  test('accepts a well-formed answer', () => {
    expect(validateTorchOutput({ env, rows: [row] }, one, ['math']).rows).toEqual([row]);
  });

  test.each([
    ['not an object', [], /not a JSON object/],
    ['env missing', { rows: [row] }, /env is missing/],
    ['env.device not a string', { env: { ...env, device: 3 }, rows: [row] }, /env\.device is not a string/],
    ['unknown backend', { env, rows: [{ ...row, backend: 'xla' }] }, /backend "xla" is unknown/],
    ['row not asked for', { env, rows: [{ ...row, id: 'zz' }] }, /was not asked for/],
    ['repeated row', { env, rows: [row, row] }, /was not asked for, or is repeated/],
    ['negative time', { env, rows: [{ ...row, msMin: -1 }] }, /msMin is not a number >= 0/],
    ['null time without an error', { env, rows: [{ ...row, msMax: null }] }, /msMax is not a number >= 0/],
    ['unknown mask', { env, rows: [{ ...row, mask: 'top_left' }] }, /mask "top_left" is unknown/],
  ])('rejects %s', (_name, value, message) => {
    expect(() => validateTorchOutput(value, one, ['math'])).toThrow(message);
  });
});

describe('finding bench/torch_sdpa.py', () => {
  test('next to the sources', () => {
    expect(findTorchScript(path.join(root, 'bench'))).toBe(script);
  });

  test('from a compiled dist/bench/ without its own copy: <package root>/bench/', () => {
    const pkg = path.join(tmp, 'pkg');
    fs.mkdirSync(path.join(pkg, 'dist', 'bench'), { recursive: true });
    fs.mkdirSync(path.join(pkg, 'bench'), { recursive: true });
    expect(findTorchScript(path.join(pkg, 'dist', 'bench'))).toBeNull();
    fs.copyFileSync(script, path.join(pkg, 'bench', 'torch_sdpa.py'));
    expect(findTorchScript(path.join(pkg, 'dist', 'bench'))).toBe(path.join(pkg, 'bench', 'torch_sdpa.py'));
  });
});

describe('bench/torch_sdpa.py with this machine\'s python3', () => {
  const python = spawnSync('python3', ['--version'], { encoding: 'utf8' });
  const run = (args: string[], input: string): ReturnType<typeof spawnSync> =>
    spawnSync('python3', [script, ...args], { input, encoding: 'utf8', timeout: 60000 });
  const request = JSON.stringify({ cells, backends: ['flash', 'cudnn', 'efficient'], warmup: 1, repeats: 3 });
  const torchHere = spawnSync('python3', ['-c', 'import torch'], { encoding: 'utf8' }).status === 0;

  test('python3 is here', () => {
    expect(python.status).toBe(0);
  });

  test('compiles (py_compile), and parses as Python 3.9', () => {
    const out = path.join(tmp, 'torch_sdpa.pyc');
    const c = spawnSync('python3', ['-c', 'import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)', script, out], { encoding: 'utf8' });
    expect(c.stderr).toBe('');
    expect(c.status).toBe(0);
    const p = spawnSync('python3', ['-c', 'import ast, sys; ast.parse(open(sys.argv[1]).read(), feature_version=(3, 9))', script], { encoding: 'utf8' });
    expect(p.stderr).toBe('');
    expect(p.status).toBe(0);
  });

  (torchHere ? test.skip : test)('without PyTorch: {"error": ...} on stdout and exit 3', () => {
    const r = run([], request);
    expect(r.status).toBe(3);
    expect(JSON.parse(String(r.stdout))).toEqual({ error: expect.stringMatching(/^PyTorch is not installed for \//) });
  });

  test('a malformed request: {"error": "bad request: ..."} and exit 2 (checked before torch is imported)', () => {
    const r = run([], JSON.stringify({ cells: [{ ...cells[0], dtype: 'float64' }], backends: ['flash'], warmup: 1, repeats: 3 }));
    expect(r.status).toBe(2);
    expect(JSON.parse(String(r.stdout)).error).toMatch(/^bad request: cells\[0\]: dtype must be one of/);
    const g = run([], JSON.stringify({ cells, backends: ['flash'], warmup: 1, repeats: 0 }));
    expect(g.status).toBe(2);
    expect(JSON.parse(String(g.stdout)).error).toMatch(/repeats must be an integer >= 1/);
    const w = run([], JSON.stringify({ cells, backends: ['flash'], warmup: 1, warmupMs: -1, repeats: 3 }));
    expect(w.status).toBe(2);
    expect(JSON.parse(String(w.stdout)).error).toMatch(/warmupMs must be an integer >= 0 \(got -1\)/);
  });

  test('"No available kernel" gets the informative part of PyTorch\'s warnings', () => {
    const probe = [
      'import importlib.util, json, sys',
      'sys.dont_write_bytecode = True',
      'spec = importlib.util.spec_from_file_location("torch_sdpa", sys.argv[1])',
      'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)',
      'print(json.dumps(m.kernel_reasons(json.loads(sys.stdin.read()))))',
    ].join('\n');
    const warningsSeen = [
      'Memory efficient kernel not used because: (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:986.)',
      'Flash attention has been runtime disabled. (Triggered internally at /pytorch/aten/src/ATen/native/transformers/sdp_utils_cpp.h:540.)',
      'Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: float (Triggered internally at /x.cpp:1.)',
      'Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: float (Triggered internally at /x.cpp:1.)',
      'Flash attention kernel not used because: (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:988.)',
    ];
    const r = spawnSync('python3', ['-c', probe, script], { input: JSON.stringify(warningsSeen), encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toEqual(['Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: float']);
  });

  test('a cell\'s backends take turns at their timed repeats, in 5 rounds', () => {
    // Runner.run with its torch and Runner.prepare faked: records the order of the timed batches.
    const probe = [
      'import importlib.util, json, sys, types',
      'sys.dont_write_bytecode = True',
      'spec = importlib.util.spec_from_file_location("torch_sdpa", sys.argv[1])',
      'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)',
      'class OOM(Exception): pass',
      'cuda = types.SimpleNamespace(synchronize=lambda: None, empty_cache=lambda: None, OutOfMemoryError=OOM)',
      'torch = types.SimpleNamespace(cuda=cuda, manual_seed=lambda s: None)',
      'log = []',
      'class Fake(m.Prepared):',
      '    def time(self, n):',
      '        log.append([self.cell["id"], self.backend, n])',
      '        if self.backend == "efficient" and len(self.times) >= 3: raise RuntimeError("late failure")',
      '        self.times += [float(len(self.times) + i + 1) for i in range(n)]',
      'def prepare(self, cell, backend):',
      '    if backend == "math": return m.error_row(cell, backend, "refused", "none")',
      '    return Fake(torch, cell, backend, "none", 7, None, None, [])',
      'r = object.__new__(m.Runner)',
      'r.torch, r.req = torch, json.loads(sys.stdin.read())',
      'r.prepare = types.MethodType(prepare, r)',
      'rows = r.run()',
      'print(json.dumps({"log": log, "rows": rows, "sizes": m.round_sizes(12, 5)}))',
    ].join('\n');
    const req = { cells: [{ id: 'a' }, { id: 'b' }], backends: ['flash', 'cudnn', 'efficient', 'math'], repeats: 12, seed: 0 };
    const r = spawnSync('python3', ['-c', probe, script], { input: JSON.stringify(req), encoding: 'utf8' });
    expect(r.stderr.split('\n').filter((l) => !l.startsWith('progress'))).toEqual(['']);
    const out = JSON.parse(r.stdout) as { log: [string, string, number][]; rows: Record<string, unknown>[]; sizes: number[] };
    expect(out.sizes).toEqual([3, 3, 2, 2, 2]);
    // Round by round, flash then cuDNN then efficient; efficient fails in its second round and
    // sits out the rest; math refused before timing.
    const cellA = out.log.filter(([id]) => id === 'a').map(([, b, n]) => `${b}:${n}`);
    expect(cellA).toEqual([
      'flash:3', 'cudnn:3', 'efficient:3',
      'flash:3', 'cudnn:3', 'efficient:3',
      'flash:2', 'cudnn:2', 'flash:2', 'cudnn:2', 'flash:2', 'cudnn:2',
    ]);
    expect(out.log.filter(([id]) => id === 'b')).toHaveLength(12);
    expect(out.rows.map((row) => [row.id, row.backend, row.error])).toEqual([
      ['a', 'flash', null], ['a', 'cudnn', null], ['a', 'efficient', 'RuntimeError: late failure'], ['a', 'math', 'refused'],
      ['b', 'flash', null], ['b', 'cudnn', null], ['b', 'efficient', 'RuntimeError: late failure'], ['b', 'math', 'refused'],
    ]);
    // The 12 repeats (1 .. 12 here) make one median / min / max.
    expect(out.rows[0]).toMatchObject({ msMedian: 6.5, msMin: 1, msMax: 12, peakBytes: 7, mask: 'none' });
  });

  test('--plan: 3 rotating input sets below 256 MiB of working set, 1 above', () => {
    const big: TorchCell = { ...cells[0], id: 'big', batch: 16, seqlenQ: 8192, seqlenK: 8192, headsQ: 16, headsKV: 16, headDim: 128 };
    const r = run(['--plan'], JSON.stringify({ cells: [...cells, big], backends: ['math'], warmup: 0, repeats: 1 }));
    expect(r.status).toBe(0);
    const plan = JSON.parse(String(r.stdout)) as { cells: Array<{ id: string; workingSetBytes: number; inputSets: number }>; seed: number };
    // a: fwd bf16, q/out 2·128·8·64 and k/v 2·128·8·64 elements → 4·131072 · 2 bytes
    expect(plan.cells.map((c) => [c.id, c.workingSetBytes, c.inputSets])).toEqual([
      ['a', 4 * 131072 * 2, 3],
      ['b', (4 * 64 * 8 * 128 + 4 * 256 * 2 * 128) * 4, 3],
      ['big', 4 * 16 * 8192 * 16 * 128 * 2, 1],
    ]);
    expect(plan.seed).toBe(0);
  });
});
