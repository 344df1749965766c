/**
 * Bearer tokens that expire. `connectBroker` and `connectBrokerWeb` take a fixed token, or a
 * provider: a function returning the token to send (or a promise of it), or an object whose
 * `token()` does, asked before each request (it keeps its own cache). When the broker refuses a provider's token, the provider's
 * `invalidate(token)` (if it has one) is called and the request is made once more with its next
 * token. A provider that cannot give a token throws (`TokenUnavailable`): whatever waited fails
 * with that error, and nothing is sent to the broker. `ClientCredentials` (in
 * `approval-broker/node`) is such a provider, for agents that are service clients of the
 * organisation's identity provider.
 * @module
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { TokenUnavailable } from "./errors.js";

/** A function giving the bearer token to send now; told with `invalidate` when the broker
 * refused one. */
export interface TokenProvider {
  (): string | Promise<string>;
  invalidate?(token: string): void;
}

/** A provider as an object: `ClientCredentials` is one. */
export interface TokenSource {
  token(): string | Promise<string>;
  invalidate?(token: string): void;
}

/** What the transports' `token` option takes. */
export type TokenOption = string | TokenProvider | TokenSource | undefined;

/** The token a transport sends: `authorization: Bearer <token>` on every request. A provider's
 * token refused on a unary call is renewed there and the call made once more; the client
 * reopens a refused stream once, after `refused()`. */
export class Bearer {
  private last: string | undefined;

  private readonly token: string | TokenSource;

  constructor(token: string | TokenProvider | TokenSource) {
    this.token =
      typeof token === "function"
        ? { token: () => token(), ...(token.invalidate ? { invalidate: (t: string) => token.invalidate?.(t) } : {}) }
        : token;
  }

  /** Whether a refused token is worth renewing (a provider's). */
  get renews(): boolean {
    return typeof this.token !== "string";
  }

  /** The broker refused the token last sent: the provider is told, and gives another next. */
  refused(): void {
    if (typeof this.token !== "string" && this.last !== undefined) this.token.invalidate?.(this.last);
  }

  interceptor(): Interceptor {
    return (next) => async (request) => {
      const sent = await this.current();
      request.header.set("authorization", `Bearer ${sent}`);
      try {
        return await next(request);
      } catch (e) {
        if (!this.renews || request.stream || ConnectError.from(e).code !== Code.Unauthenticated) throw e;
        this.refused();
        request.header.set("authorization", `Bearer ${await this.current()}`);
        return await next(request);
      }
    };
  }

  private async current(): Promise<string> {
    if (typeof this.token === "string") return this.token;
    try {
      this.last = await this.token.token();
      return this.last;
    } catch (e) {
      // Carried as the cause, so the client fails with it as it is, at once.
      const failure = e instanceof TokenUnavailable ? e : new TokenUnavailable(`the token provider failed: ${String(e)}`);
      throw new ConnectError(failure.message, Code.Unauthenticated, undefined, undefined, failure);
    }
  }
}

/** The provider's own failure, when `error` carries one. */
export function tokenFailure(error: ConnectError): TokenUnavailable | undefined {
  return error.cause instanceof TokenUnavailable ? error.cause : undefined;
}
