// The inbox in a real browser, driven as a person would: the real broker binary, calls
// submitted by a real gRPC agent, Debian's Chromium through playwright-core. Each test proves
// one promise of issue 15; the submit-to-visible time is measured and printed, not asserted.
import assert from "node:assert/strict";
import { after, afterEach, before, describe, test } from "node:test";
import type { Browser, BrowserContext, Locator, Page } from "playwright-core";
import { Decision } from "../src/gen/approvals/v1/approver_pb";
import { CallStatus, Effect } from "../src/gen/approvals/v1/types_pb";
import { anonymousAgent, Broker, card, enterToken, grpcClients, outcomeAtAgent, pendingAtAgent, signIn, startBrokerAndChromium, stopBrokerAndChromium, TOKENS } from "./harness";

let broker: Broker;
let browser: Browser;
let clients: ReturnType<typeof grpcClients>;
const contexts: BrowserContext[] = [];

before(async () => {
  ({ broker, clients, browser } = await startBrokerAndChromium());
});

// Each test's pages close with it: open pages keep their live streams and render every event.
afterEach(async () => {
  for (const context of contexts.splice(0)) await context.close().catch(() => {});
});

after(async () => {
  await stopBrokerAndChromium({ broker, browser }, contexts);
});

async function openInbox(token: string, viewport = { width: 1200, height: 900 }): Promise<Page> {
  const context = await browser.newContext({ viewport });
  contexts.push(context);
  const page = await context.newPage();
  await signIn(page, `${broker.url}/`, token);
  return page;
}

let seq = 0;
function unique(prefix: string): string {
  seq += 1;
  return `${prefix}-${seq}`;
}

async function submit(session: string, calls: { id: string; tool?: string; input?: string; title?: string; message?: string; host?: string }[]) {
  return clients.agent.submit({
    batch: {
      sessionId: session,
      calls: calls.map((c) => ({
        callId: c.id,
        tool: c.tool ?? "shell",
        inputJson: c.input ?? '{"command":"ls"}',
        title: c.title ?? "",
        message: c.message ?? "",
        host: c.host ?? "",
      })),
    },
  });
}

/** The call's outcome as the agent gets it, once decided; whether it is still pending. */
const outcomeOf = (session: string, callId: string) => outcomeAtAgent(clients.agent, session, callId);
const isPending = (session: string, callId: string) => pendingAtAgent(clients.agent, session, callId);

describe("the approval inbox in Chromium", () => {
  test("a wrong token is refused", async () => {
    const context = await browser.newContext();
    contexts.push(context);
    const page = await context.newPage();
    await page.goto(`${broker.url}/`);
    await enterToken(page, "not-a-token");
    await page.getByRole("alert").filter({ hasText: "refused this token (UNAUTHENTICATED)" }).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem("approvals.token")), null);
  });

  test("a submitted call appears, and approve reaches the agent as APPROVED", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-approve");
    await submit(session, [{ id: "c1", title: "List files" }]);
    await card(page, session, "c1").waitFor();
    assert.match(await page.title(), /^\(\d+\) Approval inbox$/);
    await page.getByRole("button", { name: "Approve shell call c1" }).first().click();
    const outcome = await outcomeOf(session, "c1");
    assert.equal(outcome.status, CallStatus.APPROVED);
    assert.equal(outcome.decidedBy, "approver:alice");
    await card(page, session, "c1").getByText("APPROVED by approver:alice").waitFor();
  });

  test("deny with a reason reaches the agent as DENIED with that reason", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-deny");
    await submit(session, [{ id: "c1", input: '{"command":"rm -rf /"}' }]);
    const c = card(page, session, "c1");
    await c.getByRole("button", { name: "Deny shell call c1" }).click();
    await c.getByLabel("Reason to deny shell call c1").fill("never delete the root");
    await c.getByRole("button", { name: "Deny", exact: true }).click();
    const outcome = await outcomeOf(session, "c1");
    assert.equal(outcome.status, CallStatus.DENIED);
    assert.equal(outcome.reason, "never delete the root");
    assert.match(outcome.toolResult, /never delete the root/);
  });

  test("respond sends the model a message instead of running the call; an empty one is not sent", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-respond");
    await submit(session, [{ id: "c1", input: '{"command":"npm install"}' }]);
    const c = card(page, session, "c1");
    await c.getByRole("button", { name: "Respond to shell call c1 with a message instead of running it" }).click();
    const box = c.getByLabel("Message to the model instead of running shell call c1");
    await box.fill("   ");
    await c.getByRole("button", { name: "Send response" }).click();
    await c.getByText("Not sent: write a message for the model").waitFor();
    assert.ok(await isPending(session, "c1"), "an empty response is never sent");
    await box.fill('Use "npm ci" instead');
    await c.getByRole("button", { name: "Send response" }).click();
    const outcome = await outcomeOf(session, "c1");
    assert.equal(outcome.status, CallStatus.DENIED);
    assert.equal(outcome.responded, true);
    assert.equal(outcome.toolResult, 'The user did not run this tool call and answered instead: "Use \\"npm ci\\" instead"');
    await c.locator(".outcome", { hasText: 'answered the model: “Use "npm ci" instead”' }).waitFor();
  });

  test("remember commands starting with npm test: previewed with what it would decide, then saved; a chained command still asks", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-prefix");
    for (const [id, command] of [["c1", "npm test"], ["c2", "npm test -- --watch"], ["c3", "npm test; rm -rf ~"]]) {
      await submit(session, [{ id, input: JSON.stringify({ command }) }]);
    }
    const c = card(page, session, "c3");
    await c.waitFor();
    const c1 = card(page, session, "c1");
    await c1.getByLabel("Remember the decision on shell call c1").selectOption({ label: "This session" });
    await c1.getByLabel("Which inputs the grant for shell call c1 matches").selectOption({ label: "commands starting with…" });
    const words = c1.getByLabel("What the grant for shell call c1 matches");
    assert.equal(await words.inputValue(), "npm test");
    await c1.locator(".narrow-text", { hasText: 'so never "npm test; rm -rf ~"' }).waitFor();
    await c1.getByRole("button", { name: "Approve shell call c1" }).click();
    await c1.getByText("Saving it also decides 1 pending call(s) now:").waitFor();
    await c1.locator(".would-decide li", { hasText: "c2" }).waitFor();
    assert.equal(await c1.locator(".would-decide li").count(), 1, "the chained command is not listed");
    assert.ok(await isPending(session, "c1"), "a preview decides nothing");
    assert.ok(await isPending(session, "c2"), "a preview decides nothing");
    await c1.getByRole("button", { name: "Approve shell call c1" }).click();
    assert.equal((await outcomeOf(session, "c1")).status, CallStatus.APPROVED);
    assert.equal((await outcomeOf(session, "c2")).status, CallStatus.APPROVED);
    assert.ok(await isPending(session, "c3"), "npm test; rm -rf ~ still asks");
  });

  test("a signed link opens its call after sign-in and decides nothing; a changed link is refused", async () => {
    const session = unique("s-link");
    // Two batches of one, decided at the end: nothing is left for the tests after this one.
    await submit(session, [{ id: "c0" }]);
    await submit(session, [{ id: "c1", input: '{"command":"make deploy"}' }]);
    const made = await clients.approver.createCallLink({ sessionId: session, callId: "c1", agent: "agent-a" });
    assert.ok(made.link.includes(`/${session}/c1/`), made.link);
    const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
    contexts.push(context);
    const page = await context.newPage();
    await page.goto(`${broker.url}/#link=${made.link}`);
    await enterToken(page, TOKENS.alice);
    await page.locator(".link-note", { hasText: `Linked call: shell c1 (session ${session}).` }).waitFor();
    await page.locator(`article.card.linked[data-session="${session}"][data-call="c1"]`).waitFor();
    assert.ok(await isPending(session, "c1"), "a link decides nothing");
    // The same link with another call's id: refused, and said so.
    await page.goto(`${broker.url}/#link=${made.link.replace("/c1/", "/c0/")}`);
    await page.reload();
    await page.locator(".link-note", { hasText: "This link does not open a call" }).waitFor();
    assert.ok(await isPending(session, "c0"));
    for (const callId of ["c0", "c1"]) await clients.approver.decide({ sessionId: session, callId, agent: "agent-a", decision: Decision.DENY });
  });

  test("edit then approve gives the agent the edited input; invalid JSON is refused before sending", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-edit");
    await submit(session, [{ id: "c1", input: '{"command":"rm -rf build"}' }]);
    const c = card(page, session, "c1");
    await c.getByRole("button", { name: "Edit the input of shell call c1, then approve" }).click();
    const editor = c.getByLabel("Edited input of shell call c1 (JSON)");
    await editor.fill('{"command": "rm -rf build/tmp"');
    await c.getByRole("button", { name: "Approve edited input" }).click();
    await c.getByText("Not sent: not valid JSON").waitFor();
    assert.equal(await isPending(session, "c1"), true, "nothing was sent");
    await editor.fill('{"command": "rm -rf build/tmp"}');
    await c.getByRole("button", { name: "Approve edited input" }).click();
    const outcome = await outcomeOf(session, "c1");
    assert.equal(outcome.status, CallStatus.APPROVED);
    assert.equal(outcome.inputEdited, true);
    assert.equal(outcome.inputJson, '{"command":"rm -rf build/tmp"}');
  });

  test("a session grant auto-approves the next matching call, shows in Grants, and revoking it works", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-grant");
    await submit(session, [{ id: "c1", tool: "read_file", input: '{"path":"README.md"}' }]);
    const c = card(page, session, "c1");
    await c.getByLabel("Remember the decision on read_file call c1").selectOption({ label: "This session" });
    await c.getByText(/Creates a grant: ALLOW \(on Approve\) or DENY \(on Deny\) every later "read_file" call in session/).waitFor();
    await c.getByRole("button", { name: "Approve read_file call c1" }).click();
    assert.equal((await outcomeOf(session, "c1")).status, CallStatus.APPROVED);

    const second = await submit(session, [{ id: "c2", tool: "read_file", input: '{"path":"README.md"}' }]);
    const decided = second.outcomes.find((o) => o.callId === "c2");
    assert.equal(decided?.status, CallStatus.APPROVED);
    assert.match(decided?.decidedBy ?? "", /^grant:\d+$/);
    const grantId = decided!.decidedBy.slice("grant:".length);

    await page.getByRole("tab", { name: "Grants" }).click();
    const row = page.locator(`li[data-grant="${grantId}"]`);
    await row.getByText(`in session "${session}"`).waitFor();
    await row.getByRole("button", { name: `Revoke grant ${grantId}` }).click();
    await page.locator(`li[data-grant="${grantId}"]`).waitFor({ state: "detached" });

    await submit(session, [{ id: "c3", tool: "read_file", input: '{"path":"README.md"}' }]);
    assert.equal(await isPending(session, "c3"), true, "the revoked grant decides nothing");
    await page.getByRole("tab", { name: /Pending/ }).click();
    await card(page, session, "c3").waitFor();
  });

  test("history finds decided calls by tool, with who decided and why", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-history");
    await submit(session, [{ id: "h1", tool: "history_probe" }]);
    await clients.approver.decide({ sessionId: session, callId: "h1", agent: "agent-a", decision: 2, reason: "not today" });
    await page.getByRole("tab", { name: "History" }).click();
    await page.locator("#history").getByLabel("tool", { exact: true }).fill("history_probe");
    await page.getByRole("button", { name: "Search" }).click();
    await page.locator("#history li", { hasText: `${session} / h1` }).getByText("by approver:bob · reason: not today").waitFor();
  });

  test("history shows a decided call's receipt, its signature verified in the browser", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-receipt");
    await submit(session, [{ id: "r1", tool: "receipt_probe" }]);
    await clients.approver.decide({ sessionId: session, callId: "r1", agent: "agent-a", decision: 1 });
    await page.getByRole("tab", { name: "History" }).click();
    await page.locator("#history").getByLabel("tool", { exact: true }).fill("receipt_probe");
    await page.getByRole("button", { name: "Search" }).click();
    const row = page.locator("#history li", { hasText: `${session} / r1` });
    await row.getByRole("button", { name: "Check the receipt of r1" }).click();
    await row.getByText(/receipt #\d+ verified in this browser \(Ed25519, key [0-9a-f]{12}/).waitFor();
  });

  test("rules: create one, Explain shows it deciding, delete it", async () => {
    const page = await openInbox(TOKENS.alice);
    const id = unique("no-danger");
    await page.getByRole("tab", { name: "Rules" }).click();
    const form = page.getByRole("form", { name: "Create a rule" });
    await form.getByLabel("rule id").fill(id);
    await form.getByLabel("tool glob (shell, mcp__github__*)").fill("danger_*");
    await form.getByLabel("Effect").selectOption({ label: "DENY" });
    await form.getByLabel("description (a deny rule's reason)").fill("dangerous tools are off");
    await form.getByRole("button", { name: "Create rule" }).click();
    await page.locator(`li[data-rule="${id}"]`).waitFor();

    const explain = page.getByRole("form", { name: "Explain a call" });
    await explain.getByLabel("tool", { exact: true }).fill("danger_zone");
    await explain.getByLabel("agent (empty: default)").fill("agent-a");
    await explain.getByRole("button", { name: "Explain" }).click();
    await explain.getByText(`DENIED by policy:${id}`).waitFor();

    await page.getByRole("button", { name: `Delete rule ${id}` }).click();
    await page.locator(`li[data-rule="${id}"]`).waitFor({ state: "detached" });
    await explain.getByRole("button", { name: "Explain" }).click();
    await explain.getByText(/^PENDING/).waitFor();
  });

  test("a new pending call notifies while the tab is in the background, once notifications are allowed", async () => {
    const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
    contexts.push(context);
    await context.grantPermissions(["notifications"], { origin: broker.url });
    const page = await context.newPage();
    // The real Notification, wrapped to record what the page shows; the tab reports itself
    // hidden, as a background tab does (headless tabs are never hidden by themselves).
    await page.addInitScript(() => {
      const Real = window.Notification;
      const shown: string[] = [];
      (window as unknown as { shown: string[] }).shown = shown;
      class Recorded extends Real {
        constructor(title: string, options?: NotificationOptions) {
          super(title, options);
          shown.push(`${title} | ${options?.body ?? ""}`);
        }
      }
      window.Notification = Recorded as typeof Notification;
      Object.defineProperty(document, "hidden", { get: () => true });
    });
    await signIn(page, `${broker.url}/`, TOKENS.alice);
    const session = unique("s-notify");
    await submit(session, [{ id: "n1", tool: "deploy", title: "Deploy to production" }]);
    await card(page, session, "n1").waitFor();
    await page.waitForFunction(() => (window as unknown as { shown: string[] }).shown.length > 0);
    const shown = await page.evaluate(() => (window as unknown as { shown: string[] }).shown);
    assert.deepEqual(shown, ["Approve deploy? | Deploy to production"]);
  });

  test("a call needing two approvals shows who may decide and 1 of 2 approvals after the first", async () => {
    const id = unique("two-person");
    const tool = `deploy_${id.replace(/-/g, "_")}`;
    await clients.admin.createRule({ rule: { id, tool, effect: Effect.ASK, approvers: { quorum: 2 } } });
    const page = await openInbox(TOKENS.bob);
    const session = unique("s-two");
    await submit(session, [{ id: "c1", tool }]);
    const c1 = card(page, session, "c1");
    await c1.getByText("0 of 2 approvals · who may decide: any approver").waitFor();
    await page.getByRole("button", { name: `Approve ${tool} call c1` }).first().click();
    await c1.getByText("1 of 2 approvals (bob) · who may decide: any approver").waitFor();
    assert.equal(await isPending(session, "c1"), true);
    // The second approver (alice, through gRPC) completes it; the page shows both.
    await clients.adminApprover.decide({ sessionId: session, callId: "c1", agent: "agent-a", decision: Decision.APPROVE });
    const outcome = await outcomeOf(session, "c1");
    assert.equal(outcome.decidedBy, "approver:bob,alice");
    await c1.getByText("APPROVED by approver:bob,alice").waitFor();
  });

  test("a second browser sees the first one's decision, with who decided", async () => {
    const first = await openInbox(TOKENS.alice);
    const second = await openInbox(TOKENS.bob);
    const session = unique("s-two");
    await submit(session, [{ id: "c1" }]);
    await card(second, session, "c1").waitFor();
    await card(first, session, "c1").getByRole("button", { name: "Approve shell call c1" }).click();
    await card(second, session, "c1").getByText("APPROVED by approver:alice").waitFor();
    // Bob's approver token cannot read the audit: the view says so, nothing else breaks.
    await second.getByRole("tab", { name: "History" }).click();
    await second.getByText("This view needs an admin token.").waitFor();
  });

  test("a whole batch is approved in one action; keyboard j and a approve the selected call", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-batch");
    await submit(session, [{ id: "b1" }, { id: "b2", tool: "read_file", input: '{"path":"a"}' }]);
    await card(page, session, "b2").waitFor();
    await page.getByRole("button", { name: /^Approve all 2 pending calls of batch/ }).click();
    assert.equal((await outcomeOf(session, "b1")).status, CallStatus.APPROVED);
    assert.equal((await outcomeOf(session, "b2")).status, CallStatus.APPROVED);

    const keys = unique("s-keys");
    await submit(keys, [{ id: "k1" }]);
    await card(page, keys, "k1").waitFor();
    await page.getByLabel("Filter by session").fill(keys);
    await page.locator("body").click({ position: { x: 1, y: 1 } });
    await page.keyboard.press("j");
    await page.keyboard.press("a");
    assert.equal((await outcomeOf(keys, "k1")).status, CallStatus.APPROVED);
  });

  test("the page works 360 px wide (a phone)", async () => {
    const page = await openInbox(TOKENS.alice, { width: 360, height: 740 });
    const session = unique("s-phone");
    await submit(session, [{ id: "c1", title: "A long title that has to wrap on a small phone screen without scrolling sideways" }]);
    const approve = card(page, session, "c1").getByRole("button", { name: "Approve shell call c1" });
    await approve.waitFor();
    const box = await approve.boundingBox();
    assert.ok(box && box.x >= 0 && box.x + box.width <= 360, `the button is on screen: ${JSON.stringify(box)}`);
    const scrollWidth = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(scrollWidth <= 360, `no sideways scrolling (scrollWidth ${scrollWidth})`);
    await approve.click();
    assert.equal((await outcomeOf(session, "c1")).status, CallStatus.APPROVED);
  });

  test("killing and restarting the broker loses nothing; the page resumes and says what was decided while away", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-restart");
    await submit(session, [{ id: "r1" }]);
    await card(page, session, "r1").waitFor();

    await broker.kill();
    await page.locator("#connection", { hasText: "reconnecting" }).waitFor();
    // Keep the page away while the broker is back and decides without it.
    await page.route("**/approvals.v1.ApproverService/Subscribe", (route) => route.abort());
    await broker.start();
    clients = grpcClients(broker);
    await clients.approver.decide({ sessionId: session, callId: "r1", agent: "agent-a", decision: 1 });
    await submit(session, [{ id: "r2" }]);
    await page.unroute("**/approvals.v1.ApproverService/Subscribe");

    await page.locator("#connection", { hasText: "live" }).waitFor();
    await page.locator("#away", { hasText: "You were away: 1 decided" }).waitFor();
    await card(page, session, "r1").getByText("APPROVED by approver:bob").waitFor();
    await card(page, session, "r2").waitFor();
    assert.equal(await card(page, session, "r1").count(), 1, "no duplicate");
    assert.equal(await card(page, session, "r2").count(), 1, "no duplicate");
    await card(page, session, "r2").getByRole("button", { name: "Approve shell call r2" }).click();
    assert.equal((await outcomeOf(session, "r2")).status, CallStatus.APPROVED);
  });

  test("a decision that loses the race shows the outcome that stands, never an error", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-race");
    await submit(session, [{ id: "c1" }]);
    const c = card(page, session, "c1");
    await c.waitFor();
    // Hold the page's live stream away (a restart breaks it; reconnects are refused) so that
    // it still shows the call as pending when Bob approves it elsewhere.
    await page.route("**/approvals.v1.ApproverService/Subscribe", (route) => route.abort());
    await broker.kill();
    await broker.start();
    clients = grpcClients(broker);
    await clients.approver.decide({ sessionId: session, callId: "c1", agent: "agent-a", decision: 1 });
    await c.getByRole("button", { name: "Deny shell call c1" }).click();
    await c.getByLabel("Reason to deny shell call c1").fill("too late");
    await c.getByRole("button", { name: "Deny", exact: true }).click();
    await c.getByText(/^Already decided: .*APPROVED/).waitFor();
    assert.equal(await c.locator(".outcome.error").count(), 0, "not shown as an error");
    await page.unroute("**/approvals.v1.ApproverService/Subscribe");
    await c.getByText("APPROVED by approver:bob").waitFor();
    assert.equal((await outcomeOf(session, "c1")).status, CallStatus.APPROVED);
  });

  test("submit to visible in the page: the median of 20 (measured, not asserted)", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-latency");
    // The page notes when each card enters its DOM (the same machine's wall clock as this
    // process): the test's own polling for the card would add its interval to the figure.
    await page.evaluate(() => {
      const seen: Record<string, number> = {};
      (window as unknown as { seen: Record<string, number> }).seen = seen;
      new MutationObserver(() => {
        for (const el of document.querySelectorAll<HTMLElement>("article.card[data-call]")) {
          const id = el.dataset.call!;
          if (!(id in seen)) seen[id] = Date.now();
        }
      }).observe(document.body, { childList: true, subtree: true });
    });
    const times: number[] = [];
    const acks: number[] = [];
    for (let i = 0; i < 20; i++) {
      const started = Date.now();
      await submit(session, [{ id: `m${i}` }]);
      acks.push(Date.now() - started);
      await card(page, session, `m${i}`).waitFor();
      const seenAt = await page.evaluate((id) => (window as unknown as { seen: Record<string, number> }).seen[id], `m${i}`);
      times.push(seenAt - started);
    }
    const median = (xs: number[]) => {
      const s = [...xs].sort((a, b) => a - b);
      return ((s[9] + s[10]) / 2).toFixed(1);
    };
    const sorted = [...times].sort((a, b) => a - b);
    console.log(
      `submit -> visible in the page: median ${median(times)} ms of 20 (min ${sorted[0]}, max ${sorted[19]}); ` +
        `of which submit -> acknowledged (committed): median ${median(acks)} ms`,
    );
  });
});

// Issue 44: the title is the agent's claim, the input is the fact. Every card shows what would
// run, above the title, badged where invisible characters stand, and nothing folded is approved
// unseen.
describe("a pending card shows what would run", () => {
  /** Whether `first` comes before `second` in the page. */
  const above = async (first: Locator, second: Locator) =>
    first.evaluate((a, b) => Boolean(a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING), await second.elementHandle());

  test("a shell call shows its command, monospaced, above the agent's title; one without a title shows it too", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-command");
    await submit(session, [
      { id: "c1", tool: "run_shell", input: '{"command":"rm -rf build"}', title: "Delete the build directory" },
      { id: "toolu_A2", tool: "shell", input: '{"command":"rm -rf ~/.cache","timeout":60}' },
    ]);
    const c1 = card(page, session, "c1");
    const command = c1.locator("pre.command");
    assert.equal(await command.textContent(), "rm -rf build");
    assert.match(await command.evaluate((el) => getComputedStyle(el).fontFamily), /mono/);
    assert.ok(await above(command, c1.getByRole("heading", { name: /Delete the build directory/ })), "the command is above the title");
    const c2 = card(page, session, "toolu_A2");
    assert.equal(await c2.locator("pre.command").textContent(), "rm -rf ~/.cache");
    await c2.locator(".input pre.json").getByText('"timeout": 60').waitFor();
    assert.equal(await c2.locator(".input").isVisible(), true, "shown without opening Details");
  });

  test("another tool's input is its canonical JSON, a long value folded with its length; the first Approve unfolds it, the second approves", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-fold");
    await submit(session, [{ id: "w1", tool: "write_file", input: JSON.stringify({ path: "notes.txt", content: `${"x".repeat(490)}rm -rf ~` }), title: "Save notes" }]);
    const c = card(page, session, "w1");
    const input = c.locator(".input pre.json");
    await input.getByText('"path": "notes.txt"').waitFor();
    await input.getByText("338 more characters (498 in all; folded)").waitFor();
    assert.equal(await input.getByText("rm -rf ~").isVisible(), false, "the tail is folded away");

    await c.getByRole("button", { name: "Approve write_file call w1" }).click();
    await c.getByText("The input was folded: it is shown in full now. Read it, then Approve again.").waitFor();
    assert.equal(await input.getByText(/rm -rf ~/).isVisible(), true, "the whole value is shown");
    assert.equal(await isPending(session, "w1"), true, "the first Approve sent nothing");

    await c.getByRole("button", { name: "Approve write_file call w1" }).click();
    assert.equal((await outcomeOf(session, "w1")).status, CallStatus.APPROVED);
  });

  test("Approve all on a batch with a folded input unfolds it first, then approves", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-fold-batch");
    await submit(session, [{ id: "b1" }, { id: "b2", tool: "write_file", input: JSON.stringify({ content: "y".repeat(300) }) }]);
    const b2 = card(page, session, "b2");
    await b2.waitFor();
    const approveAll = page.locator(".batch", { has: b2 }).getByRole("button", { name: /^Approve all 2 pending calls of batch/ });
    await approveAll.click();
    await b2.getByText("The input was folded: it is shown in full now.", { exact: false }).waitFor();
    assert.equal(await isPending(session, "b1"), true);
    assert.equal(await isPending(session, "b2"), true);
    await approveAll.click();
    assert.equal((await outcomeOf(session, "b1")).status, CallStatus.APPROVED);
    assert.equal((await outcomeOf(session, "b2")).status, CallStatus.APPROVED);
  });

  test("an MCP call shows its server and tool as fields and the tool's hints as flags, its message without raw backticks", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-mcp");
    // What the MCP gateway submits (src/agent/mcp/approval.rs, call_spec).
    await submit(session, [
      {
        id: "m1",
        tool: "delete_file",
        input: JSON.stringify({ path: "/srv/a.txt", _mcp_hints: { destructiveHint: true, openWorldHint: false, readOnlyHint: false } }),
        title: "Delete File: /srv/a.txt",
        message:
          "An MCP client asks to run the tool `delete_file` of the server `files`.\n\nThe server describes it: Deletes a file.\n\n" +
          "The server declares `destructiveHint: true`, `openWorldHint: false`, `readOnlyHint: false` (hints it gives about itself, not checked by anyone; also in the input as `_mcp_hints`, which is not passed to the tool).",
      },
    ]);
    const c = card(page, session, "m1");
    assert.equal(await c.locator(".mcp code.mcp-server").textContent(), "files");
    assert.equal(await c.locator(".mcp code.mcp-tool").textContent(), "delete_file");
    const destructive = c.locator('.flag[data-hint="destructiveHint"]');
    assert.equal(await destructive.textContent(), "destructive");
    assert.match((await destructive.getAttribute("class")) ?? "", /risky/);
    assert.equal(await c.locator('.flag[data-hint="openWorldHint"]').textContent(), "closed world");
    const message = c.locator("p.message");
    assert.equal((await message.textContent())?.includes("`"), false, "no raw backticks");
    assert.equal(await message.locator("code", { hasText: "files" }).count(), 1);
  });

  // One class of the broker's list each (src/domain/invisible.rs): the badge stands where the
  // character does, in the input on the card.
  const classes: [string, string, string[]][] = [
    ["a bidirectional override", "rm -rf \u202Epmt/", ["U+202E"]],
    ["a zero-width space", "read\u200B_file", ["U+200B"]],
    ["tag characters (U+E0000-U+E007F)", "ok\u{E0001}\u{E0069}\u{E0067}\u{E007F}", ["U+E0001", "U+E0069", "U+E0067", "U+E007F"]],
    ["line and paragraph separators", "one\u2028two\u2029three", ["U+2028", "U+2029"]],
    ["other invisible format characters (soft hyphen, variation selector, Arabic number sign, musical format)", "a\u00ADb\uFE0Fc\u0600d\u{1D173}e", ["U+00AD", "U+FE0F", "U+0600", "U+1D173"]],
  ];
  for (const [name, text, codes] of classes) {
    test(`${name} in an input is badged where it stands, in JSON and in a command`, async () => {
      const page = await openInbox(TOKENS.alice);
      const session = unique("s-invisible");
      await submit(session, [
        { id: "j1", tool: "write_file", input: JSON.stringify({ text }) },
        { id: "s1", tool: "shell", input: JSON.stringify({ command: `echo ${text}` }) },
      ]);
      const json = card(page, session, "j1").locator(".input pre.json");
      await json.waitFor();
      assert.deepEqual(await json.locator("mark.hidden-char").allTextContents(), codes);
      // Where it stands: the text around each badge is the text around the character.
      const shown = await json.locator(".j-str").textContent();
      let expected = JSON.stringify(text);
      for (const ch of Array.from(text)) if (codes.includes(`U+${ch.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0")}`)) expected = expected.replace(ch, `U+${ch.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0")}`);
      assert.equal(shown, expected);
      const command = card(page, session, "s1").locator("pre.command");
      assert.deepEqual(await command.locator("mark.hidden-char").allTextContents(), codes);
    });
  }
});

describe("the inbox says how things stand", () => {
  test("after a broker restart with nothing new, the page is live again at once, without waiting for an event", async () => {
    const page = await openInbox(TOKENS.alice);
    await broker.kill();
    await page.locator("#connection", { hasText: "reconnecting" }).waitFor();
    await broker.start();
    clients = grpcClients(broker);
    // Nothing is submitted or decided: the resume has nothing to replay. The page retries
    // within 3 s; once the stream is open it must say so.
    await page.locator("#connection", { hasText: /^live$/ }).waitFor({ timeout: 10_000 });
  });
});

describe("batch headers follow their calls", () => {
  test("deciding two of three updates the header: 1 pending, and no Approve all", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-header");
    await submit(session, [{ id: "h1" }, { id: "h2" }, { id: "h3" }]);
    const batch = page.locator(".batch", { has: card(page, session, "h3") });
    await batch.locator(".batch-head").getByText("3 call(s), 3 pending").waitFor();
    assert.equal(await batch.getByRole("button", { name: /^Approve all 3 pending calls/ }).count(), 1);
    // One decided elsewhere, one on this page.
    await clients.approver.decide({ sessionId: session, callId: "h1", agent: "agent-a", decision: Decision.APPROVE });
    await card(page, session, "h1").getByText("APPROVED by approver:bob").waitFor();
    await batch.locator(".batch-head").getByText("3 call(s), 2 pending").waitFor();
    await card(page, session, "h2").getByRole("button", { name: "Approve shell call h2" }).click();
    await card(page, session, "h2").getByText("APPROVED by approver:alice").waitFor();
    await batch.locator(".batch-head").getByText("3 call(s), 1 pending").waitFor();
    assert.equal(await batch.getByRole("button", { name: /^Approve all/ }).count(), 0, "nothing to approve all");
    assert.equal(await batch.getByRole("button", { name: /^Deny all/ }).count(), 0);
    await clients.approver.decide({ sessionId: session, callId: "h3", agent: "agent-a", decision: Decision.DENY, reason: "no" });
    await batch.locator(".batch-head").getByText("3 call(s), all decided").waitFor();
  });
});

describe("a first visit without surprises", () => {
  test("on a broker without tokens, sign-in asks only for a name, and decisions are recorded under it", async () => {
    const open = new Broker({ tokens: false });
    await open.start();
    try {
      const context = await browser.newContext();
      contexts.push(context);
      const page = await context.newPage();
      await page.goto(`${open.url}/`);
      await page.getByText("This broker runs without tokens").waitFor();
      assert.equal(await page.getByLabel("Token", { exact: true }).isVisible(), false, "no token asked for");
      await page.getByLabel(/Your name/).fill("carol");
      await page.getByRole("button", { name: "Open the inbox" }).click();
      await page.locator("#connection", { hasText: "live" }).waitFor();
      await anonymousAgent(open).submit({ batch: { sessionId: "s-open", calls: [{ callId: "c1", tool: "shell", inputJson: '{"command":"ls"}' }] } });
      await card(page, "s-open", "c1").getByRole("button", { name: "Approve shell call c1" }).click();
      await card(page, "s-open", "c1").getByText("APPROVED by approver:carol").waitFor();
    } finally {
      await open.stop();
    }
  });

  test("a broker with tokens still asks for one", async () => {
    const context = await browser.newContext();
    contexts.push(context);
    const page = await context.newPage();
    await page.goto(`${broker.url}/`);
    await page.getByText("Enter an approver (or admin) token").waitFor();
    assert.equal(await page.getByLabel("Token", { exact: true }).isVisible(), true);
  });

  test("/favicon.ico answers 204, not a gRPC 400, and loading the page asks for nothing that fails", async () => {
    const icon = await fetch(`${broker.url}/favicon.ico`);
    assert.equal(icon.status, 204);
    const context = await browser.newContext();
    contexts.push(context);
    const page = await context.newPage();
    const failed: string[] = [];
    page.on("response", (r) => {
      if (r.status() >= 400) failed.push(`${r.status()} ${r.url()}`);
    });
    await signIn(page, `${broker.url}/`, TOKENS.alice);
    assert.deepEqual(failed, []);
  });
});

describe("history shows what was decided", () => {
  test("newest first, each call's title and input, outcomes told apart; filters by tool, session, outcome and decider", async () => {
    const tool = `hist_shell_${Date.now()}`;
    const session = unique("s-hist");
    const other = unique("s-hist-other");
    // One call per batch, in order: h1 oldest, h3 newest.
    await submit(session, [{ id: "h1", tool, input: '{"command":"echo one"}', title: "First" }]);
    await submit(session, [{ id: "h2", tool, input: '{"command":"rm -rf /tmp/two"}', title: "Second" }]);
    await submit(other, [{ id: "h3", tool, input: '{"command":"echo three"}', title: "Third" }]);
    await clients.approver.decide({ sessionId: session, callId: "h1", agent: "agent-a", decision: Decision.APPROVE });
    await clients.approver.decide({ sessionId: session, callId: "h2", agent: "agent-a", decision: Decision.DENY, reason: "not /tmp" });
    await clients.adminApprover.decide({ sessionId: other, callId: "h3", agent: "agent-a", decision: Decision.APPROVE });

    const page = await openInbox(TOKENS.alice);
    await page.getByRole("tab", { name: "History" }).click();
    const history = page.locator("#history");
    const search = async (fields: { tool?: string; session?: string; decidedBy?: string; outcome?: string }) => {
      await history.getByLabel("tool", { exact: true }).fill(fields.tool ?? tool);
      await history.getByLabel("session", { exact: true }).fill(fields.session ?? "");
      await history.getByLabel(/^decided by/).fill(fields.decidedBy ?? "");
      await history.getByLabel("Outcome").selectOption({ label: fields.outcome ?? "any outcome" });
      await history.getByRole("button", { name: "Search" }).click();
    };
    const shown = () => history.locator("li.history-row").evaluateAll((rows) => rows.map((r) => (r as HTMLElement).dataset.call));
    const waitShown = async (want: string[]) => {
      for (let i = 0; i < 100 && JSON.stringify(await shown()) !== JSON.stringify(want); i++) await page.waitForTimeout(50);
      assert.deepEqual(await shown(), want);
    };

    await search({});
    await waitShown(["h3", "h2", "h1"]);
    const row = (id: string) => history.locator(`li.history-row[data-call="${id}"]`);
    assert.equal(await row("h2").locator(".title").textContent(), "Second");
    assert.equal(await row("h2").locator("pre.command").textContent(), "rm -rf /tmp/two");
    assert.equal(await row("h2").locator(".outcome-badge").textContent(), "✗ DENIED");
    assert.equal(await row("h1").locator(".outcome-badge").textContent(), "✓ APPROVED");
    const colour = (id: string) => row(id).locator(".outcome-badge").evaluate((el) => getComputedStyle(el).backgroundColor);
    assert.notEqual(await colour("h1"), await colour("h2"), "approved and denied differ in colour");
    await row("h2").getByText("by approver:bob · reason: not /tmp").waitFor();

    await search({ session: other });
    await waitShown(["h3"]);
    await search({ outcome: "DENIED" });
    await waitShown(["h2"]);
    await search({ decidedBy: "approver:alice" });
    await waitShown(["h3"]);
    await search({ decidedBy: "approver:bob", outcome: "APPROVED" });
    await waitShown(["h1"]);
  });
});

// Issue 48: a call a host adapter submits (`CallSpec.host`) says which host asked and what it
// does in the words every host shares (`Call.action`), beside the raw tool and input, which stay
// the fact; a remembered decision on it covers the action on every host, and says so.
describe("the inbox shows which host asked and what the call does", () => {
  test("a Codex call shows the host, the kind and the command beside the raw tool and input; a call without a host looks as before", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-host");
    await submit(session, [
      { id: "x1", tool: "Bash", input: '{"command":"git status"}', host: "codex", title: "Check the tree" },
      { id: "p1", tool: "shell", input: '{"command":"git status"}' },
    ]);
    const x1 = card(page, session, "x1");
    const action = x1.locator("p.action");
    await action.waitFor();
    assert.equal(await action.locator(".host").textContent(), "Codex");
    assert.equal(await action.locator(".kind").textContent(), "shell");
    assert.equal(await action.locator(".key-field").textContent(), "git status");
    // The raw tool and input are shown as ever.
    assert.equal(await x1.locator("code.tool").textContent(), "Bash");
    assert.equal(await x1.locator("pre.command").textContent(), "git status");
    // The scope choice says the remembered decision holds for the action on every host.
    const scope = x1.getByLabel("Remember the decision on Bash call x1");
    assert.deepEqual(await scope.locator("option").allTextContents(), [
      "Once",
      "For `git status` (shell) on every host, this session",
      "For `git status` (shell) on every host, this workspace",
      "For `git status` (shell) on every host, always (this agent)",
    ]);
    await scope.selectOption({ index: 1 });
    await x1.getByText(/every later shell action, on every host \(whichever tool asks for it, not only "Bash"\)/).waitFor();
    await x1.getByLabel("Which inputs the grant for Bash call x1 matches").selectOption("any");
    assert.equal(await scope.locator("option").nth(1).textContent(), "For any shell action on every host, this session");
    // Details holds the action's fields, as rules and grants test them.
    await x1.getByRole("button", { name: "Details of Bash call x1" }).click();
    await x1.getByLabel("The shell action's fields").getByText('"command": "git status"').waitFor();

    const p1 = card(page, session, "p1");
    await p1.locator("pre.command").waitFor();
    assert.equal(await p1.locator("p.action").count(), 0, "no host line without a host");
    assert.deepEqual(await p1.getByLabel("Remember the decision on shell call p1").locator("option").allTextContents(), [
      "Once",
      "This session",
      "This workspace",
      "Always (this agent)",
    ]);
  });

  test("a command holding markup is shown as text, never run as HTML", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-host-html");
    const command = `echo <img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>`;
    await submit(session, [{ id: "i1", tool: "Bash", input: JSON.stringify({ command }), host: "claude-code", title: "<b>bold</b>" }]);
    const c = card(page, session, "i1");
    const key = c.locator("p.action .key-field");
    await key.waitFor();
    assert.equal(await key.textContent(), command);
    assert.equal(await c.locator("p.action .host").textContent(), "Claude Code");
    assert.equal(await c.locator("img, script, b").count(), 0, "no element made from the call's text");
    assert.match((await c.locator("select[name=scope] option").nth(1).textContent()) ?? "", /^For `echo <img src=x/);
    await page.waitForTimeout(200);
    assert.equal(await page.evaluate(() => (window as unknown as { __pwned?: number }).__pwned), undefined);
  });

  test("remembering a Codex shell call for the session approves the same command from Gemini CLI; Grants shows its kind", async () => {
    const page = await openInbox(TOKENS.alice);
    const session = unique("s-host-grant");
    await submit(session, [{ id: "g1", tool: "Bash", input: '{"command":"git status"}', host: "codex" }]);
    const c = card(page, session, "g1");
    await c.getByLabel("Remember the decision on Bash call g1").selectOption({ label: "For `git status` (shell) on every host, this session" });
    await c.getByRole("button", { name: "Approve Bash call g1" }).click();
    assert.equal((await outcomeOf(session, "g1")).status, CallStatus.APPROVED);

    const second = await submit(session, [{ id: "g2", tool: "run_shell_command", input: '{"command":"git status"}', host: "gemini-cli" }]);
    const decided = second.outcomes.find((o) => o.callId === "g2");
    assert.equal(decided?.status, CallStatus.APPROVED, "the grant covers the action on another host");
    assert.match(decided?.decidedBy ?? "", /^grant:\d+$/);
    const grantId = decided!.decidedBy.slice("grant:".length);

    await page.getByRole("tab", { name: "Grants" }).click();
    await page.locator(`li[data-grant="${grantId}"]`).getByText('ALLOW shell actions on every host (made on "Bash")').waitFor();

    // History shows the host line beside what ran, as the card did.
    await page.getByRole("tab", { name: "History" }).click();
    const history = page.locator("#history");
    await history.getByLabel("session", { exact: true }).fill(session);
    await history.getByRole("button", { name: "Search" }).click();
    const g2 = history.locator(`li.history-row[data-call="g2"]`);
    assert.equal(await g2.locator("p.action .host").textContent(), "Gemini CLI");
    assert.equal(await g2.locator("p.action .key-field").textContent(), "git status");
    assert.equal(await g2.locator("code").first().textContent(), "run_shell_command");
  });

  test("a rule made for the shell kind, without a tool, is listed with its kind and decides a host's shell call", async () => {
    const page = await openInbox(TOKENS.alice);
    const id = unique("no-rm-anywhere");
    await page.getByRole("tab", { name: "Rules" }).click();
    const form = page.getByRole("form", { name: "Create a rule" });
    await form.getByLabel("rule id").fill(id);
    await form.getByLabel("Action kind (any host)").selectOption("shell");
    await form.getByLabel("Effect").selectOption({ label: "DENY" });
    await form.getByLabel(/^Inputs:/).fill("command ^= rm -rf");
    await form.getByRole("button", { name: "Create rule" }).click();
    const row = page.locator(`li[data-rule="${id}"]`);
    await row.getByText('DENY shell actions on every host for actions where command starts with "rm -rf"').waitFor();
    try {
      const session = unique("s-host-rule");
      const reply = await submit(session, [{ id: "r1", tool: "run_shell_command", input: '{"command":"rm -rf build"}', host: "gemini-cli" }]);
      assert.equal(reply.outcomes.find((o) => o.callId === "r1")?.decidedBy, `policy:${id}`);
      // Explain of a call described inline tries kind rules once it names its host.
      const explain = page.getByRole("form", { name: "Explain a call" });
      await explain.getByLabel("tool", { exact: true }).fill("Bash");
      await explain.getByLabel("agent (empty: default)").fill("agent-a");
      await explain.getByLabel("Input JSON").fill('{"command":"rm -rf build"}');
      await explain.getByLabel("Host (none: any agent)").selectOption({ label: "Codex" });
      await explain.getByRole("button", { name: "Explain" }).click();
      await explain.getByText(`DENIED by policy:${id}`).waitFor();
    } finally {
      await page.getByRole("button", { name: `Delete rule ${id}` }).click();
      await row.waitFor({ state: "detached" });
    }
  });
});
