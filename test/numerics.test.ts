/**
 * Numerics under non-finite and large-magnitude inputs (issue 6), on every device.
 *
 * 1. NaN and ±Infinity in one element of q, k, v or dout. Standard attention (lib/reference.ts: softmax
 *    over the keys a row sees, masked keys take no part at all) decides, element by element, which
 *    outputs become non-finite; every other element must be bit-identical to the same call made
 *    without the poisoned element (and that clean call is checked against the float64 reference).
 *    With G the query heads that read the poisoned key/value head, and "row i sees key j" meaning
 *    j ≤ i + seqlenK − seqlenQ under the causal mask:
 *
 *    - NaN in q row (i, h): out row i of head h is NaN, its lse NaN; dq row i NaN; dk and dv rows of
 *      the keys that row i sees are non-finite (its P and dS are NaN). Nothing else changes; a row
 *      that sees no key ignores its q entirely.
 *    - NaN in k row j: the rows of G that see key j get NaN scores, so NaN out rows and NaN lse; their
 *      dq rows are non-finite, and so are the dk and dv rows of every key those rows see (with the
 *      bottom-right causal mask the last row sees every key, so all of the head's dk and dv). Rows
 *      that do not see key j (causal) are untouched, in every output.
 *    - NaN in element c of v row j: column c of the out rows of G that see key j is NaN, the other
 *      columns and lse are untouched; in the backward D_i = dO_i·out_i is NaN for those rows, so
 *      their dq rows and the dk rows of the keys they see are non-finite; dv = Pᵀ·dO is untouched.
 *    - +Infinity behaves as NaN where it makes a score +∞ (exp(∞ − ∞)) or every score of a row −∞
 *      (softmax of all −∞ is 0/0): q row i with +∞ gives NaN for row i, like a NaN. In v it gives
 *      +∞ in column c of the out rows that see it (p > 0), and the backward pattern of a NaN.
 *    - −Infinity in k row j for rows whose score with key j is −∞: key j drops out of those rows'
 *      softmax (p = 0). Their out and lse stay finite and equal attention without key j (checked
 *      against the reference); dk and dv of key j are exactly 0; and dq = scale·Σ_j dS_ij·k_j
 *      takes 0·(−∞) = NaN in column c, as in any matrix-product implementation of the formula.
 *    - NaN or ±Infinity in element c of dout row (i, h) (the backward's upstream gradient): out and
 *      lse are untouched. D_i = dO_i·out_i is non-finite, so dS_ij = P_ij·(dO_i·v_j − D_i) is
 *      non-finite at every key j that row i sees: dq row i and the dk rows of those keys are
 *      non-finite (NaN for a NaN). dv_j = Σ_i P_ij·dO_i changes in column c only, for those keys:
 *      NaN for a NaN, +∞ for +∞ (P_ij > 0: these scores are far from underflow; P_ij = 0 would give
 *      0·∞ = NaN), −∞ for −∞ (checked as non-finite); the other columns of dv, and every other row,
 *      are untouched. A row that sees no key changes nothing: its dq stays 0 and it adds nothing
 *      to dk or dv (its P and dS are 0 by the mask, not 0·dO).
 *
 *    The expected pattern is derived from these rules, then checked twice: against the float64
 *    reference (the rules are standard attention) and against each device's kernels.
 *
 * 2. Large magnitudes that test/attention.test.ts does not cover (it has five cases with scores
 *    ~±1e4: one-hot and spread-out rows, all-negative scores, 65-113 keys): a running max that
 *    rises by ~1e4 from key tile to key tile (every earlier tile rescaled by exactly 0), one that
 *    falls (every later P underflows to 0), ~±1e4 scores with rows that see no key (fp16, MQA,
 *    batch 2) and in bf16 (GQA 3:1), forward and backward; and, forward only, scores of ~±1e11 and
 *    ~±1e30, still finite float32 numbers. Inputs are integers (q·k exact in float32, as there).
 *    Same rule and slack as there: helpers/backward.ts gradientSlack with its large-magnitude floors,
 *    and for lse helpers/forward.ts lseRoundingSlack.
 *
 * Known bugs, shown by tests marked `test.failing` (they pass while the library is wrong; a fix
 * makes them fail, and the marker must go): KNOWN_BUGS (bugs A and B, NaN / ±∞ propagation; fixed on
 * the CPU and on CUDA, including B2, the backward's products; all now empty).
 * Part 1 runs on the CPU in float32, and on CUDA through every family of FA2 kernels (NAN_VARIANTS).
 * HUGE_SCORES_BUG (bug C, scores beyond ~1e9 on the CPU) is fixed and now empty.
 */

import { AttentionBackwardOptions, Device, DType, flashAttention, flashAttentionBackward, referenceAttention, referenceAttentionBackward, Tensor } from '../lib';
import { debug } from '../lib/testing';
import { describeEachDevice, trackMemory } from './helpers/backend';
import { GRAD_ATOL, gradientSlack, visibleKeys } from './helpers/backward';
import {
  ForwardShape, kShapeOf, LSE_DIMS, lseRoundingSlack, lseShapeOf, maxFiniteAbs, optionsOf, Q_DIMS, qShapeOf,
  scoreMagnitude, shapeOf,
} from './helpers/forward';
import { randn, rngFor } from './helpers/random';
import { checkFlashRule, decodeIndex, expectAllWritten, expectFlashRule, formatFlashReport, FlashRuleInput } from './helpers/tolerance';

trackMemory();
afterAll(() => debug.poisonOutputs(false));

type OutName = 'out' | 'lse' | 'dq' | 'dk' | 'dv';
const OUT_NAMES: readonly OutName[] = ['out', 'lse', 'dq', 'dk', 'dv'];

interface Inputs {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
  dout: Float32Array;
}
type Results = Record<OutName, Float32Array>;

/** Options of both passes on `device`: the FA2 kernels, deterministic dq on CUDA (bit-exact comparisons). */
function passOptions(t: ForwardShape, device: Device, dtype: DType): AttentionBackwardOptions {
  // float32 on CUDA: the naive kernel, as test/attention.test.ts does (the FA2 float32 forward runs on
  // TF32 tensor cores and has its own rules in test/flash-forward-fp32.test.ts).
  const kernel = device === 'cuda' && dtype === 'float32' ? 'naive' : 'flash';
  return { ...optionsOf(t), kernel, deterministic: device === 'cuda' };
}

/**
 * Runs forward + backward of `t` on `device`, every output first filled with NaN (so the clean runs
 * prove the kernels write every element). Returns the inputs as stored (rounded to the dtype) and the
 * five outputs. Disposes everything it made.
 */
async function runPasses(
  device: Device, dtype: DType, t: ForwardShape, x: Inputs, fwdOnly = false, extra: Partial<AttentionBackwardOptions> = {},
): Promise<{ stored: Inputs; got: Partial<Results> }> {
  const made: Tensor[] = [];
  const make = (a: Float32Array, shape: number[]): Tensor => {
    const y = Tensor.fromFloat32Array(a, shape, { dtype, device });
    made.push(y);
    return y;
  };
  try {
    const q = make(x.q, qShapeOf(t));
    const k = make(x.k, kShapeOf(t));
    const v = make(x.v, kShapeOf(t));
    const dout = make(x.dout, qShapeOf(t));
    const opts = { ...passOptions(t, device, dtype), ...extra };
    debug.poisonOutputs(true);
    const fwd = flashAttention(q, k, v, opts);
    made.push(fwd.out, fwd.lse);
    const outs: Partial<Record<OutName, Tensor>> = { out: fwd.out, lse: fwd.lse };
    if (!fwdOnly) {
      const g = flashAttentionBackward(dout, q, k, v, fwd.out, fwd.lse, opts);
      made.push(g.dq, g.dk, g.dv);
      Object.assign(outs, { dq: g.dq, dk: g.dk, dv: g.dv });
    }
    debug.poisonOutputs(false);
    const read = async (y: Tensor): Promise<Float32Array> => new Float32Array(await y.toFloat32Array());
    const [sq, sk, sv, sd] = await Promise.all([q, k, v, dout].map(read));
    const got: Partial<Results> = {};
    for (const [n, y] of Object.entries(outs) as [OutName, Tensor][]) got[n] = await read(y);
    return { stored: { q: sq, k: sk, v: sv, dout: sd }, got };
  } finally {
    debug.poisonOutputs(false);
    for (const y of made) y.dispose();
  }
}

// ------------------------------------------------------------------------------------------------
// Part 1: NaN and ±Infinity
// ------------------------------------------------------------------------------------------------

/** What each output element must be in the poisoned run. */
const SAME = 0; // bit-identical to the clean run
const NAN = 1; // NaN
const POS_INF = 2; // +Infinity
const NON_FINITE = 3; // NaN or ±Infinity (gradients, where Inf − Inf and Inf·0 mix)
const REF = 4; // finite, and within the flash rule of the float64 reference of the poisoned inputs
const CODE_NAMES = ['bit-identical to the clean run', 'NaN', '+Infinity', 'non-finite', 'finite (reference)'];
type Pattern = Record<OutName, Uint8Array>;

/** Flat indices of the layouts of lib/attention.ts. */
const qAt = (t: ForwardShape, b: number, i: number, h: number, c = 0): number => ((b * t.sq + i) * t.hq + h) * t.d + c;
const kAt = (t: ForwardShape, b: number, j: number, hk: number, c = 0): number => ((b * t.sk + j) * t.hkv + hk) * t.d + c;
const lseAt = (t: ForwardShape, b: number, h: number, i: number): number => (b * t.hq + h) * t.sq + i;

function emptyPattern(t: ForwardShape): Pattern {
  const nq = t.b * t.sq * t.hq * t.d;
  const nk = t.b * t.sk * t.hkv * t.d;
  return {
    out: new Uint8Array(nq), lse: new Uint8Array(t.b * t.hq * t.sq), dq: new Uint8Array(nq),
    dk: new Uint8Array(nk), dv: new Uint8Array(nk),
  };
}

/** Where the poison sits: [batch, row, head] of q, [batch, key, kv head] of k, [batch, key, kv head, column] of v. */
interface Poisoned {
  q?: [number, number, number];
  k?: [number, number, number];
  v?: [number, number, number, number];
  /** What the poisoned out elements of a v poison hold: NAN (NaN in v) or POS_INF (+∞ in v). */
  vOut?: typeof NAN | typeof POS_INF;
}

/**
 * The rules of the module notes for a NaN (or a +∞ that acts as one) in q or k, or a NaN / +∞ in one
 * element of v, row by row over every (batch, query head, row) and the keys the row sees.
 */
function nanPattern(t: ForwardShape, poisoned: Poisoned): Pattern {
  const pat = emptyPattern(t);
  const group = t.hq / t.hkv;
  for (let b = 0; b < t.b; b++) {
    for (let h = 0; h < t.hq; h++) {
      const hk = Math.floor(h / group);
      for (let i = 0; i < t.sq; i++) {
        const n = visibleKeys(t, i);
        const { q, k, v } = poisoned;
        // NaN scores: the row's own q, or a key it sees.
        const scores = n > 0 && ((q !== undefined && q[0] === b && q[1] === i && q[2] === h) ||
          (k !== undefined && k[0] === b && k[2] === hk && k[1] < n));
        // A NaN (or ∞) value among the keys it sees.
        const values = v !== undefined && v[0] === b && v[2] === hk && v[1] < n;
        if (scores) {
          pat.out.fill(NAN, qAt(t, b, i, h), qAt(t, b, i, h) + t.d);
          pat.lse[lseAt(t, b, h, i)] = NAN;
        } else if (values) {
          pat.out[qAt(t, b, i, h, v[3])] = poisoned.vOut ?? NAN;
        }
        if (scores || values) {
          pat.dq.fill(NON_FINITE, qAt(t, b, i, h), qAt(t, b, i, h) + t.d);
          // dS_ij is NaN for every key j the row sees (P NaN, or D_i NaN): dk rows; P only for dv.
          for (let j = 0; j < n; j++) {
            pat.dk.fill(NON_FINITE, kAt(t, b, j, hk), kAt(t, b, j, hk) + t.d);
            if (scores) pat.dv.fill(NON_FINITE, kAt(t, b, j, hk), kAt(t, b, j, hk) + t.d);
          }
        }
      }
    }
  }
  return pat;
}

/**
 * NaN or ±∞ `value` in element c of dout row (i, h), batch b: the dout rule of the module notes.
 */
function doutPattern(t: ForwardShape, [b, i, h, c]: [number, number, number, number], value: number): Pattern {
  const pat = emptyPattern(t);
  const hk = Math.floor(h / (t.hq / t.hkv));
  const n = visibleKeys(t, i);
  if (n === 0) return pat;
  const grad = Number.isNaN(value) ? NAN : NON_FINITE;
  const dvCol = Number.isNaN(value) ? NAN : value === Infinity ? POS_INF : NON_FINITE;
  pat.dq.fill(grad, qAt(t, b, i, h), qAt(t, b, i, h) + t.d);
  for (let j = 0; j < n; j++) {
    pat.dk.fill(grad, kAt(t, b, j, hk), kAt(t, b, j, hk) + t.d);
    pat.dv[kAt(t, b, j, hk, c)] = dvCol;
  }
  return pat;
}

/**
 * −∞ in element c of k row j of kv head hk, batch b, and q > 0 in column c of every row of the group
 * (every score with key j is −∞): see the module notes.
 */
function minusInfKeyPattern(t: ForwardShape, [b, j0, hk]: [number, number, number], c: number): Pattern {
  const pat = emptyPattern(t);
  const group = t.hq / t.hkv;
  for (let h = hk * group; h < (hk + 1) * group; h++) {
    for (let i = 0; i < t.sq; i++) {
      const n = visibleKeys(t, i);
      if (j0 >= n) continue;
      pat.out.fill(REF, qAt(t, b, i, h), qAt(t, b, i, h) + t.d);
      pat.lse[lseAt(t, b, h, i)] = REF;
      pat.dq.fill(REF, qAt(t, b, i, h), qAt(t, b, i, h) + t.d);
      pat.dq[qAt(t, b, i, h, c)] = NON_FINITE;
      for (let j = 0; j < n; j++) {
        pat.dk.fill(REF, kAt(t, b, j, hk), kAt(t, b, j, hk) + t.d);
        pat.dv.fill(REF, kAt(t, b, j, hk), kAt(t, b, j, hk) + t.d);
      }
    }
  }
  return pat;
}

interface PoisonCase {
  /** Short id, the key of KNOWN_BUGS. */
  id: string;
  name: string;
  t: ForwardShape;
  /** Changes applied to both the clean and the poisoned inputs (signs that make a ±∞ score certain). */
  prepare?: (t: ForwardShape, x: Inputs) => void;
  poison: (t: ForwardShape, x: Inputs) => void;
  pattern: (t: ForwardShape) => Pattern;
}

// Causal, seqlenQ 40 > seqlenK 32: rows 0-7 see no key, row i sees keys 0..i-8. GQA 2:1, batch 2. All
// poison sits in batch 1, kv head 1 (query heads 2 and 3), column 5: batch 0 and heads 0-1 are
// untouched witnesses. Key 13 is seen by rows 21-39; row 25 sees keys 0-17. Everything fits in one
// tile of every kernel (64 rows or more), so masked and visible positions share the tile products.
const CAUSAL: ForwardShape = { b: 2, sq: 40, sk: 32, hq: 4, hkv: 2, d: 16, causal: true };
// Not causal, seqlenQ 20 < seqlenK 30: every row sees every key.
const FULL: ForwardShape = { b: 2, sq: 20, sk: 30, hq: 4, hkv: 2, d: 8, causal: false };
const PB = 1; // poisoned batch
const PHK = 1; // poisoned kv head
const PH = 2; // poisoned query head (of kv head 1)
const PC = 5; // poisoned column

/** Column PC of q rows of the poisoned group made positive (so q·k with a ±∞ in k column PC is ±∞). */
const positiveQColumn = (t: ForwardShape, x: Inputs): void => {
  const group = t.hq / t.hkv;
  for (let h = PHK * group; h < (PHK + 1) * group; h++) {
    for (let i = 0; i < t.sq; i++) x.q[qAt(t, PB, i, h, PC)] = Math.abs(x.q[qAt(t, PB, i, h, PC)]);
  }
};

const POISON_CASES: PoisonCase[] = [
  {
    id: 'q-nan',
    name: 'NaN in q (row 25, sees keys 0-17), causal',
    t: CAUSAL,
    poison: (t, x) => { x.q[qAt(t, PB, 25, PH, PC)] = NaN; },
    pattern: (t) => nanPattern(t, { q: [PB, 25, PH] }),
  },
  {
    id: 'q-nan-empty-row',
    name: 'NaN in q of a row that sees no key (row 3), causal: nothing changes',
    t: CAUSAL,
    poison: (t, x) => { x.q[qAt(t, PB, 3, PH, PC)] = NaN; },
    pattern: (t) => nanPattern(t, { q: [PB, 3, PH] }),
  },
  {
    id: 'q-inf',
    name: '+Infinity in q (row 25; its scores are +∞ and −∞), causal',
    t: CAUSAL,
    prepare: (t, x) => {
      x.k[kAt(t, PB, 0, PHK, PC)] = Math.abs(x.k[kAt(t, PB, 0, PHK, PC)]);
      x.k[kAt(t, PB, 1, PHK, PC)] = -Math.abs(x.k[kAt(t, PB, 1, PHK, PC)]);
    },
    poison: (t, x) => { x.q[qAt(t, PB, 25, PH, PC)] = Infinity; },
    pattern: (t) => nanPattern(t, { q: [PB, 25, PH] }),
  },
  {
    id: 'q-inf-all-neg',
    name: '+Infinity in q (row 25) where every score of the row becomes −∞ (softmax 0/0), causal',
    t: CAUSAL,
    prepare: (t, x) => {
      for (let j = 0; j < t.sk; j++) x.k[kAt(t, PB, j, PHK, PC)] = -Math.abs(x.k[kAt(t, PB, j, PHK, PC)]);
    },
    poison: (t, x) => { x.q[qAt(t, PB, 25, PH, PC)] = Infinity; },
    pattern: (t) => nanPattern(t, { q: [PB, 25, PH] }),
  },
  {
    id: 'k-nan',
    name: 'NaN in k (key 13, seen by rows 21-39), causal',
    t: CAUSAL,
    poison: (t, x) => { x.k[kAt(t, PB, 13, PHK, PC)] = NaN; },
    pattern: (t) => nanPattern(t, { k: [PB, 13, PHK] }),
  },
  {
    id: 'k-inf',
    name: '+Infinity in k (key 13; scores +∞), causal',
    t: CAUSAL,
    prepare: positiveQColumn,
    poison: (t, x) => { x.k[kAt(t, PB, 13, PHK, PC)] = Infinity; },
    pattern: (t) => nanPattern(t, { k: [PB, 13, PHK] }),
  },
  {
    id: 'k-minus-inf',
    name: '−Infinity in k (key 13; scores −∞: the key drops out), causal',
    t: CAUSAL,
    prepare: positiveQColumn,
    poison: (t, x) => { x.k[kAt(t, PB, 13, PHK, PC)] = -Infinity; },
    pattern: (t) => minusInfKeyPattern(t, [PB, 13, PHK], PC),
  },
  {
    id: 'v-nan',
    name: 'NaN in v (key 13, seen by rows 21-39), causal',
    t: CAUSAL,
    poison: (t, x) => { x.v[kAt(t, PB, 13, PHK, PC)] = NaN; },
    pattern: (t) => nanPattern(t, { v: [PB, 13, PHK, PC] }),
  },
  {
    id: 'v-inf',
    name: '+Infinity in v (key 13), causal',
    t: CAUSAL,
    poison: (t, x) => { x.v[kAt(t, PB, 13, PHK, PC)] = Infinity; },
    pattern: (t) => nanPattern(t, { v: [PB, 13, PHK, PC], vOut: POS_INF }),
  },
  {
    id: 'dout-nan',
    name: 'NaN in dout (row 25, sees keys 0-17 of the 32 in its tile), causal',
    t: CAUSAL,
    poison: (t, x) => { x.dout[qAt(t, PB, 25, PH, PC)] = NaN; },
    pattern: (t) => doutPattern(t, [PB, 25, PH, PC], NaN),
  },
  {
    id: 'dout-inf',
    name: '+Infinity in dout (row 25), causal',
    t: CAUSAL,
    poison: (t, x) => { x.dout[qAt(t, PB, 25, PH, PC)] = Infinity; },
    pattern: (t) => doutPattern(t, [PB, 25, PH, PC], Infinity),
  },
  {
    id: 'dout-nan-empty-row',
    name: 'NaN in dout of a row that sees no key (row 3), causal: nothing changes',
    t: CAUSAL,
    poison: (t, x) => { x.dout[qAt(t, PB, 3, PH, PC)] = NaN; },
    pattern: (t) => doutPattern(t, [PB, 3, PH, PC], NaN),
  },
  {
    id: 'full-q-nan',
    name: 'NaN in q (row 7), not causal',
    t: FULL,
    poison: (t, x) => { x.q[qAt(t, PB, 7, PH, PC)] = NaN; },
    pattern: (t) => nanPattern(t, { q: [PB, 7, PH] }),
  },
  {
    id: 'full-k-nan',
    name: 'NaN in k (key 11), not causal',
    t: FULL,
    poison: (t, x) => { x.k[kAt(t, PB, 11, PHK, PC)] = NaN; },
    pattern: (t) => nanPattern(t, { k: [PB, 11, PHK] }),
  },
  {
    id: 'full-v-nan',
    name: 'NaN in v (key 11), not causal',
    t: FULL,
    poison: (t, x) => { x.v[kAt(t, PB, 11, PHK, PC)] = NaN; },
    pattern: (t) => nanPattern(t, { v: [PB, 11, PHK, PC] }),
  },
  {
    id: 'full-dout-nan',
    name: 'NaN in dout (row 7), not causal',
    t: FULL,
    poison: (t, x) => { x.dout[qAt(t, PB, 7, PH, PC)] = NaN; },
    pattern: (t) => doutPattern(t, [PB, 7, PH, PC], NaN),
  },
  {
    id: 'full-dout-minus-inf',
    name: '−Infinity in dout (row 7), not causal',
    t: FULL,
    poison: (t, x) => { x.dout[qAt(t, PB, 7, PH, PC)] = -Infinity; },
    pattern: (t) => doutPattern(t, [PB, 7, PH, PC], -Infinity),
  },
];

/**
 * Outputs that violate the rules: `test.failing`, per device. None today: both bugs below are fixed on
 * the CPU backend and in the CUDA kernels (the two comments after this one), so both maps are empty.
 *
 * Bug A (lse of a NaN row): a row whose scores hold a NaN (or a +∞, or are all −∞) gets lse =
 *   +Infinity, the value of a row that sees no key (csrc/cpu/tile_fwd.h and
 *   csrc/cuda/flash/fragment_softmax.cuh take `!(l > 0)` for "no key"), instead of NaN. Its out is
 *   NaN, or, when every score is −∞, 0: the row is silently taken for an empty one. The backward then
 *   recomputes P = exp(S − lse) = 0 for the row's finite scores, so the poisoned row adds 0 instead
 *   of NaN to dv (and, when all its scores are −∞, to everything): NaN silently disappears from the
 *   gradients.
 * Bug B (masked and padded positions): the tile products run over causally masked positions with
 *   P = 0 or dS = 0, and over the zero rows that pad a query tile past seqlen_q, and 0·NaN = 0·∞ =
 *   NaN. So a NaN or ∞ in a key or value row reaches rows of the same tile that do not see that key
 *   (out via P·V, dq via dS·K and D = rowsum(dO∘out)); a NaN q row reaches the dk rows of keys it
 *   does not see (dSᵀ·Q), even when the row sees no key at all; and a −∞ in k makes the padding
 *   rows' scores 0·(−∞) = NaN, which turns dk and dv of that key (exactly 0 in standard attention)
 *   into NaN. (seqlen_q = 40 fills no kernel's query tile: the CPU pads it to 48 rows, the CUDA
 *   kernels to 64 or more.)
 */
/**
 * The CPU fixes: csrc/cpu/tile_fwd.h finishes a row by its structure (no visible key: out 0, lse +∞)
 * and else by l (NaN l and l = 0, softmax's 0/0, give NaN); csrc/cpu/tile_bwd.h zeroes dS as well as P
 * where a row does not see a key, gives the padding rows no keys, and on tiles that cross the causal
 * diagonal runs the products whose other operand holds a NaN or ∞ without the hidden terms
 * (gemm_masked in tile_kernels.h; the forward's P·V likewise).
 */
/**
 * The CUDA fixes (every CUDA variant below; H100, 2026-11-21): the forward kernels end a row by its
 * structure too (fragment_softmax.cuh finish()), and on tiles that cross the causal diagonal they
 * zero V's NaN / ±∞ elements for the tensor-core product and add them back to the rows that see
 * their key (nonfinite_pv.cuh); the backward kernels set P and dS to exactly 0 by a select where a
 * row does not see a key, padding rows included. Bug B2, the backward's products: dV +=
 * Pᵀ·dO, dK += dSᵀ·Q and dQ += dS·K multiplied a hidden P or dS = 0 by a NaN / ±∞ of dO, Q or K on
 * crossing tiles. Now those elements are zeroed for the product and their visible terms added back,
 * on a rare path found by the rows' lse / D (Q, dO) and a scan of K (csrc/cuda/flash/bwd_nonfinite.cuh).
 */
const CUDA_KNOWN_BUGS: Record<string, readonly OutName[]> = {};
const KNOWN_BUGS: Record<Device, Record<string, readonly OutName[]>> = { cpu: {}, cuda: CUDA_KNOWN_BUGS };
const knownBug = (device: Device, id: string, n: OutName): boolean => (KNOWN_BUGS[device][id] ?? []).includes(n);

/** One set of kernels the poison cases run through. */
interface NanVariant {
  name: string;
  dtype: DType;
  /** Options over passOptions(). */
  extra: Partial<AttentionBackwardOptions>;
  /** The same-precision arithmetic of the clean run's flash rule. */
  precision: DType | 'tf32';
}

/**
 * The CPU backend in float32; on CUDA every family of FA2 kernels a call can reach on this GPU:
 * bfloat16 with the default backward ('auto': the two kernels on Hopper, the single kernel before),
 * the single kernel explicitly (deterministic), and float32 on the TF32 FA2 kernels.
 */
const NAN_VARIANTS: Record<Device, NanVariant[]> = {
  cpu: [{ name: 'float32', dtype: 'float32', extra: {}, precision: 'float32' }],
  cuda: [
    { name: 'bfloat16, default backward', dtype: 'bfloat16', extra: {}, precision: 'bfloat16' },
    { name: 'bfloat16, single-kernel backward', dtype: 'bfloat16', extra: { algorithm: 'single-kernel' }, precision: 'bfloat16' },
    { name: 'float32 on TF32 tensor cores', dtype: 'float32', extra: { kernel: 'flash' }, precision: 'tf32' },
  ],
};

/** Clean inputs of a case (seeded normal values, never zero), with its `prepare` applied. */
function cleanInputs(pc: PoisonCase): Inputs {
  const { t } = pc;
  const rng = rngFor(`numerics/${pc.id}`);
  const nq = t.b * t.sq * t.hq * t.d;
  const nk = t.b * t.sk * t.hkv * t.d;
  const x = { q: randn(nq, rng), k: randn(nk, rng), v: randn(nk, rng), dout: randn(nq, rng) };
  pc.prepare?.(t, x);
  return x;
}

function poisonedInputs(pc: PoisonCase, clean: Inputs): Inputs {
  const x = { q: clean.q.slice(), k: clean.k.slice(), v: clean.v.slice(), dout: clean.dout.slice() };
  pc.poison(pc.t, x);
  return x;
}

const likeQ = (n: OutName): boolean => n === 'out' || n === 'dq';
const shapeOfOutput = (t: ForwardShape, n: OutName): number[] => (n === 'lse' ? lseShapeOf(t) : likeQ(n) ? qShapeOf(t) : kShapeOf(t));
const dimsOf = (n: OutName): readonly string[] => (n === 'lse' ? LSE_DIMS : Q_DIMS);

/**
 * Element-by-element check of `actual` against the pattern: SAME elements bit-identical to `clean`
 * (Object.is), NAN / POS_INF / NON_FINITE as named, REF elements finite (their values go through the
 * rule separately). Returns up to 5 described violations and their count.
 */
function patternViolations(
  t: ForwardShape, n: OutName, pat: Uint8Array, actual: ArrayLike<number>, clean: ArrayLike<number>,
): { count: number; first: string[] } {
  let count = 0;
  const first: string[] = [];
  for (let e = 0; e < pat.length; e++) {
    const x = actual[e];
    const want = pat[e];
    const ok = want === SAME ? Object.is(x, clean[e])
      : want === NAN ? Number.isNaN(x)
        : want === POS_INF ? x === Infinity
          : want === NON_FINITE ? !Number.isFinite(x)
            : Number.isFinite(x);
    if (!ok) {
      count++;
      if (first.length < 5) {
        first.push(`${n}${decodeIndex(e, shapeOfOutput(t, n), dimsOf(n))} = ${x}, expected ${CODE_NAMES[want]}` +
          (want === SAME ? ` (${clean[e]})` : ''));
      }
    }
  }
  return { count, first };
}

/** The REF elements of one output gathered for the flash rule. */
function refSubset(pat: Uint8Array, ...arrays: ArrayLike<number>[]): Float64Array[] {
  const idx: number[] = [];
  for (let e = 0; e < pat.length; e++) if (pat[e] === REF) idx.push(e);
  return arrays.map((a) => Float64Array.from(idx, (e) => a[e]));
}

describe('NaN / ±Infinity propagation: the expected patterns are standard attention (float64 reference)', () => {
  test.each(POISON_CASES)('$name', (pc) => {
    const clean = cleanInputs(pc);
    const bad = poisonedInputs(pc, clean);
    const shape = shapeOf(pc.t);
    const opts = optionsOf(pc.t);
    const refClean = referenceAttentionBackward(clean.dout, clean.q, clean.k, clean.v, shape, opts);
    const refBad = referenceAttentionBackward(bad.dout, bad.q, bad.k, bad.v, shape, opts);
    const pat = pc.pattern(pc.t);
    const problems: string[] = [];
    for (const n of OUT_NAMES) {
      const r = patternViolations(pc.t, n, pat[n], refBad[n], refClean[n]);
      if (r.count > 0) problems.push(`${r.count} elements of the reference's ${n} break the pattern: ${r.first.join('; ')}`);
    }
    expect(problems).toEqual([]);
    // Sanity: the case poisons something, and leaves witnesses.
    const counts = OUT_NAMES.map((n) => pat[n].reduce((a, x) => a + (x === SAME ? 0 : 1), 0));
    if (pc.id.endsWith('-empty-row')) expect(counts).toEqual([0, 0, 0, 0, 0]);
    else if (pc.id.includes('dout')) {
      // Backward only: out and lse untouched, every gradient poisoned somewhere.
      expect(counts.slice(0, 2)).toEqual([0, 0]);
      for (const x of counts.slice(2)) expect(x).toBeGreaterThan(0);
    } else expect(counts[0]).toBeGreaterThan(0);
    for (const n of OUT_NAMES) expect(pat[n].includes(SAME)).toBe(true);
  });
});

/** Slack of the rule on `out` and the gradients (test/attention.test.ts's ATOL) and on lse. */
const ATOL = 1e-5;
const lseAtol = (lse: ArrayLike<number>): number => 1e-5 + 2 * 2 ** -24 * maxFiniteAbs(lse);

interface CaseRun {
  clean: Partial<Results>;
  bad: Partial<Results>;
  storedClean: Inputs;
  storedBad: Inputs;
}

describeEachDevice('NaN / ±Infinity propagate to the rows that depend on them and no further', (device: Device) => {
  describe.each(NAN_VARIANTS[device])('$name', ({ dtype, extra, precision }) => {
    const runs = new Map<string, Promise<CaseRun>>();
    const runCase = (pc: PoisonCase): Promise<CaseRun> => {
      let r = runs.get(pc.id);
      if (!r) {
        r = (async () => {
          const clean = cleanInputs(pc);
          const c = await runPasses(device, dtype, pc.t, clean, false, extra);
          const b = await runPasses(device, dtype, pc.t, poisonedInputs(pc, clean), false, extra);
          return { clean: c.got, bad: b.got, storedClean: c.stored, storedBad: b.stored };
        })();
        runs.set(pc.id, r);
      }
      return r;
    };

    test.each(POISON_CASES)('clean run of "$name" is fully written and matches the float64 reference', async (pc) => {
      const { clean, storedClean: s } = await runCase(pc);
      const shape = shapeOf(pc.t);
      const ref = referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, optionsOf(pc.t));
      const same = referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, { ...optionsOf(pc.t), precision });
      for (const n of OUT_NAMES) {
        expectAllWritten(clean[n]!, `${n} (clean ${pc.id}, ${device})`);
        expectFlashRule({
          actual: clean[n]!, reference: ref[n], samePrecision: same[n], factor: n === 'out' || n === 'lse' ? 2 : 3,
          atol: n === 'lse' ? lseAtol(ref.lse) : ATOL, name: `${n} (clean ${pc.id}, ${device})`,
          shape: shapeOfOutput(pc.t, n), dims: dimsOf(n),
        });
      }
    });

    for (const pc of POISON_CASES) {
      describe(pc.name, () => {
        for (const n of OUT_NAMES) {
          const known = knownBug(device, pc.id, n);
          (known ? test.failing : test)(`${n}${known ? ' (known bug, see KNOWN_BUGS)' : ''}`, async () => {
            const { clean, bad, storedBad: s } = await runCase(pc);
            const pat = pc.pattern(pc.t)[n];
            const r = patternViolations(pc.t, n, pat, bad[n]!, clean[n]!);
            expect(`${r.count} elements break the rule${r.count ? `: ${r.first.join('; ')}` : ''}`).toBe('0 elements break the rule');
            if (pat.includes(REF)) {
              // The elements that change but stay finite (−∞ in k): the rule against the reference of
              // the poisoned inputs.
              const shape = shapeOf(pc.t);
              const ref = referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, optionsOf(pc.t));
              const same = referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, { ...optionsOf(pc.t), precision });
              const [actual, reference, samePrecision] = refSubset(pat, bad[n]!, ref[n], same[n]);
              expectFlashRule({
                actual, reference, samePrecision, factor: n === 'out' || n === 'lse' ? 2 : 3,
                atol: n === 'lse' ? lseAtol(ref.lse) : ATOL, name: `${n} (changed elements of ${pc.id}, ${device})`,
              });
            }
          });
        }
      });
    }
  });
});

// ------------------------------------------------------------------------------------------------
// Part 2: large magnitudes
// ------------------------------------------------------------------------------------------------

interface BigCase {
  name: string;
  t: ForwardShape;
  dtype: DType;
  /** Forward only (scores far beyond ~1e5: see HUGE_SCORES_BUG). */
  fwdOnly?: boolean;
  gen: (t: ForwardShape, label: string) => Inputs;
  /** Smallest max |lse| the case must reach (that the scores really were large). */
  minLse: number;
  /** Devices where the case fails today (`test.failing`; see HUGE_SCORES_BUG). */
  knownBug?: readonly Device[];
}

/** `n` random nonzero integers in [−max, max] (or [1, max] with sign > 0), times `mul`. */
function ints(n: number, max: number, rng: ReturnType<typeof rngFor>, mul = 1, sign = 0): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const m = 1 + rng.int(max);
    const s = sign !== 0 ? sign : rng.int(2) === 0 ? -1 : 1;
    a[i] = s * m * mul;
  }
  return a;
}

/** q, k, v, dout: random nonzero integers in ±[1, qkMax]·qkMul (q, k) and ±[1, 4] (v, dout). */
function intInputs(qkMax: number, qkMul = 1) {
  return (t: ForwardShape, label: string): Inputs => {
    const rng = rngFor(label);
    const nq = t.b * t.sq * t.hq * t.d;
    const nk = t.b * t.sk * t.hkv * t.d;
    return { q: ints(nq, qkMax, rng, qkMul), k: ints(nk, qkMax, rng, qkMul), v: ints(nk, 4, rng), dout: ints(nq, 4, rng) };
  };
}

/**
 * Keys on a ramp: k_j = ramp(j)·(1, …, 1) + small integer noise, q > 0: row i's score with key j is
 * scale·(ramp(j)·Σq_i + q_i·noise_j), so consecutive keys differ by ~scale·Σq·step. Integers only,
 * every q·k below 2^24: exact in float32 whatever the summation order (as test/attention.test.ts's
 * large-score inputs, so the rule compares arithmetic, not near-ties rounded two ways).
 */
function rampInputs(ramp: (j: number) => number) {
  return (t: ForwardShape, label: string): Inputs => {
    const rng = rngFor(label);
    const nq = t.b * t.sq * t.hq * t.d;
    const k = new Float32Array(t.b * t.sk * t.hkv * t.d);
    for (let b = 0; b < t.b; b++) {
      for (let j = 0; j < t.sk; j++) {
        for (let hk = 0; hk < t.hkv; hk++) {
          for (let c = 0; c < t.d; c++) k[kAt(t, b, j, hk, c)] = ramp(j) + (rng.int(3) - 1) * 8;
        }
      }
    }
    return { q: ints(nq, 4, rng, 1, 1), k, v: ints(k.length, 4, rng), dout: ints(nq, 4, rng) };
  };
}

/**
 * Scores far beyond ~1e4 (forward only: the backward recomputes P = exp(S − lse) from a float32 lse,
 * whose rounding alone is ~|S|·2^-24 in the exponent, as in every FlashAttention-2 backward, so
 * gradients are meaningful only while |S| ≲ 1e5). The docs promise correct results while the scaled
 * scores fit in float32 (|score| < 3.4e38).
 *
 * Bug C (CPU, fixed): the CPU forward computed P = exp2(fma(S, scale·log2e, −off)) with off =
 * m·scale·log2e rounded to float32. For the row max itself the exponent was then the rounding error
 * of off, up to half an ulp of |m·scale·log2e|: beyond ~2^31 (scores ≳ 1.5e9) it passed the ±127
 * clamp of exp2v, so the max key's P became 0 (the row looked empty: out 0, lse +Infinity) or 2^127
 * (overflow: Inf and NaN); every row was wrong beyond ~1e11. It now computes P = exp2((S − m)·scale·
 * log2e) (csrc/cpu/tile_fwd.h), exact for the max. The CUDA FA2 forward takes the max over the
 * rounded scaled scores and computes P = 2^(x − max), exact for the max, so it should pass too (not
 * run on a GPU yet); on CUDA float32 runs the naive kernel here. Devices listed here run the cases
 * as `test.failing`.
 */
const HUGE_SCORES_BUG: readonly Device[] = [];

const BIG_CASES: BigCase[] = [
  {
    // Σq ≈ 64·2.5, step 48, scale 1/8: consecutive keys ~960 apart, scores 0 … ~2e5 over 200 keys:
    // the max rises by ~6e4 per 64-key tile, so every earlier tile's P, l and O are rescaled by
    // exactly 0. Causal: row i's max is its last visible key.
    name: 'max rising by ~1e4 per key tile (scores up to ~2e5), 200x200 causal, d64, fp32, H2',
    t: { b: 1, sq: 200, sk: 200, hq: 2, hkv: 2, d: 64, causal: true, scale: 1 / 8 },
    dtype: 'float32',
    gen: rampInputs((j) => 48 * j),
    minLse: 1e4,
  },
  {
    // The reverse: key 0 holds the max (scores ~5e3, ~20 apart from key to key): from the second
    // 64-key tile on, every P underflows to exactly 0 (and the max never moves again).
    name: 'max in the first key tile, every later tile ≥ 1e3 below (P underflows to 0), 70x260, d64, fp32, GQA 2:1',
    t: { b: 1, sq: 70, sk: 260, hq: 4, hkv: 2, d: 64, causal: false, scale: 1 / 64 },
    dtype: 'float32',
    gen: rampInputs((j) => 8 * (256 - Math.min(j, 255))),
    minLse: 4e3,
  },
  {
    // q, k in ±{100, 200}: scores ~±2e4 of both signs; 50 rows see no key (exactly 0 and +Infinity).
    name: 'scores ~±1e4 with rows that see no key, 150x100 causal (50 empty rows), d32, fp16, MQA 4:1, B2',
    t: { b: 2, sq: 150, sk: 100, hq: 4, hkv: 1, d: 32, causal: true },
    dtype: 'float16',
    gen: intInputs(2, 100),
    minLse: 2e3,
  },
  {
    // The same in bfloat16, not causal, seqlenQ < seqlenK.
    name: 'scores ~±1e4, 70x150, d64, bf16, GQA 3:1',
    t: { b: 1, sq: 70, sk: 150, hq: 3, hkv: 1, d: 64 , causal: false },
    dtype: 'bfloat16',
    gen: intInputs(2, 100),
    minLse: 2e3,
  },
  {
    // Integer q·k (|q·k| ≤ 1024, row maxima ~150), softmaxScale 1e9: scores ~1e11, distinct scores
    // ≥ 1e9 apart (a one-hot softmax; ties share it).
    name: 'scores ~±1e11 (softmaxScale 1e9), forward, 90x130 causal, d64, fp32',
    t: { b: 1, sq: 90, sk: 130, hq: 2, hkv: 1, d: 64, causal: true, scale: 1e9 },
    dtype: 'float32',
    fwdOnly: true,
    gen: intInputs(4),
    minLse: 5e10,
    knownBug: HUGE_SCORES_BUG,
  },
  {
    // softmaxScale 1e27: scores up to ~1e30 (×log2e still a finite float32).
    name: 'scores ~±1e30 (softmaxScale 1e27), forward, 90x130 causal, d64, fp32',
    t: { b: 1, sq: 90, sk: 130, hq: 2, hkv: 1, d: 64, causal: true, scale: 1e27 },
    dtype: 'float32',
    fwdOnly: true,
    gen: intInputs(4),
    minLse: 1e29,
    knownBug: HUGE_SCORES_BUG,
  },
  {
    name: 'scores ~±1e30 (softmaxScale 1e27), forward, 130x90 causal (40 empty rows), d64, bf16',
    t: { b: 1, sq: 130, sk: 90, hq: 2, hkv: 1, d: 64, causal: true, scale: 1e27 },
    dtype: 'bfloat16',
    fwdOnly: true,
    gen: intInputs(4),
    minLse: 1e29,
    knownBug: HUGE_SCORES_BUG,
  },
];

describeEachDevice('large-magnitude scores stay finite and correct (beyond test/attention.test.ts)', (device: Device) => {
  const cases = (bug: boolean): BigCase[] => BIG_CASES.filter((bc) => (bc.knownBug ?? []).includes(device) === bug);
  const run = async (bc: BigCase): Promise<void> => {
    const { t, dtype } = bc;
    const { stored: s, got } = await runPasses(device, dtype, t, bc.gen(t, `numerics/big/${device}/${bc.name}`), bc.fwdOnly);
    const shape = shapeOf(t);
    const opts = optionsOf(t);
    const ref: Partial<Record<OutName, Float64Array>> = bc.fwdOnly
      ? referenceAttention(s.q, s.k, s.v, shape, opts)
      : referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, opts);
    const same: Partial<Record<OutName, Float64Array>> = bc.fwdOnly
      ? referenceAttention(s.q, s.k, s.v, shape, { ...opts, precision: dtype })
      : referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, { ...opts, precision: dtype });
    const names = (bc.fwdOnly ? ['out', 'lse'] : OUT_NAMES) as OutName[];

    // Finite everywhere (outputs start as NaN, so this also proves every element was written), except
    // lse = +Infinity exactly on the rows that see no key.
    const empty = t.causal ? Math.max(0, t.sq - t.sk) : 0;
    const bad: string[] = [];
    for (const n of names) {
      let count = 0;
      got[n]!.forEach((x, e) => {
        const emptyRow = n === 'lse' && e % t.sq < empty;
        if (emptyRow ? x !== Infinity : !Number.isFinite(x)) {
          if (count++ < 3) bad.push(`${n}${decodeIndex(e, shapeOfOutput(t, n), dimsOf(n))} = ${x}`);
        }
      });
      if (count > 3) bad.push(`... ${count} such elements of ${n}`);
    }
    expect(bad).toEqual([]);
    expect(maxFiniteAbs(got.lse!)).toBeGreaterThan(bc.minLse);

    // The rule, with test/attention.test.ts's slack: lse also rounds |lse| and the scores' partial
    // sums differently from a plain implementation; gradients get the large-magnitude floors.
    const rule = (n: OutName, atol: number): void => {
      const input: FlashRuleInput = {
        actual: got[n]!, reference: ref[n]!, samePrecision: same[n]!,
        factor: n === 'out' || n === 'lse' ? 2 : 3, atol, name: `${n} (${bc.name}, ${device})`,
        shape: shapeOfOutput(t, n), dims: dimsOf(n),
      };
      const rep = checkFlashRule(input);
      if (!rep.pass) throw new Error(formatFlashReport(input, rep));
    };
    rule('out', ATOL);
    rule('lse', 1e-5 + lseRoundingSlack(maxFiniteAbs(ref.lse!), scoreMagnitude(t, s.q, s.k)));
    if (!bc.fwdOnly) {
      const r = { out: ref.out!, lse: ref.lse!, dq: ref.dq!, dk: ref.dk!, dv: ref.dv! };
      const slack = gradientSlack(t, { ...s, out: got.out!, lse: got.lse! }, r, true);
      for (const n of ['dq', 'dk', 'dv'] as const) rule(n, GRAD_ATOL + slack[n]);
    }
  };
  test.each(cases(false))('$name', run);
  if (cases(true).length > 0) test.failing.each(cases(true))('$name (known bug C, see HUGE_SCORES_BUG)', run);
});
