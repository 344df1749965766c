// Runs the buf binary pinned in package-lock.json for this machine (@bufbuild/buf-linux-x64 or
// -aarch64). Not through the @bufbuild/buf wrapper: its lockfile would need every platform's
// package, and the registry CI reaches does not carry them all.
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

const arch = { x64: "x64", arm64: "aarch64" }[process.arch];
const name = `@bufbuild/buf-${process.platform}-${arch}`;
let binary;
try {
  binary = join(dirname(createRequire(import.meta.url).resolve(`${name}/package.json`)), "bin", "buf");
} catch {
  console.error(`buf: no ${name} installed; the inbox is built on Linux x64 or aarch64 (npm ci there)`);
  process.exit(1);
}
const run = spawnSync(binary, process.argv.slice(2), { stdio: "inherit" });
process.exit(run.status ?? 1);
