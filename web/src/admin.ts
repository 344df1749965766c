// The audit and policy views: history of decided calls (newest first, each with its title,
// what it ran and its outcome told apart at a glance; filtered by tool, session, agent,
// outcome and decider; paged), grants (what each covers, when it expires, revoke) and rules
// (list, create, delete, Explain); a grant or rule with a kind (issue 48) says it covers that
// action on every host. They use
// AdminService, so they need an admin token; with an approver's token they say so and nothing
// else breaks.
import { create } from "@bufbuild/protobuf";
import { type Api, describeError, isPermissionDenied } from "./api";
import { effectName, grantText, matcherText, ruleText, statusName, when } from "./describe";
import { h } from "./dom";
import { HOSTS, hostName, hostView } from "./host";
import { inputView } from "./input";
import { jsonView, revealed } from "./json";
import { receiptButton } from "./receipt";
import {
  CallStatus,
  Effect,
  FieldConditionSchema,
  type InputMatcher,
  InputMatcherSchema,
} from "./gen/approvals/v1/types_pb";

const DECIDED = [
  CallStatus.APPROVED,
  CallStatus.DENIED,
  CallStatus.SUPERSEDED,
  CallStatus.SKIPPED,
  CallStatus.EXPIRED,
  CallStatus.CANCELLED,
];

/** How each outcome reads in the history, with a sign as well as a colour. */
const OUTCOME_SIGNS: Partial<Record<CallStatus, string>> = {
  [CallStatus.APPROVED]: "✓",
  [CallStatus.DENIED]: "✗",
  [CallStatus.EXPIRED]: "⏱",
  [CallStatus.SKIPPED]: "↷",
  [CallStatus.SUPERSEDED]: "↷",
  [CallStatus.CANCELLED]: "⊘",
};

function failure(error: unknown): HTMLElement {
  return h("p", { class: "error", role: "alert" }, isPermissionDenied(error) ? "This view needs an admin token." : describeError(error));
}

function field(name: string, label: string, attrs: Record<string, string> = {}): HTMLInputElement {
  return h("input", { type: "text", name, "aria-label": label, placeholder: label, ...attrs });
}

export class HistoryView {
  readonly el: HTMLElement;
  private readonly out = h("div", { class: "rows" });
  private readonly pages: string[] = [""];
  private readonly form: HTMLFormElement;
  readonly search: HTMLInputElement;

  constructor(private readonly api: Api) {
    const status = h(
      "select",
      { name: "status", "aria-label": "Outcome" },
      h("option", { value: "" }, "any outcome"),
      DECIDED.map((s) => h("option", { value: String(s) }, statusName(s))),
    );
    this.search = field("tool", "tool");
    this.form = h(
      "form",
      { class: "filters", role: "search" },
      this.search,
      field("session", "session"),
      field("agent", "agent"),
      field("decidedBy", "decided by (approver:alice, grant:, policy:)"),
      status,
      h("button", { type: "submit" }, "Search"),
    );
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.pages.length = 1;
      void this.load();
    });
    this.el = h("section", { id: "history", "aria-labelledby": "history-heading" }, h("h2", { id: "history-heading" }, "History"), this.form, this.out);
  }

  async load(): Promise<void> {
    const data = new FormData(this.form);
    const text = (name: string) => String(data.get(name) ?? "").trim();
    const status = text("status");
    try {
      const page = await this.api.admin.listCalls({
        tool: text("tool"),
        sessionId: text("session"),
        agent: text("agent"),
        decidedBy: text("decidedBy"),
        statuses: status ? [Number(status) as CallStatus] : DECIDED,
        pageSize: 25,
        pageToken: this.pages[this.pages.length - 1],
        newestFirst: true,
      });
      const rows = page.calls.map((c) => {
        const name = statusName(c.status);
        return h(
          "li",
          { class: `row history-row status-${name.toLowerCase()}`, "data-session": c.sessionId, "data-call": c.callId },
          h(
            "p",
            { class: "history-head" },
            h("strong", { class: `outcome-badge status-${name.toLowerCase()}` }, `${OUTCOME_SIGNS[c.status] ?? ""} ${name}`.trim()),
            " ",
            h("code", {}, c.tool),
            c.title ? [" ", h("span", { class: "title" }, revealed(c.title))] : null,
          ),
          hostView(c),
          inputView(c, `${c.tool} call ${c.callId}`).el,
          c.outcome?.inputEdited ? [h("p", { class: "meta" }, "approved with an edited input, which ran:"), jsonView(c.outcome.inputJson)] : null,
          h(
            "p",
            { class: "history-meta" },
            `${c.sessionId} / ${c.callId} · by ${c.outcome?.decidedBy ?? "?"}`,
            c.outcome?.reason ? ` · reason: ${c.outcome.reason}` : "",
            c.outcome?.inputEdited ? " · edited" : "",
            h("span", { class: "meta" }, ` · ${when(c.outcome?.decidedAt)}`),
            receiptButton(this.api, c.agent, c.sessionId, c.callId),
          ),
        );
      });
      const nav = h(
        "div",
        { class: "pager" },
        this.pages.length > 1 ? h("button", { type: "button", onClick: () => { this.pages.pop(); void this.load(); } }, "Previous page") : null,
        page.nextPageToken ? h("button", { type: "button", onClick: () => { this.pages.push(page.nextPageToken); void this.load(); } }, "Next page") : null,
      );
      this.out.replaceChildren(rows.length ? h("ol", {}, rows) : h("p", { class: "empty" }, "No decided call matches."), nav);
    } catch (error) {
      this.out.replaceChildren(failure(error));
    }
  }
}

export class GrantsView {
  readonly el: HTMLElement;
  private readonly out = h("div", { class: "rows" });
  private readonly inactive = h("input", { type: "checkbox", name: "inactive" });

  constructor(private readonly api: Api) {
    this.inactive.addEventListener("change", () => void this.load());
    this.el = h(
      "section",
      { id: "grants", "aria-labelledby": "grants-heading" },
      h("h2", { id: "grants-heading" }, "Grants"),
      h("label", {}, this.inactive, " include revoked and expired"),
      this.out,
    );
  }

  async load(): Promise<void> {
    try {
      const page = await this.api.admin.listGrants({ includeInactive: this.inactive.checked, pageSize: 200 });
      const rows = page.grants.map((g) =>
        h(
          "li",
          { class: g.active ? "row" : "row inactive", "data-grant": String(g.id) },
          h("strong", {}, `Grant ${g.id}`),
          ` ${grantText(g)}`,
          g.active
            ? h("button", { type: "button", class: "deny", "aria-label": `Revoke grant ${g.id}`, onClick: () => void this.revoke(g.id) }, "Revoke")
            : null,
        ),
      );
      this.out.replaceChildren(rows.length ? h("ul", {}, rows) : h("p", { class: "empty" }, "No grants."));
    } catch (error) {
      this.out.replaceChildren(failure(error));
    }
  }

  private async revoke(id: bigint): Promise<void> {
    try {
      await this.api.admin.revokeGrant({ target: { case: "id", value: id } });
      await this.load();
    } catch (error) {
      this.out.prepend(failure(error));
    }
  }
}

/** A matcher from the rule form: empty is any input; `{...}` is an exact input; else lines of
 * `field = value`, `field ^= prefix`, `field ~ glob`. */
export function parseMatcher(text: string): InputMatcher | { error: string } {
  const t = text.trim();
  if (t === "") return create(InputMatcherSchema, { kind: { case: "any", value: {} } });
  if (t.startsWith("{")) return create(InputMatcherSchema, { kind: { case: "exactJson", value: t } });
  const conditions = [];
  for (const line of t.split("\n").map((l) => l.trim()).filter(Boolean)) {
    const m = /^([^\s=^~]+)\s*(\^=|~|==|=)\s*(.*)$/.exec(line);
    if (!m) return { error: `cannot read condition "${line}" (field = value, field ^= prefix, field ~ glob)` };
    const [, name, op, value] = m;
    const test =
      op === "^=" ? { case: "prefix" as const, value }
      : op === "~" ? { case: "glob" as const, value }
      : op === "==" ? { case: "equalsJson" as const, value }
      : { case: "equals" as const, value };
    conditions.push(create(FieldConditionSchema, { field: name, test }));
  }
  return create(InputMatcherSchema, { kind: { case: "fields", value: { conditions } } });
}

export class RulesView {
  readonly el: HTMLElement;
  private readonly out = h("div", { class: "rows" });
  private readonly message = h("p", { role: "status" });
  private readonly explained = h("p", { class: "explain", role: "status" });

  constructor(private readonly api: Api) {
    const effect = h(
      "select",
      { name: "effect", "aria-label": "Effect" },
      [Effect.ALLOW, Effect.DENY, Effect.ASK].map((e) => h("option", { value: String(e) }, effectName(e))),
    );
    const create = h(
      "form",
      { class: "rule-form", "aria-label": "Create a rule" },
      h("h3", {}, "New rule"),
      field("id", "rule id", { required: "" }),
      field("tool", "tool glob (shell, mcp__github__*)"),
      // A kind makes the rule match that action on every host (calls from host adapters only);
      // the tool glob may then stay empty, and the matcher tests the action's fields.
      h(
        "select",
        { name: "kind", "aria-label": "Action kind (any host)" },
        h("option", { value: "" }, "no kind: this tool only"),
        ["shell", "edit", "write", "read", "fetch", "mcp", "other"].map((k) => h("option", { value: k }, `${k}, on every host`)),
      ),
      effect,
      h("input", { type: "number", name: "priority", value: "0", "aria-label": "Priority" }),
      field("description", "description (a deny rule's reason)"),
      h("textarea", { name: "matcher", rows: "3", "aria-label": "Inputs: empty for any; {json} for exactly; or lines of field = value, field ^= prefix, field ~ glob", placeholder: "any input; or {\"exact\":\"json\"}; or lines: command ^= git status" }),
      h("button", { type: "submit" }, "Create rule"),
    );
    create.addEventListener("submit", (e) => {
      e.preventDefault();
      void this.create(create);
    });
    const explain = h(
      "form",
      { class: "rule-form", "aria-label": "Explain a call" },
      h("h3", {}, "Explain: what would decide this call?"),
      field("tool", "tool", { required: "" }),
      field("session", "session"),
      field("agent", "agent (empty: default)"),
      field("workspace", "workspace"),
      // With a host, rules and grants of an action kind are tried too, as on a submit from it.
      h(
        "select",
        { name: "host", "aria-label": "Host (none: any agent)" },
        h("option", { value: "" }, "no host"),
        HOSTS.map((host) => h("option", { value: host }, hostName(host))),
      ),
      h("textarea", { name: "input", rows: "3", "aria-label": "Input JSON", placeholder: "{}" }),
      h("button", { type: "submit" }, "Explain"),
      this.explained,
    );
    explain.addEventListener("submit", (e) => {
      e.preventDefault();
      void this.explain(explain);
    });
    this.el = h("section", { id: "rules", "aria-labelledby": "rules-heading" }, h("h2", { id: "rules-heading" }, "Rules"), this.out, this.message, create, explain);
  }

  async load(): Promise<void> {
    try {
      const page = await this.api.admin.listRules({});
      const rows = page.rules.map((r) =>
        h(
          "li",
          { class: "row", "data-rule": r.id },
          h("strong", {}, r.id),
          ` ${ruleText(r)}`,
          r.description ? ` · ${r.description}` : "",
          r.source === "admin" ? h("button", { type: "button", class: "deny", "aria-label": `Delete rule ${r.id}`, onClick: () => void this.remove(r.id) }, "Delete") : h("span", { class: "meta" }, " (from the policy file)"),
        ),
      );
      this.out.replaceChildren(rows.length ? h("ul", {}, rows) : h("p", { class: "empty" }, "No rules."));
    } catch (error) {
      this.out.replaceChildren(failure(error));
    }
  }

  private async create(form: HTMLFormElement): Promise<void> {
    const data = new FormData(form);
    const text = (name: string) => String(data.get(name) ?? "").trim();
    const matcher = parseMatcher(text("matcher"));
    if ("error" in matcher) {
      this.message.textContent = matcher.error;
      return;
    }
    try {
      const rule = await this.api.admin.createRule({
        rule: { id: text("id"), tool: text("tool"), kind: text("kind"), effect: Number(text("effect")) as Effect, priority: Number(text("priority") || "0"), description: text("description"), matcher },
      });
      this.message.textContent = `Rule ${rule.id} created: ${ruleText(rule)}; it applies to calls submitted from now on.`;
      form.reset();
      await this.load();
    } catch (error) {
      this.message.textContent = describeError(error);
    }
  }

  private async remove(id: string): Promise<void> {
    try {
      await this.api.admin.deleteRule({ id });
      this.message.textContent = `Rule ${id} deleted.`;
      await this.load();
    } catch (error) {
      this.message.textContent = describeError(error);
    }
  }

  private async explain(form: HTMLFormElement): Promise<void> {
    const data = new FormData(form);
    const text = (name: string) => String(data.get(name) ?? "").trim();
    try {
      const r = await this.api.admin.explain({
        call: {
          case: "inline",
          value: {
            tool: text("tool"),
            sessionId: text("session") || "explain",
            agent: text("agent"),
            workspace: text("workspace"),
            inputJson: text("input") || "{}",
            host: text("host"),
          },
        },
      });
      const by = r.rule ? ` (rule ${r.rule.id}: ${matcherText(r.rule.matcher, r.rule.kind !== "")})` : r.grant ? ` (grant ${r.grant.id})` : "";
      this.explained.textContent = `${statusName(r.verdict)}${r.decidedBy ? ` by ${r.decidedBy}` : ""}${by}: ${r.reason}`;
    } catch (error) {
      this.explained.textContent = describeError(error);
    }
  }
}
