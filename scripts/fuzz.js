#!/usr/bin/env node
// A longer fuzz campaign than the Jest suite runs (test/fuzz.test.ts):
//   node scripts/fuzz.js [--children N] [--cases N] [--seed S] [--target binding|api]
// Each child process runs test/helpers/fuzz-binding.ts (the raw binding; default) or fuzz-api.ts
// (the public API) for --cases random calls from its own seed; a crash (a signal, a non-zero exit)
// or a finding (a leak, an error without a real message) is printed with the seed that replays it.
// Exit status 1 if anything was found.
'use strict';
const { spawnSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const args = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 && args[i + 1] !== undefined ? Number(args[i + 1]) : fallback;
};
const children = opt('--children', 8);
const cases = opt('--cases', 20000);
let seed = opt('--seed', Math.floor(Math.random() * 2 ** 31));
const ti = args.indexOf('--target');
const target = ti >= 0 ? args[ti + 1] : 'binding';
if (target !== 'binding' && target !== 'api') {
  console.error(`fuzz: --target must be binding or api, got ${target}`);
  process.exit(2);
}
const root = path.resolve(__dirname, '..');
const driver = path.join(root, 'test', 'helpers', target === 'api' ? 'fuzz-api.ts' : 'fuzz-binding.ts');
const entry = target === 'api' ? 'fuzzApi' : 'fuzzBinding';
const hook = `
  require.extensions['.ts'] = (m, filename) => {
    const ts = require(${JSON.stringify(require.resolve('typescript', { paths: [root] }))});
    const out = ts.transpileModule(require('fs').readFileSync(filename, 'utf8'), { fileName: filename,
      compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022, esModuleInterop: true } });
    m._compile(out.outputText, filename);
  };`;

let bad = 0;
let total = 0;
for (let c = 0; c < children; c += 1, seed += 1) {
  const script = `${hook}
    require(${JSON.stringify(driver)}).${entry}(${seed}, ${cases}).then(
      (r) => process.stdout.write(JSON.stringify(r) + '\\n'), (e) => { console.error(e); process.exitCode = 3; });`;
  // In a scratch directory: calls such as save() write the files their random paths name.
  const cwd = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-fuzz-'));
  const run = spawnSync(process.execPath, ['-e', script], {
    cwd, encoding: 'utf8', env: { ...process.env, FLASH_ATTN_NODE_QUIET: '1' }, maxBuffer: 1 << 26,
  });
  fs.rmSync(cwd, { recursive: true, force: true });
  if (run.signal !== null || run.status !== 0) {
    bad += 1;
    console.log(`seed ${seed}: child ended with ${run.signal ?? `status ${run.status}`}\n${run.stderr.slice(-2000)}`);
    continue;
  }
  const r = JSON.parse(run.stdout.trim().split('\n').pop());
  total += r.cases;
  console.log(`seed ${seed}: ${r.cases} calls, ${r.threw} refused, ${r.returned} returned, ${r.findings.length} findings`);
  for (const f of r.findings.slice(0, 10)) console.log(`  ${f.problem}: ${f.args}`);
  if (r.findings.length > 0) bad += 1;
}
console.log(`fuzz (${target}): ${total} calls in ${children} children, ${bad} with a crash or findings`);
process.exitCode = bad > 0 ? 1 : 0;
