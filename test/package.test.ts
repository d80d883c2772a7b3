/**
 * What `npm pack` puts in the package: the files its README and the docs it ships link to are in it,
 * so no link is broken inside an installed package, and nothing meant for development only is.
 */
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';

const ROOT = path.resolve(__dirname, '..');

/** The paths `npm pack` would include (a dry run, without the lifecycle scripts). */
function packedFiles(): string[] {
  const npmCli = process.env.npm_execpath;
  const [cmd, args] = npmCli && /\.c?js$/.test(npmCli) ? [process.execPath, [npmCli]] : ['npm', []];
  const r = spawnSync(cmd, [...args, 'pack', '--dry-run', '--json', '--ignore-scripts'], {
    cwd: ROOT, encoding: 'utf8', timeout: 120000,
  });
  if (r.status !== 0) throw new Error(`npm pack --dry-run failed (${r.status}): ${r.stderr}`);
  const [report] = JSON.parse(r.stdout) as { files: { path: string }[] }[];
  return report.files.map((f) => f.path);
}

/** Relative link targets of a markdown file (no URL, no bare anchor), as package paths. */
function relativeLinks(mdPath: string): string[] {
  const md = fs.readFileSync(path.join(ROOT, mdPath), 'utf8');
  const targets = new Set<string>();
  for (const m of md.matchAll(/\]\(([^)\s]+)\)/g)) {
    const target = m[1].split('#')[0];
    if (target === '' || /^[a-z][a-z0-9+.-]*:/i.test(target)) continue;
    targets.add(path.posix.normalize(path.posix.join(path.posix.dirname(mdPath), target)));
  }
  return [...targets].sort();
}

describe('npm pack', () => {
  const files = packedFiles();
  const packed = new Set(files);

  test('ships the README and the docs it links to, and every relative link of those resolves inside the package', () => {
    const docs = files.filter((f) => f.endsWith('.md'));
    expect(docs).toContain('README.md');
    const links = relativeLinks('README.md');
    expect(links.length).toBeGreaterThan(0);
    const broken: string[] = [];
    for (const doc of docs) {
      for (const link of relativeLinks(doc)) {
        // A link to a directory resolves when the package holds something under it.
        if (!packed.has(link) && !files.some((f) => f.startsWith(`${link}/`))) broken.push(`${doc} -> ${link}`);
      }
    }
    expect(broken).toEqual([]);
  });

  test('ships the compiled library, the sources a build from source needs, and no tests', () => {
    for (const f of ['dist/lib/index.js', 'dist/lib/index.d.ts', 'binding.gyp', 'CMakeLists.txt', 'scripts/build-config.js']) {
      expect(packed.has(f) || !fs.existsSync(path.join(ROOT, f))).toBe(true);
    }
    expect(files.some((f) => f.startsWith('csrc/'))).toBe(true);
    expect(files.filter((f) => f.startsWith('test/') || f.startsWith('node_modules/'))).toEqual([]);
  });
});
