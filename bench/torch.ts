/**
 * PyTorch SDPA baselines for `flash-attn-bench --compare torch`: runs bench/torch_sdpa.py in a
 * Python that has PyTorch, on the same shapes and dtypes as our cells, and returns its timings.
 *
 * The script runs as a worker (`--serve`): it imports PyTorch and checks CUDA once, writes one
 * `{"env": ...}` line, then answers request lines, one line each, freeing its GPU memory after each
 * request or cell. Two kinds of request: a list of cells (backends, warm-up, repeats), answered with
 * their rows ({@link TorchWorker.run}; {@link runTorchBaselines} asks a worker once); and one cell
 * timed in rounds the caller drives ({@link TorchWorker.begin}: a {@link TorchCellSession}, whose
 * `round(i)` times round i on each backend and whose `end()` gives the cell's rows). The bench opens
 * one worker ({@link openTorchWorker}) and times each cell in turns: our round 1, PyTorch's round 1,
 * our round 2, ... so that both sides of a cell run beside the same neighbours (the GPU's clocks and
 * power state drift with the kernels around a run). The script's docstring holds the contract
 * (inputs, causal alignment, timing, cache rotation, peak memory, the cell requests). It reports
 * progress as `progress <done> <total>` lines on stderr, per list request. Exit 3 with `{"error":
 * "..."}` means PyTorch or CUDA is not usable there; that becomes `{ available: false, reason }`, as
 * does every other way the worker can fail (no interpreter, a crash, a timeout, output that is not
 * the contract).
 *
 * Python: `opts.python`, else the environment variable FLASH_ATTN_BENCH_PYTHON, else `python3`.
 * @packageDocumentation
 */
import { ChildProcess, spawn } from 'child_process';
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

/** Why the worker gives no baselines: it could not start, failed, or was closed. */
export interface TorchUnavailable {
  /** Always false: no baselines (see `reason`). */
  available: false;
  /** The failure in a line (the script's own reason, an exit status with its stderr, a timeout...). */
  reason: string;
}

/** The baselines, or why there are none. */
export type TorchResult = { available: true; env: TorchEnv; rows: TorchRow[] } | TorchUnavailable;

/** Options of {@link openTorchWorker} and {@link runTorchBaselines}: every request of a worker uses them. */
export interface TorchOptions {
  backends: TorchBackend[];
  /** Untimed runs per cell and backend. */
  warmup: number;
  /** Then untimed runs until this many milliseconds have passed since the first (default 0). */
  warmupMs?: number;
  /**
   * Timed runs per cell and backend (the caller's default is 20 or more). A cell session splits them
   * into {@link TorchCellSession.rounds} as bench/runner.ts `timedRounds` splits ours.
   */
  repeats: number;
  /** Python interpreter; default: env FLASH_ATTN_BENCH_PYTHON, else `python3` on PATH. */
  python?: string;
  /**
   * Kill the script when starting it (importing PyTorch, checking CUDA) or answering one request
   * (a list of cells, or one begin, round or end of a cell session) takes longer than this many
   * milliseconds (default: no limit).
   */
  timeoutMs?: number;
  /** Seed for torch.randn (default 0). */
  seed?: number;
  /** Time causal Sq != Sk cells on flash/cudnn/efficient with a dense mask when no fused bottom-right mask exists (default false: error row). */
  allowMaterializedMask?: boolean;
  /** Called for each `progress <done> <total>` line the script prints (counted within the current list request; cell sessions print none). */
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

/** The answer's `env` object, checked field by field; throws an Error naming what is wrong. */
function validateEnv(answer: { [key: string]: Json }): TorchEnv {
  const e = answer.env;
  if (!isObject(e)) throw new Error('env is missing');
  return {
    torch: str(e, 'torch', 'env'), cuda: strOrNull(e, 'cuda', 'env'), cudnn: strOrNull(e, 'cudnn', 'env'),
    device: str(e, 'device', 'env'), capability: str(e, 'capability', 'env'), driver: strOrNull(e, 'driver', 'env'),
    python: str(e, 'python', 'env'),
  };
}

/** The answer's `rows`: exactly one per cell and backend asked for; throws an Error naming what is wrong. */
function validateRows(answer: { [key: string]: Json }, cells: readonly TorchCell[], backends: readonly TorchBackend[]): TorchRow[] {
  const list = answer.rows;
  if (!Array.isArray(list)) throw new Error('rows is not a list');
  const wanted = new Set<string>();
  for (const c of cells) for (const b of backends) wanted.add(`${c.id}\u0000${b}`);
  const rows: TorchRow[] = [];
  list.forEach((r, i) => {
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
  return rows;
}

/**
 * Checks the one-shot answer (`{"env": ..., "rows": [...]}`) against the contract and the request;
 * throws an Error naming what is wrong. The worker's env line and answer lines are checked by the
 * same rules, each for its own part.
 */
export function validateTorchOutput(value: unknown, cells: readonly TorchCell[], backends: readonly TorchBackend[]): { env: TorchEnv; rows: TorchRow[] } {
  const v = value as Json;
  if (!isObject(v)) throw new Error('the answer is not a JSON object');
  return { env: validateEnv(v), rows: validateRows(v, cells, backends) };
}

/**
 * The last stderr lines worth showing (progress lines are dropped; a Python traceback ends with the
 * exception), or a note that there were none.
 */
function stderrSummary(lines: string[]): string {
  const shown = lines.filter((l) => l.trim() !== '').slice(-STDERR_SHOW);
  return shown.length > 0 ? `stderr: ${shown.join(' | ')}` : 'nothing on stderr';
}

/** How long {@link TorchWorker.close} waits, by default, for the worker to exit after its stdin is closed, before killing it. */
export const TORCH_CLOSE_GRACE_MS = 10_000;

/** How long a script that broke the contract may take to exit (and finish its stderr) before it is killed. */
const MALFORMED_GRACE_MS = 1000;

/** What {@link ScriptProcess.nextLine} gives when its time ran out. */
const TIMED_OUT = Symbol('timed out');

/**
 * The process plumbing of the bridge: torch_sdpa.py running in `python`, its stdout as lines, its
 * stderr as progress (`progress <done> <total>`, to `onProgress`) and log lines (to `onLog`, and
 * the last {@link STDERR_KEEP} kept for error messages), and how it ended.
 */
class ScriptProcess {
  private readonly child: ChildProcess;
  private readonly lines: string[] = [];
  private stdoutPartial = '';
  private stderrPartial = '';
  private readonly stderrLines: string[] = [];
  /** Why it could not be started (set by the 'error' event). */
  private startFailure: string | null = null;
  /** Its exit status, once it has exited and its stdout and stderr are read to the end. */
  private exit: { code: number | null; signal: NodeJS.Signals | null } | null = null;
  /** Wakes the {@link nextLine} call waiting for a line or the end. */
  private wake: (() => void) | null = null;
  /** Resolves once the process has exited (or failed to start) and its output is all read. */
  readonly closed: Promise<void>;

  constructor(readonly python: string, script: string, args: string[], private readonly opts: Pick<TorchOptions, 'onProgress' | 'onLog'>) {
    // env given explicitly: the environment this module reads (a test runner's sandbox may hold its own copy).
    this.child = spawn(python, [script, ...args], { stdio: ['pipe', 'pipe', 'pipe'], env: process.env });
    this.child.stdout?.setEncoding('utf8');
    this.child.stdout?.on('data', (d: string) => {
      const parts = (this.stdoutPartial + d).split(/\r?\n/);
      this.stdoutPartial = parts.pop() ?? '';
      this.lines.push(...parts.filter((l) => l.trim() !== ''));
      if (parts.length > 0) this.wake?.();
    });
    this.child.stderr?.setEncoding('utf8');
    this.child.stderr?.on('data', (d: string) => {
      const parts = (this.stderrPartial + d).split(/\r?\n/);
      this.stderrPartial = parts.pop() ?? '';
      for (const line of parts) this.onStderrLine(line);
    });
    // The script may exit (no torch, a crash) before reading what we write: ignore EPIPE here; the exit says why.
    this.child.stdin?.on('error', () => undefined);
    this.child.on('error', (err: NodeJS.ErrnoException) => {
      this.startFailure ??= err.code === 'ENOENT'
        ? `${python} was not found (set FLASH_ATTN_BENCH_PYTHON)`
        : `could not run ${python}: ${err.message}`;
      this.wake?.();
    });
    this.closed = new Promise<void>((resolve) => {
      this.child.on('close', (code, signal) => {
        if (this.stderrPartial !== '') this.onStderrLine(this.stderrPartial);
        if (this.stdoutPartial.trim() !== '') this.lines.push(this.stdoutPartial);
        this.stderrPartial = this.stdoutPartial = '';
        this.exit = { code, signal };
        this.wake?.();
        resolve();
      });
    });
  }

  private onStderrLine(line: string): void {
    const m = /^progress (\d+) (\d+)$/.exec(line.trim());
    if (m) {
      this.opts.onProgress?.(Number(m[1]), Number(m[2]));
      return;
    }
    this.stderrLines.push(line);
    if (this.stderrLines.length > STDERR_KEEP) this.stderrLines.shift();
    this.opts.onLog?.(line);
  }

  /** Whether it has ended: exited, or never started. */
  get ended(): boolean {
    return this.exit !== null || this.startFailure !== null;
  }

  /** Writes one line on its stdin (lost, silently, if it has exited: the exit then says why). */
  send(line: string): void {
    if (!this.ended) this.child.stdin?.write(`${line}\n`);
  }

  /**
   * The next line it writes on stdout (blank lines skipped); null once it has ended with no line
   * left; {@link TIMED_OUT} when `timeoutMs` passes first (undefined: no limit).
   */
  async nextLine(timeoutMs?: number): Promise<string | null | typeof TIMED_OUT> {
    const deadline = timeoutMs === undefined ? Infinity : Date.now() + timeoutMs;
    for (;;) {
      const line = this.lines.shift();
      if (line !== undefined) return line;
      if (this.ended) return null;
      const left = deadline - Date.now();
      if (left <= 0) return TIMED_OUT;
      await new Promise<void>((resolve) => {
        const timer = Number.isFinite(left) ? setTimeout(resolve, left) : undefined;
        this.wake = () => {
          if (timer !== undefined) clearTimeout(timer);
          resolve();
        };
      });
      this.wake = null;
    }
  }

  /** Kills it at once (SIGKILL), unless it has already ended. */
  kill(): void {
    if (!this.ended) this.child.kill('SIGKILL');
  }

  /** Closes its stdin (EOF: the worker's signal to exit), waits up to `graceMs` for it to exit, then kills it. */
  async stop(graceMs: number): Promise<void> {
    if (!this.ended) this.child.stdin?.end();
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(true), graceMs);
    });
    const killed = await Promise.race([this.closed.then(() => false), late]);
    clearTimeout(timer);
    if (killed) {
      this.kill();
      await this.closed;
    }
  }

  /** The kept stderr lines, for an error message ({@link stderrSummary}). */
  stderrSummary(): string {
    return stderrSummary(this.stderrLines);
  }

  /**
   * Why it ended, once {@link closed} has resolved: it did not start; exit 3 with its `{"error": ...}`
   * line (`scriptError`): that message; another exit status or a signal; else (exit 0) `missing`,
   * what the caller was still waiting for.
   */
  endReason(scriptError: string | null, missing: string): string {
    if (this.startFailure !== null) return this.startFailure;
    const { code, signal } = this.exit ?? { code: null, signal: null };
    if (code === EXIT_UNAVAILABLE && scriptError !== null) return scriptError;
    if (code !== 0) {
      const how = signal !== null ? `was killed by ${signal}` : `exited with status ${code}`;
      return `${this.python} ${SCRIPT} ${how}${scriptError !== null ? `: ${scriptError}` : ''} (${this.stderrSummary()})`;
    }
    return `${SCRIPT} gave malformed output: ${scriptError !== null ? `exit 0 after an error: ${scriptError}` : missing} (${this.stderrSummary()})`;
  }
}

/**
 * The next JSON object the script writes on stdout, or why there is none: it ended (exit 3 with
 * its reason, a crash, no output), it wrote `{"error": ...}` (then it exits: its status decides the
 * reason), it wrote something that is not a JSON object (it is killed), or `timeoutMs` passed (it
 * is killed). `missing` names what was awaited, for an exit 0 without it.
 */
async function readObject(proc: ScriptProcess, timeoutMs: number | undefined, missing: string): Promise<{ value: { [key: string]: Json } } | { reason: string }> {
  const line = await proc.nextLine(timeoutMs);
  if (line === TIMED_OUT) {
    proc.kill();
    return { reason: `${SCRIPT} did not finish within ${timeoutMs} ms (${proc.stderrSummary()})` };
  }
  if (line === null) {
    await proc.closed;
    return { reason: proc.endReason(null, missing) };
  }
  let value: Json;
  try {
    value = JSON.parse(line) as Json;
  } catch (e) {
    return { reason: await malformed(proc, `output is not JSON (${(e as Error).message})`) };
  }
  if (!isObject(value)) return { reason: await malformed(proc, 'the answer is not a JSON object') };
  if (typeof value.error === 'string') {
    // The script exits after its error line; its exit status says which failure it was.
    await proc.stop(TORCH_CLOSE_GRACE_MS);
    return { reason: proc.endReason(value.error, missing) };
  }
  return { value };
}

/**
 * Stops a script that broke the contract (stdin closed, killed after {@link MALFORMED_GRACE_MS})
 * and gives the reason, with its stderr up to its end: a script that printed garbage is often
 * about to print the traceback that explains it.
 */
async function malformed(proc: ScriptProcess, what: string): Promise<string> {
  await proc.stop(MALFORMED_GRACE_MS);
  return `${SCRIPT} gave malformed output: ${what} (${proc.stderrSummary()})`;
}

/**
 * One cell timed in rounds that the caller drives, on a worker ({@link TorchWorker.begin}): the cell
 * is prepared on each backend (inputs, memory run, warm-up) when the session starts; then
 * `round(0)`, `round(1)`, ... up to `rounds.length - 1`, each once and in order, each timing that
 * round's repeats on every backend in turn; then `end()` gives the cell's rows and frees its memory.
 * Between two rounds the caller times its own round of the cell, so that both sides take turns.
 * While a session is open the worker takes no other request. A worker failure (crash, timeout,
 * output outside the contract) gives `{ available: false, reason }` and ends the session and the
 * worker; calls out of order reject with an Error and send nothing.
 */
export interface TorchCellSession {
  /** The cell being timed. */
  readonly cell: TorchCell;
  /**
   * Repeats per round, as the worker split the options' `repeats` (the same split as bench/runner.ts
   * `timedRounds`: at equal repeats, ours and PyTorch's rounds are the same size).
   */
  readonly rounds: readonly number[];
  /**
   * Times round `index` (the next one: 0, 1, ...) on each backend in turn; resolves once the round
   * is done. Rejects (nothing sent) for an index other than the next round's or after `end()`.
   */
  round(index: number): Promise<{ available: true } | TorchUnavailable>;
  /**
   * The cell's rows (one per backend, as {@link TorchWorker.run} gives them), once every round is
   * done; the worker then frees the cell's memory and takes other requests. Rejects (nothing sent)
   * before the last round or when called twice.
   */
  end(): Promise<TorchResult>;
}

/** A started {@link TorchCellSession}, or why the worker could not start one. */
export type TorchCellBegin = { available: true; session: TorchCellSession } | TorchUnavailable;

/**
 * A running `torch_sdpa.py --serve`: PyTorch imported and CUDA checked once, then any number of
 * requests, each timed when it is asked for (the bench times each cell in a {@link
 * TorchCellSession}, its rounds taking turns with ours, so that both sides of a cell see the same
 * GPU clocks and power state). Requests queue behind each other. Made by {@link openTorchWorker};
 * {@link TorchWorker.close} it when done.
 */
export interface TorchWorker {
  /** Where the baselines run (the worker's env line). */
  readonly env: TorchEnv;
  /**
   * Times `cells` on each of the options' backends (one request). Rows as {@link
   * runTorchBaselines} gives them. Never resolves with an exception for the worker's failures: when
   * it crashes, times out (`timeoutMs`, per request) or answers outside the contract, the result is
   * `{ available: false, reason }`, the worker is dead, and every later request gives the same
   * reason. Rejects (nothing sent) while a cell session is open.
   */
  run(cells: readonly TorchCell[]): Promise<TorchResult>;
  /**
   * Starts a {@link TorchCellSession} on `cell`: the worker prepares it on each backend and says how
   * the repeats split into rounds. A backend that cannot run the cell keeps its error row for
   * `end()`. Failures as {@link run}; rejects (nothing sent) while another session is open.
   */
  begin(cell: TorchCell): Promise<TorchCellBegin>;
  /**
   * Closes the worker's stdin (its signal to exit), waits up to `graceMs` (default
   * {@link TORCH_CLOSE_GRACE_MS}) for it to exit, then kills it. Later requests give `{ available:
   * false }`. Safe to call more than once, and on a dead worker.
   */
  close(graceMs?: number): Promise<void>;
}

/** A started {@link TorchWorker}, or why none could start (the reasons {@link runTorchBaselines} gives). */
export type TorchWorkerOpen = { available: true; worker: TorchWorker } | TorchUnavailable;

/** The settings every request of a worker carries, as the script's docstring spells them. */
function requestSettings(opts: TorchOptions): { [key: string]: Json } {
  return {
    backends: opts.backends, warmup: opts.warmup, warmupMs: opts.warmupMs ?? 0, repeats: opts.repeats, seed: opts.seed ?? 0,
    allowMaterializedMask: opts.allowMaterializedMask ?? false,
  };
}

/** The request line for `cells`, as the script's docstring spells it. */
function requestLine(cells: readonly TorchCell[], opts: TorchOptions): string {
  return JSON.stringify({ cells, ...requestSettings(opts) });
}

/** The begin line of a cell session on `cell`. */
function beginLine(cell: TorchCell, opts: TorchOptions): string {
  return JSON.stringify({ op: 'begin', cell, ...requestSettings(opts) });
}

/** The answer to a begin: `{"ready": true, "rounds": [...]}`, rounds summing to `repeats`; throws an Error naming what is wrong. */
function validateReady(answer: { [key: string]: Json }, repeats: number): number[] {
  if (answer.ready !== true) throw new Error(`the answer to begin has ready ${JSON.stringify(answer.ready ?? null)}, expected true`);
  const rounds = answer.rounds;
  if (!Array.isArray(rounds) || rounds.length === 0 || !rounds.every((n) => typeof n === 'number' && Number.isInteger(n) && n >= 0)) {
    throw new Error(`the answer to begin has rounds ${JSON.stringify(rounds ?? null)}, expected a non-empty list of integers >= 0`);
  }
  const sum = (rounds as number[]).reduce((a, b) => a + b, 0);
  if (sum !== repeats) throw new Error(`the answer to begin has rounds ${JSON.stringify(rounds)} (${sum} repeats), expected ${repeats} repeats`);
  return rounds as number[];
}

/** The answer to a round: `{"ok": true}`; throws an Error naming what is wrong. */
function validateRoundDone(answer: { [key: string]: Json }, index: number): void {
  if (answer.ok !== true) throw new Error(`the answer to round ${index} is ${JSON.stringify(answer)}, expected {"ok": true}`);
}

class Worker implements TorchWorker {
  /** Why requests give no baselines any more (a failure, or close()); null while the worker serves. */
  private dead: string | null = null;
  /** The last request asked for: the next one starts after it. */
  private queue: Promise<unknown> = Promise.resolve();
  /** The cell whose session has begun and not ended (nor been cut short by the worker's end). */
  private openCell: TorchCell | null = null;

  constructor(private readonly proc: ScriptProcess, readonly env: TorchEnv, private readonly opts: TorchOptions) {}

  async run(cells: readonly TorchCell[]): Promise<TorchResult> {
    this.refuseWhileOpen('run');
    return this.ask(requestLine(cells, this.opts), 'no answer to a request',
      (answer) => ({ available: true, env: this.env, rows: validateRows(answer, cells, this.opts.backends) }));
  }

  async begin(cell: TorchCell): Promise<TorchCellBegin> {
    this.refuseWhileOpen('begin');
    if (this.dead === null) this.openCell = cell;
    let rounds: readonly number[] = [];
    let next = 0;
    let ended = false;
    /** Why a call on this cell is out of order (at call time, so that calls not awaited count too), or null. */
    const outOfOrder = (call: string): string | null => {
      if (ended) return `${call}: the session of cell ${cell.id} has ended`;
      if (call === 'end' && next < rounds.length) return `end: expected round ${next} first (${next} of the cell's ${rounds.length} rounds done)`;
      return null;
    };
    const session: TorchCellSession = {
      cell,
      get rounds() {
        return rounds;
      },
      round: async (index) => {
        if (this.dead !== null) return { available: false, reason: this.dead };
        const problem = outOfOrder(`round(${index})`) ?? (next >= rounds.length
          ? `round: expected end (all ${rounds.length} rounds done) but received round ${index}`
          : index !== next ? `round: expected index ${next} (the cell has ${rounds.length} rounds) but received ${index}` : null);
        if (problem !== null) throw new Error(problem);
        next += 1;
        return this.ask(JSON.stringify({ op: 'round', index }), `no answer to round ${index}`, (answer) => {
          validateRoundDone(answer, index);
          return { available: true as const };
        });
      },
      end: async () => {
        if (this.dead !== null) return { available: false, reason: this.dead };
        const problem = outOfOrder('end');
        if (problem !== null) throw new Error(problem);
        ended = true;
        this.openCell = null;
        return this.ask(JSON.stringify({ op: 'end' }), 'no answer to end',
          (answer) => ({ available: true, env: this.env, rows: validateRows(answer, [cell], this.opts.backends) }));
      },
    };
    return this.ask(beginLine(cell, this.opts), 'no answer to begin', (answer) => {
      rounds = validateReady(answer, this.opts.repeats);
      return { available: true, session };
    });
  }

  /** Throws when a cell session is open: the script takes nothing but its rounds and end then. */
  private refuseWhileOpen(call: 'run' | 'begin'): void {
    if (this.dead === null && this.openCell !== null) {
      throw new Error(`${call}: expected no open cell session but cell ${this.openCell.id}'s is open (end it first)`);
    }
  }

  /**
   * Sends `line` once the requests before it are answered and reads its answer, which `accept`
   * turns into the result (throwing an Error where it breaks the contract). A dead worker sends
   * nothing; a failure kills it. The one path of every request.
   */
  private ask<T>(line: string, missing: string, accept: (answer: { [key: string]: Json }) => T): Promise<T | TorchUnavailable> {
    const result = this.queue.then(async (): Promise<T | TorchUnavailable> => {
      if (this.dead !== null) return { available: false, reason: this.dead };
      this.proc.send(line);
      const answer = await readObject(this.proc, this.opts.timeoutMs, missing);
      if ('reason' in answer) return this.die(answer.reason);
      try {
        return accept(answer.value);
      } catch (e) {
        return this.die(await malformed(this.proc, (e as Error).message));
      }
    });
    this.queue = result.then(() => undefined, () => undefined);
    return result;
  }

  /** Marks the worker dead (the first reason sticks); an open cell session ends with it. */
  private die(reason: string): TorchUnavailable {
    this.dead ??= reason;
    this.openCell = null;
    return { available: false, reason: this.dead };
  }

  async close(graceMs: number = TORCH_CLOSE_GRACE_MS): Promise<void> {
    this.die(`the PyTorch worker (${SCRIPT} --serve) was closed`);
    await this.proc.stop(graceMs);
  }
}

/**
 * Starts `torch_sdpa.py --serve` and waits for its env line (PyTorch imported, CUDA checked), at
 * most `opts.timeoutMs`. Never throws for a missing or broken Python/PyTorch: those come back as `{
 * available: false, reason }`, with the texts {@link runTorchBaselines} uses. `opts` also holds
 * what every request of the worker uses (backends, warm-up, repeats, seed, materialized masks) and
 * the progress and log callbacks, which see every request's stderr.
 */
export async function openTorchWorker(opts: TorchOptions): Promise<TorchWorkerOpen> {
  const script = findTorchScript();
  if (script === null) return { available: false, reason: `${SCRIPT} was not found next to ${__dirname} or in a bench/ folder above it` };
  const envPython = process.env.FLASH_ATTN_BENCH_PYTHON;
  const python = opts.python ?? (envPython !== undefined && envPython !== '' ? envPython : 'python3');
  const proc = new ScriptProcess(python, script, ['--serve'], opts);
  const first = await readObject(proc, opts.timeoutMs, 'no output');
  if ('reason' in first) return { available: false, reason: first.reason };
  let env: TorchEnv;
  try {
    env = validateEnv(first.value);
  } catch (e) {
    return { available: false, reason: await malformed(proc, (e as Error).message) };
  }
  return { available: true, worker: new Worker(proc, env, opts) };
}

/**
 * Runs PyTorch SDPA on `cells` with each of `opts.backends`, in one Python process: a worker
 * ({@link openTorchWorker}) asked once, then closed. Never throws for a missing or broken
 * Python/PyTorch: those come back as `{ available: false, reason }`. Rows come back in the script's
 * order (cell by cell, backends in the requested order), one per cell and backend; a backend that
 * cannot run a cell gives a row with `error` set.
 */
export async function runTorchBaselines(cells: TorchCell[], opts: TorchOptions): Promise<TorchResult> {
  const opened = await openTorchWorker(opts);
  if (!opened.available) return opened;
  try {
    return await opened.worker.run(cells);
  } finally {
    await opened.worker.close();
  }
}
