/**
 * The bench's timing order: where a cell has more than one of our rows (backward variants), their
 * timed runs take turns in rounds, so that clock drift under sustained load weighs on every row
 * alike. Runs on the CPU backend, with the timing function wrapped to record each timed batch.
 */
import { parseArgs } from '../bench/args';
import { buildCells } from '../bench/grid';
import { INTERLEAVE_ROUNDS, runOurs } from '../bench/runner';
import * as timing from '../lib/timing';

jest.mock('../lib/timing', () => {
  const actual = jest.requireActual('../lib/timing');
  return { ...actual, timeRepeatsOnDevice: jest.fn(actual.timeRepeatsOnDevice) };
});

const timed = timing.timeRepeatsOnDevice as jest.MockedFunction<typeof timing.timeRepeatsOnDevice>;

function cpuSettings(argv: string[]) {
  const cmd = parseArgs(['--device', 'cpu', '--seqlen', '64', '--head-dim', '16', '--heads', '2', '--causal', 'false', ...argv], 'cpu');
  if (cmd.kind !== 'run') throw new Error(`expected a run command, got ${cmd.kind}`);
  return cmd.settings;
}

describe('bench timing order', () => {
  beforeEach(() => timed.mockClear());

  test('backward variants take turns in rounds, each timed `repeats` times in all', async () => {
    const s = cpuSettings(['--pass', 'bwd', '--repeats', '7', '--warmup', '0', '--variants', 'single-kernel,deterministic']);
    const rows = await runOurs(buildCells(s), s, null);
    expect(rows.map((r) => [r.impl, r.status])).toEqual([
      ['ours', 'ok'], ['ours-single-kernel', 'ok'], ['ours-deterministic', 'ok'],
    ]);
    // One batch per row and round, the rows in turn within each round: 3 per round for 5 rounds.
    const batches = timed.mock.calls.map((c) => c[2]);
    expect(batches).toHaveLength(3 * INTERLEAVE_ROUNDS);
    const fns = timed.mock.calls.map((c) => c[1]);
    const distinct = [...new Set(fns)];
    expect(distinct).toHaveLength(3);
    for (let round = 0; round < INTERLEAVE_ROUNDS; round++) {
      expect(fns.slice(3 * round, 3 * round + 3)).toEqual(distinct);
    }
    // 7 runs over 5 rounds: the first two rounds take 2 of each, the others 1.
    expect(batches).toEqual([2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    for (const fn of distinct) {
      expect(timed.mock.calls.filter((c) => c[1] === fn).reduce((n, c) => n + c[2], 0)).toBe(7);
    }
  });

  test('a cell with one row of ours times it in one batch', async () => {
    const s = cpuSettings(['--pass', 'fwd', '--repeats', '4', '--warmup', '0']);
    const rows = await runOurs(buildCells(s), s, null);
    expect(rows.map((r) => [r.impl, r.status])).toEqual([['ours', 'ok']]);
    expect(timed.mock.calls.map((c) => c[2])).toEqual([4]);
  });

  test('fewer repeats than rounds: one run a round', async () => {
    const s = cpuSettings(['--pass', 'bwd', '--repeats', '3', '--warmup', '0', '--variants', 'single-kernel']);
    await runOurs(buildCells(s), s, null);
    expect(timed.mock.calls.map((c) => c[2])).toEqual([1, 1, 1, 1, 1, 1]);
  });
});
