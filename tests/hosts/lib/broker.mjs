// A real broker for the host tests: the binary built from this checkout, on a free port of
// 127.0.0.1, with a fresh SQLite file in a temporary directory (as clients/typescript's tests
// start it), and the approver's and operator's gRPC clients the tests decide and explain with.
// `APPROVAL_BROKER_BIN` names the binary; by default `$CARGO_TARGET_DIR/debug/approval-broker`
// (or the repository's `target/`). The hosts find it as `approval-broker` on the PATH
// (`binDirectory`), exactly as the documented configuration names it.
import { spawn } from "node:child_process";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const HERE = dirname(fileURLToPath(import.meta.url));
/** The repository root (this file is tests/hosts/lib/broker.mjs). */
export const REPO = resolve(HERE, "../../..");
const START_TIMEOUT_MS = 60_000;

export function brokerBinary() {
  if (process.env.APPROVAL_BROKER_BIN) return process.env.APPROVAL_BROKER_BIN;
  let target = process.env.CARGO_TARGET_DIR || join(REPO, "target");
  if (!isAbsolute(target)) target = join(REPO, target);
  return join(target, "debug", "approval-broker");
}

/** A directory holding only `approval-broker` (a link to the binary under test), for the PATH. */
export function binDirectory(parent) {
  const dir = join(parent, "bin");
  mkdirSync(dir, { recursive: true });
  if (!existsSync(join(dir, "approval-broker"))) symlinkSync(brokerBinary(), join(dir, "approval-broker"));
  return dir;
}

export async function freePort() {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolvePort(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const packageDefinition = protoLoader.loadSync(
  ["approvals/v1/approver.proto", "approvals/v1/admin.proto", "approvals/v1/agent.proto"],
  { includeDirs: [join(REPO, "proto")], keepCase: false, longs: String, enums: String, defaults: true, oneofs: true },
);
const v1 = grpc.loadPackageDefinition(packageDefinition).approvals.v1;

/** Calls a unary method of a grpc-js client as a promise. */
function unary(client, method, request) {
  return new Promise((resolveCall, reject) => {
    client[method](request, { deadline: Date.now() + 10_000 }, (error, reply) => (error ? reject(error) : resolveCall(reply)));
  });
}

/** One broker process with a fresh database; `stop()` kills it, `dispose()` removes its files. */
export class Broker {
  constructor() {
    this.directory = mkdtempSync(join(tmpdir(), "approval-broker-hosts-"));
    this.port = 0;
    this.child = undefined;
  }

  static async started() {
    const broker = new Broker();
    await broker.start();
    return broker;
  }

  get target() {
    return `127.0.0.1:${this.port}`;
  }

  /** The address hooks are given (`--broker`). */
  get url() {
    return `http://${this.target}`;
  }

  get logFile() {
    return join(this.directory, "broker.log");
  }

  log() {
    return existsSync(this.logFile) ? readFileSync(this.logFile, "utf8") : "";
  }

  async start() {
    const binary = brokerBinary();
    if (!existsSync(binary)) throw new Error(`no broker binary at ${binary}: run \`cargo build --locked --bin approval-broker\``);
    for (let attempt = 0; attempt < 5; attempt++) {
      this.port = await freePort();
      const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("APPROVALS_") && k !== "DATABASE_URL"));
      const log = openSync(this.logFile, "a");
      const database = `sqlite://${join(this.directory, "approvals.db")}`;
      const child = spawn(binary, ["--listen", this.target, "--metrics-listen", "off", "--database-url", database], {
        cwd: this.directory,
        stdio: ["ignore", log, log],
        env,
      });
      closeSync(log);
      this.child = child;
      this.approver = new v1.ApproverService(this.target, grpc.credentials.createInsecure());
      this.admin = new v1.AdminService(this.target, grpc.credentials.createInsecure());
      if (await this.waitUntilServing(child)) return;
      if (!this.log().includes("Address already in use")) break;
    }
    throw new Error(`the broker exited during start:\n${this.log()}`);
  }

  async waitUntilServing(child) {
    const deadline = Date.now() + START_TIMEOUT_MS;
    while (Date.now() < deadline) {
      if (child.exitCode !== null || child.signalCode !== null) return false;
      try {
        await unary(this.approver, "listPending", { pageSize: 1 });
        return true;
      } catch {
        await sleep(100);
      }
    }
    throw new Error(`the broker did not serve within ${START_TIMEOUT_MS / 1000}s:\n${this.log()}`);
  }

  async stop() {
    const child = this.child;
    this.child = undefined;
    this.approver?.close();
    this.admin?.close();
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
    await exited;
    clearTimeout(timer);
  }

  async dispose() {
    await this.stop();
    rmSync(this.directory, { recursive: true, force: true });
  }

  // --- the approver ------------------------------------------------------------------------

  async pending(filter = {}) {
    return (await unary(this.approver, "listPending", { filter, pageSize: 1000 })).calls;
  }

  /** Waits until a call with this call id (the host's own tool-call id) is pending; returns it. */
  async waitForPending(callId, timeoutMs = 60_000) {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const call = (await this.pending()).find((c) => c.callId === callId);
      if (call) return call;
      await sleep(100);
    }
    throw new Error(`no pending call ${callId} within ${timeoutMs / 1000}s; pending: ${JSON.stringify(await this.pending())}`);
  }

  /**
   * Waits until the first pending call the predicate accepts; returns it. `gaveUp()` ends the
   * wait early with its error (the host exited, say); it returns undefined to go on.
   */
  async waitForPendingWhere(predicate, what, timeoutMs = 60_000, gaveUp = () => undefined) {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const reason = gaveUp();
      if (reason !== undefined) throw new Error(`no pending call (${what}): ${reason}`);
      const call = (await this.pending()).find(predicate);
      if (call) return call;
      await sleep(100);
    }
    throw new Error(`no pending call (${what}) within ${timeoutMs / 1000}s; pending: ${JSON.stringify(await this.pending())}`);
  }

  /**
   * ApproverService.Decide, as the approver `alice@example.com`. `scope`: `SCOPE_ONCE` (the
   * default), `SCOPE_SESSION`, `SCOPE_WORKSPACE`, `SCOPE_ALWAYS`.
   */
  async decide(call, { approve, reason = "", editedInput, scope = "SCOPE_UNSPECIFIED" }) {
    return unary(this.approver, "decide", {
      sessionId: call.sessionId,
      callId: call.callId,
      agent: call.agent,
      decision: approve ? "DECISION_APPROVE" : "DECISION_DENY",
      reason,
      editedInputJson: editedInput === undefined ? "" : JSON.stringify(editedInput),
      approver: "alice@example.com",
      scope,
    });
  }

  // --- the operator ------------------------------------------------------------------------

  async getCall(sessionId, callId) {
    return unary(this.admin, "getCall", { sessionId, callId });
  }

  async listCalls(request = {}) {
    return (await unary(this.admin, "listCalls", { pageSize: 1000, ...request })).calls;
  }

  async explain(sessionId, callId) {
    return unary(this.admin, "explain", { stored: { sessionId, callId } });
  }
}
