/**
 * Fuzzing the raw binding (issue 16): test/helpers/fuzz-binding.ts calls every function of the
 * addon with random argument lists (fast-check) in a child process, so a crash is caught and
 * reported with its seed instead of ending the test runner. The test fails on a crash, on an error
 * that is not an Error with a real message, and on any call after which memory() did not return to
 * what it was.
 *
 * Cases per run: FUZZ_CASES (default 3000, in three children). Seeds come from the file's seed
 * (helpers/random.ts): replay with `FA_TEST_SEED=<seed> npx jest test/fuzz.test.ts`.
 * scripts/fuzz.js runs longer campaigns.
 */
import * as path from 'path';

import { runNodeChild } from './helpers/child';
import { rngFor, seedHint } from './helpers/random';

const DRIVER = path.resolve(__dirname, 'helpers', 'fuzz-binding.ts');
const CASES = Number(process.env.FUZZ_CASES ?? 3000);
const CHILDREN = 3;

describe('the raw binding under random argument lists', () => {
  const rng = rngFor('fuzz');
  const seeds = Array.from({ length: CHILDREN }, () => rng.int(2 ** 31));

  test.each(seeds.map((s, i) => [i, s]))('child %i (fast-check seed %i): no crash, no leak, only real errors', (_, seed) => {
    const cases = Math.ceil(CASES / CHILDREN);
    const script = `
      require(${JSON.stringify(DRIVER)}).fuzzBinding(${seed}, ${cases}).then(
        (r) => { process.stdout.write(JSON.stringify(r) + '\\n'); },
        (e) => { console.error(e); process.exitCode = 3; });
    `;
    const run = runNodeChild(script, { cwd: process.cwd(), timeoutMs: 120000 });
    const where = `fast-check seed ${seed}, ${seedHint()}`;
    expect({ signal: run.signal, status: run.status, where, stderr: run.stderr.slice(-2000) })
      .toEqual({ signal: null, status: 0, where, stderr: expect.any(String) });
    const report = JSON.parse(run.stdout.trim().split('\n').pop() as string) as {
      cases: number; threw: number; returned: number; findings: unknown[];
    };
    expect(report.cases).toBe(cases);
    expect(report.threw + report.returned).toBe(cases);
    expect(report.threw).toBeGreaterThan(cases / 2);  // garbage is mostly refused: the calls reach the checks
    expect({ findings: report.findings.slice(0, 20), where }).toEqual({ findings: [], where });
  });
});
