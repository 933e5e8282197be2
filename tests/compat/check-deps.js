// Exits 0 when node_modules holds exactly what package-lock.json pins (as `npm ci` installs
// it), else prints what is missing or different and exits 1. The folder is this script's, or
// the one given as the first argument (tests/ref). Used by run.sh (skip the tests with the
// reason) and scripts/test.sh (skip `npm ci` when nothing changed).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = process.argv[2] ? path.resolve(process.argv[2])
                            : path.dirname(fileURLToPath(import.meta.url));
const read = (f) => JSON.parse(fs.readFileSync(path.join(here, f), 'utf8'));
let problem = null;
try {
  const want = read('package-lock.json').packages;
  // npm writes this "hidden lockfile" on every install: what is actually in node_modules.
  const have = read('node_modules/.package-lock.json').packages;
  for (const [key, pkg] of Object.entries(want)) {
    if (!key.startsWith('node_modules/')) continue;
    const got = have[key];
    // npm ci leaves out platform-specific optional packages (fsevents) and entries npm itself
    // marks extraneous (an optional peer it recorded but does not install).
    if (!got && (pkg.optional || pkg.extraneous)) continue;
    if (!got) problem = `${key.slice(13)} is not installed`;
    else if (got.version !== pkg.version) problem = `${key.slice(13)} is ${got.version}, the lock pins ${pkg.version}`;
    if (problem) break;
  }
  for (const key of Object.keys(have)) {
    if (!problem && !(key in want)) problem = `${key.slice(13)} is installed but not in the lock`;
  }
} catch (err) {
  problem = err.code === 'ENOENT' ? `${path.basename(err.path)} not found` : err.message;
}
if (problem) {
  console.log(`npm packages not as locked: ${problem}`);
  process.exit(1);
}
