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
 * Everything here is pure (no network) and runs in Node and in browsers alike: Ed25519 is
 * WebCrypto's (`crypto.subtle`, built into Node and current browsers), SHA-256 and RFC 8785 are
 * this package's own few lines. `ReceiptRejected` names what did not hold, as a clause the model
 * can read.
 * @module
 */
import { canonicalize } from "./canonical.js";
import { sha256Hex } from "./sha256.js";

export const PAYLOAD_TYPE = "application/vnd.in-toto+json";
export const STATEMENT_TYPE = "https://in-toto.io/Statement/v1";
export const PREDICATE_TYPE = "https://approval-broker.dev/receipt/v1";

/** A Node `KeyObject` (public, Ed25519), read through its JWK export. */
export interface KeyObjectLike {
  asymmetricKeyType?: string;
  export(options: { format: "jwk" }): { x?: string };
}

/**
 * A key as options give it: base64 of the raw 32 bytes (as the broker logs and serves it), a
 * `PUBLIC KEY` PEM, the raw 32 bytes, or a Node `KeyObject`.
 */
export type KeySource = string | Uint8Array | KeyObjectLike;

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
  /** The 32 bytes of the Ed25519 public key. */
  readonly publicKey: Uint8Array;
  readonly keyId: string;
  readonly validFromNanos?: bigint;
  readonly validUntilNanos?: bigint;
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Strict base64 (standard alphabet, padded): lenient decoders skip what they cannot read. */
export function decodeBase64(text: string): Uint8Array {
  if (!BASE64.test(text)) throw new ReceiptRejected("not base64");
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
}

/** The DER prefix of an Ed25519 SubjectPublicKeyInfo; the 32 key bytes follow it. */
const SPKI_ED25519 = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

function fromPem(pem: string): Uint8Array {
  const body = pem.replace(/-----(BEGIN|END) PUBLIC KEY-----/g, "").replace(/\s+/g, "");
  let der: Uint8Array;
  try {
    der = decodeBase64(body);
  } catch {
    throw new Error("a trusted receipt key PEM must hold a base64 PUBLIC KEY");
  }
  if (der.length !== 44 || SPKI_ED25519.some((byte, i) => der[i] !== byte)) {
    throw new Error("a trusted receipt key must be an Ed25519 public key");
  }
  return der.slice(12);
}

/** The 32 bytes of an Ed25519 public key from base64 (raw 32 bytes), PEM, raw bytes, or a
 * Node `KeyObject`. */
export function parsePublicKey(source: KeySource): Uint8Array {
  let raw: Uint8Array;
  if (typeof source === "string" && source.includes("-----BEGIN")) raw = fromPem(source);
  else if (typeof source === "string") {
    try {
      raw = decodeBase64(source.trim());
    } catch {
      throw new Error("a trusted receipt key must be base64 of the raw 32-byte Ed25519 public key, or a PEM");
    }
  } else if (source instanceof Uint8Array) raw = Uint8Array.from(source);
  else {
    if (source.asymmetricKeyType !== "ed25519") throw new Error("a trusted receipt key must be an Ed25519 public key");
    raw = decodeBase64Url(String(source.export({ format: "jwk" }).x ?? ""));
  }
  if (raw.length !== 32) throw new Error(`a trusted receipt key must be 32 bytes, not ${raw.length}`);
  return raw;
}

function decodeBase64Url(text: string): Uint8Array {
  const standard = text.replaceAll("-", "+").replaceAll("_", "/");
  return decodeBase64(standard + "=".repeat((4 - (standard.length % 4)) % 4));
}

/** A trusted key, with its key id, from any `KeySource`. */
export function trustedKey(source: KeySource, window: { validFromNanos?: bigint; validUntilNanos?: bigint } = {}): TrustedKey {
  const publicKey = parsePublicKey(source);
  return { publicKey, keyId: sha256Hex(publicKey), ...window };
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
  return typeof value === "object" && !(value instanceof Uint8Array) && "keyId" in value;
}

/** Whether `signature` is the key's Ed25519 signature of `message` (WebCrypto). */
async function ed25519Verify(key: TrustedKey, signature: Uint8Array, message: Uint8Array): Promise<boolean> {
  if (globalThis.crypto?.subtle === undefined) {
    // A browser page that is not a secure context (plain http:// on a name other than localhost).
    throw new ReceiptRejected("WebCrypto (crypto.subtle) is not available here, so no signature can be checked: browsers give it only to secure contexts (https://, localhost)");
  }
  try {
    const publicKey = await crypto.subtle.importKey("raw", Uint8Array.from(key.publicKey), { name: "Ed25519" }, false, ["verify"]);
    return await crypto.subtle.verify({ name: "Ed25519" }, publicKey, Uint8Array.from(signature), Uint8Array.from(message));
  } catch {
    return false;
  }
}

/** DSSE v1 pre-authentication encoding. */
export function pae(payloadType: string, payload: Uint8Array): Uint8Array {
  const encoder = new TextEncoder();
  const type = encoder.encode(payloadType);
  const parts = [encoder.encode(`DSSEv1 ${type.length} `), type, encoder.encode(` ${payload.length} `), payload];
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
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
export async function checkSignature(
  envelopeJson: string,
  keys: ReadonlyMap<string, TrustedKey>,
): Promise<{ statement: Record<string, unknown>; key: TrustedKey }> {
  let envelope: unknown;
  try {
    envelope = JSON.parse(envelopeJson);
  } catch {
    throw new ReceiptRejected("its receipt is not a DSSE envelope (not JSON)");
  }
  if (!isObject(envelope)) throw new ReceiptRejected("its receipt is not a DSSE envelope");
  if (envelope.payloadType !== PAYLOAD_TYPE) throw new ReceiptRejected(`its receipt's payloadType is not ${PAYLOAD_TYPE}`);
  let payload: Uint8Array;
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
    let sig: Uint8Array | undefined;
    try {
      sig = decodeBase64(String(signature.sig ?? ""));
    } catch {
      sig = undefined;
    }
    const valid = sig !== undefined && (await ed25519Verify(key, sig, pae(PAYLOAD_TYPE, payload)));
    if (!valid) throw new ReceiptRejected(`its receipt's signature does not verify with key ${key.keyId.slice(0, 16)}…`);
    signedBy = key;
    break;
  }
  if (signedBy === undefined) {
    throw new ReceiptRejected(`its receipt is signed with ${named.join(", ") || "no key"}, which is not a key this client trusts`);
  }
  let statement: unknown;
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(payload);
    statement = JSON.parse(text);
  } catch {
    throw new ReceiptRejected("its receipt's statement is not JSON");
  }
  if (!isObject(statement) || canonical(statement) !== text) {
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
export async function verifyApproval(envelopeJson: string, keys: ReadonlyMap<string, TrustedKey>, claim: ApprovalClaim): Promise<string> {
  if (keys.size === 0) throw new ReceiptRejected("this client trusts no receipt key");
  const { statement, key } = await checkSignature(envelopeJson, keys);
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
    const statement = JSON.parse(new TextDecoder().decode(decodeBase64(envelope.payload))) as {
      predicate?: { chain?: { sequence?: unknown } };
    };
    const sequence = statement.predicate?.chain?.sequence;
    return typeof sequence === "number" ? sequence : undefined;
  } catch {
    return undefined;
  }
}
