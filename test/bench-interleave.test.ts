/**
 * The bench's timing order: where a cell has more than one of our rows (backward variants), their
 * timed runs take turns in rounds, so that clock drift under sustained load weighs on every row
 * alike; each input group's afterGroup hook (where the CLI times PyTorch) runs right after that
 * group, before the next one is timed. Runs on the CPU backend, with the timing function wrapped to
 * record each timed batch.
 */
import { parseArgs } from '../bench/args';
import { BenchCell, buildCells, groupByInputs } from '../bench/grid';
import { INTERLEAVE_ROUNDS, runOurs } from '../bench/runner';
import { Tensor } from '../lib';
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

  test('afterGroup runs once per input group, with its rows, after its timing and before the next group\'s', async () => {
    const s = cpuSettings(['--seqlen', '32,64', '--pass', 'fwd,bwd', '--causal', 'both', '--repeats', '2', '--warmup', '0']);
    const cells = buildCells(s);
    const events: string[] = [];
    timed.mockImplementation(async (...args) => {
      events.push('timed');
      return jest.requireActual<typeof timing>('../lib/timing').timeRepeatsOnDevice(...args);
    });
    const seen: Array<{ group: readonly BenchCell[]; rows: string[] }> = [];
    try {
      const rows = await runOurs(cells, s, null, {
        afterGroup: async (group, groupRows) => {
          events.push(`group ${seen.length}`);
          await new Promise((resolve) => setTimeout(resolve, 20)); // awaited: nothing is timed meanwhile
          seen.push({ group, rows: groupRows.map((r) => r.id) });
        },
      });
      expect(rows.map((r) => r.id)).toEqual(cells.map((c) => c.id));
    } finally {
      timed.mockImplementation(jest.requireActual<typeof timing>('../lib/timing').timeRepeatsOnDevice);
    }
    const groups = groupByInputs(cells);
    expect(groups.map((g) => g.length)).toEqual([4, 4]);
    expect(seen.map((x) => x.group)).toEqual(groups);
    expect(seen.map((x) => x.rows)).toEqual(groups.map((g) => g.map((c) => c.id)));
    // One timed batch per cell (one row each), each group's four before its hook.
    expect(events).toEqual(['timed', 'timed', 'timed', 'timed', 'group 0', 'timed', 'timed', 'timed', 'timed', 'group 1']);
  });

  test('runOurs draws the same inputs with or without afterGroup: seeds follow the groups', async () => {
    const s = cpuSettings(['--seqlen', '32,64', '--pass', 'fwd', '--repeats', '1', '--warmup', '0']);
    const cells = buildCells(s);
    const made = jest.spyOn(Tensor, 'fromFloat32Array');
    /** The first values of every input runOurs makes, in order. */
    const inputsOf = async (hooks: Parameters<typeof runOurs>[3]): Promise<number[][]> => {
      made.mockClear();
      await runOurs(cells, s, null, hooks);
      return made.mock.calls.map((c) => Array.from(c[0].subarray(0, 3)));
    };
    try {
      const plain = await inputsOf({});
      const hooked = await inputsOf({ afterGroup: () => undefined });
      expect(plain).toHaveLength(2 * 4); // q, k, v, dout per group
      expect(new Set(plain.map((x) => x.join())).size).toBe(8);
      expect(hooked).toEqual(plain);
    } finally {
      made.mockRestore();
    }
  });
});
