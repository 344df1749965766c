/**
 * The approval broker's TypeScript client: an agent's tool calls go to the humans (or rules)
 * who approve them, and the agent gets exactly one outcome per call, in order, each APPROVED one
 * checked against its signed receipt before it is handed back to run.
 *
 * Make a client with `connectBroker` from `approval-broker/node` (gRPC over HTTP/2) or
 * `connectBrokerWeb` from `approval-broker/web` (gRPC-Web); the helpers for the Anthropic and
 * OpenAI message formats are in `approval-broker/anthropic` and `approval-broker/openai`.
 * @module
 */
export { Broker, type BrokerOptions, type Logger, type ReviewOptions, type Submitted } from "./client.js";
export { AuthenticationError, BrokerError, BrokerUnavailable, PermissionDenied, RequestRefused, ReviewTimeout, TokenUnavailable } from "./errors.js";
export type { TokenOption, TokenProvider, TokenSource } from "./tokens.js";
export { NOT_ASKED_TEXT, notAskedOutcomes, OnDeny, Outcome, REFUSED_TEXT, Status, type Ack, type OutcomeFields, type ToolCall } from "./models.js";
export { canonicalize } from "./canonical.js";
export {
  parsePublicKey,
  ReceiptRejected,
  trustedKey,
  trustedKeys,
  unverifiedText,
  verifyApproval,
  type ApprovalClaim,
  type KeySource,
  type TrustedKey,
} from "./receipts.js";
export { ReviewedCall, reviewTurn, type RunTool, type TurnCall, type TurnOptions } from "./turns.js";
