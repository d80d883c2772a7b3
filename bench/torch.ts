/**
 * PyTorch SDPA baselines for `flash-attn-bench --compare torch`: runs bench/torch_sdpa.py in a
 * Python that has PyTorch, on the same shapes and dtypes as our cells, and returns its timings.
 *
 * The script reads one JSON request on stdin and writes one JSON object on stdout (its docstring
 * holds the contract: inputs, causal alignment, timing, cache rotation, peak memory). It reports
 * progress as `progress <done> <total>` lines on stderr. Exit 3 with `{"error": "..."}` means
 * PyTorch or CUDA is not usable there; that becomes `{ available: false, reason }`, as does every
 * other way the run can fail (no interpreter, a crash, a timeout, output that is not the contract).
 *
 * Python: `opts.python`, else the environment variable FLASH_ATTN_BENCH_PYTHON, else `python3`.
 * @packageDocumentation
 */
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import type { ReferenceShape } from '../lib';
import type { Pass } from './flops';

/** One problem for PyTorch, in our terms: q is [batch, seqlenQ, headsQ, headDim], k and v [batch, seqlenK, headsKV, headDim]. */
export interface TorchCell extends ReferenceShape {
  /** Caller's key for matching rows to cells; unique within a request. */
  id: string;
  /** Causal with our (FA2's) bottom-right alignment; see {@link TorchRow.mask}. */
  causal: boolean;
  dtype: 'float32' | 'float16' | 'bfloat16';
  pass: Pass;
}

/** SDPA backends, as `torch.nn.attention.SDPBackend` names them: FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION, MATH. */
export type TorchBackend = 'flash' | 'cudnn' | 'efficient' | 'math';

/** The SDPA backends in the order the script runs them. */
export const TORCH_BACKENDS: readonly TorchBackend[] = ['flash', 'cudnn', 'efficient', 'math'];

/**
 * How a causal mask reached SDPA: `none` (not causal); `causal` (is_causal=True with seqlenQ ===
 * seqlenK, where top-left and bottom-right agree); `lower_right_fused` (causal_lower_right served by
 * the flash or memory-efficient kernel's own bottom-right causal mask); `lower_right_materialized`
 * (a dense [Sq, Sk] boolean mask: no causal block skipping, not comparable with a causal kernel;
 * math always, the fused backends only when allowed); `lower_right` (causal_lower_right, dispatch not
 * predictable in this PyTorch); null when the row failed before the mask was chosen.
 */
export type TorchMask = 'none' | 'causal' | 'lower_right_fused' | 'lower_right_materialized' | 'lower_right';

/** One cell on one backend. */
export interface TorchRow {
  id: string;
  backend: TorchBackend;
  /** Milliseconds from CUDA events around each repeat; NaN when `error` is set. */
  msMedian: number;
  msMin: number;
  msMax: number;
  /** Bytes allocated above the inputs (and saved forward) during one repeat; NaN when `error` is set. */
  peakBytes: number;
  mask: TorchMask | null;
  /** Why the backend could not run the cell (PyTorch's message on one line, or "out of memory"); null on success. */
  error: string | null;
}

/** Where the baselines ran. */
export interface TorchEnv {
  torch: string;
  cuda: string | null;
  cudnn: string | null;
  device: string;
  /** Compute capability, e.g. "9.0". */
  capability: string;
  /** Driver version from nvidia-smi (else the CUDA version the driver supports, as "CUDA 13.0 driver"), or null. */
  driver: string | null;
  python: string;
}

/** The baselines, or why there are none. */
export type TorchResult = { available: true; env: TorchEnv; rows: TorchRow[] } | { available: false; reason: string };

/** Options of {@link runTorchBaselines}. */
export interface TorchOptions {
  backends: TorchBackend[];
  /** Untimed runs per cell and backend. */
  warmup: number;
  /** Then untimed runs until this many milliseconds have passed since the first (default 0). */
  warmupMs?: number;
  /** Timed runs per cell and backend (the caller's default is 20 or more). */
  repeats: number;
  /** Python interpreter; default: env FLASH_ATTN_BENCH_PYTHON, else `python3` on PATH. */
  python?: string;
  /** Kill the script after this long (default: no limit). */
  timeoutMs?: number;
  /** Seed for torch.randn (default 0). */
  seed?: number;
  /** Time causal Sq != Sk cells on flash/cudnn/efficient with a dense mask when no fused bottom-right mask exists (default false: error row). */
  allowMaterializedMask?: boolean;
  /** Called for each `progress <done> <total>` line the script prints. */
  onProgress?: (done: number, total: number) => void;
  /** Called with every other stderr line (PyTorch warnings, diagnostics). */
  onLog?: (line: string) => void;
}

/** Exit status with which torch_sdpa.py says that PyTorch or CUDA is unusable. */
const EXIT_UNAVAILABLE = 3;
const SCRIPT = 'torch_sdpa.py';
/** stderr lines kept for error messages (the most recent). */
const STDERR_KEEP = 200;
const STDERR_SHOW = 8;

/**
 * Finds bench/torch_sdpa.py: next to this file (the sources, or a dist/bench/ that ships it), else
 * in a `bench/` folder of this directory's ancestors (dist/bench/ → <package root>/bench/).
 * Returns null when there is none.
 */
export function findTorchScript(from: string = __dirname): string | null {
  const direct = path.join(from, SCRIPT);
  if (fs.existsSync(direct)) return direct;
  let dir = path.dirname(from);
  for (let i = 0; i < 4; i++) {
    const candidate = path.join(dir, 'bench', SCRIPT);
    if (fs.existsSync(candidate)) return candidate;
    const up = path.dirname(dir);
    if (up === dir) break;
    dir = up;
  }
  return null;
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

function isObject(v: Json | undefined): v is { [key: string]: Json } {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(o: { [key: string]: Json }, key: string, where: string): string {
  const v = o[key];
  if (typeof v !== 'string') throw new Error(`${where}.${key} is not a string`);
  return v;
}

function strOrNull(o: { [key: string]: Json }, key: string, where: string): string | null {
  const v = o[key];
  if (v !== null && typeof v !== 'string') throw new Error(`${where}.${key} is neither a string nor null`);
  return v;
}

/** A finite number >= 0; null (error rows) becomes NaN. */
function measure(o: { [key: string]: Json }, key: string, where: string, failed: boolean): number {
  const v = o[key];
  if (failed && (v === null || v === undefined)) return NaN;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new Error(`${where}.${key} is not a number >= 0`);
  return v;
}

const MASKS: readonly TorchMask[] = ['none', 'causal', 'lower_right_fused', 'lower_right_materialized', 'lower_right'];

/** Checks the script's answer against the contract and the request; throws an Error naming what is wrong. */
export function validateTorchOutput(value: unknown, cells: readonly TorchCell[], backends: readonly TorchBackend[]): { env: TorchEnv; rows: TorchRow[] } {
  const v = value as Json;
  if (!isObject(v)) throw new Error('the answer is not a JSON object');
  const e = v.env;
  if (!isObject(e)) throw new Error('env is missing');
  const env: TorchEnv = {
    torch: str(e, 'torch', 'env'), cuda: strOrNull(e, 'cuda', 'env'), cudnn: strOrNull(e, 'cudnn', 'env'),
    device: str(e, 'device', 'env'), capability: str(e, 'capability', 'env'), driver: strOrNull(e, 'driver', 'env'),
    python: str(e, 'python', 'env'),
  };
  if (!Array.isArray(v.rows)) throw new Error('rows is not a list');
  const wanted = new Set<string>();
  for (const c of cells) for (const b of backends) wanted.add(`${c.id}\u0000${b}`);
  const rows: TorchRow[] = [];
  v.rows.forEach((r, i) => {
    const where = `rows[${i}]`;
    if (!isObject(r)) throw new Error(`${where} is not an object`);
    const id = str(r, 'id', where);
    const backend = str(r, 'backend', where);
    if (!(TORCH_BACKENDS as readonly string[]).includes(backend)) throw new Error(`${where}.backend "${backend}" is unknown`);
    const key = `${id}\u0000${backend}`;
    if (!wanted.has(key)) throw new Error(`${where} (${id}, ${backend}) was not asked for, or is repeated`);
    wanted.delete(key);
    const error = strOrNull(r, 'error', where);
    const mask = r.mask === undefined ? null : strOrNull(r, 'mask', where);
    if (mask !== null && !(MASKS as readonly string[]).includes(mask)) throw new Error(`${where}.mask "${mask}" is unknown`);
    const failed = error !== null;
    rows.push({
      id, backend: backend as TorchBackend, msMedian: measure(r, 'msMedian', where, failed), msMin: measure(r, 'msMin', where, failed),
      msMax: measure(r, 'msMax', where, failed), peakBytes: measure(r, 'peakBytes', where, failed), mask: mask as TorchMask | null, error,
    });
  });
  if (wanted.size > 0) {
    const [id, backend] = [...wanted][0].split('\u0000');
    throw new Error(`${wanted.size} cell/backend pair(s) have no row, e.g. (${id}, ${backend})`);
  }
  return { env, rows };
}

/**
 * The last stderr lines worth showing (progress lines are dropped; a Python traceback ends with the
 * exception), or a note that there were none.
 */
function stderrSummary(lines: string[]): string {
  const shown = lines.filter((l) => l.trim() !== '').slice(-STDERR_SHOW);
  return shown.length > 0 ? `stderr: ${shown.join(' | ')}` : 'nothing on stderr';
}

/**
 * Runs PyTorch SDPA on `cells` with each of `opts.backends`, in one Python process. Never throws for
 * a missing or broken Python/PyTorch: those come back as `{ available: false, reason }`. Rows come
 * back in the script's order (cell by cell, backends in the requested order), one per cell and
 * backend; a backend that cannot run a cell gives a row with `error` set.
 */
export async function runTorchBaselines(cells: TorchCell[], opts: TorchOptions): Promise<TorchResult> {
  const script = findTorchScript();
  if (script === null) return { available: false, reason: `${SCRIPT} was not found next to ${__dirname} or in a bench/ folder above it` };
  const envPython = process.env.FLASH_ATTN_BENCH_PYTHON;
  const python = opts.python ?? (envPython !== undefined && envPython !== '' ? envPython : 'python3');
  const request = JSON.stringify({
    cells, backends: opts.backends, warmup: opts.warmup, warmupMs: opts.warmupMs ?? 0, repeats: opts.repeats, seed: opts.seed ?? 0,
    allowMaterializedMask: opts.allowMaterializedMask ?? false,
  });

  return new Promise<TorchResult>((resolve) => {
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    const finish = (r: TorchResult): void => {
      if (settled) return;
      settled = true;
      if (timer !== undefined) clearTimeout(timer);
      resolve(r);
    };

    // env given explicitly: the environment this module reads (a test runner's sandbox may hold its own copy).
    const child = spawn(python, [script], { stdio: ['pipe', 'pipe', 'pipe'], env: process.env });
    const stdout: Buffer[] = [];
    const stderrLines: string[] = [];
    let partial = '';
    const onLine = (line: string): void => {
      const m = /^progress (\d+) (\d+)$/.exec(line.trim());
      if (m) {
        opts.onProgress?.(Number(m[1]), Number(m[2]));
        return;
      }
      stderrLines.push(line);
      if (stderrLines.length > STDERR_KEEP) stderrLines.shift();
      opts.onLog?.(line);
    };
    child.stdout.on('data', (d: Buffer) => stdout.push(d));
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d: string) => {
      const parts = (partial + d).split(/\r?\n/);
      partial = parts.pop() ?? '';
      for (const line of parts) onLine(line);
    });
    // The script may exit (no torch) before reading all of the request: ignore EPIPE here; the exit says why.
    child.stdin.on('error', () => undefined);

    child.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') {
        finish({ available: false, reason: `${python} was not found (set FLASH_ATTN_BENCH_PYTHON)` });
      } else {
        finish({ available: false, reason: `could not run ${python}: ${err.message}` });
      }
    });

    if (opts.timeoutMs !== undefined) {
      timer = setTimeout(() => {
        child.kill('SIGKILL');
        finish({ available: false, reason: `${SCRIPT} did not finish within ${opts.timeoutMs} ms (${stderrSummary(stderrLines)})` });
      }, opts.timeoutMs);
    }

    child.on('close', (code, signal) => {
      if (partial !== '') onLine(partial);
      partial = '';
      const text = Buffer.concat(stdout).toString('utf8').trim();
      let parsed: unknown;
      let parseError: string | null = null;
      try {
        parsed = JSON.parse(text);
      } catch (e) {
        parseError = text === '' ? 'no output' : `output is not JSON (${(e as Error).message})`;
      }
      const scriptError = isObject(parsed as Json) && typeof (parsed as { error?: unknown }).error === 'string'
        ? (parsed as { error: string }).error : null;
      if (code === EXIT_UNAVAILABLE && scriptError !== null) {
        finish({ available: false, reason: scriptError });
        return;
      }
      if (code !== 0) {
        const how = signal !== null ? `was killed by ${signal}` : `exited with status ${code}`;
        finish({ available: false, reason: `${python} ${SCRIPT} ${how}${scriptError !== null ? `: ${scriptError}` : ''} (${stderrSummary(stderrLines)})` });
        return;
      }
      if (parseError !== null) {
        finish({ available: false, reason: `${SCRIPT} gave malformed output: ${parseError} (${stderrSummary(stderrLines)})` });
        return;
      }
      try {
        finish({ available: true, ...validateTorchOutput(parsed, cells, opts.backends) });
      } catch (e) {
        finish({ available: false, reason: `${SCRIPT} gave malformed output: ${(e as Error).message} (${stderrSummary(stderrLines)})` });
      }
    });

    child.stdin.end(request);
  });
}
