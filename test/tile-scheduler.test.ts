/**
 * The CUDA query-tile scheduler's host-checkable parts, built with the host compiler (no GPU):
 * - FastDivmod (csrc/cuda/flash/fast_divmod.h): the multiply-high-and-shift division by a launch's
 *   sizes. test/native/divmod_check.cc compares it with the integer division on every dividend below
 *   2^16 for divisors 1-4096, and on the powers of two, random divisors and the multiples near the top
 *   of the promised range (below 2^31).
 * - QueryTileScheduler (csrc/cuda/flash/query_tile_scheduler.h): every grid of query tiles (the
 *   forwards, the dQ kernel) turns a work item into (query tile, head, batch, KV head) with it.
 *   test/native/scheduler_check.cc compares every item of 3,000 random launches (GQA, tile rows 64 /
 *   128 / 192, L2 sections by default, of one head, of all heads) with the plain divisions, checks
 *   that each tile comes up once and that longest-first sections go heaviest tile first, and that
 *   launches of 2^31 items are refused. A wrong item would send a block to the wrong tile.
 */
import { buildHostCheck, HostCheck } from './helpers/host-check';

describe.each([
  { name: 'divmod_check', summary: /^divmod_check: OK: 24187 divisors, \d+ divisions \(seed \d+\)/ },
  { name: 'scheduler_check', summary: /^scheduler_check: OK: 3000 launches, \d+ items \(seed \d+\)/ },
])('$name, built with the host compiler', ({ name, summary }) => {
  let check: HostCheck;

  beforeAll(() => {
    check = buildHostCheck(name);
  }, 120_000);

  afterAll(() => check?.remove());

  test.each([1, 2])('agrees with the plain divisions (seed %i)', (seed) => {
    const run = check.run(seed);
    expect(run.stdout).toMatch(summary);
    expect(run.status).toBe(0);
  });
});
