/**
 * examples/gpt and the GPT model: the CPU tiny preset trains 200 steps through the real CLI and its
 * loss falls below the corpus's unigram character entropy (so it has learned from context); the
 * run is deterministic under --seed and writes the files the PyTorch twin reads; and the whole
 * model's gradient passes a finite-difference check on a tiny config.
 */
import { spawnSync } from 'child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'fs';
import { tmpdir } from 'os';
import { join, resolve } from 'path';
import { detokenizeBrownLine, loadBrownCorpus } from '../examples/gpt/data';
import { learningRate, parseArgs } from '../examples/gpt/main';
import { GPT } from '../lib/nn/gpt';
import { loadWithMetadata } from '../lib/safetensors';
import { Tensor } from '../lib/tensor';
import { describeCuda, describeEachDevice, trackMemory } from './helpers/backend';
import { directionalGradCheck } from './helpers/gradcheck';
import { randn, rngFor, seedHint } from './helpers/random';

trackMemory();

const ROOT = resolve(__dirname, '..');
const CLI = join(ROOT, 'examples', 'gpt', 'train.js');

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'fa-gpt-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Line { step?: number; loss?: number; tokensPerSecond?: number; memoryBytes?: number; valLoss?: number; done?: boolean }

function runCli(args: string[]): Line[] {
  const r = spawnSync(process.execPath, [CLI, ...args], {
    cwd: ROOT, encoding: 'utf8', timeout: 110000, env: { ...process.env, FLASH_ATTN_NODE_QUIET: '1' },
  });
  if (r.status !== 0) throw new Error(`train.js ${args.join(' ')} exited with ${r.status}: ${r.stderr}`);
  return r.stdout.trim().split('\n').map((l) => JSON.parse(l) as Line);
}

/** Entropy (nats) of the character distribution of the first 90% of the corpus (the training split). */
function unigramEntropyOfCorpus(): number {
  const text = loadBrownCorpus();
  const train = text.slice(0, Math.floor(text.length * 0.9));
  const counts = new Map<string, number>();
  for (const ch of train) counts.set(ch, (counts.get(ch) ?? 0) + 1);
  let h = 0;
  for (const c of counts.values()) h -= (c / train.length) * Math.log(c / train.length);
  return h;
}

describe('examples/gpt [cpu]', () => {
  test('the tiny preset learns from context within 200 steps (loss below the unigram entropy)', () => {
    const out = join(dir, 'tiny');
    const lines = runCli(['--device', 'cpu', '--preset', 'tiny', '--steps', '200', '--json', '--out', out, '--sample', '40']);
    const steps = lines.filter((l) => l.step !== undefined);
    expect(steps.map((l) => l.step)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
    for (const l of steps) {
      expect(Number.isFinite(l.loss)).toBe(true);
      expect(l.tokensPerSecond).toBeGreaterThan(0);
      expect(l.memoryBytes).toBeGreaterThan(0);
    }
    const entropy = unigramEntropyOfCorpus();
    expect(entropy).toBeGreaterThan(2.5); // English characters: about 4.5 bits
    expect(entropy).toBeLessThan(3.5);
    const first = steps[0].loss as number;
    const last = steps[steps.length - 1];
    expect(first).toBeGreaterThan(entropy); // starts near ln(vocab)
    expect(last.loss).toBeLessThan(entropy);
    expect(last.valLoss).toBeLessThan(entropy);
    const done = lines[lines.length - 1] as Line & { unigramEntropy: number; finalLoss: number };
    expect(done.done).toBe(true);
    expect(done.unigramEntropy).toBeCloseTo(entropy, 6);
    // The files the twin and the reader use.
    const run = JSON.parse(readFileSync(join(out, 'run.json'), 'utf8'));
    expect(run.tokens.shape).toEqual([200, 16, 65]);
    expect(statSync(join(out, 'tokens.bin')).size).toBe(200 * 16 * 65 * 4);
    for (const f of ['init.safetensors', 'final.safetensors', 'loss.svg', 'sample.txt', 'log.jsonl']) expect(existsSync(join(out, f))).toBe(true);
    expect(readFileSync(join(out, 'loss.svg'), 'utf8')).toMatch(/^<svg/);
    expect(readFileSync(join(out, 'sample.txt'), 'utf8').length).toBeGreaterThan(40);
  });

  test('the token file holds the batches of the run, and the step-0 checkpoint its initial weights', async () => {
    const out = join(dir, 'tiny');
    const run = JSON.parse(readFileSync(join(out, 'run.json'), 'utf8'));
    const tokens = new Int32Array(readFileSync(join(out, 'tokens.bin')).buffer.slice(0));
    expect(tokens.reduce((a, b) => Math.max(a, b), 0)).toBeLessThan(run.vocabSize);
    expect(tokens.reduce((a, b) => Math.min(a, b), 0)).toBeGreaterThanOrEqual(0);
    // Every window is a substring of the corpus.
    const text = loadBrownCorpus();
    const window = Array.from(tokens.subarray(0, 65), (t) => run.chars[t]).join('');
    expect(text.includes(window)).toBe(true);
    const { tensors, metadata } = await loadWithMetadata(join(out, 'init.safetensors'), { device: 'cpu' });
    const model = new GPT({ ...run.model, device: 'cpu' }, (n) => new Float32Array(n));
    try {
      expect(metadata.step).toBe('0');
      expect(Object.keys(tensors)).toEqual(model.namedParameters().map((p) => p.name));
      await model.loadStateDict(tensors);
    } finally {
      model.dispose();
      for (const t of Object.values(tensors)) t.dispose();
    }
  });

  test('--seed makes a run reproducible; another seed changes it', () => {
    const args = ['--device', 'cpu', '--preset', 'tiny', '--steps', '12', '--json', '--sample', '0', '--log-every', '4'];
    const losses = (seed: string, name: string): number[] =>
      runCli([...args, '--seed', seed, '--out', join(dir, name)]).filter((l) => l.step !== undefined).map((l) => l.loss as number);
    const a = losses('7', 'a');
    expect(losses('7', 'b')).toEqual(a);
    expect(losses('8', 'c')).not.toEqual(a);
  });

  test('bad command lines are refused with status 2 and a message naming the flag', () => {
    const bad = (args: string[]): string => {
      const r = spawnSync(process.execPath, [CLI, ...args], { cwd: ROOT, encoding: 'utf8', env: { ...process.env, FLASH_ATTN_NODE_QUIET: '1' } });
      expect(r.status).toBe(2);
      return r.stderr;
    };
    expect(bad(['--steps', '0'])).toMatch("Expected --steps to be an integer >= 1 but received '0'");
    expect(bad(['--preset', 'huge'])).toMatch("Expected --preset to be tiny or default but received 'huge'");
    expect(bad(['--frobnicate'])).toMatch("Unknown option '--frobnicate'");
  });
});

describe('examples/gpt pieces', () => {
  test('Brown sentences lose their tags and keep their punctuation attached', () => {
    expect(detokenizeBrownLine("\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, Atlanta's/np$ (/( 1/cd )/) ./."))
      .toBe('The jury said "no evidence", Atlanta\'s (1).');
  });

  test('the learning rate warms up linearly and decays by a cosine to the floor', () => {
    const s = { lr: 1e-3, minLr: 1e-4, warmup: 10, steps: 110 };
    expect(learningRate(1, s)).toBeCloseTo(1e-3 / 11, 12);
    expect(learningRate(10, s)).toBeCloseTo(1e-3 * 10 / 11, 12);
    expect(learningRate(11, s)).toBeCloseTo(1e-3, 12);
    expect(learningRate(61, s)).toBeCloseTo(5.5e-4, 12);
    expect(learningRate(110, s)).toBeGreaterThan(1e-4);
    expect(learningRate(111, s)).toBeCloseTo(1e-4, 12);
  });

  test('defaults: bf16 on cuda, fp32 on cpu, the nanoGPT-sized default preset', () => {
    const d = parseArgs(['--device', 'cuda']);
    expect([d?.dtype, d?.layers, d?.heads, d?.dModel, d?.context, d?.batch]).toEqual(['bfloat16', 6, 6, 384, 256, 64]);
    expect(parseArgs(['--device', 'cpu', '--preset', 'tiny'])?.dtype).toBe('float32');
    expect(parseArgs(['--help'])).toBeNull();
  });
});

/**
 * Relative error allowed for the whole model (float32 forwards, ε = 1e-2 along a direction of norm 4):
 * observed at most 5.4e-4 over 60 seeds; the loss's derivative can be small, so it is wider than
 * the single layers'.
 */
const GPT_FD_TOL = 1e-2;

describeCuda('examples/gpt', () => {
  test('the tiny preset trains in bfloat16 with float32 masters, memory flat across steps', () => {
    const lines = runCli(['--device', 'cuda', '--preset', 'tiny', '--steps', '200', '--json', '--sample', '20', '--out', join(dir, 'cuda')]);
    const steps = lines.filter((l) => l.step !== undefined);
    const run = JSON.parse(readFileSync(join(dir, 'cuda', 'run.json'), 'utf8'));
    expect(run.model.dtype).toBe('bfloat16');
    expect(steps[steps.length - 1].loss).toBeLessThan(unigramEntropyOfCorpus());
    // Live tensor bytes at every log point after the first are the same: nothing accumulates.
    const later = steps.filter((l) => (l.step as number) > 10).map((l) => l.memoryBytes);
    expect(new Set(later).size).toBe(1);
  });
});

describeEachDevice('GPT gradient', (device) => {
  test.each([
    ['GPT-2 (layernorm, gelu, learned positions, bias)', {}],
    ['rmsnorm, swiglu, RoPE, no bias', { norm: 'rmsnorm', mlp: 'swiglu', positions: 'rope', bias: false }],
  ] as const)('the whole model passes a finite-difference check: %s', async (label, over) => {
    const rng = rngFor(`gpt-fd-${label}`);
    const model = new GPT({ vocabSize: 11, blockSize: 6, layers: 2, heads: 2, dModel: 16, device, ...over }, (n, std) => randn(n, rng, std));
    const [B, S] = [2, 6];
    const ids = Tensor.fromInt32Array(Int32Array.from({ length: B * S }, () => Math.floor(rng.next() * 11)), [B, S], { device });
    const targets = Tensor.fromInt32Array(Int32Array.from({ length: B * S }, () => Math.floor(rng.next() * 11)), [B, S], { device });
    try {
      const r = await directionalGradCheck({
        module: model, input: null, scalar: true,
        forward: () => model.forward(ids, { targets }),
        backward: () => {
          model.backward();
          return null;
        },
      }, rng, device);
      if (!(r.relError <= GPT_FD_TOL)) throw new Error(`analytic ${r.analytic} vs numeric ${r.numeric} (relative ${r.relError}) ${seedHint()}`);
      expect(Math.abs(r.numeric)).toBeGreaterThan(1e-3);
    } finally {
      ids.dispose();
      targets.dispose();
      model.dispose();
    }
  });
});
