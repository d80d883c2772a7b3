/**
 * The loss curve of a training run as an SVG: a Vega-Lite spec rendered headless by Vega (no browser,
 * no canvas), as the bench's chart (bench/chart.ts).
 * @packageDocumentation
 */

/** The parts of vega and vega-lite used here (their typings need the DOM library, so they are required untyped). */
interface VegaModule {
  parse(spec: unknown): unknown;
  View: new (runtime: unknown, options: { renderer: 'none' }) => { toSVG(): Promise<string>; finalize(): void };
}
interface VegaLiteModule {
  compile(spec: unknown): { spec: unknown };
}

/** One point of the curve. */
export interface LossPoint {
  step: number;
  loss: number;
  /** 'train' (every step) or 'validation' (every --eval-every steps). */
  split: 'train' | 'validation';
}

/** The Vega-Lite spec of the loss curve, with a dashed rule at the unigram entropy. */
export function lossChartSpec(points: readonly LossPoint[], title: string, subtitle: string, unigramEntropy: number): Record<string, unknown> {
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v5.json',
    title: { text: title, subtitle },
    width: 560,
    height: 300,
    layer: [
      {
        data: { values: points.map((p) => ({ ...p })) },
        encoding: {
          x: { field: 'step', type: 'quantitative', title: 'step' },
          y: { field: 'loss', type: 'quantitative', title: 'cross-entropy (nats per character)', scale: { zero: false } },
          color: { field: 'split', type: 'nominal', title: null, scale: { domain: ['train', 'validation'] } },
        },
        layer: [
          { transform: [{ filter: "datum.split === 'train'" }], mark: { type: 'line', strokeWidth: 1.5 } },
          { transform: [{ filter: "datum.split === 'validation'" }], mark: { type: 'line', point: { filled: true, size: 40 } } },
        ],
      },
      {
        data: { values: [{ entropy: unigramEntropy, label: `unigram entropy ${unigramEntropy.toFixed(3)}` }] },
        layer: [
          { mark: { type: 'rule', strokeDash: [4, 4], color: 'gray' }, encoding: { y: { field: 'entropy', type: 'quantitative' } } },
          {
            mark: { type: 'text', align: 'right', baseline: 'bottom', dx: -2, color: 'gray' },
            encoding: { y: { field: 'entropy', type: 'quantitative' }, x: { value: 560 }, text: { field: 'label' } },
          },
        ],
      },
    ],
    config: { font: 'sans-serif' },
  };
}

/** Renders the loss curve to an SVG string. */
export async function renderLossSvg(points: readonly LossPoint[], title: string, subtitle: string, unigramEntropy: number): Promise<string> {
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const vega = require('vega') as VegaModule;
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const vegaLite = require('vega-lite') as VegaLiteModule;
  const compiled = vegaLite.compile(lossChartSpec(points, title, subtitle, unigramEntropy)).spec;
  const view = new vega.View(vega.parse(compiled), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}
