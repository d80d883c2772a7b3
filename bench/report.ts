/**
 * The outputs of a run: text tables, JSON, CSV and GitHub markdown. Every format carries where and
 * when it was measured: device, driver, CUDA runtime, PyTorch (when compared), Node, date.
 * @packageDocumentation
 */
import * as os from 'os';
import type { Device } from '../lib';
import { GridSettings } from './grid';
import { algorithmsRan, BenchRow, Impl, IMPL_LABELS, IMPLS, OUR_VARIANTS, VARIANT_RATIOS, VariantRatio } from './runner';
import type { TorchBackend, TorchEnv } from './torch';
import { findPackageJson } from './version';

/**
 * Where and when a run was measured. Fields that describe a GPU or PyTorch are there only when the
 * run used one: a CPU run without --compare torch has none of them.
 */
export interface BenchEnv {
  /** ISO 8601 time at the start of the run. */
  date: string;
  /** flash-attn-node's version. */
  version: string;
  node: string;
  platform: string;
  /** Where our rows ran. */
  device: Device;
  /** The GPU's name, or "CPU backend (N threads)". */
  deviceName: string;
  /**
   * The GPU's compute capability (e.g. "9.0"). Present when something ran on a GPU (a CUDA run, or
   * PyTorch's rows beside a CPU run); absent otherwise, as are `driver`, `cudaDriver` and `cudaRuntime`.
   */
  computeCapability?: string | null;
  /**
   * The NVIDIA driver's version (e.g. "580.95.05"), when known: from /proc/driver/nvidia/version, or
   * from PyTorch's nvidia-smi when compared; else null. Only when something ran on a GPU.
   */
  driver?: string | null;
  /** The CUDA version the driver supports (e.g. "13.0"). Only when something ran on a GPU. */
  cudaDriver?: string | null;
  /** The CUDA runtime the addon was built with. Only when something ran on a GPU. */
  cudaRuntime?: string | null;
  /** The host's CPU model. */
  cpu: string;
  /** The host's logical CPUs. */
  cpuThreads: number;
  /** CPU runs: the threads of the CPU backend that ran our rows. Absent on CUDA runs. */
  cpuBackendThreads?: number;
  /** With --compare torch: PyTorch's environment, or null when the baselines could not run. Absent otherwise. */
  torch?: TorchEnv | null;
  /** With --compare torch: why the PyTorch baselines are missing, or null when they ran. Absent otherwise. */
  torchUnavailable?: string | null;
}

/**
 * The settings a run resolved to ({@link GridSettings}), less those that did not shape it, and how
 * it was set up. `tokens` is there only when the batch came from it (batch null: the FA2 grid's
 * batch = tokens/seqlen), `hidden` only when the heads did (heads = hidden/headDim), `torchBackends`
 * only with --compare torch, `peakTflops` only on CUDA runs.
 */
export type ReportSettings = Omit<GridSettings, 'tokens' | 'hidden' | 'torchBackends'> & {
  tokens?: number;
  hidden?: number;
  torchBackends?: TorchBackend[];
  /**
   * The preset the settings started from: --preset's, else the device's default (fa2-grid on CUDA,
   * cpu-small on the CPU). The run is that preset only when `presetOverrides` is empty.
   */
  preset: string;
  /** The flags that replaced values of `preset` (e.g. "--seqlen 64"); empty when its settings ran unchanged. */
  presetOverrides: string[];
  /** The kernel our rows ran ('auto' resolved). */
  kernelResolved: string;
  /** How time was measured. */
  timing: string;
  /** CUDA runs: the GPU's dense peak TFLOP/s for the dtype, used for pctPeak, or null when unknown. Absent on CPU runs. */
  peakTflops?: number | null;
};

/**
 * Everything a run produced; `--json` prints exactly this. Fields marked as present only in some
 * runs are left out (not null) where they do not apply.
 */
export interface BenchReport {
  tool: 'flash-attn-bench';
  /** Bumped when the JSON shape changes. */
  schema: 2;
  env: BenchEnv;
  settings: ReportSettings;
  /** Things the reader must know (what was not run and why, device substitutions). */
  notes: string[];
  rows: BenchRow[];
}

/** The JSON schema version of {@link BenchReport}. */
export const REPORT_SCHEMA = 2;

/** `settings` as reported: without the values that did not shape the run (see {@link ReportSettings}). */
export function reportSettings(
  s: GridSettings, extra: Pick<ReportSettings, 'preset' | 'presetOverrides' | 'kernelResolved' | 'timing'> & { peakTflops: number | null },
): ReportSettings {
  const { tokens, hidden, torchBackends, ...rest } = s;
  return {
    ...rest,
    ...(s.batch === null ? { tokens } : {}),
    ...(s.heads === null ? { hidden } : {}),
    ...(s.compare.includes('torch') ? { torchBackends } : {}),
    preset: extra.preset, presetOverrides: extra.presetOverrides, kernelResolved: extra.kernelResolved, timing: extra.timing,
    ...(s.device === 'cuda' ? { peakTflops: extra.peakTflops } : {}),
  };
}

/** "preset NAME", or "preset NAME overridden by FLAGS" when flags replaced some of its values. */
export function presetText(preset: string, overrides: readonly string[]): string {
  return overrides.length === 0 ? `preset ${preset}` : `preset ${preset} overridden by ${overrides.join(' ')}`;
}

/** flash-attn-node's version from its package.json ("unknown" if none is found). */
export function packageVersion(): string {
  return findPackageJson()?.version ?? 'unknown';
}

/** The host's CPU model. */
export function cpuModel(): string {
  return os.cpus()[0]?.model.trim() ?? 'unknown CPU';
}

// ---- number formatting ----

/** Milliseconds with 3 significant-ish digits. */
export function fmtMs(ms: number): string {
  return ms >= 100 ? ms.toFixed(1) : ms >= 10 ? ms.toFixed(2) : ms >= 0.1 ? ms.toFixed(3) : ms.toPrecision(3);
}

/** TFLOP/s with sensible precision (CPU numbers are well below 1). */
export function fmtTflops(t: number): string {
  return t >= 100 ? t.toFixed(0) : t >= 10 ? t.toFixed(1) : t >= 1 ? t.toFixed(2) : t.toPrecision(3);
}

/** Bytes in binary units. */
export function fmtBytes(b: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = b;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u += 1;
  }
  return u === 0 ? `${v} B` : `${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)} ${units[u]}`;
}

function fmtRatio(r: number | null | undefined): string {
  return r === null || r === undefined ? '' : `${r.toFixed(2)}x`;
}

// ---- header ----

/** "driver 580.95.05 (CUDA 13.0)", or "CUDA driver 13.0" when the driver's own version is unknown. */
export function driverText(e: BenchEnv): string {
  return e.driver != null ? `driver ${e.driver} (CUDA ${e.cudaDriver ?? '-'})` : `CUDA driver ${e.cudaDriver ?? '-'}`;
}

/** The lines every human-readable report starts with. */
export function headerLines(r: BenchReport): string[] {
  const e = r.env;
  const s = r.settings;
  const lines = [`flash-attn-bench ${e.version} · ${e.date}`];
  if (e.device === 'cuda') {
    lines.push(`device: ${e.deviceName} (sm ${e.computeCapability ?? '-'}, ${driverText(e)}, CUDA runtime ${e.cudaRuntime ?? '-'}) · Node ${e.node} · ${e.platform}`);
  } else {
    const gpu = e.cudaDriver != null ? ` · GPU ${driverText(e)}, CUDA runtime ${e.cudaRuntime ?? '-'}` : '';
    lines.push(`device: ${e.deviceName} on ${e.cpu}${gpu} · Node ${e.node} · ${e.platform}`);
  }
  if (e.torch) {
    const t = e.torch;
    lines.push(`PyTorch ${t.torch} (CUDA ${t.cuda ?? '-'}, cuDNN ${t.cudnn ?? '-'}, driver ${t.driver ?? '-'}) on ${t.device}, Python ${t.python}`);
  } else if (e.torchUnavailable != null) {
    lines.push(`PyTorch: not compared (${e.torchUnavailable})`);
  }
  const algorithms = algorithmsRan(r.rows);
  lines.push(
    `${s.dtype} · our kernel ${s.kernel === 'auto' ? `auto -> ${s.kernelResolved}` : s.kernelResolved}` +
      `${algorithms !== null ? ` (backward auto -> ${algorithms})` : ''} · median of ${s.repeats} after ${s.warmup} warm-up${s.warmupMs > 0 ? ` (at least ${s.warmupMs} ms)` : ''} ` +
      `(${s.timing}) · TFLOP/s by FA2's count · ${presetText(s.preset, s.presetOverrides)}`,
  );
  return lines;
}

// ---- panels ----

/** One panel of results: a (dtype, head dim, mask, pass), as in the FA2 paper's figures. */
export interface Panel {
  key: string;
  title: string;
  headDim: number;
  causal: boolean;
  pass: BenchRow['pass'];
  rows: BenchRow[];
}

const PASS_NAMES: Record<BenchRow['pass'], string> = { fwd: 'forward', bwd: 'backward', fwdbwd: 'forward + backward' };

/** Rows grouped into panels, ordered by head dim, mask, then pass. */
export function panels(rows: readonly BenchRow[]): Panel[] {
  const map = new Map<string, Panel>();
  const passOrder = ['fwd', 'bwd', 'fwdbwd'];
  for (const r of rows) {
    const key = `${r.dtype}/d${r.headDim}/${r.causal ? 'causal' : 'full'}/${r.pass}`;
    let p = map.get(key);
    if (!p) {
      p = {
        key, headDim: r.headDim, causal: r.causal, pass: r.pass, rows: [],
        title: `${PASS_NAMES[r.pass]}, head dim ${r.headDim}, ${r.causal ? 'causal' : 'not causal'} (${r.dtype})`,
      };
      map.set(key, p);
    }
    p.rows.push(r);
  }
  return [...map.values()].sort((a, b) => a.headDim - b.headDim || Number(a.causal) - Number(b.causal) || passOrder.indexOf(a.pass) - passOrder.indexOf(b.pass));
}

/**
 * A panel's title with the plan our rows ran when they share one (`ours: sm90-wgmma d64 128x64 w8
 * s3`); the title alone otherwise (no measured rows of ours, or plans that differ by row).
 */
export function panelHeading(p: Panel): string {
  const plans = new Set(p.rows.filter((r) => r.impl === 'ours' && r.plan !== undefined).map((r) => r.plan));
  return plans.size === 1 ? `${p.title} · ours: ${[...plans][0]}` : p.title;
}

/** Implementations present in `rows`, in report order. */
export function implsIn(rows: readonly BenchRow[]): Impl[] {
  const present = new Set(rows.map((r) => r.impl));
  return IMPLS.filter((i) => present.has(i));
}

function shapeText(r: BenchRow): string {
  const heads = r.headsKV === r.headsQ ? `${r.headsQ}` : `${r.headsQ}/${r.headsKV}`;
  return `${r.batch} x ${heads}`;
}

function seqText(r: BenchRow): string {
  return r.seqlenK === r.seqlenQ ? `${r.seqlenQ}` : `${r.seqlenQ}/${r.seqlenK}`;
}

/** Numbered messages of the rows that failed, deduplicated by (impl, message). */
class Footnotes {
  private readonly index = new Map<string, number>();
  readonly lines: string[] = [];
  mark(r: BenchRow): string {
    if (r.error === null || r.status === 'ok') return '';
    const key = `${r.impl}\u0000${r.error}`;
    let n = this.index.get(key);
    if (n === undefined) {
      n = this.index.size + 1;
      this.index.set(key, n);
      this.lines.push(`[${n}] ${r.impl}: ${r.error}`);
    }
    return ` [${n}]`;
  }
}

/** What a failed row shows in place of a time. */
function statusText(r: BenchRow): string {
  return r.status === 'oom' ? 'OOM' : 'error';
}

function alignTable(header: string[], body: string[][], rightAligned: boolean[]): string[] {
  const widths = header.map((h, i) => Math.max(h.length, ...body.map((row) => row[i].length)));
  const line = (cells: string[]): string => cells
    .map((c, i) => (rightAligned[i] ? c.padStart(widths[i]) : c.padEnd(widths[i])))
    .join('  ')
    .trimEnd();
  return [line(header), line(widths.map((w) => '-'.repeat(w))), ...body.map(line)];
}

/** Ratio columns: ours ÷ each other implementation present (our backward variants have {@link variantRatiosIn}). */
function ratioImpls(rows: readonly BenchRow[]): Impl[] {
  return implsIn(rows).filter((i) => i !== 'ours' && !OUR_VARIANTS.includes(i));
}

/** How each {@link VariantRatio} is named and judged. */
const VARIANT_RATIO_TEXT: Readonly<Record<VariantRatio, { column: string; markdown: string; summary: string }>> = {
  'single-kernel/two-kernel': { column: 'single÷two-kernel', markdown: 'single ÷ two-kernel', summary: 'single-kernel ÷ two-kernel backward time' },
  'deterministic/single-kernel': { column: 'determ÷single', markdown: 'deterministic ÷ single', summary: 'deterministic ÷ atomic single-kernel backward time' },
  'auto-deterministic/auto': { column: 'determ÷auto', markdown: 'deterministic ÷ auto', summary: "'auto' deterministic ÷ 'auto' backward time" },
};

/** The issue's bar for the single kernel's deterministic mode: at most this many times its atomic mode's time. */
export const DETERMINISTIC_MAX_RATIO = 1.3;
/** The bar for 'auto' with deterministic: true: at most this many times the time of 'auto' without it. */
export const AUTO_DETERMINISTIC_MAX_RATIO = 1.1;

/** Each variant ratio's bar: below `low`, or above `high`, a cell counts as past it. */
const VARIANT_RATIO_BAR: Readonly<Record<VariantRatio, { low: number } | { high: number }>> = {
  'single-kernel/two-kernel': { low: 1 },
  'deterministic/single-kernel': { high: DETERMINISTIC_MAX_RATIO },
  'auto-deterministic/auto': { high: AUTO_DETERMINISTIC_MAX_RATIO },
};

/** Variant ratios that some row of ours has, in {@link VARIANT_RATIOS} order. */
function variantRatiosIn(rows: readonly BenchRow[]): VariantRatio[] {
  return VARIANT_RATIOS.map((v) => v.key).filter((k) => rows.some((r) => r.impl === 'ours' && k in r.variantRatios));
}

/** The ratio below which a cell counts as slow in {@link ratioSummary} (issue 4's per-cell bar). */
export const SLOW_CELL_RATIO = 0.85;

/** Our speed against one other implementation over every cell where both ran. */
export interface RatioSummary {
  /** The other implementation. */
  impl: Impl;
  /** Cells with a ratio. */
  cells: number;
  /** Geometric mean of our TFLOP/s ÷ theirs. */
  geomean: number;
  min: number;
  max: number;
  /** Id of the cell with the smallest ratio. */
  worst: string;
  /** Cells below {@link SLOW_CELL_RATIO}. */
  slow: number;
}

/** One {@link RatioSummary} per other implementation that has ratios, in column order. */
export function ratioSummary(rows: readonly BenchRow[]): RatioSummary[] {
  const out: RatioSummary[] = [];
  for (const impl of ratioImpls(rows)) {
    const pairs = rows
      .filter((r) => r.impl === 'ours' && typeof r.ratios[impl] === 'number' && Number.isFinite(r.ratios[impl]) && (r.ratios[impl] as number) > 0)
      .map((r) => ({ id: r.id, ratio: r.ratios[impl] as number }));
    if (pairs.length === 0) continue;
    const worst = pairs.reduce((a, b) => (b.ratio < a.ratio ? b : a));
    out.push({
      impl,
      cells: pairs.length,
      geomean: Math.exp(pairs.reduce((acc, x) => acc + Math.log(x.ratio), 0) / pairs.length),
      min: worst.ratio,
      max: Math.max(...pairs.map((x) => x.ratio)),
      worst: worst.id,
      slow: pairs.filter((x) => x.ratio < SLOW_CELL_RATIO).length,
    });
  }
  return out;
}

/** One {@link VariantRatio} over every cell where both sides ran. */
export interface VariantRatioSummary {
  ratio: VariantRatio;
  /** Cells with a ratio. */
  cells: number;
  /** Geometric mean of the time ratios. */
  geomean: number;
  min: number;
  max: number;
  /**
   * Id of the worst cell: the lowest single-kernel ÷ two-kernel (where the two kernels gain least),
   * the highest deterministic ÷ single-kernel or deterministic ÷ auto.
   */
  worst: string;
  /**
   * Cells past the bar: single-kernel ÷ two-kernel below 1 (the two kernels slower), deterministic ÷
   * single-kernel above {@link DETERMINISTIC_MAX_RATIO}, deterministic ÷ auto above
   * {@link AUTO_DETERMINISTIC_MAX_RATIO}.
   */
  beyond: number;
}

/** One {@link VariantRatioSummary} per variant ratio that has values, in {@link VARIANT_RATIOS} order. */
export function variantRatioSummary(rows: readonly BenchRow[]): VariantRatioSummary[] {
  const out: VariantRatioSummary[] = [];
  for (const ratio of variantRatiosIn(rows)) {
    const pairs = rows
      .filter((r) => r.impl === 'ours' && typeof r.variantRatios[ratio] === 'number' && Number.isFinite(r.variantRatios[ratio]) && (r.variantRatios[ratio] as number) > 0)
      .map((r) => ({ id: r.id, ratio: r.variantRatios[ratio] as number }));
    if (pairs.length === 0) continue;
    const bar = VARIANT_RATIO_BAR[ratio];
    const worst = pairs.reduce((a, b) => (('low' in bar ? b.ratio < a.ratio : b.ratio > a.ratio) ? b : a));
    out.push({
      ratio,
      cells: pairs.length,
      geomean: Math.exp(pairs.reduce((acc, x) => acc + Math.log(x.ratio), 0) / pairs.length),
      min: Math.min(...pairs.map((x) => x.ratio)),
      max: Math.max(...pairs.map((x) => x.ratio)),
      worst: worst.id,
      beyond: pairs.filter((x) => ('low' in bar ? x.ratio < bar.low : x.ratio > bar.high)).length,
    });
  }
  return out;
}

/** {@link ratioSummary} as lines of text, one per other implementation, then one per {@link variantRatioSummary}. */
export function ratioSummaryLines(rows: readonly BenchRow[]): string[] {
  const impls = ratioSummary(rows).map((s) =>
    `ours vs ${s.impl.replace(/^torch-/, 'SDPA ')}: geometric mean ${s.geomean.toFixed(2)}x over ${s.cells} cells ` +
    `(range ${s.min.toFixed(2)}-${s.max.toFixed(2)}x, worst ${s.worst}); cells below ${SLOW_CELL_RATIO}x: ${s.slow}`);
  const variants = variantRatioSummary(rows).map((s) => {
    const limit = VARIANT_RATIO_BAR[s.ratio];
    const [extreme, bar] = 'low' in limit
      ? ['lowest', `cells below ${limit.low.toFixed(2)}x (two kernels slower)`]
      : ['highest', `cells above ${limit.high.toFixed(2)}x`];
    return `${VARIANT_RATIO_TEXT[s.ratio].summary}: geometric mean ${s.geomean.toFixed(2)}x over ${s.cells} cells ` +
      `(range ${s.min.toFixed(2)}-${s.max.toFixed(2)}x, ${extreme} ${s.worst}); ${bar}: ${s.beyond}`;
  });
  return [...impls, ...variants];
}

/** The human-readable tables, one per panel, with the header and the notes. */
export function formatText(r: BenchReport): string {
  const out = [...headerLines(r), ''];
  const notes = new Footnotes();
  const others = ratioImpls(r.rows);
  const variantRatios = variantRatiosIn(r.rows);
  for (const p of panels(r.rows)) {
    out.push(panelHeading(p));
    const header = [
      'seqlen', 'batch x heads', 'impl', 'ms median', 'ms min-max', 'TFLOP/s', '% peak', 'peak mem',
      ...others.map((o) => `ours/${o.replace(/^torch-/, '')}`), ...variantRatios.map((v) => VARIANT_RATIO_TEXT[v].column),
    ];
    const body = p.rows.map((row) => {
      const ok = row.status === 'ok';
      return [
        seqText(row), shapeText(row), row.impl,
        ok ? fmtMs(row.msMedian as number) : statusText(row) + notes.mark(row),
        ok ? `${fmtMs(row.msMin as number)}-${fmtMs(row.msMax as number)}` : '',
        ok ? fmtTflops(row.tflops as number) : '',
        ok && typeof row.pctPeak === 'number' ? `${row.pctPeak.toFixed(1)}%` : '',
        ok && row.peakBytes !== null ? fmtBytes(row.peakBytes) : '',
        ...others.map((o) => (row.impl === 'ours' ? fmtRatio(row.ratios[o]) : '')),
        ...variantRatios.map((v) => (row.impl === 'ours' ? fmtRatio(row.variantRatios[v]) : '')),
      ];
    });
    out.push(...alignTable(header, body, header.map((_, i) => i !== 2)), '');
  }
  const summary = ratioSummaryLines(r.rows);
  if (summary.length) out.push(...summary, '');
  if (notes.lines.length) out.push('Errors:', ...notes.lines.map((l) => `  ${l}`), '');
  if (r.notes.length) out.push(...r.notes.map((n) => `note: ${n}`), '');
  return out.join('\n');
}

/** The report as JSON (what --json prints). */
export function formatJson(r: BenchReport): string {
  return JSON.stringify(r, null, 2) + '\n';
}

/** Columns of the CSV, in order. */
export const CSV_COLUMNS = [
  'impl', 'id', 'device', 'kernel', 'algorithm', 'dtype', 'pass', 'causal', 'batch', 'seqlen_q', 'seqlen_k', 'heads_q', 'heads_kv',
  'head_dim', 'status', 'ms_median', 'ms_min', 'ms_max', 'tflops', 'pct_peak', 'peak_bytes',
  'ratio_naive', 'ratio_torch_flash', 'ratio_torch_cudnn', 'ratio_torch_efficient', 'ratio_torch_math',
  'ratio_single_kernel_over_two_kernel', 'ratio_deterministic_over_single_kernel', 'ratio_auto_deterministic_over_auto',
  'mask', 'error', 'plan',
] as const;

function csvField(v: string | number | boolean | null | undefined): string {
  if (v === null || v === undefined) return '';
  const s = String(v);
  return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

/** The report as CSV: `# key: value` comment lines (device, versions, date, settings), a header, one line per row. */
export function formatCsv(r: BenchReport): string {
  const e = r.env;
  const s = r.settings;
  const comments: [string, string | number | null | undefined][] = [
    ['tool', `flash-attn-bench ${e.version}`], ['date', e.date], ['device', e.device], ['device_name', e.deviceName],
    ['compute_capability', e.computeCapability], ['driver', e.driver], ['cuda_driver', e.cudaDriver],
    ['cuda_runtime', e.cudaRuntime], ['node', e.node],
    ['platform', e.platform], ['cpu', e.cpu], ['cpu_backend_threads', e.cpuBackendThreads],
    ['torch', e.torch?.torch ?? null], ['torch_cuda', e.torch?.cuda ?? null],
    ['torch_cudnn', e.torch?.cudnn ?? null], ['torch_device', e.torch?.device ?? null], ['torch_unavailable', e.torchUnavailable],
    ['preset', presetText(s.preset, s.presetOverrides).replace(/^preset /, '')], ['kernel', `${s.kernel} -> ${s.kernelResolved}`], ['repeats', s.repeats], ['warmup', s.warmup], ['warmup_ms', s.warmupMs],
    ['timing', s.timing], ['peak_tflops', s.peakTflops ?? null],
  ];
  const lines = comments.filter(([, v]) => v != null).map(([k, v]) => `# ${k}: ${String(v).replace(/[\r\n]+/g, ' ')}`);
  for (const n of r.notes) lines.push(`# note: ${n.replace(/[\r\n]+/g, ' ')}`);
  lines.push(CSV_COLUMNS.join(','));
  for (const row of r.rows) {
    const values: (string | number | boolean | null | undefined)[] = [
      row.impl, row.id, row.device, row.kernel, row.algorithm, row.dtype, row.pass, row.causal, row.batch, row.seqlenQ, row.seqlenK,
      row.headsQ, row.headsKV, row.headDim, row.status, row.msMedian, row.msMin, row.msMax, row.tflops, row.pctPeak,
      row.peakBytes, row.ratios.naive, row.ratios['torch-flash'], row.ratios['torch-cudnn'], row.ratios['torch-efficient'],
      row.ratios['torch-math'], row.variantRatios['single-kernel/two-kernel'], row.variantRatios['deterministic/single-kernel'],
      row.variantRatios['auto-deterministic/auto'], row.mask, row.error, row.plan,
    ];
    lines.push(values.map(csvField).join(','));
  }
  return lines.join('\n') + '\n';
}

/** Markdown columns that are always there (for RESULTS.md tables that line up across runs). */
const MD_FIXED: Impl[] = ['ours', 'naive', 'torch-flash', 'torch-cudnn', 'torch-efficient'];

function mdCell(row: BenchRow | undefined, notes: Footnotes): string {
  if (!row) return '–';
  if (row.status !== 'ok') return statusText(row) + notes.mark(row);
  const mem = row.peakBytes !== null ? `, ${fmtBytes(row.peakBytes)}` : '';
  return `${fmtTflops(row.tflops as number)} (${fmtMs(row.msMedian as number)} ms${mem})`;
}

/**
 * GitHub markdown: a header (device, versions, date, method), then one table per (head dim, causal,
 * pass) with a column per implementation (TFLOP/s, with median ms and peak memory above the inputs)
 * and our TFLOP/s ratios to PyTorch's flash and cuDNN kernels (and, when our backward variants ran,
 * their time ratios), then the ratio summary (geometric means, ranges, worst cells).
 */
export function formatMarkdown(r: BenchReport): string {
  const out = headerLines(r).map((l) => `${l}  `);
  const variantRatios = variantRatiosIn(r.rows);
  const legend = variantRatios.length === 0 ? '' : ' Backward variants: time ÷ time (single ÷ two-kernel > 1: the two kernels are faster;' +
    ' deterministic ÷ single: what the single kernel\'s deterministic mode costs; deterministic ÷ auto: what' +
    ' deterministic: true costs \'auto\').';
  out.push('', `Cells: TFLOP/s (median ms, peak memory above the inputs). Ratios: our TFLOP/s ÷ theirs (> 1: ours is faster).${legend}`, '');
  const notes = new Footnotes();
  const present = implsIn(r.rows);
  const columns = [...MD_FIXED, ...present.filter((i) => !MD_FIXED.includes(i))];
  const extraHeads = variantRatios.map((v) => ` ${VARIANT_RATIO_TEXT[v].markdown} |`).join('');
  for (const p of panels(r.rows)) {
    out.push(`#### ${panelHeading(p)}`, '');
    out.push(`| seqlen | batch × heads | ${columns.map((c) => IMPL_LABELS[c]).join(' | ')} | ours/flash | ours/cuDNN |${extraHeads}`);
    out.push(`| ---: | ---: | ${columns.map(() => '---:').join(' | ')} | ---: | ---: |${variantRatios.map(() => ' ---: |').join('')}`);
    const byCell = new Map<string, BenchRow[]>();
    for (const row of p.rows) {
      const list = byCell.get(row.id);
      if (list) list.push(row);
      else byCell.set(row.id, [row]);
    }
    for (const cellRows of byCell.values()) {
      const first = cellRows[0];
      const ours = cellRows.find((x) => x.impl === 'ours');
      const cells = columns.map((c) => mdCell(cellRows.find((x) => x.impl === c), notes));
      const ratio = (impl: Impl): string => fmtRatio(ours?.ratios[impl]) || '–';
      const extra = variantRatios.map((v) => ` ${fmtRatio(ours?.variantRatios[v]) || '–'} |`).join('');
      out.push(`| ${seqText(first)} | ${shapeText(first).replace(' x ', ' × ')} | ${cells.join(' | ')} | ${ratio('torch-flash')} | ${ratio('torch-cudnn')} |${extra}`);
    }
    out.push('');
  }
  const summary = ratioSummaryLines(r.rows);
  if (summary.length) out.push('Summary:', '', ...summary.map((l) => `- ${l}`), '');
  if (notes.lines.length) out.push(...notes.lines.map((l) => `${l}  `), '');
  if (r.notes.length) out.push(...r.notes.map((n) => `- ${n}`), '');
  return out.join('\n');
}
