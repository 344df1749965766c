/**
 * `ClientCredentials` against a token endpoint on loopback that the test plays: a token fetched
 * once and kept, renewed at 80% of its lifetime, kept while the provider is down until it
 * expires and then refused with `TokenUnavailable`; the secret sent as RFC 6749 says, read only
 * from a file its owner alone may read. And a provider against a real broker: a refused token is
 * renewed and the request made once more, on the stream and in a unary call. (The same against a
 * real OpenID provider: tests/identity/agents.test.mjs.)
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { chmodSync, mkdtempSync, writeFileSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { AuthenticationError, TokenUnavailable, type ToolCall } from "../src/index.js";
import { ClientCredentials, connectBroker } from "../src/node.js";
import { BrokerProcess, newSession } from "./broker.js";

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** A token endpoint on loopback: each grant gets `token-N`, living `expiresIn` seconds. */
class TokenEndpoint {
  expiresIn = 60;
  refuse = false;
  readonly requests: { form: URLSearchParams; authorization: string | undefined }[] = [];
  private readonly server = http.createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (c: Buffer) => chunks.push(c));
    request.on("end", () => {
      response.setHeader("content-type", "application/json");
      if (request.method === "GET") {
        response.end(JSON.stringify({ issuer: this.issuer, token_endpoint: `${this.issuer}/token` }));
        return;
      }
      this.requests.push({ form: new URLSearchParams(Buffer.concat(chunks).toString()), authorization: request.headers.authorization });
      if (this.refuse) {
        response.statusCode = 401;
        response.end(JSON.stringify({ error: "invalid_client", error_description: "unknown client" }));
        return;
      }
      response.end(JSON.stringify({ access_token: `token-${this.requests.length}`, token_type: "Bearer", expires_in: this.expiresIn }));
    });
  });
  issuer = "";

  async start(): Promise<this> {
    await new Promise<void>((ok) => this.server.listen(0, "127.0.0.1", ok));
    const address = this.server.address();
    this.issuer = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
    return this;
  }

  get url(): string {
    return `${this.issuer}/token`;
  }

  stop(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((ok) => this.server.close(() => ok()));
  }
}

function secretFile(mode = 0o600): string {
  const path = join(mkdtempSync(join(tmpdir(), "approval-broker-secret-")), "secret");
  writeFileSync(path, "s3cret:&=\n");
  chmodSync(path, mode);
  return path;
}

describe("ClientCredentials", () => {
  test("a token is fetched once and kept while fresh; the secret travels in HTTP Basic, form-encoded", async () => {
    const endpoint = await new TokenEndpoint().start();
    try {
      const source = new ClientCredentials({ tokenUrl: endpoint.url, clientId: "ci bot", clientSecretFile: secretFile(), scope: "approval-agent", resource: "urn:broker" });
      assert.deepEqual(await Promise.all([source.token(), source.token(), source.token()]), ["token-1", "token-1", "token-1"]);
      assert.equal(source.requests, 1);
      const [sent] = endpoint.requests;
      assert.deepEqual(Object.fromEntries(sent?.form ?? []), { grant_type: "client_credentials", scope: "approval-agent", resource: "urn:broker" });
      assert.equal(sent?.authorization, `Basic ${Buffer.from("ci+bot:s3cret%3A%26%3D").toString("base64")}`);
    } finally {
      await endpoint.stop();
    }
  });

  test("the token is renewed at four fifths of its lifetime", async () => {
    const endpoint = await new TokenEndpoint().start();
    endpoint.expiresIn = 1;
    try {
      const source = new ClientCredentials({ tokenUrl: endpoint.url, clientId: "bot", clientSecretFile: secretFile() });
      assert.equal(await source.token(), "token-1");
      await sleep(500);
      assert.equal(await source.token(), "token-1");
      await sleep(400);
      assert.equal(await source.token(), "token-2");
    } finally {
      await endpoint.stop();
    }
  });

  test("the provider down, the held token works until it expires; then TokenUnavailable, saying why", async () => {
    const endpoint = await new TokenEndpoint().start();
    endpoint.expiresIn = 3;
    const source = new ClientCredentials({ tokenUrl: endpoint.url, clientId: "bot", clientSecretFile: secretFile() });
    assert.equal(await source.token(), "token-1");
    const fetched = Date.now();
    await endpoint.stop();
    await sleep(fetched + 2600 - Date.now()); // due for renewal, the provider gone: the held token, still valid
    assert.equal(await source.token(), "token-1");
    await sleep(fetched + 3200 - Date.now()); // expired
    const refused = await source.token().then(
      () => assert.fail("a token after expiry with the provider down"),
      (e: unknown) => e,
    );
    assert.ok(refused instanceof TokenUnavailable && refused instanceof AuthenticationError);
    assert.match(refused.message, /could not be reached.*has expired.*run nothing/);
  });

  test("refused credentials say what the provider said; the endpoint is discovered from the issuer", async () => {
    const endpoint = await new TokenEndpoint().start();
    try {
      endpoint.refuse = true;
      const posting = new ClientCredentials({ tokenUrl: endpoint.url, clientId: "bot", clientSecretFile: secretFile(), authMethod: "post" });
      await assert.rejects(posting.token(), /refused: invalid_client \(unknown client\)/);
      const [sent] = endpoint.requests;
      assert.deepEqual([sent?.form.get("client_id"), sent?.form.get("client_secret"), sent?.authorization], ["bot", "s3cret:&=", undefined]);
      endpoint.refuse = false;
      const discovered = new ClientCredentials({ issuer: endpoint.issuer, clientId: "bot", clientSecretFile: secretFile() });
      assert.equal(await discovered.token(), "token-2");
      discovered.invalidate("token-2");
      assert.equal(await discovered.token(), "token-3");
    } finally {
      await endpoint.stop();
    }
  });

  test("the secret comes from a file only its owner reads, and goes only over https (or to loopback)", () => {
    assert.throws(
      () => new ClientCredentials({ tokenUrl: "https://idp.example.com/token", clientId: "bot", clientSecretFile: secretFile(0o644) }),
      /may be read by others .*chmod 600/,
    );
    assert.throws(() => new ClientCredentials({ tokenUrl: "http://idp.example.com/token", clientId: "bot", clientSecretFile: secretFile() }), /https:\/\//);
    new ClientCredentials({ tokenUrl: "http://[::1]:8080/token", clientId: "bot", clientSecretFile: secretFile() });
  });
});

describe("a token provider against a real broker", () => {
  test("a refused token is renewed once, on the stream and in a unary call; a provider that fails sends nothing", async () => {
    const agentToken = `agent-token-${randomUUID()}`;
    const process_ = await BrokerProcess.started(["--tokens", `agent build-bot ${BrokerProcess.hashToken(agentToken)}`]);
    /** A provider whose first token the broker does not know. */
    const rotating = () => {
      const provider = { current: `stale-${randomUUID()}`, invalidated: [] as string[], token: () => provider.current, invalidate: (t: string) => {
        provider.invalidated.push(t);
        provider.current = agentToken;
      } };
      return provider;
    };
    try {
      const session = newSession();
      const call: ToolCall = { callId: "c1", tool: "read_file", input: { path: "a" } };
      const onStream = rotating();
      const streaming = connectBroker(process_.target, { token: onStream });
      const submitted = await streaming.submit(session, [call]);
      await streaming.close();
      assert.deepEqual(submitted.acks.map((a) => a.kind), ["accepted"]);
      const unary = rotating();
      const asking = connectBroker(process_.target, { token: unary });
      assert.deepEqual(await asking.outcomes(session, ["c1"]), [undefined]);
      await asking.close();
      assert.deepEqual([...onStream.invalidated, ...unary.invalidated].map((t) => t.startsWith("stale-")), [true, true]);

      const down = connectBroker(process_.target, {
        token: () => Promise.reject(new TokenUnavailable("no access token: the identity provider could not be reached; run nothing")),
        unavailableTimeoutMs: 30_000,
      });
      const started = Date.now();
      await assert.rejects(down.review(session, [{ ...call, callId: "c2" }]), (e: unknown) => e instanceof TokenUnavailable && /could not be reached/.test(e.message));
      await down.close();
      assert.ok(Date.now() - started < 5_000, "a provider's failure was retried into a wait");
    } finally {
      await process_.dispose();
    }
  });
});
