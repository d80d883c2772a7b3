/**
 * The bench's timing order: where a cell has more than one of our rows (backward variants), their
 * timed runs take turns in rounds, so that clock drift under sustained load weighs on every row
 * alike; the round hooks (where the CLI times PyTorch's round of the same cell) run between our
 * rounds, only for cells that reach their timed runs; each input group's afterGroup hook runs right
 * after that group, before the next one is timed. Runs on the CPU backend, with the timing function
 * wrapped to record each timed batch.
 */
import { spawnSync } from 'child_process';
import * as path from 'path';
import { parseArgs } from '../bench/args';
import { BenchCell, buildCells, groupByInputs } from '../bench/grid';
import { BenchRow, INTERLEAVE_ROUNDS, roundSizes, RunHooks, runOurs, timedRounds } from '../bench/runner';
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

  test('runOurs draws the same inputs with or without hooks: seeds follow the groups', async () => {
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
      const rounds = await inputsOf({ beforeRounds: () => undefined, afterRound: () => undefined, afterRounds: () => undefined });
      expect(plain).toHaveLength(2 * 4); // q, k, v, dout per group
      expect(new Set(plain.map((x) => x.join())).size).toBe(8);
      expect(hooked).toEqual(plain);
      expect(rounds).toEqual(plain);
    } finally {
      made.mockRestore();
    }
  });

  /** Runs `cells` with every hook recording into `events` (timed batches too), the hooks awaited with a pause. */
  async function recordOrder(cells: readonly BenchCell[], s: ReturnType<typeof cpuSettings>, extra: RunHooks = {}): Promise<{ events: string[]; rows: BenchRow[] }> {
    const events: string[] = [];
    const pause = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 5));
    timed.mockImplementation(async (...args) => {
      events.push(`timed ${args[2]}`);
      return jest.requireActual<typeof timing>('../lib/timing').timeRepeatsOnDevice(...args);
    });
    try {
      const rows = await runOurs(cells, s, null, {
        onRow: (r) => events.push(`row ${r.impl} ${r.id} ${r.status}`),
        beforeRounds: async (cell, rounds) => {
          events.push(`before ${cell.id} ${rounds.join(',')}`);
          await pause(); // awaited: nothing of ours is timed meanwhile
        },
        afterRound: async (cell, index) => {
          events.push(`round ${cell.id} ${index}`);
          await pause();
        },
        afterRounds: async (cell) => {
          events.push(`after ${cell.id}`);
          await pause();
        },
        afterGroup: (group) => {
          events.push(`group ${group.map((c) => c.id).join(',')}`);
        },
        ...extra,
      });
      return { events, rows };
    } finally {
      timed.mockImplementation(jest.requireActual<typeof timing>('../lib/timing').timeRepeatsOnDevice);
    }
  }

  test('round hooks: before the first round, after each, after the last once the rows are out; one row is split into rounds too', async () => {
    const s = cpuSettings(['--seqlen', '32,64', '--pass', 'fwd', '--repeats', '7', '--warmup', '0']);
    const cells = buildCells(s);
    expect(cells).toHaveLength(2);
    const { events, rows } = await recordOrder(cells, s);
    expect(rows.map((r) => [r.id, r.status])).toEqual(cells.map((c) => [c.id, 'ok']));
    const rounds = timedRounds(7);
    expect(rounds).toEqual([2, 2, 1, 1, 1]);
    const cellEvents = (id: string): string[] => [
      `before ${id} 2,2,1,1,1`,
      ...rounds.flatMap((n, i) => [`timed ${n}`, `round ${id} ${i}`]),
      `row ours ${id} ok`,
      `after ${id}`,
    ];
    // The two cells have inputs of their own: a group each.
    expect(events).toEqual([...cellEvents(cells[0].id), `group ${cells[0].id}`, ...cellEvents(cells[1].id), `group ${cells[1].id}`]);
  });

  test('round hooks with backward variants: every row times its share of the round before the hook', async () => {
    const s = cpuSettings(['--pass', 'bwd', '--repeats', '3', '--warmup', '0', '--variants', 'single-kernel']);
    const [cell] = buildCells(s);
    const { events } = await recordOrder([cell], s);
    expect(events).toEqual([
      `before ${cell.id} 1,1,1`,
      'timed 1', 'timed 1', `round ${cell.id} 0`,
      'timed 1', 'timed 1', `round ${cell.id} 1`,
      'timed 1', 'timed 1', `round ${cell.id} 2`,
      `row ours ${cell.id} ok`, `row ours-single-kernel ${cell.id} ok`,
      `after ${cell.id}`,
      `group ${cell.id}`,
    ]);
  });

  test('round hooks are not called for a cell whose rows all fail before timing, nor for a group whose inputs fail', async () => {
    // kernel 'naive' is CUDA-only: on the CPU every row fails at its first run.
    const s = { ...cpuSettings(['--seqlen', '32,64', '--pass', 'fwd', '--repeats', '2', '--warmup', '0']), kernel: 'naive' as const };
    const cells = buildCells(s);
    const failed = await recordOrder(cells, s);
    expect(failed.rows.map((r) => r.status)).toEqual(['error', 'error']);
    expect(failed.rows[0].error).toMatch(/Expected kernel to be 'auto' or 'flash' on device 'cpu' but received 'naive'/);
    expect(failed.events).toEqual([`row ours ${cells[0].id} error`, `group ${cells[0].id}`, `row ours ${cells[1].id} error`, `group ${cells[1].id}`]);

    // The first group's first input cannot be made: its cells fail before anything runs; the next group is timed as usual.
    const ok = cpuSettings(['--seqlen', '32,64', '--pass', 'fwd', '--repeats', '2', '--warmup', '0']);
    const made = jest.spyOn(Tensor, 'fromFloat32Array').mockImplementationOnce(() => {
      throw new Error('CUDA out of memory (test)');
    });
    try {
      const { events, rows } = await recordOrder(cells, ok);
      expect(rows.map((r) => [r.id, r.status])).toEqual([[cells[0].id, 'oom'], [cells[1].id, 'ok']]);
      expect(events).toEqual([
        `row ours ${cells[0].id} oom`, `group ${cells[0].id}`,
        `before ${cells[1].id} 1,1`, 'timed 1', `round ${cells[1].id} 0`, 'timed 1', `round ${cells[1].id} 1`,
        `row ours ${cells[1].id} ok`, `after ${cells[1].id}`, `group ${cells[1].id}`,
      ]);
    } finally {
      made.mockRestore();
    }
  });

  test('a row that fails in a round sits out the later rounds; the hooks still see every round', async () => {
    const s = cpuSettings(['--pass', 'fwd', '--repeats', '3', '--warmup', '0']);
    const [cell] = buildCells(s);
    const events: string[] = [];
    let batches = 0;
    timed.mockImplementation(async (...args) => {
      events.push(`timed ${args[2]}`);
      if (++batches === 2) throw new Error('device lost (test)');
      return jest.requireActual<typeof timing>('../lib/timing').timeRepeatsOnDevice(...args);
    });
    try {
      const rows = await runOurs([cell], s, null, {
        onRow: (row) => void events.push(`row ${row.status}`),
        beforeRounds: () => void events.push('before'),
        afterRound: (_c, i) => void events.push(`round ${i}`),
        afterRounds: () => void events.push('after'),
      });
      expect(rows.map((x) => [x.status, x.error])).toEqual([['error', 'device lost (test)']]);
    } finally {
      timed.mockImplementation(jest.requireActual<typeof timing>('../lib/timing').timeRepeatsOnDevice);
    }
    // The caller's rounds keep their turns: PyTorch's side of the cell still has three rounds.
    expect(events).toEqual(['before', 'timed 1', 'round 0', 'timed 1', 'round 1', 'round 2', 'row error', 'after']);
  });

  test('timedRounds: INTERLEAVE_ROUNDS rounds as even as can be, fewer for fewer repeats, never an empty one', () => {
    expect(roundSizes(12, 5)).toEqual([3, 3, 2, 2, 2]);
    expect(timedRounds(20)).toEqual([4, 4, 4, 4, 4]);
    expect(timedRounds(3)).toEqual([1, 1, 1]);
    expect(timedRounds(1)).toEqual([1]);
    for (let r = 1; r <= 40; r++) {
      const sizes = timedRounds(r);
      expect(sizes).toHaveLength(Math.min(INTERLEAVE_ROUNDS, r));
      expect(sizes.reduce((a, b) => a + b, 0)).toBe(r);
      expect(Math.min(...sizes)).toBeGreaterThan(0);
      expect(Math.max(...sizes) - Math.min(...sizes)).toBeLessThanOrEqual(1);
    }
  });

  test('timedRounds is bench/torch_sdpa.py\'s cell_rounds: at equal repeats, ours and PyTorch\'s rounds match', () => {
    const probe = [
      'import importlib.util, json, sys',
      'sys.dont_write_bytecode = True',
      'spec = importlib.util.spec_from_file_location("torch_sdpa", sys.argv[1])',
      'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)',
      'print(json.dumps([m.INTERLEAVE_ROUNDS, [m.cell_rounds(r) for r in range(1, 61)], m.round_sizes(12, 5)]))',
    ].join('\n');
    const r = spawnSync('python3', ['-c', probe, path.join(__dirname, '..', 'bench', 'torch_sdpa.py')], { encoding: 'utf8', timeout: 60000 });
    expect(r.stderr).toBe('');
    const [rounds, cellRounds, sizes] = JSON.parse(r.stdout) as [number, number[][], number[]];
    expect(rounds).toBe(INTERLEAVE_ROUNDS);
    expect(cellRounds).toEqual(Array.from({ length: 60 }, (_, i) => timedRounds(i + 1)));
    expect(sizes).toEqual(roundSizes(12, 5));
  });
});
