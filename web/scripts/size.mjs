// Fails when the app's JavaScript is 200 KB or more gzipped (all of
// dist/assets/*.js, each compressed as the server sends it). Prints the
// figure either way. A size, not a time: it is the same on every machine.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync, constants } from 'node:zlib';

const LIMIT = 200 * 1024;
const assets = new URL('../dist/assets/', import.meta.url).pathname;
let raw = 0;
let gz = 0;
const files = readdirSync(assets).filter((f) => f.endsWith('.js'));
if (files.length === 0) {
  console.error('size: no JavaScript in dist/assets; run npm run build first');
  process.exit(1);
}
for (const f of files) {
  const bytes = readFileSync(join(assets, f));
  raw += bytes.length;
  gz += gzipSync(bytes, { level: constants.Z_BEST_COMPRESSION }).length;
}
const kb = (n) => (n / 1024).toFixed(1);
console.log(`size: ${files.length} JavaScript file(s), ${kb(raw)} KB, ${kb(gz)} KB gzipped (limit ${kb(LIMIT)} KB)`);
if (gz >= LIMIT) {
  console.error('size: over the limit');
  process.exit(1);
}
