/**
 * Fuzzing (issue 16) with random argument lists (fast-check), each run in a child process, so a
 * crash is caught and reported with its seed instead of ending the test runner:
 * - the raw binding (test/helpers/fuzz-binding.ts): every function of the addon;
 * - the public API (test/helpers/fuzz-api.ts): every exported function and class and every Tensor
 *   method, with real and imitation tensors and options objects.
 * A test fails on a crash, on an error that is not an Error with a message of its own (a bare
 * "internal" one, or an engine TypeError that means a missing check), and on any call after which
 * memory() did not return to what it was.
 *
 * Cases per run: FUZZ_CASES (default 3000) for each, in three children. Seeds come from the file's
 * seed (helpers/random.ts): replay with `FA_TEST_SEED=<seed> npx jest test/fuzz.test.ts`.
 * scripts/fuzz.js runs longer campaigns.
 */
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

import { runNodeChild } from './helpers/child';
import { rngFor, seedHint } from './helpers/random';

const CASES = Number(process.env.FUZZ_CASES ?? 3000);
const CHILDREN = 3;

describe.each([
  ['the raw binding', 'fuzz-binding.ts', 'fuzzBinding'],
  ['the public API', 'fuzz-api.ts', 'fuzzApi'],
])('%s under random argument lists', (_what, file, entry) => {
  const rng = rngFor(`fuzz-${entry}`);
  const seeds = Array.from({ length: CHILDREN }, () => rng.int(2 ** 31));
  const driver = path.resolve(__dirname, 'helpers', file);

  test.each(seeds.map((s, i) => [i, s]))('child %i (fast-check seed %i): no crash, no leak, only real errors', (_, seed) => {
    const cases = Math.ceil(CASES / CHILDREN);
    const script = `
      require(${JSON.stringify(driver)}).${entry}(${seed}, ${cases}).then(
        (r) => { process.stdout.write(JSON.stringify(r) + '\\n'); },
        (e) => { console.error(e); process.exitCode = 3; });
    `;
    // In a scratch directory: calls such as save() write the files their random paths name.
    const cwd = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-fuzz-'));
    let run: ReturnType<typeof runNodeChild>;
    try {
      run = runNodeChild(script, { cwd, timeoutMs: 120000 });
    } finally {
      fs.rmSync(cwd, { recursive: true, force: true });
    }
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
