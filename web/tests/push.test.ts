// Web Push in a real browser: the inbox's own "Enable notifications" click subscribes (the
// browser's push service is stood in for: headless Chromium has none, so PushManager.subscribe
// answers a loopback endpoint and keys this test holds), the real broker encrypts and POSTs each
// push to a loopback push service here, which decrypts it as a browser would (node:crypto, RFC
// 8291) and hands it to the inbox's service worker through the DevTools protocol
// (ServiceWorker.deliverPushMessage). The service worker shows the notification, its click opens
// the call in the inbox, and the decision's withdrawal closes it. The click is the worker's own
// notificationclick handler, dispatched in the worker (a headless browser shows no notification
// to click): for the notification and each of its actions, a reminder and a step-up call, it
// opens that call and decides nothing. Submit -> notification shown and click-approve -> outcome
// at the agent are measured and printed (medians), never asserted.
import assert from "node:assert/strict";
import { createDecipheriv, createECDH, createHmac, randomBytes } from "node:crypto";
import { createServer, type Server } from "node:http";
import { after, before, describe, test } from "node:test";
import type { Browser, BrowserContext, Page, Worker } from "playwright-core";
import { Decision } from "../src/gen/approvals/v1/approver_pb";
import { CallStatus, Effect, EscalationStepKind, StepUp } from "../src/gen/approvals/v1/types_pb";
import { type Broker, enterToken, type grpcClients, signIn, startBrokerAndChromium, stopBrokerAndChromium, TOKENS } from "./harness";

const b64u = (b: Buffer) => b.toString("base64url");
const hmac = (key: Buffer, data: Buffer) => createHmac("sha256", key).update(data).digest();

/** The browser's half of RFC 8291: decrypts an aes128gcm body for the subscription's keys. */
function decrypt(body: Buffer, ecdh: ReturnType<typeof createECDH>, auth: Buffer): string {
  const salt = body.subarray(0, 16);
  const idlen = body[20];
  const senderPublic = body.subarray(21, 21 + idlen);
  const ciphertext = body.subarray(21 + idlen);
  const shared = ecdh.computeSecret(senderPublic);
  const uaPublic = ecdh.getPublicKey();
  const ikm = hmac(hmac(auth, shared), Buffer.concat([Buffer.from("WebPush: info\0"), uaPublic, senderPublic, Buffer.from([1])]));
  const prk = hmac(salt, ikm);
  const cek = hmac(prk, Buffer.concat([Buffer.from("Content-Encoding: aes128gcm\0"), Buffer.from([1])])).subarray(0, 16);
  const nonce = hmac(prk, Buffer.concat([Buffer.from("Content-Encoding: nonce\0"), Buffer.from([1])])).subarray(0, 12);
  const decipher = createDecipheriv("aes-128-gcm", cek, nonce);
  decipher.setAuthTag(ciphertext.subarray(ciphertext.length - 16));
  const record = Buffer.concat([decipher.update(ciphertext.subarray(0, ciphertext.length - 16)), decipher.final()]);
  let end = record.length - 1;
  while (end >= 0 && record[end] === 0) end--;
  assert.equal(record[end], 2, "the last record's delimiter");
  return record.subarray(0, end).toString("utf8");
}

let broker: Broker;
let browser: Browser;
let clients: ReturnType<typeof grpcClients>;
/** The browser contexts a test opened, closed after the suite if a failed test left them open. */
const contexts: BrowserContext[] = [];
let pushService: Server;
let pushPort = 0;
const ecdh = createECDH("prime256v1");
ecdh.generateKeys();
const auth = randomBytes(16);
/** Where decrypted pushes go: the service worker, once the test knows its registration. */
let deliver: (data: string) => Promise<void> = async () => {};
const delivered: { at: number; data: Record<string, unknown> }[] = [];
/** DevTools hand-overs that failed (said when a wait times out, rather than lost). */
const handOverErrors: string[] = [];

before(async () => {
  pushService = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (c: Buffer) => chunks.push(c));
    request.on("end", () => {
      response.writeHead(201).end();
      const data = decrypt(Buffer.concat(chunks), ecdh, auth);
      delivered.push({ at: Date.now(), data: JSON.parse(data) });
      deliver(data).catch((error: unknown) => handOverErrors.push(String(error)));
    });
  });
  await new Promise<void>((ok) => pushService.listen(0, "127.0.0.1", ok));
  const address = pushService.address();
  pushPort = typeof address === "object" && address ? address.port : 0;
  ({ broker, clients, browser } = await startBrokerAndChromium({ tokens: true, args: ["--webhook-allow-hosts", "127.0.0.1"] }));
});

after(async () => {
  await stopBrokerAndChromium({ broker, browser }, contexts);
  pushService?.close();
});

async function until<T>(what: string, probe: () => Promise<T | undefined>): Promise<T> {
  for (let i = 0; i < 400; i++) {
    const value = await probe();
    if (value !== undefined) return value;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}; the last pushes received: ${JSON.stringify(delivered.slice(-6).map((d) => [d.data.kind, d.data.tag]))}; failed hand-overs to the service worker: ${JSON.stringify(handOverErrors)}`);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** Points `deliver` at the inbox's service worker, through `page`'s own DevTools session. */
async function deliverThrough(context: BrowserContext, page: Page): Promise<void> {
  const cdp = await context.newCDPSession(page);
  const registrations: { registrationId: string; scopeURL: string; isDeleted: boolean }[] = [];
  cdp.on("ServiceWorker.workerRegistrationUpdated", (event) => registrations.push(...event.registrations));
  await cdp.send("ServiceWorker.enable");
  const registration = await until("the registration", async () => registrations.find((r) => r.scopeURL === `${broker.url}/` && !r.isDeleted));
  deliver = async (data) => {
    await cdp.send("ServiceWorker.deliverPushMessage", { origin: broker.url, registrationId: registration.registrationId, data });
  };
}

describe("Web Push in Chromium", () => {
  let context: BrowserContext;
  let page: Page;
  let worker: Worker;

  test("the click on Enable notifications (never the load) subscribes with the broker's key, and the broker keeps it", async () => {
    context = await browser.newContext({ viewport: { width: 400, height: 800 } });
    contexts.push(context);
    const endpoint = `http://127.0.0.1:${pushPort}/push/chromium-1`;
    await context.addInitScript(
      ({ endpoint, p256dh, auth }) => {
        const w = window as unknown as { asked: number; subscribed?: { userVisibleOnly: boolean; key: string } };
        w.asked = 0;
        const request = Notification.requestPermission.bind(Notification);
        Notification.requestPermission = (...args: Parameters<typeof Notification.requestPermission>) => {
          w.asked += 1;
          return request(...args);
        };
        // Headless Chromium reaches no push service: this browser's subscription is the test's.
        PushManager.prototype.getSubscription = async () => null;
        PushManager.prototype.subscribe = async function (options?: PushSubscriptionOptionsInit) {
          const key = new Uint8Array(options?.applicationServerKey as ArrayBuffer);
          w.subscribed = { userVisibleOnly: options?.userVisibleOnly === true, key: btoa(String.fromCharCode(...key)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "") };
          return {
            endpoint,
            options: { applicationServerKey: key.buffer, userVisibleOnly: true },
            toJSON: () => ({ endpoint, keys: { p256dh, auth } }),
            unsubscribe: async () => true,
          } as unknown as PushSubscription;
        };
      },
      { endpoint, p256dh: b64u(ecdh.getPublicKey()), auth: b64u(auth) },
    );
    page = await context.newPage();
    await signIn(page, `${broker.url}/`, TOKENS.alice);
    assert.equal(await page.evaluate(() => (window as unknown as { asked: number }).asked), 0, "no permission asked on load");
    // The person allows notifications when the browser asks (the grant stands for the prompt).
    await context.grantPermissions(["notifications"], { origin: broker.url });
    await page.getByRole("button", { name: "Enable notifications" }).click();
    const subscribed = await until("the page to subscribe", () => page.evaluate(() => (window as unknown as { subscribed?: { userVisibleOnly: boolean; key: string } }).subscribed));
    const { vapidPublicKey } = await clients.adminApprover.getPushKey({});
    assert.deepEqual(subscribed, { userVisibleOnly: true, key: vapidPublicKey });
    assert.equal(await page.evaluate(() => (window as unknown as { asked: number }).asked), 1);

    // The service worker, registered by the page at /sw.js, controls it; the DevTools protocol
    // delivers what the push service decrypted to it.
    worker = await until("the service worker", async () => context.serviceWorkers()[0]);
    assert.equal(new URL(worker.url()).pathname, "/sw.js");
    // What the worker shows is observed as it completes (its showNotification passes through):
    // polling registration.getNotifications() instead races the showing, and Chromium, which
    // reconciles that list with the notifications on screen, can drop the one being shown.
    await worker.evaluate(() => {
      const registration = (self as unknown as ServiceWorkerGlobalScope).registration;
      const scope = self as unknown as { shown: { tag: string; at: number }[] };
      scope.shown = [];
      const show = registration.showNotification.bind(registration);
      Object.defineProperty(registration, "showNotification", {
        configurable: true,
        value: async (title: string, options?: NotificationOptions) => {
          await show(title, options);
          scope.shown.push({ tag: options?.tag ?? "", at: Date.now() });
        },
      });
      // And each window the worker asks to open (passed through as well).
      const windows = self as unknown as { opening: string[] };
      windows.opening = [];
      const clients = (self as unknown as ServiceWorkerGlobalScope).clients;
      const openWindow = clients.openWindow.bind(clients);
      Object.defineProperty(clients, "openWindow", {
        configurable: true,
        value: (url: string) => {
          windows.opening.push(url);
          return openWindow(url);
        },
      });
    });
    await deliverThrough(context, page);
    await page.reload();
    await page.locator("#connection", { hasText: "live" }).waitFor();
    assert.ok(await page.evaluate(() => navigator.serviceWorker.controller !== null), "the page is controlled");
  });

  test("a pending call is shown as a notification; its click opens the call; approving it there reaches the agent and pushes the withdrawal (measured)", async () => {
    const { agent } = clients;
    const shownTimes: number[] = [];
    const decidedTimes: number[] = [];
    for (let i = 0; i < 5; i++) {
      const session = `s-push-${i}`;
      const callId = `p${i}`;
      const tag = `call:agent-a/${session}/${callId}`;
      const submitted = Date.now();
      await agent.submit({ batch: { sessionId: session, calls: [{ callId, tool: "Bash", inputJson: JSON.stringify({ command: `npm test -- --shard ${i}\necho done` }) }] } });
      const shown = await shownNotification(tag);
      shownTimes.push(shown.at - submitted);
      assert.deepEqual({ title: shown.title, body: shown.body }, { title: "Approve Bash?", body: `npm test -- --shard ${i}` });

      // The notification's click: the service worker's own handler, given the shown
      // notification (a headless browser has no notification to click on screen).
      await worker.evaluate(async (tag) => {
        const scope = self as unknown as ServiceWorkerGlobalScope;
        const [notification] = await scope.registration.getNotifications({ tag });
        scope.dispatchEvent(new NotificationEvent("notificationclick", { notification }));
      }, tag);
      await page.waitForURL((url) => url.hash === `#agent=agent-a&session=${session}&call=${callId}`);
      const card = page.locator(`article[data-session="${session}"][data-call="${callId}"]`);
      await card.waitFor();
      await until("the call's card to have focus", async () => ((await card.evaluate((el) => el === document.activeElement)) ? true : undefined));

      const watch = agent.watchOutcomes({ sessionId: session, callIds: [callId] });
      const iterator = watch[Symbol.asyncIterator]();
      const clicked = Date.now();
      await card.getByRole("button", { name: `Approve Bash call ${callId}` }).click();
      let outcomeAt = 0;
      for (;;) {
        const next = await iterator.next();
        assert.ok(!next.done, "the watch ended without the outcome");
        if (next.value.event.case === "outcome") {
          outcomeAt = Date.now();
          assert.equal(next.value.event.value.status, CallStatus.APPROVED);
          break;
        }
      }
      await iterator.return?.();
      decidedTimes.push(outcomeAt - clicked);
      // The click closed this notification; the decision's withdrawal is pushed all the same
      // (for this person's other devices). It is waited for, not assumed: it travels apart from
      // the outcome. (That a withdrawal closes a notification nobody clicked: the next test.)
      await until("the withdrawal", async () => (delivered.some((d) => d.data.kind === "withdrawn" && d.data.tag === tag) ? true : undefined));
      assert.equal(await worker.evaluate(async (tag) => (await (self as unknown as ServiceWorkerGlobalScope).registration.getNotifications({ tag })).length, tag), 0);
    }
    console.log(`submit -> notification shown (ms): ${shownTimes.join(", ")}; median ${median(shownTimes)}`);
    console.log(`click Approve -> outcome at the agent (ms): ${decidedTimes.join(", ")}; median ${median(decidedTimes)}`);
  });

  /** Submits one call and waits for the service worker to show its notification. */
  async function submitShown(session: string, callId: string, tool: string, input: Record<string, unknown>) {
    const tag = `call:agent-a/${session}/${callId}`;
    await clients.agent.submit({ batch: { sessionId: session, calls: [{ callId, tool, inputJson: JSON.stringify(input) }] } });
    const shown = await shownNotification(tag);
    return { tag, ...shown };
  }

  /** Waits for the worker to have shown its `nth` notification tagged `tag` (see the observer
   * in the first test), then reads it back from the browser's list, once. */
  async function shownNotification(tag: string, nth = 1) {
    const at = await until("the notification", () =>
      worker.evaluate(({ tag, nth }) => (self as unknown as { shown: { tag: string; at: number }[] }).shown.filter((s) => s.tag === tag)[nth - 1]?.at, { tag, nth }),
    );
    const listed = await worker.evaluate(async (tag) => {
      const [n] = await (self as unknown as ServiceWorkerGlobalScope).registration.getNotifications({ tag });
      return n ? { title: n.title, body: n.body, actions: n.actions.map((a) => a.action) } : undefined;
    }, tag);
    assert.ok(listed, `the notification ${tag}, once shown, is listed`);
    return { ...listed, at };
  }

  /** What the person's click does: the service worker's own notificationclick handler, given
   * the shown notification and the action clicked ("" for the notification itself). */
  async function click(tag: string, action: string) {
    await worker.evaluate(
      async ({ tag, action }) => {
        const scope = self as unknown as ServiceWorkerGlobalScope;
        const [notification] = await scope.registration.getNotifications({ tag });
        if (!notification) throw new Error(`no notification tagged ${tag} to click`);
        scope.dispatchEvent(new NotificationEvent("notificationclick", { notification, action }));
      },
      { tag, action },
    );
  }

  /** The page shows that call's card, in focus, and nothing else is linked. */
  async function showsCall(on: Page, session: string, callId: string) {
    await on.waitForURL((url) => url.hash === `#agent=agent-a&session=${session}&call=${callId}`);
    const card = on.locator(`article[data-session="${session}"][data-call="${callId}"]`);
    await card.waitFor();
    await until("the call's card to have focus", async () => ((await card.evaluate((el) => el === document.activeElement)) ? true : undefined));
    assert.equal(await on.locator("article.linked").count(), 1, "only the clicked call is linked");
    return card;
  }

  /** The windows the worker asked to open (none while an inbox tab is open). */
  async function windowsAsked() {
    return worker.evaluate(() => [...(self as unknown as { opening: string[] }).opening]);
  }

  async function notificationsTagged(tag: string) {
    return worker.evaluate(async (tag) => (await (self as unknown as ServiceWorkerGlobalScope).registration.getNotifications({ tag })).length, tag);
  }

  /** The click decided nothing: the agent still sees the call pending. */
  async function stillPending(session: string, callId: string) {
    const { calls } = await clients.agent.getOutcomes({ sessionId: session, callIds: [callId] });
    assert.equal(calls[0]?.state.case, "pending", `${callId} must still be pending after the click`);
  }

  async function denyAndWithdrawn(session: string, callId: string, tag: string) {
    await clients.adminApprover.decide({ sessionId: session, callId, agent: "agent-a", decision: Decision.DENY, approver: "alice", reason: "test over" });
    await until("the withdrawal", async () => (delivered.some((d) => d.data.kind === "withdrawn" && d.data.tag === tag) ? true : undefined));
  }

  test("the notification's click and each of its actions open that call in the inbox tab already open (navigated and focused, no new tab), and decide nothing", async () => {
    const first = await submitShown("s-click-0", "c0", "Bash", { command: "make deploy-preview" });
    // Every way to click sw.js offers: the notification itself, and each action it defines.
    const ways = ["", ...first.actions];
    assert.deepEqual(first.actions, ["open"], "sw.js's actions");
    await denyAndWithdrawn("s-click-0", "c0", first.tag);
    for (const [i, action] of ways.entries()) {
      const session = `s-click-${i + 1}`;
      const callId = `c${i + 1}`;
      // Another call is pending too: the click must open its own call, not just the inbox.
      const other = await submitShown(session, `${callId}-other`, "Bash", { command: "ls" });
      const shown = await submitShown(session, callId, "Bash", { command: `rm -rf build/${i}\nmake` });
      assert.deepEqual({ title: shown.title, body: shown.body }, { title: "Approve Bash?", body: `rm -rf build/${i}` });
      await click(shown.tag, action);
      await showsCall(page, session, callId);
      assert.equal(context.pages().length, 1, `action "${action}": the open tab was used, no new one`);
      assert.deepEqual(await windowsAsked(), [], "no window asked for");
      assert.equal(await notificationsTagged(shown.tag), 0, "the clicked notification is closed");
      assert.equal(await notificationsTagged(other.tag), 1, "the other call's notification stays");
      await stillPending(session, callId);
      await denyAndWithdrawn(session, callId, shown.tag);
      await denyAndWithdrawn(session, `${callId}-other`, other.tag);
      await until("the other notification to close", async () => ((await notificationsTagged(other.tag)) === 0 ? true : undefined));
    }
  });

  test("a reminder's click, on the tab already showing that call, brings its card back into focus", async () => {
    await clients.admin.createRule({
      rule: {
        id: "push-remind",
        tool: "remind",
        effect: Effect.ASK,
        description: "reminded soon",
        escalation: [{ after: { seconds: 2n, nanos: 0 }, kind: EscalationStepKind.REMINDER, endpoints: [] }],
      },
    });
    const session = "s-remind";
    const callId = "r1";
    const shown = await submitShown(session, callId, "remind", { command: "make release" });
    await click(shown.tag, "");
    await showsCall(page, session, callId);
    // The person looks elsewhere on the page; the call still waits, and its reminder is shown.
    await page.locator("#connection").evaluate((el) => {
      el.setAttribute("tabindex", "-1");
      (el as HTMLElement).focus();
    });
    const reminded = await shownNotification(shown.tag, 2);
    assert.equal(reminded.title, "Still waiting: Approve remind?");
    assert.ok(delivered.some((d) => d.data.kind === "reminder" && d.data.tag === shown.tag));
    await click(shown.tag, "open");
    await showsCall(page, session, callId);
    assert.equal(context.pages().length, 1);
    await stillPending(session, callId);
    await denyAndWithdrawn(session, callId, shown.tag);
  });

  test("a step-up call's notification says it needs a passkey; its click (and its Open) opens the call, never approves it", async () => {
    await clients.admin.createRule({
      rule: { id: "push-deploys-need-a-passkey", tool: "deploy", effect: Effect.ASK, description: "production deploys", approvers: { stepUp: StepUp.PASSKEY } },
    });
    for (const [i, action] of ["", "open"].entries()) {
      const session = `s-step-up-${i}`;
      const callId = `d${i}`;
      const shown = await submitShown(session, callId, "deploy", { env: `prod-${i}` });
      const payload = delivered.find((d) => d.data.kind === "pending" && d.data.tag === shown.tag);
      assert.equal(payload?.data.step_up, true, "the push says step_up");
      assert.ok(shown.body.startsWith("Needs your passkey · "), shown.body);
      assert.deepEqual(shown.actions, ["open"], "no action approves");
      await click(shown.tag, action);
      const card = await showsCall(page, session, callId);
      await card.getByText("Needs your passkey").first().waitFor();
      assert.equal(context.pages().length, 1);
      await stillPending(session, callId);
      await denyAndWithdrawn(session, callId, shown.tag);
    }
  });

  test("with no inbox tab open, the click opens one at the call; the person signs in there and sees the call's card", async () => {
    const session = "s-click-new-tab";
    const callId = "n1";
    const shown = await submitShown(session, callId, "Bash", { command: "terraform apply" });
    // The person closed the inbox: the service worker has no window to navigate.
    await page.close();
    assert.equal(context.pages().length, 0);
    // Chromium lets a service worker open a window only inside a notificationclick the browser
    // dispatched (a person's real click), not the one this test dispatches: what the worker asks
    // clients.openWindow to open (see the observer in the first test), the test opens itself.
    await click(shown.tag, "");
    const url = await until("the click to open a window", async () => (await windowsAsked())[0]);
    assert.equal(url, `${broker.url}/#agent=agent-a&session=${session}&call=${callId}`);
    page = await context.newPage();
    await page.goto(url);
    // A new tab holds no token (it is kept per tab): the person signs in, and the call is shown.
    await enterToken(page, TOKENS.alice);
    const card = await showsCall(page, session, callId);
    assert.equal(await notificationsTagged(shown.tag), 0, "the clicked notification is closed");
    await stillPending(session, callId);
    // Deliveries now go through this tab's DevTools session; the Approve here reaches the agent.
    await deliverThrough(context, page);
    await card.getByRole("button", { name: `Approve Bash call ${callId}` }).click();
    const { agent } = clients;
    await until("the approval", async () => {
      const { calls } = await agent.getOutcomes({ sessionId: session, callIds: [callId] });
      return calls[0]?.state.case === "outcome" ? calls[0].state.value.status : undefined;
    }).then((status) => assert.equal(status, CallStatus.APPROVED));
  });

  test("signing out removes this browser's subscription at the broker", async () => {
    let unsubscribed = false;
    await page.exposeFunction("unsubscribed", () => {
      unsubscribed = true;
    });
    // The test's stand-in subscription, as getSubscription now answers it.
    await page.evaluate((endpoint) => {
      PushManager.prototype.getSubscription = async () =>
        ({ endpoint, unsubscribe: async () => ((window as unknown as { unsubscribed: () => void }).unsubscribed(), true) }) as unknown as PushSubscription;
    }, `http://127.0.0.1:${pushPort}/push/chromium-1`);
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByRole("button", { name: "Open the inbox" }).waitFor();
    assert.ok(unsubscribed, "the browser dropped it");
    const again = await clients.adminApprover.removePushSubscription({ endpoint: `http://127.0.0.1:${pushPort}/push/chromium-1` });
    assert.equal(again.removed, false, "the broker had forgotten it already");
    await context.close();
  });
});
