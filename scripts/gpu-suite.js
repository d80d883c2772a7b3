#!/usr/bin/env node
// Runs every Jest file on a GPU machine in one go and checks that each test ran:
//   node scripts/gpu-suite.js [out dir]          (default: a fresh directory under the system tmp)
// test/flash-backward.test.ts alone takes longer than the rest of the suite together (its float64
// references), so it runs as three Jest processes that split its tests by name (-t), beside one Jest
// run of all the other files; the four run at once. Each writes Jest's JSON report to the out dir.
// The script then merges them: every test of flash-backward.test.ts must have passed in one of its
// three runs (a test that none of them ran counts as skipped, as Jest counts a skip), no test may have
// failed, and every test file of test/ must appear in a report. Prints one summary line per run and
// a total; exit status 0 when all of that holds. Needs the CUDA build of the addon and dist/ (as for
// scripts/gpu-smoke.js); on a machine without a GPU the CUDA suites skip, as in `npm test`.
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const root = path.resolve(__dirname, '..');
const outDir = process.argv[2] ? path.resolve(process.argv[2]) : fs.mkdtempSync(path.join(os.tmpdir(), 'gpu-suite-'));
fs.mkdirSync(outDir, { recursive: true });
const jest = path.join(root, 'node_modules', 'jest', 'bin', 'jest.js');

const SPLIT_FILE = 'test/flash-backward.test.ts';
// The describe blocks of SPLIT_FILE, in three groups of about equal time (the last takes the rest).
const groups = ['every head dim|awkward seqlens', 'long sequences|rows that see no key|memory after|large-magnitude'];
const runs = [
  { name: 'suite', args: ['--testPathIgnorePatterns', '/test/flash-backward\\.test\\.ts$'] },
  { name: 'split-1', args: [SPLIT_FILE, '-t', groups[0]] },
  { name: 'split-2', args: [SPLIT_FILE, '-t', groups[1]] },
  { name: 'split-3', args: [SPLIT_FILE, '-t', `^(?!.*(${groups.join('|')}))`] },
];

function runJest(run) {
  const report = path.join(outDir, `${run.name}.json`);
  const log = fs.openSync(path.join(outDir, `${run.name}.log`), 'w');
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [jest, '--json', `--outputFile=${report}`, ...run.args], {
      cwd: root,
      stdio: ['ignore', log, log],
    });
    child.on('close', (code) => {
      fs.closeSync(log);
      resolve({ run, code, report: fs.existsSync(report) ? JSON.parse(fs.readFileSync(report, 'utf8')) : null });
    });
  });
}

(async () => {
  const started = Date.now();
  const results = await Promise.all(runs.map(runJest));
  let ok = true;
  const filesSeen = new Set();
  const split = new Map();  // full name -> statuses over the three runs
  for (const { run, code, report } of results) {
    if (!report) {
      console.log(`gpu-suite: ${run.name}: no report (exit ${code}; see ${path.join(outDir, `${run.name}.log`)})`);
      ok = false;
      continue;
    }
    console.log(`gpu-suite: ${run.name}: exit ${code}, ${report.numPassedTests} passed, ${report.numFailedTests} failed, ` +
      `${report.numPendingTests} skipped, ${report.numTotalTests} tests in ${report.testResults.length} files`);
    if (report.numFailedTests > 0 || report.numFailedTestSuites > 0 || code !== 0) ok = false;
    for (const file of report.testResults) {
      filesSeen.add(path.relative(root, file.name));
      if (run.name.startsWith('split')) {
        for (const t of file.assertionResults) split.set(t.fullName, [...(split.get(t.fullName) ?? []), t.status]);
        continue;
      }
      // A failed test by name, with the first line of its message; a file that failed to run, with its message.
      for (const t of file.assertionResults.filter((a) => a.status === 'failed'))
        console.log(`gpu-suite: failed: ${path.relative(root, file.name)}: ${t.fullName}: ` +
          `${(t.failureMessages?.[0] ?? '').split('\n')[0]}`);
      if (file.assertionResults.length === 0 && file.message)
        console.log(`gpu-suite: failed to run: ${path.relative(root, file.name)}: ${file.message.split('\n')[0]}`);
    }
  }
  let splitPassed = 0, splitSkipped = 0;
  for (const [name, statuses] of split) {
    if (statuses.includes('failed')) {
      console.log(`gpu-suite: failed: ${name}`);
      ok = false;
    } else if (statuses.includes('passed')) {
      ++splitPassed;
    } else {
      ++splitSkipped;
    }
  }
  const files = fs.readdirSync(path.join(root, 'test')).filter((f) => f.endsWith('.test.ts')).map((f) => `test/${f}`);
  const missing = files.filter((f) => !filesSeen.has(f));
  if (missing.length > 0) {
    console.log(`gpu-suite: not run: ${missing.join(', ')}`);
    ok = false;
  }
  const suite = results[0].report;
  console.log(`gpu-suite: ${ok ? 'OK' : 'FAIL'}: ${filesSeen.size} of ${files.length} files; ` +
    `${SPLIT_FILE}: ${splitPassed} passed, ${splitSkipped} skipped of ${split.size}; the other files: ` +
    `${suite ? `${suite.numPassedTests} passed, ${suite.numPendingTests} skipped` : 'no report'}; ` +
    `${Math.round((Date.now() - started) / 1000)} s; reports in ${outDir}`);
  process.exit(ok ? 0 : 1);
})();
