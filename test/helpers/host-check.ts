/**
 * The host-only native checks (test/native/*_check.cc with no CUDA): built with the host compiler
 * (`CXX`, default g++; warnings are errors) into a temporary directory, run with `--seed N`.
 */
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

const root = path.resolve(__dirname, '..', '..');
const cxx = process.env.CXX || 'g++';

/** A built check: `run(seed)` gives its stdout and exit status; `remove()` deletes the build. */
export interface HostCheck {
  run(seed: number): { stdout: string; status: number | null };
  remove(): void;
}

/** Builds test/native/`name`.cc; throws with the compiler's output when the build fails. */
export function buildHostCheck(name: string): HostCheck {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `${name}-`));
  const bin = path.join(dir, name);
  const build = spawnSync(cxx, ['-std=c++17', '-O2', '-Wall', '-Wextra', '-Werror', `-I${path.join(root, 'csrc')}`,
    path.join(root, 'test', 'native', `${name}.cc`), '-o', bin], { encoding: 'utf8' });
  if (build.status !== 0) {
    fs.rmSync(dir, { recursive: true, force: true });
    throw new Error(`${cxx} failed to build ${name}.cc:\n${build.stderr}`);
  }
  return {
    run: (seed) => {
      const r = spawnSync(bin, ['--seed', String(seed)], { encoding: 'utf8' });
      return { stdout: r.stdout, status: r.status };
    },
    remove: () => fs.rmSync(dir, { recursive: true, force: true }),
  };
}
