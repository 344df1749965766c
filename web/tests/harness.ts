// What the browser tests and the screenshot script share: the real broker binary started on a
// free port with a fresh SQLite file and known tokens, an agent and an admin speaking real gRPC
// (HTTP/2, @connectrpc/connect-node), Debian's Chromium driven by playwright-core, the
// start-up and shutdown of all three that every browser suite runs before and after its tests,
// how a person signs in on the inbox page, and how a test reads a call: its state as the agent
// sees it, its card on the page.
import { type ChildProcess, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, openSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { type Browser, type BrowserContext, chromium, type Locator, type Page } from "playwright-core";
import { AdminService } from "../src/gen/approvals/v1/admin_pb";
import { AgentService } from "../src/gen/approvals/v1/agent_pb";
import { ApproverService } from "../src/gen/approvals/v1/approver_pb";
import type { Outcome } from "../src/gen/approvals/v1/types_pb";

export const TOKENS = {
  agent: "agent-token-for-tests",
  /** An admin: every view of the page works. */
  alice: "alice-admin-token-for-tests",
  /** An approver: pending calls and decisions only. */
  bob: "bob-approver-token-for-tests",
};

const hash = (token: string) => `sha256:${createHash("sha256").update(token).digest("hex")}`;

const TOKEN_LINES = [
  `agent agent-a ${hash(TOKENS.agent)}`,
  `admin alice ${hash(TOKENS.alice)}`,
  `approver bob ${hash(TOKENS.bob)}`,
].join(";");

/** The broker binary: $BROKER, else the debug build of this repository (run from web/). */
export const BROKER = process.env.BROKER ?? resolve(process.cwd(), "../target/debug/approval-broker");

export async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => ok(typeof address === "object" && address ? address.port : 0));
    });
  });
}

export interface BrokerOptions {
  /** `false` runs the broker without tokens (authentication off, the laptop default). */
  tokens: boolean;
  /** More flags for the broker (the push test allows its loopback push service). */
  args?: string[];
  /** The port to serve on, when its flags must name it (the passkey origin); else a free one. */
  port?: number;
}

export class Broker {
  process: ChildProcess | undefined;
  readonly dir = mkdtempSync(join(tmpdir(), "inbox-test-"));
  port = 0;

  constructor(private readonly options: BrokerOptions = { tokens: true }) {
    this.port = options.port ?? 0;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    if (this.port === 0) this.port = await freePort();
    const log = openSync(join(this.dir, "broker.log"), "a");
    this.process = spawn(
      BROKER,
      ["--listen", `127.0.0.1:${this.port}`, "--metrics-listen", "off", "--database-url", `sqlite://${join(this.dir, "approvals.db")}`, ...(this.options.args ?? [])],
      {
        env: { PATH: process.env.PATH ?? "", RUST_LOG: "info", ...(this.options.tokens ? { APPROVALS_TOKENS: TOKEN_LINES } : {}) },
        stdio: ["ignore", log, log],
      },
    );
    const started = Date.now();
    for (;;) {
      if (this.process.exitCode !== null) throw new Error(`the broker exited (${this.process.exitCode}); see ${this.dir}/broker.log`);
      try {
        const page = await fetch(`${this.url}/`);
        if (page.ok) return;
      } catch {
        // Not listening yet.
      }
      if (Date.now() - started > 60_000) throw new Error("the broker did not start within 60 s");
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Kills the broker at once (SIGKILL): nothing gets to drain. */
  async kill(): Promise<void> {
    const child = this.process;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGKILL");
    await exited;
  }

  async stop(): Promise<void> {
    const child = this.process;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGTERM");
    await exited;
  }
}

function bearer(token: string): Interceptor {
  return (next) => (request) => {
    if (token !== "") request.header.set("authorization", `Bearer ${token}`);
    return next(request);
  };
}

/** An agent of a broker without tokens (it sends none). */
export function anonymousAgent(broker: Broker) {
  return createClient(AgentService, createGrpcTransport({ baseUrl: broker.url, interceptors: [bearer("")] }));
}

/** gRPC clients (HTTP/2, as any agent or tool speaks to the broker). */
export function grpcClients(broker: Broker) {
  const transport = (token: string) => createGrpcTransport({ baseUrl: broker.url, interceptors: [bearer(token)] });
  return {
    agent: createClient(AgentService, transport(TOKENS.agent)),
    admin: createClient(AdminService, transport(TOKENS.alice)),
    approver: createClient(ApproverService, transport(TOKENS.bob)),
    /** Alice (an admin) deciding, as a second approver. */
    adminApprover: createClient(ApproverService, transport(TOKENS.alice)),
  };
}

/** Chromium as the CI machine has it, with the flags this closed network needs. */
export async function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
}

/** A started broker, gRPC clients of it and Chromium: what a browser suite runs against. */
export interface Started {
  broker: Broker;
  clients: ReturnType<typeof grpcClients>;
  browser: Browser;
}

/**
 * A suite's start-up (its `before`): the broker, then its gRPC clients and Chromium. When
 * Chromium does not start, the broker is stopped before the error is thrown, so no broker
 * outlives a suite that could not run.
 */
export async function startBrokerAndChromium(options: BrokerOptions = { tokens: true }): Promise<Started> {
  const broker = new Broker(options);
  await broker.start();
  try {
    return { broker, clients: grpcClients(broker), browser: await launchChromium() };
  } catch (error) {
    await broker.stop();
    throw error;
  }
}

/**
 * A suite's shutdown (its `after`): the browser contexts its tests left open, Chromium, then the
 * broker. Any of them may be missing (a start-up that failed).
 */
export async function stopBrokerAndChromium(started: Partial<Started>, contexts: BrowserContext[] = []): Promise<void> {
  for (const context of contexts.splice(0)) await context.close().catch(() => {});
  await started.browser?.close();
  await started.broker?.stop();
}

/** An agent's gRPC client (`grpcClients(broker).agent`). */
type Agent = ReturnType<typeof grpcClients>["agent"];

/** The call's outcome as the agent gets it, once decided (asked every 50 ms, for 10 s at most). */
export async function outcomeAtAgent(agent: Agent, session: string, callId: string): Promise<Outcome> {
  for (let i = 0; i < 200; i++) {
    const reply = await agent.getOutcomes({ sessionId: session, callIds: [callId] });
    const state = reply.calls[0]?.state;
    if (state?.case === "outcome") return state.value;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${session}/${callId} was never decided`);
}

/** Whether the agent still sees the call pending (asked once). */
export async function pendingAtAgent(agent: Agent, session: string, callId: string): Promise<boolean> {
  const reply = await agent.getOutcomes({ sessionId: session, callIds: [callId] });
  return reply.calls[0]?.state.case === "pending";
}

/** The call's card on an inbox page. */
export const card = (page: Page, session: string, callId: string): Locator => page.locator(`article[data-session="${session}"][data-call="${callId}"]`);

/** Types `token` into the page's sign-in form and opens the inbox (whatever the page then shows). */
export async function enterToken(page: Page, token: string): Promise<void> {
  await page.getByLabel("Token", { exact: true }).fill(token);
  await page.getByRole("button", { name: "Open the inbox" }).click();
}

/** Opens the inbox at `url` signed in with `token`, once its live stream is up. */
export async function signIn(page: Page, url: string, token: string): Promise<void> {
  await page.goto(url);
  await enterToken(page, token);
  await page.locator("#connection", { hasText: "live" }).waitFor();
}
