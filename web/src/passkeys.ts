// Passkeys in the inbox (issue 46, docs/identity.md "Passkeys"): a signed-in approver registers
// the passkeys of this browser or a security key (WebAuthn, the broker's creation options as
// WebAuthn Level 3 JSON) and lists them; a call whose requirement asks for `step_up: passkey` is
// approved only with an assertion whose challenge the broker derived from the statement the
// approver is shown (BeginStepUp), which this file asks the authenticator for. Deny and respond
// need none. An admin also sees everyone's passkeys there, and revokes them. Every WebAuthn
// failure is told in words: nothing is approved without the passkey.
import { type Api, ConnectError, describeError, isPermissionDenied } from "./api";
import { h } from "./dom";
import { type Call, type Passkey, StepUp } from "./gen/approvals/v1/types_pb";

/** Whether approving `call` needs the approver's passkey (its requirement's `step_up`). */
export function needsPasskey(call: Call): boolean {
  return call.approval?.approvers?.stepUp === StepUp.PASSKEY;
}

/** Whether this browser speaks WebAuthn with its Level 3 JSON forms. */
export function passkeysSupported(): boolean {
  return (
    typeof PublicKeyCredential !== "undefined" &&
    typeof PublicKeyCredential.parseCreationOptionsFromJSON === "function" &&
    typeof PublicKeyCredential.parseRequestOptionsFromJSON === "function" &&
    navigator.credentials !== undefined
  );
}

const UNSUPPORTED = "This browser cannot use passkeys here (it needs WebAuthn with its JSON forms, on https:// or http://localhost).";

/** What a WebAuthn (or broker) failure means to the person at the keyboard. */
export function passkeyError(error: unknown, during: "register" | "sign"): string {
  if (error instanceof DOMException) {
    switch (error.name) {
      case "NotAllowedError":
        return during === "sign"
          ? "No passkey signed: the prompt was cancelled or timed out, or none of your registered passkeys is on this device. Nothing was approved."
          : "No passkey was made: the prompt was cancelled or timed out.";
      case "InvalidStateError":
        return "This authenticator already holds a passkey of yours for this inbox.";
      case "SecurityError":
        return `This page's address (${location.hostname}) does not match the broker's passkey domain (--passkey-rp-id), or it is not a secure origin.`;
      case "NotSupportedError":
        return "This authenticator supports none of the broker's signature algorithms.";
      case "AbortError":
        return "The passkey prompt was aborted.";
      default:
        return `${error.name}: ${error.message}`;
    }
  }
  return describeError(error);
}

/** The assertion for the approving Decide of a step-up call, and the statement it signs. */
export interface SignedStatement {
  /** `DecideRequest.passkey`. */
  passkey: { credentialJson: string };
  /** The hex SHA-256 of the statement shown (call key, tool, input, title, message, requirement). */
  statementDigest: string;
}

/**
 * Asks the broker for the step-up challenge of approving `call` (with `editedInputJson`, the
 * input that would run instead), shows the statement and its digest through `shown`, then asks the
 * authenticator to sign it. Throws (with a message for people) when anything fails.
 */
export async function signStatement(api: Api, call: Call, editedInputJson: string, shown: (digest: string, statementJson: string) => void): Promise<SignedStatement> {
  if (!passkeysSupported()) throw new Error(UNSUPPORTED);
  let begun;
  try {
    begun = await api.approver.beginStepUp({
      sessionId: call.sessionId,
      callId: call.callId,
      agent: call.agent,
      approver: api.approverName,
      editedInputJson,
    });
  } catch (error) {
    throw new Error(`The broker gave no passkey challenge: ${describeError(error)}`);
  }
  shown(begun.statementDigest, begun.statementJson);
  let credential: Credential | null;
  try {
    const options = PublicKeyCredential.parseRequestOptionsFromJSON(JSON.parse(begun.optionsJson));
    credential = await navigator.credentials.get({ publicKey: options });
  } catch (error) {
    throw new Error(passkeyError(error, "sign"));
  }
  if (!(credential instanceof PublicKeyCredential)) throw new Error("The authenticator returned no passkey assertion. Nothing was approved.");
  return { passkey: { credentialJson: JSON.stringify(credential.toJSON()) }, statementDigest: begun.statementDigest };
}

const ALGORITHMS: Record<string, string> = { "-7": "ES256", "-8": "EdDSA", "-257": "RS256" };

const dateText = (t: { seconds: bigint } | undefined) => (t ? new Date(Number(t.seconds) * 1000).toLocaleString() : "never");

/** The Passkeys tab: register a passkey for the signed-in approver, and list theirs. */
export class PasskeysView {
  readonly el: HTMLElement;
  private readonly out = h("div", { class: "rows" });
  private readonly status = h("p", { class: "status", role: "status" });
  private readonly name = h("input", { type: "text", name: "passkey-name", "aria-label": "Passkey name", placeholder: "name (e.g. work laptop)", maxlength: "64" });

  constructor(private readonly api: Api) {
    const form = h(
      "form",
      { class: "filters", "aria-label": "Register a passkey" },
      this.name,
      h("button", { type: "submit", class: "approve" }, "Register a passkey"),
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      void this.register();
    });
    this.el = h(
      "section",
      { id: "passkeys", "aria-labelledby": "passkeys-heading" },
      h("h2", { id: "passkeys-heading" }, "Passkeys"),
      h("p", {}, "Calls marked “Needs your passkey” are approved only with one of your passkeys: it signs the statement you are shown (the call, its input, the requirement). Denying needs none."),
      passkeysSupported() ? form : h("p", { class: "error", role: "alert" }, UNSUPPORTED),
      this.status,
      this.out,
    );
  }

  async load(): Promise<void> {
    try {
      const reply = await this.api.approver.listMyPasskeys({});
      const rows = reply.passkeys.map((p) => this.row(p, false));
      const mine = rows.length ? h("ul", { "aria-label": "Your passkeys" }, rows) : h("p", { class: "empty" }, "You have no passkey yet.");
      this.out.replaceChildren(h("h3", {}, "Yours"), mine, ...(await this.everyone()));
    } catch (error) {
      this.out.replaceChildren(h("p", { class: "error", role: "alert" }, describeError(error)));
    }
  }

  /** Everyone's passkeys, with Revoke, for an admin (AdminService); nothing for anyone else. */
  private async everyone(): Promise<HTMLElement[]> {
    try {
      const reply = await this.api.admin.listPasskeys({});
      const rows = reply.passkeys.map((p) => this.row(p, true));
      return [h("h3", {}, "Everyone's passkeys (admin)"), rows.length ? h("ul", { "aria-label": "Everyone's passkeys" }, rows) : h("p", { class: "empty" }, "Nobody has a passkey yet.")];
    } catch (error) {
      return isPermissionDenied(error) ? [] : [h("p", { class: "error", role: "alert" }, describeError(error))];
    }
  }

  private row(p: Passkey, admin: boolean): HTMLElement {
    const name = p.name || "passkey";
    return h(
      "li",
      { class: p.revokedAt ? "row inactive" : "row", "data-credential": p.credentialId },
      admin ? `${p.approver}: ` : "",
      h("strong", {}, name),
      ` ${ALGORITHMS[String(p.algorithm)] ?? `algorithm ${p.algorithm}`}, registered ${dateText(p.createdAt)}, last used ${dateText(p.lastUsedAt)}`,
      p.revokedAt ? ` · revoked ${dateText(p.revokedAt)} by ${p.revokedBy}` : "",
      h("span", { class: "meta" }, ` · id ${p.credentialId.slice(0, 16)}…`),
      admin && !p.revokedAt
        ? h("button", { type: "button", class: "deny", "aria-label": `Revoke passkey ${name} of ${p.approver}`, onClick: () => void this.revoke(p.credentialId) }, "Revoke")
        : null,
    );
  }

  private async revoke(credentialId: string): Promise<void> {
    try {
      await this.api.admin.revokePasskey({ credentialId });
      this.status.className = "status";
      this.status.textContent = "Revoked: it signs no approval from now on (what it signed before stands).";
      await this.load();
    } catch (error) {
      this.status.className = "status error";
      this.status.textContent = `Not revoked: ${describeError(error)}`;
    }
  }

  private async register(): Promise<void> {
    this.status.className = "status";
    this.status.textContent = "Asking the broker…";
    try {
      const begun = await this.api.approver.beginPasskeyRegistration({});
      this.status.textContent = "Follow your browser's passkey prompt…";
      let credential: Credential | null;
      try {
        const options = PublicKeyCredential.parseCreationOptionsFromJSON(JSON.parse(begun.optionsJson));
        credential = await navigator.credentials.create({ publicKey: options });
      } catch (error) {
        throw new Error(passkeyError(error, "register"));
      }
      if (!(credential instanceof PublicKeyCredential)) throw new Error("The authenticator made no passkey.");
      const passkey = await this.api.approver.finishPasskeyRegistration({
        registrationId: begun.registrationId,
        credentialJson: JSON.stringify(credential.toJSON()),
        name: this.name.value.trim(),
      });
      this.name.value = "";
      this.status.textContent = `Registered passkey “${passkey.name || "passkey"}”.`;
      await this.load();
    } catch (error) {
      this.status.className = "status error";
      // The broker's refusals with their status; the authenticator's already in words.
      this.status.textContent = error instanceof ConnectError ? `Not registered: ${describeError(error)}` : error instanceof Error ? error.message : String(error);
    }
  }
}
