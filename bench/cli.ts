#!/usr/bin/env node
/**
 * flash-attn-bench: times flash-attn-node's attention on this machine's backend.
 *
 *   npx flash-attn-bench                        # default grid on the default device (CUDA, else CPU)
 *   npx flash-attn-bench --seqlen 1024,2048 --head-dim 64 --pass fwdbwd --json
 *
 * Timing: inputs drawn at random (never zeros); warm-up runs first; each repeat is timed from the
 * call until its outputs are read back to the host (`synchronize`), and the median, min and max are
 * reported. FLOPs are counted as FlashAttention-2 does (bench/flops.ts).
 * @packageDocumentation
 */
import { backends, defaultDevice, flashAttention, flashAttentionBackward, synchronize, Tensor } from '../lib';
import type { Device, DType, ReferenceShape } from '../lib';
import { AttentionShape, Pass, passFlops } from './flops';

/** Parsed command line. */
export interface BenchArgs {
  device: Device;
  dtype: DType;
  seqlens: number[];
  seqlenK: number | null;
  batch: number | null;
  heads: number;
  kvHeads: number | null;
  headDims: number[];
  causal: boolean[];
  passes: Pass[];
  repeats: number;
  warmup: number;
  json: boolean;
}

const HELP = `flash-attn-bench: time flash-attn-node attention

Options (lists are comma-separated):
  --device cpu|cuda        default: cuda when available, else cpu
  --dtype float32|float16|bfloat16   default: bfloat16 on cuda, float32 on cpu
  --seqlen N[,N...]        query (and key) lengths
  --seqlen-k N             key length, when it differs from the query length
  --batch N                default: 16384/seqlen on cuda, 1 on cpu
  --heads N                query heads (default: 8)
  --kv-heads N             key/value heads for GQA (default: = heads)
  --head-dim D[,D...]      default: 64
  --causal true|false|both default: false
  --pass fwd|bwd|fwdbwd[,...]  default: fwd,bwd,fwdbwd
  --repeats N              timed runs per cell (median reported; default 20 on cuda, 3 on cpu)
  --warmup N               untimed runs first (default 3 on cuda, 1 on cpu)
  --json                   print the results as JSON on stdout
  --help
`;

function parseList(flag: string, value: string | undefined, parse: (s: string) => number): number[] {
  if (value === undefined) throw new Error(`${flag} needs a value`);
  const out = value.split(',').map((s) => parse(s.trim()));
  for (const v of out) if (!Number.isSafeInteger(v) || v < 1) throw new Error(`${flag}: expected positive integers but received "${value}"`);
  return out;
}

/** Parses argv (without node and the script). Throws an Error with a usage message on bad input. */
export function parseArgs(argv: string[], device: Device = 'cpu'): BenchArgs & { help: boolean } {
  const a: BenchArgs & { help: boolean } = {
    device, dtype: device === 'cuda' ? 'bfloat16' : 'float32', seqlens: [], seqlenK: null, batch: null,
    heads: 8, kvHeads: null, headDims: [64], causal: [false], passes: ['fwd', 'bwd', 'fwdbwd'],
    repeats: device === 'cuda' ? 20 : 3, warmup: device === 'cuda' ? 3 : 1, json: false, help: false,
  };
  let dtypeSet = false, repeatsSet = false, warmupSet = false;
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const next = (): string => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${flag} needs a value`);
      return v;
    };
    switch (flag) {
      case '--help': case '-h': a.help = true; break;
      case '--json': a.json = true; break;
      case '--device': {
        const v = next();
        if (v !== 'cpu' && v !== 'cuda') throw new Error(`--device: expected cpu or cuda but received "${v}"`);
        a.device = v;
        break;
      }
      case '--dtype': {
        const v = next();
        if (v !== 'float32' && v !== 'float16' && v !== 'bfloat16') {
          throw new Error(`--dtype: expected float32, float16 or bfloat16 but received "${v}"`);
        }
        a.dtype = v;
        dtypeSet = true;
        break;
      }
      case '--seqlen': a.seqlens = parseList(flag, next(), Number); break;
      case '--seqlen-k': a.seqlenK = parseList(flag, next(), Number)[0]; break;
      case '--batch': a.batch = parseList(flag, next(), Number)[0]; break;
      case '--heads': a.heads = parseList(flag, next(), Number)[0]; break;
      case '--kv-heads': a.kvHeads = parseList(flag, next(), Number)[0]; break;
      case '--head-dim': a.headDims = parseList(flag, next(), Number); break;
      case '--repeats': a.repeats = parseList(flag, next(), Number)[0]; repeatsSet = true; break;
      case '--warmup': {
        const v = Number(next());
        if (!Number.isSafeInteger(v) || v < 0) throw new Error(`--warmup: expected an integer >= 0 but received "${argv[i]}"`);
        a.warmup = v;
        warmupSet = true;
        break;
      }
      case '--causal': {
        const v = next();
        if (v === 'both') a.causal = [false, true];
        else if (v === 'true' || v === 'false') a.causal = [v === 'true'];
        else throw new Error(`--causal: expected true, false or both but received "${v}"`);
        break;
      }
      case '--pass': {
        const v = next().split(',');
        for (const p of v) if (p !== 'fwd' && p !== 'bwd' && p !== 'fwdbwd') throw new Error(`--pass: expected fwd, bwd or fwdbwd but received "${p}"`);
        a.passes = v as Pass[];
        break;
      }
      default:
        throw new Error(`unknown option "${flag}" (see --help)`);
    }
  }
  if (!dtypeSet) a.dtype = a.device === 'cuda' ? 'bfloat16' : 'float32';
  if (!repeatsSet) a.repeats = a.device === 'cuda' ? 20 : 3;
  if (!warmupSet) a.warmup = a.device === 'cuda' ? 3 : 1;
  if (a.seqlens.length === 0) a.seqlens = a.device === 'cuda' ? [512, 1024, 2048, 4096, 8192, 16384] : [512, 1024, 2048];
  return a;
}

/** One measured cell: the problem's sizes (as the reference names them) and its timings. */
export interface BenchRow extends ReferenceShape {
  device: Device;
  dtype: DType;
  pass: Pass;
  causal: boolean;
  msMedian: number;
  msMin: number;
  msMax: number;
  tflops: number;
}

function randomTensor(shape: number[], dtype: DType, device: Device): Tensor {
  const n = shape.reduce((x, y) => x * y, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = Math.random() * 2 - 1;
  return Tensor.fromFloat32Array(data, shape, { dtype, device });
}

function median(xs: number[]): number {
  const s = [...xs].sort((x, y) => x - y);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

async function timeCell(args: BenchArgs, shape: AttentionShape & { headsKV: number }, pass: Pass): Promise<BenchRow> {
  const { device, dtype } = args;
  const q = randomTensor([shape.batch, shape.seqlenQ, shape.headsQ, shape.headDim], dtype, device);
  const k = randomTensor([shape.batch, shape.seqlenK, shape.headsKV, shape.headDim], dtype, device);
  const v = randomTensor([shape.batch, shape.seqlenK, shape.headsKV, shape.headDim], dtype, device);
  const dout = randomTensor([shape.batch, shape.seqlenQ, shape.headsQ, shape.headDim], dtype, device);
  const opts = { causal: shape.causal };
  const fwd = flashAttention(q, k, v, opts); // the backward's inputs
  await synchronize(device);
  const runOnce = (): void => {
    if (pass === 'fwd') {
      const r = flashAttention(q, k, v, opts);
      r.out.dispose();
      r.lse.dispose();
    } else if (pass === 'bwd') {
      const g = flashAttentionBackward(dout, q, k, v, fwd.out, fwd.lse, opts);
      g.dq.dispose(); g.dk.dispose(); g.dv.dispose();
    } else {
      const r = flashAttention(q, k, v, opts);
      const g = flashAttentionBackward(dout, q, k, v, r.out, r.lse, opts);
      r.out.dispose(); r.lse.dispose(); g.dq.dispose(); g.dk.dispose(); g.dv.dispose();
    }
  };
  try {
    for (let i = 0; i < args.warmup; i++) runOnce();
    await synchronize(device);
    const times: number[] = [];
    for (let i = 0; i < args.repeats; i++) {
      const t0 = process.hrtime.bigint();
      runOnce();
      await synchronize(device);
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    const ms = median(times);
    return {
      device, dtype, pass, batch: shape.batch, seqlenQ: shape.seqlenQ, seqlenK: shape.seqlenK, headsQ: shape.headsQ,
      headsKV: shape.headsKV, headDim: shape.headDim, causal: shape.causal, msMedian: ms,
      msMin: Math.min(...times), msMax: Math.max(...times), tflops: passFlops(shape, pass) / (ms * 1e-3) / 1e12,
    };
  } finally {
    for (const t of [q, k, v, dout, fwd.out, fwd.lse]) t.dispose();
  }
}

function pad(s: string, n: number): string {
  return s.length >= n ? s : ' '.repeat(n - s.length) + s;
}

/** Runs the grid in `args` and returns the rows. */
export async function runBench(args: BenchArgs, onRow?: (row: BenchRow) => void): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  for (const headDim of args.headDims) {
    for (const causal of args.causal) {
      for (const seqlen of args.seqlens) {
        const batch = args.batch ?? (args.device === 'cuda' ? Math.max(1, Math.floor(16384 / seqlen)) : 1);
        const shape = {
          batch, seqlenQ: seqlen, seqlenK: args.seqlenK ?? seqlen, headsQ: args.heads,
          headsKV: args.kvHeads ?? args.heads, headDim, causal,
        };
        for (const pass of args.passes) {
          const row = await timeCell(args, shape, pass);
          rows.push(row);
          onRow?.(row);
        }
      }
    }
  }
  return rows;
}

/** Formats one table line. */
export function formatRow(r: BenchRow): string {
  return [
    pad(r.pass, 6), pad(String(r.headDim), 4), pad(r.causal ? 'yes' : 'no', 6), pad(String(r.batch), 5),
    pad(String(r.seqlenQ), 6), pad(String(r.seqlenK), 6), pad(`${r.headsQ}/${r.headsKV}`, 6),
    pad(r.msMedian.toFixed(2), 10), pad(`${r.msMin.toFixed(2)}-${r.msMax.toFixed(2)}`, 17),
    pad(r.tflops < 1 ? (r.tflops * 1000).toFixed(2) + ' G' : r.tflops.toFixed(1) + ' T', 10),
  ].join(' ');
}

async function main(): Promise<void> {
  let args: ReturnType<typeof parseArgs>;
  try {
    const devFlag = process.argv.indexOf('--device');
    const device: Device = devFlag >= 0 ? (process.argv[devFlag + 1] as Device) : defaultDevice();
    args = parseArgs(process.argv.slice(2), device);
  } catch (err) {
    process.stderr.write(`flash-attn-bench: ${(err as Error).message}\n`);
    process.exitCode = 2;
    return;
  }
  if (args.help) {
    process.stdout.write(HELP);
    return;
  }
  const b = backends();
  if (args.device === 'cuda' && !b.cuda.available) {
    process.stderr.write(`flash-attn-bench: CUDA is not available (${b.cuda.reason})\n`);
    process.exitCode = 1;
    return;
  }
  const where = args.device === 'cuda'
    ? `CUDA: ${b.cuda.device?.name} (driver ${b.cuda.device?.driverVersion}, runtime ${b.cuda.device?.runtimeVersion})`
    : `CPU backend, ${b.cpu.threads} threads${b.cuda.available ? '' : ` (no GPU: ${b.cuda.reason})`}`;
  const log = (s: string): void => {
    (args.json ? process.stderr : process.stdout).write(s + '\n');
  };
  log(`flash-attn-bench ${new Date().toISOString().slice(0, 10)} on ${where}, Node ${process.version}`);
  log(`dtype ${args.dtype}; median of ${args.repeats} after ${args.warmup} warm-up; FLOPs as FA2 counts them`);
  log(['  pass', 'hdim', 'causal', 'batch', '    Sq', '    Sk', ' heads', '  ms (med)', '     ms (min-max)', ' FLOP/s'].join(' '));
  const rows = await runBench(args, (r) => log(formatRow(r)));
  if (args.json) process.stdout.write(JSON.stringify({ date: new Date().toISOString(), device: where, rows }, null, 2) + '\n');
}

if (require.main === module) {
  main().catch((err) => {
    process.stderr.write(`flash-attn-bench: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exitCode = 1;
  });
}
