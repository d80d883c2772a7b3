/**
 * Runs the cells: ours (and our naive CUDA kernel) in this process, PyTorch's SDPA through
 * bench/torch.ts, and turns everything into one kind of row.
 *
 * Method, the same for every implementation: inputs random in [-1, 1) (never zeros), made once per
 * shape; one untimed run that measures peak memory above what was live before it (the inputs, and
 * for the backward the forward's out and lse); `warmup` more untimed runs, and more until `warmupMs`
 * have passed (in doubling batches, as bench/torch_sdpa.py); then `repeats` runs timed by
 * {@link timeRepeatsOnDevice}: on CUDA queued back to back, each between its own pair of CUDA events,
 * as bench/torch_sdpa.py times SDPA (so neither side counts host work that overlaps the GPU's); on
 * the CPU, host time until each run finished. Where a cell has more than one of our rows (backward
 * variants, --compare naive), their timed runs take turns in the rounds of {@link timedRounds}; with
 * the round hooks of {@link RunHooks} (where the CLI times PyTorch's round of the same cell between
 * ours) every cell is timed in those rounds. Median, min and max are reported.
 * @packageDocumentation
 */
import { backends, flashAttention, flashAttentionBackward, memory, resetPeakMemory, synchronize, Tensor } from '../lib';
import type { AttentionKernel, AttentionOutput, BackwardAlgorithm, Device, DType, KernelPlan } from '../lib';
import { timeRepeatsOnDevice } from '../lib/timing';
import { tflopsPerSecond } from './flops';
import { BenchCell, BwdVariant, GridSettings, groupByInputs } from './grid';
import type { TorchBackend, TorchResult } from './torch';

/**
 * Who computed a row. 'ours' runs the backward with algorithm 'auto' (two kernels on Hopper for
 * fp16/bf16, else the single kernel); the ours-* variants (--variants) pin it:
 * 'ours-single-kernel' the single kernel with atomic dQ, 'ours-deterministic' the single kernel's
 * deterministic mode, 'ours-two-kernel' the two kernels, 'ours-auto-deterministic' 'auto' with
 * deterministic: true.
 */
export type Impl =
  | 'ours' | 'ours-single-kernel' | 'ours-deterministic' | 'ours-two-kernel' | 'ours-auto-deterministic'
  | 'naive' | 'torch-flash' | 'torch-cudnn' | 'torch-efficient' | 'torch-math';

/** Implementations in report order (also the chart's series order). */
export const IMPLS: readonly Impl[] = [
  'ours', 'ours-single-kernel', 'ours-deterministic', 'ours-two-kernel', 'ours-auto-deterministic', 'naive', 'torch-flash', 'torch-cudnn', 'torch-efficient', 'torch-math',
];

/**
 * What each --variants entry runs: its rows' impl and the backward options beside our kernel and
 * mask. 'deterministic' pins the single kernel ('auto' with deterministic: true may pick the two
 * kernels on Hopper, which are deterministic by construction); 'auto-deterministic' is that choice.
 */
export const BWD_VARIANT_RUNS: Readonly<Record<BwdVariant, { impl: Impl; options: { algorithm: BackwardAlgorithm; deterministic?: boolean } }>> = {
  'single-kernel': { impl: 'ours-single-kernel', options: { algorithm: 'single-kernel' } },
  deterministic: { impl: 'ours-deterministic', options: { algorithm: 'single-kernel', deterministic: true } },
  'two-kernel': { impl: 'ours-two-kernel', options: { algorithm: 'two-kernel' } },
  'auto-deterministic': { impl: 'ours-auto-deterministic', options: { algorithm: 'auto', deterministic: true } },
};

/** Our backward variants: measured beside 'ours' and compared with each other, not with 'ours'. */
export const OUR_VARIANTS: readonly Impl[] = Object.values(BWD_VARIANT_RUNS).map((v) => v.impl);

/** Human names for tables and the chart legend. */
export const IMPL_LABELS: Readonly<Record<Impl, string>> = {
  ours: 'ours', 'ours-single-kernel': 'ours (single-kernel bwd)', 'ours-deterministic': 'ours (single-kernel deterministic bwd)',
  'ours-two-kernel': 'ours (two-kernel bwd)', 'ours-auto-deterministic': 'ours (deterministic bwd)', naive: 'naive', 'torch-flash': 'torch flash',
  'torch-cudnn': 'torch cuDNN', 'torch-efficient': 'torch efficient', 'torch-math': 'torch math',
};

/**
 * Per-cell time ratios between our backward variants (on bwd and fwdbwd cells):
 * 'single-kernel/two-kernel' is the single kernel's (atomic dQ) time ÷ the two kernels' (above 1:
 * the two kernels are faster); 'deterministic/single-kernel' is the single kernel's deterministic
 * time ÷ its atomic time (what determinism costs); 'auto-deterministic/auto' is the time of 'auto'
 * with deterministic: true ÷ that of "ours" (what asking for determinism costs a caller).
 */
export type VariantRatio = 'single-kernel/two-kernel' | 'deterministic/single-kernel' | 'auto-deterministic/auto';

/** A backward a row measured: which of {@link VariantRatio}'s sides it can stand for. */
type BwdRole = 'single-kernel' | 'deterministic' | 'two-kernel' | 'auto-deterministic' | 'auto';

/** Each variant ratio's numerator and denominator, in report order. */
export const VARIANT_RATIOS: readonly { key: VariantRatio; over: BwdRole; under: BwdRole }[] = [
  { key: 'single-kernel/two-kernel', over: 'single-kernel', under: 'two-kernel' },
  { key: 'deterministic/single-kernel', over: 'deterministic', under: 'single-kernel' },
  { key: 'auto-deterministic/auto', over: 'auto-deterministic', under: 'auto' },
];

/**
 * ok: measured. oom: the device ran out of memory (the run goes on). error: the implementation
 * could not run the cell (the message says why).
 */
export type RowStatus = 'ok' | 'oom' | 'error';

/** One cell on one implementation. Measurements are null unless status is 'ok'. */
export interface BenchRow extends BenchCell {
  impl: Impl;
  /** Where it ran. */
  device: Device;
  /** Our kernel ('flash' or 'naive'; 'auto' resolved), or null for PyTorch rows. */
  kernel: string | null;
  /**
   * Our backward's structure that ran ('single-kernel' or 'two-kernel', from the result's
   * `algorithm`; 'auto' resolved) on bwd and fwdbwd cells; for a failed row, the one asked for if
   * not 'auto'; null for forward cells and PyTorch rows.
   */
  algorithm: string | null;
  /**
   * Ours (and naive) measured rows: the kernel family and configuration that ran, from the results'
   * `plan` ({@link describePlan}; a fwdbwd cell names the forward's and the backward's). Absent on
   * PyTorch rows and failed rows.
   */
  plan?: string;
  status: RowStatus;
  msMedian: number | null;
  msMin: number | null;
  msMax: number | null;
  /** FA2's FLOP count / median time. */
  tflops: number | null;
  /**
   * Rows that ran on a GPU: tflops as a percentage of the GPU's dense peak for the dtype; null when
   * the peak is unknown or the row failed. Absent on rows that ran on the CPU (no peak applies).
   */
  pctPeak?: number | null;
  /** Peak device memory above the inputs during one run, bytes. */
  peakBytes: number | null;
  /** Why status is not 'ok'. */
  error: string | null;
  /** PyTorch rows only: how the causal mask reached SDPA (bench/torch.ts). Absent on our rows. */
  mask?: string | null;
  /**
   * Ours only: our TFLOP/s ÷ theirs per other implementation of the same cell (> 1: ours is faster);
   * our backward variants are not in it (see `variantRatios`).
   */
  ratios: Partial<Record<Impl, number | null>>;
  /**
   * Ours only, on cells where both sides were measured (null where one failed): time ratios between
   * our backward variants ({@link VariantRatio}).
   */
  variantRatios: Partial<Record<VariantRatio, number | null>>;
}

/** Kernels that ran in our rows, in order of first appearance (e.g. "flash, naive"). */
export function kernelsRan(rows: readonly BenchRow[]): string {
  const seen = [...new Set(rows.filter((r) => r.impl === 'ours' && r.kernel).map((r) => r.kernel as string))];
  return seen.length > 0 ? seen.join(', ') : 'none';
}

/** Backward structures that ran in our rows, in order of first appearance (e.g. "two-kernel"), or null if none. */
export function algorithmsRan(rows: readonly BenchRow[]): string | null {
  const seen = [...new Set(rows.filter((r) => r.impl === 'ours' && r.status === 'ok' && r.algorithm).map((r) => r.algorithm as string))];
  return seen.length > 0 ? seen.join(', ') : null;
}

/** The first kernel `kernel` can resolve to on `device` (rows say what really ran). */
export function resolveKernel(device: Device, kernel: AttentionKernel): string {
  if (kernel !== 'auto') return kernel;
  const b = backends();
  return (device === 'cuda' ? b.cuda.kernels[0] : b.cpu.kernels[0]) ?? 'auto';
}

/** Whether `message` is the addon's (or PyTorch's) out-of-memory error. */
export function isOutOfMemory(message: string): boolean {
  return /^CUDA out of memory/.test(message) || /\bout of memory\b/i.test(message);
}

/** A uniform [-1, 1) tensor from a xorshift32 stream (fast enough for 10⁸ elements; never all zeros). */
function randomTensor(shape: number[], dtype: DType, device: Device, seed: number): Tensor {
  const n = shape.reduce((x, y) => x * y, 1);
  const data = new Float32Array(n);
  let x = (seed * 0x9e3779b1) | 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    data[i] = (x >>> 0) / 2147483648 - 1;
  }
  return Tensor.fromFloat32Array(data, shape, { dtype, device });
}

/**
 * `count` untimed runs of `run`, then batches of them (1, 2, 4, ... runs, synchronised after each)
 * until `ms` milliseconds have passed since the first; returns once the device is idle.
 */
async function warmUp(device: Device, run: () => void, count: number, ms: number): Promise<void> {
  const start = performance.now();
  for (let i = 0; i < count; i++) run();
  await synchronize(device);
  for (let batch = 1; performance.now() - start < ms; batch *= 2) {
    for (let i = 0; i < batch; i++) run();
    await synchronize(device);
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

function liveBytes(device: Device): number {
  const m = memory()[device];
  return device === 'cuda' ? m.poolUsedBytes ?? m.bytes : m.bytes;
}

function peakBytesSinceReset(device: Device): number {
  const m = memory()[device];
  return device === 'cuda' ? m.poolPeakBytes ?? m.peakBytes : m.peakBytes;
}

function messageOf(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).split('\n')[0];
}

/**
 * A plan in a few words: the family, then for FlashAttention-2 on CUDA the compiled head dim and the
 * tile (`sm90-wgmma d128 128x128 w8 s3`: 128 query rows by 128 keys, 8 warps, 3 stages).
 */
export function describePlan(plan: KernelPlan): string {
  if (plan.headDim === null) return plan.family;
  return `${plan.family} d${plan.headDim} ${plan.blockM}x${plan.blockN} w${plan.warps} s${plan.stages}`;
}

/** A row without measurements (`pctPeak` null on a GPU row, absent on a CPU row). */
export function emptyRow(
  cell: BenchCell, impl: Impl, device: Device, kernel: string | null, status: RowStatus, error: string | null, algorithm: string | null = null,
): BenchRow {
  return {
    ...cell, impl, device, kernel, algorithm, status, msMedian: null, msMin: null, msMax: null, tflops: null,
    ...(device === 'cuda' ? { pctPeak: null } : {}), peakBytes: null, error, ratios: {}, variantRatios: {},
  };
}

/** A measured row. */
export function measuredRow(
  cell: BenchCell, impl: Impl, device: Device, kernel: string | null,
  ms: { median: number; min: number; max: number }, peakBytes: number | null, peak: number | null, algorithm: string | null = null,
): BenchRow {
  const tflops = tflopsPerSecond(cell, cell.pass, ms.median);
  return {
    ...emptyRow(cell, impl, device, kernel, 'ok', null, algorithm), msMedian: ms.median, msMin: ms.min, msMax: ms.max, tflops,
    ...(device === 'cuda' ? { pctPeak: peak === null ? null : (100 * tflops) / peak } : {}), peakBytes,
  };
}

/**
 * What {@link runOurs} reports as it goes, and where the caller may act between its steps. Every
 * hook is awaited: nothing of ours runs meanwhile. The round hooks are called only for cells where
 * at least one of our rows reached its timed runs (not for a cell whose inputs or every row failed
 * before timing); with any of them given, each such cell is timed in the rounds of
 * {@link timedRounds} even with one row.
 */
export interface RunHooks {
  /** After each measured (or failed) cell of ours or naive. */
  onRow?: (row: BenchRow) => void;
  /**
   * After the cell's rows are prepared and warmed up, before the first timed round; `rounds` are
   * the repeats of each round ({@link timedRounds} of the settings' repeats).
   */
  beforeRounds?: (cell: BenchCell, rounds: readonly number[]) => Promise<void> | void;
  /** After our round `index` of the cell (0, 1, ...): every row of ours has timed its runs of that round. */
  afterRound?: (cell: BenchCell, index: number) => Promise<void> | void;
  /** After our last round of the cell, once the cell's rows are reported (`onRow`). */
  afterRounds?: (cell: BenchCell) => Promise<void> | void;
  /**
   * After each input group ({@link groupByInputs}: the cells that share inputs), once its rows are
   * measured and its inputs freed; awaited before the next group's inputs are made. `rows` are the
   * group's rows. The CLI hands our pool's cached memory back here, and times PyTorch on the
   * group's cells that had no rounds of ours to take turns with.
   */
  afterGroup?: (group: readonly BenchCell[], rows: readonly BenchRow[]) => Promise<void> | void;
}

/** Number of rows {@link runOurs} measures (for a progress bar). */
export function oursWork(cells: readonly BenchCell[], s: GridSettings): number {
  const bwdCells = cells.filter((c) => c.pass !== 'fwd').length;
  const variants = s.variants.filter((v) => v in BWD_VARIANT_RUNS).length;
  return cells.length * (naiveMeasuredSeparately(s) ? 2 : 1) + variants * bwdCells;
}

/**
 * Whether --compare naive needs runs of its own: not when "ours" already resolves to the naive
 * kernel (a build without the CUDA FlashAttention-2 kernels), whose rows then fill both columns.
 */
function naiveMeasuredSeparately(s: GridSettings): boolean {
  return s.compare.includes('naive') && s.device === 'cuda' && resolveKernel(s.device, s.kernel) !== 'naive';
}

/** Rounds in which the timed runs of a cell's implementations take turns (see {@link runOurs}). */
export const INTERLEAVE_ROUNDS = 5;

/**
 * Repeats per round when `repeats` are spread over `rounds` rounds: as even as can be, the first
 * rounds one more (bench/torch_sdpa.py `round_sizes` is the same split).
 */
export function roundSizes(repeats: number, rounds: number): number[] {
  return Array.from({ length: rounds }, (_, r) => Math.floor(repeats / rounds) + (r < repeats % rounds ? 1 : 0));
}

/**
 * The timed rounds of a cell whose rows (or whose two sides, ours and PyTorch's) take turns:
 * {@link INTERLEAVE_ROUNDS} rounds, fewer when there are fewer repeats, none of them empty. The same
 * as bench/torch_sdpa.py `cell_rounds`, so that at equal repeats our rounds and PyTorch's match.
 */
export function timedRounds(repeats: number): number[] {
  return roundSizes(repeats, Math.min(INTERLEAVE_ROUNDS, repeats));
}

/** One implementation of a cell while {@link runOurs} times it. */
interface TimedImpl {
  impl: Impl;
  resolved: string;
  algorithm: BackwardAlgorithm | null;
  /** What ran, its backward algorithm and plan, from the last run's results. */
  ran: string;
  ranAlgorithm: string | null;
  ranPlan: string;
  runOnce: () => void;
  peakBytes: number;
  times: number[];
  /** Set when its preparation or a timed batch threw: the row reports it. */
  error?: unknown;
}

/**
 * Runs our cells (and, with --compare naive on CUDA, the naive kernel on the same inputs).
 * `peak` is the device's dense peak TFLOP/s for the run's dtype, or null.
 */
export async function runOurs(cells: readonly BenchCell[], s: GridSettings, peak: number | null, hooks: RunHooks = {}): Promise<BenchRow[]> {
  const { device } = s;
  const kernels: { impl: Impl; kernel: AttentionKernel; deterministic?: boolean; algorithm?: BackwardAlgorithm }[] =
    [{ impl: 'ours', kernel: s.kernel }];
  if (naiveMeasuredSeparately(s)) kernels.push({ impl: 'naive', kernel: 'naive' });
  // Backward variants, on the cells that run a backward, in report order.
  for (const [variant, run] of Object.entries(BWD_VARIANT_RUNS) as [BwdVariant, (typeof BWD_VARIANT_RUNS)[BwdVariant]][]) {
    if (s.variants.includes(variant)) kernels.push({ impl: run.impl, kernel: s.kernel, ...run.options });
  }
  const oursIsNaive = s.compare.includes('naive') && device === 'cuda' && !naiveMeasuredSeparately(s);
  const rows: BenchRow[] = [];
  const push = (r: BenchRow): void => {
    rows.push(r);
    hooks.onRow?.(r);
    if (oursIsNaive && r.impl === 'ours') rows.push({ ...r, impl: 'naive' }); // the same kernel: measured once
  };
  let seed = 1;
  const roundHooks = hooks.beforeRounds !== undefined || hooks.afterRound !== undefined || hooks.afterRounds !== undefined;

  for (const group of groupByInputs(cells)) {
    const groupStart = rows.length;
    const groupDone = async (): Promise<void> => {
      await hooks.afterGroup?.(group, rows.slice(groupStart));
    };
    const c0 = group[0];
    const qShape = [c0.batch, c0.seqlenQ, c0.headsQ, c0.headDim];
    const kShape = [c0.batch, c0.seqlenK, c0.headsKV, c0.headDim];
    const inputs: Tensor[] = [];
    let q: Tensor, k: Tensor, v: Tensor, dout: Tensor;
    try {
      q = randomTensor(qShape, c0.dtype, device, seed++);
      inputs.push(q);
      k = randomTensor(kShape, c0.dtype, device, seed++);
      inputs.push(k);
      v = randomTensor(kShape, c0.dtype, device, seed++);
      inputs.push(v);
      dout = randomTensor(qShape, c0.dtype, device, seed++);
      inputs.push(dout);
      await synchronize(device);
    } catch (err) {
      for (const t of inputs) t.dispose();
      await synchronize(device).catch(() => undefined);
      const msg = messageOf(err);
      for (const cell of group) {
        for (const kk of kernels) {
          push(emptyRow(cell, kk.impl, device, resolveKernel(device, kk.kernel), isOutOfMemory(msg) ? 'oom' : 'error', `inputs: ${msg}`,
            cell.pass === 'fwd' ? null : kk.algorithm ?? null));
        }
      }
      await groupDone();
      continue;
    }

    // Forward outputs the backward cells start from, per (mask, kernel); made on first use.
    const forwards = new Map<string, AttentionOutput>();
    try {
      for (const cell of group) {
        // Each implementation of the cell: its memory run and warm-up, then the timed runs. With
        // more than one (the backward variants), the timed runs go in timedRounds' rounds that take
        // turns, so that the GPU's clocks drifting under sustained load (on an H100 the same kernel
        // read 7-17% slower as a cell's later row than as its first) weigh on every row alike. The
        // round hooks put the caller's turn (PyTorch's round of the cell) between our rounds.
        const timed: TimedImpl[] = [];
        for (const { impl, kernel, deterministic, algorithm } of kernels) {
          if ((deterministic || algorithm) && cell.pass === 'fwd') continue;  // backward options
          const resolved = resolveKernel(device, kernel);
          // What really ran, from the results' `kernel` and `algorithm` fields ('auto' may pick per call).
          const t: TimedImpl = { impl, resolved, algorithm: algorithm ?? null, ran: resolved, ranAlgorithm: null, ranPlan: '',
                                 runOnce: () => undefined, peakBytes: 0, times: [] };
          const opts = { causal: cell.causal, kernel };
          const bwdOpts = { ...opts, deterministic: deterministic ?? false, algorithm: algorithm ?? 'auto' };
          try {
            if (cell.pass === 'fwd') {
              t.runOnce = () => {
                const r = flashAttention(q, k, v, opts);
                t.ran = r.kernel;
                t.ranPlan = describePlan(r.plan);
                r.out.dispose();
                r.lse.dispose();
              };
            } else if (cell.pass === 'bwd') {
              const key = `${cell.causal}/${kernel}`;
              let fwd = forwards.get(key);
              if (!fwd) {
                fwd = flashAttention(q, k, v, opts);
                forwards.set(key, fwd);
              }
              const f = fwd;
              t.runOnce = () => {
                const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, bwdOpts);
                t.ran = g.kernel;
                t.ranAlgorithm = g.algorithm;
                t.ranPlan = describePlan(g.plan);
                g.dq.dispose();
                g.dk.dispose();
                g.dv.dispose();
              };
            } else {
              t.runOnce = () => {
                const r = flashAttention(q, k, v, opts);
                const g = flashAttentionBackward(dout, q, k, v, r.out, r.lse, bwdOpts);
                t.ran = r.kernel === g.kernel ? r.kernel : `${r.kernel} fwd + ${g.kernel} bwd`;
                t.ranAlgorithm = g.algorithm;
                t.ranPlan = `fwd ${describePlan(r.plan)}; bwd ${describePlan(g.plan)}`;
                r.out.dispose();
                r.lse.dispose();
                g.dq.dispose();
                g.dk.dispose();
                g.dv.dispose();
              };
            }
            // One untimed run measures memory above what is live (inputs, saved forward).
            await synchronize(device);
            const before = liveBytes(device);
            resetPeakMemory(device);
            t.runOnce();
            await synchronize(device);
            t.peakBytes = Math.max(0, peakBytesSinceReset(device) - before);
            await warmUp(device, t.runOnce, s.warmup, s.warmupMs);
            timed.push(t);
          } catch (err) {
            t.error = err;
            timed.push(t);
          }
        }
        const live = () => timed.filter((t) => t.error === undefined);
        // Only a cell that reaches its timed runs has rounds for the hooks to take turns with.
        const hooked = live().length > 0 && roundHooks;
        const rounds = live().length > 1 || hooked ? timedRounds(s.repeats) : [s.repeats];
        if (hooked) await hooks.beforeRounds?.(cell, rounds);
        for (const [round, n] of rounds.entries()) {
          for (const t of live()) {
            try {
              t.times.push(...(await timeRepeatsOnDevice(device, t.runOnce, n)));
            } catch (err) {
              t.error = err;
            }
          }
          if (hooked) await hooks.afterRound?.(cell, round);
        }
        for (const t of timed) {
          if (t.error === undefined) {
            const ms = { median: median(t.times), min: Math.min(...t.times), max: Math.max(...t.times) };
            push({ ...measuredRow(cell, t.impl, device, t.ran, ms, t.peakBytes, peak, t.ranAlgorithm), plan: t.ranPlan });
          } else {
            await synchronize(device).catch(() => undefined);
            const msg = messageOf(t.error);
            push(emptyRow(cell, t.impl, device, t.resolved, isOutOfMemory(msg) ? 'oom' : 'error', msg,
              cell.pass === 'fwd' ? null : t.algorithm));
          }
        }
        if (hooked) await hooks.afterRounds?.(cell);
      }
    } finally {
      for (const f of forwards.values()) {
        f.out.dispose();
        f.lse.dispose();
      }
      for (const t of inputs) t.dispose();
      await synchronize(device).catch(() => undefined);
    }
    await groupDone();
  }
  return rows;
}

/** PyTorch's rows for our cells; none when the baselines are unavailable. */
export function torchRows(result: TorchResult, cells: readonly BenchCell[], peak: number | null): BenchRow[] {
  if (!result.available) return [];
  const byId = new Map(cells.map((c) => [c.id, c]));
  const out: BenchRow[] = [];
  for (const r of result.rows) {
    const cell = byId.get(r.id);
    if (!cell) continue;
    const impl = `torch-${r.backend}` as Impl;
    if (r.error !== null) {
      const row = emptyRow(cell, impl, 'cuda', null, isOutOfMemory(r.error) ? 'oom' : 'error', r.error);
      out.push({ ...row, mask: r.mask });
    } else {
      const row = measuredRow(cell, impl, 'cuda', null, { median: r.msMedian, min: r.msMin, max: r.msMax }, r.peakBytes, peak);
      out.push({ ...row, mask: r.mask });
    }
  }
  return out;
}

/** The SDPA backends behind the torch-* impls. */
export function torchImpl(b: TorchBackend): Impl {
  return `torch-${b}` as Impl;
}

/**
 * The row of a cell that stands for `role`: 'ours' itself for 'auto', else the variant pinned to it,
 * else 'ours' when what 'ours' ran is that structure ('auto' resolved; 'ours' is never deterministic).
 */
function roleRow(cellRows: readonly BenchRow[], role: BwdRole): BenchRow | undefined {
  if (role === 'auto') return cellRows.find((r) => r.impl === 'ours');
  const pinned = cellRows.find((r) => r.impl === `ours-${role}`);
  if (pinned || role === 'deterministic' || role === 'auto-deterministic') return pinned;
  return cellRows.find((r) => r.impl === 'ours' && r.status === 'ok' && r.algorithm === role);
}

/**
 * Fills each of our rows' `ratios` (our TFLOP/s ÷ every other measured implementation's, same cell;
 * our backward variants left out) and `variantRatios` (time ÷ time between the rows that stand for
 * each side of a {@link VariantRatio}, when both ran the same kernel).
 */
export function addRatios(rows: BenchRow[]): void {
  const byCell = new Map<string, BenchRow[]>();
  for (const r of rows) {
    const list = byCell.get(r.id);
    if (list) list.push(r);
    else byCell.set(r.id, [r]);
  }
  for (const r of rows) {
    if (r.impl !== 'ours') continue;
    r.ratios = {};
    r.variantRatios = {};
    const cellRows = byCell.get(r.id) ?? [];
    for (const o of cellRows) {
      if (o.impl === 'ours' || OUR_VARIANTS.includes(o.impl)) continue;
      r.ratios[o.impl] = r.tflops !== null && o.tflops !== null && o.tflops > 0 ? r.tflops / o.tflops : null;
    }
    if (r.pass === 'fwd') continue;
    for (const { key, over, under } of VARIANT_RATIOS) {
      const a = roleRow(cellRows, over);
      const b = roleRow(cellRows, under);
      if (!a || !b) continue;
      const ok = a.msMedian !== null && b.msMedian !== null && b.msMedian > 0 && a.kernel === b.kernel;
      r.variantRatios[key] = ok ? (a.msMedian as number) / (b.msMedian as number) : null;
    }
  }
}

/** Sorts rows for reporting: by cell order, then implementation order. */
export function sortRows(rows: BenchRow[], cells: readonly BenchCell[]): BenchRow[] {
  const order = new Map(cells.map((c, i) => [c.id, i]));
  return [...rows].sort((a, b) => (order.get(a.id) ?? 0) - (order.get(b.id) ?? 0) || IMPLS.indexOf(a.impl) - IMPLS.indexOf(b.impl));
}
