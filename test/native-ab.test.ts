/**
 * scripts/native-ab.js: the comparison of two builds' native-check timings that the kernel changes'
 * commits quote. It must pair the runs in order, report each build's TFLOP/s and the ratio range, and
 * refuse a call without two labelled files.
 */
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

const script = path.resolve(__dirname, '..', 'scripts', 'native-ab.js');

function benchLine(variant: string, seqlen: number, causal: boolean, median: number, queued: number): string {
  return `BENCH ${variant} bf16 B4 H16 S${seqlen}  D128 ${causal ? 'causal' : 'full  '} median 1.000 ms  ${median.toFixed(1)} ` +
    `TFLOP/s | back to back 0.900 ms  ${queued.toFixed(1)} TFLOP/s`;
}

describe('scripts/native-ab.js', () => {
  let dir: string;
  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'native-ab-'));
    fs.writeFileSync(path.join(dir, 'old.txt'), ['device 0: test', benchLine('ws-d128', 4096, false, 500, 560),
      benchLine('ws-d128', 4096, false, 510, 580), benchLine('ws-d128', 8192, true, 400, 450)].join('\n'));
    fs.writeFileSync(path.join(dir, 'new.txt'), [benchLine('ws-d128', 4096, false, 550, 560),
      benchLine('ws-d128', 4096, false, 561, 551), benchLine('ws-d128', 8192, true, 420, 495)].join('\n'));
  });
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  test('pairs the runs in order and reports the ratio range of the queued TFLOP/s', () => {
    const run = spawnSync(process.execPath, [script, `old=${path.join(dir, 'old.txt')}`, `new=${path.join(dir, 'new.txt')}`],
      { encoding: 'utf8' });
    expect(run.status).toBe(0);
    expect(run.stdout).toContain('#### ws-d128 bf16 full d128');
    // 560 / 580 against 560 / 551: 1.00 and 0.95.
    expect(run.stdout).toContain('| 4096 | 560 / 580 | 560 / 551 | 0.95–1.00 (median 0.97) |');
    expect(run.stdout).toContain('#### ws-d128 bf16 causal d128');
    expect(run.stdout).toContain('| 8192 | 450 | 495 | 1.10–1.10 (median 1.10) |');
  });

  test('--median compares the medians', () => {
    const run = spawnSync(process.execPath,
      [script, `a=${path.join(dir, 'old.txt')}`, `b=${path.join(dir, 'new.txt')}`, '--median'], { encoding: 'utf8' });
    expect(run.status).toBe(0);
    expect(run.stdout).toContain('| 4096 | 500 / 510 | 550 / 561 | 1.10–1.10 (median 1.10) |');
  });

  test('refuses a call without two labelled files', () => {
    const one = spawnSync(process.execPath, [script, `old=${path.join(dir, 'old.txt')}`], { encoding: 'utf8' });
    expect(one.status).toBe(2);
    expect(one.stderr).toContain('usage: node scripts/native-ab.js');
    const unlabelled = spawnSync(process.execPath, [script, path.join(dir, 'old.txt'), `new=${path.join(dir, 'new.txt')}`],
      { encoding: 'utf8' });
    expect(unlabelled.status).toBe(2);
    expect(unlabelled.stderr).toContain('expected label=file');
  });
});
