// Signing in to the inbox with the organisation's OpenID provider (docs/identity.md, "Signing in
// to the inbox"): Authorization Code with PKCE (S256), state and nonce, the inbox a public client.
// The page redirects to the provider, exchanges the code at the provider's token endpoint itself,
// checks the ID token's nonce, issuer and audience, and then sends the ID token as the bearer of
// every gRPC-Web call, which the broker verifies against the provider's keys like any JWT.
//
// Tokens live in this page's memory only (never localStorage or sessionStorage): a reload signs
// in again, usually without a prompt while the provider's own session lasts. Only the one-shot
// PKCE verifier, state and nonce survive the redirect, in sessionStorage, and are removed as soon
// as the provider answers. No cookie carries the session, so there is no cross-site request to
// forge: another site cannot make the browser attach a bearer token.
//
// The session ends when the ID token does, unless the provider gave a refresh token, which is
// used before then. If a refresh fails (the provider down), the page keeps the token it has
// until it expires, then says the session ended and offers sign-in again: nothing fails open.

/** What the broker serves at SETTINGS_PATH when sign-in is configured. */
export interface OpenIdSettings {
  issuer: string;
  clientId: string;
  scopes: string;
  /** The claim that names the person (as the broker reads it: `--jwt-identity-claim`). */
  identityClaim: string;
}

interface Discovery {
  authorization_endpoint: string;
  token_endpoint: string;
  end_session_endpoint?: string;
}

interface TokenReply {
  id_token?: string;
  refresh_token?: string;
  error?: string;
  error_description?: string;
}

/** The sign-in settings: served by the broker on the page's own origin. */
export const SETTINGS_PATH = "/inbox-sign-in.json";
/** What survives the redirect to the provider: the PKCE verifier, state and nonce. */
const PENDING_KEY = "approvals.openid.pending";
/** The `state` of a sign-out's return, so the page can say the person signed out. */
const SIGNED_OUT_STATE = "signed-out";
/** A sign-in started more than this long ago is not finished (a stale or replayed answer). */
const PENDING_LIFETIME_MS = 10 * 60_000;

/** The settings, or `undefined` when this broker offers no sign-in (or cannot be asked). */
export async function openIdSettings(): Promise<OpenIdSettings | undefined> {
  try {
    const response = await fetch(SETTINGS_PATH, { cache: "no-store" });
    if (!response.ok) return undefined;
    const body = (await response.json()) as { openid?: OpenIdSettings | null };
    return body.openid ?? undefined;
  } catch {
    return undefined;
  }
}

const base64url = (bytes: Uint8Array): string =>
  btoa(String.fromCharCode(...bytes))
    .replace(/\+/g, "-")
    .replace(/\//g, "_")
    .replace(/=+$/, "");

const randomText = (): string => base64url(crypto.getRandomValues(new Uint8Array(32)));

async function discover(settings: OpenIdSettings): Promise<Discovery> {
  const url = `${settings.issuer.replace(/\/$/, "")}/.well-known/openid-configuration`;
  let response: Response;
  try {
    response = await fetch(url, { cache: "no-store" });
  } catch (error) {
    throw new Error(`the identity provider could not be reached (${url}): ${error}`);
  }
  if (!response.ok) throw new Error(`the identity provider answered ${response.status} for ${url}`);
  const doc = (await response.json()) as Discovery & { issuer?: string };
  if (doc.issuer !== settings.issuer) throw new Error(`the provider at ${url} names another issuer (${doc.issuer})`);
  if (!doc.authorization_endpoint || !doc.token_endpoint) throw new Error(`the provider at ${url} has no authorization or token endpoint`);
  return doc;
}

/** This page, where the provider sends the person back (register it at the provider). */
const redirectUri = (): string => `${location.origin}/`;

/** Starts a sign-in: to the provider's login, with PKCE, state and nonce. Does not return. */
export async function beginSignIn(settings: OpenIdSettings): Promise<void> {
  const provider = await discover(settings);
  const verifier = randomText();
  const challenge = base64url(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier))));
  const state = randomText();
  const nonce = randomText();
  sessionStorage.setItem(PENDING_KEY, JSON.stringify({ verifier, state, nonce, at: Date.now() }));
  const url = new URL(provider.authorization_endpoint);
  for (const [name, value] of Object.entries({
    response_type: "code",
    client_id: settings.clientId,
    redirect_uri: redirectUri(),
    scope: settings.scopes,
    state,
    nonce,
    code_challenge: challenge,
    code_challenge_method: "S256",
  })) {
    url.searchParams.set(name, value);
  }
  location.assign(url.toString());
}

/** The claims of a JWT, unverified: the broker verifies it; the page reads what it shows. */
function claimsOf(jwt: string): Record<string, unknown> {
  const payload = jwt.split(".")[1] ?? "";
  const text = atob(payload.replace(/-/g, "+").replace(/_/g, "/"));
  const bytes = Uint8Array.from(text, (c) => c.charCodeAt(0));
  return JSON.parse(new TextDecoder().decode(bytes)) as Record<string, unknown>;
}

/** Checks an ID token the token endpoint gave: from this issuer, for this client, and (on
 * sign-in) carrying this sign-in's nonce, so an ID token from another sign-in is refused. */
function checkIdToken(settings: OpenIdSettings, idToken: string, nonce: string | undefined): Record<string, unknown> {
  let claims: Record<string, unknown>;
  try {
    claims = claimsOf(idToken);
  } catch {
    throw new Error("the provider's ID token is not a JWT");
  }
  if (claims.iss !== settings.issuer) throw new Error("the ID token was issued by another issuer");
  const aud = Array.isArray(claims.aud) ? claims.aud : [claims.aud];
  if (!aud.includes(settings.clientId)) throw new Error("the ID token is for another client");
  if (nonce !== undefined && claims.nonce !== nonce) throw new Error("the ID token's nonce is not this sign-in's (a replayed answer?)");
  if (typeof claims.exp !== "number") throw new Error("the ID token has no expiry");
  return claims;
}

async function tokenRequest(provider: Discovery, body: Record<string, string>): Promise<TokenReply> {
  const response = await fetch(provider.token_endpoint, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded", accept: "application/json" },
    body: new URLSearchParams(body),
    cache: "no-store",
  });
  const reply = (await response.json().catch(() => ({}))) as TokenReply;
  if (!response.ok || reply.error) {
    throw new Error(`the provider refused (${reply.error ?? response.status}${reply.error_description ? `: ${reply.error_description}` : ""})`);
  }
  if (!reply.id_token) throw new Error("the provider's answer holds no ID token (is `openid` among the scopes?)");
  return reply;
}

/** What the provider's return to this page means. */
export type Return =
  | { kind: "none" }
  | { kind: "signed-out" }
  | { kind: "failed"; error: string }
  | { kind: "signed-in"; session: OpenIdSession };

/** Finishes a sign-in when the provider sent the person back here (`?code=` or `?error=`);
 * removes the answer from the address bar either way, so a reload does not replay it. */
export async function finishSignIn(settings: OpenIdSettings | undefined): Promise<Return> {
  const params = new URLSearchParams(location.search);
  const code = params.get("code");
  const error = params.get("error");
  const state = params.get("state");
  if (code === null && error === null) {
    if (state === SIGNED_OUT_STATE) {
      history.replaceState(null, "", "/");
      return { kind: "signed-out" };
    }
    return { kind: "none" };
  }
  history.replaceState(null, "", "/");
  const saved = sessionStorage.getItem(PENDING_KEY);
  sessionStorage.removeItem(PENDING_KEY);
  const pending = saved === null ? undefined : (JSON.parse(saved) as { verifier: string; state: string; nonce: string; at: number });
  if (!settings) return { kind: "failed", error: "This broker offers no sign-in with an identity provider." };
  if (!pending || pending.state !== state || Date.now() - pending.at > PENDING_LIFETIME_MS) {
    return { kind: "failed", error: "That sign-in answer was not for a sign-in started here (or started too long ago); sign in again." };
  }
  // RFC 9207: a provider that names itself in its answer must be this one (no mix-up).
  const iss = params.get("iss");
  if (iss !== null && iss !== settings.issuer) return { kind: "failed", error: `That sign-in answer came from another issuer (${iss}); sign in again.` };
  if (error !== null) {
    const why = params.get("error_description");
    return { kind: "failed", error: `The identity provider did not sign you in: ${error}${why ? ` (${why})` : ""}.` };
  }
  try {
    const provider = await discover(settings);
    const reply = await tokenRequest(provider, {
      grant_type: "authorization_code",
      code: code ?? "",
      redirect_uri: redirectUri(),
      client_id: settings.clientId,
      code_verifier: pending.verifier,
    });
    const idToken = reply.id_token ?? "";
    checkIdToken(settings, idToken, pending.nonce);
    return { kind: "signed-in", session: new OpenIdSession(settings, provider, idToken, reply.refresh_token) };
  } catch (e) {
    return { kind: "failed", error: `Sign-in failed: ${e instanceof Error ? e.message : String(e)}.` };
  }
}

/** A signed-in person: the ID token (the bearer), kept fresh while a refresh token allows. */
export class OpenIdSession {
  /** Who the provider says signed in (the identity claim), for the page. */
  readonly person: string;
  private timer: ReturnType<typeof setTimeout> | undefined;
  /** When the current ID token expires, on this browser's clock. */
  private expiresAt = 0;
  private ended: ((why: string) => void) | undefined;
  private changed: ((token: string) => void) | undefined;

  constructor(
    private readonly settings: OpenIdSettings,
    private readonly provider: Discovery,
    private idToken: string,
    private refreshToken: string | undefined,
  ) {
    const claims = checkIdToken(settings, idToken, undefined);
    this.person = String(claims[settings.identityClaim] ?? claims.sub ?? "");
    this.track(claims);
  }

  get token(): string {
    return this.idToken;
  }

  /** Calls `changed` with each refreshed token and `ended` once the session is over. */
  watch(changed: (token: string) => void, ended: (why: string) => void): void {
    this.changed = changed;
    this.ended = ended;
    this.schedule();
  }

  /** Measured from the token's own `iat`, so a browser clock that is off does not matter. */
  private track(claims: Record<string, unknown>): void {
    const exp = Number(claims.exp);
    const iat = typeof claims.iat === "number" ? claims.iat : Math.floor(Date.now() / 1000);
    this.expiresAt = Date.now() + Math.max(0, exp - iat) * 1000;
  }

  private schedule(): void {
    clearTimeout(this.timer);
    const left = this.expiresAt - Date.now();
    if (this.refreshToken === undefined) {
      this.timer = setTimeout(() => this.end("Your sign-in has expired: sign in again."), Math.max(0, left));
      return;
    }
    // Refresh when a quarter of the lifetime is left (at most a minute before the end).
    const lead = Math.min(60_000, Math.max(1_000, left / 4));
    this.timer = setTimeout(() => void this.refresh(), Math.max(0, left - lead));
  }

  private async refresh(): Promise<void> {
    try {
      const reply = await tokenRequest(this.provider, {
        grant_type: "refresh_token",
        refresh_token: this.refreshToken ?? "",
        client_id: this.settings.clientId,
      });
      const idToken = reply.id_token ?? "";
      const claims = checkIdToken(this.settings, idToken, undefined);
      if (claims.sub !== claimsOf(this.idToken).sub) throw new Error("the refreshed ID token names another person");
      this.idToken = idToken;
      this.refreshToken = reply.refresh_token ?? this.refreshToken;
      this.track(claims);
      this.changed?.(idToken);
      this.schedule();
    } catch (error) {
      console.warn("refreshing the sign-in failed:", error);
      // Keep the token until it expires; try again meanwhile, then end.
      const left = this.expiresAt - Date.now();
      if (left <= 0) {
        this.end("Your sign-in has expired and could not be renewed: sign in again.");
        return;
      }
      clearTimeout(this.timer);
      this.timer = setTimeout(() => void this.refresh(), Math.min(5_000, left));
    }
  }

  private end(why: string): void {
    clearTimeout(this.timer);
    this.idToken = "";
    this.refreshToken = undefined;
    const ended = this.ended;
    this.ended = undefined;
    ended?.(why);
  }

  /** Forgets the tokens here, and stops renewing them (the broker refused them). */
  forget(): void {
    clearTimeout(this.timer);
    this.idToken = "";
    this.refreshToken = undefined;
    this.ended = undefined;
  }

  /** Forgets the tokens and ends the provider's session too, when it says how (RP-initiated
   * logout); the provider sends the person back here, signed out. */
  signOut(): void {
    const hint = this.idToken;
    this.forget();
    if (!this.provider.end_session_endpoint) {
      location.assign(`/?state=${SIGNED_OUT_STATE}`);
      return;
    }
    const url = new URL(this.provider.end_session_endpoint);
    url.searchParams.set("client_id", this.settings.clientId);
    url.searchParams.set("post_logout_redirect_uri", redirectUri());
    url.searchParams.set("state", SIGNED_OUT_STATE);
    if (hint) url.searchParams.set("id_token_hint", hint);
    location.assign(url.toString());
  }
}

/** Puts "Sign in with your organisation" at the top of the sign-in form (once), beside the
 * token box, which keeps working for static tokens. */
export function offerSignIn(form: HTMLElement, settings: OpenIdSettings | undefined, failed: (why: string) => void): void {
  if (!settings || document.getElementById("sign-in-openid")) return;
  const button = document.createElement("button");
  button.type = "button";
  button.id = "sign-in-openid";
  button.textContent = "Sign in with your organisation";
  button.onclick = () => {
    button.disabled = true;
    beginSignIn(settings).catch((error) => {
      button.disabled = false;
      failed(`Sign-in could not start: ${error instanceof Error ? error.message : String(error)}.`);
    });
  };
  const or = document.createElement("p");
  or.textContent = "Or use a token:";
  form.querySelector("h2")?.after(button, or);
}
