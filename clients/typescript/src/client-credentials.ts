/**
 * `ClientCredentials`: the token provider of an agent registered at the organisation's identity
 * provider as a service client (OAuth 2.0 client credentials, RFC 6749 section 4.4). It fetches a
 * token, keeps it, and fetches the next once `refreshAt` (80%) of its lifetime has passed; while
 * the provider cannot be reached, the token held keeps working until it expires, and then
 * `TokenUnavailable` says why (nothing is sent to the broker). Node only: a client secret has no
 * place in a browser.
 *
 * The token request goes only over `https://` (plain `http://` to a loopback host alone, as the
 * broker fetches its keys): a client secret sent in clear could be read by anyone on the path.
 * @module
 */
import { readFileSync, statSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import { isIP } from "node:net";
import { rootCertificates } from "node:tls";
import { TokenUnavailable } from "./errors.js";
import type { TokenSource } from "./tokens.js";

/** How `ClientCredentials` reaches the provider and authenticates to it. */
export interface ClientCredentialsOptions {
  /** The provider's token endpoint; or give `issuer`. */
  tokenUrl?: string;
  /** The issuer, whose `/.well-known/openid-configuration` names the token endpoint (read once). */
  issuer?: string;
  clientId: string;
  /** A file holding the client secret, which only its owner may read (mode 0600 or stricter). */
  clientSecretFile?: string;
  /** The secret itself (prefer the file: it stays out of the code and the environment). */
  clientSecret?: string;
  /** Space-separated scopes. */
  scope?: string;
  /** RFC 8707 `resource`. */
  resource?: string;
  /** `audience`, which some providers take instead of `resource`. */
  audience?: string;
  /** PEM of a private CA the provider's HTTPS certificate is checked with, besides Node's roots. */
  ca?: string | Buffer;
  /** `"basic"` (HTTP Basic, the default) or `"post"` (id and secret in the form). */
  authMethod?: "basic" | "post";
  /** The fraction of a token's lifetime after which the next is fetched. Default 0.8. */
  refreshAt?: number;
  /** How long one request to the provider may take. Default 10 000 ms. */
  timeoutMs?: number;
}

// A token that says nothing of its lifetime is used this long before the next is asked for.
const DEFAULT_LIFETIME_MS = 300_000;
// After a failed renewal, how long the held token is used before the provider is asked again.
const RETRY_AFTER_MS = 2_000;
// The largest answer read from the provider.
const MAX_ANSWER = 1024 * 1024;

/** The secret in `path` (surrounding white space removed), refused when others may read it. */
export function readSecretFile(path: string): string {
  let mode: number;
  let text: string;
  try {
    mode = statSync(path).mode;
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`cannot read the client secret file ${path}: ${(e as Error).message}`);
  }
  if (process.platform !== "win32" && (mode & 0o077) !== 0) {
    throw new Error(`the client secret file ${path} may be read by others (mode ${(mode & 0o777).toString(8)}); make it 0600 (chmod 600 ${path})`);
  }
  return text.trim();
}

function checkedUrl(url: string): URL {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`${url} is not a URL`);
  }
  const host = parsed.hostname.replace(/^\[|\]$/g, "");
  const loopback = host === "localhost" || (isIP(host) === 4 && host.startsWith("127.")) || host === "::1";
  if (parsed.protocol === "https:" || (parsed.protocol === "http:" && loopback)) return parsed;
  throw new Error(
    `${url}: the identity provider is reached over https:// (plain http:// only on a loopback host), since a client secret sent in clear could be read by anyone on the path`,
  );
}

/** RFC 6749 appendix B: form encoding, spaces as `+`. */
const formEncode = (text: string) => encodeURIComponent(text).replace(/%20/g, "+");

/** A token provider for `connectBroker(target, { token: new ClientCredentials({...}) })`. */
export class ClientCredentials implements TokenSource {
  /** How many token requests were made (tests and logs read it). */
  requests = 0;
  readonly clientId: string;
  private readonly secret: string;
  private tokenUrl: string | undefined;
  private readonly issuer: string | undefined;
  private readonly form: Record<string, string>;
  private readonly authMethod: "basic" | "post";
  private readonly refreshAt: number;
  private readonly timeoutMs: number;
  private readonly ca: string | Buffer | undefined;
  private held: { token: string; refreshAfter: number; expires: number } | undefined;
  private expired = false;
  private inFlight: Promise<string> | undefined;

  constructor(options: ClientCredentialsOptions) {
    if ((options.tokenUrl === undefined) === (options.issuer === undefined)) {
      throw new Error("give the provider's tokenUrl, or its issuer (to discover the token endpoint), not both");
    }
    if ((options.clientSecret === undefined) === (options.clientSecretFile === undefined)) {
      throw new Error("give clientSecretFile (or clientSecret), not both");
    }
    if (!options.clientId) throw new Error("clientId is empty");
    const refreshAt = options.refreshAt ?? 0.8;
    if (!(refreshAt >= 0.1 && refreshAt < 1)) throw new Error("refreshAt is a fraction of the token's lifetime, between 0.1 and 1");
    for (const url of [options.tokenUrl, options.issuer]) if (url !== undefined) checkedUrl(url);
    this.secret = options.clientSecret ?? readSecretFile(options.clientSecretFile as string);
    if (!this.secret) throw new Error("the client secret is empty");
    this.clientId = options.clientId;
    this.tokenUrl = options.tokenUrl;
    this.issuer = options.issuer?.replace(/\/+$/, "");
    this.form = {};
    for (const key of ["scope", "resource", "audience"] as const) {
      const value = options[key];
      if (value) this.form[key] = value;
    }
    this.authMethod = options.authMethod ?? "basic";
    this.refreshAt = refreshAt;
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.ca = options.ca;
  }

  /** The token to send now: the one held while it is fresh, else a new one (one request at a
   * time, shared by concurrent callers). */
  token(): Promise<string> {
    const held = this.held;
    if (held && Date.now() < held.refreshAfter) return Promise.resolve(held.token);
    this.inFlight ??= this.renew().finally(() => {
      this.inFlight = undefined;
    });
    return this.inFlight;
  }

  /** The broker refused `token`: the next call fetches a new one. */
  invalidate(token: string): void {
    if (this.held?.token === token) this.held = undefined;
  }

  private async renew(): Promise<string> {
    try {
      const { token, lifetimeMs } = await this.fetchToken();
      const now = Date.now();
      this.held = { token, refreshAfter: now + lifetimeMs * this.refreshAt, expires: now + lifetimeMs };
      this.expired = false;
      return token;
    } catch (e) {
      const why = e instanceof TokenUnavailable ? e.message : String(e);
      const held = this.held;
      if (held && Date.now() < held.expires) {
        held.refreshAfter = Math.min(held.expires, Date.now() + RETRY_AFTER_MS);
        console.warn(`approval-broker: could not renew the access token (${why}); using the one held until it expires`);
        return held.token;
      }
      if (held) this.expired = true;
      this.held = undefined;
      throw new TokenUnavailable(
        `no access token for ${this.clientId}: ${why}${this.expired ? " (and the last token has expired)" : ""}; nothing was sent to the approval broker, run nothing`,
      );
    }
  }

  private async endpoint(): Promise<string> {
    if (this.tokenUrl !== undefined) return this.tokenUrl;
    const url = `${this.issuer}/.well-known/openid-configuration`;
    const document = await this.exchange(url, "GET", undefined, { accept: "application/json" });
    if (typeof document.issuer !== "string" || document.issuer.replace(/\/+$/, "") !== this.issuer) {
      throw new TokenUnavailable(`the discovery document ${url} names another issuer than ${this.issuer}`);
    }
    if (typeof document.token_endpoint !== "string") throw new TokenUnavailable(`the discovery document ${url} names no token_endpoint`);
    checkedUrl(document.token_endpoint);
    this.tokenUrl = document.token_endpoint;
    return this.tokenUrl;
  }

  private async fetchToken(): Promise<{ token: string; lifetimeMs: number }> {
    const url = await this.endpoint();
    const form: Record<string, string> = { grant_type: "client_credentials", ...this.form };
    const headers: Record<string, string> = { accept: "application/json", "content-type": "application/x-www-form-urlencoded" };
    if (this.authMethod === "basic") {
      headers.authorization = `Basic ${Buffer.from(`${formEncode(this.clientId)}:${formEncode(this.secret)}`).toString("base64")}`;
    } else {
      form.client_id = this.clientId;
      form.client_secret = this.secret;
    }
    this.requests += 1;
    const answer = await this.exchange(url, "POST", new URLSearchParams(form).toString(), headers);
    if (typeof answer.access_token !== "string" || !answer.access_token) {
      throw new TokenUnavailable(`the identity provider at ${url} answered without an access_token`);
    }
    const expiresIn = answer.expires_in;
    const lifetimeMs = typeof expiresIn === "number" && expiresIn > 0 ? expiresIn * 1000 : DEFAULT_LIFETIME_MS;
    return { token: answer.access_token, lifetimeMs };
  }

  private exchange(url: string, method: string, body: string | undefined, headers: Record<string, string>): Promise<Record<string, unknown>> {
    const target = checkedUrl(url);
    const send = target.protocol === "https:" ? https.request : http.request;
    return new Promise((resolve, reject) => {
      const request = send(
        target,
        { method, headers, timeout: this.timeoutMs, ...(this.ca !== undefined && target.protocol === "https:" ? { ca: [...rootCertificates, String(this.ca)] } : {}) },
        (response) => {
          const chunks: Buffer[] = [];
          let size = 0;
          response.on("data", (chunk: Buffer) => {
            size += chunk.length;
            if (size > MAX_ANSWER) request.destroy(new Error("the answer is too large"));
            else chunks.push(chunk);
          });
          response.on("error", (e) => reject(new TokenUnavailable(`the identity provider at ${url} could not be read (${e.message})`)));
          response.on("end", () => {
            let document: unknown;
            try {
              document = JSON.parse(Buffer.concat(chunks).toString("utf8"));
            } catch {
              document = undefined;
            }
            const status = response.statusCode ?? 0;
            const object = typeof document === "object" && document !== null && !Array.isArray(document) ? (document as Record<string, unknown>) : undefined;
            if (status < 200 || status >= 300) {
              const error = typeof object?.error === "string" ? object.error : undefined;
              const description = typeof object?.error_description === "string" ? ` (${object.error_description})` : "";
              reject(new TokenUnavailable(`the identity provider at ${url} refused: ${error ? `${error}${description}` : `HTTP ${status}`}`));
            } else if (!object) {
              reject(new TokenUnavailable(`the identity provider at ${url} answered something that is not a JSON object`));
            } else {
              resolve(object);
            }
          });
        },
      );
      request.on("timeout", () => request.destroy(new Error(`no answer within ${this.timeoutMs} ms`)));
      request.on("error", (e) => reject(new TokenUnavailable(`the identity provider at ${url} could not be reached (${e.message})`)));
      request.end(body);
    });
  }
}
