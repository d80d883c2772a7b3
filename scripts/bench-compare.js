#!/usr/bin/env node
// Compares our rows of bench runs of two builds (`node dist/bench/cli.js ... --json`), cell by cell:
// the new build's median time over the old one's, and their geometric mean. Each side may be given
// as several JSON files of the same grid (runs interleaved old, new, old, new to spread drift over
// both); a cell's time is then the median of its runs' medians.
//   node scripts/bench-compare.js --old a1.json[,a2.json] --new b1.json[,b2.json]
// Exits 1 when the geometric mean is above --limit (default 1.01: a step of the kernel refactors may
// cost at most 1%).
'use strict';
const fs = require('node:fs');

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : fallback;
}

function cells(files) {
  const times = new Map();
  for (const f of files.split(',')) {
    for (const r of JSON.parse(fs.readFileSync(f, 'utf8')).rows) {
      if (r.impl !== 'ours' || r.msMedian === null) continue;
      const key = r.id;
      if (!times.has(key)) times.set(key, []);
      times.get(key).push(r.msMedian);
    }
  }
  const median = (a) => { const s = [...a].sort((x, y) => x - y); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
  return new Map([...times].map(([k, v]) => [k, median(v)]));
}

const oldCells = cells(arg('--old'));
const newCells = cells(arg('--new'));
const limit = Number(arg('--limit', '1.01'));
let logSum = 0, n = 0, worst = 0;
for (const [key, tOld] of oldCells) {
  const tNew = newCells.get(key);
  if (tNew === undefined) { console.log(`${key}: missing in the new runs`); continue; }
  const ratio = tNew / tOld;
  logSum += Math.log(ratio); ++n; worst = Math.max(worst, ratio);
  console.log(`${key.padEnd(44)} old ${tOld.toFixed(4)} ms  new ${tNew.toFixed(4)} ms  new/old ${ratio.toFixed(4)}`);
}
const geo = Math.exp(logSum / n);
console.log(`cells ${n}, geometric mean new/old ${geo.toFixed(4)}, worst ${worst.toFixed(4)}`);
process.exit(geo > limit ? 1 : 0);
