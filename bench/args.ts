/**
 * The command line of flash-attn-bench: flags → settings (flags over a preset over the device's
 * default grid) and output options. Every bad flag throws a {@link BenchArgError} that names the
 * flag, what was expected and what was received.
 * @packageDocumentation
 */
import type { AttentionKernel, Device, DType } from '../lib';
import { Pass, PASSES } from './flops';
import { BwdVariant, CompareTarget, GridSettings, headsFor } from './grid';
import { defaultPresetName, deviceDefaults, Preset, PRESETS, RENAMED_PRESETS } from './presets';
import type { TorchBackend } from './torch';

/** A bad command line; the CLI prints the message and exits with status 2. */
export class BenchArgError extends Error {
  override readonly name = 'BenchArgError';
}

/** Where and how results are written. */
export interface OutputOptions {
  json: boolean;
  csv: boolean;
  markdown: boolean;
  /** SVG file for the chart, or null. */
  chart: string | null;
  quiet: boolean;
  /** Python for --compare torch (default: $FLASH_ATTN_BENCH_PYTHON, else python3). */
  python: string | null;
}

/** What the command line asks for. */
export type BenchCommand =
  | { kind: 'help' }
  | { kind: 'version' }
  | { kind: 'list-presets' }
  | {
    kind: 'run';
    settings: GridSettings;
    output: OutputOptions;
    /** The preset named by --preset, or null. */
    preset: string | null;
    /** The preset the settings start from: --preset's, else the device's default (fa2-grid on cuda, cpu-small on cpu). */
    basePreset: string;
    /**
     * The flags that changed a value of `basePreset` (e.g. `--seqlen 64`), in command-line order; empty
     * when the run is the preset unchanged. A flag that repeats the preset's value is not listed.
     */
    overrides: string[];
    deviceChosen: boolean;
  };

/** Smallest repeat count on CUDA: medians of fewer runs are noise there. */
export const MIN_CUDA_REPEATS = 20;

export const HELP = `flash-attn-bench: time flash-attn-node's attention (ms, TFLOP/s, peak memory),
optionally beside our naive CUDA kernel and PyTorch SDPA.

Usage: flash-attn-bench [options]      (lists are comma-separated; 1k = 1024)

With no options: the FA2 paper's grid on CUDA (preset fa2-grid: bf16, head dim 64 and 128, causal
and not, seqlen 512-16k with batch = 16384/seqlen and heads = 2048/headDim, fwd, bwd, fwdbwd), or,
without a GPU, a small fp32 grid on the CPU backend (preset cpu-small).

Problem:
  --seqlen N[,N...]          query (and key) lengths
  --seqlen-k N               key length, when it differs from the query length
  --batch N                  default: 16384/seqlen on the FA2 grid, 1 on cpu-small
  --heads N                  query heads; default: 2048/headDim on the FA2 grid, 8 on cpu-small
  --kv-heads N               key/value heads (GQA/MQA; divides --heads); default: = heads
  --head-dim D[,D...]        multiples of 8 up to 256
  --dtype T                  bfloat16|float16|float32 (bf16, fp16, fp32); default: bf16 on cuda, fp32 on cpu
  --causal [true|false|both] bare --causal means true; default: both on the FA2 grid
  --pass P[,P...]            fwd|bwd|fwdbwd|all; default: all

Implementation and timing:
  --device cpu|cuda          default: cuda when usable, else cpu
  --kernel auto|flash|naive  flashAttention's kernel option for our rows; default: auto
  --repeats N                timed runs per cell, median reported; default 20 on cuda (at least 20), 3 on cpu
  --warmup N                 untimed runs first; default 5 on cuda, 1 on cpu
  --warmup-ms N              then untimed runs until N ms have passed since the first (sustained clocks); default 0
  --compare T[,T...]         naive: our S-materialising CUDA kernel (shows the memory wall; OOM is reported);
                             torch: PyTorch SDPA in python3, same cells, same timing (CUDA events)
  --torch-backends B[,B...]  flash|cudnn|efficient|math; default: flash,cudnn,efficient
  --variants V[,V...]        extra rows of our backward (bwd and fwdbwd cells; "ours" is algorithm 'auto'):
                             single-kernel: one kernel, dQ by atomic adds (algorithm: 'single-kernel');
                             deterministic: that kernel's deterministic mode (single-kernel, deterministic: true);
                             two-kernel: a dK/dV kernel, then a dQ kernel (algorithm: 'two-kernel'; Hopper, fp16/bf16);
                             auto-deterministic: 'auto' with deterministic: true (what asking for determinism gets)
  --python PATH              Python with PyTorch for --compare torch; default: $FLASH_ATTN_BENCH_PYTHON, else python3
  --preset NAME              a named run (see --list-presets); flags given beside it override it

Output (tables go to stdout, or to stderr when --json, --csv or --markdown takes stdout):
  --json                     results as JSON on stdout
  --csv                      results as CSV on stdout (# comment lines carry device, versions, date)
  --markdown                 GitHub markdown tables on stdout (for bench/RESULTS.md)
  --chart FILE.svg           TFLOP/s against seqlen, one line per implementation, one panel per (head dim, causal, pass)
  --quiet                    no progress bar; no tables on stderr when stdout carries JSON, CSV or markdown
  --list-presets             describe the presets
  --help, -h                 this text
  --version, -v              print flash-attn-bench's version (the package's) and exit

Measured: the median (with min and max) of --repeats runs timed by CUDA events (host time to completion
on the CPU); TFLOP/s by FlashAttention-2's count (fwd 4·B·H·Sq·Sk·D, halved when causal; bwd 2.5×; fwdbwd
3.5×); % of the GPU's dense peak for the dtype (fp32 against the non-tensor-core fp32 peak); peak memory
above the inputs during one run. Ratios (ours ÷ other, in TFLOP/s) above 1 mean ours is faster. Backward
variant ratios are of times: single-kernel ÷ two-kernel above 1 means the two kernels are faster;
deterministic ÷ single-kernel is what the single kernel's deterministic mode costs, deterministic ÷ auto
what deterministic: true costs 'auto'.
`;

const DTYPE_ALIASES: Record<string, DType> = {
  float32: 'float32', fp32: 'float32', f32: 'float32',
  float16: 'float16', fp16: 'float16', f16: 'float16', half: 'float16',
  bfloat16: 'bfloat16', bf16: 'bfloat16',
};
const KERNELS: readonly AttentionKernel[] = ['auto', 'flash', 'naive'];
const COMPARE: readonly CompareTarget[] = ['naive', 'torch'];
const TORCH_BACKEND_NAMES: readonly TorchBackend[] = ['flash', 'cudnn', 'efficient', 'math'];
const BWD_VARIANTS: readonly BwdVariant[] = ['single-kernel', 'deterministic', 'two-kernel', 'auto-deterministic'];
/** Flags that take no value. */
const SWITCHES = new Set(['--json', '--csv', '--markdown', '--quiet', '--help', '-h', '--version', '-v', '--list-presets']);

/** The setting each grid flag sets (for {@link BenchCommand}'s `overrides`). */
const FLAG_SETTINGS: Readonly<Record<string, keyof GridSettings>> = {
  '--device': 'device', '--dtype': 'dtype', '--seqlen': 'seqlens', '--seqlen-k': 'seqlenK', '--batch': 'batch', '--heads': 'heads',
  '--kv-heads': 'kvHeads', '--head-dim': 'headDims', '--causal': 'causal', '--pass': 'passes', '--kernel': 'kernel',
  '--repeats': 'repeats', '--warmup': 'warmup', '--warmup-ms': 'warmupMs', '--compare': 'compare', '--torch-backends': 'torchBackends', '--variants': 'variants',
};

/** Settings whose lists are sets (their order does not change the cells measured). */
const SET_SETTINGS: ReadonlySet<keyof GridSettings> = new Set(['seqlens', 'headDims', 'causal', 'passes', 'compare', 'torchBackends', 'variants']);

/** `v` as one shell word. */
function shellWord(v: string): string {
  return /^[\w.,:/=+@%-]+$/.test(v) ? v : `'${v.replace(/'/g, `'\\''`)}'`;
}

function sameSetting(key: keyof GridSettings, a: GridSettings[keyof GridSettings], b: GridSettings[keyof GridSettings]): boolean {
  const norm = (v: unknown): string => JSON.stringify(Array.isArray(v) && SET_SETTINGS.has(key) ? [...v].map(String).sort() : v);
  return norm(a) === norm(b);
}

/** The name of the preset a run starts from: `preset` if named, else the device's default. */
export function basePresetName(preset: string | null, device: Device): string {
  return preset ?? defaultPresetName(device);
}


function fail(flag: string, expected: string, received: string): never {
  throw new BenchArgError(`${flag}: expected ${expected} but received ${received}`);
}

function quote(s: string): string {
  return JSON.stringify(s);
}

/** "a, b or c". */
function oneOf(xs: readonly string[]): string {
  return xs.length === 1 ? xs[0] : `${xs.slice(0, -1).join(', ')} or ${xs[xs.length - 1]}`;
}

/** One positive integer, with an optional k (×1024) suffix; null when malformed. */
function positiveInt(s: string): number | null {
  const m = /^(\d+)(k?)$/i.exec(s.trim());
  if (!m) return null;
  const v = Number(m[1]) * (m[2] ? 1024 : 1);
  return Number.isSafeInteger(v) && v >= 1 ? v : null;
}

function intList(flag: string, value: string): number[] {
  const parts = value.split(',');
  const out = parts.map(positiveInt);
  if (value.trim() === '' || out.some((v) => v === null)) fail(flag, 'a comma-separated list of positive integers (e.g. 1024,4k)', quote(value));
  return out as number[];
}

function oneInt(flag: string, value: string): number {
  const v = positiveInt(value);
  if (v === null) fail(flag, 'a positive integer', quote(value));
  return v;
}

function nonNegativeInt(flag: string, value: string): number {
  if (!/^\d+$/.test(value.trim()) || !Number.isSafeInteger(Number(value))) fail(flag, 'an integer >= 0', quote(value));
  return Number(value);
}

function enumList<T extends string>(flag: string, value: string, allowed: readonly T[], extra: Record<string, readonly T[]> = {}): T[] {
  const out: T[] = [];
  for (const raw of value.split(',')) {
    const v = raw.trim();
    if (extra[v]) out.push(...extra[v]);
    else if ((allowed as readonly string[]).includes(v)) out.push(v as T);
    else fail(flag, `${oneOf([...allowed, ...Object.keys(extra)])} (comma-separated)`, quote(value));
  }
  return [...new Set(out)];
}

/**
 * Parses argv (without node and the script). `defaultDevice` is used when neither --device nor a
 * preset names one (the CLI passes 'cuda' when a GPU is usable). Throws {@link BenchArgError}.
 */
export function parseArgs(argv: readonly string[], defaultDevice: Device = 'cpu'): BenchCommand {
  const flags: Partial<GridSettings> = {};
  const output: OutputOptions = { json: false, csv: false, markdown: false, chart: null, quiet: false, python: null };
  let preset: string | null = null;
  let help = false;
  let version = false;
  let list = false;
  /** Per setting, the last flag that set it, as typed (`--seqlen 64`). */
  const given = new Map<keyof GridSettings, string>();

  for (let i = 0; i < argv.length; i++) {
    const start = i;
    let flag = argv[i];
    let inline: string | undefined;
    const eq = flag.indexOf('=');
    if (flag.startsWith('--') && eq > 0) {
      inline = flag.slice(eq + 1);
      flag = flag.slice(0, eq);
    }
    if (SWITCHES.has(flag) && inline !== undefined) fail(flag, 'no value', quote(inline));
    const value = (): string => {
      if (inline !== undefined) return inline;
      const v = argv[i + 1];
      if (v === undefined || (v.startsWith('--') && v.length > 2)) fail(flag, 'a value', 'nothing');
      i += 1;
      return v;
    };
    switch (flag) {
      case '--help': case '-h': help = true; break;
      case '--version': case '-v': version = true; break;
      case '--list-presets': list = true; break;
      case '--json': output.json = true; break;
      case '--csv': output.csv = true; break;
      case '--markdown': output.markdown = true; break;
      case '--quiet': output.quiet = true; break;
      case '--chart': {
        const v = value();
        if (!/\.svg$/i.test(v) || v.length <= 4) fail(flag, 'a file name ending in .svg', quote(v));
        output.chart = v;
        break;
      }
      case '--python': {
        const v = value();
        if (v.trim() === '') fail(flag, 'a path to a Python interpreter', '""');
        output.python = v;
        break;
      }
      case '--preset': {
        const v = value();
        if (!Object.prototype.hasOwnProperty.call(PRESETS, v)) {
          const renamed = Object.prototype.hasOwnProperty.call(RENAMED_PRESETS, v) ? RENAMED_PRESETS[v] : null;
          const hint = renamed === null ? '' : ` (preset '${v}' was renamed to '${renamed}')`;
          fail(flag, oneOf(Object.keys(PRESETS)), quote(v) + hint);
        }
        preset = v;
        break;
      }
      case '--device': {
        const v = value();
        if (v !== 'cpu' && v !== 'cuda') fail(flag, 'cpu or cuda', quote(v));
        flags.device = v;
        break;
      }
      case '--dtype': {
        const v = value();
        const d = DTYPE_ALIASES[v.toLowerCase()];
        if (!d) fail(flag, 'bfloat16, float16 or float32 (or bf16, fp16, fp32)', quote(v));
        flags.dtype = d;
        break;
      }
      case '--seqlen': flags.seqlens = [...new Set(intList(flag, value()))]; break;
      case '--seqlen-k': flags.seqlenK = oneInt(flag, value()); break;
      case '--batch': flags.batch = oneInt(flag, value()); break;
      case '--heads': flags.heads = oneInt(flag, value()); break;
      case '--kv-heads': flags.kvHeads = oneInt(flag, value()); break;
      case '--head-dim': {
        const v = value();
        const dims = intList(flag, v);
        if (dims.some((d) => d % 8 !== 0 || d > 256)) fail(flag, 'multiples of 8 up to 256', quote(v));
        flags.headDims = [...new Set(dims)];
        break;
      }
      case '--causal': {
        // Bare --causal means true (when no value follows, or the next word is another flag).
        const next = inline ?? argv[i + 1];
        if (next === undefined || (inline === undefined && next.startsWith('-'))) {
          flags.causal = [true];
          break;
        }
        const v = value();
        if (v === 'both') flags.causal = [false, true];
        else if (v === 'true' || v === 'false') flags.causal = [v === 'true'];
        else fail(flag, 'true, false or both', quote(v));
        break;
      }
      case '--pass': flags.passes = enumList<Pass>(flag, value(), PASSES, { all: PASSES }); break;
      case '--kernel': {
        const v = value();
        if (!(KERNELS as readonly string[]).includes(v)) fail(flag, oneOf(KERNELS), quote(v));
        flags.kernel = v as AttentionKernel;
        break;
      }
      case '--repeats': flags.repeats = oneInt(flag, value()); break;
      case '--warmup': flags.warmup = nonNegativeInt(flag, value()); break;
      case '--warmup-ms': flags.warmupMs = nonNegativeInt(flag, value()); break;
      case '--compare': flags.compare = enumList<CompareTarget>(flag, value(), COMPARE); break;
      case '--torch-backends': flags.torchBackends = enumList<TorchBackend>(flag, value(), TORCH_BACKEND_NAMES); break;
      case '--variants': flags.variants = enumList<BwdVariant>(flag, value(), BWD_VARIANTS); break;
      default:
        throw new BenchArgError(`unknown option ${quote(argv[i])} (see --help)`);
    }
    const key = FLAG_SETTINGS[flag];
    if (key !== undefined) {
      const words = inline !== undefined ? [flag, inline] : argv.slice(start, i + 1);
      given.delete(key);
      given.set(key, [words[0], ...words.slice(1).map(shellWord)].join(' '));
    }
  }
  if (help) return { kind: 'help' };
  if (version) return { kind: 'version' };
  if (list) return { kind: 'list-presets' };

  const stdoutFormats = (['json', 'csv', 'markdown'] as const).filter((k) => output[k]);
  if (stdoutFormats.length > 1) {
    throw new BenchArgError(
      `--json, --csv and --markdown all write to stdout: expected at most one but received ${stdoutFormats.map((k) => `--${k}`).join(' and ')}`,
    );
  }

  const p = preset === null ? null : PRESETS[preset];
  const settings = resolveSettings(p, flags, defaultDevice);
  validate(settings, flags);
  // What each flag is measured against: the preset on its own device, and for the other settings,
  // the preset moved to the run's device (which takes that device's timing defaults).
  const basePreset = basePresetName(preset, settings.device);
  const onDevice = resolveSettings(PRESETS[basePreset], { device: settings.device }, settings.device);
  const base: GridSettings = { ...onDevice, device: PRESETS[basePreset].device };
  const overrides = [...given].filter(([key]) => !sameSetting(key, settings[key], base[key])).map(([, text]) => text);
  return { kind: 'run', settings, output, preset, basePreset, overrides, deviceChosen: flags.device !== undefined || p !== null };
}

/** Flags over a preset over the device's default grid. */
function resolveSettings(p: Preset | null, flags: Partial<GridSettings>, defaultDevice: Device): GridSettings {
  const device = flags.device ?? p?.device ?? defaultDevice;
  const settings: GridSettings = { ...deviceDefaults(device), ...(p?.settings ?? {}), ...flags, device };
  // A preset made for the other device keeps its problem but takes this device's timing defaults.
  if (flags.repeats === undefined && p && p.device !== device) settings.repeats = deviceDefaults(device).repeats;
  if (flags.warmup === undefined && p && p.device !== device) settings.warmup = deviceDefaults(device).warmup;
  if (flags.warmupMs === undefined && p && p.device !== device) settings.warmupMs = deviceDefaults(device).warmupMs;
  return settings;
}

/** Checks that hold across flags (and the preset's values). */
function validate(s: GridSettings, flags: Partial<GridSettings>): void {
  if (s.device === 'cuda' && s.repeats < MIN_CUDA_REPEATS) {
    fail('--repeats', `at least ${MIN_CUDA_REPEATS} on cuda (the median of fewer runs is noise)`, String(s.repeats));
  }
  if (s.device === 'cpu' && s.kernel === 'naive') {
    fail('--kernel', 'auto or flash on cpu (naive is CUDA-only)', quote(s.kernel));
  }
  if (s.kvHeads !== null) {
    for (const d of s.headDims) {
      const hq = headsFor(s, d);
      if (hq % s.kvHeads !== 0) {
        const where = flags.heads !== undefined || s.heads !== null ? `${hq} query heads` : `${hq} query heads at head dim ${d}`;
        fail('--kv-heads', `a divisor of the ${where}`, String(s.kvHeads));
      }
    }
  }
}
