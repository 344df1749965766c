// The answers people ask for, on a card (docs/answers.md): Respond (answer the model with a
// message instead of running the call) and Remember a prefix (commands starting with some words,
// paths under a directory, URLs on a host), previewed with the pending calls it would decide
// before it is saved; and signed approval links (#link=…), opened after sign-in. Kept apart from
// ./pending and ./main, which only hook them in. A response is never sent empty: the broker
// would refuse it naming `response`, and the page says so first.
import { create } from "@bufbuild/protobuf";
import { type Api, describeError } from "./api";
import { h } from "./dom";
import type { DecideResponse } from "./gen/approvals/v1/approver_pb";
import { type Call, CallStatus, type InputMatcher, InputMatcherSchema, type Outcome } from "./gen/approvals/v1/types_pb";

/** The Respond button and its form for the card of `label`; `send` decides the call. */
export function respondControls(label: string, send: (message: string) => void): { button: HTMLElement; form: HTMLFormElement } {
  const message = h("textarea", {
    name: "response",
    rows: "3",
    "aria-label": `Message to the model instead of running ${label}`,
    placeholder: "your answer to the model (the call is not run)",
  });
  const error = h("p", { class: "error", role: "alert" });
  const form = h(
    "form",
    { class: "respond-form", hidden: true },
    h("p", { class: "meta" }, "The call is not run. The model reads your message as your words, in place of the tool's result."),
    message,
    error,
    h("button", { type: "submit", class: "respond" }, "Send response"),
    h("button", { type: "button", onClick: () => (form.hidden = true) }, "Cancel"),
  ) as HTMLFormElement;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (message.value.trim() === "") {
      error.textContent = "Not sent: write a message for the model (a response cannot be empty).";
      message.setAttribute("aria-invalid", "true");
      message.focus();
      return;
    }
    error.textContent = "";
    message.removeAttribute("aria-invalid");
    send(message.value);
  });
  const button = h(
    "button",
    {
      type: "button",
      class: "respond",
      "aria-label": `Respond to ${label} with a message instead of running it`,
      onClick: () => {
        form.hidden = false;
        message.focus();
      },
    },
    "Respond…",
  );
  return { button, form };
}

/** What a decided card says of its outcome, when a person answered instead of running it. */
export function responseNote(outcome: Outcome): string | undefined {
  return outcome.responded ? `answered the model: “${outcome.reason}”` : undefined;
}

/** The narrower matchers "Remember" offers: commands starting with some words, paths under a
 * directory, URLs on a host. The broker's words for each (src/domain/policy/matcher.rs). */
export type NarrowKind = "commandPrefix" | "pathUnder" | "urlHost";

interface NarrowChoice {
  kind: NarrowKind;
  field: string;
  value: string;
}

/** What a remembered `kind` with `value` matches, exactly as the broker matches it. */
export function narrowText(kind: NarrowKind, field: string, value: string): string {
  const v = JSON.stringify(value);
  switch (kind) {
    case "commandPrefix":
      return `${field} is the command ${v}, or ${v} followed by a space and arguments with none of ; & | < > ( ) $ \` \\ or a line break (so never "${value}; rm -rf ~")`;
    case "pathUnder":
      return `${field} is ${v} or a path under it, with no ".." segment`;
    case "urlHost":
      return `${field} is an http or https URL on host ${v} (any port, no user info)`;
  }
}

const METACHARACTERS = /[;&|<>()$`\\\n\r]/;

/** The narrowings a call offers, from its action's fields (a host's call) or its input. */
function choices(call: Call): NarrowChoice[] {
  const source = call.action && call.action.kind !== "other" ? call.action.fieldsJson : call.inputJson;
  let fields: Record<string, unknown> = {};
  try {
    const parsed: unknown = JSON.parse(source);
    if (parsed && typeof parsed === "object") fields = parsed as Record<string, unknown>;
  } catch {
    return [];
  }
  const out: NarrowChoice[] = [];
  if (typeof fields.command === "string") {
    // The first two words before anything a shell would read as more than words.
    const words = fields.command.split(METACHARACTERS)[0]!.trim().split(/\s+/).filter(Boolean).slice(0, 2).join(" ");
    if (words) out.push({ kind: "commandPrefix", field: "command", value: words });
  }
  if (typeof fields.path === "string" && fields.path.includes("/")) {
    const dir = fields.path.slice(0, fields.path.lastIndexOf("/")) || "/";
    if (!dir.split("/").includes("..")) out.push({ kind: "pathUnder", field: "path", value: dir });
  }
  if (typeof fields.url === "string") {
    try {
      const url = new URL(fields.url);
      if ((url.protocol === "https:" || url.protocol === "http:") && !url.username) out.push({ kind: "urlHost", field: "url", value: url.hostname });
    } catch {
      /* not a URL: nothing to offer */
    }
  }
  return out;
}

const LABELS: Record<NarrowKind, string> = {
  commandPrefix: "commands starting with…",
  pathUnder: "paths under a directory…",
  urlHost: "URLs on a host…",
};

/** "Remember a prefix" on a card: the choices for its matcher select, a box for the words,
 * directory or host, and the preview of the pending calls it would decide, shown before the
 * grant is saved (a first Approve previews, a second one saves what was previewed). */
export class Narrowing {
  readonly options: HTMLOptionElement[];
  readonly el: HTMLElement;
  private readonly box: HTMLInputElement;
  private readonly explained: HTMLElement;
  private readonly list: HTMLElement;
  private readonly offered: NarrowChoice[];
  private previewed = "";

  constructor(call: Call, label: string) {
    this.offered = choices(call);
    this.options = this.offered.map((c) => h("option", { value: `narrow:${c.kind}` }, LABELS[c.kind]));
    this.box = h("input", { type: "text", name: "narrow", "aria-label": `What the grant for ${label} matches` });
    this.explained = h("p", { class: "narrow-text" });
    this.list = h("div", { class: "would-decide", role: "status" });
    this.el = h("div", { class: "narrow", hidden: true }, this.box, this.explained, this.list);
    this.box.addEventListener("input", () => this.describe());
  }

  private chosen(value: string): NarrowChoice | undefined {
    return this.offered.find((c) => `narrow:${c.kind}` === value);
  }

  /** Shows the box for the matcher select's `value` (hidden for another choice). */
  show(value: string, remembering: boolean): void {
    const choice = this.chosen(value);
    this.el.hidden = !choice || !remembering;
    if (!choice) return;
    if (this.box.dataset.kind !== choice.kind) {
      this.box.dataset.kind = choice.kind;
      this.box.value = choice.value;
    }
    this.describe();
  }

  private describe(): void {
    const choice = this.chosen(`narrow:${this.box.dataset.kind ?? ""}`);
    if (!choice) return;
    this.explained.textContent = `Matches when ${narrowText(choice.kind, choice.field, this.box.value.trim())}.`;
    if (this.key(`narrow:${choice.kind}`) !== this.previewed) this.list.textContent = "";
  }

  private key(value: string): string {
    return `${value} ${this.box.value.trim()}`;
  }

  /** `anyInputText` (what the grant says for any input) said of the narrowing `value` instead;
   * `undefined` when `value` is not a narrowing. */
  grantText(value: string, anyInputText: string): string | undefined {
    const choice = this.chosen(value);
    if (!choice) return undefined;
    const when = `when ${narrowText(choice.kind, choice.field, this.box.value.trim() || choice.value)}`;
    return anyInputText.replace(/for any (input|fields)/, when) + " Approve shows them first; a second Approve saves it.";
  }

  /** The matcher for the select's `value`, or `undefined` when it is not a narrowing. */
  matcher(value: string): InputMatcher | undefined {
    const choice = this.chosen(value);
    if (!choice) return undefined;
    return create(InputMatcherSchema, {
      kind: { case: "fields", value: { conditions: [{ field: choice.field, test: { case: choice.kind, value: this.box.value.trim() } }] } },
    });
  }

  /** Whether Approve must preview first: a narrowing not previewed as it now reads. */
  mustPreview(value: string): boolean {
    return this.chosen(value) !== undefined && this.key(value) !== this.previewed;
  }

  /** Runs the preview and lists what saving it would decide now. */
  async preview(value: string, run: () => Promise<DecideResponse>): Promise<void> {
    this.list.textContent = "Previewing…";
    try {
      const reply = await run();
      this.previewed = this.key(value);
      const others = reply.decidedByGrant.map((o) => h("li", {}, `${o.callId}: ${CallStatus[o.status] ?? o.status}`));
      const said = h("p", {}, others.length === 0 ? "Saving it decides no other pending call now." : `Saving it also decides ${reply.decidedByGrantCount} pending call(s) now:`);
      const again = h("p", { class: "meta" }, "Approve again to save it.");
      if (others.length) this.list.replaceChildren(said, h("ul", {}, others), again);
      else this.list.replaceChildren(said, again);
    } catch (error) {
      this.list.textContent = `Not previewed: ${describeError(error)}`;
    }
  }
}

/** A signed approval link (`#link=…`, docs/answers.md): once signed in, asks the broker which
 * call it names (it checks the signature, the expiry and that this person may see the call),
 * then shows that call as a notification's link does (./push). The link decides nothing. */
export async function openSignedLink(api: Api, hash = location.hash): Promise<void> {
  if (!hash.startsWith("#link=")) return;
  const note = h("p", { class: "link-note", role: "status" }, "Opening the linked call…");
  document.querySelector("main")?.prepend(note);
  try {
    const reply = await api.approver.openCallLink({ link: decodeURIComponent(hash.slice("#link=".length)) });
    const call = reply.call;
    if (!call) throw new Error("the broker named no call");
    note.textContent = `Linked call: ${call.tool} ${call.callId} (session ${call.sessionId}).`;
    const params = new URLSearchParams({ agent: call.agent, session: call.sessionId, call: call.callId });
    history.replaceState(null, "", `#${params}`);
    window.dispatchEvent(new HashChangeEvent("hashchange"));
  } catch (error) {
    note.className = "link-note error";
    note.textContent = `This link does not open a call: ${describeError(error)}`;
  }
}
