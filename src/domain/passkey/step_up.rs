//! What a passkey signs when it approves a call: the digest of the statement the approver was
//! shown (who approves, the call's identity, its tool, the input that will run, its title and
//! message, and the requirement), bound to a fresh nonce from the broker. The authenticator signs the
//! challenge `SHA-256(statement digest || nonce)`; the broker checks it before the vote counts,
//! and the receipt carries the whole assertion ([`SignedApproval`]) so anyone holding it can
//! check, offline, that this authenticator approved exactly this input.
//!
//! The statement is canonical JSON (RFC 8785), built from plain fields so the broker (from the
//! call) and the verifier (from the receipt) build the very same bytes.

use serde_json::{Value, json};

use super::webauthn::{self, Assertion, b64url, from_b64url, sha256};
use crate::domain::json;
use crate::domain::policy::Requirement;
use crate::domain::receipt::sha256_hex;
use crate::domain::{Call, ToolInput};
use crate::error::{Error, Result};

/// The statement's `purpose`: which broker statement this is, and its version.
pub const PURPOSE: &str = "approval-broker/step-up/v1";

/// How many random bytes a nonce holds.
pub const NONCE_BYTES: usize = 32;

/// What the approver is shown and approves, as the statement names it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown<'a> {
    /// Who approves (canonical identity): an assertion cannot be passed off as another's.
    pub approver: &'a str,
    pub agent: &'a str,
    pub session: &'a str,
    pub call_id: &'a str,
    pub tool: &'a str,
    /// The input that runs if the call is approved: the approver's edit, or the call's own.
    pub input: &'a str,
    pub edited: bool,
    pub title: &'a str,
    pub message: &'a str,
    /// The requirement fixed on the call, as its stored JSON form says it.
    pub requirement: Value,
}

impl<'a> Shown<'a> {
    /// What an approval of `call` by `approver` (with `edited`, where they edit its input)
    /// shows.
    pub fn of(
        approver: &'a str,
        call: &'a Call,
        edited: Option<&'a ToolInput>,
        requirement: &Requirement,
    ) -> Self {
        Self {
            approver,
            agent: call.key.agent.as_str(),
            session: call.key.session.as_str(),
            call_id: call.key.call_id.as_str(),
            tool: call.tool.as_str(),
            input: edited.unwrap_or(&call.input).as_str(),
            edited: edited.is_some(),
            title: &call.title,
            message: &call.message,
            requirement: requirement_json(requirement),
        }
    }

    /// The statement's canonical JSON text.
    pub fn statement(&self) -> String {
        let input: Value = serde_json::from_str(self.input)
            .unwrap_or_else(|_| Value::String(self.input.to_owned()));
        json::canonical(&json!({
            "purpose": PURPOSE,
            "approver": self.approver,
            "call": {"agent": self.agent, "sessionId": self.session, "callId": self.call_id},
            "tool": self.tool,
            "input": input,
            "edited": self.edited,
            "title": self.title,
            "message": self.message,
            "requirement": self.requirement,
        }))
    }

    /// The SHA-256 of [`Shown::statement`].
    pub fn digest(&self) -> [u8; 32] {
        sha256(&[self.statement().as_bytes()])
    }
}

/// A requirement as the statement and the receipt write it: its stored JSON (the approvers as
/// the policy file spells them, and `rule`).
pub fn requirement_json(requirement: &Requirement) -> Value {
    serde_json::from_str(&requirement.to_stored()).unwrap_or(Value::Null)
}

/// The challenge an authenticator signs for `digest` and `nonce`: base64url of
/// `SHA-256(digest || nonce)`, as `clientDataJSON.challenge` carries it.
pub fn challenge(digest: &[u8; 32], nonce: &[u8]) -> String {
    b64url(&sha256(&[digest, nonce]))
}

/// A passkey's approval of one call, as the vote and the receipt keep it: enough to check it
/// again anywhere, with nothing but these fields and the statement. Binary fields base64url.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedApproval {
    pub credential_id: String,
    /// The credential's COSE public key.
    pub public_key: String,
    pub authenticator_data: String,
    pub client_data_json: String,
    pub signature: String,
    pub nonce: String,
    /// Hex SHA-256 of the statement.
    pub statement_digest: String,
    /// The relying party id the assertion was made for (its hash begins the authenticator data).
    pub rp_id: String,
}

impl SignedApproval {
    /// From an assertion the broker checked, the key it checked it with, and its nonce.
    pub fn of(
        assertion: &Assertion,
        public_key: &[u8],
        nonce: &[u8],
        digest: &[u8; 32],
        rp_id: &str,
    ) -> Self {
        Self {
            credential_id: b64url(&assertion.credential_id),
            public_key: b64url(public_key),
            authenticator_data: b64url(&assertion.authenticator_data),
            client_data_json: b64url(&assertion.client_data_json),
            signature: b64url(&assertion.signature),
            nonce: b64url(nonce),
            statement_digest: hex(digest),
            rp_id: rp_id.to_owned(),
        }
    }

    /// The JSON form (votes, receipts): camelCase keys, as WebAuthn names the parts.
    pub fn to_json(&self) -> Value {
        json!({
            "credentialId": self.credential_id,
            "publicKey": self.public_key,
            "authenticatorData": self.authenticator_data,
            "clientDataJSON": self.client_data_json,
            "signature": self.signature,
            "nonce": self.nonce,
            "statementDigest": self.statement_digest,
            "rpId": self.rp_id,
        })
    }

    /// Reads [`SignedApproval::to_json`]'s form; `None` if a field is missing.
    pub fn from_json(value: &Value) -> Option<Self> {
        let text = |key: &str| value.get(key)?.as_str().map(str::to_owned);
        Some(Self {
            credential_id: text("credentialId")?,
            public_key: text("publicKey")?,
            authenticator_data: text("authenticatorData")?,
            client_data_json: text("clientDataJSON")?,
            signature: text("signature")?,
            nonce: text("nonce")?,
            statement_digest: text("statementDigest")?,
            rp_id: text("rpId")?,
        })
    }

    /// Checks, offline, that this approval signed `shown` for its relying party: the
    /// statement's digest, the challenge made of it and the nonce, the client data's type, the
    /// authenticator data (relying party, user present) and the signature with `public_key`.
    /// Says which check failed.
    pub fn check(&self, shown: &Shown<'_>) -> std::result::Result<(), String> {
        let rp_id = self.rp_id.as_str();
        let digest = shown.digest();
        if self.statement_digest != hex(&digest) {
            return Err(format!(
                "the passkey approved another statement (digest {}) than this call, input and \
                 requirement make ({})",
                self.statement_digest,
                hex(&digest)
            ));
        }
        let decode = |field: &str, text: &str| {
            from_b64url(field, text).map_err(|e| format!("the passkey approval's {e}"))
        };
        let nonce = decode("nonce", &self.nonce)?;
        let assertion = Assertion {
            credential_id: decode("credentialId", &self.credential_id)?,
            client_data_json: decode("clientDataJSON", &self.client_data_json)?,
            authenticator_data: decode("authenticatorData", &self.authenticator_data)?,
            signature: decode("signature", &self.signature)?,
            challenge: String::new(),
        };
        let client: Value = serde_json::from_slice(&assertion.client_data_json)
            .map_err(|_| "the passkey approval's clientDataJSON is not JSON".to_owned())?;
        if client.get("type").and_then(Value::as_str) != Some("webauthn.get") {
            return Err(
                "the passkey approval's clientDataJSON is not of an assertion \
                        (type webauthn.get)"
                    .into(),
            );
        }
        if client.get("challenge").and_then(Value::as_str) != Some(&challenge(&digest, &nonce)) {
            return Err(
                "the passkey signed another challenge than this statement and nonce make".into(),
            );
        }
        let data = &assertion.authenticator_data;
        if data.len() < 37 || data[..32] != sha256(&[rp_id.as_bytes()]) {
            return Err(format!(
                "the passkey approval was made for another relying party than `{rp_id}`"
            ));
        }
        if data[32] & 0x01 == 0 {
            return Err("the passkey approval has no user presence (UP flag)".into());
        }
        let key = decode("publicKey", &self.public_key)?;
        webauthn::check_signature(&assertion, &key).map_err(|e| e.to_string())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a statement digest as hex (`field` names it in errors).
pub fn digest_from_hex(field: &str, text: &str) -> Result<[u8; 32]> {
    let bytes: Option<Vec<u8>> = (text.len() == 64)
        .then(|| {
            (0..64)
                .step_by(2)
                .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
                .collect()
        })
        .flatten();
    bytes
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Error::invalid(field, "must be 64 hex digits (a SHA-256)"))
}

/// Hex SHA-256 of the statement, as receipts write digests.
pub fn statement_digest_hex(shown: &Shown<'_>) -> String {
    sha256_hex(shown.statement().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::super::webauthn::tests::{Soft, rp};
    use super::*;

    fn shown(input: &str) -> Shown<'_> {
        Shown {
            approver: "alice",
            agent: "bot",
            session: "s",
            call_id: "c",
            tool: "shell",
            input,
            edited: false,
            title: "t",
            message: "m",
            requirement: json!({"quorum": 1, "step_up": "passkey", "rule": null}),
        }
    }

    #[test]
    fn the_statement_is_canonical_and_names_everything_shown() {
        let s = shown(r#"{"b":1,"a":2}"#).statement();
        assert_eq!(
            s,
            r#"{"approver":"alice","call":{"agent":"bot","callId":"c","sessionId":"s"},"edited":false,"input":{"a":2,"b":1},"message":"m","purpose":"approval-broker/step-up/v1","requirement":{"quorum":1,"rule":null,"step_up":"passkey"},"title":"t","tool":"shell"}"#
        );
        assert_eq!(
            statement_digest_hex(&shown("{}")),
            hex(&shown("{}").digest())
        );
        assert_eq!(
            digest_from_hex("d", &hex(&shown("{}").digest())).unwrap(),
            shown("{}").digest()
        );
        assert!(digest_from_hex("d", "zz").is_err());
    }

    #[test]
    fn an_approval_checks_offline_only_for_the_statement_it_signed() {
        let soft = Soft::new();
        let registered = webauthn::verify_registration(
            "c",
            &soft.register("r", "localhost", "http://localhost:8080"),
            "r",
            &rp(),
        )
        .unwrap();
        let nonce = [9u8; NONCE_BYTES];
        let digest = shown("{}").digest();
        let json = soft.assert(
            &challenge(&digest, &nonce),
            "localhost",
            "http://localhost:8080",
            1,
        );
        let assertion = webauthn::read_assertion("c", &json).unwrap();
        let signed = SignedApproval::of(
            &assertion,
            &registered.public_key,
            &nonce,
            &digest,
            "localhost",
        );
        assert_eq!(
            SignedApproval::from_json(&signed.to_json()),
            Some(signed.clone())
        );
        signed.check(&shown("{}")).unwrap();
        let other_input = signed.check(&shown(r#"{"x":1}"#)).unwrap_err();
        assert!(other_input.contains("another statement"), "{other_input}");
        let mut other_rp = signed.clone();
        other_rp.rp_id = "example.com".into();
        assert!(
            other_rp
                .check(&shown("{}"))
                .unwrap_err()
                .contains("relying party")
        );
        let mut other_nonce = signed.clone();
        other_nonce.nonce = b64url(&[1u8; NONCE_BYTES]);
        assert!(
            other_nonce
                .check(&shown("{}"))
                .unwrap_err()
                .contains("challenge")
        );
        let mut other_key = signed.clone();
        other_key.public_key = b64url(&super::super::cose::tests::es256_cose(&{
            let mut p = [0u8; 65];
            p[0] = 4;
            p
        }));
        assert!(other_key.check(&shown("{}")).is_err());
    }
}
