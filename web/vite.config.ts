import { svelte } from '@sveltejs/vite-plugin-svelte';
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

// The typed client lives in clients/typescript (the first SDK) and is
// compiled into the app from its source; its one dependency, openapi-fetch,
// comes from this package's node_modules.
const client = fileURLToPath(new URL('../clients/typescript/src/index.ts', import.meta.url));

export default defineConfig({
  plugins: [svelte()],
  resolve: {
    alias: { '@tarn/client': client },
    dedupe: ['openapi-fetch'],
  },
  build: {
    // No inline script anywhere: the page's policy forbids it.
    modulePreload: { polyfill: false },
    assetsInlineLimit: 0,
    target: 'es2022',
    sourcemap: false,
  },
  server: {
    fs: { allow: ['..'] },
    // `npm run dev` against a `tarn serve` on the default port.
    proxy: { '/api': 'http://127.0.0.1:7700', '/metrics': 'http://127.0.0.1:7700' },
  },
});
