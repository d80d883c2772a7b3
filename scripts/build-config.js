#!/usr/bin/env node
// The one place that decides what the native build compiles and how. binding.gyp (node-gyp, used by
// `npm install` and prebuildify) and CMakeLists.txt (cmake-js, the developer build) both call it, so
// the two build descriptions cannot drift apart.
//
// Usage: node scripts/build-config.js <query>
//   sources <cpp|cuda_host|cuda>   space-separated source paths (gyp: relative to the repo root)
//   cuda                           1 when the CUDA sources are built, else 0
//   cuda-home                      the CUDA toolkit root (empty without CUDA)
//   nvcc                           path of nvcc
//   archs                          CUDA architectures, e.g. "80;90a"
//   gencode                        nvcc -gencode flags for those architectures
//   nvcc-flags                     the full nvcc flag list (without -c/-o)
//   defines                        preprocessor definitions shared by every translation unit
//   cpu-only-reason                why the CUDA sources are not built (empty when they are): disabled
//                                  (FA_CUDA=0), nvcc-not-found, or cudart-not-found (nvcc without the
//                                  static CUDA runtime); a CPU-only build records it as FA_CPU_ONLY_REASON
//   headers                        every header under csrc/ (.h, .cuh), repo-relative: the extra inputs
//                                  of binding.gyp's nvcc rule, which has no per-file dependency scan
//   summary                        a human-readable line (printed by the builds)
//
// Environment (all optional; narrow a development build with them):
//   FA_CUDA=0|1        force the CUDA build off, or on (then a missing nvcc is an error)
//   CUDA_HOME / CUDA_PATH   toolkit root (default: the directory of `nvcc` on PATH, or /usr/local/cuda)
//   FA_CUDA_ARCHS      semicolon or comma list, default "80;90a" (sm_80 SASS + PTX covers sm_80/86/89,
//                      sm_90a has the Hopper-only instructions)
//   FA_HEAD_DIMS       comma list of head dims whose kernels are instantiated, default all
//                      (read by the CUDA kernels through FA_HEAD_DIMS_<d> definitions)
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const ALL_HEAD_DIMS = [32, 64, 96, 128, 192, 256];
const DEFAULT_ARCHS = ['80', '90a'];

function readSources() {
  return JSON.parse(fs.readFileSync(path.join(root, 'csrc', 'sources.json'), 'utf8'));
}

function cudaHomeCandidates() {
  const homes = [process.env.CUDA_HOME, process.env.CUDA_PATH].filter(Boolean);
  homes.push('/usr/local/cuda');
  for (const dir of (process.env.PATH || '').split(path.delimiter)) {
    const p = dir && path.join(dir, 'nvcc');
    if (p && fs.existsSync(p)) homes.push(path.dirname(path.dirname(fs.realpathSync(p))));
  }
  return homes;
}

// Why a build has no CUDA, recorded in the addon as FA_CPU_ONLY_REASON=<code> (csrc/napi/addon.cc
// reports it as cpuOnlyReason, and lib/native.ts's CPU-only notice says what to do about it).
const CPU_ONLY_REASON_CODE = { disabled: 1, 'nvcc-not-found': 2, 'cudart-not-found': 3 };

// The first usable toolkit among `homes`: one with nvcc and the static CUDA runtime (the addon links
// cudart_static, so the .node needs no libcudart.so at run time, only the driver). Returns
// { cuda: { nvcc, home, cudart } } or, when none is usable, { cuda: null, reason }: cudart-not-found
// when some candidate had nvcc, nvcc-not-found otherwise.
function findToolkit(homes) {
  let sawNvcc = false;
  for (const home of homes) {
    const nvcc = path.join(home, 'bin', 'nvcc');
    if (!fs.existsSync(nvcc)) continue;
    sawNvcc = true;
    const libDirs = [path.join(home, 'lib64'), path.join(home, 'targets', 'x86_64-linux', 'lib'), path.join(home, 'lib')];
    const libDir = libDirs.find((d) => fs.existsSync(path.join(d, 'libcudart_static.a')));
    if (libDir) return { cuda: { nvcc, home, cudart: path.join(libDir, 'libcudart_static.a') }, reason: null };
  }
  return { cuda: null, reason: sawNvcc ? 'cudart-not-found' : 'nvcc-not-found' };
}

// { cuda, reason }: the toolkit to build with, or null and why not (FA_CUDA=0 gives 'disabled').
function cudaDecision() {
  const want = process.env.FA_CUDA;
  if (want === '0') return { cuda: null, reason: 'disabled' };
  const found = findToolkit(cudaHomeCandidates());
  if (!found.cuda && want === '1') {
    throw new Error('FA_CUDA=1 but no CUDA toolkit with nvcc and libcudart_static.a was found (set CUDA_HOME)');
  }
  return found;
}

function archs() {
  const raw = process.env.FA_CUDA_ARCHS;
  const list = raw ? raw.split(/[;,\s]+/).filter(Boolean) : DEFAULT_ARCHS;
  for (const a of list) {
    if (!/^\d{2,3}a?$/.test(a)) throw new Error(`FA_CUDA_ARCHS: expected entries like 80 or 90a but received "${a}"`);
  }
  return list;
}

function headDims() {
  const raw = process.env.FA_HEAD_DIMS;
  if (!raw) return ALL_HEAD_DIMS;
  const list = raw.split(/[;,\s]+/).filter(Boolean).map(Number);
  for (const d of list) {
    if (!ALL_HEAD_DIMS.includes(d)) {
      throw new Error(`FA_HEAD_DIMS: expected a subset of ${ALL_HEAD_DIMS.join(',')} but received "${raw}"`);
    }
  }
  return list;
}

function gencode() {
  const flags = [];
  const list = archs();
  for (const a of list) flags.push(`-gencode=arch=compute_${a},code=sm_${a}`);
  // PTX of the lowest architecture, so newer GPUs can JIT it.
  const lowest = list.filter((a) => !a.endsWith('a')).sort((x, y) => Number(x) - Number(y))[0];
  if (lowest) flags.push(`-gencode=arch=compute_${lowest},code=compute_${lowest}`);
  return flags;
}

function defines(cuda, cpuOnlyReason) {
  const d = [];
  if (cuda) d.push('FA_WITH_CUDA=1');
  else if (cpuOnlyReason) d.push(`FA_CPU_ONLY_REASON=${CPU_ONLY_REASON_CODE[cpuOnlyReason]}`);
  // The Hopper (wgmma) kernels exist only when the sm_90a target is built.
  if (cuda && archs().includes('90a')) d.push('FA_HAS_SM90A=1');
  for (const h of headDims()) d.push(`FA_HEAD_DIM_${h}=1`);
  return d;
}

// Every header under csrc/, sorted, repo-relative with '/' separators. gyp's make generator scans C++
// sources for their includes but not the outputs of a custom rule: without these as the nvcc rule's
// inputs, an edit to a .cuh left the .cu objects that include it stale (seen: a kernel fix that the
// addon did not contain after `node-gyp build`).
function headers() {
  const found = [];
  const walk = (dir) => {
    for (const e of fs.readdirSync(path.join(root, dir), { withFileTypes: true })) {
      const rel = `${dir}/${e.name}`;
      if (e.isDirectory()) walk(rel);
      else if (/\.(h|cuh)$/.test(e.name)) found.push(rel);
    }
  };
  walk('csrc');
  return found.sort();
}

function nvccFlags() {
  return [
    '-std=c++17', '-O3', '-Xcompiler=-fPIC', '-Xcompiler=-fvisibility=hidden',
    `-I${path.join(root, 'csrc')}`, ...defines(true).map((x) => `-D${x}`), ...gencode(),
  ];
}

const SUMMARY_REASON = {
  disabled: 'FA_CUDA=0 requested a CPU-only build',
  'nvcc-not-found': 'nvcc was not found: set CUDA_HOME or put nvcc on PATH for the CUDA kernels',
  'cudart-not-found': 'nvcc was found but not libcudart_static.a: install the full CUDA toolkit for the CUDA kernels',
};

function main(argv) {
  const [query, arg] = argv;
  const { cuda, reason } = cudaDecision();
  switch (query) {
    case 'sources': {
      const s = readSources();
      if (!Object.prototype.hasOwnProperty.call(s, arg) || arg === '//') {
        throw new Error(`sources: expected cpp, cuda_host or cuda but received "${arg}"`);
      }
      if ((arg === 'cuda' || arg === 'cuda_host') && !cuda) return '';
      return s[arg].join(' ');
    }
    case 'cuda': return cuda ? '1' : '0';
    case 'cuda-home': return cuda ? cuda.home : '';
    case 'cudart': return cuda ? cuda.cudart : '';
    case 'nvcc': return cuda ? cuda.nvcc : '';
    case 'archs': return archs().join(';');
    case 'gencode': return gencode().join(' ');
    case 'nvcc-flags': return cuda ? nvccFlags().join(' ') : '';
    case 'defines': return defines(Boolean(cuda), reason).join(' ');
    case 'cpu-only-reason': return cuda ? '' : reason;
    case 'headers': return headers().join(' ');
    case 'summary':
      return cuda
        ? `flash-attn-node: building with CUDA (${cuda.nvcc}; archs ${archs().join(',')}; head dims ${headDims().join(',')})`
        : `flash-attn-node: building the CPU backend only (${SUMMARY_REASON[reason]})`;
    default:
      throw new Error(`unknown query "${query}"`);
  }
}

if (require.main === module) {
  try {
    process.stdout.write(main(process.argv.slice(2)));
  } catch (e) {
    process.stderr.write(`build-config: ${e.message}\n`);
    process.exit(1);
  }
}

module.exports = { main, readSources, findToolkit, ALL_HEAD_DIMS, CPU_ONLY_REASON_CODE };
