/**
 * The README's TypeScript examples run as written. Each ```ts block is transpiled (its imports kept
 * first, the rest inside an async function: the examples use top-level await) and run in a child
 * `node` against the current lib/ sources, where `'flash-attn-node'` resolves to lib/index.ts. It runs
 * on the default device: the CPU backend where there is no GPU, as in CI. Each block runs in a
 * scratch directory (the GPT example writes a checkpoint there).
 */
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import * as ts from 'typescript';
import { LIB_ENTRY, runNodeChild } from './helpers/child';

const README = path.resolve(__dirname, '..', 'README.md');
const BLOCK_TIMEOUT_MS = 180000;

interface Block {
  line: number;  // 1-based line of the opening fence
  code: string;
}

/** The ```ts blocks of a markdown text, in order. */
function tsBlocks(md: string): Block[] {
  const blocks: Block[] = [];
  const lines = md.split('\n');
  for (let i = 0; i < lines.length; ++i) {
    if (lines[i].trim() !== '```ts') continue;
    const start = i;
    const code: string[] = [];
    for (++i; i < lines.length && lines[i].trim() !== '```'; ++i) code.push(lines[i]);
    if (i === lines.length) throw new Error(`README.md: the ts block at line ${start + 1} is never closed`);
    blocks.push({ line: start + 1, code: code.join('\n') });
  }
  return blocks;
}

/** A block as a CommonJS script: its leading imports, then the rest in an async function whose failure exits 1. */
function asScript(code: string): string {
  const imports = /^(?:import[^;]*;\s*)*/.exec(code)?.[0] ?? '';
  const wrapped = `${imports}\n(async () => {\n${code.slice(imports.length)}\n})().catch((e) => {\n` +
    '  console.error(e);\n  process.exit(1);\n});\n';
  return ts.transpileModule(wrapped, {
    compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022, esModuleInterop: true },
    reportDiagnostics: false,
  }).outputText;
}

const scratch: string[] = [];
afterAll(() => {
  for (const dir of scratch) fs.rmSync(dir, { recursive: true, force: true });
});

/** Runs a block in a scratch directory (removed after the tests); returns the child's result and the directory. */
function runBlock(block: Block) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-readme-'));
  scratch.push(dir);
  const file = path.join(dir, `readme-line-${block.line}.js`);
  fs.writeFileSync(file, asScript(block.code));
  const script = `
    const Module = require('module');
    const resolve = Module._resolveFilename;
    Module._resolveFilename = function (request, ...rest) {
      return resolve.call(this, request === 'flash-attn-node' ? ${JSON.stringify(LIB_ENTRY)} : request, ...rest);
    };
    require(${JSON.stringify(file)});
  `;
  return { result: runNodeChild(script, { cwd: dir, timeoutMs: BLOCK_TIMEOUT_MS }), dir };
}

const blocks = tsBlocks(fs.readFileSync(README, 'utf8'));
const usage = blocks.find((b) => b.code.includes('flashAttentionWithGrad'));
const gpt = blocks.find((b) => b.code.includes('new GPT('));

describe('README examples run as written', () => {
  test('the README has its attention and GPT examples as ts blocks, and no ts block this file does not run', () => {
    expect(usage).toBeDefined();
    expect(gpt).toBeDefined();
    // A new example gets a test here (what it prints is part of what it claims).
    expect(blocks.filter((b) => b !== usage && b !== gpt).map((b) => b.line)).toEqual([]);
  });

  test('the attention example: its output reads back, and every tensor is freed as it says', () => {
    const { result } = runBlock(usage!);
    expect({ status: result.status, signal: result.signal, stderr: result.stderr }).toEqual({ status: 0, signal: null, stderr: '' });
    // The example's closing comment: no tensor left on either device (util.inspect breaks an
    // object with pool fields, as CUDA's is, over several lines).
    expect(result.stdout).toMatch(/cpu: \{\s*tensors: 0,\s*bytes: 0,/);
    expect(result.stdout).toMatch(/cuda: \{\s*tensors: 0,\s*bytes: 0,/);
    expect(result.stdout).toMatch(/finalizedWithoutDispose: 0/);
    // The first four outputs print before it: finite numbers of attention over values in [-0.5, 0.5).
    const first = /^Float32Array\(4\) \[([^\]]*)\]/m.exec(result.stdout);
    expect(first).not.toBeNull();
    const values = first![1].split(',').map(Number);
    expect(values).toHaveLength(4);
    for (const x of values) expect(Math.abs(x)).toBeLessThan(0.5);
  }, BLOCK_TIMEOUT_MS + 10000);

  test('the GPT example: one training step prints a loss near ln(65) and saves a checkpoint', () => {
    const { result, dir } = runBlock(gpt!);
    expect({ status: result.status, signal: result.signal, stderr: result.stderr }).toEqual({ status: 0, signal: null, stderr: '' });
    const loss = Number(result.stdout.trim().split('\n').pop());
    // Freshly initialised weights over 65 tokens: about ln(65) = 4.17.
    expect(loss).toBeGreaterThan(3.5);
    expect(loss).toBeLessThan(5.5);
    const ckpt = path.join(dir, 'ckpt.safetensors');
    expect(fs.existsSync(ckpt)).toBe(true);
    // safetensors: an 8-byte little-endian header length, then JSON naming the model's tensors.
    const bytes = fs.readFileSync(ckpt);
    const headerLength = Number(bytes.readBigUInt64LE(0));
    const header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString('utf8')) as Record<string, unknown>;
    expect(Object.keys(header).length).toBeGreaterThan(10);
  }, BLOCK_TIMEOUT_MS + 10000);
});
