/**
 * flash-attn-bench: flag parsing (every error message), the grids and presets, the reports
 * (text, JSON, CSV, markdown, SVG chart) on synthetic rows, and end-to-end runs of the CLI in a
 * child process on the CPU backend with a tiny grid. No test asserts a speed.
 */
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { BenchArgError, BenchCommand, HELP, parseArgs } from '../bench/args';
import { chartSpec, renderChartSvg, seqLabel } from '../bench/chart';
import { main } from '../bench/cli';
import { passFlops } from '../bench/flops';
import { BenchCell, buildCells, cellId, GridSettings, groupByInputs } from '../bench/grid';
import { findDevicePeak, peakTflops } from '../bench/peaks';
import { deviceDefaults, listPresets, PRESETS, RENAMED_PRESETS } from '../bench/presets';
import {
  AUTO_DETERMINISTIC_MAX_RATIO, BenchReport, CSV_COLUMNS, DETERMINISTIC_MAX_RATIO, fmtBytes, formatCsv, formatMarkdown, formatText, headerLines, panelHeading,
  panels, ratioSummary, ratioSummaryLines, variantRatioSummary,
} from '../bench/report';
import {
  addRatios, BenchRow, BWD_VARIANT_RUNS, describePlan, emptyRow, Impl, IMPL_LABELS, isOutOfMemory, measuredRow, oursWork, sortRows,
  torchRows,
} from '../bench/runner';
import type { TorchResult } from '../bench/torch';
import { findPackageJson, packageVersionFrom } from '../bench/version';
import { runNodeChild } from './helpers/child';
import { HAS_CUDA } from './helpers/backend';

const root = path.resolve(__dirname, '..');
const packageJson = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')) as { name: string; version: string };

function run(argv: string[], device: 'cpu' | 'cuda' = 'cpu'): Extract<BenchCommand, { kind: 'run' }> {
  const cmd = parseArgs(argv, device);
  if (cmd.kind !== 'run') throw new Error(`expected a run, got ${cmd.kind}`);
  return cmd;
}

function settings(argv: string[], device: 'cpu' | 'cuda' = 'cpu'): GridSettings {
  return run(argv, device).settings;
}

function errorOf(argv: string[], device: 'cpu' | 'cuda' = 'cpu'): string {
  try {
    parseArgs(argv, device);
  } catch (e) {
    expect(e).toBeInstanceOf(BenchArgError);
    return (e as Error).message;
  }
  throw new Error(`no error for ${argv.join(' ')}`);
}

describe('flags', () => {
  test('no flags: the FA2 grid on cuda, cpu-small on the cpu', () => {
    const c = run([], 'cuda');
    expect(c.settings).toEqual(deviceDefaults('cuda'));
    expect(c.settings).toMatchObject({
      device: 'cuda', dtype: 'bfloat16', seqlens: [512, 1024, 2048, 4096, 8192, 16384], headDims: [64, 128],
      causal: [false, true], passes: ['fwd', 'bwd', 'fwdbwd'], batch: null, tokens: 16384, heads: null, hidden: 2048,
      kernel: 'auto', repeats: 20, warmup: 5, warmupMs: 0, compare: [],
    });
    expect(c.deviceChosen).toBe(false);
    expect(c.output).toEqual({ json: false, csv: false, markdown: false, chart: null, quiet: false, python: null });
    expect(settings([], 'cpu')).toMatchObject({ device: 'cpu', dtype: 'float32', batch: 1, heads: 8, headDims: [64], repeats: 3, warmup: 1, warmupMs: 0 });
  });

  test('every flag at once', () => {
    const c = run([
      '--device', 'cuda', '--seqlen', '1024,4k', '--seqlen-k', '2048', '--batch', '3', '--heads', '16', '--kv-heads', '4',
      '--head-dim', '128,64', '--dtype', 'fp16', '--causal', 'true', '--pass', 'fwd,bwd', '--kernel', 'naive',
      '--repeats', '25', '--warmup', '0', '--warmup-ms', '40', '--compare', 'torch,naive', '--torch-backends', 'flash,math', '--json',
      '--chart', 'out.svg', '--quiet', '--python', '/opt/py/bin/python3',
    ], 'cpu');
    expect(c.settings).toMatchObject({
      device: 'cuda', seqlens: [1024, 4096], seqlenK: 2048, batch: 3, heads: 16, kvHeads: 4, headDims: [128, 64],
      dtype: 'float16', causal: [true], passes: ['fwd', 'bwd'], kernel: 'naive', repeats: 25, warmup: 0, warmupMs: 40,
      compare: ['torch', 'naive'], torchBackends: ['flash', 'math'],
    });
    expect(c.output).toEqual({ json: true, csv: false, markdown: false, chart: 'out.svg', quiet: true, python: '/opt/py/bin/python3' });
    expect(c.deviceChosen).toBe(true);
  });

  test('--flag=value, bare --causal, --causal both, --pass all, dtype names', () => {
    expect(settings(['--seqlen=64,128', '--dtype=bfloat16'])).toMatchObject({ seqlens: [64, 128], dtype: 'bfloat16' });
    expect(settings(['--causal', '--json']).causal).toEqual([true]);
    expect(settings(['--causal']).causal).toEqual([true]);
    expect(settings(['--causal', 'both']).causal).toEqual([false, true]);
    expect(settings(['--causal=false']).causal).toEqual([false]);
    expect(settings(['--pass', 'all']).passes).toEqual(['fwd', 'bwd', 'fwdbwd']);
    expect(settings(['--pass', 'fwdbwd,fwd']).passes).toEqual(['fwdbwd', 'fwd']);
    expect(settings(['--dtype', 'float32']).dtype).toBe('float32');
    expect(settings(['--dtype', 'bf16']).dtype).toBe('bfloat16');
    expect(settings(['--seqlen', '512,512,1k']).seqlens).toEqual([512, 1024]);
    expect(run(['--csv']).output.csv).toBe(true);
    expect(run(['--markdown']).output.markdown).toBe(true);
  });

  test('bench/README.md carries the --help text and every preset', () => {
    const readme = fs.readFileSync(path.join(root, 'bench', 'README.md'), 'utf8');
    expect(readme).toContain(HELP);
    for (const name of Object.keys(PRESETS)) expect(readme).toContain(`\`${name}\``);
  });

  test('--help, -h and --list-presets', () => {
    expect(parseArgs(['--help'])).toEqual({ kind: 'help' });
    expect(parseArgs(['--seqlen', '64', '-h'])).toEqual({ kind: 'help' });
    expect(parseArgs(['--list-presets'])).toEqual({ kind: 'list-presets' });
    for (const flag of ['--seqlen', '--seqlen-k', '--batch', '--heads', '--kv-heads', '--head-dim', '--dtype', '--causal', '--pass',
      '--device', '--kernel', '--repeats', '--warmup', '--warmup-ms', '--json', '--csv', '--markdown', '--chart', '--quiet', '--compare',
      '--torch-backends', '--variants', '--python', '--preset', '--list-presets', '--help', '--version']) {
      expect(HELP).toContain(flag);
    }
  });

  test('--version and -v ask for the version; with an unknown flag or a value they are refused', () => {
    expect(parseArgs(['--version'])).toEqual({ kind: 'version' });
    expect(parseArgs(['-v'])).toEqual({ kind: 'version' });
    expect(parseArgs(['--seqlen', '64', '--version'])).toEqual({ kind: 'version' });
    expect(parseArgs(['--version', '--help'])).toEqual({ kind: 'help' });
    expect(HELP).toMatch(/^ {2}--version, -v {2,}print flash-attn-bench's version/m);
    expect(errorOf(['--version', '--frobnicate'])).toBe('unknown option "--frobnicate" (see --help)');
    expect(errorOf(['-v', '-x'])).toBe('unknown option "-x" (see --help)');
    expect(errorOf(['--version=1'])).toBe('--version: expected no value but received "1"');
  });

  test('overrides: the flags that replaced values of the preset the run starts from', () => {
    const o = (argv: string[], device: 'cpu' | 'cuda' = 'cpu'): [string, string[]] => {
      const c = run(argv, device);
      return [c.basePreset, c.overrides];
    };
    expect(o([])).toEqual(['cpu-small', []]);
    expect(o([], 'cuda')).toEqual(['fa2-grid', []]);
    expect(o(['--json', '--quiet', '--chart', 'x.svg'])).toEqual(['cpu-small', []]);
    // Flags that repeat the preset's values (in any order) replace nothing.
    expect(o(['--device', 'cpu', '--pass', 'fwdbwd,bwd,fwd', '--causal', 'both', '--seqlen', '2k,256,512,1024', '--repeats', '3'])).toEqual(['cpu-small', []]);
    expect(o(['--device', 'cpu'], 'cuda')).toEqual(['cpu-small', []]);
    expect(o(['--seqlen', '64', '--head-dim=32', '--causal', '--pass', 'fwd', '--repeats', '2'])).toEqual(
      ['cpu-small', ['--seqlen 64', '--head-dim 32', '--causal', '--pass fwd', '--repeats 2']],
    );
    // The last of a repeated flag is the one that counts.
    expect(o(['--seqlen', '64', '--seqlen', '128'])).toEqual(['cpu-small', ['--seqlen 128']]);
    expect(o(['--seqlen', '64', '--seqlen', '256,512,1024,2048'])).toEqual(['cpu-small', []]);
    expect(o(['--preset', 'fp32-memory-wall', '--seqlen', '4096', '--dtype', 'fp32'])).toEqual(['fp32-memory-wall', ['--seqlen 4096']]);
    expect(o(['--preset', 'fp32-memory-wall'])).toEqual(['fp32-memory-wall', []]);
    // Moving a CUDA preset to the CPU overrides it; its repeats are then measured against the CPU's default.
    expect(o(['--preset', 'fp32-memory-wall', '--device', 'cpu'])).toEqual(['fp32-memory-wall', ['--device cpu']]);
    expect(o(['--preset', 'fp32-memory-wall', '--device', 'cpu', '--repeats', '20'])).toEqual(['fp32-memory-wall', ['--device cpu', '--repeats 20']]);
    expect(o(['--preset', 'fp32-memory-wall', '--device', 'cpu', '--repeats', '3'])).toEqual(['fp32-memory-wall', ['--device cpu']]);
  });

  const cases: [string[], string, ('cpu' | 'cuda')?][] = [
    [['--frobnicate'], 'unknown option "--frobnicate" (see --help)'],
    [['fwd'], 'unknown option "fwd" (see --help)'],
    [['--seqlen'], '--seqlen: expected a value but received nothing'],
    [['--seqlen', '--json'], '--seqlen: expected a value but received nothing'],
    [['--seqlen', '1k5'], '--seqlen: expected a comma-separated list of positive integers (e.g. 1024,4k) but received "1k5"'],
    [['--seqlen', '0,64'], '--seqlen: expected a comma-separated list of positive integers (e.g. 1024,4k) but received "0,64"'],
    [['--seqlen='], '--seqlen: expected a comma-separated list of positive integers (e.g. 1024,4k) but received ""'],
    [['--seqlen-k', 'x'], '--seqlen-k: expected a positive integer but received "x"'],
    [['--batch', '0'], '--batch: expected a positive integer but received "0"'],
    [['--heads', '1.5'], '--heads: expected a positive integer but received "1.5"'],
    [['--kv-heads', '-1'], '--kv-heads: expected a positive integer but received "-1"'],
    [['--head-dim', '64,100'], '--head-dim: expected multiples of 8 up to 256 but received "64,100"'],
    [['--head-dim', '264'], '--head-dim: expected multiples of 8 up to 256 but received "264"'],
    [['--dtype', 'int8'], '--dtype: expected bfloat16, float16 or float32 (or bf16, fp16, fp32) but received "int8"'],
    [['--causal', 'maybe'], '--causal: expected true, false or both but received "maybe"'],
    [['--pass', 'fwd,forward'], '--pass: expected fwd, bwd, fwdbwd or all (comma-separated) but received "fwd,forward"'],
    [['--device', 'tpu'], '--device: expected cpu or cuda but received "tpu"'],
    [['--kernel', 'fast'], '--kernel: expected auto, flash or naive but received "fast"'],
    [['--repeats', '0'], '--repeats: expected a positive integer but received "0"'],
    [['--repeats', '5'], '--repeats: expected at least 20 on cuda (the median of fewer runs is noise) but received 5', 'cuda'],
    [['--warmup', '-1'], '--warmup: expected an integer >= 0 but received "-1"'],
    [['--warmup', 'two'], '--warmup: expected an integer >= 0 but received "two"'],
    [['--warmup-ms', '-5'], '--warmup-ms: expected an integer >= 0 but received "-5"'],
    [['--warmup-ms', '0.5'], '--warmup-ms: expected an integer >= 0 but received "0.5"'],
    [['--compare', 'torch,jax'], '--compare: expected naive or torch (comma-separated) but received "torch,jax"'],
    [['--torch-backends', 'sdpa'], '--torch-backends: expected flash, cudnn, efficient or math (comma-separated) but received "sdpa"'],
    [['--variants', 'atomic'], '--variants: expected single-kernel, deterministic, two-kernel or auto-deterministic (comma-separated) but received "atomic"'],
    [['--preset', 'nope'], '--preset: expected fa2-grid, cpu-small, fp32-memory-wall, long-seq-bf16 or bwd-variants but received "nope"'],
    [['--preset', 'seed-fp32'], '--preset: expected fa2-grid, cpu-small, fp32-memory-wall, long-seq-bf16 or bwd-variants but received "seed-fp32" (preset \'seed-fp32\' was renamed to \'fp32-memory-wall\')'],
    [['--preset', 'seed-bf16'], '--preset: expected fa2-grid, cpu-small, fp32-memory-wall, long-seq-bf16 or bwd-variants but received "seed-bf16" (preset \'seed-bf16\' was renamed to \'long-seq-bf16\')'],
    [['--preset', 'seed-bwd-kernels'], '--preset: expected fa2-grid, cpu-small, fp32-memory-wall, long-seq-bf16 or bwd-variants but received "seed-bwd-kernels" (preset \'seed-bwd-kernels\' was renamed to \'bwd-variants\')'],
    [['--chart', 'out.png'], '--chart: expected a file name ending in .svg but received "out.png"'],
    [['--python', ''], '--python: expected a path to a Python interpreter but received ""'],
    [['--json=yes'], '--json: expected no value but received "yes"'],
    [['--json', '--csv'], '--json, --csv and --markdown all write to stdout: expected at most one but received --json and --csv'],
    [['--csv', '--markdown'], '--json, --csv and --markdown all write to stdout: expected at most one but received --csv and --markdown'],
    [['--heads', '8', '--kv-heads', '3'], '--kv-heads: expected a divisor of the 8 query heads but received 3'],
    [['--kv-heads', '3'], '--kv-heads: expected a divisor of the 32 query heads at head dim 64 but received 3', 'cuda'],
    [['--kernel', 'naive'], '--kernel: expected auto or flash on cpu (naive is CUDA-only) but received "naive"'],
  ];
  for (const [argv, message, device] of cases) {
    test(`${argv.join(' ')}${device ? ` (on ${device})` : ''} fails with a message naming the flag`, () => {
      expect(errorOf(argv, device)).toBe(message);
    });
  }
});

describe('grid', () => {
  test('the default CUDA grid: 6 seqlens x 2 head dims x 2 masks x 3 passes, batch 16384/seqlen, heads 2048/headDim', () => {
    const cells = buildCells(settings([], 'cuda'));
    expect(cells).toHaveLength(72);
    expect(new Set(cells.map((c) => c.id)).size).toBe(72);
    for (const c of cells) {
      expect(c.batch).toBe(16384 / c.seqlenQ);
      expect(c.headsQ).toBe(2048 / c.headDim);
      expect(c.headsKV).toBe(c.headsQ);
      expect(c.seqlenK).toBe(c.seqlenQ);
      expect(c.dtype).toBe('bfloat16');
    }
    const count = (f: (c: BenchCell) => boolean): number => cells.filter(f).length;
    for (const s of [512, 1024, 2048, 4096, 8192, 16384]) expect(count((c) => c.seqlenQ === s)).toBe(12);
    for (const d of [64, 128]) expect(count((c) => c.headDim === d)).toBe(36);
    expect(count((c) => c.causal)).toBe(36);
    for (const p of ['fwd', 'bwd', 'fwdbwd']) expect(count((c) => c.pass === p)).toBe(24);
    expect(cells[0]).toEqual({
      id: 'fwd-bf16-d64-full-b32h32kv32-q512k512', batch: 32, seqlenQ: 512, seqlenK: 512, headsQ: 32, headsKV: 32,
      headDim: 64, causal: false, dtype: 'bfloat16', pass: 'fwd',
    });
    // Cells of one shape are adjacent: 12 input sets (6 seqlens x 2 head dims), 6 cells each.
    const groups = groupByInputs(cells);
    expect(groups).toHaveLength(12);
    for (const g of groups) expect(g).toHaveLength(6);
  });

  test('flags shape the cells: Sk, GQA, batch floor, fixed heads', () => {
    const cells = buildCells(settings(['--device', 'cuda', '--seqlen', '32768', '--seqlen-k', '1024', '--kv-heads', '8', '--head-dim', '64', '--pass', 'bwd', '--causal', 'false']));
    expect(cells).toEqual([{
      id: 'bwd-bf16-d64-full-b1h32kv8-q32768k1024', batch: 1, seqlenQ: 32768, seqlenK: 1024, headsQ: 32, headsKV: 8,
      headDim: 64, causal: false, dtype: 'bfloat16', pass: 'bwd',
    }]);
    expect(cellId({ ...cells[0], dtype: 'float16', causal: true, pass: 'fwd' })).toBe('fwd-fp16-d64-causal-b1h32kv8-q32768k1024');
  });
});

describe('presets', () => {
  test('fa2-grid is the default CUDA grid, cpu-small the default CPU grid', () => {
    expect(settings(['--preset', 'fa2-grid'], 'cpu')).toEqual(deviceDefaults('cuda'));
    expect(settings(['--preset', 'cpu-small'], 'cuda')).toEqual(deviceDefaults('cpu'));
  });

  test('fp32-memory-wall: fp32 B4 H1 d64 S8192, fwd and fwdbwd, vs naive and torch efficient', () => {
    const s = settings(['--preset', 'fp32-memory-wall']);
    expect(s).toMatchObject({
      device: 'cuda', dtype: 'float32', batch: 4, heads: 1, headDims: [64], seqlens: [8192], causal: [false],
      passes: ['fwd', 'fwdbwd'], compare: ['naive', 'torch'], repeats: 20,
    });
    expect(s.torchBackends).toContain('efficient');
    expect(buildCells(s).map((c) => c.id)).toEqual(['fwd-fp32-d64-full-b4h1kv1-q8192k8192', 'fwdbwd-fp32-d64-full-b4h1kv1-q8192k8192']);
  });

  test('long-seq-bf16: bf16 fwd+bwd at 8k-64k vs torch flash, batch 4, 1 head, d 64', () => {
    const s = settings(['--preset', 'long-seq-bf16']);
    expect(s).toMatchObject({
      device: 'cuda', dtype: 'bfloat16', batch: 4, heads: 1, headDims: [64], seqlens: [8192, 16384, 32768, 65536],
      passes: ['fwdbwd'], compare: ['torch'], torchBackends: ['flash'],
    });
  });

  test('bwd-variants asks for the single-kernel, deterministic and two-kernel variants beside ours', () => {
    expect(settings(['--preset', 'bwd-variants'])).toMatchObject({
      dtype: 'bfloat16', passes: ['bwd'], variants: ['single-kernel', 'deterministic', 'two-kernel'], batch: 4, seqlens: [8192],
    });
  });

  test('--variants adds backward variants; an unknown one is refused', () => {
    expect(settings(['--variants', 'single-kernel'], 'cuda').variants).toEqual(['single-kernel']);
    expect(settings(['--variants', 'deterministic'], 'cuda').variants).toEqual(['deterministic']);
    expect(settings(['--variants', 'two-kernel,single-kernel,deterministic,single-kernel'], 'cuda').variants)
      .toEqual(['two-kernel', 'single-kernel', 'deterministic']);
    expect(settings([], 'cuda').variants).toEqual([]);
    expect(HELP).toMatch(/^ +single-kernel: .*algorithm: 'single-kernel'/m);
    expect(HELP).toMatch(/^ +deterministic: .*single-kernel, deterministic: true/m);
    expect(HELP).toMatch(/^ +two-kernel: .*algorithm: 'two-kernel'/m);
    expect(HELP).toMatch(/^ +auto-deterministic: 'auto' with deterministic: true/m);
  });

  test('each variant pins the backward: deterministic is the single kernel\'s deterministic mode', () => {
    expect(BWD_VARIANT_RUNS).toEqual({
      'single-kernel': { impl: 'ours-single-kernel', options: { algorithm: 'single-kernel' } },
      deterministic: { impl: 'ours-deterministic', options: { algorithm: 'single-kernel', deterministic: true } },
      'two-kernel': { impl: 'ours-two-kernel', options: { algorithm: 'two-kernel' } },
      'auto-deterministic': { impl: 'ours-auto-deterministic', options: { algorithm: 'auto', deterministic: true } },
    });
    expect(IMPL_LABELS['ours-single-kernel']).toBe('ours (single-kernel bwd)');
    expect(IMPL_LABELS['ours-deterministic']).toBe('ours (single-kernel deterministic bwd)');
    expect(IMPL_LABELS['ours-auto-deterministic']).toBe('ours (deterministic bwd)');
    // One row per cell for ours, plus one per variant on the cells that run a backward.
    const s = settings(['--seqlen', '64', '--head-dim', '32', '--causal', 'false', '--variants', 'single-kernel,deterministic,two-kernel']);
    expect(oursWork(buildCells(s), s)).toBe(3 + 3 * 2);
    const a = settings(['--seqlen', '64', '--head-dim', '32', '--causal', 'false', '--variants', 'auto-deterministic']);
    expect(oursWork(buildCells(a), a)).toBe(3 + 1 * 2);
  });

  test('flags override the preset; a CUDA preset on the CPU takes the CPU\'s timing defaults', () => {
    const s = settings(['--seqlen', '4096', '--preset', 'fp32-memory-wall', '--compare', 'torch']);
    expect(s).toMatchObject({ seqlens: [4096], dtype: 'float32', batch: 4, compare: ['torch'] });
    expect(settings(['--preset', 'fp32-memory-wall', '--device', 'cpu'])).toMatchObject({ device: 'cpu', repeats: 3, warmup: 1, warmupMs: 0, seqlens: [8192] });
  });

  test('--list-presets describes every preset', () => {
    const text = listPresets();
    for (const name of Object.keys(PRESETS)) expect(text).toContain(name);
    // Sources are cited by title.
    expect(text).toContain('"FlashAttention-2:');
    expect(text).toContain('"Understanding the Forward and Backward Pass of FlashAttention2"');
    expect(text).not.toMatch(/seed|design doc/i);
    expect(Object.keys(PRESETS)).toEqual(['fa2-grid', 'cpu-small', 'fp32-memory-wall', 'long-seq-bf16', 'bwd-variants']);
  });

  test('every former preset name points at a preset, and none is still a preset', () => {
    expect(Object.keys(RENAMED_PRESETS).length).toBeGreaterThan(0);
    for (const [old, current] of Object.entries(RENAMED_PRESETS)) {
      expect(Object.keys(PRESETS)).toContain(current);
      expect(Object.keys(PRESETS)).not.toContain(old);
    }
  });
});

describe('% of peak', () => {
  test('dense peaks by device name and dtype; unknown or CPU is blank', () => {
    expect(peakTflops('NVIDIA H100 80GB HBM3', 'bfloat16')).toBe(989);
    expect(peakTflops('NVIDIA H100 80GB HBM3', 'float32')).toBe(67);
    expect(peakTflops('NVIDIA H200', 'float16')).toBe(989);
    expect(peakTflops('NVIDIA H100 PCIe', 'bfloat16')).toBe(756);
    expect(peakTflops('NVIDIA A100-SXM4-80GB', 'bfloat16')).toBe(312);
    expect(peakTflops('NVIDIA A100 80GB PCIe', 'float32')).toBe(19.5);
    expect(findDevicePeak('NVIDIA A100-SXM4-40GB')?.tf32).toBe(156);
    expect(peakTflops('NVIDIA A10', 'bfloat16')).toBe(125);
    expect(peakTflops('NVIDIA GeForce GTX 1080', 'float32')).toBeNull();
    expect(peakTflops(null, 'bfloat16')).toBeNull();
  });
});

/** Synthetic rows: ours, naive (OOM at the longest), three torch backends, one torch error. */
function syntheticReport(): BenchReport {
  const s = { ...deviceDefaults('cuda'), seqlens: [1024, 2048], headDims: [64], causal: [true], passes: ['fwd' as const], compare: ['naive' as const, 'torch' as const] };
  const cells = buildCells(s);
  const speeds: Partial<Record<Impl, number>> = { ours: 300, 'torch-flash': 250, 'torch-cudnn': 400, 'torch-efficient': 150, naive: 10 };
  let rows: BenchRow[] = [];
  for (const c of cells) {
    for (const [impl, tf] of Object.entries(speeds) as [Impl, number][]) {
      if (impl === 'naive' && c.seqlenQ === 2048) {
        rows.push(emptyRow(c, impl, 'cuda', 'naive', 'oom', 'CUDA out of memory: tried to allocate 8.00 GiB'));
        continue;
      }
      const ms = (passFlops(c, c.pass) / (tf * 1e12)) * 1e3;
      rows.push(measuredRow(c, impl, 'cuda', impl === 'ours' ? 'flash' : null, { median: ms, min: ms * 0.9, max: ms * 1.1 }, 3 << 20, 989));
    }
  }
  rows.push(emptyRow(cells[0], 'torch-math', 'cuda', null, 'error', 'No available kernel'));
  addRatios(rows);
  rows = sortRows(rows, cells);
  return {
    tool: 'flash-attn-bench', schema: 2,
    env: {
      date: '2026-11-21T12:00:00.000Z', version: '0.1.0', node: 'v20.20.2', platform: 'linux-x64', device: 'cuda',
      deviceName: 'NVIDIA H200', computeCapability: '9.0', driver: '580.95', cudaDriver: '13.0', cudaRuntime: '13.0', cpu: 'Xeon', cpuThreads: 16,
      torch: { torch: '2.11.0+cu130', cuda: '13.0', cudnn: '9.19.0', device: 'NVIDIA H200', capability: '9.0', driver: '580.95', python: '3.12.3' },
      torchUnavailable: null,
    },
    settings: {
      ...s, preset: 'fa2-grid', presetOverrides: ['--seqlen 1024,2048', '--head-dim 64', '--causal true', '--pass fwd', '--compare naive,torch'],
      kernelResolved: 'flash', timing: 'CUDA events', peakTflops: 989,
    },
    notes: ['a note for the reader'],
    rows,
  };
}

/**
 * Synthetic backward rows with our variants: ours (its algorithm as given), single-kernel (atomic),
 * deterministic and two-kernel, and torch flash. Times per cell (ms ∝): two-kernel 1, single-kernel
 * 1.1 then 0.9, deterministic 1.2 then 1.4 times single-kernel.
 */
function variantReport(
  o: { oursAlgorithm?: 'single-kernel' | 'two-kernel'; impls?: Impl[]; failTwoKernel?: boolean } = {},
): BenchReport {
  const oursAlgorithm = o.oursAlgorithm ?? 'two-kernel';
  const impls = o.impls ?? ['ours-single-kernel', 'ours-deterministic', 'ours-two-kernel', 'torch-flash'];
  const s = { ...deviceDefaults('cuda'), seqlens: [1024, 2048], headDims: [64], causal: [false], passes: ['bwd' as const], variants: [] };
  const cells = buildCells(s);
  let rows: BenchRow[] = [];
  cells.forEach((c, i) => {
    const two = 2;
    const single = two * [1.1, 0.9][i];
    const ms: Partial<Record<Impl, number>> = {
      ours: oursAlgorithm === 'two-kernel' ? two : single, 'ours-single-kernel': single,
      'ours-deterministic': single * [1.2, 1.4][i], 'ours-two-kernel': two, 'torch-flash': two * 1.2,
    };
    for (const impl of ['ours', ...impls] as Impl[]) {
      const algorithm = impl === 'ours' ? oursAlgorithm : impl === 'ours-two-kernel' ? 'two-kernel' : impl === 'torch-flash' ? null : 'single-kernel';
      if (impl === 'ours-two-kernel' && o.failTwoKernel) {
        rows.push(emptyRow(c, impl, 'cuda', 'flash', 'error', "Expected algorithm to be 'auto' or 'single-kernel' for this call", 'two-kernel'));
        continue;
      }
      const t = ms[impl] as number;
      rows.push(measuredRow(c, impl, 'cuda', impl === 'torch-flash' ? null : 'flash', { median: t, min: t, max: t }, 1 << 20, 989, algorithm));
    }
  });
  addRatios(rows);
  rows = sortRows(rows, cells);
  const base = syntheticReport();
  return { ...base, settings: { ...base.settings, ...s, passes: ['bwd'] }, notes: [], rows };
}

describe('reports', () => {
  test('panel headings name the plan our rows ran when they share one', () => {
    const [c, c2] = buildCells(settings(['--device', 'cuda', '--seqlen', '1024,2048', '--head-dim', '64', '--pass', 'fwd', '--causal', 'false']));
    const ms = { median: 1, min: 1, max: 1 };
    const plan = 'sm90-wgmma d64 128x64 w8 s3';
    const ours = (cell: typeof c, p: string): BenchRow => ({ ...measuredRow(cell, 'ours', 'cuda', 'flash', ms, 0, 989), plan: p });
    const torch = measuredRow(c, 'torch-flash', 'cuda', null, ms, 0, 989);
    const [same] = panels([ours(c, plan), ours(c2, plan), torch]);
    expect(panelHeading(same)).toBe(`${same.title} · ours: ${plan}`);
    const [mixed] = panels([ours(c, plan), ours(c2, 'sm80-mma d64 64x64 w4 s2')]);
    expect(panelHeading(mixed)).toBe(mixed.title);
    const [theirs] = panels([torch]);
    expect(panelHeading(theirs)).toBe(theirs.title);
  });

  test('describePlan: the family, then the compiled head dim and the tile of FlashAttention-2 on CUDA', () => {
    expect(describePlan({ family: 'sm90-wgmma', headDim: 128, blockM: 128, blockN: 128, warps: 8, stages: 3 }))
      .toBe('sm90-wgmma d128 128x128 w8 s3');
    expect(describePlan({ family: 'fp32-mma', headDim: 32, blockM: 64, blockN: 64, warps: 4, stages: 1 })).toBe('fp32-mma d32 64x64 w4 s1');
    for (const family of ['cpu', 'naive'] as const) {
      expect(describePlan({ family, headDim: null, blockM: null, blockN: null, warps: null, stages: null })).toBe(family);
    }
  });

  const report = syntheticReport();

  test('rows: TFLOP/s from the FA2 count, % of peak, ratios ours ÷ theirs', () => {
    const ours = report.rows.filter((r) => r.impl === 'ours');
    expect(ours).toHaveLength(2);
    expect(ours[0].tflops).toBeCloseTo(300, 9);
    expect(ours[0].pctPeak).toBeCloseTo((100 * 300) / 989, 9);
    expect(ours[0].ratios['torch-flash']).toBeCloseTo(1.2, 9);
    expect(ours[0].ratios['torch-cudnn']).toBeCloseTo(0.75, 9);
    expect(ours[0].ratios.naive).toBeCloseTo(30, 9);
    expect(ours[0].ratios['torch-math']).toBeNull();
    expect(ours[1].ratios.naive).toBeNull(); // naive ran out of memory there
    expect(report.rows.filter((r) => r.impl !== 'ours').every((r) => Object.keys(r.ratios).length === 0)).toBe(true);
  });

  test('OOM detection', () => {
    expect(isOutOfMemory('CUDA out of memory: tried to allocate 1 GiB')).toBe(true);
    expect(isOutOfMemory('CUDA out of memory in attentionForward: its workspace needs 2 GiB')).toBe(true);
    expect(isOutOfMemory('out of memory')).toBe(true);
    expect(isOutOfMemory('CUDA error: an illegal memory access was encountered')).toBe(false);
  });

  test('PyTorch rows: measured, OOM and failed', () => {
    const cells = buildCells({ ...deviceDefaults('cuda'), seqlens: [1024], headDims: [64], causal: [false], passes: ['fwd'] });
    const result: TorchResult = {
      available: true,
      env: { torch: '2.11', cuda: '13.0', cudnn: '9.19', device: 'NVIDIA H100 80GB HBM3', capability: '9.0', driver: null, python: '3.12' },
      rows: [
        { id: cells[0].id, backend: 'flash', msMedian: 2, msMin: 1.5, msMax: 3, peakBytes: 1024, mask: 'none', error: null },
        { id: cells[0].id, backend: 'cudnn', msMedian: NaN, msMin: NaN, msMax: NaN, peakBytes: NaN, mask: 'none', error: 'out of memory' },
        { id: cells[0].id, backend: 'math', msMedian: NaN, msMin: NaN, msMax: NaN, peakBytes: NaN, mask: 'none', error: 'No available kernel' },
      ],
    };
    const rows = torchRows(result, cells, 989);
    expect(rows.map((r) => [r.impl, r.status])).toEqual([['torch-flash', 'ok'], ['torch-cudnn', 'oom'], ['torch-math', 'error']]);
    expect(rows[0].tflops).toBeCloseTo(passFlops(cells[0], 'fwd') / 2e-3 / 1e12, 9);
    expect(rows[0]).toMatchObject({ msMedian: 2, msMin: 1.5, msMax: 3, peakBytes: 1024, device: 'cuda', mask: 'none' });
    expect(rows[1]).toMatchObject({ msMedian: null, tflops: null, error: 'out of memory' });
    expect(torchRows({ available: false, reason: 'no python' }, cells, null)).toEqual([]);
  });

  test('text: header with device, versions, date; one table per panel; OOM and errors named', () => {
    const text = formatText(report);
    for (const s of ['NVIDIA H200', 'driver 580.95 (CUDA 13.0)', 'CUDA runtime 13.0', 'Node v20.20.2', '2026-11-21', 'PyTorch 2.11.0+cu130', 'forward, head dim 64, causal (bfloat16)']) {
      expect(text).toContain(s);
    }
    // Footnotes number failures in table order: torch-math's error (seqlen 1024), then naive's OOM (2048).
    expect(text).toMatch(/2048 +8 x 32 +naive +OOM \[2\]/);
    expect(text).toContain('[1] torch-math: No available kernel');
    expect(text).toContain('[2] naive: CUDA out of memory: tried to allocate 8.00 GiB');
    expect(text).toContain('ours/flash');
    expect(text).toContain('1.20x');
    expect(text).toContain('note: a note for the reader');
  });

  test('CSV: comment lines with device and versions, the header, one line per row', () => {
    const lines = formatCsv(report).trimEnd().split('\n');
    const comments = lines.filter((l) => l.startsWith('#'));
    for (const s of ['# device_name: NVIDIA H200', '# driver: 580.95', '# cuda_driver: 13.0', '# cuda_runtime: 13.0', '# node: v20.20.2', '# date: 2026-11-21T12:00:00.000Z', '# torch: 2.11.0+cu130']) {
      expect(comments).toContain(s);
    }
    const body = lines.filter((l) => !l.startsWith('#'));
    expect(body[0]).toBe(CSV_COLUMNS.join(','));
    expect(body).toHaveLength(1 + report.rows.length);
    expect(body.every((l) => l.split(',').length === CSV_COLUMNS.length)).toBe(true);
  });

  test('markdown: header, one table per (head dim, causal, pass), the fixed columns, OOM', () => {
    const md = formatMarkdown(report);
    expect(md).toContain('NVIDIA H200 (sm 9.0, driver 580.95 (CUDA 13.0), CUDA runtime 13.0)');
    expect(md).toContain('#### forward, head dim 64, causal (bfloat16)');
    expect(md).toContain('| seqlen | batch × heads | ours | naive | torch flash | torch cuDNN | torch efficient | torch math | ours/flash | ours/cuDNN |');
    const table = md.split('\n').filter((l) => l.startsWith('| 1024 ') || l.startsWith('| 2048 '));
    expect(table).toHaveLength(2);
    expect(table[0]).toMatch(/^\| 1024 \| 16 × 32 \| 300 \(\d\.\d+ ms, 3\.00 MiB\) \| 10\.0 .* \| 1\.20x \| 0\.75x \|$/);
    expect(table[1]).toContain('| OOM [2] |');
    expect(md).toContain('[2] naive: CUDA out of memory: tried to allocate 8.00 GiB');
  });

  test('ratio summary: geometric mean, range, worst cell and slow cells per other implementation', () => {
    const rows = report.rows.map((r) => ({ ...r, ratios: { ...r.ratios } }));
    const ours = rows.filter((r) => r.impl === 'ours');
    ours[0].ratios['torch-flash'] = 0.8;
    ours[1].ratios['torch-flash'] = 1.25;
    const byImpl = new Map(ratioSummary(rows).map((x) => [x.impl, x]));
    const flash = byImpl.get('torch-flash');
    expect(flash).toMatchObject({ cells: 2, min: 0.8, max: 1.25, worst: ours[0].id, slow: 1 });
    expect(flash?.geomean).toBeCloseTo(1, 12);
    // naive ran out of memory in one cell: only the other counts; torch-math has no ratio at all.
    expect(byImpl.get('naive')).toMatchObject({ cells: 1, min: 30, slow: 0 });
    expect(byImpl.has('torch-math')).toBe(false);
    const md = formatMarkdown({ ...report, rows });
    expect(md).toContain(`- ours vs SDPA flash: geometric mean 1.00x over 2 cells (range 0.80-1.25x, worst ${ours[0].id}); cells below 0.85x: 1`);
    expect(formatText(report)).toContain('ours vs SDPA cudnn: geometric mean 0.75x over 2 cells (range 0.75-0.75x');
  });

  test("auto-deterministic: 'auto' with deterministic: true ÷ ours, per cell, summarised against the 1.1 bar, in the CSV", () => {
    const s = { ...deviceDefaults('cuda'), seqlens: [1024, 2048], headDims: [64], causal: [false], passes: ['bwd' as const], variants: [] };
    const rows: BenchRow[] = [];
    buildCells(s).forEach((c, i) => {
      // ours ran the single kernel; 'auto' deterministic the two kernels, 1.05 then 1.25 times as long.
      rows.push(measuredRow(c, 'ours', 'cuda', 'flash', { median: 2, min: 2, max: 2 }, 1 << 20, 989, 'single-kernel'));
      const t = 2 * [1.05, 1.25][i];
      rows.push(measuredRow(c, 'ours-auto-deterministic', 'cuda', 'flash', { median: t, min: t, max: t }, 1 << 20, 989, 'two-kernel'));
    });
    addRatios(rows);
    const ours = rows.filter((r) => r.impl === 'ours');
    expect(ours.map((r) => r.variantRatios['auto-deterministic/auto'])).toEqual([expect.closeTo(1.05, 12), expect.closeTo(1.25, 12)]);
    // Neither the single kernel's deterministic mode nor the two kernels ran as pinned variants.
    expect(Object.keys(ours[0].variantRatios)).toEqual(['auto-deterministic/auto']);
    expect(Object.keys(ours[0].ratios)).toEqual([]);
    expect(AUTO_DETERMINISTIC_MAX_RATIO).toBe(1.1);
    const [det] = variantRatioSummary(rows);
    expect(det).toMatchObject({ ratio: 'auto-deterministic/auto', cells: 2, worst: ours[1].id, beyond: 1 });
    expect(ratioSummaryLines(rows)).toEqual([
      `'auto' deterministic ÷ 'auto' backward time: geometric mean ${Math.sqrt(1.05 * 1.25).toFixed(2)}x over 2 cells ` +
        `(range 1.05-1.25x, highest ${ours[1].id}); cells above 1.10x: 1`,
    ]);
    const report = { ...variantReport(), rows };
    expect(formatMarkdown(report)).toContain('| torch efficient | ours (deterministic bwd) | ours/flash | ours/cuDNN | deterministic ÷ auto |');
    const csv = formatCsv(report).trimEnd().split('\n').filter((l) => !l.startsWith('#'));
    const oursLine = csv.find((l) => l.startsWith('ours,'))?.split(',') ?? [];
    expect(Number(oursLine[CSV_COLUMNS.indexOf('ratio_auto_deterministic_over_auto')])).toBeCloseTo(1.05, 12);
  });

  test('backward variants: time ratios single-kernel ÷ two-kernel and deterministic ÷ single-kernel, per cell and summarised', () => {
    const v = variantReport();
    const ours = v.rows.filter((r) => r.impl === 'ours');
    expect(ours).toHaveLength(2);
    // Variants are compared with each other, not with ours: ours ÷ X only for torch.
    for (const r of ours) expect(Object.keys(r.ratios)).toEqual(['torch-flash']);
    expect(ours[0].variantRatios['single-kernel/two-kernel']).toBeCloseTo(1.1, 12);
    expect(ours[0].variantRatios['deterministic/single-kernel']).toBeCloseTo(1.2, 12);
    expect(ours[1].variantRatios['single-kernel/two-kernel']).toBeCloseTo(0.9, 12);
    expect(ours[1].variantRatios['deterministic/single-kernel']).toBeCloseTo(1.4, 12);
    expect(v.rows.filter((r) => r.impl !== 'ours').every((r) => Object.keys(r.variantRatios).length === 0)).toBe(true);

    const [split, det] = variantRatioSummary(v.rows);
    expect(split).toMatchObject({ ratio: 'single-kernel/two-kernel', cells: 2, worst: ours[1].id, beyond: 1 });
    expect(split.min).toBeCloseTo(0.9, 12);
    expect(split.max).toBeCloseTo(1.1, 12);
    expect(split.geomean).toBeCloseTo(Math.sqrt(1.1 * 0.9), 12);
    expect(det).toMatchObject({ ratio: 'deterministic/single-kernel', cells: 2, worst: ours[1].id, beyond: 1 });
    expect(det.geomean).toBeCloseTo(Math.sqrt(1.2 * 1.4), 12);
    expect(DETERMINISTIC_MAX_RATIO).toBe(1.3);
    // No ratio summary of ours against its own variants.
    expect(ratioSummary(v.rows).map((x) => x.impl)).toEqual(['torch-flash']);

    const lines = [
      `single-kernel ÷ two-kernel backward time: geometric mean 0.99x over 2 cells (range 0.90-1.10x, lowest ${ours[1].id}); ` +
        'cells below 1.00x (two kernels slower): 1',
      `deterministic ÷ atomic single-kernel backward time: geometric mean 1.30x over 2 cells (range 1.20-1.40x, highest ${ours[1].id}); ` +
        'cells above 1.30x: 1',
    ];
    expect(ratioSummaryLines(v.rows).slice(1)).toEqual(lines);
    const text = formatText(v);
    for (const l of lines) expect(text).toContain(l);
    expect(text).toMatch(/ours\/flash +single÷two-kernel +determ÷single\n/);
    expect(text).toMatch(/\n +1024 +16 x 32 +ours +.* 1\.20x +1\.10x +1\.20x\n/);
    expect(text).toContain('our kernel auto -> flash (backward auto -> two-kernel)');

    const md = formatMarkdown(v);
    for (const l of lines) expect(md).toContain(`- ${l}`);
    expect(md).toContain('| ours (single-kernel bwd) | ours (single-kernel deterministic bwd) | ours (two-kernel bwd) | ours/flash | ours/cuDNN | single ÷ two-kernel | deterministic ÷ single |');
    const mdRows = md.split('\n').filter((l) => /^\| (1024|2048) \|/.test(l));
    expect(mdRows).toHaveLength(2);
    expect(mdRows[0]).toMatch(/ \| 1\.20x \| – \| 1\.10x \| 1\.20x \|$/);
    expect(mdRows[1]).toMatch(/ \| 0\.90x \| 1\.40x \|$/);

    const csv = formatCsv(v).trimEnd().split('\n').filter((l) => !l.startsWith('#'));
    const col = (name: typeof CSV_COLUMNS[number]): number => CSV_COLUMNS.indexOf(name);
    const oursLine = csv.find((l) => l.startsWith('ours,'))?.split(',') ?? [];
    expect(oursLine[col('algorithm')]).toBe('two-kernel');
    expect(Number(oursLine[col('ratio_single_kernel_over_two_kernel')])).toBeCloseTo(1.1, 12);
    expect(Number(oursLine[col('ratio_deterministic_over_single_kernel')])).toBeCloseTo(1.2, 12);
  });

  test('backward variants: "ours" stands for the algorithm it ran when that variant was not asked for', () => {
    // Hopper, --variants single-kernel: ours ran the two kernels, so it is the denominator.
    const hopper = variantReport({ oursAlgorithm: 'two-kernel', impls: ['ours-single-kernel'] });
    const h = hopper.rows.filter((r) => r.impl === 'ours');
    expect(h.map((r) => r.variantRatios)).toEqual([
      { 'single-kernel/two-kernel': expect.closeTo(1.1, 12) }, { 'single-kernel/two-kernel': expect.closeTo(0.9, 12) },
    ]);
    // Elsewhere (or the CPU), --variants deterministic: ours ran the single kernel.
    const other = variantReport({ oursAlgorithm: 'single-kernel', impls: ['ours-deterministic'] });
    expect(other.rows.filter((r) => r.impl === 'ours').map((r) => Object.keys(r.variantRatios))).toEqual([
      ['deterministic/single-kernel'], ['deterministic/single-kernel'],
    ]);
    expect(headerLines(other).join('\n')).toContain('(backward auto -> single-kernel)');
    // A variant that failed (the two kernels off Hopper) leaves its ratio null, shown blank; no summary line.
    const failed = variantReport({ oursAlgorithm: 'single-kernel', impls: ['ours-two-kernel'], failTwoKernel: true });
    const f = failed.rows.filter((r) => r.impl === 'ours');
    expect(f.map((r) => r.variantRatios)).toEqual([{ 'single-kernel/two-kernel': null }, { 'single-kernel/two-kernel': null }]);
    expect(variantRatioSummary(failed.rows)).toEqual([]);
    expect(formatText(failed)).toContain('[1] ours-two-kernel: Expected algorithm');
    // Forward cells have no variant ratios, and no variants: no extra columns.
    expect(formatMarkdown(report)).not.toContain('single ÷ two-kernel');
    expect(formatText(report)).not.toContain('single÷two-kernel');
  });

  test('the header names the preset alone only when no flag replaced its values', () => {
    const unchanged: BenchReport = { ...report, settings: { ...report.settings, presetOverrides: [] } };
    expect(headerLines(unchanged).at(-1)).toMatch(/ · preset fa2-grid$/);
    const line = headerLines(report).at(-1);
    expect(line).toMatch(/ · preset fa2-grid overridden by --seqlen 1024,2048 --head-dim 64 --causal true --pass fwd --compare naive,torch$/);
    expect(formatCsv(report)).toContain('\n# preset: fa2-grid overridden by --seqlen 1024,2048 --head-dim 64');
    expect(formatCsv(unchanged)).toContain('\n# preset: fa2-grid\n');
  });

  test('formatting helpers', () => {
    expect(fmtBytes(512)).toBe('512 B');
    expect(fmtBytes(3 << 20)).toBe('3.00 MiB');
    expect(fmtBytes(2.5 * 2 ** 30)).toBe('2.50 GiB');
    expect(seqLabel(512)).toBe('512');
    expect(seqLabel(16384)).toBe('16k');
  });

  test('chart: one series per implementation, one panel per (head dim, causal, pass), rendered to SVG', async () => {
    const spec = chartSpec(report) as { data: { values: { impl: string }[] } };
    expect(new Set(spec.data.values.map((v) => v.impl))).toEqual(new Set(['ours', 'naive', 'torch-flash', 'torch-cudnn', 'torch-efficient']));
    const svg = await renderChartSvg(report);
    expect(svg.startsWith('<svg')).toBe(true);
    for (const name of ['ours', 'naive', 'torch-flash', 'torch-cudnn', 'torch-efficient', 'TFLOP/s', 'NVIDIA H200']) expect(svg).toContain(name);
  });
});

describe('main() in-process', () => {
  function io(): { stdout: string[]; stderr: string[]; io: Parameters<typeof main>[1] } {
    const stdout: string[] = [];
    const stderr: string[] = [];
    const sink = (into: string[]) => ({ write: (s: string) => (into.push(s), true) }) as unknown as NodeJS.WritableStream;
    return { stdout, stderr, io: { stdout: sink(stdout), stderr: sink(stderr), env: {} } };
  }

  test('--help prints the help on stdout; a bad flag exits 2 with the message', async () => {
    const a = io();
    expect(await main(['--help'], a.io)).toBe(0);
    expect(a.stdout.join('')).toBe(HELP);
    const b = io();
    expect(await main(['--seqlen', 'abc'], b.io)).toBe(2);
    expect(b.stderr.join('')).toBe('flash-attn-bench: --seqlen: expected a comma-separated list of positive integers (e.g. 1024,4k) but received "abc"\n');
    const c = io();
    expect(await main(['--list-presets'], c.io)).toBe(0);
    expect(c.stdout.join('')).toBe(listPresets());
  });

  test('--version and -v print the package.json version; an unknown flag beside them exits 2', async () => {
    expect(packageJson.name).toBe('flash-attn-node');
    for (const flag of ['--version', '-v']) {
      const a = io();
      expect(await main([flag], a.io)).toBe(0);
      expect(a.stdout.join('')).toBe(`flash-attn-bench ${packageJson.version}\n`);
      expect(a.stderr.join('')).toBe('');
    }
    const b = io();
    expect(await main(['--version', '--frobnicate'], b.io)).toBe(2);
    expect(b.stdout.join('')).toBe('');
    expect(b.stderr.join('')).toBe('flash-attn-bench: unknown option "--frobnicate" (see --help)\n');
  });
});

describe('package version', () => {
  let tmp: string;
  beforeAll(() => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-bench-version-'));
  });
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

  test('found by walking up from the sources (bench/) and from the compiled layout (dist/bench/)', () => {
    expect(findPackageJson(path.join(root, 'bench'))).toEqual({ path: path.join(root, 'package.json'), name: 'flash-attn-node', version: packageJson.version });
    expect(packageVersionFrom(path.join(root, 'bench'))).toBe(packageJson.version);
    // An installed package: <pkg>/dist/bench/cli.js, with other package.json files on the way up and above.
    const pkg = path.join(tmp, 'node_modules', 'flash-attn-node');
    fs.mkdirSync(path.join(pkg, 'dist', 'bench'), { recursive: true });
    fs.writeFileSync(path.join(tmp, 'package.json'), JSON.stringify({ name: 'some-app', version: '3.0.0' }));
    fs.writeFileSync(path.join(pkg, 'package.json'), JSON.stringify({ name: 'flash-attn-node', version: '9.8.7-rc.1' }));
    fs.writeFileSync(path.join(pkg, 'dist', 'package.json'), JSON.stringify({ type: 'commonjs' }));
    fs.writeFileSync(path.join(pkg, 'dist', 'bench', 'package.json'), '{ not json');
    expect(packageVersionFrom(path.join(pkg, 'dist', 'bench'))).toBe('9.8.7-rc.1');
    expect(findPackageJson(path.join(pkg, 'dist', 'bench'))?.path).toBe(path.join(pkg, 'package.json'));
    // No flash-attn-node above: an error, not another package's version.
    expect(findPackageJson(tmp)).toBeNull();
    expect(() => packageVersionFrom(tmp)).toThrow(/no package\.json named flash-attn-node in .* or above it/);
  });

  test('--version in a fresh process loads no native addon and runs nothing', () => {
    // Counts process.dlopen (how Node loads a .node addon) around main(['--version']).
    const r = runNodeChild(
      `let dlopens = 0;
       const dlopen = process.dlopen;
       process.dlopen = function (...a) { dlopens += 1; return dlopen.apply(this, a); };
       require('./bench/cli.ts').main(['--version']).then((c) => {
         const addons = Object.keys(require.cache).filter((k) => k.endsWith('.node'));
         process.stderr.write(JSON.stringify({ dlopens, addons }));
         process.exitCode = c;
       }, (e) => { console.error(e); process.exitCode = 9; });`,
      { cwd: root, timeoutMs: 60000 },
    );
    expect(r.status).toBe(0);
    expect(r.stdout).toBe(`flash-attn-bench ${packageJson.version}\n`);
    expect(JSON.parse(r.stderr)).toEqual({ dlopens: 0, addons: [] });
    // The same count sees the addon load when the CLI does run something.
    const probe = runNodeChild(
      `let dlopens = 0;
       const dlopen = process.dlopen;
       process.dlopen = function (...a) { dlopens += 1; return dlopen.apply(this, a); };
       require('./bench/cli.ts').main(['--device', 'cpu', '--seqlen', '16', '--head-dim', '8', '--pass', 'fwd', '--causal', 'false',
         '--repeats', '1', '--warmup', '0', '--json', '--quiet']).then((c) => {
         process.stderr.write(JSON.stringify({ dlopens }));
         process.exitCode = c;
       }, (e) => { console.error(e); process.exitCode = 9; });`,
      { cwd: root, timeoutMs: 60000 },
    );
    expect(probe.status).toBe(0);
    expect(JSON.parse(probe.stderr).dlopens).toBeGreaterThan(0);
  });
});

describe('end to end on the CPU backend (child process)', () => {
  const tiny = ['--device', 'cpu', '--seqlen', '64,128', '--head-dim', '32', '--repeats', '2', '--warmup', '1', '--quiet'];
  let tmp: string;
  beforeAll(() => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-bench-'));
  });
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

  /** Runs the CLI on `argv` in a child process, after `preamble` (JS run first in the child: a test's wrapper around a module). */
  function cli(argv: string[], env: Record<string, string> = {}, preamble = ''): { status: number | null; stdout: string; stderr: string } {
    const r = runNodeChild(
      `${preamble}
       require('./bench/cli.ts').main(${JSON.stringify(argv)}).then((c) => { process.exitCode = c; }, (e) => { console.error(e); process.exitCode = 9; });`,
      { cwd: root, env, timeoutMs: 60000 },
    );
    return { status: r.status, stdout: r.stdout, stderr: r.stderr };
  }

  /**
   * A preamble that appends {"ours": n} to $FAKE_PYTHON_RECORD before each timed batch of ours,
   * beside the fake python's own line per request: the file then holds both sides in the order
   * they ran (each request is answered before the CLI goes on).
   */
  const recordOurs = `
    const timing = require('./lib/timing.ts');
    const timeRepeats = timing.timeRepeatsOnDevice;
    timing.timeRepeatsOnDevice = (device, fn, n) => {
      require('fs').appendFileSync(process.env.FAKE_PYTHON_RECORD, JSON.stringify({ ours: n }) + '\\n');
      return timeRepeats(device, fn, n);
    };`;

  /** The record of a run with {@link recordOurs}: `ours <n>`, `begin <cell id>`, `round <i>`, `end`, or `list <cell ids>`. */
  function turns(record: string): string[] {
    return fs.readFileSync(record, 'utf8').trimEnd().split('\n').map((l) => {
      const x = JSON.parse(l) as { ours?: number; request?: { op?: string; cell?: BenchCell; index?: number; cells?: BenchCell[] } };
      if (x.ours !== undefined) return `ours ${x.ours}`;
      const r = x.request ?? {};
      if (r.op === 'begin') return `begin ${r.cell?.id}`;
      if (r.op === 'round') return `round ${r.index}`;
      if (r.op === 'end') return 'end';
      return `list ${(r.cells ?? []).map((c) => c.id).join(',')}`;
    });
  }

  /** Every number in `v` (recursively) is positive and finite. */
  function numbersIn(v: unknown, out: number[] = []): number[] {
    if (typeof v === 'number') out.push(v);
    else if (Array.isArray(v)) v.forEach((x) => numbersIn(x, out));
    else if (v && typeof v === 'object') Object.values(v).forEach((x) => numbersIn(x, out));
    return out;
  }

  test('--json: the schema, and every measurement positive and finite', () => {
    const r = cli([...tiny, '--json']);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const report = JSON.parse(r.stdout) as BenchReport;
    expect(report).toMatchObject({ tool: 'flash-attn-bench', schema: 2 });
    expect(report.env).toMatchObject({ device: 'cpu', node: process.version });
    expect(Number.isNaN(Date.parse(report.env.date))).toBe(false);
    expect(report.env.deviceName).toMatch(/^CPU backend \(\d+ threads\)$/);
    expect(report.settings).toMatchObject({
      device: 'cpu', dtype: 'float32', seqlens: [64, 128], headDims: [32], repeats: 2, warmup: 1, kernelResolved: 'flash',
      preset: 'cpu-small', presetOverrides: ['--seqlen 64,128', '--head-dim 32', '--repeats 2'],
    });
    // cpu-small's masks and passes: 2 seqlens x 2 masks x 3 passes.
    expect(report.rows).toHaveLength(12);
    for (const row of report.rows) {
      expect(row).toMatchObject({ impl: 'ours', device: 'cpu', kernel: 'flash', status: 'ok', error: null, headDim: 32, dtype: 'float32' });
      expect(row.algorithm).toBe(row.pass === 'fwd' ? null : 'single-kernel');
      expect(row.plan).toBe(row.pass === 'fwdbwd' ? 'fwd cpu; bwd cpu' : 'cpu');
      for (const k of ['msMedian', 'msMin', 'msMax', 'tflops', 'peakBytes'] as const) expect(typeof row[k]).toBe('number');
      expect(row.msMin as number).toBeLessThanOrEqual(row.msMedian as number);
      expect(row.msMedian as number).toBeLessThanOrEqual(row.msMax as number);
      expect(row.tflops as number).toBeCloseTo(passFlops(row, row.pass) / ((row.msMedian as number) * 1e-3) / 1e12, 6);
    }
    const nums = numbersIn(report.rows);
    expect(nums.length).toBeGreaterThan(12 * 8);
    for (const n of nums) {
      expect(Number.isFinite(n)).toBe(true);
      expect(n).toBeGreaterThan(0);
    }
  });

  test('--json on the CPU: the CPU run\'s fields, none of the GPU grid\'s, CUDA\'s or PyTorch\'s', () => {
    const r = cli([...tiny, '--pass', 'fwd', '--causal', 'false', '--json']);
    expect(r.status).toBe(0);
    const report = JSON.parse(r.stdout) as BenchReport;
    const env = report.env as unknown as Record<string, unknown>;
    for (const k of ['computeCapability', 'driver', 'cudaDriver', 'cudaRuntime', 'torch', 'torchUnavailable']) expect(env).not.toHaveProperty(k);
    expect(Number.isInteger(report.env.cpuBackendThreads)).toBe(true);
    expect(report.env.cpuBackendThreads as number).toBeGreaterThan(0);
    expect(report.env.deviceName).toBe(`CPU backend (${report.env.cpuBackendThreads} threads)`);
    expect(report.env.cpuThreads).toBe(os.cpus().length);
    const settings = report.settings as unknown as Record<string, unknown>;
    // tokens/hidden (the FA2 grid's 16384/seqlen and 2048/headDim), the SDPA backends, the GPU's peak.
    for (const k of ['tokens', 'hidden', 'torchBackends', 'peakTflops']) expect(settings).not.toHaveProperty(k);
    expect(report.settings).toMatchObject({ device: 'cpu', batch: 1, heads: 8, compare: [], timing: 'host time to completion', preset: 'cpu-small' });
    expect(report.rows).toHaveLength(2);
    for (const row of report.rows) {
      expect(row).not.toHaveProperty('pctPeak');
      expect(row).not.toHaveProperty('mask');
      expect(row).toMatchObject({ device: 'cpu', batch: 1, headsQ: 8 });
    }
    expect(JSON.stringify(report)).not.toMatch(/cuda|cudnn|torch/i);
    // The text tables of the same report leave the % peak column blank.
    expect(formatText(report)).toMatch(/\n +64 +1 x 8 +ours +[\d.]+ +[\d.]+-[\d.]+ +[\d.]+ +[\d.]+ (?:B|KiB|MiB)\n/);
  });

  test('--json: tokens and hidden are there only when they set the batch and the heads', () => {
    const grid = ['--preset', 'fa2-grid', ...tiny, '--seqlen', '64', '--pass', 'fwd', '--causal', 'false', '--json'];
    const a = JSON.parse(cli(grid).stdout) as BenchReport;
    expect(a.settings).toMatchObject({ batch: null, tokens: 16384, heads: null, hidden: 2048, preset: 'fa2-grid' });
    // --warmup 1 is fa2-grid's warm-up on the CPU: not an override.
    expect(a.settings.presetOverrides).toEqual(['--device cpu', '--head-dim 32', '--repeats 2', '--seqlen 64', '--pass fwd', '--causal false']);
    expect(a.rows.map((x) => [x.batch, x.headsQ])).toEqual([[16384 / 64, 2048 / 32]]);
    const b = JSON.parse(cli([...grid, '--batch', '2']).stdout) as BenchReport;
    expect(b.settings).not.toHaveProperty('tokens');
    expect(b.settings).toMatchObject({ batch: 2, heads: null, hidden: 2048 });
    expect(b.rows.map((x) => [x.batch, x.headsQ])).toEqual([[2, 2048 / 32]]);
  });

  test('--csv prints the header and one line per cell; --chart writes an SVG with the series', () => {
    const chart = path.join(tmp, 'chart.svg');
    const r = cli([...tiny, '--pass', 'fwd', '--causal', 'false', '--csv', '--chart', chart]);
    expect(r.status).toBe(0);
    const lines = r.stdout.trimEnd().split('\n');
    expect(lines.some((l) => l.startsWith('# node: v'))).toBe(true);
    expect(lines.some((l) => l.startsWith('# date: '))).toBe(true);
    const body = lines.filter((l) => !l.startsWith('#'));
    expect(body[0]).toBe(CSV_COLUMNS.join(','));
    expect(body.slice(1).map((l) => l.split(',')[0])).toEqual(['ours', 'ours']);
    const svg = fs.readFileSync(chart, 'utf8');
    expect(svg).toMatch(/^<svg[\s>]/);
    expect(svg).toContain('ours');
    expect(svg).toContain('forward · d32 · not causal');
  });

  test('--compare torch without a Python: the plain reason, and our rows all the same', () => {
    const missing = path.join(tmp, 'no-such-python');
    const r = cli([...tiny, '--pass', 'fwd', '--compare', 'torch,naive', '--json'], { FLASH_ATTN_BENCH_PYTHON: missing });
    expect(r.status).toBe(0);
    expect(r.stderr).toContain(`--compare torch: no PyTorch baselines: ${missing} was not found`);
    const report = JSON.parse(r.stdout) as BenchReport;
    expect(report.env.torchUnavailable).toContain(`${missing} was not found`);
    expect(report.rows.map((x) => x.impl)).toEqual(['ours', 'ours', 'ours', 'ours']);
    expect(report.notes.join('\n')).toContain('naive kernel is CUDA-only');
  });

  test('--compare torch with a Python that answers: torch rows, ratio columns, versions in the report', () => {
    const fake = path.join(__dirname, 'fixtures', 'fake-python', 'python3');
    fs.chmodSync(fake, 0o755);
    const r = cli([...tiny, '--seqlen', '64', '--dtype', 'bf16', '--pass', 'fwd', '--causal', 'false', '--compare', 'torch', '--python', fake, '--markdown'], { FAKE_PYTHON_MODE: 'ok' });
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('PyTorch 2.11.0+cu130');
    expect(r.stdout).toContain('| seqlen | batch × heads | ours | naive | torch flash | torch cuDNN | torch efficient | ours/flash | ours/cuDNN |');
    const row = r.stdout.split('\n').find((l) => l.startsWith('| 64 |'));
    expect(row).toBeDefined();
    // ours, then naive (not run on the CPU), then the three torch backends and the two ratios, all measured.
    const cols = (row as string).split('|').slice(3, -1).map((c) => c.trim());
    expect(cols).toHaveLength(7);
    expect(cols[1]).toBe('–');
    for (const i of [0, 2, 3, 4]) expect(cols[i]).toMatch(/^[\d.]+ \([\d.]+ ms, [\d.]+ \w+\)$/);
    for (const i of [5, 6]) expect(cols[i]).toMatch(/^[\d.]+x$/);
  });

  test('--compare torch: one worker; in each cell our round i, then PyTorch\'s round i (begin before, end after); the report as before', () => {
    const fake = path.join(__dirname, 'fixtures', 'fake-python', 'python3');
    fs.chmodSync(fake, 0o755);
    const record = path.join(tmp, 'torch-turns.jsonl');
    // Not --quiet: the log's row lines show when each side's rows came. 5 repeats: as many rounds as PyTorch's 20.
    const argv = [...tiny.filter((a) => a !== '--quiet'), '--repeats', '5', '--dtype', 'bf16', '--pass', 'fwd,bwd', '--causal', 'both', '--compare', 'torch',
      '--python', fake, '--json'];
    const r = cli(argv, { FAKE_PYTHON_MODE: 'ok', FAKE_PYTHON_RECORD: record }, recordOurs);
    expect(r.status).toBe(0);
    const cells = buildCells(settings(argv));
    expect(cells).toHaveLength(8);
    const oneCell = (id: string): string[] => [`begin ${id}`, ...[0, 1, 2, 3, 4].flatMap((i) => ['ours 1', `round ${i}`]), 'end'];
    expect(turns(record)).toEqual(cells.flatMap((c) => oneCell(c.id)));
    const seen = fs.readFileSync(record, 'utf8').trimEnd().split('\n').map((l) => JSON.parse(l) as { argv?: string[]; pid?: number; request?: Record<string, unknown> })
      .filter((x) => x.request !== undefined);
    expect(new Set(seen.map((x) => x.pid)).size).toBe(1);
    expect(seen[0].argv).toEqual([path.join(root, 'bench', 'torch_sdpa.py'), '--serve']);
    // PyTorch keeps at least 20 repeats: 5 rounds of 4, as ours' 5 of 1.
    expect(seen[0].request).toEqual({
      op: 'begin', cell: cells[0], backends: ['flash', 'cudnn', 'efficient'], warmup: 1, warmupMs: 0, repeats: 20, seed: 0, allowMaterializedMask: false,
    });
    // The log: each cell's row of ours, then PyTorch's rows of it, before the next cell's.
    const impls = ['ours', 'torch-flash', 'torch-cudnn', 'torch-efficient'];
    const logged = r.stderr.split('\n').map((l) => /^\[\d+\/(\d+)\] (\S+) (\S+):/.exec(l)).filter((m) => m !== null) as RegExpExecArray[];
    expect(logged.map((m) => `${m[3]} ${m[2]}`)).toEqual(cells.flatMap((c) => impls.map((i) => `${c.id} ${i}`)));
    expect(new Set(logged.map((m) => m[1]))).toEqual(new Set(['32']));

    const report = JSON.parse(r.stdout) as BenchReport;
    expect(Object.keys(report)).toEqual(['tool', 'schema', 'env', 'settings', 'notes', 'rows']);
    expect(report.schema).toBe(2);
    expect(report.env).toMatchObject({ torch: { torch: '2.11.0+cu130', device: 'NVIDIA H100 80GB HBM3' }, torchUnavailable: null });
    expect(report.settings.timing).toBe('host time to completion; ours and PyTorch SDPA take turns round by round within each cell');
    expect(report.notes).toEqual(['PyTorch rows ran on NVIDIA H100 80GB HBM3 (CUDA); ours on the CPU backend']);
    // Cell by cell in grid order, ours then the SDPA backends, as sortRows orders them.
    expect(report.rows.map((x) => `${x.id} ${x.impl}`)).toEqual(cells.flatMap((c) => impls.map((i) => `${c.id} ${i}`)));
    // The fake numbers its rows from 1 within each answer: each cell's end gave its own.
    expect(report.rows.filter((x) => x.impl !== 'ours').map((x) => x.msMin)).toEqual(cells.flatMap(() => [1, 2, 3]));
    for (const row of report.rows) {
      expect(row.status).toBe('ok');
      if (row.impl === 'ours') {
        expect(Object.keys(row.ratios)).toEqual(['torch-flash', 'torch-cudnn', 'torch-efficient']);
        expect(row).not.toHaveProperty('mask');
      } else {
        expect(row).toMatchObject({ device: 'cuda', kernel: null, algorithm: null, error: null, ratios: {}, variantRatios: {} });
        expect(row.mask).toBe(row.causal ? 'causal' : 'none');
        expect(row.pctPeak as number).toBeCloseTo((100 * (row.tflops as number)) / 989, 6);
      }
    }
  });

  test('--compare torch: cells ours could not time get PyTorch rows from one list request after their group', () => {
    const fake = path.join(__dirname, 'fixtures', 'fake-python', 'python3');
    fs.chmodSync(fake, 0o755);
    const record = path.join(tmp, 'torch-untimed.jsonl');
    // The first input ours makes (the first group's q) runs out of memory.
    const failFirstInput = `
      const { Tensor } = require('./lib/index.ts');
      const fromFloat32Array = Tensor.fromFloat32Array;
      let made = 0;
      Tensor.fromFloat32Array = function (...args) {
        if (made++ === 0) throw new Error('CUDA out of memory (test)');
        return fromFloat32Array.apply(this, args);
      };`;
    const argv = [...tiny, '--dtype', 'bf16', '--pass', 'fwd', '--causal', 'both', '--compare', 'torch', '--python', fake, '--json'];
    const r = cli(argv, { FAKE_PYTHON_MODE: 'ok', FAKE_PYTHON_RECORD: record }, failFirstInput + recordOurs);
    expect(r.status).toBe(0);
    const cells = buildCells(settings(argv));
    expect(groupByInputs(cells).map((g) => g.map((c) => c.id))).toEqual([[cells[0].id, cells[1].id], [cells[2].id, cells[3].id]]);
    // 2 repeats of ours, 20 of PyTorch: PyTorch's rounds past ours' two run back to back before its end.
    const oneCell = (id: string): string[] => [`begin ${id}`, 'ours 1', 'round 0', 'ours 1', 'round 1', 'round 2', 'round 3', 'round 4', 'end'];
    expect(turns(record)).toEqual([`list ${cells[0].id},${cells[1].id}`, ...oneCell(cells[2].id), ...oneCell(cells[3].id)]);
    const report = JSON.parse(r.stdout) as BenchReport;
    const impls = ['ours', 'torch-flash', 'torch-cudnn', 'torch-efficient'];
    expect(report.rows.map((x) => `${x.id} ${x.impl} ${x.status}`)).toEqual(cells.flatMap((c, i) => impls.map((impl) =>
      `${c.id} ${impl} ${impl === 'ours' && i < 2 ? 'oom' : 'ok'}`)));
    expect(report.rows[0].error).toBe('inputs: CUDA out of memory (test)');
    expect(report.notes).toEqual(['PyTorch rows ran on NVIDIA H100 80GB HBM3 (CUDA); ours on the CPU backend']);
  });

  test('--compare torch: a worker that dies mid-cell keeps the rows it gave, and the report says how many cells lack them', () => {
    const fake = path.join(__dirname, 'fixtures', 'fake-python', 'python3');
    fs.chmodSync(fake, 0o755);
    const record = path.join(tmp, 'torch-crash.jsonl');
    const argv = [...tiny, '--dtype', 'bf16', '--pass', 'fwd', '--causal', 'false', '--head-dim', '32,64', '--compare', 'torch', '--python', fake, '--json'];
    const r = cli(argv, { FAKE_PYTHON_MODE: 'crash-mid-cell', FAKE_PYTHON_RECORD: record }, recordOurs);
    expect(r.status).toBe(0);
    const cells = buildCells(settings(argv));
    expect(cells).toHaveLength(4);
    // The first cell answered; the second crashed the worker in its round 1; ours went on, PyTorch was not asked again.
    expect(turns(record)).toEqual([
      `begin ${cells[0].id}`, 'ours 1', 'round 0', 'ours 1', 'round 1', 'round 2', 'round 3', 'round 4', 'end',
      `begin ${cells[1].id}`, 'ours 1', 'round 0', 'ours 1', 'round 1',
      'ours 1', 'ours 1', 'ours 1', 'ours 1',
    ]);
    expect(r.stderr).toMatch(/--compare torch: PyTorch stopped after 1 of 4 cells: .*torch_sdpa\.py exited with status 1 .*illegal memory access.*; going on without it/);
    const report = JSON.parse(r.stdout) as BenchReport;
    expect(report.env.torchUnavailable).toBeNull();
    expect(report.env.torch).toMatchObject({ device: 'NVIDIA H100 80GB HBM3' });
    expect(report.notes).toHaveLength(2);
    expect(report.notes[0]).toMatch(/^--compare torch: PyTorch SDPA stopped mid-run \(.*exited with status 1.*\): 3 of 4 cells have no PyTorch rows$/);
    expect(report.notes[1]).toBe('PyTorch rows ran on NVIDIA H100 80GB HBM3 (CUDA); ours on the CPU backend');
    const impls = ['ours', 'torch-flash', 'torch-cudnn', 'torch-efficient'];
    expect(report.rows.map((x) => `${x.id} ${x.impl}`)).toEqual([
      ...impls.map((i) => `${cells[0].id} ${i}`), ...cells.slice(1).map((c) => `${c.id} ours`),
    ]);
    expect(report.rows.every((x) => x.status === 'ok')).toBe(true);
  });

  test('--variants on the CPU: single-kernel and deterministic rows with deterministic ÷ single-kernel; two-kernel rows are errors', () => {
    const r = cli([...tiny, '--seqlen', '64', '--pass', 'fwd,bwd', '--causal', 'false', '--variants', 'single-kernel,deterministic,two-kernel,auto-deterministic', '--json']);
    expect(r.status).toBe(0); // a variant's error is not one of ours
    const report = JSON.parse(r.stdout) as BenchReport;
    expect(report.rows.map((x) => [x.impl, x.pass, x.status, x.algorithm])).toEqual([
      ['ours', 'fwd', 'ok', null],
      ['ours', 'bwd', 'ok', 'single-kernel'],
      ['ours-single-kernel', 'bwd', 'ok', 'single-kernel'],
      ['ours-deterministic', 'bwd', 'ok', 'single-kernel'],
      ['ours-two-kernel', 'bwd', 'error', 'two-kernel'],
      ['ours-auto-deterministic', 'bwd', 'ok', 'single-kernel'],
    ]);
    expect(report.rows[4].error).toMatch(/^Expected algorithm to be 'auto' or 'single-kernel' .*CPU backend/);
    const bwd = report.rows[1];
    expect(bwd.variantRatios).toEqual({
      'single-kernel/two-kernel': null, 'deterministic/single-kernel': expect.any(Number), 'auto-deterministic/auto': expect.any(Number),
    });
    expect(bwd.variantRatios['auto-deterministic/auto']).toBeCloseTo((report.rows[5].msMedian as number) / (bwd.msMedian as number), 9);
    expect(bwd.variantRatios['deterministic/single-kernel']).toBeCloseTo((report.rows[3].msMedian as number) / (report.rows[2].msMedian as number), 9);
    const text = formatText(report);
    expect(text).toContain('our kernel auto -> flash (backward auto -> single-kernel)');
    expect(text).toMatch(/^deterministic ÷ atomic single-kernel backward time: geometric mean [\d.]+x over 1 cells .*cells above 1\.30x: [01]$/m);
    expect(text).not.toMatch(/^single-kernel ÷ two-kernel/m);
  });

  (HAS_CUDA ? test.skip : test)('no flags and no GPU: preset cpu-small on the CPU backend as it is, and the report says so', () => {
    const r = cli(['--json', '--quiet']);
    expect(r.status).toBe(0);
    const report = JSON.parse(r.stdout) as BenchReport;
    expect(report.env.device).toBe('cpu');
    const { tokens, hidden, torchBackends, ...used } = deviceDefaults('cpu');
    expect([tokens, hidden, torchBackends]).toEqual([16384, 2048, ['flash', 'cudnn', 'efficient']]);
    expect(report.settings).toMatchObject(used);
    for (const k of ['tokens', 'hidden', 'torchBackends', 'peakTflops']) expect(report.settings).not.toHaveProperty(k);
    expect(report.settings).toMatchObject({ preset: 'cpu-small', presetOverrides: [], seqlens: [256, 512, 1024, 2048], batch: 1, heads: 8 });
    expect(report.rows).toHaveLength(buildCells(deviceDefaults('cpu')).length);
    expect(report.notes).toHaveLength(1);
    expect(report.notes[0]).toMatch(/^no usable GPU \(.+\): ran the small CPU grid \(preset cpu-small\) on the CPU backend, \d+ threads$/);
  });

  (HAS_CUDA ? test.skip : test)('no device flag and no GPU, flags over cpu-small: the closing line names the flags, not the preset as it is', () => {
    const r = cli(['--seqlen', '64', '--head-dim', '32', '--pass', 'fwd', '--causal', 'false', '--repeats', '2']);
    expect(r.status).toBe(0);
    const lines = r.stdout.trimEnd().split('\n');
    const last = lines[lines.length - 1];
    expect(last).toMatch(
      /^note: no usable GPU \(.+\): ran on the CPU backend, \d+ threads: preset cpu-small overridden by --seqlen 64 --head-dim 32 --pass fwd --causal false --repeats 2$/,
    );
    expect(last).not.toContain('small CPU grid');
    expect(last).not.toContain('(preset cpu-small)');
    // The header says the same.
    expect(lines[2]).toMatch(/ · preset cpu-small overridden by --seqlen 64 --head-dim 32 --pass fwd --causal false --repeats 2$/);
    const json = cli(['--seqlen', '64', '--head-dim', '32', '--pass', 'fwd', '--causal', 'false', '--repeats', '2', '--json']);
    const report = JSON.parse(json.stdout) as BenchReport;
    expect(report.settings).toMatchObject({ preset: 'cpu-small', presetOverrides: ['--seqlen 64', '--head-dim 32', '--pass fwd', '--causal false', '--repeats 2'] });
    expect(report.notes).toHaveLength(1);
    expect(report.notes[0]).toMatch(/: ran on the CPU backend, \d+ threads: preset cpu-small overridden by --seqlen 64 /);
  });
});
