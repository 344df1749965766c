// Web Push for the inbox (docs/notifications.md): on the person's click (never on load) the page
// asks permission to notify, registers the service worker (/sw.js) and subscribes with the
// broker's VAPID key, then hands the subscription to the broker for this approver. A page opened
// from a notification (/#agent=…&session=…&call=…) brings that call's card into view.
import type { Api } from "./api";

/** Whether this browser can subscribe at all (a secure context: https, or localhost). */
export function pushSupported(): boolean {
  return window.isSecureContext && "serviceWorker" in navigator && "PushManager" in window && "Notification" in window;
}

function bytes(base64url: string): Uint8Array<ArrayBuffer> {
  const text = atob(base64url.replace(/-/g, "+").replace(/_/g, "/"));
  const out = new Uint8Array(new ArrayBuffer(text.length));
  for (let i = 0; i < text.length; i++) out[i] = text.charCodeAt(i);
  return out;
}

/** Registers the service worker and subscribes; the broker keeps the subscription for this
 * approver. Throws (saying why) when the browser or the broker cannot. */
export async function subscribePush(api: Api): Promise<PushSubscription> {
  const registration = await navigator.serviceWorker.register("/sw.js", { scope: "/" });
  await navigator.serviceWorker.ready;
  const { vapidPublicKey } = await api.approver.getPushKey({});
  let subscription = await registration.pushManager.getSubscription();
  const current = subscription?.options.applicationServerKey;
  if (subscription && current && btoa(String.fromCharCode(...new Uint8Array(current))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "") !== vapidPublicKey) {
    // The broker's key changed (rotation): the old subscription cannot be pushed to any more.
    await subscription.unsubscribe();
    subscription = null;
  }
  subscription ??= await registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: bytes(vapidPublicKey) });
  const json = subscription.toJSON();
  await api.approver.addPushSubscription({ endpoint: subscription.endpoint, p256dh: json.keys?.p256dh ?? "", auth: json.keys?.auth ?? "" });
  return subscription;
}

/** On sign-out: this browser stops getting this person's pushes (the broker forgets the
 * subscription, and the browser drops it). Never throws: signing out must not fail. */
export async function forgetPush(api: Api): Promise<void> {
  try {
    if (!pushSupported()) return;
    const registration = await navigator.serviceWorker.getRegistration("/");
    const subscription = await registration?.pushManager.getSubscription();
    if (!subscription) return;
    await api.approver.removePushSubscription({ endpoint: subscription.endpoint });
    await subscription.unsubscribe();
  } catch (error) {
    console.warn("push subscription not removed:", error);
  }
}

/** After sign-in: a browser that already allowed notifications renews its subscription (the
 * approver's groups as the token has them now), without asking anything. */
export function renewPush(api: Api): void {
  if (!pushSupported() || Notification.permission !== "granted") return;
  subscribePush(api).catch((error) => console.warn("push subscription not renewed:", error));
}

/** The call a notification opened the page at, from the location's fragment. */
export function linkedCall(hash = location.hash): { agent: string; session: string; call: string } | undefined {
  const params = new URLSearchParams(hash.replace(/^#/, ""));
  const agent = params.get("agent");
  const session = params.get("session");
  const call = params.get("call");
  return agent !== null && session !== null && call !== null ? { agent, session, call } : undefined;
}

/** Brings the linked call's card into view and focus when it appears (now, or when the page
 * navigates to another call). */
export function followLinks(root: HTMLElement): void {
  let observer: MutationObserver | undefined;
  const open = () => {
    observer?.disconnect();
    const linked = linkedCall();
    if (!linked) return;
    const selector = `.card[data-session="${CSS.escape(linked.session)}"][data-call="${CSS.escape(linked.call)}"]`;
    const show = (): boolean => {
      const card = root.querySelector<HTMLElement>(selector);
      if (!card) return false;
      for (const other of root.querySelectorAll(".card.linked")) other.classList.remove("linked");
      card.classList.add("linked");
      card.focus();
      card.scrollIntoView({ block: "center" });
      return true;
    };
    if (show()) return;
    observer = new MutationObserver(() => {
      if (show()) observer?.disconnect();
    });
    observer.observe(root, { childList: true, subtree: true });
  };
  window.addEventListener("hashchange", open);
  open();
}
