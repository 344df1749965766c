// Builds the inbox page into dist/ with fixed file names (index.html, inbox.js, inbox.css), so
// the broker embeds known paths and a rebuild from the same sources gives the same bytes.
import { defineConfig } from "vite";

export default defineConfig({
  base: "/",
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2022",
    modulePreload: false,
    assetsInlineLimit: 0,
    cssCodeSplit: false,
    reportCompressedSize: true,
    rollupOptions: {
      output: {
        entryFileNames: "inbox.js",
        chunkFileNames: "inbox-[name].js",
        assetFileNames: "inbox.[ext]",
        inlineDynamicImports: true,
      },
    },
  },
});
