/**
 * What the fuzz drivers (fuzz-binding.ts, fuzz-api.ts) share: the report they return to
 * test/fuzz.test.ts and scripts/fuzz.js, and the judgement of an error a call threw.
 */

/** One problem a call showed. */
export interface Finding {
  fn: string;
  args: string;
  problem: string;
}

/** What a driver reports for its run. */
export interface FuzzReport {
  seed: number;
  cases: number;
  threw: number;
  returned: number;
  findings: Finding[];
}

/**
 * Counts a thrown value and records a finding unless it is an Error with a message of its own: a
 * non-Error, an empty message, or one that `bad` matches (a bare "internal" message, an engine
 * error...) is a finding.
 */
export function judgeThrown(report: FuzzReport, e: unknown, fn: string, args: string, bad: (message: string) => boolean): void {
  report.threw += 1;
  if (!(e instanceof Error) && !(e !== null && typeof e === 'object' && 'message' in e)) {
    report.findings.push({ fn, args, problem: `threw a non-Error: ${String(e)}` });
    return;
  }
  const msg = (e as Error).message;
  if (typeof msg !== 'string' || msg.length === 0) report.findings.push({ fn, args, problem: 'an Error without a message' });
  else if (bad(msg)) report.findings.push({ fn, args, problem: `${(e as Error).name}: ${msg}` });
}
