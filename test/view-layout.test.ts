/**
 * The overlap and nesting checks of csrc/common/view_layout.h, which every binding that takes views
 * runs before it reads or writes through them (a wrong "no overlap" would let an op write into its
 * own input). test/native/view_check.cc compares them with brute force on random nested views: pairs
 * of one layout (the path that decides packed q / k / v views) and of different layouts.
 */
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

const root = path.resolve(__dirname, '..');
const cxx = process.env.CXX || 'g++';

describe('views_overlap and view_nested against brute force', () => {
  let dir: string;
  let bin: string;

  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'view-check-'));
    bin = path.join(dir, 'view_check');
    const build = spawnSync(cxx, ['-std=c++17', '-O2', '-Wall', '-Wextra', '-Werror', `-I${path.join(root, 'csrc')}`,
      path.join(root, 'test', 'native', 'view_check.cc'), '-o', bin], { encoding: 'utf8' });
    if (build.status !== 0) throw new Error(`${cxx} failed to build view_check.cc:\n${build.stderr}`);
  }, 120_000);

  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  test.each([1, 2, 3])('200,000 random pairs agree (seed %i)', (seed) => {
    const run = spawnSync(bin, ['--seed', String(seed)], { encoding: 'utf8' });
    expect(run.stdout).toMatch(/^view_check: OK: 200000 pairs \(100000 of one layout\), \d+ overlapping/);
    expect(run.status).toBe(0);
  });
});
