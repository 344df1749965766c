/**
 * A real broker for the tests: the debug binary, on a free port, with a fresh SQLite file in a
 * temporary directory, as `.ci/lib.sh` starts it. `APPROVAL_BROKER_BIN` names the binary; by
 * default `$CARGO_TARGET_DIR/debug/approval-broker` (or the repository's `target/`).
 *
 * `approveWhenPending` plays the approver UI: once every named call is pending, it decides them
 * in the given order through `ApproverService.Decide`.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, closeSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ApproverService, Decision as ProtoDecision } from "../src/gen/approvals/v1/approver_pb.js";
import { Scope, type Call, type Outcome } from "../src/gen/approvals/v1/types_pb.js";

export { Scope };

const HERE = dirname(fileURLToPath(import.meta.url));
/** The repository root (tests compile to clients/typescript/.test-build/tests). */
export const REPO = resolve(HERE, "../../../..");
const START_TIMEOUT_MS = 60_000;

export function brokerBinary(): string {
  if (process.env.APPROVAL_BROKER_BIN) return process.env.APPROVAL_BROKER_BIN;
  let targetDir = process.env.CARGO_TARGET_DIR || join(REPO, "target");
  if (!isAbsolute(targetDir)) targetDir = join(REPO, targetDir);
  return join(targetDir, "debug", "approval-broker");
}

export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** One broker process; `restart` keeps its port and its database. */
export class BrokerProcess {
  readonly directory: string;
  port = 0;
  process: ChildProcess | undefined;
  private startedOnce = false;

  /** The PEM of the CA that signed the broker's certificate, when it serves TLS. */
  ca: string | undefined;
  /** The approver token the test helpers decide with, when the broker has tokens. */
  approverToken: string | undefined;

  constructor(readonly args: string[] = [], directory?: string) {
    this.directory = directory ?? mkdtempSync(join(tmpdir(), "approval-broker-ts-"));
  }

  get target(): string {
    return `127.0.0.1:${this.port}`;
  }

  get url(): string {
    return `${this.ca === undefined ? "http" : "https"}://${this.target}`;
  }

  /** An `ApproverService` client, as the inbox would be (with the approver token, over TLS
   * when the broker serves it). */
  approver() {
    const token = this.approverToken;
    return createClient(
      ApproverService,
      createGrpcTransport({
        baseUrl: this.url,
        ...(this.ca === undefined ? {} : { nodeOptions: { ca: this.ca } }),
        interceptors: token
          ? [
              (next) => (request) => {
                request.header.set("authorization", `Bearer ${token}`);
                return next(request);
              },
            ]
          : [],
      }),
    );
  }

  get database(): string {
    return join(this.directory, "approvals.db");
  }

  get logFile(): string {
    return join(this.directory, "broker.log");
  }

  static async started(args: string[] = [], setup?: (broker: BrokerProcess) => void): Promise<BrokerProcess> {
    const broker = new BrokerProcess(args);
    setup?.(broker);
    await broker.start();
    return broker;
  }

  /** Starts the broker; on a first start, a port taken meanwhile is replaced by another. */
  async start(): Promise<void> {
    const binary = brokerBinary();
    if (!existsSync(binary)) throw new Error(`no broker binary at ${binary}: run \`cargo build --locked --bin approval-broker\``);
    for (let attempt = 0; attempt < 5; attempt++) {
      if (!this.startedOnce) this.port = await freePort();
      const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("APPROVALS_") && k !== "DATABASE_URL"));
      const log = openSync(this.logFile, "a");
      const child = spawn(
        binary,
        ["--listen", this.target, "--metrics-listen", "off", "--database-url", `sqlite://${this.database}`, ...this.args],
        { cwd: this.directory, stdio: ["ignore", log, log], env },
      );
      closeSync(log);
      this.process = child;
      if (await this.waitUntilServing(child)) {
        this.startedOnce = true;
        return;
      }
      if (this.startedOnce || !readFileSync(this.logFile, "utf8").includes("Address already in use")) break;
    }
    throw new Error(`the broker exited during start:\n${this.log()}`);
  }

  private async waitUntilServing(child: ChildProcess): Promise<boolean> {
    const approver = this.approver();
    const deadline = Date.now() + START_TIMEOUT_MS;
    while (Date.now() < deadline) {
      if (child.exitCode !== null || child.signalCode !== null) return false;
      try {
        await approver.listPending({ pageSize: 1 }, { timeoutMs: 1_000 });
        return true;
      } catch (e) {
        // Refused credentials mean it serves.
        if (e instanceof ConnectError && (e.code === Code.Unauthenticated || e.code === Code.PermissionDenied)) return true;
        await sleep(100);
      }
    }
    throw new Error(`the broker did not serve within ${START_TIMEOUT_MS / 1000}s:\n${this.log()}`);
  }

  log(): string {
    return existsSync(this.logFile) ? readFileSync(this.logFile, "utf8") : "";
  }

  /** Stops the process (SIGKILL by default, as a crash would) and waits for it. */
  async stop(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    const child = this.process;
    this.process = undefined;
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once("exit", () => r()));
    child.kill(signal);
    const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
    await exited;
    clearTimeout(timer);
  }

  async restart(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    await this.stop(signal);
    await this.start();
  }

  /** Stops the broker and removes its directory. */
  async dispose(): Promise<void> {
    await this.stop("SIGTERM");
    rmSync(this.directory, { recursive: true, force: true });
  }

  /** The broker's own `hash-token`, so the tests configure tokens as an operator does. */
  static hashToken(token: string): string {
    const run = spawnSync(brokerBinary(), ["hash-token", token], { encoding: "utf8" });
    if (run.status !== 0) throw new Error(`hash-token failed: ${run.stderr}`);
    return run.stdout.trim();
  }

  /** Runs SQL on the broker's SQLite file while the broker is stopped (as someone who can write
   * the file, and not the key, would), then starts it again. */
  async editDatabase(sql: string): Promise<void> {
    await this.stop("SIGTERM");
    const run = spawnSync("sqlite3", [this.database], { input: sql, encoding: "utf8" });
    if (run.status !== 0) throw new Error(`sqlite3 failed: ${run.stderr}`);
    await this.start();
  }

  /** Reads one value with SQL (the broker may run). */
  query(sql: string): string {
    const run = spawnSync("sqlite3", [this.database, sql], { encoding: "utf8" });
    if (run.status !== 0) throw new Error(`sqlite3 failed: ${run.stderr}`);
    return run.stdout.trim();
  }
}

export interface Decision {
  callId: string;
  approve: boolean;
  reason?: string;
  editedInputJson?: string;
  /** A message for the model instead of running the call (DECISION_RESPOND; `approve` ignored). */
  response?: string;
  /** The agent of the call, when the broker has tokens (the agent token's identity). */
  agent?: string;
  /** How long the decision holds: a grant for the session, the workspace, always. */
  scope?: Scope;
  /** The grant covers every input of the tool (by default only this call's input). */
  anyInput?: boolean;
}

/** A broker to reach: a plaintext `host:port` without tokens, or the process itself. */
export type Endpoint = string | BrokerProcess;

function approverClient(endpoint: Endpoint) {
  if (typeof endpoint !== "string") return endpoint.approver();
  return createClient(ApproverService, createGrpcTransport({ baseUrl: `http://${endpoint}` }));
}

export async function pendingCalls(target: Endpoint, sessionId: string): Promise<Call[]> {
  const reply = await approverClient(target).listPending({ filter: { sessionId } }, { timeoutMs: 5_000 });
  return reply.calls;
}

export async function waitUntilPending(target: Endpoint, sessionId: string, callIds: string[], timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      const pending = new Set((await pendingCalls(target, sessionId)).map((c) => c.callId));
      if (callIds.every((id) => pending.has(id))) return;
    } catch {
      // not up yet
    }
    await sleep(50);
  }
  throw new Error(`${callIds.join(", ")} were not all pending within ${timeoutMs / 1000}s`);
}

/** Decides the calls in order, as the approver `alice@example.com`. */
export async function decide(target: Endpoint, sessionId: string, decisions: Decision[]): Promise<Outcome[]> {
  const approver = approverClient(target);
  const outcomes: Outcome[] = [];
  for (const d of decisions) {
    const reply = await approver.decide(
      {
        sessionId,
        callId: d.callId,
        decision: d.response ? ProtoDecision.RESPOND : d.approve ? ProtoDecision.APPROVE : ProtoDecision.DENY,
        reason: d.reason ?? "",
        response: d.response ?? "",
        editedInputJson: d.editedInputJson ?? "",
        approver: "alice@example.com",
        agent: d.agent ?? "",
        scope: d.scope ?? Scope.UNSPECIFIED,
        ...(d.anyInput ? { matcher: { kind: { case: "any" as const, value: {} } } } : {}),
      },
      { timeoutMs: 5_000 },
    );
    if (reply.outcome) outcomes.push(reply.outcome);
  }
  return outcomes;
}

/** The approver UI: once every named call is pending, decides them in order. */
export async function approveWhenPending(target: Endpoint, sessionId: string, decisions: Decision[]): Promise<Outcome[]> {
  await waitUntilPending(target, sessionId, decisions.map((d) => d.callId));
  return decide(target, sessionId, decisions);
}

let sessions = 0;
/** A fresh session id. */
export function newSession(prefix = "ts"): string {
  sessions += 1;
  return `${prefix}-${process.pid}-${Date.now().toString(36)}-${sessions}`;
}
