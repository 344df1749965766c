// Why this exists: the broker's JWT checks against a real OpenID provider. `oidc-provider` (npm)
// runs on loopback with an ES256 and an RS256 key; an agent gets its token through the real
// client-credentials grant at the provider's token endpoint, people get theirs from the
// provider's own AccessToken model (the tokens an Authorization Code sign-in would issue, minted
// without a browser), and the broker, started with the provider as its issuer, finds the keys
// by discovery. Every token is used over gRPC (@grpc/grpc-js). Forged tokens (`alg: none`, HS256
// keyed with the public key, another key under the same key id, a changed payload, another
// audience, another issuer, expired) are refused UNAUTHENTICATED, saying which.
//
// The broker binary comes from APPROVAL_BROKER_BIN, else target/debug/approval-broker.

import assert from "node:assert/strict";
import crypto from "node:crypto";
import { after, before, test } from "node:test";

import Provider, { errors } from "oidc-provider";

import { AUDIENCE, b64, freePort, grpc, parts, refusal, startBroker } from "./support.mjs";

/** An oidc-provider on loopback: `ci-bot` may use client credentials; people are minted.
 * `keys` (another provider's) makes a second issuer that signs with the same keys, as the tenants
 * of one multi-tenant provider do. */
async function startProvider(keys) {
  const port = await freePort();
  const issuer = `http://127.0.0.1:${port}`;
  const ec = keys?.ec ?? crypto.generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey.export({ format: "jwk" });
  const rsa = keys?.rsa ?? crypto.generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey.export({ format: "jwk" });
  const resources = {
    "urn:approval-broker": { audience: AUDIENCE, alg: "ES256" },
    "urn:approval-broker:rs256": { audience: AUDIENCE, alg: "RS256" },
    "urn:another-api": { audience: "another-api", alg: "ES256" },
  };
  const info = (resource) => {
    const r = resources[resource];
    if (!r) throw new errors.InvalidTarget();
    return {
      scope: "approval-agent",
      audience: r.audience,
      accessTokenFormat: "jwt",
      accessTokenTTL: 600,
      jwt: { sign: { alg: r.alg } },
    };
  };
  // The people the provider knows, by account id: the claims it adds to their access tokens.
  const accounts = new Map();
  const provider = new Provider(issuer, {
    extraTokenClaims: (_ctx, token) => accounts.get(token.accountId) ?? {},
    jwks: {
      keys: [
        { ...ec, kid: "ec-1", use: "sig", alg: "ES256" },
        { ...rsa, kid: "rsa-1", use: "sig", alg: "RS256" },
      ],
    },
    clients: [
      {
        client_id: "ci-bot",
        client_secret: "ci-bot-secret",
        grant_types: ["client_credentials"],
        redirect_uris: [],
        response_types: [],
      },
      {
        client_id: "approvals-inbox",
        client_secret: "inbox-secret",
        grant_types: ["authorization_code"],
        redirect_uris: ["http://127.0.0.1/callback"],
        response_types: ["code"],
      },
    ],
    features: {
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => "urn:approval-broker",
        getResourceServerInfo: (_ctx, resource) => info(resource),
        useGrantedResource: () => true,
      },
    },
  });
  const server = await new Promise((ok) => {
    const s = provider.listen(port, "127.0.0.1", () => ok(s));
  });
  /** A person's access token, as the provider issues it after a sign-in. */
  async function person(email, { roles = ["approver"], groups = [], resource = "urn:approval-broker", expiresIn } = {}) {
    accounts.set(email, { email, email_verified: true, roles, groups });
    const client = await provider.Client.find("approvals-inbox");
    const token = new provider.AccessToken({
      accountId: email,
      client,
      scope: "openid",
      gty: "authorization_code",
      resourceServer: new provider.ResourceServer(resource, info(resource)),
      ...(expiresIn === undefined ? {} : { expiresIn }),
    });
    return token.save();
  }
  /** The agent's token through the real client-credentials grant. */
  async function agent() {
    const response = await fetch(`${issuer}/token`, {
      method: "POST",
      headers: {
        authorization: `Basic ${Buffer.from("ci-bot:ci-bot-secret").toString("base64")}`,
        "content-type": "application/x-www-form-urlencoded",
      },
      body: new URLSearchParams({
        grant_type: "client_credentials",
        scope: "approval-agent",
        resource: "urn:approval-broker:rs256",
      }),
    });
    const body = await response.json();
    assert.equal(response.status, 200, JSON.stringify(body));
    return body.access_token;
  }
  return { issuer, person, agent, keys: { ec, rsa }, publicJwk: { kty: "EC", crv: ec.crv, x: ec.x, y: ec.y }, close: () => {
    server.close();
    server.closeAllConnections();
  } };
}

let idp;
let broker;

before(async () => {
  idp = await startProvider();
  broker = await startBroker(idp.issuer);
});

after(async () => {
  await broker?.close();
  idp?.close();
});

test("an agent by client credentials and people by the provider's tokens submit, decide and read", async () => {
  const agentToken = await idp.agent();
  const [header, claims] = parts(agentToken);
  assert.equal(header.alg, "RS256");
  assert.equal(claims.client_id, "ci-bot");
  const submitted = await broker.call("agent", "Submit", agentToken, {
    batch: {
      session_id: "s1",
      calls: [{ call_id: "c1", tool: "deploy", input_json: '{"env": "prod"}', requested_by: "Carol@Example.COM" }],
    },
  });
  assert.equal(submitted.acks[0].accepted?.status, "CALL_STATUS_PENDING", JSON.stringify(submitted));

  const admin = await idp.person("root@example.com", { roles: ["broker-admin"] });
  const listed = await broker.call("admin", "ListCalls", admin, {});
  assert.equal(listed.calls.length, 1);
  assert.equal(listed.calls[0].agent, "ci-bot", "the agent is its token's client_id");

  const decide = (token) =>
    broker.call("approver", "Decide", token, { session_id: "s1", call_id: "c1", agent: "ci-bot", decision: "DECISION_APPROVE" });
  // Carol requested it: her own token may not approve it, whatever case either spells.
  const carol = await refusal(decide(await idp.person("carol@example.com", { groups: ["ops"] })));
  assert.equal(carol.code, grpc.status.PERMISSION_DENIED, carol.details);
  assert.match(carol.details, /self-approval/);
  // Dave is in no group: the call is hidden from him.
  const dave = await refusal(decide(await idp.person("dave@example.com", { groups: ["sec"] })));
  assert.equal(dave.code, grpc.status.NOT_FOUND, dave.details);
  // Two people of ops make the quorum; the same person's second token counts once.
  const first = await decide(await idp.person("Alice@Example.com", { groups: ["ops"] }));
  assert.equal(first.outcome, null);
  const again = await decide(await idp.person("alice@example.com", { groups: ["ops"] }));
  assert.equal(again.outcome, null);
  const second = await decide(await idp.person("bob@example.com", { groups: ["ops", "sec"] }));
  assert.equal(second.outcome.status, "CALL_STATUS_APPROVED");
  assert.equal(second.outcome.decided_by, "approver:alice@example.com,bob@example.com");
  assert.match(broker.log(), /identity provider keys fetched/);
});

test("forged and misdirected tokens are refused UNAUTHENTICATED, saying which", async () => {
  const real = await idp.person("root@example.com", { roles: ["broker-admin"] });
  const [header, claims, signature] = parts(real);
  const hmac = (text) =>
    crypto.createHmac("sha256", JSON.stringify(idp.publicJwk)).update(text).digest("base64url");
  const hsSigned = `${b64({ ...header, alg: "HS256" })}.${b64(claims)}`;
  const forger = crypto.generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey;
  const forgedSigned = `${b64(header)}.${b64(claims)}`;
  const forgedSignature = crypto.sign("sha256", Buffer.from(forgedSigned), { key: forger, dsaEncoding: "ieee-p1363" }).toString("base64url");
  // Another issuer signing with the very same keys: only `iss` tells its tokens apart.
  const otherIdp = await startProvider(idp.keys);
  const cases = [
    [`${b64({ ...header, alg: "none" })}.${b64(claims)}.`, /`alg: none`/],
    [`${hsSigned}.${hmac(hsSigned)}`, /symmetric/],
    [`${forgedSigned}.${forgedSignature}`, /signature does not verify/],
    [`${b64(header)}.${b64({ ...claims, roles: ["broker-admin"], email: "mallory@example.com" })}.${signature}`, /signature does not verify/],
    [await idp.person("root@example.com", { roles: ["broker-admin"], resource: "urn:another-api" }), /audience/],
    [await otherIdp.person("root@example.com", { roles: ["broker-admin"] }), /another issuer/],
  ];
  otherIdp.close();
  for (const [token, why] of cases) {
    const refused = await refusal(broker.call("admin", "ListCalls", token, {}));
    assert.equal(refused.code, grpc.status.UNAUTHENTICATED, `${why}: ${refused.details}`);
    assert.match(refused.details, why);
    assert.ok(!refused.details.includes(token.split(".")[1]), "the token is never repeated");
  }
  // A token of the provider that expires: taken while valid, refused once it has expired.
  const shortLived = await idp.person("root@example.com", { roles: ["broker-admin"], expiresIn: 1 });
  await broker.call("admin", "ListCalls", shortLived, {});
  const expiry = parts(shortLived)[1].exp * 1000;
  await new Promise((r) => setTimeout(r, Math.max(0, expiry - Date.now()) + 2_100));
  const expired = await refusal(broker.call("admin", "ListCalls", shortLived, {}));
  assert.equal(expired.code, grpc.status.UNAUTHENTICATED, expired.details);
  assert.match(expired.details, /expired/);
  // The real one still works.
  await broker.call("admin", "ListCalls", real, {});
});

test("with the provider down, its tokens keep working and a token of an unknown key is refused saying so", async () => {
  const alice = await idp.person("alice@example.com", { roles: ["broker-admin"] });
  await broker.call("admin", "ListCalls", alice, {});
  const provider = idp;
  idp = undefined;
  provider.close();
  // A token the broker has never seen, signed by a cached key, is verified without the provider.
  const bob = await provider.person("bob@example.com", { roles: ["broker-admin"] });
  await broker.call("admin", "ListCalls", bob, {});
  // A key the broker has never seen: it tries the provider (past the refetch interval), fails,
  // and refuses, saying the keys could not be fetched.
  await new Promise((r) => setTimeout(r, 1_100));
  const [header, claims] = parts(alice);
  const key = crypto.generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey;
  const signed = `${b64({ ...header, kid: "ec-rotated" })}.${b64(claims)}`;
  const sig = crypto.sign("sha256", Buffer.from(signed), { key, dsaEncoding: "ieee-p1363" }).toString("base64url");
  const refused = await refusal(broker.call("admin", "ListCalls", `${signed}.${sig}`, {}));
  assert.equal(refused.code, grpc.status.UNAUTHENTICATED, refused.details);
  assert.match(refused.details, /could not be fetched/);
  assert.match(broker.log(), /identity provider keys could not be fetched/);
});
