// Bundles src/ into runstate_server/console/static/ (index.html, app.js, app.css): fixed names,
// minified, no source map, no timestamp, so the same sources always give the same bytes (the
// built files are committed; tests/test_console_build.py rebuilds and compares them).
import { build } from "esbuild";
import { copyFileSync, mkdirSync, readdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = process.argv[2] ?? join(here, "..", "runstate_server", "console", "static");
const FILES = new Set(["index.html", "app.js", "app.css"]);

mkdirSync(out, { recursive: true });
for (const name of readdirSync(out)) {
  if (!FILES.has(name)) rmSync(join(out, name), { recursive: true, force: true });
}
await build({
  entryPoints: { app: join(here, "src", "main.tsx") },
  outdir: out,
  bundle: true,
  minify: true,
  format: "iife",
  target: ["es2020"],
  jsx: "automatic",
  jsxImportSource: "preact",
  sourcemap: false,
  legalComments: "none",
  charset: "utf8",
  logLevel: "warning",
  absWorkingDir: here,
});
copyFileSync(join(here, "index.html"), join(out, "index.html"));
