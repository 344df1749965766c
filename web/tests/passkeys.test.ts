// Passkey-signed approvals (issue 46) in a real browser, through the real inbox: Chromium's
// virtual authenticator (the DevTools protocol's WebAuthn domain: CTAP2, internal, with user
// verification) registers a passkey in the Passkeys tab and signs a step-up call's statement on
// Approve; the agent receives APPROVED and a receipt carrying the assertion. A step-up call
// approved without a passkey is refused and stays pending; Deny needs none.
//
// The page is opened at http://localhost:<port> (a WebAuthn RP ID is a domain, never an IP
// address), the broker told so with --passkey-rp-id/--passkey-origin. With PASSKEY_EVIDENCE_DIR
// set, the receipts and each person's credential as the authenticator holds it (its public key,
// from the virtual authenticator, not from the broker) are written there for the independent
// check with @simplewebauthn/server (tests/passkeys, run by .ci/passkeys).
import assert from "node:assert/strict";
import { createPrivateKey, createPublicKey } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, BrowserContext, CDPSession, Page } from "playwright-core";
import { Decision } from "../src/gen/approvals/v1/approver_pb";
import { CallStatus, Effect, StepUp } from "../src/gen/approvals/v1/types_pb";
import { type Broker, card, freePort, type grpcClients, outcomeAtAgent, pendingAtAgent, signIn, startBrokerAndChromium, stopBrokerAndChromium, TOKENS } from "./harness";

let broker: Broker;
let browser: Browser;
let clients: ReturnType<typeof grpcClients>;
let origin = "";
const contexts: BrowserContext[] = [];
/** What the independent check reads (PASSKEY_EVIDENCE_DIR). */
const evidence: { origin: string; rpId: string; people: Record<string, { credentialId: string; publicKeySpki: string }[]>; receipts: Record<string, string>; receiptKeys: string[] } = {
  origin: "",
  rpId: "localhost",
  people: {},
  receipts: {},
  receiptKeys: [],
};

before(async () => {
  const port = await freePort();
  origin = `http://localhost:${port}`;
  evidence.origin = origin;
  ({ broker, clients, browser } = await startBrokerAndChromium({ tokens: true, port, args: ["--passkey-rp-id", "localhost", "--passkey-origin", origin] }));
  await clients.admin.createRule({
    rule: { id: "deploys-need-a-passkey", tool: "deploy", effect: Effect.ASK, description: "production deploys", approvers: { stepUp: StepUp.PASSKEY } },
  });
});

after(async () => {
  await stopBrokerAndChromium({ broker, browser }, contexts);
  const dir = process.env.PASSKEY_EVIDENCE_DIR;
  if (dir) {
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "evidence.json"), JSON.stringify(evidence, null, 2));
  }
});

interface Person {
  page: Page;
  cdp: CDPSession;
  authenticatorId: string;
}

/** A browser of `token`'s person on the inbox, with a virtual authenticator (or none). */
async function openInbox(token: string, authenticator = true): Promise<Person> {
  const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
  contexts.push(context);
  const page = await context.newPage();
  const cdp = await context.newCDPSession(page);
  let authenticatorId = "";
  if (authenticator) {
    await cdp.send("WebAuthn.enable", { enableUI: false });
    const added = await cdp.send("WebAuthn.addVirtualAuthenticator", {
      options: { protocol: "ctap2", transport: "internal", hasResidentKey: true, hasUserVerification: true, isUserVerified: true, automaticPresenceSimulation: true },
    });
    authenticatorId = added.authenticatorId;
  }
  // Counts the page's WebAuthn requests, so a test can say none was made.
  await context.addInitScript(() => {
    const w = window as unknown as { webauthnGets: number };
    w.webauthnGets = 0;
    const get = navigator.credentials.get.bind(navigator.credentials);
    navigator.credentials.get = (options?: CredentialRequestOptions) => {
      w.webauthnGets += 1;
      return get(options);
    };
  });
  await signIn(page, `${origin}/`, token);
  return { page, cdp, authenticatorId };
}

async function credentials(person: Person) {
  return (await person.cdp.send("WebAuthn.getCredentials", { authenticatorId: person.authenticatorId })).credentials;
}

/** Registers a passkey in the Passkeys tab; returns the authenticator's credential. */
async function register(person: Person, who: string, name: string) {
  const { page } = person;
  await page.getByRole("tab", { name: "Passkeys" }).click();
  await page.getByLabel("Passkey name").fill(name);
  await page.getByRole("button", { name: "Register a passkey" }).click();
  await page.getByRole("status").filter({ hasText: `Registered passkey “${name}”` }).waitFor();
  const held = await credentials(person);
  assert.equal(held.length, 1, "the authenticator made one credential");
  const credential = held[0];
  assert.equal(credential.rpId, "localhost");
  const id = Buffer.from(credential.credentialId, "base64").toString("base64url");
  // The public key as the authenticator holds it, derived from its private key.
  const privateKey = createPrivateKey({ key: Buffer.from(credential.privateKey, "base64"), format: "der", type: "pkcs8" });
  const spki = createPublicKey(privateKey).export({ format: "der", type: "spki" }).toString("base64");
  (evidence.people[who] ??= []).push({ credentialId: id, publicKeySpki: spki });
  await page.getByRole("list", { name: "Your passkeys" }).getByText(name).waitFor();
  await page.getByRole("tab", { name: /^Pending/ }).click();
  return { id, credential };
}

let seq = 0;
function unique(prefix: string): string {
  seq += 1;
  return `${prefix}-${seq}`;
}

async function submit(session: string, id: string, tool: string, input: string, title = "") {
  const reply = await clients.agent.submit({ batch: { sessionId: session, calls: [{ callId: id, tool, inputJson: input, title }] } });
  const ack = reply.acks[0]?.result;
  assert.ok(ack?.case === "accepted" && ack.value.status === CallStatus.PENDING, `${tool} waits for a person`);
}

/** The call's outcome as the agent gets it, once decided; whether it is still pending. */
const outcomeOf = (session: string, callId: string) => outcomeAtAgent(clients.agent, session, callId);
const isPending = (session: string, callId: string) => pendingAtAgent(clients.agent, session, callId);

/** The receipt's statement (the DSSE payload), as text. */
async function receiptOf(session: string, callId: string): Promise<{ envelope: string; statement: string }> {
  const reply = await clients.agent.getReceipt({ sessionId: session, callId });
  const envelope = reply.receipt?.envelope ?? "";
  assert.notEqual(envelope, "", "the call has a receipt");
  return { envelope, statement: Buffer.from(JSON.parse(envelope).payload, "base64").toString("utf8") };
}

describe("passkey-signed approvals in Chromium", () => {
  let bob: Person;
  let bobCredential: { id: string; credential: { signCount: number } };

  test("an approver registers a passkey in the Passkeys tab; the broker lists it for them and for admins", async () => {
    bob = await openInbox(TOKENS.bob);
    bobCredential = await register(bob, "bob", "bob's laptop");
    const mine = await clients.approver.listMyPasskeys({});
    assert.deepEqual(
      mine.passkeys.map((p) => [p.credentialId, p.name]),
      [[bobCredential.id, "bob's laptop"]],
    );
    const listed = await clients.admin.listPasskeys({ approver: "bob" });
    assert.deepEqual(
      listed.passkeys.map((p) => p.credentialId),
      [bobCredential.id],
    );
  });

  test("a step-up call is marked, Approve has the passkey sign its statement, and the agent receives APPROVED", async () => {
    const { page } = bob;
    const session = unique("s-passkey");
    await submit(session, "d1", "deploy", '{"service":"api","to":"production"}', "Deploy the API");
    const c = card(page, session, "d1");
    await c.getByText("Needs your passkey").waitFor();
    const before = (await credentials(bob))[0].signCount;
    await c.getByRole("button", { name: "Approve deploy call d1" }).click();
    const outcome = await outcomeOf(session, "d1");
    assert.equal(outcome.status, CallStatus.APPROVED);
    assert.equal(outcome.decidedBy, "approver:bob");
    await c.getByText("APPROVED by approver:bob").waitFor();
    assert.ok((await credentials(bob))[0].signCount > before, "the authenticator signed");
    // The card showed the statement digest the passkey signed, and the receipt carries it.
    const digest = (await c.locator(".statement .digest").textContent()) ?? "";
    assert.match(digest, /^[0-9a-f]{64}$/);
    const receipt = await receiptOf(session, "d1");
    assert.ok(receipt.statement.includes(digest), "the receipt carries the signed statement's digest");
    assert.ok(receipt.statement.includes(bobCredential.id), "the receipt names the credential");
    evidence.receipts.approved = receipt.envelope;
  });

  test("Edit then approve on a step-up call signs the edited input", async () => {
    const { page } = bob;
    const session = unique("s-passkey-edit");
    await submit(session, "d2", "deploy", '{"service":"api","to":"production"}');
    const c = card(page, session, "d2");
    await c.getByRole("button", { name: "Edit the input of deploy call d2, then approve" }).click();
    await c.getByLabel("Edited input of deploy call d2 (JSON)").fill('{"service":"api","to":"staging"}');
    await c.getByRole("button", { name: "Approve edited input" }).click();
    const outcome = await outcomeOf(session, "d2");
    assert.equal(outcome.status, CallStatus.APPROVED);
    assert.equal(outcome.inputEdited, true);
    // What the passkey signed is shown on the card: the edited input, not the submitted one.
    const signed = JSON.parse((await c.locator(".statement-json").textContent()) ?? "{}");
    assert.deepEqual(signed.input, { service: "api", to: "staging" });
    assert.equal(signed.edited, true);
    const receipt = await receiptOf(session, "d2");
    assert.ok(receipt.statement.includes((await c.locator(".statement .digest").textContent()) ?? "-"));
    evidence.receipts.edited = receipt.envelope;
  });

  test("a step-up call approved without a passkey is refused and stays pending", async () => {
    const session = unique("s-no-passkey");
    await submit(session, "d3", "deploy", '{"service":"db","to":"production"}');
    // Over gRPC, bob's vote with no assertion.
    await assert.rejects(
      clients.approver.decide({ sessionId: session, callId: "d3", agent: "agent-a", approver: "bob", decision: Decision.APPROVE }),
      /permission_denied.*needs a passkey-signed approval/i,
    );
    assert.ok(await isPending(session, "d3"));
    // In the inbox, alice (an admin) has no passkey: her Approve is refused, in words.
    const alice = await openInbox(TOKENS.alice);
    const c = card(alice.page, session, "d3");
    await c.getByText("Needs your passkey").waitFor();
    await c.getByRole("button", { name: "Approve deploy call d3" }).click();
    await c.locator(".outcome.error").filter({ hasText: "needs a passkey-signed approval and `alice` has no passkey" }).waitFor();
    assert.ok(await isPending(session, "d3"), "nothing was approved");
    assert.equal((await credentials(alice)).length, 0, "alice's authenticator made nothing");
  });

  test("an assertion whose signature does not verify is refused by the broker, said on the card, and the call stays pending", async () => {
    const { page, cdp, authenticatorId } = bob;
    const session = unique("s-bogus");
    await submit(session, "d6", "deploy", '{"service":"api","to":"production"}');
    const c = card(page, session, "d6");
    await cdp.send("WebAuthn.setResponseOverrideBits", { authenticatorId, isBogusSignature: true });
    try {
      await c.getByRole("button", { name: "Approve deploy call d6" }).click();
      await c.locator(".outcome.error").filter({ hasText: "PERMISSION_DENIED: the passkey's signature (ES256) does not verify" }).waitFor();
    } finally {
      await cdp.send("WebAuthn.setResponseOverrideBits", { authenticatorId, isBogusSignature: false });
    }
    assert.ok(await isPending(session, "d6"), "nothing was approved");
    // The same card approves once the authenticator signs properly (a fresh challenge).
    await c.getByRole("button", { name: "Approve deploy call d6" }).click();
    assert.equal((await outcomeOf(session, "d6")).status, CallStatus.APPROVED);
  });

  test("Deny on a step-up call needs no passkey", async () => {
    // A browser with no authenticator at all.
    const carol = await openInbox(TOKENS.alice, false);
    const session = unique("s-deny");
    await submit(session, "d4", "deploy", '{"service":"api","to":"production"}');
    const c = card(carol.page, session, "d4");
    await c.getByRole("button", { name: "Deny deploy call d4" }).click();
    await c.getByLabel("Reason to deny deploy call d4").fill("not today");
    await c.getByRole("button", { name: "Deny", exact: true }).click();
    const outcome = await outcomeOf(session, "d4");
    assert.equal(outcome.status, CallStatus.DENIED);
    assert.equal(outcome.reason, "not today");
    assert.equal(await carol.page.evaluate(() => (window as unknown as { webauthnGets: number }).webauthnGets), 0, "no WebAuthn request was made");
  });

  test("with none of the approver's passkeys on this device, the prompt fails, the card says so in words, and nothing is approved", async () => {
    const { page, cdp, authenticatorId } = bob;
    const [held] = await credentials(bob);
    await cdp.send("WebAuthn.removeCredential", { authenticatorId, credentialId: held.credentialId });
    const session = unique("s-elsewhere");
    await submit(session, "d8", "deploy", '{"service":"api","to":"production"}');
    const c = card(page, session, "d8");
    try {
      await c.getByRole("button", { name: "Approve deploy call d8" }).click();
      await c.locator(".outcome.error").filter({ hasText: "No passkey signed: the prompt was cancelled or timed out, or none of your registered passkeys is on this device. Nothing was approved." }).waitFor({ timeout: 90_000 });
    } finally {
      await cdp.send("WebAuthn.addCredential", { authenticatorId, credential: held });
    }
    assert.ok(await isPending(session, "d8"), "nothing was approved");
  });

  let alice: Person;

  test("another person's passkey signs their own approval (for the independent check)", async () => {
    alice = await openInbox(TOKENS.alice);
    await register(alice, "alice", "alice's key");
    const session = unique("s-alice");
    await submit(session, "d5", "deploy", '{"service":"web","to":"production"}');
    await card(alice.page, session, "d5").getByRole("button", { name: "Approve deploy call d5" }).click();
    const outcome = await outcomeOf(session, "d5");
    assert.equal(outcome.status, CallStatus.APPROVED);
    assert.equal(outcome.decidedBy, "approver:alice");
    evidence.receipts.alice = (await receiptOf(session, "d5")).envelope;
    const keys = await clients.agent.listReceiptKeys({});
    evidence.receiptKeys = keys.keys.map((k) => k.key?.publicKey ?? "");
  });

  test("a quorum of two: each person's passkey signs their own vote, and the receipt carries both", async () => {
    await clients.admin.createRule({
      rule: { id: "two-passkeys", tool: "deploy_database", effect: Effect.ASK, approvers: { quorum: 2, stepUp: StepUp.PASSKEY } },
    });
    const session = unique("s-quorum");
    await submit(session, "q1", "deploy_database", '{"database":"orders","to":"production"}');
    const first = card(bob.page, session, "q1");
    await first.getByRole("button", { name: "Approve deploy_database call q1" }).click();
    await first.getByText("Vote recorded: 1 of 2 approvals").waitFor();
    assert.ok(await isPending(session, "q1"), "one vote decides nothing");
    await card(alice.page, session, "q1").getByRole("button", { name: "Approve deploy_database call q1" }).click();
    const outcome = await outcomeOf(session, "q1");
    assert.equal(outcome.status, CallStatus.APPROVED);
    const receipt = await receiptOf(session, "q1");
    const approvals = JSON.parse(receipt.statement).predicate.stepUp.approvals as { approver: string }[];
    assert.deepEqual(approvals.map((a) => a.approver).sort(), ["alice", "bob"]);
    evidence.receipts.quorum = receipt.envelope;
  });

  test("an admin revokes a passkey in the Passkeys tab; its owner's approvals are refused from then on", async () => {
    const { page } = alice;
    await page.getByRole("tab", { name: "Passkeys" }).click();
    const everyone = page.getByRole("list", { name: "Everyone's passkeys" });
    await everyone.getByText("bob's laptop").waitFor();
    await everyone.getByRole("button", { name: "Revoke passkey bob's laptop of bob" }).click();
    await everyone.locator(`li[data-credential="${bobCredential.id}"]`, { hasText: "revoked" }).waitFor();
    const listed = await clients.admin.listPasskeys({ approver: "bob" });
    assert.equal(listed.passkeys[0]?.revokedBy, "alice");
    // Bob's inbox: his passkey signs nothing more, and the call stays pending.
    const session = unique("s-revoked");
    await submit(session, "d7", "deploy", '{"service":"api","to":"production"}');
    const c = card(bob.page, session, "d7");
    await c.getByRole("button", { name: "Approve deploy call d7" }).click();
    await c.locator(".outcome.error").filter({ hasText: "needs a passkey-signed approval and `bob` has no passkey" }).waitFor();
    assert.ok(await isPending(session, "d7"), "nothing was approved");
  });
});
