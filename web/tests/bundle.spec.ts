// The app as the server sends it: every script the first page loads, from
// this origin, and all of them together under 200 KB gzipped (the issue's
// budget; `npm run size` checks the same of dist/ before the server is
// built).
import { gzipSync, constants } from 'node:zlib';
import { request as http } from '@playwright/test';
import { expect, test, url } from './support';

const LIMIT = 200 * 1024;

test('the JavaScript the first page loads is under 200 KB gzipped', async () => {
  const request = await http.newContext({ baseURL: url() });
  const page = await request.get('/', { headers: { accept: 'text/html' } });
  expect(page.status()).toBe(200);
  const html = await page.text();
  const sources = [...html.matchAll(/<script\b[^>]*\bsrc="([^"]+)"/g)].map((m) => m[1]);
  expect(sources.length, 'the page loads at least one script').toBeGreaterThan(0);
  // No inline script: every <script> has a src.
  expect([...html.matchAll(/<script\b/g)].length).toBe(sources.length);
  let raw = 0;
  let gzipped = 0;
  for (const src of sources) {
    expect(src.startsWith('/assets/'), src).toBe(true);
    const r = await request.get(src);
    expect(r.status(), src).toBe(200);
    const body = await r.body();
    raw += body.length;
    gzipped += gzipSync(body, { level: constants.Z_BEST_COMPRESSION }).length;
  }
  console.log(`bundle: ${sources.length} script(s), ${(raw / 1024).toFixed(1)} KB, ${(gzipped / 1024).toFixed(1)} KB gzipped`);
  expect(gzipped).toBeLessThan(LIMIT);
  await request.dispose();
});
