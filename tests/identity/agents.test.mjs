// Why this exists: agents that authenticate to the broker as service clients of a real OpenID
// provider, and keep working as their tokens expire. `oidc-provider` (npm) runs on loopback and
// issues client-credentials tokens that live TTL seconds; the broker verifies them (keys by
// discovery). The Claude Code hook (`approval-broker hook claude-code --oauth-*`), the Python
// client and the TypeScript client each get their token from the provider's token endpoint,
// renew it before it expires (the provider counts the requests), keep using it while the
// provider is down until it expires, and then fail closed, saying why: the hook denies, the
// clients raise TokenUnavailable, and nothing runs.
//
// The broker binary comes from APPROVAL_BROKER_BIN, else target/debug/approval-broker; the
// Python with `approval_broker` installed from PYTHON_BIN, else python3; the TypeScript client
// from clients/typescript/dist (`npm run build` there).

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import crypto from "node:crypto";
import { chmodSync, existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import Provider from "oidc-provider";
import { AUDIENCE, ROOT, freePort, startBroker } from "./support.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const RESOURCE = "urn:approval-broker";
const SCOPE = "approval-agent";
/** How long the provider's client-credentials tokens live, in seconds. */
const TTL = 4;
const APPROVER_TOKEN = `approver-${crypto.randomUUID()}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function brokerBinary() {
  const bin = process.env.APPROVAL_BROKER_BIN ?? join(ROOT, process.env.CARGO_TARGET_DIR ?? "target", "debug", "approval-broker");
  if (!existsSync(bin)) throw new Error(`no broker binary at ${bin}: run \`cargo build --locked --bin approval-broker\``);
  return bin;
}

/** oidc-provider on loopback, with the agent `ci-bot` (client credentials, tokens of TTL
 * seconds); counts the token requests, and can be stopped and started again on its port. */
async function startProvider() {
  const port = await freePort();
  const issuer = `http://127.0.0.1:${port}`;
  const ec = crypto.generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey.export({ format: "jwk" });
  const provider = new Provider(issuer, {
    jwks: { keys: [{ ...ec, kid: "ec-1", use: "sig", alg: "ES256" }] },
    ttl: { ClientCredentials: TTL },
    clients: [
      {
        client_id: "ci-bot",
        client_secret: "ci-bot-secret",
        grant_types: ["client_credentials"],
        redirect_uris: [],
        response_types: [],
        id_token_signed_response_alg: "ES256",
      },
    ],
    features: {
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => RESOURCE,
        getResourceServerInfo: () => ({
          scope: SCOPE,
          audience: AUDIENCE,
          accessTokenFormat: "jwt",
          accessTokenTTL: TTL,
          jwt: { sign: { alg: "ES256" } },
        }),
        useGrantedResource: () => true,
      },
    },
  });
  const state = { tokens: 0, server: undefined };
  provider.on("grant.success", () => {
    state.tokens += 1;
  });
  const listen = () =>
    new Promise((ok) => {
      state.server = provider.listen(port, "127.0.0.1", ok);
    });
  await listen();
  return {
    issuer,
    tokenUrl: `${issuer}/token`,
    get tokens() {
      return state.tokens;
    },
    stop() {
      state.server?.closeAllConnections();
      state.server?.close();
      state.server = undefined;
    },
    start: listen,
  };
}

/** The broker with the provider as its issuer, a static approver token beside it, and the
 * approver: it approves each call once the call has been pending `approving.delayMs`. */
async function startBrokerApproving(issuer) {
  const hashed = spawnSync(brokerBinary(), ["hash-token", APPROVER_TOKEN], { encoding: "utf8" }).stdout.trim();
  const broker = await startBroker(issuer, { args: ["--tokens", `approver alice ${hashed}`], approvers: '{"quorum": 1}' });
  const seen = new Map();
  const approving = { delayMs: 0, stopped: false };
  const loop = (async () => {
    while (!approving.stopped) {
      try {
        const { calls } = await broker.call("approver", "ListPending", APPROVER_TOKEN, {});
        for (const pending of calls) {
          const key = `${pending.session_id}/${pending.call_id}`;
          if (!seen.has(key)) seen.set(key, Date.now());
          if (Date.now() - seen.get(key) >= approving.delayMs) {
            const decision = { session_id: pending.session_id, call_id: pending.call_id, agent: pending.agent, decision: "DECISION_APPROVE" };
            await broker.call("approver", "Decide", APPROVER_TOKEN, decision);
          }
        }
      } catch {
        // The broker is stopping, or the call was decided meanwhile: look again.
      }
      await sleep(100);
    }
  })();
  return {
    url: broker.url,
    call: broker.call,
    approving,
    log: broker.log,
    async stop() {
      approving.stopped = true;
      await loop;
      await broker.close();
    },
  };
}

let idp;
let broker;
let secretFile;

before(async () => {
  idp = await startProvider();
  broker = await startBrokerApproving(idp.issuer);
  secretFile = join(mkdtempSync(join(tmpdir(), "approval-broker-secret-")), "ci-bot.secret");
  writeFileSync(secretFile, "ci-bot-secret\n");
  chmodSync(secretFile, 0o600);
});

after(async () => {
  await broker?.stop();
  idp?.stop();
});

/** Runs the Claude Code hook on a PreToolUse input; its answer, standard error and the token
 * requests the provider served meanwhile. */
async function hook(callId, { timeout = "60s", whileWaiting } = {}) {
  const before_ = idp.tokens;
  const child = spawn(
    brokerBinary(),
    [
      "hook", "claude-code",
      "--broker", broker.url,
      "--timeout", timeout,
      "--oauth-token-url", idp.tokenUrl,
      "--oauth-client-id", "ci-bot",
      "--oauth-client-secret-file", secretFile,
      "--oauth-scope", SCOPE,
      "--oauth-resource", RESOURCE,
    ],
    { stdio: ["pipe", "pipe", "pipe"], env: Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("APPROVALS_"))) },
  );
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  child.stdin.end(
    JSON.stringify({
      session_id: "hook-session",
      transcript_path: "/tmp/transcript.jsonl",
      cwd: "/tmp",
      permission_mode: "default",
      hook_event_name: "PreToolUse",
      tool_name: "Bash",
      tool_input: { command: `echo ${callId}`, description: "say which call" },
      tool_use_id: callId,
    }),
  );
  const exited = new Promise((ok) => child.on("close", ok));
  await whileWaiting?.();
  const code = await exited;
  assert.equal(code, 0, stderr);
  return { answer: JSON.parse(stdout).hookSpecificOutput, stderr, requests: idp.tokens - before_ };
}

/** Runs a client script (agents_client.py or .mjs) through its steps; stops the provider when
 * it asks, and starts it again after. */
async function client(command, args) {
  const child = spawn(command, args, {
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, BROKER: broker.url, TOKEN_URL: idp.tokenUrl, CLIENT_ID: "ci-bot", SECRET_FILE: secretFile, SCOPE, RESOURCE, TTL: String(TTL) },
  });
  const steps = {};
  const exited = new Promise((ok) => child.on("close", ok));
  for await (const line of createInterface({ input: child.stdout })) {
    const step = JSON.parse(line);
    steps[step.step] = step;
    if (step.step === "stop-provider") {
      idp.stop();
      child.stdin.write("stopped\n");
    }
  }
  assert.equal(await exited, 0, `${command} failed: ${JSON.stringify(steps)}`);
  await idp.start();
  return steps;
}

function checkClient(steps) {
  // A token at first use; the next after 80% of its lifetime; approvals either side of it.
  assert.deepEqual([steps.first?.status, steps.first?.requests], ["APPROVED", 1], JSON.stringify(steps));
  assert.deepEqual([steps.renewed?.status, steps.renewed?.requests], ["APPROVED", 2], JSON.stringify(steps));
  // The provider down: the token held still works, with no new request.
  assert.deepEqual([steps.cached?.status, steps.cached?.requests], ["APPROVED", 2], JSON.stringify(steps));
  // Once it has expired: nothing is sent, and the error says why.
  assert.equal(steps.expired?.error, "TokenUnavailable", JSON.stringify(steps));
  assert.match(steps.expired.message, /could not be reached.*has expired.*run nothing/);
}

/** Whether the broker holds `callId` of the hook's session pending. */
async function pending(callId) {
  const { calls } = await broker.call("approver", "ListPending", APPROVER_TOKEN, {});
  return calls.some((c) => c.session_id === "hook-session" && c.call_id === callId);
}

test("the hook gets its token from the provider, and renews it when its wait outlasts it", async () => {
  const quick = await hook("toolu_quick");
  assert.equal(quick.answer.permissionDecision, "allow", quick.stderr);
  assert.equal(quick.requests, 1, "one token for one hook run");
  // Nobody decides within 6 s, past the token's 4: cancelling the call needs a new token.
  broker.approving.delayMs = Number.POSITIVE_INFINITY;
  try {
    const slow = await hook("toolu_slow", { timeout: "6s" });
    assert.equal(slow.answer.permissionDecision, "deny", slow.stderr);
    assert.match(slow.answer.permissionDecisionReason, /No approver decided within 6s/);
    assert.equal(slow.requests, 2, "the token was renewed during the wait");
    assert.equal(await pending("toolu_slow"), false, "the call was cancelled with the renewed token");
  } finally {
    broker.approving.delayMs = 0;
  }
  assert.match(broker.log(), /identity provider keys fetched/);
});

test("the Python client renews its token, keeps it while the provider is down, then fails closed", async () => {
  checkClient(await client(process.env.PYTHON_BIN ?? "python3", [join(HERE, "agents_client.py")]));
});

test("the TypeScript client renews its token, keeps it while the provider is down, then fails closed", async () => {
  checkClient(await client(process.execPath, [join(HERE, "agents_client.mjs")]));
});

test("the provider down past the token's expiry, the hook denies, saying why, and sends nothing", async () => {
  // Down before the hook starts: no token, nothing sent, the call denied.
  idp.stop();
  try {
    const none = await hook("toolu_no_token");
    assert.equal(none.answer.permissionDecision, "deny", none.stderr);
    assert.match(none.answer.permissionDecisionReason, /No access token for the approval broker.*could not be reached/);
    assert.equal(await pending("toolu_no_token"), false, "nothing was submitted");
  } finally {
    await idp.start();
  }
  // Down during a wait that outlasts the token: at the time limit the call is denied, and the
  // cancel is not sent with an expired token (the call stays for its approvers or its deadline).
  broker.approving.delayMs = Number.POSITIVE_INFINITY;
  try {
    const stranded = await hook("toolu_stranded", {
      timeout: "6s",
      whileWaiting: async () => {
        await sleep(1_000);
        idp.stop();
      },
    });
    assert.equal(stranded.answer.permissionDecision, "deny", stranded.stderr);
    assert.match(stranded.answer.permissionDecisionReason, /No approver decided within 6s/);
    assert.equal(stranded.requests, 1, "no token could be had after the first");
    assert.equal(await pending("toolu_stranded"), true, "no cancel went out without a token");
  } finally {
    broker.approving.delayMs = 0;
    await idp.start();
  }
});
