// Why this exists: signing in to the inbox with a real OpenID provider, end to end. `oidc-provider`
// (npm) runs on loopback with a public client for the inbox (Authorization Code + PKCE, refresh
// tokens when the test turns them on, RP-initiated logout) and a client-credentials client for the
// agent; the real broker serves the real inbox (web/dist, embedded in the binary) with that
// provider as its issuer; headless Chromium (playwright-core, /usr/bin/chromium) fills the
// provider's own login and consent pages. It proves: the person's decision is recorded under
// the identity their provider claims; groups come from claims (a person outside a call's group
// does not see it); the page keeps its tokens in memory only; sign-out forgets them and ends the
// provider's session; the session ends with the ID token unless refreshed; tampered and foreign
// tokens are refused; and with the provider down a signed-in page keeps working.
//
// The broker binary comes from APPROVAL_BROKER_BIN, else target/debug/approval-broker; Chromium
// from CHROMIUM, else /usr/bin/chromium.

import assert from "node:assert/strict";
import crypto from "node:crypto";
import { after, before, test } from "node:test";

import Provider from "oidc-provider";
import { chromium } from "playwright-core";

import { AUDIENCE, b64, freePort, grpc, parts, refusal, startBroker } from "./support.mjs";

const INBOX_CLIENT = "approvals-inbox";
/** A static admin token beside the provider's (static tokens keep working). */
const ADMIN_TOKEN = "static-admin-token-for-signin-tests";
const sha256 = (text) => crypto.createHash("sha256").update(text).digest("hex");

/** The people the provider knows: their claims. Any password signs them in (the provider's
 * development login page). */
const PEOPLE = {
  "alice@example.com": { roles: ["approver"], groups: ["ops"] },
  "dave@example.com": { roles: ["approver"], groups: ["sec"] },
  "erin@example.com": { roles: ["approver"], groups: ["ops"] },
  "frank@example.com": { roles: ["approver"], groups: ["ops"] },
};

/** What the tests change while the provider runs. */
const knobs = { idTokenTtl: 600, refresh: false };

/** An oidc-provider on loopback for the inbox at `inboxOrigin`; `ec` (another provider's key)
 * makes a second issuer signing with the same key, as the tenants of one provider do. */
async function startProvider(inboxOrigin, { clientId = INBOX_CLIENT, ec: sharedKey } = {}) {
  const port = await freePort();
  const issuer = `http://127.0.0.1:${port}`;
  const ec = sharedKey ?? crypto.generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey.export({ format: "jwk" });
  const provider = new Provider(issuer, {
    jwks: { keys: [{ ...ec, kid: "ec-1", use: "sig", alg: "ES256" }] },
    clients: [
      {
        client_id: clientId,
        token_endpoint_auth_method: "none",
        application_type: "web",
        grant_types: ["authorization_code", "refresh_token"],
        response_types: ["code"],
        redirect_uris: [`${inboxOrigin}/`],
        post_logout_redirect_uris: [`${inboxOrigin}/`],
        id_token_signed_response_alg: "ES256",
      },
      {
        client_id: "ci-bot",
        client_secret: "ci-bot-secret",
        grant_types: ["client_credentials"],
        redirect_uris: [],
        response_types: [],
        id_token_signed_response_alg: "ES256",
      },
    ],
    // The person's claims in the ID token itself (the inbox sends the ID token as its bearer).
    conformIdTokenClaims: false,
    scopes: ["openid", "offline_access", "email", "approvals"],
    claims: { openid: ["sub"], email: ["email", "email_verified"], approvals: ["roles", "groups"] },
    async findAccount(_ctx, id) {
      const person = PEOPLE[id];
      if (!person) return undefined;
      return { accountId: id, claims: async () => ({ sub: id, email: id, email_verified: true, ...person }) };
    },
    ttl: { IdToken: () => knobs.idTokenTtl, AccessToken: 600, RefreshToken: 3600, Session: 3600, Grant: 3600, Interaction: 600 },
    issueRefreshToken: async (_ctx, client) => knobs.refresh && client.grantTypeAllowed("refresh_token"),
    features: {
      devInteractions: { enabled: true },
      rpInitiatedLogout: { enabled: true },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined,
        getResourceServerInfo: () => ({
          scope: "approval-agent",
          audience: AUDIENCE,
          accessTokenFormat: "jwt",
          accessTokenTTL: 600,
          jwt: { sign: { alg: "ES256" } },
        }),
        useGrantedResource: () => true,
      },
    },
  });
  provider.on("server_error", (_ctx, error) => console.error("oidc-provider:", error));
  const server = await new Promise((ok) => {
    const s = provider.listen(port, "127.0.0.1", () => ok(s));
  });
  /** The agent's token through the client-credentials grant. */
  async function agent() {
    const response = await fetch(`${issuer}/token`, {
      method: "POST",
      headers: {
        authorization: `Basic ${Buffer.from("ci-bot:ci-bot-secret").toString("base64")}`,
        "content-type": "application/x-www-form-urlencoded",
      },
      body: new URLSearchParams({ grant_type: "client_credentials", scope: "approval-agent", resource: "urn:approval-broker" }),
    });
    const body = await response.json();
    assert.equal(response.status, 200, JSON.stringify(body));
    return body.access_token;
  }
  return {
    issuer,
    agent,
    ec,
    close: () => {
      server.close();
      server.closeAllConnections();
    },
  };
}

let idp;
let broker;
let browser;
let agentToken;
const contexts = [];

before(async () => {
  const brokerPort = await freePort();
  const origin = `http://127.0.0.1:${brokerPort}`;
  idp = await startProvider(origin);
  broker = await startBroker(idp.issuer, {
    port: brokerPort,
    args: [
      "--inbox-oidc-client-id", INBOX_CLIENT,
      "--inbox-oidc-scopes", "openid email approvals",
    ],
    approvers: '{"groups": ["ops"], "quorum": 1}',
    env: { APPROVALS_TOKENS: `admin root sha256:${sha256(ADMIN_TOKEN)}` },
  });
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  agentToken = await idp.agent();
});

after(async () => {
  await browser?.close();
  await broker?.close();
  idp?.close();
});

/** A fresh browser profile on the inbox; `bearers` collects every token the page sends. */
async function inbox() {
  const context = await browser.newContext();
  contexts.push(context);
  const page = await context.newPage();
  const bearers = [];
  page.on("request", (request) => {
    const value = request.headers().authorization;
    if (value?.startsWith("Bearer ") && request.url().startsWith(broker.url)) {
      const token = value.slice("Bearer ".length);
      if (bearers.at(-1) !== token) bearers.push(token);
    }
  });
  await page.goto(`${broker.url}/`);
  return { page, bearers };
}

/** Signs `who` in through the provider's own login (and, the first time, consent) pages. */
async function signIn(page, who) {
  await page.getByRole("button", { name: "Sign in with your organisation" }).click();
  await page.waitForURL((url) => url.origin === idp.issuer);
  await page.locator('input[name="login"]').fill(who);
  await page.locator('input[name="password"]').fill("any password");
  await page.getByRole("button", { name: "Sign-in" }).click();
  // Consent, asked once per browser session.
  const consent = page.getByRole("button", { name: "Continue" });
  const signedIn = page.getByRole("button", { name: `Sign out ${who}` });
  await consent.or(signedIn).waitFor();
  if (await consent.isVisible()) await consent.click();
  await signedIn.waitFor();
  await page.locator("#connection", { hasText: "live" }).waitFor();
}

let calls = 0;
async function submit(tool = "deploy") {
  calls += 1;
  const session = `signin-${calls}`;
  const reply = await broker.call("agent", "Submit", agentToken, {
    batch: { session_id: session, calls: [{ call_id: "c1", tool, input_json: '{"env": "prod"}', requested_by: "carol@example.com" }] },
  });
  assert.equal(reply.acks[0].accepted?.status, "CALL_STATUS_PENDING", JSON.stringify(reply));
  return session;
}

async function decidedBy(session) {
  for (let i = 0; i < 100; i++) {
    const { calls: listed } = await broker.call("admin", "ListCalls", ADMIN_TOKEN, {});
    const call = listed.find((c) => c.session_id === session);
    if (call?.outcome) return call.outcome.decided_by;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail(`${session} was never decided`);
}

const card = (page, session) => page.locator(`article[data-session="${session}"][data-call="c1"]`);

test("a person signs in at the provider (PKCE, nonce) and approves as the identity the provider claims; tokens stay in memory", async () => {
  const { page, bearers } = await inbox();
  await signIn(page, "alice@example.com");
  const session = await submit();
  await card(page, session).getByRole("button", { name: "Approve deploy call c1" }).click();
  assert.equal(await decidedBy(session), "approver:alice@example.com");

  // The bearer is the provider's ID token for the inbox, carrying this sign-in's nonce.
  const token = bearers.at(-1);
  const [header, claims] = parts(token);
  assert.equal(header.alg, "ES256");
  assert.equal(claims.iss, idp.issuer);
  assert.equal(claims.aud, INBOX_CLIENT);
  assert.equal(claims.email, "alice@example.com");
  assert.ok(claims.nonce, "the ID token carries the sign-in's nonce");
  // Nothing the page keeps in storage holds it, nor the PKCE state once used.
  const stored = await page.evaluate(() => JSON.stringify({ ...localStorage, ...sessionStorage }));
  assert.ok(!stored.includes(token), "the token is in memory only");
  assert.doesNotMatch(stored, /openid|verifier/);
  assert.equal(new URL(page.url()).search, "", "the code is gone from the address bar");
  // A reload forgets it: the page asks to sign in again.
  await page.reload();
  await page.getByRole("button", { name: "Sign in with your organisation" }).waitFor();
});

test("groups come from the provider's claims: a person outside the call's group does not see it, nor may decide it", async () => {
  const alice = await inbox();
  await signIn(alice.page, "alice@example.com");
  const session = await submit();
  await card(alice.page, session).waitFor();
  // Dave signs in after the call arrived: his page's snapshot does not hold it.
  const dave = await inbox();
  await signIn(dave.page, "dave@example.com");
  assert.equal(await card(dave.page, session).count(), 0, "dave (sec) does not see a call of ops");
  const refused = await refusal(
    broker.call("approver", "Decide", dave.bearers.at(-1), { session_id: session, call_id: "c1", agent: "ci-bot", decision: "DECISION_APPROVE" }),
  );
  assert.equal(refused.code, grpc.status.NOT_FOUND, refused.details);
  await card(alice.page, session).getByRole("button", { name: "Deny deploy call c1" }).click();
  await card(alice.page, session).getByRole("button", { name: "Deny", exact: true }).click();
  assert.equal(await decidedBy(session), "approver:alice@example.com");
});

test("sign-out forgets the token and ends the provider's session: the next sign-in asks for the login again", async () => {
  const { page } = await inbox();
  await signIn(page, "frank@example.com");
  await page.getByRole("button", { name: "Sign out frank@example.com" }).click();
  // The provider's RP-initiated logout asks, then sends the person back.
  await page.waitForURL((url) => url.origin === idp.issuer);
  await page.getByRole("button", { name: "Yes, sign me out" }).click();
  await page.waitForURL((url) => url.origin === broker.url);
  await page.getByRole("alert").filter({ hasText: "You are signed out." }).waitFor();
  assert.equal(await page.getByRole("button", { name: /Sign out/ }).isVisible(), false);
  await page.getByRole("button", { name: "Sign in with your organisation" }).click();
  await page.waitForURL((url) => url.origin === idp.issuer);
  await page.locator('input[name="login"]').waitFor();
});

test("the session ends with the ID token unless refreshed; a refresh token keeps it going", async () => {
  knobs.idTokenTtl = 4;
  try {
    // Without a refresh token: the page says the session ended, and the broker refuses the token.
    const short = await inbox();
    await signIn(short.page, "erin@example.com");
    const expiring = short.bearers.at(-1);
    await short.page.getByRole("alert").filter({ hasText: "Your sign-in has expired" }).waitFor({ timeout: 10_000 });
    await short.page.getByRole("button", { name: "Sign in with your organisation" }).waitFor();
    await new Promise((r) => setTimeout(r, 1_500)); // past the broker's 1 s clock skew
    const expired = await refusal(broker.call("approver", "ListPending", expiring, {}));
    assert.equal(expired.code, grpc.status.UNAUTHENTICATED, expired.details);
    assert.match(expired.details, /expired/);

    // With one: the page renews its ID token before it expires and stays signed in.
    knobs.refresh = true;
    const kept = await inbox();
    await signIn(kept.page, "erin@example.com");
    const first = kept.bearers.at(-1);
    await new Promise((r) => setTimeout(r, 6_000));
    const session = await submit();
    await card(kept.page, session).getByRole("button", { name: "Approve deploy call c1" }).click();
    assert.equal(await decidedBy(session), "approver:erin@example.com");
    const renewed = kept.bearers.at(-1);
    assert.notEqual(renewed, first, "the decision carried a refreshed ID token");
    assert.ok(parts(renewed)[1].exp > parts(first)[1].exp);
    assert.equal(parts(renewed)[1].sub, "erin@example.com");
  } finally {
    knobs.idTokenTtl = 600;
    knobs.refresh = false;
  }
});

test("a tampered or foreign token is refused, in the page and over gRPC", async () => {
  const { page, bearers } = await inbox();
  await signIn(page, "alice@example.com");
  const [header, claims, signature] = parts(bearers.at(-1));
  const tampered = `${b64(header)}.${b64({ ...claims, email: "mallory@example.com", groups: ["ops", "sec"] })}.${signature}`;
  const refused = await refusal(broker.call("approver", "ListPending", tampered, {}));
  assert.equal(refused.code, grpc.status.UNAUTHENTICATED);
  assert.match(refused.details, /signature does not verify/);

  // Another provider's ID token for a client of the same name: another issuer.
  const otherPort = await freePort();
  const other = await startProvider(`http://127.0.0.1:${otherPort}`, { ec: idp.ec });
  const foreign = await browser.newContext();
  contexts.push(foreign);
  try {
    // Sign in to the other provider directly, as the inbox would, and take its ID token.
    const verifier = crypto.randomBytes(32).toString("base64url");
    const challenge = crypto.createHash("sha256").update(verifier).digest("base64url");
    const redirect = `http://127.0.0.1:${otherPort}/`;
    const tab = await foreign.newPage();
    const code = new Promise((ok) =>
      tab.route(`${redirect}**`, (route) => {
        ok(new URL(route.request().url()).searchParams.get("code"));
        return route.fulfill({ body: "ok" });
      }),
    );
    const authorize = new URL(`${other.issuer}/auth`);
    for (const [k, v] of Object.entries({ response_type: "code", client_id: INBOX_CLIENT, redirect_uri: redirect, scope: "openid email approvals", nonce: "n", state: "s", code_challenge: challenge, code_challenge_method: "S256" })) {
      authorize.searchParams.set(k, v);
    }
    await tab.goto(authorize.toString());
    await tab.locator('input[name="login"]').fill("alice@example.com");
    await tab.locator('input[name="password"]').fill("x");
    await tab.getByRole("button", { name: "Sign-in" }).click();
    await tab.getByRole("button", { name: "Continue" }).click();
    const response = await fetch(`${other.issuer}/token`, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ grant_type: "authorization_code", code: await code, redirect_uri: redirect, client_id: INBOX_CLIENT, code_verifier: verifier }),
    });
    const { id_token: foreignToken } = await response.json();
    assert.equal(parts(foreignToken)[1].email, "alice@example.com");
    const elsewhere = await refusal(broker.call("approver", "ListPending", foreignToken, {}));
    assert.equal(elsewhere.code, grpc.status.UNAUTHENTICATED);
    assert.match(elsewhere.details, /another issuer/);
  } finally {
    other.close();
  }

  // A code the page did not ask for (login CSRF, a replayed answer) is never exchanged.
  const forged = await inbox();
  await forged.page.goto(`${broker.url}/?code=stolen-code&state=guessed-state`);
  await forged.page.getByRole("alert").filter({ hasText: "That sign-in answer was not for a sign-in started here" }).waitFor();
  assert.equal(new URL(forged.page.url()).search, "", "the answer is gone from the address bar");
  assert.equal(await forged.page.getByRole("button", { name: /Sign out/ }).isVisible(), false);

  // The page's token box with the tampered token: refused, and nothing kept.
  const typed = await inbox();
  await typed.page.getByLabel("Token", { exact: true }).fill(tampered);
  await typed.page.getByRole("button", { name: "Open the inbox" }).click();
  await typed.page.getByRole("alert").filter({ hasText: "refused this token (UNAUTHENTICATED)" }).waitFor();
  // A static token keeps working beside sign-in.
  await typed.page.getByLabel("Token", { exact: true }).fill(ADMIN_TOKEN);
  await typed.page.getByRole("button", { name: "Open the inbox" }).click();
  await typed.page.locator("#connection", { hasText: "live" }).waitFor();
});

test("with the provider down, a signed-in page keeps deciding until its token expires; sign-in then fails, saying why", async () => {
  const { page } = await inbox();
  await signIn(page, "alice@example.com");
  const provider = idp;
  idp = undefined;
  provider.close();
  const session = await submit();
  await card(page, session).getByRole("button", { name: "Approve deploy call c1" }).click();
  assert.equal(await decidedBy(session), "approver:alice@example.com");
  const fresh = await inbox();
  await fresh.page.getByRole("button", { name: "Sign in with your organisation" }).click();
  await fresh.page.getByRole("alert").filter({ hasText: "Sign-in could not start: the identity provider could not be reached" }).waitFor();
});
