// The approval inbox page: sign in with the organisation's OpenID provider (signin.ts, tokens in
// memory only) or with a token (kept in this tab's sessionStorage), then the
// live pending list, history, grants and rules, with keyboard shortcuts and notifications. A
// broker without tokens asks for none: the page asks it first, and then only for a name.
import "./style.css";
import { type Api, connect, describeError, forgetSession, isAuthFailure, type Session, saveSession, savedSession, tokensRequired } from "./api";
import { GrantsView, HistoryView, RulesView } from "./admin";
import { $, h } from "./dom";
import type { Call } from "./gen/approvals/v1/types_pb";
import { Live, type LinkState } from "./live";
import { PasskeysView } from "./passkeys";
import { PendingView } from "./pending";
import { openSignedLink } from "./answers";
import { followLinks, forgetPush, pushSupported, renewPush, subscribePush } from "./push";
import { finishSignIn, offerSignIn, type OpenIdSession, type OpenIdSettings, openIdSettings } from "./signin";

const TITLE = "Approval inbox";
/** Sign-in with the organisation's OpenID provider, when the broker offers it. */
let openid: OpenIdSettings | undefined;

function signIn(error?: string, withToken = true): void {
  const form = $("sign-in") as HTMLFormElement;
  form.hidden = false;
  $("sign-out").hidden = true;
  $("sign-in-error").textContent = error ?? "";
  offerSignIn(form, openid, (why) => ($("sign-in-error").textContent = why));
  // Without tokens the broker takes anyone's word for who decides: ask only for the name.
  $("token-label").hidden = !withToken;
  $("sign-in-with-token").hidden = !withToken;
  $("sign-in-without-token").hidden = withToken;
  (document.getElementById(withToken ? "token" : "approver-name") as HTMLInputElement).focus();
  form.onsubmit = (event) => {
    event.preventDefault();
    const session: Session = {
      token: (form.elements.namedItem("token") as HTMLInputElement).value.trim(),
      approverName: (form.elements.namedItem("approver") as HTMLInputElement).value.trim(),
    };
    saveSession(session);
    location.reload();
  };
}

function notifier(api: Api): (call: Call) => void {
  const button = $("notify") as HTMLButtonElement;
  if (!("Notification" in window)) return () => {};
  button.hidden = Notification.permission !== "default";
  button.onclick = async () => {
    await Notification.requestPermission();
    button.hidden = Notification.permission !== "default";
    // Web Push too, where the browser can: notifications while the inbox is closed.
    if (Notification.permission === "granted" && pushSupported()) subscribePush(api).catch((error) => console.warn("push subscription failed:", error));
  };
  return (call) => {
    if (Notification.permission !== "granted" || !document.hidden) return;
    new Notification(`Approve ${call.tool}?`, { body: call.title || call.message || call.inputJson.slice(0, 120), tag: call.callId });
  };
}

/** `person`: signed in with the OpenID provider (tokens in memory only), not a typed token. */
function open(session: Session, person?: OpenIdSession): void {
  const api: Api = connect(session);
  $("sign-in").hidden = true;
  const signOut = $("sign-out");
  signOut.hidden = false;
  if (person) signOut.textContent = `Sign out ${person.person}`;
  signOut.onclick = async () => {
    await forgetPush(api).catch(() => {});
    forgetSession();
    if (person) person.signOut();
    else location.reload();
  };
  const notify = notifier(api);
  const connection = $("connection");
  const away = $("away");
  let pending: PendingView;
  let snapshotTaken = false;
  const live = new Live(api, {
    changed: () => schedule(),
    state: (state: LinkState) => {
      connection.textContent = state === "live" ? "live" : state === "connecting" ? "connecting…" : "reconnecting…";
      connection.className = `link-${state}`;
      if (state === "live") snapshotTaken = true;
    },
    away: (n) => {
      away.hidden = false;
      away.textContent = `You were away: ${n} decided`;
    },
    requested: (call) => {
      if (snapshotTaken) notify(call);
    },
    refused: (error) => {
      live.stop();
      forgetSession();
      person?.forget();
      main.replaceChildren($("sign-in"));
      signIn(isAuthFailure(error) ? "The broker refused this token (UNAUTHENTICATED)." : `Refused: ${describeError(error)}`);
    },
  });
  person?.watch(
    (token) => (session.token = token),
    (why) => {
      live.stop();
      session.token = "";
      signOut.hidden = true;
      main.replaceChildren($("sign-in"));
      signIn(why);
    },
  );
  pending = new PendingView(api, live);
  const history = new HistoryView(api);
  const grants = new GrantsView(api);
  const rules = new RulesView(api);
  const passkeys = new PasskeysView(api);
  const views = { pending, history, grants, rules, passkeys } as const;
  type ViewName = keyof typeof views;
  let current: ViewName = "pending";
  const tabs = (Object.keys(views) as ViewName[]).map((name) =>
    h("button", { type: "button", role: "tab", id: `tab-${name}`, "aria-controls": name, onClick: () => show(name) }, name[0].toUpperCase() + name.slice(1)),
  );
  const main = $("main");
  main.append(h("nav", { role: "tablist", "aria-label": "Views" }, tabs));
  for (const view of Object.values(views)) main.append(view.el);

  function show(name: ViewName): void {
    current = name;
    for (const [n, view] of Object.entries(views)) view.el.hidden = n !== name;
    for (const tab of tabs) tab.setAttribute("aria-selected", String(tab.id === `tab-${name}`));
    if (name !== "pending") void views[name].load();
  }
  show("pending");

  let scheduled = false;
  function schedule(): void {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      pending.render();
      const n = pending.pendingCount();
      document.title = n > 0 ? `(${n}) ${TITLE}` : TITLE;
      tabs[0].textContent = n > 0 ? `Pending (${n})` : "Pending";
    });
  }
  // Ages and deadlines count down; decided cards leave after a while.
  setInterval(() => pending.prune(), 1000);
  schedule();

  document.addEventListener("keydown", (event) => {
    const target = event.target as HTMLElement;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (target.closest("input, textarea, select")) {
      if (event.key === "Escape") target.blur();
      return;
    }
    const keys: Record<string, () => void> = {
      j: () => pending.move(1),
      k: () => pending.move(-1),
      a: () => pending.act("approve"),
      d: () => pending.act("deny"),
      e: () => pending.act("edit"),
      "/": () => (current === "history" ? history.search.focus() : pending.focusSearch()),
    };
    const action = keys[event.key];
    if (!action) return;
    if (current !== "pending" && event.key !== "/") return;
    event.preventDefault();
    action();
  });
  void live.run();
  renewPush(api);
  followLinks(main);
  void openSignedLink(api);
}

void (async () => {
  // Hidden until signIn() wires it: a submit before then would be the browser's own.
  $("sign-in").hidden = true;
  openid = await openIdSettings();
  const back = await finishSignIn(openid);
  if (back.kind === "signed-in") return open({ token: back.session.token, approverName: "" }, back.session);
  const session = savedSession();
  if (session && back.kind === "none") return open(session);
  const required = await tokensRequired();
  signIn(back.kind === "failed" ? back.error : back.kind === "signed-out" ? "You are signed out." : undefined, required);
})();
