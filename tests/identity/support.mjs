// Why this exists: what the identity suites share (identity.test.mjs, JWTs over gRPC, and
// signin.test.mjs, the inbox's sign-in in Chromium): free loopback ports, the real broker started
// with an OpenID provider as its issuer on a fresh SQLite file, gRPC calls with a bearer token
// (@grpc/grpc-js), and reading or forging JWTs.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const AUDIENCE = "approval-broker";
export const ROLES = "admin=broker-admin;approver=approver;agent=approval-agent";
export { grpc };

export function freePort() {
  return new Promise((ok, fail) => {
    const server = net.createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => ok(port));
    });
  });
}

function brokerBinary() {
  const bin = process.env.APPROVAL_BROKER_BIN ?? join(ROOT, process.env.CARGO_TARGET_DIR ?? "target", "debug", "approval-broker");
  if (!existsSync(bin)) throw new Error(`no broker binary at ${bin}: run \`cargo build --locked --bin approval-broker\``);
  return bin;
}

const packages = grpc.loadPackageDefinition(
  protoLoader.loadSync(["approvals/v1/agent.proto", "approvals/v1/approver.proto", "approvals/v1/admin.proto"], {
    includeDirs: [join(ROOT, "proto")],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
  }),
).approvals.v1;

/** The broker with the provider as its issuer; every call no rule names needs `approvers`
 * (two of `ops`). `port`: where it listens (0: any free one); `args`: more flags. */
export async function startBroker(issuer, { port = 0, args = [], env: extraEnv = {}, approvers = '{"groups": ["ops"], "quorum": 2}' } = {}) {
  const directory = mkdtempSync(join(tmpdir(), "approval-broker-identity-"));
  port ||= await freePort();
  const log = openSync(join(directory, "broker.log"), "a");
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("APPROVALS_") && k !== "DATABASE_URL"));
  const child = spawn(
    brokerBinary(),
    [
      "--listen", `127.0.0.1:${port}`,
      "--metrics-listen", "off",
      "--database-url", `sqlite://${join(directory, "approvals.db")}`,
      "--jwt-issuer", issuer,
      "--jwt-audience", AUDIENCE,
      "--jwt-roles", ROLES,
      "--jwt-role-claims", "roles,scope",
      "--jwt-clock-skew", "1s",
      "--jwt-keys-refetch-interval", "1s",
      "--default-approvers", approvers,
      ...args,
    ],
    { cwd: directory, stdio: ["ignore", log, log], env: { ...env, ...extraEnv } },
  );
  const target = `127.0.0.1:${port}`;
  const clients = {
    agent: new packages.AgentService(target, grpc.credentials.createInsecure()),
    approver: new packages.ApproverService(target, grpc.credentials.createInsecure()),
    admin: new packages.AdminService(target, grpc.credentials.createInsecure()),
  };
  const call = (service, method, token, request) =>
    new Promise((ok, fail) => {
      const metadata = new grpc.Metadata();
      if (token !== undefined) metadata.set("authorization", `Bearer ${token}`);
      clients[service][method](request, metadata, { deadline: Date.now() + 10_000 }, (error, reply) =>
        error ? fail(error) : ok(reply),
      );
    });
  const logText = () => readFileSync(join(directory, "broker.log"), "utf8");
  // Serving once a call without a token is refused UNAUTHENTICATED.
  for (let i = 0; ; i++) {
    if (child.exitCode !== null) throw new Error(`the broker exited:\n${logText()}`);
    try {
      await call("approver", "ListPending", undefined, {});
    } catch (e) {
      if (e.code === grpc.status.UNAUTHENTICATED) break;
      if (i > 300) throw new Error(`the broker did not serve:\n${logText()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return {
    url: `http://${target}`,
    call,
    log: logText,
    async close() {
      for (const c of Object.values(clients)) c.close();
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
      rmSync(directory, { recursive: true, force: true });
    },
  };
}

/** The gRPC error of `promise`, which must fail. */
export async function refusal(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  assert.fail("expected the call to be refused");
}

export const b64 = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");
/** A JWT's header, claims and signature (unverified). */
export const parts = (jwt) => jwt.split(".").map((p, i) => (i < 2 ? JSON.parse(Buffer.from(p, "base64url")) : p));
