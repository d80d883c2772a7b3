/**
 * Runs a script in a child `node` that loads the TypeScript sources of lib/ directly (a require hook
 * that transpiles .ts with the installed TypeScript), so the child tests the current sources and
 * needs no dist/ build. Used where a test needs a fresh process: --expose-gc, or a package layout
 * without a local build.
 */
import { spawnSync, SpawnSyncReturns } from 'child_process';
import * as path from 'path';

/** The TypeScript entry point of lib/, for `require` in a child process or a worker (through the hook below). */
export const LIB_ENTRY = path.resolve(__dirname, '..', '..', 'lib', 'index.ts');
/** The TypeScript entry point of the test hooks (`flash-attn-node/testing`), as {@link LIB_ENTRY}. */
export const TESTING_ENTRY = path.resolve(__dirname, '..', '..', 'lib', 'testing.ts');

/** JS source that installs the .ts require hook in the child. */
export function tsRequireHook(): string {
  return `
    require.extensions['.ts'] = (m, filename) => {
      const ts = require(${JSON.stringify(require.resolve('typescript'))});
      const src = require('fs').readFileSync(filename, 'utf8');
      const out = ts.transpileModule(src, {
        fileName: filename,
        compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022, esModuleInterop: true },
      });
      m._compile(out.outputText, filename);
    };
  `;
}

/** Runs `script` (after the hook) in `node [nodeArgs] -e`, with FLASH_ATTN_NODE_QUIET set. */
export function runNodeChild(
  script: string,
  options: { cwd: string; env?: Record<string, string>; nodeArgs?: string[]; timeoutMs?: number },
): SpawnSyncReturns<string> {
  return spawnSync(process.execPath, [...(options.nodeArgs ?? []), '-e', tsRequireHook() + script], {
    cwd: options.cwd,
    env: { ...process.env, FLASH_ATTN_NODE_QUIET: '1', ...options.env },
    encoding: 'utf8',
    timeout: options.timeoutMs ?? 60000,
  });
}
