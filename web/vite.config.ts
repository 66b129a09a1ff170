import { defineConfig } from 'vite';
import preact from '@preact/preset-vite';

// The bundle goes where the console embeds it (console/webui/dist). Nothing
// is inlined into the HTML: the console's Content-Security-Policy allows
// scripts and styles from its own origin only.
export default defineConfig({
  plugins: [preact()],
  base: '/',
  build: {
    outDir: '../console/webui/dist',
    emptyOutDir: true,
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    sourcemap: false,
    reportCompressedSize: true,
    target: 'es2022',
  },
});
