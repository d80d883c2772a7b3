/**
 * The PyTorch SDPA bridge (bench/torch.ts: the worker, its cell sessions and runTorchBaselines) against a fake
 * interpreter (test/fixtures/fake-python/python3, behaviour chosen by FAKE_PYTHON_MODE), and the real
 * bench/torch_sdpa.py as far as this machine's python3 (no PyTorch, no GPU) can run it.
 */
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import {
  findTorchScript, openTorchWorker, runTorchBaselines, TorchCell, TorchCellBegin, TorchCellSession, TorchOptions, TorchResult, TorchWorker,
  TorchWorkerOpen, validateTorchOutput,
} from '../bench/torch';

const root = path.resolve(__dirname, '..');
const fake = path.join(__dirname, 'fixtures', 'fake-python', 'python3');
const script = path.join(root, 'bench', 'torch_sdpa.py');
fs.chmodSync(fake, 0o755); // a checkout may lose the executable bit

const cells: TorchCell[] = [
  { id: 'a', batch: 2, seqlenQ: 128, seqlenK: 128, headsQ: 8, headsKV: 8, headDim: 64, causal: true, dtype: 'bfloat16', pass: 'fwd' },
  { id: 'b', batch: 1, seqlenQ: 64, seqlenK: 256, headsQ: 8, headsKV: 2, headDim: 128, causal: true, dtype: 'float32', pass: 'bwd' },
];

/** `fn` with FAKE_PYTHON_MODE (and FAKE_PYTHON_RECORD) set while the interpreter starts; restored after. */
async function withFakeEnv<T>(mode: string, record: string | undefined, fn: () => Promise<T>): Promise<T> {
  const saved = { mode: process.env.FAKE_PYTHON_MODE, record: process.env.FAKE_PYTHON_RECORD };
  process.env.FAKE_PYTHON_MODE = mode;
  if (record !== undefined) process.env.FAKE_PYTHON_RECORD = record;
  try {
    return await fn();
  } finally {
    for (const [k, v] of [['FAKE_PYTHON_MODE', saved.mode], ['FAKE_PYTHON_RECORD', saved.record]] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

const fakeOptions: TorchOptions = { backends: ['flash', 'cudnn'], warmup: 2, repeats: 20, python: fake };

/** Runs the bridge with the fake interpreter in `mode`, with FAKE_PYTHON_* set only for this call. */
async function withFake(mode: string, extra: Partial<TorchOptions> = {}, record?: string): Promise<TorchResult> {
  return withFakeEnv(mode, record, () => runTorchBaselines(cells, { ...fakeOptions, ...extra }));
}

/** Opens a worker on the fake interpreter in `mode` (the mode sticks to the process it starts). */
async function openFake(mode: string, extra: Partial<TorchOptions> = {}, record?: string): Promise<TorchWorkerOpen> {
  return withFakeEnv(mode, record, () => openTorchWorker({ ...fakeOptions, ...extra }));
}

/** What FAKE_PYTHON_RECORD holds: one line per request the fake received. */
interface Recorded {
  argv: string[];
  pid: number;
  request: { cells: TorchCell[] } & Record<string, unknown>;
}

function recorded(file: string): Recorded[] {
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, 'utf8').trimEnd().split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as Recorded);
}

/** Whether process `pid` is still running. */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Why a request gave no result (a list's, a begin's, a round's or an end's). */
function reasonOf(r: TorchResult | TorchCellBegin | { available: true }): string {
  if (r.available) throw new Error('expected an unavailable result');
  return r.reason;
}

/** Why an open failed; a worker that did start is closed before the test fails. */
async function openReason(o: Promise<TorchWorkerOpen>): Promise<string> {
  const r = await o;
  if (r.available) {
    await r.worker.close();
    throw new Error('expected the worker not to start');
  }
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

    // What the script received: its own path in worker mode, and one request as the contract spells it.
    const seen = recorded(record);
    expect(seen).toHaveLength(1);
    expect(seen[0].argv).toEqual([script, '--serve']);
    expect(seen[0].request).toEqual({ cells, backends: ['flash', 'cudnn'], warmup: 2, warmupMs: 0, repeats: 20, seed: 7, allowMaterializedMask: false });
    // The worker was closed (EOF on its stdin) and has exited.
    expect(alive(seen[0].pid)).toBe(false);
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

/** The worker of an open that must succeed. */
function workerOf(o: TorchWorkerOpen): TorchWorker {
  if (!o.available) throw new Error(`unavailable: ${o.reason}`);
  return o.worker;
}

/** The session of a begin that must succeed. */
function sessionOf(b: TorchCellBegin): TorchCellSession {
  if (!b.available) throw new Error(`unavailable: ${b.reason}`);
  return b.session;
}

describe('openTorchWorker with a fake python', () => {
  test('one process answers request after request, each with its own rows and progress', async () => {
    const record = path.join(tmp, 'worker-record.jsonl');
    const progress: Array<[number, number]> = [];
    const worker = workerOf(await openFake('progress', { seed: 3, onProgress: (d, t) => progress.push([d, t]) }, record));
    try {
      expect(worker.env).toMatchObject({ torch: '2.11.0+cu130', device: 'NVIDIA H100 80GB HBM3' });
      const first = await worker.run([cells[1]]);
      if (!first.available) throw new Error(first.reason);
      expect(first.env).toEqual(worker.env);
      expect(first.rows.map((x) => [x.id, x.backend, x.error === null])).toEqual([['b', 'flash', false], ['b', 'cudnn', true]]);
      expect(progress).toEqual([[0, 2], [1, 2], [2, 2]]);
      progress.length = 0;
      const second = await worker.run(cells);
      if (!second.available) throw new Error(second.reason);
      // The fake numbers rows from 1 within each request: this is the second request's answer.
      expect(second.rows.map((x) => [x.id, x.backend, x.msMin])).toEqual([['a', 'flash', 1], ['a', 'cudnn', 2], ['b', 'flash', NaN], ['b', 'cudnn', 4]]);
      expect(progress).toEqual([[0, 4], [1, 4], [2, 4], [3, 4], [4, 4]]);
    } finally {
      await worker.close();
    }
    const seen = recorded(record);
    expect(seen.map((r) => r.request.cells.map((c) => c.id))).toEqual([['b'], ['a', 'b']]);
    expect(new Set(seen.map((r) => r.pid)).size).toBe(1);
    expect(seen[0].argv).toEqual([script, '--serve']);
    for (const r of seen) expect(r.request).toMatchObject({ backends: ['flash', 'cudnn'], warmup: 2, warmupMs: 0, repeats: 20, seed: 3 });
    expect(alive(seen[0].pid)).toBe(false);
  });

  test('runs asked for at once are sent one after another, each answered with its own cells', async () => {
    const worker = workerOf(await openFake('ok'));
    try {
      const results = await Promise.all([worker.run([cells[0]]), worker.run([cells[1]]), worker.run([])]);
      expect(results.map((r) => (r.available ? r.rows.map((x) => `${x.id}/${x.backend}`) : r.reason))).toEqual([
        ['a/flash', 'a/cudnn'], ['b/flash', 'b/cudnn'], [],
      ]);
    } finally {
      await worker.close();
    }
  });

  test('a crash mid-run: the rows already given stay, the reason names the exit and stderr, later runs give it again', async () => {
    const record = path.join(tmp, 'crash-record.jsonl');
    const worker = workerOf(await openFake('crash-later', {}, record));
    try {
      const first = await worker.run([cells[0]]);
      expect(first.available).toBe(true);
      const reason = reasonOf(await worker.run([cells[1]]));
      expect(reason).toContain(`${fake} torch_sdpa.py exited with status 1`);
      expect(reason).toContain('illegal memory access');
      expect(reasonOf(await worker.run(cells))).toBe(reason);
    } finally {
      await worker.close();
    }
    // The run after the crash was not sent anywhere.
    expect(recorded(record).map((r) => r.request.cells.map((c) => c.id))).toEqual([['a'], ['b']]);
  });

  test('a malformed answer mid-run kills the worker: not JSON, a missing row, a mistyped field', async () => {
    for (const [mode, message] of [
      ['garbage-answer', /^torch_sdpa\.py gave malformed output: output is not JSON/],
      ['missing-row', /^torch_sdpa\.py gave malformed output: 1 cell\/backend pair\(s\) have no row, e\.g\. \(a, cudnn\)/],
      ['bad-row', /^torch_sdpa\.py gave malformed output: rows\[0\]\.msMedian is not a number/],
    ] as const) {
      const record = path.join(tmp, `${mode}-record.jsonl`);
      const worker = workerOf(await openFake(mode, {}, record));
      try {
        const reason = reasonOf(await worker.run([cells[0]]));
        expect(reason).toMatch(message);
        expect(reasonOf(await worker.run([cells[0]]))).toBe(reason);
      } finally {
        await worker.close();
      }
      const seen = recorded(record);
      expect(seen).toHaveLength(1);
      expect(alive(seen[0].pid)).toBe(false);
    }
  });

  test('timeoutMs bounds each request, not the worker\'s life; a request past it kills the worker', async () => {
    // Three requests with pauses between them, together longer than the limit: each is in time.
    const worker = workerOf(await openFake('progress', { timeoutMs: 2000 }));
    try {
      for (let i = 0; i < 3; i++) {
        await new Promise((resolve) => setTimeout(resolve, 800));
        expect((await worker.run(cells)).available).toBe(true);
      }
    } finally {
      await worker.close();
    }
    const record = path.join(tmp, 'hang-record.jsonl');
    const hung = workerOf(await openFake('hang', { timeoutMs: 1000 }, record));
    try {
      const t0 = Date.now();
      const reason = reasonOf(await hung.run(cells));
      expect(Date.now() - t0).toBeLessThan(8000);
      expect(reason).toMatch(/^torch_sdpa\.py did not finish within 1000 ms \(nothing on stderr\)$/);
      expect(reasonOf(await hung.run(cells))).toBe(reason);
    } finally {
      await hung.close();
    }
    expect(alive(recorded(record)[0].pid)).toBe(false);
  });

  test('startup failures: exit 3, no env line in time, a malformed env line, no interpreter', async () => {
    expect(await openReason(openFake('exit3'))).toBe('PyTorch is not installed for /usr/bin/python3');
    expect(await openReason(openFake('hang-start', { timeoutMs: 1000 }))).toBe(
      'torch_sdpa.py did not finish within 1000 ms (stderr: torch_sdpa: importing torch)');
    expect(await openReason(openFake('bad-env'))).toMatch(/^torch_sdpa\.py gave malformed output: env\.device is not a string \(nothing on stderr\)$/);
    const garbage = await openReason(openFake('garbage'));
    expect(garbage).toMatch(/^torch_sdpa\.py gave malformed output: output is not JSON/);
    expect(garbage).toContain('libcudnn.so.9');
    const missing = path.join(tmp, 'no-such-python');
    expect(await openReason(openFake('ok', { python: missing }))).toBe(`${missing} was not found (set FLASH_ATTN_BENCH_PYTHON)`);
  });

  test('close: the worker exits at EOF; later runs give a reason; closing twice is harmless', async () => {
    const record = path.join(tmp, 'close-record.jsonl');
    const worker = workerOf(await openFake('ok', {}, record));
    expect((await worker.run([cells[0]])).available).toBe(true);
    await worker.close();
    const [{ pid }] = recorded(record);
    expect(alive(pid)).toBe(false);
    expect(reasonOf(await worker.run([cells[0]]))).toBe('the PyTorch worker (torch_sdpa.py --serve) was closed');
    await worker.close();
    expect(recorded(record)).toHaveLength(1);
  });

  test('close kills a worker that does not exit at EOF, after the grace period', async () => {
    const record = path.join(tmp, 'linger-record.jsonl');
    const worker = workerOf(await openFake('linger', {}, record));
    expect((await worker.run([cells[0]])).available).toBe(true);
    const t0 = Date.now();
    await worker.close(300);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(250);
    expect(Date.now() - t0).toBeLessThan(5000);
    expect(alive(recorded(record)[0].pid)).toBe(false);
  });
});

describe('cell sessions (begin, round, end) with a fake python', () => {
  /** Every round of `session`, each of which must succeed. */
  async function allRounds(session: TorchCellSession): Promise<void> {
    for (let i = 0; i < session.rounds.length; i++) expect(await session.round(i)).toEqual({ available: true });
  }

  test('begin, round 0 .. n-1, end: the request lines as the contract spells them, the cell\'s rows, then other requests', async () => {
    const record = path.join(tmp, 'session-record.jsonl');
    const worker = workerOf(await openFake('ok', { seed: 5, repeats: 7 }, record));
    try {
      const session = sessionOf(await worker.begin(cells[1]));
      expect(session.cell).toBe(cells[1]);
      // 7 repeats over 5 rounds, the first rounds one more (the worker's split).
      expect(session.rounds).toEqual([2, 2, 1, 1, 1]);
      await allRounds(session);
      const result = await session.end();
      if (!result.available) throw new Error(result.reason);
      expect(result.env).toEqual(worker.env);
      expect(result.rows.map((x) => [x.id, x.backend, x.error === null, x.msMin])).toEqual([['b', 'flash', false, NaN], ['b', 'cudnn', true, 2]]);
      // The session has ended: the worker takes a list, and another session.
      const after = await worker.run([cells[0]]);
      expect(after.available && after.rows.map((x) => `${x.id}/${x.backend}`)).toEqual(['a/flash', 'a/cudnn']);
      const next = sessionOf(await worker.begin(cells[0]));
      await allRounds(next);
      expect((await next.end()).available).toBe(true);
    } finally {
      await worker.close();
    }
    const seen = recorded(record);
    expect(new Set(seen.map((r) => r.pid)).size).toBe(1);
    const settings = { backends: ['flash', 'cudnn'], warmup: 2, warmupMs: 0, repeats: 7, seed: 5, allowMaterializedMask: false };
    const rounds = [0, 1, 2, 3, 4].map((index) => ({ op: 'round', index }));
    expect(seen.map((r) => r.request)).toEqual([
      { op: 'begin', cell: cells[1], ...settings }, ...rounds, { op: 'end' },
      { cells: [cells[0]], ...settings },
      { op: 'begin', cell: cells[0], ...settings }, ...rounds, { op: 'end' },
    ]);
  });

  test('calls out of order reject with an Error naming what was expected, send nothing, and leave the session going', async () => {
    const record = path.join(tmp, 'order-record.jsonl');
    const worker = workerOf(await openFake('ok', {}, record));
    try {
      const session = sessionOf(await worker.begin(cells[0]));
      expect(session.rounds).toEqual([4, 4, 4, 4, 4]);
      await expect(worker.begin(cells[1])).rejects.toThrow("begin: expected no open cell session but cell a's is open (end it first)");
      await expect(worker.run(cells)).rejects.toThrow("run: expected no open cell session but cell a's is open (end it first)");
      await expect(session.round(1)).rejects.toThrow('round: expected index 0 (the cell has 5 rounds) but received 1');
      await expect(session.end()).rejects.toThrow("end: expected round 0 first (0 of the cell's 5 rounds done)");
      expect(await session.round(0)).toEqual({ available: true });
      await expect(session.round(0)).rejects.toThrow('round: expected index 1 (the cell has 5 rounds) but received 0');
      for (let i = 1; i < 5; i++) expect(await session.round(i)).toEqual({ available: true });
      await expect(session.round(5)).rejects.toThrow('round: expected end (all 5 rounds done) but received round 5');
      expect((await session.end()).available).toBe(true);
      await expect(session.end()).rejects.toThrow('end: the session of cell a has ended');
      await expect(session.round(0)).rejects.toThrow('round(0): the session of cell a has ended');
      // Rounds asked for without awaiting each go out in order.
      const second = sessionOf(await worker.begin(cells[1]));
      const answers = await Promise.all(second.rounds.map((_, i) => second.round(i)));
      expect(answers.every((a) => a.available)).toBe(true);
      expect((await second.end()).available).toBe(true);
    } finally {
      await worker.close();
    }
    const ops = recorded(record).map((r) => (r.request.op === 'round' ? `round ${r.request.index}` : String(r.request.op)));
    const cell = ['begin', 'round 0', 'round 1', 'round 2', 'round 3', 'round 4', 'end'];
    expect(ops).toEqual([...cell, ...cell]);
  });

  test('a crash mid-cell: the cells before keep their rows; that round, its end, later sessions and lists give the reason', async () => {
    const record = path.join(tmp, 'mid-cell-record.jsonl');
    const worker = workerOf(await openFake('crash-mid-cell', {}, record));
    try {
      const first = sessionOf(await worker.begin(cells[0]));
      await allRounds(first);
      const rows = await first.end();
      expect(rows.available && rows.rows.map((x) => `${x.id}/${x.backend}`)).toEqual(['a/flash', 'a/cudnn']);
      const second = sessionOf(await worker.begin(cells[1]));
      expect(await second.round(0)).toEqual({ available: true });
      const reason = reasonOf(await second.round(1));
      expect(reason).toContain(`${fake} torch_sdpa.py exited with status 1`);
      expect(reason).toContain('illegal memory access');
      expect(reasonOf(await second.end())).toBe(reason);
      expect(await second.round(2)).toEqual({ available: false, reason });
      expect(await worker.begin(cells[0])).toEqual({ available: false, reason });
      expect(reasonOf(await worker.run(cells))).toBe(reason);
    } finally {
      await worker.close();
    }
    // Nothing was sent after the round that crashed it.
    const seen = recorded(record);
    expect(seen).toHaveLength(7 + 3);
    expect(seen[seen.length - 1].request).toEqual({ op: 'round', index: 1 });
    expect(alive(seen[0].pid)).toBe(false);
  });

  test('answers outside the contract kill the worker: rounds that do not add up to the repeats, an end missing a row', async () => {
    const ready = workerOf(await openFake('bad-ready'));
    try {
      const reason = reasonOf(await ready.begin(cells[0]));
      expect(reason).toMatch(/^torch_sdpa\.py gave malformed output: the answer to begin has rounds \[4,4,4,4,4,1\] \(21 repeats\), expected 20 repeats/);
      expect(reasonOf(await ready.run(cells))).toBe(reason);
    } finally {
      await ready.close();
    }
    const missing = workerOf(await openFake('missing-row'));
    try {
      const session = sessionOf(await missing.begin(cells[0]));
      await allRounds(session);
      const reason = reasonOf(await session.end());
      expect(reason).toMatch(/^torch_sdpa\.py gave malformed output: 1 cell\/backend pair\(s\) have no row, e\.g\. \(a, cudnn\)/);
      // The session ended with the worker: a new one may not begin, and says why.
      expect(await missing.begin(cells[1])).toEqual({ available: false, reason });
    } finally {
      await missing.close();
    }
  });

  test('a session on a worker closed mid-cell gives the close reason', async () => {
    const worker = workerOf(await openFake('ok', { timeoutMs: 2000 }));
    const session = sessionOf(await worker.begin(cells[0]));
    expect(await session.round(0)).toEqual({ available: true });
    await worker.close();
    expect(await session.round(1)).toEqual({ available: false, reason: 'the PyTorch worker (torch_sdpa.py --serve) was closed' });
    expect(reasonOf(await session.end())).toBe('the PyTorch worker (torch_sdpa.py --serve) was closed');
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

  (torchHere ? test.skip : test)('--serve without PyTorch: one {"error": ...} line on stdout and exit 3, before any request is read', () => {
    const r = run(['--serve'], `${request}\n${request}\n`);
    expect(r.status).toBe(3);
    const lines = String(r.stdout).trimEnd().split('\n');
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0])).toEqual({ error: expect.stringMatching(/^PyTorch is not installed for \//) });
  });

  (torchHere ? test.skip : test)('openTorchWorker on the real script without PyTorch: the script\'s reason', async () => {
    expect(await openReason(openTorchWorker({ backends: ['flash'], warmup: 1, repeats: 3, python: 'python3', timeoutMs: 60000 })))
      .toMatch(/^PyTorch is not installed for \//);
  });

  test('--serve with --plan is refused: --plan is one-shot only', () => {
    const r = run(['--serve', '--plan'], request);
    expect(r.status).toBe(2);
    expect(JSON.parse(String(r.stdout))).toEqual({ error: 'bad request: --plan is for the one-shot mode, not --serve' });
  });

  /**
   * The start of a Python probe that loads torch_sdpa.py as module m, with a fake torch whose
   * empty_cache calls are recorded in `events`.
   */
  const fakeTorchProbe = [
    'import importlib.util, json, sys, types',
    'sys.dont_write_bytecode = True',
    'spec = importlib.util.spec_from_file_location("torch_sdpa", sys.argv[1])',
    'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)',
    'events = []',
    'class OOM(Exception): pass',
    'cuda = types.SimpleNamespace(synchronize=lambda: None, empty_cache=lambda: events.append("empty_cache"), OutOfMemoryError=OOM)',
    'torch = types.SimpleNamespace(cuda=cuda, manual_seed=lambda s: None)',
  ];

  test('--serve\'s loop: the env line, one rows line per request (blank lines skipped), memory freed after each, exit 0 at EOF', () => {
    // serve() with a fake torch and Runner.prepare faked (as in the interleaving test below).
    const probe = [
      ...fakeTorchProbe,
      'class Fake(m.Prepared):',
      '    def time(self, n):',
      '        self.times += [1.0] * n',
      'class Runner(m.Runner):',
      '    def __init__(self, torch, req):',
      '        self.torch, self.req = torch, req',
      '        events.append("request " + ",".join(c["id"] for c in req["cells"]))',
      '    def prepare(self, cell, backend):',
      '        return Fake(torch, cell, backend, "none", 7, None, None, [])',
      'm.Runner = Runner',
      'real_gc = m.gc.collect',
      'm.gc.collect = lambda: events.append("gc") or real_gc()',
      'code = m.serve(torch, {"torch": "fake"})',
      'sys.stderr.write("events " + json.dumps(events) + "\\n")',
      'sys.exit(code)',
    ].join('\n');
    const req = (ids: string[]) => JSON.stringify({ cells: cells.filter((c) => ids.includes(c.id)), backends: ['flash', 'math'], warmup: 0, repeats: 2 });
    const r = spawnSync('python3', ['-c', probe, script], { input: `${req(['a'])}\n\n${req(['a', 'b'])}\n`, encoding: 'utf8', timeout: 60000 });
    expect(r.status).toBe(0);
    const out = r.stdout.trimEnd().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(out[0]).toEqual({ env: { torch: 'fake' } });
    expect(out.slice(1).map((o) => Object.keys(o))).toEqual([['rows'], ['rows']]);
    const ids = out.slice(1).map((o) => (o.rows as Array<{ id: string; backend: string }>).map((x) => `${x.id}/${x.backend}`));
    expect(ids).toEqual([['a/flash', 'a/math'], ['a/flash', 'a/math', 'b/flash', 'b/math']]);
    expect((out[1].rows as Array<Record<string, unknown>>)[0]).toEqual({
      id: 'a', backend: 'flash', msMedian: 1, msMin: 1, msMax: 1, peakBytes: 7, mask: 'none', error: null,
    });
    const stderr = r.stderr.trimEnd().split('\n');
    // Progress per request, each counted from 0; the runner empties the cache after each cell, serve
    // collects and empties it again after each request.
    expect(stderr.filter((l) => l.startsWith('progress'))).toEqual([
      'progress 0 2', 'progress 1 2', 'progress 2 2', 'progress 0 4', 'progress 1 4', 'progress 2 4', 'progress 3 4', 'progress 4 4',
    ]);
    const events = JSON.parse(stderr[stderr.length - 1].replace(/^events /, '')) as string[];
    expect(events).toEqual(['request a', 'empty_cache', 'gc', 'empty_cache', 'request a,b', 'empty_cache', 'empty_cache', 'gc', 'empty_cache']);
  });

  test('--serve\'s loop: a malformed request line gets {"error": "bad request: ..."} and exit 2, after the answers before it', () => {
    const probe = [
      'import importlib.util, sys, types',
      'sys.dont_write_bytecode = True',
      'spec = importlib.util.spec_from_file_location("torch_sdpa", sys.argv[1])',
      'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)',
      'class Runner:',
      '    def __init__(self, torch, req): pass',
      '    def run(self): return []',
      'm.Runner = Runner',
      'torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None, empty_cache=lambda: None))',
      'sys.exit(m.serve(torch, {"torch": "fake"}))',
    ].join('\n');
    const ok = JSON.stringify({ cells: [], backends: ['flash'], warmup: 0, repeats: 1 });
    const bad = JSON.stringify({ cells, backends: ['flash'], warmup: 0, repeats: 0 });
    const r = spawnSync('python3', ['-c', probe, script], { input: `${ok}\n${bad}\n${ok}\n`, encoding: 'utf8', timeout: 60000 });
    expect(r.status).toBe(2);
    const out = r.stdout.trimEnd().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(out).toEqual([{ env: { torch: 'fake' } }, { rows: [] }, { error: 'bad request: request: repeats must be an integer >= 1 (got 0)' }]);
    const notJson = spawnSync('python3', ['-c', probe, script], { input: 'cells: []\n', encoding: 'utf8', timeout: 60000 });
    expect(notJson.status).toBe(2);
    expect(JSON.parse(notJson.stdout.trimEnd().split('\n')[1]).error).toMatch(/^bad request: request is not JSON: /);
  });

  /**
   * serve() with a fake torch and Runner.prepare faked: math refuses every cell, the other backends
   * time 1, 2, 3, ... ms per repeat; events (prepare, time, gc, empty_cache) go to stderr at the end.
   */
  const sessionProbe = [
    ...fakeTorchProbe,
    'class Fake(m.Prepared):',
    '    def time(self, n):',
    '        events.append("time %s %s %d" % (self.cell["id"], self.backend, n))',
    '        self.times += [float(len(self.times) + i + 1) for i in range(n)]',
    'class Runner(m.Runner):',
    '    def __init__(self, torch, req):',
    '        self.torch, self.req = torch, req',
    '    def prepare(self, cell, backend):',
    '        events.append("prepare %s %s" % (cell["id"], backend))',
    '        if backend == "math": return m.error_row(cell, backend, "refused", "none")',
    '        return Fake(torch, cell, backend, "none", 7, None, None, [])',
    'm.Runner = Runner',
    'real_gc = m.gc.collect',
    'm.gc.collect = lambda: events.append("gc") or real_gc()',
    'code = 1',
    'try:',
    '    code = m.serve(torch, {"torch": "fake"})',
    'finally:',
    '    sys.stderr.write("events " + json.dumps(events) + "\\n")',
    'sys.exit(code)',
  ].join('\n');
  /** Runs sessionProbe on `lines` (objects, one JSON line each): its exit status, stdout objects and events. */
  const serveLines = (lines: object[]): { status: number | null; out: Record<string, unknown>[]; events: string[] } => {
    const r = spawnSync('python3', ['-c', sessionProbe, script], { input: lines.map((l) => `${JSON.stringify(l)}\n`).join(''), encoding: 'utf8', timeout: 60000 });
    const stderr = r.stderr.trimEnd().split('\n');
    const last = stderr[stderr.length - 1];
    if (!last.startsWith('events ')) throw new Error(`the probe failed: ${r.stderr}`);
    return { status: r.status, out: r.stdout.trimEnd().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>), events: JSON.parse(last.slice(7)) as string[] };
  };
  const settings = (backends: string[], repeats: number) => ({ backends, warmup: 0, repeats });
  const begin = (cell: TorchCell, backends: string[], repeats: number) => ({ op: 'begin', cell, ...settings(backends, repeats) });
  const round = (index: number) => ({ op: 'round', index });
  const end = { op: 'end' };

  test('--serve\'s cell requests: begin prepares every backend, each round times the prepared ones in turn, end gives the rows and frees the memory', () => {
    const { status, out, events } = serveLines([
      begin(cells[0], ['flash', 'cudnn', 'math'], 7), round(0), round(1), round(2), round(3), round(4), end,
      // The same cell as one list request: the same rows, by the same code.
      { cells: [cells[0]], ...settings(['flash', 'cudnn', 'math'], 7) },
      // Every backend refuses: still ready, the rounds time nothing, end gives the error rows.
      begin(cells[1], ['math'], 2), round(0), round(1), end,
    ]);
    expect(status).toBe(0);
    expect(out.slice(0, 7)).toEqual([
      { env: { torch: 'fake' } }, { ready: true, rounds: [2, 2, 1, 1, 1] }, { ok: true }, { ok: true }, { ok: true }, { ok: true }, { ok: true },
    ]);
    const rows = out[7].rows as Array<Record<string, unknown>>;
    expect(rows).toEqual([
      { id: 'a', backend: 'flash', msMedian: 4, msMin: 1, msMax: 7, peakBytes: 7, mask: 'none', error: null },
      { id: 'a', backend: 'cudnn', msMedian: 4, msMin: 1, msMax: 7, peakBytes: 7, mask: 'none', error: null },
      { id: 'a', backend: 'math', msMedian: null, msMin: null, msMax: null, peakBytes: null, mask: 'none', error: 'refused' },
    ]);
    expect(out[8]).toEqual({ rows });
    expect(out.slice(9)).toEqual([
      { ready: true, rounds: [1, 1] }, { ok: true }, { ok: true },
      { rows: [{ id: 'b', backend: 'math', msMedian: null, msMin: null, msMax: null, peakBytes: null, mask: 'none', error: 'refused' }] },
    ]);
    const turns = (id: string, sizes: number[]): string[] => sizes.flatMap((n) => [`time ${id} flash ${n}`, `time ${id} cudnn ${n}`]);
    expect(events).toEqual([
      // begin: prepared (inputs, memory run, warm-up) before any round; each round both timed in turn; end frees.
      'prepare a flash', 'prepare a cudnn', 'prepare a math', ...turns('a', [2, 2, 1, 1, 1]), 'gc', 'empty_cache',
      // the list request: the runner empties the cache after its cell, serve collects and empties it again.
      'prepare a flash', 'prepare a cudnn', 'prepare a math', ...turns('a', [2, 2, 1, 1, 1]), 'empty_cache', 'gc', 'empty_cache',
      'prepare b math', 'gc', 'empty_cache',
    ]);
  });

  test.each([
    ['round before begin', [round(0)], 'bad request: round before begin (no cell is open)'],
    ['end before begin', [end], 'bad request: end before begin (no cell is open)'],
    ['begin twice', [begin(cells[0], ['flash'], 3), begin(cells[1], ['flash'], 3)], "bad request: begin while cell 'a' is open: expected round 0"],
    ['a list request while a cell is open', [begin(cells[0], ['flash'], 3), round(0), { cells, ...settings(['flash'], 3) }],
      "bad request: a request while cell 'a' is open: expected round 1"],
    ['an index other than the next', [begin(cells[0], ['flash'], 20), round(0), round(2)], "bad request: round: expected index 1 (cell 'a' has 5 rounds) but got 2"],
    ['a round after the last', [begin(cells[0], ['flash'], 2), round(0), round(1), round(2)],
      "bad request: round: expected end (cell 'a' has 2 rounds, all done) but got index 2"],
    ['end before the last round', [begin(cells[0], ['flash'], 20), round(0), end], "bad request: end: expected round 1 first (cell 'a': 1 of 5 rounds done)"],
    ['begin without a cell', [{ op: 'begin', ...settings(['flash'], 3) }], 'bad request: begin: cell must be an object'],
    ['begin with a bad cell', [begin({ ...cells[0], dtype: 'float64' as TorchCell['dtype'] }, ['flash'], 3)], /^bad request: begin: cell: dtype must be one of /],
    ['begin with no repeats', [begin(cells[0], ['flash'], 0)], 'bad request: begin: repeats must be an integer >= 1 (got 0)'],
    ['a negative index', [begin(cells[0], ['flash'], 3), round(-1)], 'bad request: round: index must be an integer >= 0 (got -1)'],
    ['an unknown op', [{ op: 'pause' }], "bad request: op must be one of begin, round, end (got 'pause')"],
  ] as [string, object[], string | RegExp][])('--serve\'s cell requests out of order or malformed: %s gets {"error"} and exit 2 after the answers before it', (_name, lines, message) => {
    const { status, out } = serveLines([...lines, round(0), end]);
    expect(status).toBe(2);
    // The env line, one answer per line before the bad one, then the error: the line after it is never read.
    expect(out).toHaveLength(1 + lines.length);
    expect(out.slice(1, -1).every((o) => 'ready' in o || 'ok' in o)).toBe(true);
    const last = out[out.length - 1];
    expect(Object.keys(last)).toEqual(['error']);
    if (typeof message === 'string') expect(last.error).toBe(message);
    else expect(last.error).toMatch(message);
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
