// Web Push in a real browser: the inbox's own "Enable notifications" click subscribes (the
// browser's push service is stood in for: headless Chromium has none, so PushManager.subscribe
// answers a loopback endpoint and keys this test holds), the real broker encrypts and POSTs each
// push to a loopback push service here, which decrypts it as a browser would (node:crypto, RFC
// 8291) and hands it to the inbox's service worker through the DevTools protocol
// (ServiceWorker.deliverPushMessage). The service worker shows the notification, its click opens
// the call in the inbox, and the decision's withdrawal closes it. Submit -> notification shown and
// click-approve -> outcome at the agent are measured and printed (medians), never asserted.
import assert from "node:assert/strict";
import { createDecipheriv, createECDH, createHmac, randomBytes } from "node:crypto";
import { createServer, type Server } from "node:http";
import { after, before, describe, test } from "node:test";
import type { Browser, BrowserContext, CDPSession, Page, Worker } from "playwright-core";
import { CallStatus } from "../src/gen/approvals/v1/types_pb";
import { Broker, grpcClients, launchChromium, TOKENS } from "./harness";

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
let pushService: Server;
let pushPort = 0;
const ecdh = createECDH("prime256v1");
ecdh.generateKeys();
const auth = randomBytes(16);
/** Where decrypted pushes go: the service worker, once the test knows its registration. */
let deliver: (data: string) => Promise<void> = async () => {};
const delivered: { at: number; data: Record<string, unknown> }[] = [];

before(async () => {
  pushService = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (c: Buffer) => chunks.push(c));
    request.on("end", () => {
      response.writeHead(201).end();
      const data = decrypt(Buffer.concat(chunks), ecdh, auth);
      delivered.push({ at: Date.now(), data: JSON.parse(data) });
      void deliver(data);
    });
  });
  await new Promise<void>((ok) => pushService.listen(0, "127.0.0.1", ok));
  const address = pushService.address();
  pushPort = typeof address === "object" && address ? address.port : 0;
  broker = new Broker({ tokens: true, args: ["--webhook-allow-hosts", "127.0.0.1"] });
  await broker.start();
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  await broker?.stop();
  pushService?.close();
});

async function until<T>(what: string, probe: () => Promise<T | undefined>): Promise<T> {
  for (let i = 0; i < 400; i++) {
    const value = await probe();
    if (value !== undefined) return value;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

describe("Web Push in Chromium", () => {
  let context: BrowserContext;
  let page: Page;
  let worker: Worker;
  let cdp: CDPSession;

  test("the click on Enable notifications (never the load) subscribes with the broker's key, and the broker keeps it", async () => {
    context = await browser.newContext({ viewport: { width: 400, height: 800 } });
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
    await page.goto(`${broker.url}/`);
    await page.getByLabel("Token", { exact: true }).fill(TOKENS.alice);
    await page.getByRole("button", { name: "Open the inbox" }).click();
    await page.locator("#connection", { hasText: "live" }).waitFor();
    assert.equal(await page.evaluate(() => (window as unknown as { asked: number }).asked), 0, "no permission asked on load");
    // The person allows notifications when the browser asks (the grant stands for the prompt).
    await context.grantPermissions(["notifications"], { origin: broker.url });
    await page.getByRole("button", { name: "Enable notifications" }).click();
    const subscribed = await until("the page to subscribe", () => page.evaluate(() => (window as unknown as { subscribed?: { userVisibleOnly: boolean; key: string } }).subscribed));
    const { vapidPublicKey } = await grpcClients(broker).adminApprover.getPushKey({});
    assert.deepEqual(subscribed, { userVisibleOnly: true, key: vapidPublicKey });
    assert.equal(await page.evaluate(() => (window as unknown as { asked: number }).asked), 1);

    // The service worker, registered by the page at /sw.js, controls it; the DevTools protocol
    // delivers what the push service decrypted to it.
    worker = await until("the service worker", async () => context.serviceWorkers()[0]);
    assert.equal(new URL(worker.url()).pathname, "/sw.js");
    cdp = await context.newCDPSession(page);
    const registrations: { registrationId: string; scopeURL: string; isDeleted: boolean }[] = [];
    cdp.on("ServiceWorker.workerRegistrationUpdated", (event) => registrations.push(...event.registrations));
    await cdp.send("ServiceWorker.enable");
    const registration = await until("the registration", async () => registrations.find((r) => r.scopeURL === `${broker.url}/` && !r.isDeleted));
    deliver = async (data) => {
      await cdp.send("ServiceWorker.deliverPushMessage", { origin: broker.url, registrationId: registration.registrationId, data });
    };
    await page.reload();
    await page.locator("#connection", { hasText: "live" }).waitFor();
    assert.ok(await page.evaluate(() => navigator.serviceWorker.controller !== null), "the page is controlled");
  });

  test("a pending call is shown as a notification; its click opens the call; approving closes it (measured)", async () => {
    const { agent } = grpcClients(broker);
    const shownTimes: number[] = [];
    const decidedTimes: number[] = [];
    for (let i = 0; i < 5; i++) {
      const session = `s-push-${i}`;
      const callId = `p${i}`;
      const tag = `call:agent-a/${session}/${callId}`;
      const submitted = Date.now();
      await agent.submit({ batch: { sessionId: session, calls: [{ callId, tool: "Bash", inputJson: JSON.stringify({ command: `npm test -- --shard ${i}\necho done` }) }] } });
      const shown = await until("the notification", () =>
        worker.evaluate(async (tag) => {
          const [n] = await (self as unknown as ServiceWorkerGlobalScope).registration.getNotifications({ tag });
          return n ? { title: n.title, body: n.body, at: Date.now() } : undefined;
        }, tag),
      );
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
      // The withdrawal closes the notification.
      await until("the withdrawal to close it", () =>
        worker.evaluate(async (tag) => ((await (self as unknown as ServiceWorkerGlobalScope).registration.getNotifications({ tag })).length === 0 ? true : undefined), tag),
      );
      assert.ok(delivered.some((d) => d.data.kind === "withdrawn" && d.data.tag === tag));
    }
    console.log(`submit -> notification shown (ms): ${shownTimes.join(", ")}; median ${median(shownTimes)}`);
    console.log(`click Approve -> outcome at the agent (ms): ${decidedTimes.join(", ")}; median ${median(decidedTimes)}`);
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
    const again = await grpcClients(broker).adminApprover.removePushSubscription({ endpoint: `http://127.0.0.1:${pushPort}/push/chromium-1` });
    assert.equal(again.removed, false, "the broker had forgotten it already");
    await context.close();
  });
});
