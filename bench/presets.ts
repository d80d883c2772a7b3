/**
 * Named runs (`--preset NAME`, listed by `--list-presets`): the grid of T. Dao, "FlashAttention-2:
 * Faster Attention with Better Parallelism and Work Partitioning" (2023), a small CPU grid, and the
 * configurations of K. Garimella, "Understanding the Forward and Backward Pass of FlashAttention2"
 * (Triton kernels measured on an RTX 3090; code at github.com/kvgarimella/flashattention2-backward),
 * so that their numbers can be set beside ours. Flags given with a preset override its values.
 * @packageDocumentation
 */
import type { Device } from '../lib';
import { FA2_SEQLENS, GridSettings } from './grid';

/** One named configuration. */
export interface Preset {
  name: string;
  /** One line for `--list-presets`. */
  summary: string;
  /** Where the numbers come from and what to compare them with. */
  details: string[];
  /** The device it is meant for (a `--device` flag still wins). */
  device: Device;
  settings: Partial<GridSettings>;
}

const FA2_GRID: GridSettings = {
  device: 'cuda', dtype: 'bfloat16', seqlens: [...FA2_SEQLENS], seqlenK: null, batch: null, tokens: 16384,
  heads: null, hidden: 2048, kvHeads: null, headDims: [64, 128], causal: [false, true], passes: ['fwd', 'bwd', 'fwdbwd'],
  kernel: 'auto', repeats: 20, warmup: 5, warmupMs: 0, compare: [], torchBackends: ['flash', 'cudnn', 'efficient'], variants: [],
};

const CPU_SMALL: GridSettings = {
  ...FA2_GRID, device: 'cpu', dtype: 'float32', seqlens: [256, 512, 1024, 2048], batch: 1, heads: 8, headDims: [64],
  repeats: 3, warmup: 1, warmupMs: 0,
};

/**
 * The shape of Garimella's measurements: batch 4, one head, head dim 64, seqlen 8192 (the post names
 * no head count; its tensors are (batch, seq, d)).
 */
const B4_H1_D64_8K: Partial<GridSettings> = { batch: 4, heads: 1, kvHeads: null, headDims: [64], seqlens: [8192], causal: [false] };

/** Every preset, by name, in the order `--list-presets` shows them. */
export const PRESETS: Readonly<Record<string, Preset>> = {
  'fa2-grid': {
    name: 'fa2-grid',
    summary: 'the FA2 paper\'s grid: bf16, head dim 64 and 128, causal and not, seqlen 512-16k, fwd/bwd/fwdbwd (the default on CUDA)',
    details: [
      'batch = 16384/seqlen, heads = 2048/headDim (16k tokens, model width 2048), as in §4.1 of T. Dao, "FlashAttention-2:',
      'Faster Attention with Better Parallelism and Work Partitioning" (2023).',
      'Add --compare torch for PyTorch SDPA (flash, cuDNN, memory-efficient) on the same cells, --compare naive for the memory wall.',
    ],
    device: 'cuda',
    settings: FA2_GRID,
  },
  'cpu-small': {
    name: 'cpu-small',
    summary: 'a small fp32 grid for the CPU backend: B1 H8 d64, seqlen 256-2k, causal and not, fwd/bwd/fwdbwd (the default without a GPU)',
    details: ['Median of 3 after 1 warm-up: a smoke test of the CPU backend, not a GPU substitute.'],
    device: 'cpu',
    settings: CPU_SMALL,
  },
  'fp32-memory-wall': {
    name: 'fp32-memory-wall',
    summary: 'the N x N memory wall in fp32: B4 H1 d64 seqlen 8192, fwd and fwdbwd, vs naive and PyTorch (efficient, math)',
    details: [
      'K. Garimella, "Understanding the Forward and Backward Pass of FlashAttention2" (github.com/kvgarimella/flashattention2-backward),',
      'on an RTX 3090: eager forward 23.5 ms, torch.compile 13.95 ms, Triton FA2 2.19 ms; eager/compile hold the N x N',
      'matrices in memory (GiBs), FA2 a few MiB. PyTorch on an H100: eager 3.55 ms and 2.4 GB peak, SDPA memory-efficient',
      '2.56 ms and 385 MB. "naive" is our S-materialising CUDA kernel, "torch-math" PyTorch\'s unfused SDPA (the eager',
      'equivalent): both show the wall.',
    ],
    device: 'cuda',
    settings: {
      ...B4_H1_D64_8K, dtype: 'float32', passes: ['fwd', 'fwdbwd'], compare: ['naive', 'torch'], torchBackends: ['efficient', 'math'],
    },
  },
  'long-seq-bf16': {
    name: 'long-seq-bf16',
    summary: 'long sequences in bf16: B4 H1 d64, seqlen 8k-64k, forward+backward vs PyTorch FA2',
    details: [
      'Garimella\'s bf16 table (RTX 3090, PyTorch 2.10 FA2 vs the post\'s Triton kernel, fwd+bwd ms): 8k 2.517 vs 3.351,',
      '16k 7.749 vs 12.287, 32k 31.197 vs 46.403, 64k 111.403 vs 185.191. The post states batch 4 and head dim 64 but',
      'neither a head count (1 assumed: its tensors are (batch, seq, d)) nor the mask of this table: both masks are run.',
    ],
    device: 'cuda',
    settings: {
      ...B4_H1_D64_8K, dtype: 'bfloat16', seqlens: [8192, 16384, 32768, 65536], causal: [false, true], passes: ['fwdbwd'],
      compare: ['torch'], torchBackends: ['flash'],
    },
  },
  'bwd-variants': {
    name: 'bwd-variants',
    summary: 'backward variants at B4 H1 d64 seqlen 8192, bf16: single kernel (atomic dQ, and deterministic) vs two kernels',
    details: [
      'Garimella\'s Triton kernels (RTX 3090): single-kernel backward with atomic dQ 28.9 ms, two-kernel backward (dQ pass, then',
      'dK/dV pass; 12·N²·d instead of 10·N²·d FLOPs, no atomics) 6.53 ms. Ours, in bf16: the default backward (\'auto\':',
      'two kernels on Hopper) beside the single kernel with atomic dQ, its deterministic mode, and the two-kernel',
      'backward (Hopper, fp16/bf16: a dK/dV kernel, then a dQ kernel); the summary gives single-kernel ÷ two-kernel and',
      'deterministic ÷ single-kernel times.',
    ],
    device: 'cuda',
    settings: { ...B4_H1_D64_8K, dtype: 'bfloat16', passes: ['bwd'], variants: ['single-kernel', 'deterministic', 'two-kernel'] },
  },
};

/** Former preset names and the preset that runs the same configuration, for the hint an unknown `--preset` gets. */
export const RENAMED_PRESETS: Readonly<Record<string, string>> = {
  'seed-fp32': 'fp32-memory-wall',
  'seed-bf16': 'long-seq-bf16',
  'seed-bwd-kernels': 'bwd-variants',
};

/** The preset a run on `device` starts from when none is named: fa2-grid on CUDA, cpu-small on the CPU. */
export function defaultPresetName(device: Device): 'fa2-grid' | 'cpu-small' {
  return device === 'cuda' ? 'fa2-grid' : 'cpu-small';
}

/** The settings a run starts from on `device` when no preset is named (those of {@link defaultPresetName}). */
export function deviceDefaults(device: Device): GridSettings {
  const base = defaultPresetName(device) === 'fa2-grid' ? FA2_GRID : CPU_SMALL;
  return { ...base, seqlens: [...base.seqlens], headDims: [...base.headDims], causal: [...base.causal], passes: [...base.passes] };
}

/** The text of `--list-presets`. */
export function listPresets(): string {
  const lines = ['Presets (--preset NAME; flags given beside it override its values):', ''];
  for (const p of Object.values(PRESETS)) {
    lines.push(`  ${p.name}  [${p.device}]`, `      ${p.summary}`);
    for (const d of p.details) lines.push(`      ${d}`);
    lines.push('');
  }
  return lines.join('\n');
}
