// Writes a gzip twin (name.gz) of every compressible file of dist/, which
// the server serves to clients that accept gzip. Run after `vite build`.
import { readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync, constants } from 'node:zlib';

const dist = new URL('../dist/', import.meta.url).pathname;
const compressible = /\.(html|js|mjs|css|svg|json|txt|webmanifest)$/;

function walk(dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) walk(path);
    else if (compressible.test(name)) {
      const raw = readFileSync(path);
      const gz = gzipSync(raw, { level: constants.Z_BEST_COMPRESSION });
      if (gz.length < raw.length) writeFileSync(`${path}.gz`, gz);
    }
  }
}
walk(dist);
