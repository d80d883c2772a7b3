#!/usr/bin/env node
// Compares the timings of two or more builds from the native checks' BENCH lines
// (test/native/flash_fwd_check.cu, flash_bwd_check.cu: "BENCH <variant> bf16 B.. H.. S.. D.. <mask>
// median <ms> ms <T> TFLOP/s | back to back <ms> ms <T> TFLOP/s"), each build's output in a file of its
// own, or several runs of one build appended to one file (the builds timed in turns):
//   node scripts/native-ab.js old=before.txt new=after.txt [--median]
// Prints a markdown table per variant, mask and head dim: each build's TFLOP/s per sequence length
// (every run, back to back unless --median), and each later build's ratio to the first, as the range
// over the runs paired in order (run i of one build against run i of the other) and their median.
'use strict';
const fs = require('fs');

const args = process.argv.slice(2);
const useMedian = args.includes('--median');
const builds = args.filter((a) => !a.startsWith('--')).map((a) => {
  const eq = a.indexOf('=');
  if (eq <= 0) {
    console.error(`native-ab: expected label=file, got "${a}"`);
    process.exit(2);
  }
  return { label: a.slice(0, eq), file: a.slice(eq + 1) };
});
if (builds.length < 2) {
  console.error('usage: node scripts/native-ab.js old=before.txt new=after.txt [--median]');
  process.exit(2);
}

const LINE = /^BENCH\s+(\S+)\s+(\S+)\s+B\d+\s+H\d+\s+S(\d+)\s+D(\d+)\s+(\S+)\s+median\s+[\d.]+ ms\s+([\d.]+) TFLOP\/s \| back to back [\d.]+ ms\s+([\d.]+) TFLOP\/s/;
// key "variant dtype mask D" -> seqlen -> label -> [TFLOP/s per run]
const table = new Map();
for (const { label, file } of builds) {
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    const m = LINE.exec(line.trim());
    if (!m) continue;
    const [, variant, dtype, seqlen, d, mask, median, queued] = m;
    const key = `${variant} ${dtype} ${mask} d${d}`;
    if (!table.has(key)) table.set(key, new Map());
    const bySeq = table.get(key);
    if (!bySeq.has(+seqlen)) bySeq.set(+seqlen, new Map());
    const byLabel = bySeq.get(+seqlen);
    if (!byLabel.has(label)) byLabel.set(label, []);
    byLabel.get(label).push(Number(useMedian ? median : queued));
  }
}
if (table.size === 0) {
  console.error('native-ab: no BENCH lines in the files');
  process.exit(1);
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const base = builds[0].label;
const others = builds.slice(1).map((b) => b.label);
console.log(`TFLOP/s (${useMedian ? 'median' : 'back to back'}); ratios: each build over ${base}, run i against run i\n`);
for (const [key, bySeq] of table) {
  console.log(`#### ${key}\n`);
  const header = ['seqlen', ...builds.map((b) => b.label), ...others.map((o) => `${o} / ${base}`)];
  console.log(`| ${header.join(' | ')} |`);
  console.log(`| ${header.map(() => '---:').join(' | ')} |`);
  for (const [seqlen, byLabel] of [...bySeq].sort((a, b) => a[0] - b[0])) {
    const cells = builds.map((b) => (byLabel.get(b.label) ?? []).map((x) => x.toFixed(0)).join(' / ') || '–');
    for (const o of others) {
      const a = byLabel.get(base) ?? [], b = byLabel.get(o) ?? [];
      const n = Math.min(a.length, b.length);
      const r = Array.from({ length: n }, (_, i) => b[i] / a[i]);
      cells.push(n ? `${Math.min(...r).toFixed(2)}–${Math.max(...r).toFixed(2)} (median ${median(r).toFixed(2)})` : '–');
    }
    console.log(`| ${seqlen} | ${cells.join(' | ')} |`);
  }
  console.log('');
}
