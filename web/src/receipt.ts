// A decided call's signed receipt, checked where the approver can see it: the page fetches the
// DSSE envelope (GetReceipt) and verifies its Ed25519 signature over the DSSE encoding itself,
// with WebCrypto, against the key the broker serves. Where the browser has no Ed25519 in
// WebCrypto, it says so and shows what the broker reported instead, labelled as the broker's
// word. Verifying with the served key proves the receipt was not changed since it was signed
// with that key, not that the key is the operator's: compare its id with the one the operator
// published (docs/receipts.md).
import { type Api, describeError } from "./api";
import { h } from "./dom";

const PAYLOAD_TYPE = "application/vnd.in-toto+json";

function fromBase64(text: string): Uint8Array<ArrayBuffer> {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

/** DSSE v1 pre-authentication encoding of `payload`: what the signature covers. */
export function pae(payloadType: string, payload: Uint8Array): Uint8Array<ArrayBuffer> {
  const type = new TextEncoder().encode(payloadType);
  const head = new TextEncoder().encode(`DSSEv1 ${type.length} ${payloadType} ${payload.length} `);
  const out = new Uint8Array(head.length + payload.length);
  out.set(head, 0);
  out.set(payload, head.length);
  return out;
}

/** Whether the envelope's signature verifies with the raw Ed25519 key; `undefined` when this
 * browser's WebCrypto has no Ed25519. */
export async function verifyInBrowser(envelopeJson: string, publicKey: string): Promise<boolean | undefined> {
  const envelope = JSON.parse(envelopeJson) as { payloadType: string; payload: string; signatures: { sig: string }[] };
  if (envelope.payloadType !== PAYLOAD_TYPE) return false;
  let key: CryptoKey;
  try {
    key = await crypto.subtle.importKey("raw", fromBase64(publicKey), { name: "Ed25519" }, false, ["verify"]);
  } catch {
    return undefined;
  }
  const message = pae(envelope.payloadType, fromBase64(envelope.payload));
  for (const s of envelope.signatures) {
    if (await crypto.subtle.verify({ name: "Ed25519" }, key, fromBase64(s.sig), message)) return true;
  }
  return false;
}

/** A button that fetches the call's receipt and shows whether it verifies, and how that was
 * checked. */
export function receiptButton(api: Api, agent: string, sessionId: string, callId: string): HTMLElement {
  const out = h("span", { class: "receipt", role: "status" });
  const button = h("button", { type: "button", "aria-label": `Check the receipt of ${callId}` }, "Receipt");
  button.addEventListener("click", () => void check());
  async function check(): Promise<void> {
    out.textContent = " checking…";
    try {
      const reply = await api.approver.getReceipt({ agent, sessionId, callId });
      const receipt = reply.receipt;
      if (!receipt) throw new Error("no receipt in the reply");
      const key = reply.key;
      const local = key ? await verifyInBrowser(receipt.envelope, key.publicKey) : undefined;
      const keyId = key ? key.keyId.slice(0, 12) : "?";
      if (local === true) {
        out.replaceChildren(h("span", { class: "receipt-ok" }, ` ✓ receipt #${receipt.sequence} verified in this browser (Ed25519, key ${keyId}…)`));
      } else if (local === false) {
        out.replaceChildren(h("span", { class: "error" }, ` ✗ receipt #${receipt.sequence} does NOT verify with key ${keyId}…`));
      } else {
        const said = receipt.verified ? "verified" : "NOT verified";
        out.replaceChildren(
          h("span", { class: receipt.verified ? "receipt-ok" : "error" }, ` receipt #${receipt.sequence}: ${said} by the broker (this browser cannot check Ed25519 itself)`),
        );
      }
    } catch (error) {
      out.replaceChildren(h("span", { class: "error" }, ` ${describeError(error)}`));
    }
  }
  return h("span", {}, button, out);
}
