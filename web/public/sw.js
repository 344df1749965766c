// The inbox's service worker: shows the broker's Web Push messages as notifications, closes
// them when the call is decided elsewhere, and opens the call in the inbox on a click. Served
// by the broker at /sw.js (scope /). It never decides anything: approving needs the page.
"use strict";

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

/** The message the broker sent (src/push/mod.rs, `Notice::to_json`), or null. */
function read(event) {
  try {
    const data = event.data ? event.data.json() : null;
    return data && data.v === 1 && typeof data.tag === "string" ? data : null;
  } catch {
    return null;
  }
}

async function handle(event) {
  const data = read(event);
  if (!data) {
    // userVisibleOnly: every push shows something, even one this page cannot read.
    await self.registration.showNotification("Approval inbox", { body: "Something changed: open the inbox.", tag: "inbox" });
    return;
  }
  if (data.kind === "withdrawn") {
    for (const shown of await self.registration.getNotifications({ tag: data.tag })) shown.close();
    return;
  }
  const tool = String(data.tool ?? "").slice(0, 80);
  const line = String(data.line ?? "").slice(0, 200);
  await self.registration.showNotification(`${data.kind === "reminder" ? "Still waiting: " : ""}Approve ${tool}?`, {
    body: line,
    tag: data.tag,
    renotify: data.kind === "reminder",
    requireInteraction: true,
    icon: "/icon.svg",
    data: { url: typeof data.url === "string" && data.url.startsWith("/#") ? data.url : "/" },
    actions: [{ action: "open", title: "Open" }],
  });
}

// One push at a time: Chromium's getNotifications() reconciles its list with the notifications on
// screen and can drop one being shown at that moment (seen in web/tests/push.test.ts), so a
// withdrawal's lookup must not overlap another call's showing; the dropped one would stay on
// screen with no click and no withdrawal reaching it.
let turn = Promise.resolve();
self.addEventListener("push", (event) => {
  const handled = turn.then(() => handle(event));
  turn = handled.catch(() => {});
  event.waitUntil(handled);
});

async function open(url) {
  const target = new URL(url, self.location.origin).href;
  const windows = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  for (const client of windows) {
    if (new URL(client.url).origin !== self.location.origin) continue;
    const navigated = await client.navigate(target).catch(() => null);
    if (navigated) return navigated.focus();
  }
  return self.clients.openWindow(target);
}

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  event.waitUntil(open(event.notification.data?.url ?? "/"));
});
