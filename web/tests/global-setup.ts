// Starts `tarn serve` for the browser tests: the debug binary of this
// checkout (or $TARN_BIN), a fresh data directory, a free loopback port and
// an administrator with a random password. Stops it afterwards. Fails —
// never skips — when the binary is missing or was built without the app.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, openSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

export default async function globalSetup() {
  const root = resolve(import.meta.dirname, '../..');
  const bin = process.env.TARN_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(root, 'target'), 'debug', 'tarn');
  if (!existsSync(bin)) {
    throw new Error(`no tarn binary at ${bin}: build it after the app (make test-web does both)`);
  }
  const chromium = process.env.CHROMIUM ?? '/usr/bin/chromium';
  if (!existsSync(chromium)) {
    throw new Error(`no Chromium at ${chromium}: install Debian's chromium (scripts/setup.sh --browser does)`);
  }
  const data = mkdtempSync(join(tmpdir(), 'tarn-web-'));
  const results = resolve(import.meta.dirname, '../test-results');
  mkdirSync(results, { recursive: true });
  const log = openSync(join(results, 'server.log'), 'w');
  const adminPassword = randomBytes(12).toString('base64url');
  const server = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--data', join(data, 'data'), '--app-indexes', 'true'], {
    env: { ...process.env, TARN_ADMIN_PASSWORD: adminPassword, RUST_LOG: process.env.RUST_LOG ?? 'warn' },
    stdio: ['ignore', 'pipe', log],
  });
  const url = await new Promise<string>((ok, fail) => {
    let out = '';
    const timer = setTimeout(() => fail(new Error(`tarn serve did not start: ${out}`)), 60_000);
    server.stdout!.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      const m = /tarn listening on (http:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        ok(m[1]);
      }
    });
    server.on('exit', (code) => fail(new Error(`tarn serve exited (${code}); see test-results/server.log`)));
  });

  const page = await (await fetch(`${url}/`, { headers: { accept: 'text/html' } })).text();
  if (!/<script type="module"[^>]* src="\/assets\//.test(page)) {
    server.kill('SIGTERM');
    throw new Error(`${bin} was built without the web app (npm run build in web/, then cargo build -p tarn)`);
  }

  process.env.TARN_URL = url;
  process.env.TARN_TEST_ADMIN_PASSWORD = adminPassword;
  return async () => {
    server.kill('SIGTERM');
    await new Promise((done) => server.once('exit', done));
    rmSync(data, { recursive: true, force: true });
  };
}
