// The pending calls, grouped by session and batch (newest batch first), each a card a person
// can approve, deny with a reason, answer the model instead (./answers), edit then approve, or
// open; a whole batch in one action. Each card shows what would run (./input) above the agent's
// title, and an input partly folded away is unfolded by a first Approve, never approved unseen.
// A call another UI (or a rule, a grant, the deadline) decided turns into its outcome with who
// decided it; a decision this page loses to another shows the outcome that stands, not an error.
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Narrowing, respondControls, responseNote } from "./answers";
import { type Api, ConnectError, Code, describeError, isPermissionDenied } from "./api";
import { approvalText, grantPreview, scopeLabel, span, statusName } from "./describe";
import { h } from "./dom";
import { Decision, type DecideResponse } from "./gen/approvals/v1/approver_pb";
import { actionDetail, hostView } from "./host";
import { type Call, InputMatcherSchema, type Outcome, Scope } from "./gen/approvals/v1/types_pb";
import { inputView, type InputView, mcpView, prose } from "./input";
import { parseEdit, pretty, revealed } from "./json";
import { callKey, type Live } from "./live";
import { needsPasskey, signStatement } from "./passkeys";

/** How long a decided call stays on screen as its outcome. */
export const KEEP_DECIDED_MS = 120_000;

interface Filters {
  agent: string;
  session: string;
  tool: string;
  workspace: string;
}

interface Card {
  el: HTMLElement;
  call: Call;
  outcome: HTMLElement;
  /** What the approver's passkey signs, once asked (step-up calls only). */
  statement: HTMLElement;
  decided: boolean;
  /** What would run, shown on the card. */
  input: InputView;
  refresh(): void;
  /** Approves as the card's own Approve button does (with its Remember choice); an input
   * still partly folded is unfolded instead, and a second Approve approves. */
  approve(): void;
  /** Unfolds the input, saying why nothing was approved yet. */
  reveal(): void;
}

type DecisionFields = { decision: Decision; reason?: string; response?: string; editedInputJson?: string; scope?: Scope; matcher?: ReturnType<typeof create<typeof InputMatcherSchema>> };

const FILTER_FIELDS: (keyof Filters)[] = ["agent", "session", "tool", "workspace"];

export class PendingView {
  readonly el: HTMLElement;
  private readonly list: HTMLElement;
  private readonly cards = new Map<string, Card>();
  private readonly filters: Filters = { agent: "", session: "", tool: "", workspace: "" };
  readonly search: HTMLInputElement;
  private selected: string | undefined;
  private layoutKey = "";

  constructor(
    private readonly api: Api,
    private readonly live: Live,
  ) {
    const inputs = FILTER_FIELDS.map((field) => {
      const input = h("input", { type: "search", name: field, "aria-label": `Filter by ${field}`, placeholder: field });
      input.addEventListener("input", () => {
        this.filters[field] = input.value.trim();
        this.render();
      });
      return input;
    });
    this.search = inputs[0];
    this.list = h("div", { class: "groups", "aria-live": "off" });
    this.el = h(
      "section",
      { id: "pending", "aria-labelledby": "pending-heading" },
      h("h2", { id: "pending-heading", class: "visually-hidden" }, "Pending calls"),
      h("div", { class: "filters", role: "search" }, inputs),
      this.list,
    );
  }

  private matches(call: Call): boolean {
    const f = this.filters;
    const has = (value: string, want: string) => want === "" || value.toLowerCase().includes(want.toLowerCase());
    return has(call.agent, f.agent) && has(call.sessionId, f.session) && has(call.tool, f.tool) && has(call.workspace, f.workspace);
  }

  /** The calls on screen, pending and recently decided, grouped and ordered. */
  private groups(): { session: string; agent: string; batches: { id: string; calls: Call[]; newest: number }[] }[] {
    const calls: Call[] = [...this.live.pending.values()];
    for (const d of this.live.decided.values()) if (d.call && this.cards.has(callKey(d.call))) calls.push(d.call);
    const sessions = new Map<string, { session: string; agent: string; batches: Map<string, { id: string; calls: Call[]; newest: number }> }>();
    for (const call of calls) {
      if (!this.matches(call)) continue;
      const sk = `${call.agent}\u0000${call.sessionId}`;
      let s = sessions.get(sk);
      if (!s) sessions.set(sk, (s = { session: call.sessionId, agent: call.agent, batches: new Map() }));
      let b = s.batches.get(call.batchId);
      if (!b) s.batches.set(call.batchId, (b = { id: call.batchId, calls: [], newest: 0 }));
      b.calls.push(call);
      b.newest = Math.max(b.newest, call.createdAt ? timestampDate(call.createdAt).getTime() : 0);
    }
    const out = [...sessions.values()].map((s) => {
      const batches = [...s.batches.values()].sort((a, b) => b.newest - a.newest || (a.id < b.id ? 1 : -1));
      for (const b of batches) b.calls.sort((x, y) => x.position - y.position);
      return { session: s.session, agent: s.agent, batches };
    });
    return out.sort((a, b) => b.batches[0].newest - a.batches[0].newest);
  }

  pendingCount(): number {
    return this.live.pending.size;
  }

  render(): void {
    for (const [key, card] of this.cards) {
      const decided = this.live.decided.get(key);
      if (decided && !card.decided) this.showOutcome(card, decided.outcome);
      if (!decided && !this.live.pending.has(key)) this.cards.delete(key);
    }
    for (const [key, call] of this.live.pending) if (!this.cards.has(key)) this.cards.set(key, this.card(call));
    const groups = this.groups();
    // Which calls are still pending is part of the layout: a batch's header counts them and
    // offers Approve all only while more than one is left.
    const layoutKey = JSON.stringify(groups.map((g) => g.batches.map((b) => b.calls.map((c) => [callKey(c), this.live.pending.has(callKey(c))]))));
    for (const card of this.cards.values()) card.refresh();
    if (layoutKey === this.layoutKey) return;
    this.layoutKey = layoutKey;
    const focused = document.activeElement;
    const nodes = groups.map((g) =>
      h(
        "section",
        { class: "session", "aria-label": `Session ${g.session} of agent ${g.agent}` },
        h("h3", {}, "Session ", h("code", {}, g.session), h("span", { class: "meta" }, ` agent ${g.agent}`)),
        g.batches.map((b) => this.batchSection(b.id, b.calls)),
      ),
    );
    this.list.replaceChildren(
      ...(nodes.length > 0 ? nodes : [h("p", { class: "empty" }, this.live.pending.size > 0 ? "No pending call matches the filters." : "Nothing to approve.")]),
    );
    if (focused instanceof HTMLElement && focused.isConnected && focused !== document.activeElement) focused.focus();
  }

  private batchSection(batchId: string, calls: Call[]): HTMLElement {
    const pending = calls.filter((c) => this.live.pending.has(callKey(c)));
    const reason = h("input", { type: "text", name: "batch-reason", "aria-label": `Reason to deny batch ${batchId}`, placeholder: "reason (optional)" });
    const denyForm = h(
      "form",
      { class: "inline", hidden: true },
      reason,
      h("button", { type: "submit", class: "deny" }, "Deny all"),
    );
    denyForm.addEventListener("submit", (event) => {
      event.preventDefault();
      denyForm.hidden = true;
      void this.decideAll(pending, Decision.DENY, reason.value);
    });
    const header = h(
      "div",
      { class: "batch-head" },
      h("span", { class: "batch-count" }, `Batch …${batchId.slice(-8)} · ${calls[0]?.batchSize ?? calls.length} call(s), ${pending.length > 0 ? `${pending.length} pending` : "all decided"}`),
      pending.length > 1
        ? [
            h("button", { type: "button", class: "approve", "aria-label": `Approve all ${pending.length} pending calls of batch ${batchId}`, onClick: () => void this.decideAll(pending, Decision.APPROVE, "") }, "Approve all"),
            h("button", { type: "button", "aria-label": `Deny all ${pending.length} pending calls of batch ${batchId}`, onClick: () => { denyForm.hidden = false; reason.focus(); } }, "Deny all…"),
            denyForm,
          ]
        : null,
    );
    return h("div", { class: "batch", "data-batch": batchId }, header, calls.map((c) => this.cards.get(callKey(c))!.el));
  }

  private async decideAll(calls: Call[], decision: Decision, reason: string): Promise<void> {
    if (decision === Decision.APPROVE) {
      // Nothing is approved unseen: a first Approve all unfolds what is folded, a second approves.
      const folded = calls.map((c) => this.cards.get(callKey(c))).filter((card) => card && !card.decided && card.input.folded());
      for (const card of folded) card!.reveal();
      if (folded.length > 0) return;
    }
    for (const call of calls) {
      const card = this.cards.get(callKey(call));
      if (card && !card.decided) await this.decide(card, { decision, reason });
    }
  }

  private card(call: Call): Card {
    const key = callKey(call);
    const label = `${call.tool} call ${call.callId}`;
    const titleId = `t-${Math.random().toString(36).slice(2)}`;
    const hiddenIn = call.hiddenCharacters.map((hc) => `${hc.field} hides ${hc.count} invisible character(s): ${hc.codePoints.join(", ")}`);
    const input = inputView(call, label);
    const unfolded = h("p", { class: "warn", role: "status", hidden: true }, "The input was folded: it is shown in full now. Read it, then Approve again.");
    const age = h("span", { class: "age" });
    const deadline = h("span", { class: "deadline" });
    const outcome = h("p", { class: "outcome", role: "status" });
    const approvals = h("p", { class: "approvals" });
    const stepUp = needsPasskey(call);
    const statement = h("p", { class: "statement", hidden: true });

    // A host call's choices name the action and say they hold on every host (./host).
    const scopes = [Scope.ONCE, Scope.SESSION, Scope.WORKSPACE, Scope.ALWAYS].map((s) =>
      h("option", { value: String(s), disabled: s === Scope.WORKSPACE && call.workspace === "" }, scopeLabel(call, s, false)),
    );
    const scope = h("select", { name: "scope", "aria-label": `Remember the decision on ${label}` }, scopes);
    const narrow = new Narrowing(call, label);
    const inputs = h(
      "select",
      { name: "matcher", "aria-label": `Which inputs the grant for ${label} matches` },
      h("option", { value: "exact" }, "exactly this input"),
      h("option", { value: "any" }, "any input"),
      narrow.options,
    );
    const preview = h("p", { class: "grant-preview" });
    const showPreview = () => {
      const s = Number(scope.value) as Scope;
      inputs.hidden = s === Scope.ONCE;
      for (const option of scopes) option.textContent = scopeLabel(call, Number(option.value) as Scope, inputs.value === "any");
      preview.textContent = narrow.grantText(inputs.value, grantPreview(call, s, true)) ?? grantPreview(call, s, inputs.value === "any");
      narrow.show(inputs.value, s !== Scope.ONCE);
    };
    scope.addEventListener("change", showPreview);
    inputs.addEventListener("change", showPreview);
    showPreview();
    const remembered = () => {
      const s = Number(scope.value) as Scope;
      if (s === Scope.ONCE) return {};
      return {
        scope: s,
        matcher: narrow.matcher(inputs.value) ?? (inputs.value === "any" ? create(InputMatcherSchema, { kind: { case: "any", value: {} } }) : undefined),
      };
    };

    const reason = h("input", { type: "text", name: "reason", "aria-label": `Reason to deny ${label}`, placeholder: "reason (shown to the model)" });
    const denyForm = h("form", { class: "deny-form", hidden: true }, reason, h("button", { type: "submit", class: "deny" }, "Deny"), h("button", { type: "button", onClick: () => (denyForm.hidden = true) }, "Cancel"));
    const respond = respondControls(label, (message) => void this.decide(card, { decision: Decision.RESPOND, response: message }));
    const editor = h("textarea", { name: "edit", rows: "8", spellcheck: "false", "aria-label": `Edited input of ${label} (JSON)` });
    const editError = h("p", { class: "error", role: "alert" });
    const editForm = h(
      "form",
      { class: "edit-form", hidden: true },
      editor,
      editError,
      h("button", { type: "submit", class: "approve" }, "Approve edited input"),
      h("button", { type: "button", onClick: () => (editForm.hidden = true) }, "Cancel"),
    );
    const explain = h("p", { class: "explain", role: "status" });
    const detail = h(
      "div",
      { class: "detail", hidden: true },
      actionDetail(call),
      h("button", { type: "button", "aria-label": `Explain what would decide ${label}`, onClick: () => void this.explain(call, explain) }, "Explain"),
      explain,
    );
    const actions = h(
      "div",
      { class: "actions" },
      h("button", { type: "button", class: "approve", "aria-label": `Approve ${label}`, onClick: () => card.approve() }, "Approve"),
      h("button", { type: "button", class: "deny", "aria-label": `Deny ${label}`, onClick: () => this.openDeny(card) }, "Deny…"),
      respond.button,
      h("button", { type: "button", "aria-label": `Edit the input of ${label}, then approve`, onClick: () => this.openEdit(card) }, "Edit…"),
      h("button", { type: "button", "aria-expanded": "false", "aria-label": `Details of ${label}`, onClick: (e) => { detail.hidden = !detail.hidden; (e.currentTarget as HTMLElement).setAttribute("aria-expanded", String(!detail.hidden)); } }, "Details"),
      h("label", { class: "scope" }, "Remember ", scope, inputs),
      preview,
      narrow.el,
    );
    denyForm.addEventListener("submit", (event) => {
      event.preventDefault();
      void this.decide(card, { decision: Decision.DENY, reason: reason.value, ...remembered() });
    });
    editForm.addEventListener("submit", (event) => {
      event.preventDefault();
      const parsed = parseEdit(editor.value);
      if ("error" in parsed) {
        editError.textContent = `Not sent: ${parsed.error}`;
        editor.setAttribute("aria-invalid", "true");
        editor.focus();
        return;
      }
      editError.textContent = "";
      editor.removeAttribute("aria-invalid");
      void this.decide(card, { decision: Decision.APPROVE, editedInputJson: parsed.json });
    });
    editor.addEventListener("input", () => {
      const parsed = parseEdit(editor.value);
      editError.textContent = "error" in parsed ? parsed.error : "";
    });

    const el = h(
      "article",
      { class: "card", tabindex: "-1", "aria-labelledby": titleId, "data-call": call.callId, "data-session": call.sessionId },
      hostView(call),
      input.el,
      mcpView(call),
      h(
        "header",
        {},
        h("h4", { id: titleId }, h("code", { class: "tool" }, call.tool), " ", call.title ? h("span", { class: "title" }, revealed(call.title)) : h("span", { class: "meta" }, call.callId)),
        h("p", { class: "meta" }, `${call.callId} · agent ${call.agent}`, call.workspace ? ` · workspace ${call.workspace}` : "", " · ", age, deadline),
      ),
      call.message ? h("p", { class: "message" }, prose(call.message)) : null,
      hiddenIn.length > 0 ? h("p", { class: "warn", role: "note" }, "Hidden characters: ", hiddenIn.join("; ")) : null,
      stepUp ? h("p", { class: "step-up", role: "note" }, "Needs your passkey: Approve asks your passkey to sign this call, its input and its requirement; Deny needs none.") : null,
      statement,
      unfolded,
      approvals,
      actions,
      denyForm,
      respond.form,
      editForm,
      detail,
      outcome,
    );
    const card: Card = {
      el,
      call,
      outcome,
      statement,
      decided: false,
      input,
      approve: () => {
        if (input.folded()) card.reveal();
        else if (Number(scope.value) !== Scope.ONCE && narrow.mustPreview(inputs.value))
          // Remember a prefix: previewed with what it would decide, saved by a second Approve.
          void narrow.preview(inputs.value, () => this.api.approver.previewDecision(this.request(card, { decision: Decision.APPROVE, ...remembered() })));
        else void this.decide(card, { decision: Decision.APPROVE, ...remembered() });
      },
      reveal: () => {
        input.unfold();
        unfolded.hidden = false;
      },
      refresh: () => {
        // Votes arrive as approvalRecorded events, which replace the pending call.
        approvals.textContent = approvalText(this.live.pending.get(key) ?? call);
        approvals.hidden = approvals.textContent === "";
        const created = call.createdAt ? timestampDate(call.createdAt).getTime() : Date.now();
        age.textContent = `${span((Date.now() - created) / 1000)} ago`;
        if (call.deadline && !card.decided) {
          const left = (timestampDate(call.deadline).getTime() - Date.now()) / 1000;
          deadline.textContent = left > 0 ? ` · expires in ${span(left)}` : " · expiring";
          deadline.classList.toggle("soon", left < 60);
        }
      },
    };
    editor.value = pretty(call.inputJson);
    el.addEventListener("focusin", () => this.select(key, false));
    return card;
  }

  private openDeny(card: Card): void {
    if (card.decided) return;
    const form = card.el.querySelector<HTMLFormElement>(".deny-form")!;
    form.hidden = false;
    form.querySelector("input")!.focus();
  }

  private openEdit(card: Card): void {
    if (card.decided) return;
    const form = card.el.querySelector<HTMLFormElement>(".edit-form")!;
    form.hidden = false;
    form.querySelector("textarea")!.focus();
  }

  /** The Decide (or PreviewDecision) request for `card`'s call. */
  private request(card: Card, d: DecisionFields) {
    const c = card.call;
    return {
      sessionId: c.sessionId,
      callId: c.callId,
      agent: c.agent,
      approver: this.api.approverName,
      decision: d.decision,
      reason: d.reason ?? "",
      response: d.response ?? "",
      editedInputJson: d.editedInputJson ?? "",
      scope: d.scope,
      matcher: d.matcher,
    };
  }

  private async decide(card: Card, d: DecisionFields): Promise<void> {
    if (card.decided) return;
    card.el.classList.add("busy");
    card.outcome.classList.remove("error");
    card.outcome.textContent = "Sending…";
    try {
      // A step-up call's approval carries the approver's passkey signature of what they see.
      let passkey: { credentialJson: string } | undefined;
      if (d.decision === Decision.APPROVE && needsPasskey(card.call)) {
        card.outcome.textContent = "Asking your passkey…";
        try {
          passkey = (
            await signStatement(this.api, card.call, d.editedInputJson ?? "", (digest, statementJson) => {
              card.statement.replaceChildren(
                "Your passkey signs statement ",
                h("code", { class: "digest" }, digest),
                " (SHA-256 of the call, its tool, the input that runs, title, message and requirement). ",
                h("details", {}, h("summary", {}, "What it signs"), h("pre", { class: "statement-json" }, pretty(statementJson))),
              );
              card.statement.hidden = false;
            })
          ).passkey;
        } catch (error) {
          card.outcome.textContent = error instanceof Error ? error.message : String(error);
          card.outcome.classList.add("error");
          return;
        }
        card.outcome.textContent = "Sending…";
      }
      const reply: DecideResponse = await this.api.approver.decide({ ...this.request(card, d), passkey });
      if (reply.outcome) this.live.resolve(reply.outcome);
      if (reply.pending) {
        // A vote that leaves the call waiting for more approvers.
        this.live.pending.set(callKey(reply.pending), reply.pending);
        card.outcome.textContent = `Vote recorded: ${reply.pending.approval?.summary ?? ""}`;
      }
      for (const o of [...reply.skipped, ...reply.decidedByGrant]) this.live.resolve(o);
      this.render();
    } catch (error) {
      if (error instanceof ConnectError && error.code === Code.FailedPrecondition) {
        // Another decision won: its outcome stands and arrives on the live stream too.
        card.outcome.textContent = `Already decided: ${error.rawMessage}`;
        card.el.classList.add("lost-race");
      } else {
        card.outcome.textContent = describeError(error);
        card.outcome.classList.add("error");
      }
    } finally {
      card.el.classList.remove("busy");
    }
  }

  private showOutcome(card: Card, outcome: Outcome): void {
    card.decided = true;
    card.el.classList.remove("lost-race");
    card.el.classList.add("decided", `status-${statusName(outcome.status).toLowerCase()}`);
    card.el.querySelectorAll("form, .actions").forEach((n) => ((n as HTMLElement).hidden = true));
    const parts = [`${statusName(outcome.status)} by ${outcome.decidedBy}`];
    const answered = responseNote(outcome);
    if (answered) parts.push(answered);
    else if (outcome.reason) parts.push(`reason: ${outcome.reason}`);
    if (outcome.inputEdited) parts.push("with an edited input");
    card.outcome.classList.remove("error");
    card.outcome.textContent = parts.join(" · ");
  }

  private async explain(call: Call, into: HTMLElement): Promise<void> {
    into.textContent = "Asking…";
    try {
      const r = await this.api.admin.explain({
        call: { case: "stored", value: { sessionId: call.sessionId, callId: call.callId, agent: call.agent } },
      });
      into.textContent = `${statusName(r.verdict)}${r.decidedBy ? ` by ${r.decidedBy}` : ""}: ${r.reason}`;
    } catch (error) {
      into.textContent = isPermissionDenied(error) ? "Explain needs an admin token." : describeError(error);
    }
  }

  // Keyboard: the selected card is the one j/k moved to (or that holds focus).
  private visibleKeys(): string[] {
    return [...this.list.querySelectorAll<HTMLElement>("article.card")].map((el) => {
      for (const [key, card] of this.cards) if (card.el === el) return key;
      return "";
    });
  }

  private select(key: string, focus: boolean): void {
    if (this.selected) this.cards.get(this.selected)?.el.classList.remove("selected");
    this.selected = key;
    const card = this.cards.get(key);
    card?.el.classList.add("selected");
    if (focus) {
      card?.el.focus();
      card?.el.scrollIntoView({ block: "nearest" });
    }
  }

  move(step: number): void {
    const keys = this.visibleKeys();
    if (keys.length === 0) return;
    const at = this.selected ? keys.indexOf(this.selected) : -1;
    const next = at < 0 ? (step > 0 ? 0 : keys.length - 1) : Math.min(keys.length - 1, Math.max(0, at + step));
    this.select(keys[next], true);
  }

  act(what: "approve" | "deny" | "edit"): void {
    const card = this.selected ? this.cards.get(this.selected) : undefined;
    if (!card || card.decided) return;
    if (what === "approve") card.approve();
    else if (what === "deny") this.openDeny(card);
    else this.openEdit(card);
  }

  /** Drops cards of calls decided long enough ago; says whether any went. */
  prune(): void {
    if (this.live.prune(KEEP_DECIDED_MS)) this.render();
    else for (const card of this.cards.values()) card.refresh();
  }

  focusSearch(): void {
    this.search.focus();
  }
}
