//! Passkeys (WebAuthn): approvers register them, and a call whose requirement asks for
//! `step_up: passkey` counts an approving vote only with an assertion, made by one of the
//! voter's own registered credentials, over the statement they were shown and a fresh nonce
//! (`step_up`). Here: the ceremonies checked from their bytes (`webauthn`, over a small CBOR
//! reader and COSE keys), and the credentials and challenges as the store keeps them. No I/O:
//! the store keeps the rows, `broker::passkeys` runs the ceremonies, and the decision checks
//! the assertion in its own transaction (`operations::decide`).

pub mod cbor;
pub mod cose;
pub mod step_up;
pub mod webauthn;

use crate::domain::{CallKey, Timestamp};

pub use step_up::{Shown, SignedApproval};
pub use webauthn::{Assertion, NewCredential, RelyingParty};

/// How long a challenge (a registration's, or a step-up's nonce) may be answered.
pub const CHALLENGE_LIFETIME_MICROS: i64 = 5 * 60 * 1_000_000;

/// At most this many passkeys per approver (a bound on what one person can make the store
/// hold, and on `excludeCredentials`).
pub const MAX_PER_APPROVER: usize = 20;

/// A registered credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passkey {
    /// base64url of the credential id.
    pub credential_id: String,
    /// Its owner's canonical identity.
    pub approver: String,
    /// What its owner called it (`"laptop"`); may be empty.
    pub name: String,
    /// The COSE public key's bytes.
    pub public_key: Vec<u8>,
    pub algorithm: i64,
    /// The authenticator's last sign count (0: it keeps none).
    pub sign_count: i64,
    pub created_at: Timestamp,
    pub last_used_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
    pub revoked_by: Option<String>,
}

/// What a challenge is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A registration's challenge.
    Register,
    /// A step-up approval's challenge (`SHA-256(statement digest || nonce)`).
    StepUp,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Register => "register",
            Purpose::StepUp => "step_up",
        }
    }

    pub fn from_stored(text: &str) -> Option<Self> {
        match text {
            "register" => Some(Purpose::Register),
            "step_up" => Some(Purpose::StepUp),
            _ => None,
        }
    }
}

/// A challenge the broker issued and has not yet seen answered: single use (the answer that
/// counts deletes it, in its transaction), for one approver, until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// base64url, as `clientDataJSON.challenge` carries it (and a registration's id).
    pub challenge: String,
    pub purpose: Purpose,
    /// Who asked for it (canonical identity).
    pub approver: String,
    /// The call a step-up challenge approves.
    pub call: Option<CallKey>,
    /// A step-up's nonce (base64url) and statement digest (hex); empty for a registration.
    pub nonce: String,
    pub statement_digest: String,
    pub expires_at: Timestamp,
}

/// An approval's passkey assertion as the decision carries it to its transaction: decoded (not
/// yet checked) and with the relying party it must have been made for.
#[derive(Debug, Clone)]
pub struct PasskeyVote {
    pub assertion: Assertion,
    pub relying_party: std::sync::Arc<RelyingParty>,
}

/// A registration to finish: the id (the challenge) it answers, who asks, the browser's
/// credential, its name, and the relying party it must have been made for.
#[derive(Debug, Clone)]
pub struct Registration {
    pub registration_id: String,
    pub approver: String,
    pub credential_json: String,
    pub name: String,
    pub relying_party: std::sync::Arc<RelyingParty>,
}
