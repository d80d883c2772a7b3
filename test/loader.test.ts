/**
 * Loading the addon: node-gyp-build prefers a local build, falls back to a prebuild in
 * prebuilds/<platform>-<arch>/, and a failed load tells the user what to do next while the float64
 * reference keeps working. Each case lays out a throwaway package (package.json + lib/ + optionally
 * prebuilds/) in a temporary directory and loads it in a child process.
 */
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

import { runNodeChild } from './helpers/child';

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
