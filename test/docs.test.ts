/**
 * The API reference builds (`npm run docs`: TypeDoc over lib/index.ts and lib/testing.ts, typedoc.json)
 * and every public symbol has documentation: TypeDoc's validation (not documented, not exported,
 * invalid links) runs with warnings as errors.
 */
import { spawnSync } from 'child_process';
import * as path from 'path';

const ROOT = path.resolve(__dirname, '..');

test('TypeDoc builds the API reference with every public symbol documented', () => {
  const manifest = require.resolve('typedoc/package.json', { paths: [ROOT] });
  const typedoc = path.join(path.dirname(manifest), (require(manifest) as { bin: { typedoc: string } }).bin.typedoc);
  const r = spawnSync(process.execPath, [typedoc, '--emit', 'none', '--treatWarningsAsErrors'], {
    cwd: ROOT, encoding: 'utf8', timeout: 120000, env: { ...process.env, NO_COLOR: '1', FORCE_COLOR: '0' },
  });
  expect({ status: r.status, output: (r.stdout + r.stderr).trim() }).toEqual({ status: 0, output: '' });
}, 130000);
