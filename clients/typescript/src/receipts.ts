/**
 * Checks a broker's signed receipt before an APPROVED call runs.
 *
 * The broker signs every outcome as a DSSE envelope over an in-toto Statement
 * (docs/receipts.md): Ed25519 over DSSE's pre-authentication encoding, `keyid` the SHA-256 (hex)
 * of the raw 32-byte public key, the payload the statement's RFC 8785 canonical JSON. The client
 * runs a tool only when such a receipt, signed by a key it trusts, says APPROVED for exactly this
 * session and call id and exactly the input the client hands back to run (`verifyApproval`). The
 * trusted keys come from the client's options or from `ListReceiptKeys`, read once: never from
 * the outcome or the receipt itself.
 *
 * Everything here is pure (Node's built-in `crypto`, no network). `ReceiptRejected` names what
 * did not hold, as a clause the model can read.
 * @module
 */
import { createHash, createPublicKey, KeyObject, verify } from "node:crypto";
import { canonicalize } from "./canonical.js";

export const PAYLOAD_TYPE = "application/vnd.in-toto+json";
export const STATEMENT_TYPE = "https://in-toto.io/Statement/v1";
export const PREDICATE_TYPE = "https://approval-broker.dev/receipt/v1";

/**
 * A key as options give it: base64 of the raw 32 bytes (as the broker logs and serves it), a
 * `PUBLIC KEY` PEM, the raw 32 bytes, or a Node `KeyObject`.
 */
export type KeySource = string | Uint8Array | KeyObject;

/** The text the model reads when an APPROVED outcome fails its check. */
export function unverifiedText(reason: string): string {
  return `The broker's outcome for this call could not be verified (${reason}): the tool was not run.`;
}

/** The receipt does not prove the approval; `reason` says why (a clause for the model). */
export class ReceiptRejected extends Error {
  override name = "ReceiptRejected";
  constructor(readonly reason: string) {
    super(reason);
  }
}

/**
 * A public key receipts may be signed with and, when the broker said so, the window of decision
 * times it signed: from `validFrom` (included) until `validUntil` (excluded), as nanoseconds
 * since the epoch (receipt times have microseconds; a `Date` would round them).
 */
export interface TrustedKey {
  readonly publicKey: KeyObject;
  readonly keyId: string;
  readonly validFromNanos?: bigint;
  readonly validUntilNanos?: bigint;
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Strict base64 (standard alphabet, padded): Node's own decoder skips what it cannot read. */
export function decodeBase64(text: string): Buffer {
  if (!BASE64.test(text)) throw new ReceiptRejected("not base64");
  return Buffer.from(text, "base64");
}

function fromRaw(raw: Uint8Array): KeyObject {
  if (raw.length !== 32) throw new Error(`a trusted receipt key must be 32 bytes, not ${raw.length}`);
  return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(raw).toString("base64url") }, format: "jwk" });
}

function rawOf(key: KeyObject): Buffer {
  const jwk = key.export({ format: "jwk" });
  return Buffer.from(String(jwk.x), "base64url");
}

/** An Ed25519 public key from base64 (raw 32 bytes), PEM, raw bytes, or a `KeyObject`. */
export function parsePublicKey(source: KeySource): KeyObject {
  let key: KeyObject;
  if (source instanceof KeyObject) key = source;
  else if (typeof source === "string" && source.includes("-----BEGIN")) key = createPublicKey(source);
  else if (typeof source === "string") {
    let raw: Buffer;
    try {
      raw = decodeBase64(source.trim());
    } catch {
      throw new Error("a trusted receipt key must be base64 of the raw 32-byte Ed25519 public key, or a PEM");
    }
    key = fromRaw(raw);
  } else if (source.length === 32) key = fromRaw(source);
  else key = createPublicKey(Buffer.from(source).toString());
  if (key.type !== "public" || key.asymmetricKeyType !== "ed25519") {
    throw new Error("a trusted receipt key must be an Ed25519 public key");
  }
  return key;
}

/** A trusted key, with its key id, from any `KeySource`. */
export function trustedKey(source: KeySource, window: { validFromNanos?: bigint; validUntilNanos?: bigint } = {}): TrustedKey {
  const publicKey = parsePublicKey(source);
  return { publicKey, keyId: sha256Hex(rawOf(publicKey)), ...window };
}

/** The keys by key id. */
export function trustedKeys(sources: Iterable<KeySource | TrustedKey>): Map<string, TrustedKey> {
  const keys = new Map<string, TrustedKey>();
  for (const source of sources) {
    const key = isTrustedKey(source) ? source : trustedKey(source);
    keys.set(key.keyId, key);
  }
  return keys;
}

function isTrustedKey(value: KeySource | TrustedKey): value is TrustedKey {
  return typeof value === "object" && !(value instanceof KeyObject) && !(value instanceof Uint8Array) && "keyId" in value;
}

/** DSSE v1 pre-authentication encoding. */
export function pae(payloadType: string, payload: Uint8Array): Buffer {
  const type = Buffer.from(payloadType, "utf8");
  return Buffer.concat([
    Buffer.from(`DSSEv1 ${type.length} `, "utf8"),
    type,
    Buffer.from(` ${payload.length} `, "utf8"),
    payload,
  ]);
}

function sha256Hex(data: Uint8Array | string): string {
  return createHash("sha256").update(data).digest("hex");
}

function canonical(value: unknown): string {
  try {
    return canonicalize(value);
  } catch (e) {
    throw new ReceiptRejected(`a value has no canonical JSON form: ${(e as Error).message}`);
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function field(obj: unknown, ...path: string[]): unknown {
  let value = obj;
  for (const name of path) {
    if (!isObject(value) || !(name in value)) throw new ReceiptRejected(`its receipt has no \`${path.join(".")}\``);
    value = value[name];
  }
  return value;
}

const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$/;

/** An RFC 3339 time as nanoseconds since the epoch, exactly. */
export function parseTimeNanos(text: unknown): bigint {
  if (typeof text !== "string") throw new ReceiptRejected("its receipt has no decision time");
  const m = RFC3339.exec(text);
  if (m === null) throw new ReceiptRejected(`its receipt's decision time ${JSON.stringify(text)} is not RFC 3339`);
  const [, y, mo, d, h, mi, s, frac = "", zone = "Z"] = m;
  let millis = Date.UTC(Number(y), Number(mo) - 1, Number(d), Number(h), Number(mi), Number(s));
  if (zone !== "Z" && zone !== "z") {
    const sign = zone.startsWith("-") ? -1 : 1;
    millis -= sign * (Number(zone.slice(1, 3)) * 60 + Number(zone.slice(4, 6))) * 60_000;
  }
  return BigInt(millis) * 1_000_000n + BigInt(frac.padEnd(9, "0") || "0");
}

/**
 * Checks the envelope's signature with the trusted key its `keyid` names; returns the statement
 * (whose payload must be canonical JSON) and the key.
 */
export function checkSignature(envelopeJson: string, keys: ReadonlyMap<string, TrustedKey>): { statement: Record<string, unknown>; key: TrustedKey } {
  let envelope: unknown;
  try {
    envelope = JSON.parse(envelopeJson);
  } catch {
    throw new ReceiptRejected("its receipt is not a DSSE envelope (not JSON)");
  }
  if (!isObject(envelope)) throw new ReceiptRejected("its receipt is not a DSSE envelope");
  if (envelope.payloadType !== PAYLOAD_TYPE) throw new ReceiptRejected(`its receipt's payloadType is not ${PAYLOAD_TYPE}`);
  let payload: Buffer;
  try {
    payload = decodeBase64(String(envelope.payload ?? ""));
  } catch {
    throw new ReceiptRejected("its receipt's payload is not base64");
  }
  const signatures = envelope.signatures;
  if (!Array.isArray(signatures) || signatures.length === 0) throw new ReceiptRejected("its receipt carries no signature");
  const named: string[] = [];
  let signedBy: TrustedKey | undefined;
  for (const signature of signatures) {
    if (!isObject(signature)) continue;
    const keyId = signature.keyid;
    const key = typeof keyId === "string" ? keys.get(keyId) : undefined;
    if (key === undefined) {
      named.push(keyId ? `key ${String(keyId).slice(0, 16)}…` : "no key id");
      continue;
    }
    let valid = false;
    try {
      valid = verify(null, pae(PAYLOAD_TYPE, payload), key.publicKey, decodeBase64(String(signature.sig ?? "")));
    } catch {
      valid = false;
    }
    if (!valid) throw new ReceiptRejected(`its receipt's signature does not verify with key ${key.keyId.slice(0, 16)}…`);
    signedBy = key;
    break;
  }
  if (signedBy === undefined) {
    throw new ReceiptRejected(`its receipt is signed with ${named.join(", ") || "no key"}, which is not a key this client trusts`);
  }
  const text = payload.toString("utf8");
  let statement: unknown;
  try {
    statement = JSON.parse(text);
  } catch {
    throw new ReceiptRejected("its receipt's statement is not JSON");
  }
  if (!isObject(statement) || !Buffer.from(canonical(statement), "utf8").equals(payload)) {
    throw new ReceiptRejected("its receipt's statement is not canonical JSON");
  }
  return { statement, key: signedBy };
}

/** What an approval is checked against: the call, and the input about to run. */
export interface ApprovalClaim {
  sessionId: string;
  callId: string;
  /** The outcome's input to run (JSON text); compared in canonical form. */
  inputJson: string;
  /** When given, the receipt must name this tool. */
  tool?: string | undefined;
  /** When given (non-empty), the receipt must name this batch. */
  batchId?: string | undefined;
}

/**
 * Checks that the receipt, signed by a trusted key, says APPROVED for exactly this session and
 * call id (and tool, and batch, when given) and exactly the input `inputJson`. Returns that
 * input's canonical JSON text: the input to run. Throws `ReceiptRejected` naming what did not
 * hold.
 */
export function verifyApproval(envelopeJson: string, keys: ReadonlyMap<string, TrustedKey>, claim: ApprovalClaim): string {
  if (keys.size === 0) throw new ReceiptRejected("this client trusts no receipt key");
  const { statement, key } = checkSignature(envelopeJson, keys);
  if (statement._type !== STATEMENT_TYPE || statement.predicateType !== PREDICATE_TYPE) {
    throw new ReceiptRejected("its receipt is not an approval-broker receipt statement");
  }
  const predicate = field(statement, "predicate") as Record<string, unknown>;
  const call = field(predicate, "call");
  if (!isObject(call)) throw new ReceiptRejected("its receipt has no `call`");
  if (call.sessionId !== claim.sessionId || call.callId !== claim.callId) {
    throw new ReceiptRejected(
      `its signed receipt is for session ${JSON.stringify(call.sessionId)}, call ${JSON.stringify(call.callId)}, not this call`,
    );
  }
  if (claim.batchId && call.batchId !== claim.batchId) throw new ReceiptRejected("its signed receipt is for another batch of this call id");
  if (claim.tool !== undefined && predicate.tool !== claim.tool) {
    throw new ReceiptRejected(`its signed receipt is for tool ${JSON.stringify(predicate.tool)}, not ${JSON.stringify(claim.tool)}`);
  }
  const outcome = predicate.outcome;
  if (outcome !== "APPROVED") throw new ReceiptRejected(`its signed receipt says ${String(outcome)}`);
  const decidedAt = parseTimeNanos(field(predicate, "times", "decidedAt"));
  if (key.validFromNanos !== undefined && decidedAt < key.validFromNanos) {
    throw new ReceiptRejected(`its receipt was decided before its key ${key.keyId.slice(0, 16)}… started signing`);
  }
  if (key.validUntilNanos !== undefined && decidedAt >= key.validUntilNanos) {
    throw new ReceiptRejected(`its receipt was decided after its key ${key.keyId.slice(0, 16)}… was retired`);
  }
  const asked = canonical(field(predicate, "input"));
  const subjects = statement.subject;
  if (!Array.isArray(subjects) || subjects.length !== 1 || field(subjects[0], "digest", "sha256") !== sha256Hex(asked)) {
    throw new ReceiptRejected("its receipt's subject is not the digest of its input");
  }
  const runs = predicate.runs;
  if (!isObject(runs)) throw new ReceiptRejected("its signed receipt says nothing runs");
  const toRun = "input" in runs ? canonical(runs.input) : asked;
  if (field(runs, "digest", "sha256") !== sha256Hex(toRun)) {
    throw new ReceiptRejected("its receipt's digest of the input that runs does not match that input");
  }
  let given: string;
  try {
    given = canonical(JSON.parse(claim.inputJson));
  } catch (e) {
    if (e instanceof ReceiptRejected) throw e;
    throw new ReceiptRejected("the input to run is not JSON");
  }
  if (given !== toRun) throw new ReceiptRejected("the input it would run is not the input its signed receipt approved");
  return toRun;
}

/** The chain sequence a receipt names; read once the receipt verified. */
export function chainSequence(envelopeJson: string): number | undefined {
  try {
    const envelope = JSON.parse(envelopeJson) as { payload: string };
    const statement = JSON.parse(Buffer.from(envelope.payload, "base64").toString("utf8")) as {
      predicate?: { chain?: { sequence?: unknown } };
    };
    const sequence = statement.predicate?.chain?.sequence;
    return typeof sequence === "number" ? sequence : undefined;
  } catch {
    return undefined;
  }
}
