// The independent check of passkey-signed approvals (issue 46): the receipts a real broker wrote
// for calls approved through the inbox with Chromium's virtual authenticator
// (web/tests/passkeys.test.ts, which leaves them in $PASSKEY_EVIDENCE_DIR/evidence.json with
// each person's credential as the authenticator holds it) are checked here with no broker code:
// the DSSE signature with node:crypto, and each passkey assertion with @simplewebauthn/server
// (verifyAuthenticationResponse), its challenge recomputed from what the receipt says was shown
// (docs/receipts.md, "Passkey-signed approvals"). The real receipts are accepted (one of them a
// quorum of two, each person's vote signed by their own passkey); a receipt given the assertion
// of another call, another input, or another person's credential is refused, each for the reason
// it should be.
import assert from "node:assert/strict";
import { createHash, createPublicKey, verify } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { verifyAuthenticationResponse } from "@simplewebauthn/server";
import { decodeCredentialPublicKey, cose } from "@simplewebauthn/server/helpers";

const dir = process.env.PASSKEY_EVIDENCE_DIR;
assert.ok(dir, "PASSKEY_EVIDENCE_DIR names the browser test's evidence (run by .ci/passkeys)");
/** @type {{origin: string, rpId: string, people: Record<string, {credentialId: string, publicKeySpki: string}[]>, receipts: Record<string, string>, receiptKeys: string[]}} */
const evidence = JSON.parse(readFileSync(join(dir, "evidence.json"), "utf8"));

const sha256 = (bytes) => createHash("sha256").update(bytes).digest();
const b64u = (bytes) => Buffer.from(bytes).toString("base64url");

/** RFC 8785 for the JSON this check builds (strings, integers, booleans, null, arrays, objects). */
function canonical(value) {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  const keys = Object.keys(value).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
}

/** The statement inside a DSSE envelope. */
const statementOf = (envelope) => JSON.parse(Buffer.from(JSON.parse(envelope).payload, "base64").toString("utf8"));

/** DSSE: Ed25519 over the pre-authentication encoding, with one of the broker's keys. */
function dsseVerifies(envelope) {
  const e = JSON.parse(envelope);
  const payload = Buffer.from(e.payload, "base64");
  const pae = Buffer.concat([Buffer.from(`DSSEv1 ${Buffer.byteLength(e.payloadType)} ${e.payloadType} ${payload.length} `), payload]);
  return evidence.receiptKeys.some((raw) => {
    const key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(raw, "base64").toString("base64url") }, format: "jwk" });
    return e.signatures.some((s) => verify(null, pae, key, Buffer.from(s.sig, "base64")));
  });
}

/** The P-256 point of a COSE key and of an SPKI key, to compare the two. */
function coseXY(coseBytes) {
  const key = decodeCredentialPublicKey(coseBytes);
  return `${b64u(key.get(cose.COSEKEYS.x))}.${b64u(key.get(cose.COSEKEYS.y))}`;
}
function spkiXY(spkiB64) {
  const jwk = createPublicKey({ key: Buffer.from(spkiB64, "base64"), format: "der", type: "spki" }).export({ format: "jwk" });
  return `${jwk.x}.${jwk.y}`;
}

/** The digest of what `approver` was shown, from the receipt alone (docs/receipts.md). */
function statementDigest(predicate, approver) {
  return sha256(canonical(shownStatement(predicate, approver)));
}

/**
 * Checks every passkey assertion of a receipt's statement; resolves to the approvers whose
 * assertions verified, or rejects naming the check that failed.
 */
async function checkPasskeys(statement) {
  const p = statement.predicate;
  const assertions = passkeyAssertions(p);
  assert.ok(assertions.length > 0, "the receipt carries no passkey assertion");
  const who = [];
  for (const a of assertions) {
    const digest = statementDigest(p, a.approver);
    // The approver's credential as their authenticator holds it (not as the broker says).
    const theirs = (evidence.people[a.approver] ?? []).find((c) => c.credentialId === a.credentialId);
    if (!theirs) throw new Error(`credential ${a.credentialId} is not one of ${a.approver}'s passkeys`);
    if (coseXY(Buffer.from(a.publicKey, "base64url")) !== spkiXY(theirs.publicKeySpki)) throw new Error(`the receipt's public key is not ${a.approver}'s credential's`);
    const challenge = b64u(sha256(Buffer.concat([digest, Buffer.from(a.nonce, "base64url")])));
    const result = await verifyAuthenticationResponse({
      response: {
        id: a.credentialId,
        rawId: a.credentialId,
        type: "public-key",
        clientExtensionResults: {},
        response: { authenticatorData: a.authenticatorData, clientDataJSON: a.clientDataJSON, signature: a.signature },
      },
      expectedChallenge: challenge,
      expectedOrigin: evidence.origin,
      expectedRPID: evidence.rpId,
      credential: { id: a.credentialId, publicKey: new Uint8Array(Buffer.from(a.publicKey, "base64url")), counter: 0 },
      requireUserVerification: false,
    });
    if (!result.verified) throw new Error("the signature does not verify");
    if (a.statementDigest !== digest.toString("hex")) throw new Error(`the receipt's statementDigest ${a.statementDigest} is not the digest of what it says was shown`);
    if (a.rpId !== evidence.rpId) throw new Error(`the receipt names relying party ${a.rpId}, not ${evidence.rpId}`);
    who.push(a.approver);
  }
  // Every approver the outcome names signed, and nobody else did.
  const named = (p.decidedBy ?? "").replace(/^approver:/, "").split(",");
  for (const a of who) if (!named.includes(a)) throw new Error(`${a} signed, but the outcome names ${p.decidedBy}`);
  for (const n of named) if (!who.includes(n)) throw new Error(`${n} approved, but the receipt carries no passkey assertion of theirs`);
  return who;
}

// ---- The receipt's passkey fields (docs/receipts.md, "Passkey-signed approvals") ----------

/**
 * The statement an approver was shown and signed, rebuilt from the receipt alone: who approves
 * (the assertion's `approver`), the call's identity, its tool, the input that runs (the edit, if
 * any), title, message, and the requirement (`stepUp.requirement`).
 */
function shownStatement(p, approver) {
  return {
    purpose: "approval-broker/step-up/v1",
    approver,
    call: { agent: p.call.agent, sessionId: p.call.sessionId, callId: p.call.callId },
    tool: p.tool,
    input: p.runs?.input ?? p.input,
    edited: p.runs?.edited === true,
    title: p.shown.title,
    message: p.shown.message,
    requirement: p.stepUp?.requirement ?? null,
  };
}

/** The receipt's assertions (`stepUp.approvals`), each with its approver; the objects themselves. */
function passkeyAssertions(p) {
  return p.stepUp?.approvals ?? [];
}

/** Puts `assertions` in place of the statement's own. */
function setAssertions(statement, assertions) {
  statement.predicate.stepUp.approvals = clone(assertions);
}

// ---- Tests ------------------------------------------------------------------------------------

const real = Object.entries(evidence.receipts);
const clone = (value) => JSON.parse(JSON.stringify(value));

describe("passkey assertions in a real broker's receipts, checked by @simplewebauthn/server", () => {
  test("the browser test left four receipts and two people's credentials", () => {
    assert.deepEqual(Object.keys(evidence.receipts).sort(), ["alice", "approved", "edited", "quorum"]);
    assert.deepEqual(Object.keys(evidence.people).sort(), ["alice", "bob"]);
  });

  for (const [name, envelope] of real) {
    test(`the ${name} receipt is accepted: its DSSE signature and its passkey assertion verify`, async () => {
      assert.ok(dsseVerifies(envelope), "the broker's signature");
      const who = await checkPasskeys(statementOf(envelope));
      assert.deepEqual(who, { alice: ["alice"], quorum: ["bob", "alice"] }[name] ?? ["bob"]);
    });
  }

  test("a receipt given the assertion of another call is refused: the challenge is not this call's", async () => {
    const statement = statementOf(evidence.receipts.approved);
    const other = statementOf(evidence.receipts.edited);
    setAssertions(statement, passkeyAssertions(other.predicate));
    await assert.rejects(checkPasskeys(statement), /challenge/i);
  });

  test("a receipt whose input was changed is refused: the passkey signed another input", async () => {
    const statement = statementOf(evidence.receipts.approved);
    statement.predicate.input = { ...statement.predicate.input, to: "staging" };
    await assert.rejects(checkPasskeys(statement), /challenge/i);
  });

  test("a receipt naming another person than the passkey's owner is refused", async () => {
    const statement = statementOf(evidence.receipts.approved);
    for (const a of passkeyAssertions(statement.predicate)) a.approver = "alice";
    setApprover(statement, "alice");
    await assert.rejects(checkPasskeys(statement), /is not one of alice's passkeys/);
  });

  test("a receipt given another person's credential and assertion is refused", async () => {
    const statement = statementOf(evidence.receipts.approved);
    const alice = passkeyAssertions(statementOf(evidence.receipts.alice).predicate).map((a) => ({ ...a, approver: "bob" }));
    setAssertions(statement, alice);
    await assert.rejects(checkPasskeys(statement), /is not one of bob's passkeys/);
  });

  test("a quorum receipt missing one person's assertion is refused", async () => {
    const statement = statementOf(evidence.receipts.quorum);
    statement.predicate.stepUp.approvals = statement.predicate.stepUp.approvals.filter((a) => a.approver !== "alice");
    await assert.rejects(checkPasskeys(statement), /alice approved, but the receipt carries no passkey assertion of theirs/);
  });

  test("a quorum receipt whose two assertions were swapped between the people is refused", async () => {
    const statement = statementOf(evidence.receipts.quorum);
    for (const a of passkeyAssertions(statement.predicate)) a.approver = a.approver === "bob" ? "alice" : "bob";
    await assert.rejects(checkPasskeys(statement), /is not one of (alice|bob)'s passkeys/);
  });

  test("a changed signature is refused", async () => {
    const statement = statementOf(evidence.receipts.approved);
    const a = passkeyAssertions(statement.predicate)[0];
    const sig = Buffer.from(a.signature, "base64url");
    sig[sig.length - 1] ^= 1;
    a.signature = b64u(sig);
    await assert.rejects(checkPasskeys(statement), /signature does not verify/);
  });

  test("a receipt saying someone else decided, with the passkey's owner's assertion, is refused", async () => {
    const statement = statementOf(evidence.receipts.approved);
    setApprover(statement, "alice");
    await assert.rejects(checkPasskeys(statement), /bob signed, but the outcome names approver:alice/);
  });
});

/** Makes the statement say `who` decided. */
function setApprover(statement, who) {
  statement.predicate.decidedBy = `approver:${who}`;
}

