/**
 * The client checks an APPROVED outcome's signed receipt before it hands the input back to run
 * (PRODUCT.md guarantee 10, docs/receipts.md "Executors check what they run"), against a real
 * broker: an approval verifies and runs; an untrusted key, a database row edited to APPROVED, a
 * forged receipt, a broker signing nothing each fail closed with a result text naming why. Then
 * the pure verifier, against receipts the broker signed, and the RFC 8785 canonicalizer.
 */
import assert from "node:assert/strict";
import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync, randomBytes, sign, type KeyObject } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { canonicalize, type Outcome, Status, trustedKeys, verifyApproval, type BrokerOptions, type ToolCall } from "../src/index.js";
import { connectBroker } from "../src/node.js";
import { pae, PAYLOAD_TYPE } from "../src/receipts.js";
import { sha256Hex } from "../src/sha256.js";
import { approveWhenPending, BrokerProcess, decide, newSession, type Decision } from "./broker.js";

const CALL: ToolCall = { callId: "toolu_01", tool: "run_shell", input: { command: "ls -la", cwd: "/srv" }, title: "List files" };
const OTHER: ToolCall = { callId: "toolu_02", tool: "read_file", input: { path: "notes.txt" } };
const UNVERIFIED_PREFIX = "The broker's outcome for this call could not be verified (";
const NOT_RUN_SUFFIX = "): the tool was not run.";

function signingKey(process_: BrokerProcess): KeyObject {
  return createPrivateKey(readFileSync(join(process_.directory, "approvals.db.receipt-key.pem")));
}

function rawPublic(key: KeyObject): Buffer {
  const publicKey = key.type === "public" ? key : createPublicKey(key);
  return Buffer.from(String(publicKey.export({ format: "jwk" }).x), "base64url");
}

async function reviewed(process_: BrokerProcess, session: string, decisions: Decision[], calls: ToolCall[], options: Partial<BrokerOptions> = {}): Promise<Outcome[]> {
  const approving = approveWhenPending(process_.target, session, decisions);
  const broker = connectBroker(process_.target, { logger: silent, ...options });
  try {
    return await broker.review(session, calls, { timeoutMs: 30_000 });
  } finally {
    await approving;
    await broker.close();
  }
}

const warnings: string[] = [];
const silent = { debug() {}, info() {}, warn: (m: string) => void warnings.push(m) };

function assertNotRun(outcome: Outcome | undefined, why: string): void {
  assert.ok(outcome);
  assert.equal(outcome.status, Status.UNVERIFIED);
  assert.equal(outcome.approved, false);
  assert.equal(outcome.inputJson, "");
  assert.deepEqual(outcome.input, {});
  assert.ok(outcome.toolResult.startsWith(UNVERIFIED_PREFIX) && outcome.toolResult.endsWith(NOT_RUN_SUFFIX), outcome.toolResult);
  assert.ok(outcome.reason.includes(why) && outcome.toolResult.includes(why), outcome.toolResult);
}

const sql = (text: string) => `'${text.replaceAll("'", "''")}'`;
const EDIT_ROW = (session: string) =>
  `UPDATE calls SET status = 2, decided_by = 'approver:mallory', reason = '', tool_result = '', run_input = input WHERE session_id = ${sql(session)} AND call_id = 'toolu_01';`;

describe("receipts checked against a real broker", () => {
  let process_: BrokerProcess;

  before(async () => {
    process_ = await BrokerProcess.started();
  });
  after(async () => {
    await process_.dispose();
  });

  test("an approval verifies with the broker's keys, read once, and on every path that returns it", async () => {
    const session = newSession();
    const outcomes = await reviewed(process_, session, [{ callId: "toolu_01", approve: true }, { callId: "toolu_02", approve: true, editedInputJson: '{"path":"README.md"}' }], [CALL, OTHER]);
    const [approved, edited] = outcomes;
    assert.equal(approved?.status, Status.APPROVED);
    assert.equal(approved?.inputJson, '{"command":"ls -la","cwd":"/srv"}');
    assert.ok(approved?.receipt);
    const statement = JSON.parse(Buffer.from(JSON.parse(approved.receipt).payload, "base64").toString()) as { predicate: { call: { callId: string }; chain: { sequence: number } } };
    assert.equal(statement.predicate.call.callId, "toolu_01");
    assert.equal(statement.predicate.chain.sequence, approved.receiptSequence);
    assert.equal(edited?.status, Status.APPROVED);
    assert.deepEqual(edited?.input, { path: "README.md" });
    const broker = connectBroker(process_.target);
    try {
      const looked = await broker.outcomes(session, ["toolu_01", "toolu_02"]);
      assert.deepEqual(looked.map((o) => [o?.status, o?.inputJson, o?.receiptSequence]), outcomes.map((o) => [o.status, o.inputJson, o.receiptSequence]));
      const [waited] = await broker.wait(session, ["toolu_02"], { timeoutMs: 5_000 });
      assert.equal(waited?.receiptSequence, edited?.receiptSequence);
      const keyId = createHash("sha256").update(rawPublic(signingKey(process_))).digest("hex");
      assert.deepEqual([...(await broker.receiptKeys()).keys()], [keyId]);
    } finally {
      await broker.close();
    }
    // Another call's receipt carried by this outcome does not prove it.
    const keys = trustedKeys([rawPublic(signingKey(process_))]);
    await assert.rejects(
      verifyApproval(edited?.receipt ?? "", keys, { sessionId: session, callId: "toolu_01", inputJson: approved.inputJson }),
      /not this call/,
    );
  });

  for (const form of ["base64", "pem", "raw bytes", "KeyObject"] as const) {
    test(`a configured key verifies, given as ${form}`, async () => {
      const publicKey = createPublicKey(signingKey(process_));
      const key = {
        base64: rawPublic(publicKey).toString("base64"),
        pem: String(publicKey.export({ format: "pem", type: "spki" })),
        "raw bytes": new Uint8Array(rawPublic(publicKey)),
        KeyObject: publicKey,
      }[form];
      const [outcome] = await reviewed(process_, newSession(), [{ callId: "toolu_01", approve: true }], [CALL], { trustedReceiptKeys: [key] });
      assert.equal(outcome?.status, Status.APPROVED);
      assert.deepEqual(outcome?.input, CALL.input);
    });
  }

  test("with an untrusted key configured, an approval fails closed; a denial passes as it is", async () => {
    const stranger = generateKeyPairSync("ed25519").publicKey;
    const [outcome] = await reviewed(process_, newSession(), [{ callId: "toolu_01", approve: true }], [CALL], { trustedReceiptKeys: [stranger] });
    assertNotRun(outcome, "which is not a key this client trusts");
    assert.ok(warnings.some((w) => w.includes("not running call")));
    const [denied] = await reviewed(process_, newSession(), [{ callId: "toolu_01", approve: false, reason: "no" }], [CALL], { trustedReceiptKeys: [stranger] });
    assert.equal(denied?.status, Status.DENIED);
  });

  test("a DENIED row edited to APPROVED in the SQLite file is not run", async () => {
    const session = newSession();
    const [denied] = await reviewed(process_, session, [{ callId: "toolu_01", approve: false, reason: "not on prod" }], [CALL]);
    assert.equal(denied?.status, Status.DENIED);
    await process_.editDatabase(EDIT_ROW(session));
    // The edit took: a client that does not check is handed the call to run.
    const trusting = connectBroker(process_.target, { verifyReceipts: false, logger: silent });
    const [served] = await trusting.outcomes(session, ["toolu_01"]);
    await trusting.close();
    assert.equal(served?.status, Status.APPROVED);
    assert.deepEqual(served?.input, CALL.input);
    // The checking client refuses it, naming why, on every path that returns outcomes.
    const broker = connectBroker(process_.target, { logger: silent });
    try {
      const [lookedUp] = await broker.outcomes(session, ["toolu_01"]);
      const [again] = await broker.review(session, [CALL], { timeoutMs: 10_000 });
      const [waited] = await broker.wait(session, ["toolu_01"], { timeoutMs: 10_000 });
      for (const outcome of [lookedUp, again, waited]) assertNotRun(outcome, "its signed receipt says DENIED");
      assert.equal(again?.toolResult, "The broker's outcome for this call could not be verified (its signed receipt says DENIED): the tool was not run.");
    } finally {
      await broker.close();
    }
  });

  const forgeries: [string, (statement: string, row: { keyid: string; sig: string }) => { payload: string; keyid: string; sig: string }, string][] = [
    [
      "signed by another key",
      (payload) => {
        const forger = generateKeyPairSync("ed25519");
        const keyid = createHash("sha256").update(rawPublic(forger.publicKey)).digest("hex");
        return { payload, keyid, sig: sign(null, pae(PAYLOAD_TYPE, Buffer.from(payload)), forger.privateKey).toString("base64") };
      },
      "which is not a key this client trusts",
    ],
    ["payload edited, the broker's signature kept", (payload, row) => ({ payload, ...row }), "signature does not verify with key"],
    ["a signature that is not base64", (payload, row) => ({ payload, keyid: row.keyid, sig: "not%base64!" }), "signature does not verify with key"],
  ];
  for (const [name, forge, why] of forgeries) {
    test(`a forged receipt fails closed: ${name}`, async () => {
      const session = newSession();
      await reviewed(process_, session, [{ callId: "toolu_01", approve: false }], [CALL]);
      const [payload = "", keyid = "", sig = ""] = process_
        .query(`SELECT payload || char(31) || keyid || char(31) || sig FROM receipts WHERE session_id = ${sql(session)} AND call_id = 'toolu_01'`)
        .split("\x1f");
      const statement = JSON.parse(payload) as { subject: { digest: unknown }[]; predicate: Record<string, unknown> };
      assert.equal(statement.predicate.outcome, "DENIED");
      Object.assign(statement.predicate, { outcome: "APPROVED", reason: "", decidedBy: "approver:mallory", runs: { digest: statement.subject[0]?.digest, edited: false } });
      const forged = forge(canonicalize(statement), { keyid, sig });
      await process_.editDatabase(
        `${EDIT_ROW(session)}\nUPDATE receipts SET payload = ${sql(forged.payload)}, keyid = ${sql(forged.keyid)}, sig = ${sql(forged.sig)} WHERE session_id = ${sql(session)} AND call_id = 'toolu_01';`,
      );
      const broker = connectBroker(process_.target, { logger: silent });
      try {
        const [outcome] = await broker.outcomes(session, ["toolu_01"]);
        assertNotRun(outcome, why);
      } finally {
        await broker.close();
      }
    });
  }

  test("a broker out of reach for its keys fails the approval closed", async () => {
    const session = newSession();
    const [approved] = await reviewed(process_, session, [{ callId: "toolu_01", approve: true }], [CALL]);
    assert.equal(approved?.status, Status.APPROVED);
    const raw = await (async () => {
      const b = connectBroker(process_.target, { verifyReceipts: false, logger: silent });
      try {
        return (await b.outcomes(session, ["toolu_01"]))[0];
      } finally {
        await b.close();
      }
    })();
    await process_.stop("SIGKILL");
    try {
      const broker = connectBroker(process_.target, { rpcTimeoutMs: 2_000, logger: silent });
      // The outcome as it arrived, the broker gone before its keys are read.
      const checked = await (broker as unknown as { checked(o: Outcome[], t: undefined): Promise<Outcome[]> }).checked([raw as Outcome], undefined);
      await broker.close();
      assertNotRun(checked[0], "the broker's receipt keys could not be read (");
    } finally {
      await process_.start();
    }
  });
});

describe("a broker signing nothing (--receipts off)", () => {
  test("fails every approval closed, unless the check is turned off", async () => {
    const process_ = await BrokerProcess.started(["--receipts", "off"]);
    try {
      const [outcome] = await reviewed(process_, newSession(), [{ callId: "toolu_01", approve: true }], [CALL]);
      assertNotRun(outcome, "the broker signs no receipts");
      const key = generateKeyPairSync("ed25519").publicKey;
      const [withKey] = await reviewed(process_, newSession(), [{ callId: "toolu_01", approve: true }], [CALL], { trustedReceiptKeys: [key] });
      assertNotRun(withKey, "the broker has no receipt for it");
      warnings.length = 0;
      const [unchecked] = await reviewed(process_, newSession(), [{ callId: "toolu_01", approve: true }], [CALL], { verifyReceipts: false });
      assert.equal(unchecked?.status, Status.APPROVED);
      assert.equal(unchecked?.receiptSequence, undefined);
      assert.ok(warnings.some((w) => w.includes("receipt verification is off")));
      assert.throws(() => connectBroker(process_.target, { verifyReceipts: false, trustedReceiptKeys: [key] }), /turns the check off/);
      assert.throws(() => connectBroker(process_.target, { trustedReceiptKeys: [] }), /is empty/);
    } finally {
      await process_.dispose();
    }
  });
});

describe("the verifier alone, on receipts the broker signed", () => {
  let process_: BrokerProcess;
  let envelope: string;
  let session: string;
  let keys: ReturnType<typeof trustedKeys>;
  const INPUT = '{"command":"ls -la","cwd":"/srv"}';

  before(async () => {
    process_ = await BrokerProcess.started();
    session = newSession();
    const broker = connectBroker(process_.target, { verifyReceipts: false, logger: silent });
    try {
      await broker.submit(session, [CALL]);
      await decide(process_.target, session, [{ callId: "toolu_01", approve: true }]);
      envelope = (await broker.wait(session, ["toolu_01"], { timeoutMs: 10_000 }))[0]?.receipt ?? "";
    } finally {
      await broker.close();
    }
    keys = trustedKeys([rawPublic(signingKey(process_))]);
  });
  after(async () => {
    await process_.dispose();
  });

  /** The envelope with its statement changed and signed again with the broker's own key: what
   * the statement says must be checked, not only the signature. */
  type Statement = { predicateType: string; predicate: Record<string, unknown> };
  function resign(change: (statement: Statement) => void, canonical = true): string {
    const data = JSON.parse(envelope) as { payload: string; signatures: { keyid: string; sig: string }[] };
    const statement = JSON.parse(Buffer.from(data.payload, "base64").toString()) as Statement;
    change(statement);
    const payload = Buffer.from(canonical ? canonicalize(statement) : JSON.stringify(statement, null, 1));
    data.payload = payload.toString("base64");
    data.signatures = [{ keyid: data.signatures[0]?.keyid ?? "", sig: sign(null, pae(PAYLOAD_TYPE, payload), signingKey(process_)).toString("base64") }];
    return JSON.stringify(data);
  }

  const claim = () => ({ sessionId: session, callId: "toolu_01", inputJson: INPUT });

  test("a genuine receipt returns the canonical input to run", async () => {
    assert.equal(await verifyApproval(envelope, keys, { ...claim(), inputJson: '{ "cwd": "/srv", "command": "ls -la" }', tool: "run_shell" }), INPUT);
  });

  test("each thing that does not hold is named", async () => {
    const cases: [string, () => Promise<string>][] = [
      ["its signed receipt says DENIED", () => verifyApproval(resign((s) => (s.predicate.outcome = "DENIED")), keys, claim())],
      ["not this call", () => verifyApproval(envelope, keys, { ...claim(), callId: "toolu_02" })],
      ["not this call", () => verifyApproval(envelope, keys, { ...claim(), sessionId: "another" })],
      ["for tool \"run_shell\", not \"rm\"", () => verifyApproval(envelope, keys, { ...claim(), tool: "rm" })],
      ["another batch", () => verifyApproval(envelope, keys, { ...claim(), batchId: "b-other" })],
      ["not the input its signed receipt approved", () => verifyApproval(envelope, keys, { ...claim(), inputJson: '{"command":"rm -rf /"}' })],
      ["the input to run is not JSON", () => verifyApproval(envelope, keys, { ...claim(), inputJson: "{" })],
      ["not canonical JSON", () => verifyApproval(resign(() => undefined, false), keys, claim())],
      ["subject is not the digest of its input", () => verifyApproval(resign((s) => (s.predicate.input = { command: "rm -rf /" })), keys, claim())],
      ["digest of the input that runs", () => verifyApproval(resign((s) => (s.predicate.runs = { ...(s.predicate.runs as object), input: { command: "rm -rf /" } })), keys, claim())],
      ["not an approval-broker receipt", () => verifyApproval(resign((s) => (s.predicateType = "x")), keys, claim())],
      ["decided before its key", () => verifyApproval(envelope, new Map([...keys].map(([id, k]) => [id, { ...k, validFromNanos: BigInt(Date.now() + 60_000) * 1_000_000n }])), claim())],
      ["decided after its key", () => verifyApproval(envelope, new Map([...keys].map(([id, k]) => [id, { ...k, validUntilNanos: 1n }])), claim())],
      ["not a DSSE envelope (not JSON)", () => verifyApproval("garbage", keys, claim())],
      ["carries no signature", () => verifyApproval(JSON.stringify({ ...JSON.parse(envelope), signatures: [] }), keys, claim())],
      ["payload is not base64", () => verifyApproval(JSON.stringify({ ...JSON.parse(envelope), payload: "%%%" }), keys, claim())],
      ["trusts no receipt key", () => verifyApproval(envelope, new Map(), claim())],
    ];
    for (const [why, run] of cases) await assert.rejects(run(), (e: Error) => e.name === "ReceiptRejected" && e.message.includes(why), why);
  });

  test("keys that are not Ed25519 public keys are refused when configured", () => {
    const ec = String(generateKeyPairSync("ec", { namedCurve: "prime256v1" }).publicKey.export({ format: "pem", type: "spki" }));
    assert.throws(() => trustedKeys([ec]), /must be an Ed25519 public key/);
    assert.throws(() => trustedKeys(["not base64!"]), /must be base64 of the raw 32-byte/);
    assert.throws(() => trustedKeys([new Uint8Array(31)]), /must be 32 bytes, not 31/);
    assert.throws(() => trustedKeys([generateKeyPairSync("x25519").publicKey]), /must be an Ed25519 public key/);
  });

  test("SHA-256 (the package's own, for digests and key ids) agrees with Node's on every length", () => {
    for (let n = 0; n < 260; n++) {
      const data = randomBytes(n);
      assert.equal(sha256Hex(data), createHash("sha256").update(data).digest("hex"), `length ${n}`);
    }
    assert.equal(sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  });

  test("RFC 8785: sorted keys by UTF-16 code units, ECMAScript numbers, minimal escapes", () => {
    assert.equal(canonicalize({ b: [1, 2.5, -0, 1e21, 1e-7], a: "é\u2028\n\"", "\u20ac": 1, "\ud83d\ude00": 2, "\ufb33": 3 }),
      '{"a":"é\u2028\\n\\"","b":[1,2.5,0,1e+21,1e-7],"\u20ac":1,"\ud83d\ude00":2,"\ufb33":3}');
    assert.equal(canonicalize(JSON.parse('{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001]}')),
      '{"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}');
    assert.throws(() => canonicalize({ x: Number.NaN }), TypeError);
  });
});
