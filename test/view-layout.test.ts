/**
 * The overlap and nesting checks of csrc/common/view_layout.h, which every binding that takes views
 * runs before it reads or writes through them (a wrong "no overlap" would let an op write into its
 * own input). test/native/view_check.cc compares them with brute force on random nested views: pairs
 * of one layout (the path that decides packed q / k / v views) and of different layouts.
 */
import { buildHostCheck, HostCheck } from './helpers/host-check';

describe('views_overlap and view_nested against brute force', () => {
  let check: HostCheck;

  beforeAll(() => {
    check = buildHostCheck('view_check');
  }, 120_000);

  afterAll(() => check?.remove());

  test.each([1, 2, 3])('200,000 random pairs agree (seed %i)', (seed) => {
    const run = check.run(seed);
    expect(run.stdout).toMatch(/^view_check: OK: 200000 pairs \(100000 of one layout\), \d+ overlapping/);
    expect(run.status).toBe(0);
  });
});
