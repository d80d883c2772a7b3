/**
 * Loading the addon: node-gyp-build prefers a local build, falls back to a prebuild in
 * prebuilds/<platform>-<arch>/, and a failed load tells the user what to do next while the float64
 * reference keeps working. Each case lays out a throwaway package (package.json + lib/ + optionally
 * prebuilds/) in a temporary directory and loads it in a child process.
 */
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

import { cpuOnlyNotice, cpuOnlyReasonText } from '../lib/native';
import { LIB_ENTRY, runNodeChild } from './helpers/child';

const root = path.resolve(__dirname, '..');
const prebuildDir = path.join(root, 'prebuilds', `${process.platform}-${process.arch}`);
const hasPrebuild = fs.existsSync(prebuildDir) && fs.readdirSync(prebuildDir).some((f) => f.endsWith('.node'));

/** A package named flash-attn-node with the current lib/ sources and the repo's node_modules. */
function makePackage(withPrebuild: boolean): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-loader-'));
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'flash-attn-node', version: '0.0.0' }));
  fs.cpSync(path.join(root, 'lib'), path.join(dir, 'lib'), { recursive: true });
  fs.symlinkSync(path.join(root, 'node_modules'), path.join(dir, 'node_modules'), 'dir');
  if (withPrebuild) fs.cpSync(path.join(root, 'prebuilds'), path.join(dir, 'prebuilds'), { recursive: true });
  return dir;
}

const probe = `
  const fa = require('./lib/index.ts');
  const report = { backends: fa.backends() };
  try {
    fa.Tensor.fromFloat32Array(new Float32Array(4), [4], { device: 'cpu' });
    report.tensor = 'ok';
  } catch (e) {
    report.tensor = { name: e.name, message: e.message };
  }
  const r = fa.referenceAttention(new Float32Array([1, 0]), new Float32Array([1, 0, 0, 1]), new Float32Array([1, 2, 3, 4]),
    { batch: 1, seqlenQ: 1, seqlenK: 2, headsQ: 1, headsKV: 1, headDim: 2 });
  report.reference = Array.from(r.out);
  process.stdout.write(JSON.stringify(report));
`;

describe('loading the native addon', () => {
  test('a local build (build/Release) is preferred over a prebuild', () => {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    const addon = (require('node-gyp-build') as { resolve(dir: string): string }).resolve(root);
    const dir = makePackage(false);
    try {
      fs.mkdirSync(path.join(dir, 'build', 'Release'), { recursive: true });
      fs.copyFileSync(addon, path.join(dir, 'build', 'Release', 'flash_attn_node.node'));
      const platformDir = path.join(dir, 'prebuilds', `${process.platform}-${process.arch}`);
      fs.mkdirSync(platformDir, { recursive: true });
      fs.copyFileSync(addon, path.join(platformDir, 'flash-attn-node.node'));
      const child = runNodeChild(probe, { cwd: dir });
      expect(child.stderr).toBe('');
      const report = JSON.parse(child.stdout);
      expect(report.backends.native.path).toBe(path.join(fs.realpathSync(dir), 'build', 'Release', 'flash_attn_node.node'));
      expect(report.tensor).toBe('ok');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  (hasPrebuild ? test : test.skip)('without a local build, the prebuild in prebuilds/<platform>-<arch> is loaded', () => {
    const dir = makePackage(true);
    try {
      const child = runNodeChild(probe, { cwd: dir });
      expect(child.stderr).toBe('');
      const report = JSON.parse(child.stdout);
      expect(report.backends.native.loaded).toBe(true);
      expect(report.backends.native.path).toContain(path.join(fs.realpathSync(dir), 'prebuilds'));
      expect(report.backends.cpu.available).toBe(true);
      expect(report.tensor).toBe('ok');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
  if (!hasPrebuild) {
    test.skip(`prebuild fallback: skipped because ${prebuildDir} has no .node (run \`npm run prebuild\`)`, () => undefined);
  }

  test('with no binary at all, the error says what to do next and the reference still works', () => {
    const dir = makePackage(false);
    try {
      const child = runNodeChild(probe, { cwd: dir });
      expect(child.stderr).toBe('');
      const report = JSON.parse(child.stdout);
      expect(report.backends.native.loaded).toBe(false);
      expect(report.backends.cpu).toMatchObject({ available: false, kernels: [] });
      expect(report.backends.native.error).toContain('flash-attn-node: the native addon could not be loaded');
      expect(report.backends.native.error).toContain('npm rebuild flash-attn-node');
      expect(report.backends.native.error).toContain(path.join('prebuilds', `${process.platform}-${process.arch}`));
      expect(report.tensor.name).toBe('NativeLoadError');
      expect(report.tensor.message).toContain('What to do next');
      // scores 1/√2 and 0 (scale 1/√2); values 1 and 3 in the first column
      expect(report.reference[0]).toBeCloseTo((Math.exp(Math.SQRT1_2) * 1 + 3) / (Math.exp(Math.SQRT1_2) + 1), 12);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the CPU-only notice names the reason the build recorded', () => {
  test('FA_CUDA=0: names FA_CUDA=0 as the reason, not nvcc, and how to get a CUDA build', () => {
    const notice = cpuOnlyNotice('disabled');
    expect(notice.message).toBe(
      'flash-attn-node was built without CUDA (FA_CUDA=0 requested a CPU-only build): only the CPU backend is available',
    );
    expect(notice.detail).toContain('FA_CUDA=1 npm rebuild flash-attn-node');
    expect(notice.detail).toContain('FLASH_ATTN_NODE_QUIET=1');
    expect(`${notice.message} ${notice.detail}`).not.toMatch(/nvcc/i);
    expect(cpuOnlyReasonText('disabled')).toContain('FA_CUDA=0 requested a CPU-only build');
    expect(cpuOnlyReasonText('disabled')).not.toMatch(/nvcc/i);
  });

  test('nvcc missing: names nvcc and where to point the build', () => {
    const notice = cpuOnlyNotice('nvcc-not-found');
    expect(notice.message).toContain('(nvcc was not found when the addon was built)');
    expect(notice.message).not.toContain('FA_CUDA=0');
    expect(notice.detail).toContain('install the CUDA toolkit, set CUDA_HOME');
    expect(notice.detail).toContain('npm rebuild flash-attn-node');
  });

  test('nvcc without the static runtime: names libcudart_static.a', () => {
    const notice = cpuOnlyNotice('cudart-not-found');
    expect(notice.message).toContain('not the static CUDA runtime (libcudart_static.a)');
    expect(notice.detail).toContain('install the full CUDA toolkit');
    expect(notice.detail).toContain('npm rebuild flash-attn-node');
  });

  test('an unrecorded or unrecognised reason says so rather than guessing', () => {
    for (const reason of ['unknown', undefined, null, 'something-else', 3, '__proto__', 'toString']) {
      const notice = cpuOnlyNotice(reason);
      expect(notice.message).toContain('(the build did not record why)');
      expect(notice.detail).toContain('npm rebuild flash-attn-node');
      expect(cpuOnlyReasonText(reason)).toContain('compiled without CUDA (the build did not record why)');
    }
  });

  // The loader's wiring: the addon's cudaCompiled / cpuOnlyReason are replaced as it loads (a .node
  // loader hook in a child process), so every reason is exercised whatever this checkout's build is.
  const loadAs = (cpuOnlyReason: string | undefined): {
    warnings: { name: string; code: string; message: string; detail: string }[];
    cudaReason: string;
    compiled: boolean;
  } => {
    const script = `
      const Module = require('module');
      const loadNode = Module._extensions['.node'];
      Module._extensions['.node'] = (m, filename) => {
        loadNode(m, filename);
        m.exports.cudaCompiled = false;
        ${cpuOnlyReason === undefined ? 'delete m.exports.cpuOnlyReason;' : `m.exports.cpuOnlyReason = ${JSON.stringify(cpuOnlyReason)};`}
      };
      const warnings = [];
      process.on('warning', (w) => warnings.push({ name: w.name, code: w.code, message: w.message, detail: w.detail }));
      const fa = require(${JSON.stringify(LIB_ENTRY)});
      const b = fa.backends();
      process.on('exit', () => process.stdout.write(JSON.stringify({ warnings, cudaReason: b.cuda.reason, compiled: b.cuda.compiled })));
    `;
    const child = runNodeChild(`${script}`, {
      cwd: root, env: { FLASH_ATTN_NODE_QUIET: '' }, nodeArgs: ['--no-warnings'],
    });
    expect(child.stderr).toBe('');
    expect(child.status).toBe(0);
    return JSON.parse(child.stdout);
  };

  test.each([
    ['disabled', 'FA_CUDA=0 requested a CPU-only build'],
    ['nvcc-not-found', 'nvcc was not found when the addon was built'],
    ['cudart-not-found', 'libcudart_static.a'],
  ])('loading a CPU-only addon built with reason %s warns once with it, and backends().cuda.reason agrees', (reason, text) => {
    const report = loadAs(reason);
    expect(report.warnings).toEqual([{ name: 'Warning', code: 'FLASH_ATTN_NODE_CPU_ONLY', ...cpuOnlyNotice(reason) }]);
    expect(report.warnings[0].message).toContain(text);
    expect(report.compiled).toBe(false);
    expect(report.cudaReason).toBe(cpuOnlyReasonText(reason));
    expect(report.cudaReason).toContain(text);
  });

  test('an addon without cpuOnlyReason (built before it was recorded) gets the unrecorded-reason notice', () => {
    const report = loadAs(undefined);
    expect(report.warnings).toEqual([{ name: 'Warning', code: 'FLASH_ATTN_NODE_CPU_ONLY', ...cpuOnlyNotice('unknown') }]);
  });
});
