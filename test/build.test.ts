/**
 * The two build descriptions compile the same sources: binding.gyp (node-gyp: npm install's
 * fallback and prebuildify) and CMakeLists.txt (cmake-js: the developer build) both take the list
 * from csrc/sources.json through scripts/build-config.js. These tests catch drift: a source file
 * that is on disk but not listed, a list entry that does not exist, a build file that names
 * sources itself, and a generated build that compiles something else than the list. Likewise the
 * numeric codes shared by lib/ and csrc/ come from one file (csrc/enums.json).
 */
import { execFileSync, spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

const root = path.resolve(__dirname, '..');
// eslint-disable-next-line @typescript-eslint/no-var-requires
const config = require(path.join(root, 'scripts', 'build-config.js')) as {
  main(argv: string[]): string;
  readSources(): Record<string, string[]>;
  findToolkit(homes: string[]): { cuda: { nvcc: string; home: string; cudart: string } | null; reason: string | null };
  CPU_ONLY_REASON_CODE: Record<string, number>;
};

const sources = config.readSources();
const listed = [...sources.cpp, ...sources.cuda_host, ...sources.cuda];
const cudaBuilt = config.main(['cuda']) === '1';
const expected = new Set(cudaBuilt ? listed : sources.cpp);

function sourcesOnDisk(): string[] {
  const found: string[] = [];
  const walk = (dir: string): void => {
    for (const e of fs.readdirSync(path.join(root, dir), { withFileTypes: true })) {
      const rel = `${dir}/${e.name}`;
      if (e.isDirectory()) walk(rel);
      else if (/\.(cc|cpp|cu)$/.test(e.name)) found.push(rel);
    }
  };
  walk('csrc');
  return found.sort();
}

describe('the source list (csrc/sources.json)', () => {
  test('lists every native source on disk, and only files that exist', () => {
    expect([...listed].sort()).toEqual(sourcesOnDisk());
  });

  test('has no duplicates', () => {
    expect(new Set(listed).size).toBe(listed.length);
  });

  test('build-config.js prints it for gyp, per group', () => {
    expect(config.main(['sources', 'cpp']).split(' ')).toEqual(sources.cpp);
    expect(() => config.main(['sources', 'nope'])).toThrow('expected cpp, cuda_host or cuda but received "nope"');
  });
});

describe('the numeric codes of the JS <-> C++ contract (csrc/enums.json)', () => {
  test('csrc/common/enum_codes.h and lib/enum-codes.ts are what scripts/gen-enums.js writes from it', () => {
    const run = spawnSync(process.execPath, [path.join(root, 'scripts', 'gen-enums.js'), '--check'], { encoding: 'utf8' });
    expect({ status: run.status, stderr: run.stderr }).toEqual({ status: 0, stderr: '' });
  });

  test('the check names a file that drifted', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-enums-'));
    try {
      for (const rel of ['scripts/gen-enums.js', 'csrc/enums.json', 'csrc/common/enum_codes.h', 'lib/enum-codes.ts']) {
        fs.mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
        fs.copyFileSync(path.join(root, rel), path.join(dir, rel));
      }
      const ts = path.join(dir, 'lib', 'enum-codes.ts');
      fs.writeFileSync(ts, fs.readFileSync(ts, 'utf8').replace('cuda: 1', 'cuda: 2'));
      const run = spawnSync(process.execPath, [path.join(dir, 'scripts', 'gen-enums.js'), '--check'], { encoding: 'utf8' });
      expect(run.status).toBe(1);
      expect(run.stderr).toContain('lib/enum-codes.ts differs from csrc/enums.json');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('build files take their sources from the list', () => {
  const literalSource = /csrc\/[\w/]+\.(cc|cpp|cu)\b/;

  test('binding.gyp names no source itself and asks build-config.js for every group', () => {
    const gyp = fs.readFileSync(path.join(root, 'binding.gyp'), 'utf8');
    expect(gyp).not.toMatch(literalSource);
    for (const group of ['cpp', 'cuda_host', 'cuda']) expect(gyp).toContain(`build-config.js sources ${group}`);
  });

  test('CMakeLists.txt names no source itself and asks build-config.js for every group', () => {
    const cmake = fs.readFileSync(path.join(root, 'CMakeLists.txt'), 'utf8');
    expect(cmake).not.toMatch(literalSource);
    for (const group of ['cpp', 'cuda_host', 'cuda']) expect(cmake).toMatch(new RegExp(`fa_query\\(\\w+ sources ${group}\\)`));
  });
});

describe('generated builds compile exactly the list', () => {
  // node-gyp's makefile for the addon, present after `npm install` / `npm run build:gyp`.
  const gypMakefile = path.join(root, 'build', 'flash_attn_node.target.mk');
  const hasGypBuild = fs.existsSync(gypMakefile);
  const testGyp = hasGypBuild ? test : test.skip;
  if (!hasGypBuild) {
    test.skip('node-gyp build check: skipped because build/flash_attn_node.target.mk is missing (run `npm run build:gyp`)', () => undefined);
  }
  testGyp('node-gyp (build/flash_attn_node.target.mk)', () => {
    const mk = fs.readFileSync(gypMakefile, 'utf8');
    const objs = mk.slice(mk.indexOf('OBJS :='), mk.indexOf('\n\n', mk.indexOf('OBJS :=')));
    const compiled = new Set<string>();
    for (const m of objs.matchAll(/\$\(TARGET\)\/(csrc\/[\w/]+)\.o/g)) {
      const base = m[1];
      const src = ['.cc', '.cpp'].map((ext) => base + ext).find((p) => fs.existsSync(path.join(root, p)));
      compiled.add(src ?? base);
    }
    // nvcc rule outputs: geni/<name>.cu.o
    for (const m of mk.matchAll(/\$\(srcdir\)\/(csrc\/[\w/]+\.cu) /g)) compiled.add(m[1]);
    const gypHasCuda = /-DFA_WITH_CUDA=1|FA_WITH_CUDA=1/.test(mk);
    expect([...compiled].sort()).toEqual([...(gypHasCuda ? listed : sources.cpp)].sort());
  });

  // Configure (not build) the cmake-js project in a temporary directory: CMake writes
  // compile_commands.json at configure time.
  const hasCmake = spawnSync('cmake', ['--version']).status === 0;
  const testCmake = hasCmake ? test : test.skip;
  testCmake('cmake-js (compile_commands.json of a fresh configure)', () => {
    const out = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-cmake-'));
    try {
      const cmakeJs = path.join(root, 'node_modules', 'cmake-js', 'bin', 'cmake-js');
      execFileSync(process.execPath, [cmakeJs, 'configure', '--out', out, '-G', 'Ninja'], { cwd: root, stdio: 'pipe' });
      const db = JSON.parse(fs.readFileSync(path.join(out, 'compile_commands.json'), 'utf8')) as { file: string }[];
      const compiled = db.map((e) => path.relative(root, e.file)).sort();
      expect(compiled).toEqual([...expected].sort());
    } finally {
      fs.rmSync(out, { recursive: true, force: true });
    }
  }, 120_000);
  if (!hasCmake) test.skip('cmake-js configure: skipped because cmake is not installed', () => undefined);
});

describe('narrowing a development build', () => {
  const run = (env: Record<string, string>, query: string[]): string =>
    execFileSync(process.execPath, [path.join(root, 'scripts', 'build-config.js'), ...query], {
      env: { ...process.env, ...env },
      encoding: 'utf8',
    });

  test('FA_CUDA_ARCHS picks the architectures', () => {
    expect(run({ FA_CUDA_ARCHS: '90a' }, ['gencode'])).toBe('-gencode=arch=compute_90a,code=sm_90a');
    expect(run({ FA_CUDA_ARCHS: '80,86' }, ['gencode'])).toBe(
      '-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_86,code=sm_86 -gencode=arch=compute_80,code=compute_80',
    );
    expect(run({}, ['archs'])).toBe('80;90a');
  });

  test('FA_HEAD_DIMS picks the head dims, and rejects others', () => {
    expect(run({ FA_HEAD_DIMS: '64,128' }, ['defines']).split(' ').filter((d) => d.startsWith('FA_HEAD_DIM_'))).toEqual([
      'FA_HEAD_DIM_64=1',
      'FA_HEAD_DIM_128=1',
    ]);
    const bad = spawnSync(process.execPath, [path.join(root, 'scripts', 'build-config.js'), 'defines'], {
      env: { ...process.env, FA_HEAD_DIMS: '65' },
      encoding: 'utf8',
    });
    expect(bad.status).toBe(1);
    expect(bad.stderr).toContain('FA_HEAD_DIMS: expected a subset of 32,64,96,128,192,256 but received "65"');
  });

  test('FA_CUDA=0 builds the CPU backend only, and records that as the reason', () => {
    expect(run({ FA_CUDA: '0' }, ['cuda'])).toBe('0');
    expect(run({ FA_CUDA: '0' }, ['sources', 'cuda'])).toBe('');
    expect(run({ FA_CUDA: '0' }, ['cpu-only-reason'])).toBe('disabled');
    expect(run({ FA_CUDA: '0' }, ['defines']).split(' ')).toContain('FA_CPU_ONLY_REASON=1');
    expect(run({ FA_CUDA: '0' }, ['nvcc-flags'])).toBe('');
    const summary = run({ FA_CUDA: '0' }, ['summary']);
    expect(summary).toBe('flash-attn-node: building the CPU backend only (FA_CUDA=0 requested a CPU-only build)');
    expect(summary).not.toMatch(/nvcc/i);
  });

  test('a CUDA build records no CPU-only reason', () => {
    const cuda = config.main(['cuda']) === '1';
    expect(config.main(['cpu-only-reason']) === '').toBe(cuda);
    const defines = config.main(['defines']).split(' ');
    expect(defines.some((d) => d.startsWith('FA_CPU_ONLY_REASON='))).toBe(!cuda);
    expect(defines.includes('FA_WITH_CUDA=1')).toBe(cuda);
  });

  test('the toolkit search tells a missing nvcc from a missing static runtime', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fa-toolkit-'));
    try {
      const home = (name: string, files: string[]): string => {
        for (const f of files) {
          fs.mkdirSync(path.dirname(path.join(dir, name, f)), { recursive: true });
          fs.writeFileSync(path.join(dir, name, f), '');
        }
        fs.mkdirSync(path.join(dir, name), { recursive: true });
        return path.join(dir, name);
      };
      const empty = home('empty', []);
      const nvccOnly = home('nvcc-only', ['bin/nvcc', 'lib64/libcudart.so']);
      const full = home('full', ['bin/nvcc', 'targets/x86_64-linux/lib/libcudart_static.a']);
      expect(config.findToolkit([])).toEqual({ cuda: null, reason: 'nvcc-not-found' });
      expect(config.findToolkit([empty, path.join(dir, 'absent')])).toEqual({ cuda: null, reason: 'nvcc-not-found' });
      expect(config.findToolkit([empty, nvccOnly])).toEqual({ cuda: null, reason: 'cudart-not-found' });
      expect(config.findToolkit([nvccOnly, full])).toEqual({
        cuda: {
          nvcc: path.join(full, 'bin', 'nvcc'), home: full,
          cudart: path.join(full, 'targets', 'x86_64-linux', 'lib', 'libcudart_static.a'),
        },
        reason: null,
      });
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('each CPU-only reason has its own FA_CPU_ONLY_REASON code', () => {
    expect(config.CPU_ONLY_REASON_CODE).toEqual({ disabled: 1, 'nvcc-not-found': 2, 'cudart-not-found': 3 });
  });
});

describe('the addon reports the CPU-only reason its build recorded', () => {
  const gypMakefile = path.join(root, 'build', 'flash_attn_node.target.mk');
  const hasGypBuild = fs.existsSync(gypMakefile);
  if (!hasGypBuild) {
    test.skip('skipped because build/flash_attn_node.target.mk is missing (run `npm run build:gyp`)', () => undefined);
  }
  (hasGypBuild ? test : test.skip)('node-gyp build: cpuOnlyReason matches the FA_CPU_ONLY_REASON it was compiled with', () => {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    const { binding } = require('../lib/native') as typeof import('../lib/native');
    const mk = fs.readFileSync(gypMakefile, 'utf8');
    const code = /-DFA_CPU_ONLY_REASON=(\d+)/.exec(mk)?.[1];
    const b = binding();
    if (/-DFA_WITH_CUDA=1/.test(mk)) {
      expect(b.cudaCompiled).toBe(true);
      expect(b.cpuOnlyReason).toBeNull();
    } else {
      expect(b.cudaCompiled).toBe(false);
      const name = Object.entries(config.CPU_ONLY_REASON_CODE).find(([, c]) => String(c) === code)?.[0] ?? 'unknown';
      expect(b.cpuOnlyReason).toBe(name);
    }
  });
});
