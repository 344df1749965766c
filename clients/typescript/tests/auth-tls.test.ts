/**
 * Bearer tokens and TLS: the options `connectBroker` takes, against a broker started with tokens
 * and with a certificate. Refused credentials fail at once, typed, never retried into a wait.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { randomUUID } from "node:crypto";
import { AuthenticationError, BrokerUnavailable, PermissionDenied, Status, type ToolCall } from "../src/index.js";
import { connectBroker } from "../src/node.js";
import { approveWhenPending, BrokerProcess, newSession } from "./broker.js";

const AGENT_TOKEN = `agent-token-${randomUUID()}`;
const APPROVER_TOKEN = `approver-token-${randomUUID()}`;
const CALL: ToolCall = { callId: "c1", tool: "read_file", input: { path: "a" } };

describe("bearer tokens", () => {
  test("the agent's token is sent; missing, unknown or wrong-role tokens fail at once, typed", async () => {
    const tokens = `agent build-bot ${BrokerProcess.hashToken(AGENT_TOKEN)};approver alice ${BrokerProcess.hashToken(APPROVER_TOKEN)}`;
    const process_ = await BrokerProcess.started(["--tokens", tokens], (b) => (b.approverToken = APPROVER_TOKEN));
    try {
      const broker = connectBroker(process_.target, { token: AGENT_TOKEN });
      const session = newSession();
      const approving = approveWhenPending(process_, session, [{ callId: "c1", approve: true, agent: "build-bot" }]);
      const [outcome] = await broker.review(session, [CALL], { timeoutMs: 30_000 });
      await approving;
      await broker.close();
      assert.equal(outcome?.status, Status.APPROVED);
      // The token's identity, not the request's `approver` field, is recorded.
      assert.equal(outcome?.decidedBy, "approver:alice");

      const started = Date.now();
      const anonymous = connectBroker(process_.target, { unavailableTimeoutMs: 30_000 });
      await assert.rejects(anonymous.review("s", [CALL]), AuthenticationError);
      await anonymous.close();
      const unknown = connectBroker(process_.target, { token: "not-a-token" });
      await assert.rejects(unknown.outcomes("s", ["c1"]), AuthenticationError);
      await unknown.close();
      const approver = connectBroker(process_.target, { token: APPROVER_TOKEN });
      await assert.rejects(approver.review("s", [CALL]), PermissionDenied);
      await approver.close();
      assert.ok(Date.now() - started < 10_000, "refused credentials were retried");
    } finally {
      await process_.dispose();
    }
  });
});

describe("TLS", () => {
  test("an https:// target with the CA verifies the broker's certificate; without it, nothing is decided", async () => {
    const process_ = new BrokerProcess();
    const cert = join(process_.directory, "cert.pem");
    const key = join(process_.directory, "key.pem");
    const made = spawnSync(
      "openssl",
      ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
        "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
      { encoding: "utf8" },
    );
    assert.equal(made.status, 0, made.stderr);
    process_.args.push("--tls-cert", cert, "--tls-key", key);
    process_.ca = readFileSync(cert, "utf8");
    await process_.start();
    try {
      const broker = connectBroker(`https://${process_.target}`, { ca: process_.ca });
      const session = newSession();
      const approving = approveWhenPending(process_, session, [{ callId: "c1", approve: true }]);
      const [outcome] = await broker.review(session, [CALL], { timeoutMs: 30_000 });
      await approving;
      await broker.close();
      assert.equal(outcome?.status, Status.APPROVED);
      assert.deepEqual(outcome?.input, { path: "a" });
      // A certificate the client does not trust: no connection, so no outcome.
      const untrusting = connectBroker(`https://${process_.target}`, { unavailableTimeoutMs: 1_000 });
      await assert.rejects(untrusting.review(newSession(), [CALL]), BrokerUnavailable);
      await untrusting.close();
      assert.throws(() => connectBroker(`http://${process_.target}`, { tls: true }), /says plaintext/);
    } finally {
      await process_.dispose();
    }
  });
});
