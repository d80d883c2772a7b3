/**
 * The package this CLI belongs to: its root (the directory whose package.json is named
 * flash-attn-node) and its version, read at run time. The search walks up from this file, so it
 * works from the sources (bench/) and from the compiled CLI (dist/bench/) alike.
 * @packageDocumentation
 */
import * as fs from 'fs';
import * as path from 'path';

/** The `name` in the package's package.json. */
export const PACKAGE_NAME = 'flash-attn-node';

/** What {@link findPackageJson} found: the file and its parsed contents. */
export interface PackageJson {
  path: string;
  name: string;
  version: string;
}

/**
 * The nearest package.json named {@link PACKAGE_NAME} in `start` or a directory above it, or null.
 * Files with another name, or that do not parse, are passed over.
 */
export function findPackageJson(start: string = __dirname): PackageJson | null {
  let dir = path.resolve(start);
  for (;;) {
    const file = path.join(dir, 'package.json');
    try {
      const pkg = JSON.parse(fs.readFileSync(file, 'utf8')) as { name?: unknown; version?: unknown };
      if (pkg.name === PACKAGE_NAME && typeof pkg.version === 'string') return { path: file, name: pkg.name, version: pkg.version };
    } catch {
      // missing, unreadable or not JSON: keep walking up
    }
    const parent = path.dirname(dir);
    if (parent === dir) return null;
    dir = parent;
  }
}

/** The package's version from its package.json; throws when none is found above `start`. */
export function packageVersionFrom(start: string = __dirname): string {
  const pkg = findPackageJson(start);
  if (!pkg) throw new Error(`no package.json named ${PACKAGE_NAME} in ${path.resolve(start)} or above it`);
  return pkg.version;
}
