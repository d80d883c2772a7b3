/**
 * Reference results for a few blocks of consecutive query rows of an attention problem too large for
 * a full float64 reference (seqlen 4097 and the like), computed by lib/reference.ts itself on a
 * smaller problem whose result is exactly those rows.
 *
 * Why that is exact: query rows do not interact. Rows [start, start + R) of a problem with seqlenQ
 * rows and seqlenK keys are the whole of a problem with R rows and
 * - without the causal mask: the same seqlenK keys;
 * - with the causal mask, which is aligned to the bottom-right corner (row i sees key j iff
 *   j <= i + seqlenK - seqlenQ): the first K' = start + R + seqlenK - seqlenQ keys. In the smaller
 *   problem row r sees j <= r + K' - R = (start + r) + seqlenK - seqlenQ, the same keys as row
 *   start + r of the big one. When K' <= 0 no row of the block sees a key (out 0, lse +Infinity).
 * Each row is computed by the same code in the same order as in the full reference, so the rows are
 * bit-identical to the full reference's (test/flash-forward.test.ts checks it, in both precisions).
 *
 * Layouts: the rows of several blocks, all of the same length R, are concatenated block after block:
 * out is [blocks, batch, R, headsQ, headDim] and lse is [blocks, batch, headsQ, R]. {@link takeRows}
 * cuts the same layout out of a full-size result, so the flash rule can compare the two directly.
 */

import { referenceAttention, ReferenceOptions, ReferenceShape } from '../../lib/reference';
import type { Rng } from './random';

/** Query rows [start, start + count) of every batch and head. */
export interface RowBlock {
  start: number;
  count: number;
}

/** Names of the dimensions of {@link referenceRows}' out and lse, for the rule's messages. */
export const ROW_OUT_DIMS = ['blk', 'b', 'row', 'h', 'd'] as const;
export const ROW_LSE_DIMS = ['blk', 'b', 'h', 'row'] as const;

function checkBlocks(shape: ReferenceShape, blocks: readonly RowBlock[]): number {
  if (blocks.length === 0) throw new RangeError('referenceRows: no row blocks');
  const R = blocks[0].count;
  for (const { start, count } of blocks) {
    if (count !== R || !Number.isSafeInteger(start) || start < 0 || count < 1 || start + count > shape.seqlenQ) {
      throw new RangeError(
        `referenceRows: blocks must all have ${R} rows within [0, ${shape.seqlenQ}), got [${start}, ${start + count})`,
      );
    }
  }
  return R;
}

/**
 * Keys that the rows of `block` need: seqlenK without the causal mask, else
 * start + count + seqlenK − seqlenQ (the last row's visible keys; ≤ 0 when no row sees any).
 */
export function keysForBlock(shape: ReferenceShape, block: RowBlock, causal: boolean): number {
  return causal ? Math.min(shape.seqlenK, block.start + block.count + shape.seqlenK - shape.seqlenQ) : shape.seqlenK;
}

/** Rows [first, first + count) of every batch of a flat [batch, seqlen, heads, headDim] array (a view when batch is 1). */
function rowsOf(a: Float32Array, batch: number, seqlen: number, rowSize: number, first: number, count: number): Float32Array {
  if (batch === 1) return a.subarray(first * rowSize, (first + count) * rowSize);
  const out = new Float32Array(batch * count * rowSize);
  for (let b = 0; b < batch; b++) {
    const from = (b * seqlen + first) * rowSize;
    out.set(a.subarray(from, from + count * rowSize), b * count * rowSize);
  }
  return out;
}

/**
 * The reference (`options.precision` as in lib/reference.ts: float64 or same-precision) for the
 * query rows of `blocks`, every batch and head, from the full-size inputs.
 *
 * @param q `[batch, seqlenQ, headsQ, headDim]` as stored on the device (already rounded to the dtype).
 * @param k `[batch, seqlenK, headsKV, headDim]`, likewise; `v` like k.
 * @param blocks row blocks, all with the same `count`.
 * @returns out `[blocks, batch, count, headsQ, headDim]` and lse `[blocks, batch, headsQ, count]`.
 */
export function referenceRows(
  q: Float32Array, k: Float32Array, v: Float32Array, shape: ReferenceShape, blocks: readonly RowBlock[],
  options: ReferenceOptions,
): { out: Float64Array; lse: Float64Array } {
  const R = checkBlocks(shape, blocks);
  const { batch: B, headsQ: Hq, headsKV: Hkv, headDim: d } = shape;
  const outBlock = B * R * Hq * d;
  const lseBlock = B * Hq * R;
  const out = new Float64Array(blocks.length * outBlock);
  const lse = new Float64Array(blocks.length * lseBlock);
  blocks.forEach((block, n) => {
    const keys = keysForBlock(shape, block, options.causal === true);
    if (keys <= 0) {
      lse.fill(Infinity, n * lseBlock, (n + 1) * lseBlock); // out stays 0
      return;
    }
    const sub = { ...shape, seqlenQ: R, seqlenK: keys };
    const r = referenceAttention(
      rowsOf(q, B, shape.seqlenQ, Hq * d, block.start, R),
      rowsOf(k, B, shape.seqlenK, Hkv * d, 0, keys),
      rowsOf(v, B, shape.seqlenK, Hkv * d, 0, keys),
      sub,
      options,
    );
    out.set(r.out, n * outBlock);
    lse.set(r.lse, n * lseBlock);
  });
  return { out, lse };
}

/**
 * The rows of `blocks` cut out of full-size results (a kernel's float32 outputs, or a full reference's
 * float64 ones), in {@link referenceRows}' layout, as float64 (exact for both).
 * @param out `[batch, seqlenQ, headsQ, headDim]`
 * @param lse `[batch, headsQ, seqlenQ]`
 */
export function takeRows(
  out: Float32Array | Float64Array, lse: Float32Array | Float64Array, shape: ReferenceShape, blocks: readonly RowBlock[],
): { out: Float64Array; lse: Float64Array } {
  const R = checkBlocks(shape, blocks);
  const { batch: B, seqlenQ: Sq, headsQ: Hq, headDim: d } = shape;
  const rowSize = Hq * d;
  const rowsOut = new Float64Array(blocks.length * B * R * rowSize);
  const rowsLse = new Float64Array(blocks.length * B * Hq * R);
  blocks.forEach((block, n) => {
    for (let b = 0; b < B; b++) {
      const from = (b * Sq + block.start) * rowSize;
      rowsOut.set(out.subarray(from, from + R * rowSize), (n * B + b) * R * rowSize);
      for (let h = 0; h < Hq; h++) {
        const at = (b * Hq + h) * Sq + block.start;
        rowsLse.set(lse.subarray(at, at + R), ((n * B + b) * Hq + h) * R);
      }
    }
  });
  return { out: rowsOut, lse: rowsLse };
}

/**
 * Row blocks of `count` rows worth checking in a long sequence: the first rows, rows 62-65 and
 * 126-129 (across the 64- and 128-row tile edges, and, for causal attention with seqlenQ ≈ seqlenK,
 * rows whose visible keys cross a 64- or 128-key tile edge), the middle, one random block and the
 * last rows (the partial last tile). Blocks are clamped into [0, seqlenQ) and deduplicated.
 */
export function sampleRowBlocks(seqlenQ: number, count: number, rng: Rng): RowBlock[] {
  const R = Math.min(count, seqlenQ);
  const last = seqlenQ - R;
  const starts = [0, 62, 126, Math.floor(seqlenQ / 2) - Math.floor(R / 2), rng.int(last + 1), last];
  const unique = [...new Set(starts.map((s) => Math.max(0, Math.min(last, s))))].sort((a, b) => a - b);
  return unique.map((start) => ({ start, count: R }));
}
