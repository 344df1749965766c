/**
 * The errors of the client, one class per thing that can go wrong.
 *
 * Every error means the same for the agent: no outcome was obtained, so no tool may run. A call
 * the broker refused on its own (a bad field, or its id reused with another input) is not an
 * error here: it gets an `Outcome` with status `REFUSED`, like any other call that did not run.
 * @module
 */
import type { Outcome } from "./models.js";

/** Base class of every error this library raises. */
export class BrokerError extends Error {
  override name = "BrokerError";
}

/**
 * The broker could not be reached, or the connection was lost and not regained, within the
 * client's `unavailableTimeoutMs`. Nothing was decided: fail closed, run nothing. Calls already
 * acknowledged stay pending at the broker; a later `review` of the same calls picks up their
 * outcomes.
 */
export class BrokerUnavailable extends BrokerError {
  override name = "BrokerUnavailable";
}

/** The broker refused the credentials (UNAUTHENTICATED: no token, or an unknown one). */
export class AuthenticationError extends BrokerError {
  override name = "AuthenticationError";
}

/**
 * No bearer token to send: the identity provider could not issue one (unreachable, or it refused
 * the client's credentials) and the last token it issued has expired. Nothing was sent to the
 * broker: fail closed, run nothing.
 */
export class TokenUnavailable extends AuthenticationError {
  override name = "TokenUnavailable";
}

/** The token is valid but of the wrong role for the service (PERMISSION_DENIED). */
export class PermissionDenied extends BrokerError {
  override name = "PermissionDenied";
}

/** The broker refused a whole request (a bad session id, an empty batch...). */
export class RequestRefused extends BrokerError {
  override name = "RequestRefused";
  constructor(
    /** A gRPC status code number. */
    readonly code: number,
    /** The broker's message, naming the field. */
    readonly brokerMessage: string,
  ) {
    super(`the broker refused the request (code ${code}): ${brokerMessage}`);
  }
}

/**
 * `timeoutMs` passed before every call had an outcome. The calls stay pending at the broker (or
 * `cancel` them); `decided` holds the outcomes that did arrive, by call id.
 */
export class ReviewTimeout extends BrokerError {
  override name = "ReviewTimeout";
  constructor(
    readonly pending: string[],
    readonly decided: Map<string, Outcome>,
  ) {
    super(`no outcome yet for ${pending.length} call(s): ${pending.join(", ")}`);
  }
}
