// Runs a host's real binary the way a user would from a shell, with an environment built from
// nothing (so no API key, proxy or broker setting of the machine leaks in): the PATH holds the
// broker (`approval-broker`), the Node 22 the tests run on, and the system's directories; HOME is
// the test's own directory, where the host's settings are written. A run that outlives its time
// is killed with its process group and reported as such.
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { binDirectory } from "./broker.mjs";

/** A fresh directory for one test: `home` (the host's HOME), `workspace` (its cwd), `bin`. */
export function testDirectories(name) {
  const root = mkdtempSync(join(tmpdir(), `hosts-${name}-`));
  const home = join(root, "home");
  const workspace = join(root, "workspace");
  mkdirSync(home);
  mkdirSync(workspace);
  return { root, home, workspace, bin: binDirectory(root), remove: () => rmSync(root, { recursive: true, force: true }) };
}

/** The environment a host runs with: only what is listed here, plus `extra`. */
export function hostEnvironment(dirs, extra = {}) {
  return {
    PATH: [dirs.bin, dirname(process.execPath), "/usr/local/bin", "/usr/bin", "/bin"].join(":"),
    HOME: dirs.home,
    TMPDIR: process.env.TMPDIR ?? "/tmp",
    LANG: "C.UTF-8",
    TERM: "dumb",
    CI: "true",
    NO_COLOR: "1",
    // Nothing but loopback: were a host to try a proxy-aware request elsewhere, it fails here.
    NO_PROXY: "127.0.0.1,localhost",
    ...extra,
  };
}

/**
 * Runs `command args` in `cwd` with `env`; resolves `{ code, signal, stdout, stderr, timedOut }`
 * when it exits (standard input is closed unless `input` is given).
 */
export function runHost(command, args, { cwd, env, timeoutMs = 180_000, input } = {}) {
  return new Promise((resolveRun, reject) => {
    const child = spawn(command, args, { cwd, env, stdio: ["pipe", "pipe", "pipe"], detached: true });
    let stdout = "";
    let stderr = "";
    let timedOut = false;
    child.stdout.on("data", (chunk) => {
      stdout += chunk;
    });
    child.stderr.on("data", (chunk) => {
      stderr += chunk;
    });
    child.stdin.end(input ?? "");
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {
        child.kill("SIGKILL");
      }
    }, timeoutMs);
    child.on("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolveRun({ code, signal, stdout, stderr, timedOut });
    });
  });
}

/** Fails with the run's output when it did not exit 0. */
export function assertExitedCleanly(run, what) {
  if (run.code !== 0 || run.timedOut) {
    throw new Error(
      `${what} exited with ${run.timedOut ? "a timeout" : (run.signal ?? run.code)}\n--- stdout ---\n${run.stdout.slice(-4000)}\n--- stderr ---\n${run.stderr.slice(-4000)}`,
    );
  }
}

/** A tool-call id unique to this run, with the host's usual prefix. */
let counter = 0;
export function newCallId(prefix) {
  counter += 1;
  return `${prefix}${process.pid.toString(36)}${Date.now().toString(36)}${counter}`;
}
