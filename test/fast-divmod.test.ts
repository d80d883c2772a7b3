/**
 * FastDivmod (csrc/cuda/flash/fast_divmod.h): the query-tile schedulers of every CUDA attention
 * forward and of the dQ kernel turn a work item into (query tile, head, batch, KV head) by
 * multiply-high and shift with multipliers built on the host. A wrong multiplier would send a block
 * to the wrong tile. test/native/divmod_check.cc compares it with the integer division on every
 * dividend below 2^16 for divisors 1-4096, and on the powers of two, random divisors and the
 * multiples near the top of the promised range (below 2^31), built with the host compiler.
 */
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

const root = path.resolve(__dirname, '..');
const cxx = process.env.CXX || 'g++';

describe('FastDivmod against the integer division', () => {
  let dir: string;
  let bin: string;

  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'divmod-check-'));
    bin = path.join(dir, 'divmod_check');
    const build = spawnSync(cxx, ['-std=c++17', '-O2', '-Wall', '-Wextra', '-Werror', `-I${path.join(root, 'csrc')}`,
      path.join(root, 'test', 'native', 'divmod_check.cc'), '-o', bin], { encoding: 'utf8' });
    if (build.status !== 0) throw new Error(`${cxx} failed to build divmod_check.cc:\n${build.stderr}`);
  }, 120_000);

  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  test.each([1, 2])('every checked quotient and remainder agree (seed %i)', (seed) => {
    const run = spawnSync(bin, ['--seed', String(seed)], { encoding: 'utf8' });
    expect(run.stdout).toMatch(/^divmod_check: OK: 24187 divisors, \d+ divisions \(seed \d+\)/);
    expect(run.status).toBe(0);
  });
});
