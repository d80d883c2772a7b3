/**
 * `--chart FILE.svg`: TFLOP/s against sequence length, one line per implementation, one panel per
 * (head dim, causal, pass), like the FlashAttention-2 paper's figures. A Vega-Lite spec rendered
 * to SVG headless by Vega (no browser, no canvas).
 * @packageDocumentation
 */
import type { BenchReport } from './report';
import { driverText, implsIn, Panel, panels } from './report';

/**
 * The parts of vega and vega-lite used here. Their own typings need the DOM library (vega-typings
 * names Element, MouseEvent...), which this Node project does not load, so they are required untyped.
 */
interface VegaModule {
  parse(spec: unknown): unknown;
  View: new (runtime: unknown, options: { renderer: 'none' }) => { toSVG(): Promise<string>; finalize(): void };
}
interface VegaLiteModule {
  compile(spec: unknown): { spec: unknown };
}

/** A Vega-Lite specification (JSON). */
export type ChartSpec = Record<string, unknown>;

/** Short sequence-length labels: 512, 1k, 2k, ..., 64k. */
export function seqLabel(n: number): string {
  return n >= 1024 && n % 1024 === 0 ? `${n / 1024}k` : String(n);
}

const PASS_SHORT = { fwd: 'forward', bwd: 'backward', fwdbwd: 'forward + backward' } as const;

function panelTitle(p: Panel): string {
  return `${PASS_SHORT[p.pass]} · d${p.headDim} · ${p.causal ? 'causal' : 'not causal'}`;
}

/** The chart as a Vega-Lite spec (data inlined: the measured rows only). */
export function chartSpec(r: BenchReport): ChartSpec {
  const ps = panels(r.rows);
  const values: Record<string, string | number>[] = [];
  for (const p of ps) {
    for (const row of p.rows) {
      if (row.status !== 'ok' || row.tflops === null) continue;
      values.push({ panel: panelTitle(p), seqlen: row.seqlenQ, seq: seqLabel(row.seqlenQ), tflops: row.tflops, impl: row.impl });
    }
  }
  const seqs = [...new Set(r.rows.map((x) => x.seqlenQ))].sort((a, b) => a - b).map(seqLabel);
  const series = implsIn(r.rows.filter((x) => x.status === 'ok'));
  const e = r.env;
  const where = e.device === 'cuda' ? `${e.deviceName}, ${driverText(e)}, CUDA runtime ${e.cudaRuntime ?? '-'}` : e.deviceName;
  const torch = e.torch ? `, PyTorch ${e.torch.torch}` : '';
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
    title: {
      text: `flash-attn-bench: ${r.settings.dtype} attention, TFLOP/s (FA2 FLOP count)`,
      subtitle: `${where}${torch} · Node ${e.node} · ${e.date.slice(0, 10)} · median of ${r.settings.repeats}`,
    },
    data: { values },
    facet: { field: 'panel', type: 'nominal', sort: ps.map(panelTitle), title: null },
    // One column per pass, one row per (head dim, mask): the layout of the FA2 paper's figures.
    columns: Math.max(1, new Set(ps.map((p) => p.pass)).size),
    spec: {
      width: 220,
      height: 160,
      mark: { type: 'line', point: true },
      encoding: {
        x: { field: 'seq', type: 'ordinal', sort: seqs, title: 'sequence length', axis: { labelAngle: 0 } },
        y: { field: 'tflops', type: 'quantitative', title: 'TFLOP/s' },
        color: { field: 'impl', type: 'nominal', scale: { domain: series }, title: 'implementation' },
      },
    },
    config: { font: 'sans-serif' },
  };
}

/** Renders the chart to an SVG string (Vega's headless renderer). */
export async function renderChartSvg(r: BenchReport): Promise<string> {
  // Loaded on demand: only --chart pays for Vega's start-up.
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const vega = require('vega') as VegaModule;
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const vegaLite = require('vega-lite') as VegaLiteModule;
  const compiled = vegaLite.compile(chartSpec(r)).spec;
  const view = new vega.View(vega.parse(compiled), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}
