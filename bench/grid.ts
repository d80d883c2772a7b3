/**
 * What to measure: the settings a run resolves to (flags over a preset over the device's default
 * grid), and the cells (one problem size, mask, dtype and pass each) built from them.
 * @packageDocumentation
 */
import type { AttentionKernel, Device, DType } from '../lib';
import { Pass, PASSES } from './flops';
import type { TorchBackend, TorchCell } from './torch';

/** Implementations that `--compare` adds beside ours. */
export type CompareTarget = 'naive' | 'torch';

/**
 * Backward variants that a preset can ask for beside our default backward ("ours", algorithm
 * 'auto'): single-kernel (atomic dQ), the single kernel's deterministic mode, two-kernel, and
 * 'auto' with deterministic: true (what a user who asks for determinism gets).
 */
export type BwdVariant = 'single-kernel' | 'deterministic' | 'two-kernel' | 'auto-deterministic';

/** Everything that decides which cells run and how they are timed. */
export interface GridSettings {
  device: Device;
  dtype: DType;
  /** Query lengths (and key lengths unless `seqlenK` is set). */
  seqlens: number[];
  seqlenK: number | null;
  /** Batch size; null: max(1, floor(tokens / seqlen)). */
  batch: number | null;
  /** Tokens per batch when `batch` is null (the FA2 paper: 16384). */
  tokens: number;
  /** Query heads; null: max(1, floor(hidden / headDim)). */
  heads: number | null;
  /** Model width when `heads` is null (the FA2 paper: 2048). */
  hidden: number;
  /** Key/value heads (GQA); null: as many as query heads. */
  kvHeads: number | null;
  headDims: number[];
  causal: boolean[];
  passes: Pass[];
  /** flashAttention's `kernel` option for our rows. */
  kernel: AttentionKernel;
  /** Timed runs per cell (the median is reported). */
  repeats: number;
  /** Untimed runs per cell before the timed ones. */
  warmup: number;
  /**
   * Then more untimed runs until this many milliseconds have passed since the warm-up began (0:
   * none): the GPU's sustained clocks rather than its burst ones (H100, d128 forward, 2026-11-27:
   * ours 0.87-0.95x its TFLOP/s after 100 ms, cuDNN 0.85-0.92x, SDPA flash 0.94-1.0x).
   */
  warmupMs: number;
  compare: CompareTarget[];
  torchBackends: TorchBackend[];
  /** Extra backward variants reported beside ours (--variants, or a preset's). */
  variants: BwdVariant[];
}

/** One measured problem. The same type PyTorch's baselines take, so ids match across both sides. */
export type BenchCell = TorchCell;

/** The FA2 paper's sequence lengths (its Figures 4-6). */
export const FA2_SEQLENS: readonly number[] = [512, 1024, 2048, 4096, 8192, 16384];

/** A stable, readable key of a cell: `fwd-bf16-d64-causal-b16h32kv32-q1024k1024`. */
export function cellId(c: Omit<BenchCell, 'id'>): string {
  const dt = c.dtype === 'bfloat16' ? 'bf16' : c.dtype === 'float16' ? 'fp16' : 'fp32';
  return `${c.pass}-${dt}-d${c.headDim}-${c.causal ? 'causal' : 'full'}-b${c.batch}h${c.headsQ}kv${c.headsKV}-q${c.seqlenQ}k${c.seqlenK}`;
}

/** The batch size of a cell of query length `seqlen`. */
export function batchFor(s: Pick<GridSettings, 'batch' | 'tokens'>, seqlen: number): number {
  return s.batch ?? Math.max(1, Math.floor(s.tokens / seqlen));
}

/** The query heads of a cell of head dim `headDim`. */
export function headsFor(s: Pick<GridSettings, 'heads' | 'hidden'>, headDim: number): number {
  return s.heads ?? Math.max(1, Math.floor(s.hidden / headDim));
}

/**
 * The cells of a run, head dim by head dim, then sequence length, mask and pass (cells of one
 * shape are adjacent, so their inputs are made once).
 */
export function buildCells(s: GridSettings): BenchCell[] {
  const cells: BenchCell[] = [];
  const passes = PASSES.filter((p) => s.passes.includes(p));
  for (const headDim of s.headDims) {
    const headsQ = headsFor(s, headDim);
    for (const seqlen of s.seqlens) {
      for (const causal of [false, true].filter((c) => s.causal.includes(c))) {
        for (const pass of passes) {
          const c = {
            batch: batchFor(s, seqlen), seqlenQ: seqlen, seqlenK: s.seqlenK ?? seqlen, headsQ,
            headsKV: s.kvHeads ?? headsQ, headDim, causal, dtype: s.dtype, pass,
          };
          cells.push({ id: cellId(c), ...c });
        }
      }
    }
  }
  return cells;
}

/** Cells with the same inputs (everything but mask and pass), in first-seen order. */
export function groupByInputs(cells: readonly BenchCell[]): BenchCell[][] {
  const groups = new Map<string, BenchCell[]>();
  for (const c of cells) {
    const key = [c.batch, c.seqlenQ, c.seqlenK, c.headsQ, c.headsKV, c.headDim, c.dtype].join('/');
    const g = groups.get(key);
    if (g) g.push(c);
    else groups.set(key, [c]);
  }
  return [...groups.values()];
}
