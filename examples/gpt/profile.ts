/**
 * Where a GPT training step's time goes: `node examples/gpt/profile.js [--device cuda] [--preset
 * default] [--steps N] [--json]`.
 *
 * For the model of a train.js preset, on random token ids, after warm-up steps:
 * - wall: milliseconds per step of a loop that synchronises only at its end (what train.js does
 *   between log points);
 * - host: the milliseconds JS spends queuing zeroGrad, forward, backward and the optimizer update;
 * - device: the milliseconds each of those four takes on the device, between CUDA events recorded
 *   while the stream holds a backlog of work (fills of a 1 GiB tensor) ahead of them, so that host
 *   launch gaps do not count: what a step costs when the host is not the bottleneck;
 * - calls: every native call a step makes, by name, with its count and host microseconds.
 * `--plain` only runs the warm-up and the steps, for an external profiler (ncu).
 * If wall is close to host, the step is bound by the host; if close to device, by the kernels.
 * @packageDocumentation
 */
import { binding } from '../../lib/native';
import { GPT, GPTConfig } from '../../lib/nn/gpt';
import { AdamW } from '../../lib/nn/optim';
import { Device, synchronize, Tensor } from '../../lib/tensor';
import { timeOnDevice } from '../../lib/timing';
import { Rng } from './data';
import { PRESETS } from './main';

interface Options {
  device: Device;
  preset: keyof typeof PRESETS;
  steps: number;
  warmup: number;
  json: boolean;
  plain: boolean;
}

function parse(argv: readonly string[]): Options {
  const o: Options = { device: 'cuda', preset: 'default', steps: 20, warmup: 5, json: false, plain: false };
  for (let i = 0; i < argv.length; i += 1) {
    const a = argv[i];
    const next = (): string => {
      const v = argv[i + 1];
      if (v === undefined) throw new Error(`${a} needs a value`);
      i += 1;
      return v;
    };
    if (a === '--device') o.device = next() as Device;
    else if (a === '--preset') o.preset = next() as keyof typeof PRESETS;
    else if (a === '--steps') o.steps = Number(next());
    else if (a === '--warmup') o.warmup = Number(next());
    else if (a === '--json') o.json = true;
    else if (a === '--plain') o.plain = true;
    else throw new Error(`unknown argument ${a}`);
  }
  if (o.device !== 'cpu' && o.device !== 'cuda') throw new Error(`--device: expected cpu or cuda, got ${o.device}`);
  if (!(o.preset in PRESETS)) throw new Error(`--preset: expected ${Object.keys(PRESETS).join(' or ')}, got ${o.preset}`);
  if (!Number.isSafeInteger(o.steps) || o.steps < 1) throw new Error(`--steps: expected a positive integer, got ${o.steps}`);
  return o;
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

type StepCall = 'zeroGrad' | 'forward' | 'backward' | 'optimizer';
const STEP_CALLS: StepCall[] = ['zeroGrad', 'forward', 'backward', 'optimizer'];

export async function main(argv: readonly string[]): Promise<void> {
  const o = parse(argv);
  const p = PRESETS[o.preset];
  const vocab = 65; // the Brown corpus's character count
  const dtype = o.device === 'cuda' ? 'bfloat16' : 'float32';
  const config: GPTConfig = { vocabSize: vocab, blockSize: p.context, layers: p.layers, heads: p.heads, dModel: p.dModel, dtype, device: o.device };
  const rng = new Rng(1);
  const model = new GPT(config, (n, std) => rng.normal(n, std));
  const opt = new AdamW(model.parameters(), { lr: 1e-4, beta2: 0.99, weightDecay: 0.1, maxGradNorm: 1 });
  const ids = new Int32Array(p.batch * p.context).map(() => rng.below(vocab));
  const tgt = new Int32Array(p.batch * p.context).map(() => rng.below(vocab));
  const inputs = Tensor.fromInt32Array(ids, [p.batch, p.context], { device: o.device });
  const targets = Tensor.fromInt32Array(tgt, [p.batch, p.context], { device: o.device });

  const stepCalls: Record<StepCall, () => void> = {
    zeroGrad: () => opt.zeroGrad(),
    forward: () => model.forward(inputs, { targets }).dispose(),
    backward: () => model.backward(),
    optimizer: () => opt.step(),
  };
  const step = (host?: Record<StepCall, number[]>): void => {
    for (const s of STEP_CALLS) {
      const t = performance.now();
      stepCalls[s]();
      host?.[s].push(performance.now() - t);
    }
  };

  for (let i = 0; i < o.warmup; i += 1) step();
  await synchronize(o.device);
  if (o.plain) {
    // Only the steps (for an external profiler such as ncu): no timing, no ballast.
    for (let i = 0; i < o.steps; i += 1) step();
    await synchronize(o.device);
    for (const t of [inputs, targets, opt, model]) t.dispose();
    return;
  }

  // Wall time of steps queued back to back, and the host time of each call.
  const host = Object.fromEntries(STEP_CALLS.map((s) => [s, [] as number[]])) as Record<StepCall, number[]>;
  const t0 = performance.now();
  for (let i = 0; i < o.steps; i += 1) step(host);
  await synchronize(o.device);
  const wallMs = (performance.now() - t0) / o.steps;

  // Device milliseconds of zeroGrad, forward, backward and the update: between CUDA events behind a
  // backlog of 1 GiB fills on the stream (CUDA), or in the executor (CPU).
  const device = Object.fromEntries(STEP_CALLS.map((s) => [s, [] as number[]])) as Record<StepCall, number[]>;
  const ballast = o.device === 'cuda' ? Tensor.empty([256 * 1024 * 1024], { dtype: 'float32', device: o.device }) : null;
  for (let i = 0; i < o.steps; i += 1) {
    await synchronize(o.device);
    if (ballast) for (let j = 0; j < 200; j += 1) ballast.fill(j); // 1 GiB each, queued ahead of the timed calls
    for (const s of STEP_CALLS) device[s].push(await timeOnDevice(o.device, stepCalls[s]));
  }
  ballast?.dispose();

  // Native calls of one step: count and host time.
  const b = binding() as unknown as Record<string, unknown>;
  const calls = new Map<string, { count: number; us: number }>();
  const originals = new Map<string, (...a: unknown[]) => unknown>();
  for (const [name, fn] of Object.entries(b)) {
    if (typeof fn !== 'function') continue;
    originals.set(name, fn as (...a: unknown[]) => unknown);
    b[name] = (...a: unknown[]): unknown => {
      const t = performance.now();
      try {
        return (fn as (...x: unknown[]) => unknown)(...a);
      } finally {
        const c = calls.get(name) ?? { count: 0, us: 0 };
        c.count += 1;
        c.us += (performance.now() - t) * 1000;
        calls.set(name, c);
      }
    };
  }
  await synchronize(o.device);
  for (let i = 0; i < o.steps; i += 1) step();
  await synchronize(o.device);
  for (const [name, fn] of originals) b[name] = fn;

  const tokens = p.batch * p.context;
  const hostMs = Object.fromEntries(STEP_CALLS.map((s) => [s, median(host[s])]));
  const deviceMs = Object.fromEntries(STEP_CALLS.map((s) => [s, median(device[s])]));
  const sum = (r: Record<string, number>): number => Object.values(r).reduce((a, x) => a + x, 0);
  const callRows = [...calls.entries()]
    .map(([name, c]) => ({ name, perStep: c.count / o.steps, usPerCall: c.us / c.count, usPerStep: c.us / o.steps }))
    .sort((x, y) => y.usPerStep - x.usPerStep);
  const report = {
    device: o.device, preset: o.preset, dtype, parameters: model.numParameters(), tokensPerStep: tokens, steps: o.steps,
    wallMs, tokensPerSecond: tokens / (wallMs / 1000), hostMs, hostTotalMs: sum(hostMs), deviceMs, deviceTotalMs: sum(deviceMs),
    nativeCallsPerStep: callRows.reduce((a, r) => a + r.perStep, 0), nativeUsPerStep: callRows.reduce((a, r) => a + r.usPerStep, 0),
    calls: callRows,
  };
  if (o.json) {
    process.stdout.write(`${JSON.stringify(report)}\n`);
  } else {
    const f = (x: number): string => x.toFixed(2).padStart(8);
    process.stdout.write(`${o.preset} on ${o.device} (${dtype}, ${report.parameters} parameters, ${tokens} tokens/step), median of ${o.steps} steps\n`);
    process.stdout.write(`wall ${wallMs.toFixed(2)} ms/step (${Math.round(report.tokensPerSecond)} tokens/s)\n`);
    process.stdout.write(`call         host ms  device ms\n`);
    for (const s of STEP_CALLS) process.stdout.write(`${s.padEnd(10)} ${f(hostMs[s])} ${f(deviceMs[s])}\n`);
    process.stdout.write(`${'total'.padEnd(10)} ${f(report.hostTotalMs)} ${f(report.deviceTotalMs)}\n`);
    process.stdout.write(`native calls per step: ${report.nativeCallsPerStep} (${(report.nativeUsPerStep / 1000).toFixed(2)} ms of host time)\n`);
    for (const r of callRows.slice(0, 25)) {
      process.stdout.write(`  ${r.name.padEnd(28)} ${r.perStep.toFixed(0).padStart(5)}/step ${r.usPerCall.toFixed(1).padStart(8)} us/call ${r.usPerStep.toFixed(0).padStart(7)} us/step\n`);
    }
  }
  inputs.dispose();
  targets.dispose();
  opt.dispose();
  model.dispose();
}
