//! Passkeys through the facade (docs/identity.md, "Passkeys"): the registration ceremony
//! (a challenge issued, then the credential checked against it and kept), listing and revoking
//! credentials, and the start of a step-up approval: the statement the approver is shown, a
//! fresh nonce, and the WebAuthn request options whose challenge binds the two. The vote itself
//! goes through `decide` like any other; its check runs in the decision's transaction
//! (`operations::passkeys::check_step_up`).

use std::sync::Arc;

use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Value, json};

use super::Broker;
use crate::domain::passkey::step_up::{self, NONCE_BYTES, Shown};
use crate::domain::passkey::webauthn::b64url;
use crate::domain::passkey::{
    CHALLENGE_LIFETIME_MICROS, Challenge, Passkey, Purpose, RelyingParty, cose,
};
use crate::domain::policy::{Gate, Person};
use crate::domain::{CallKey, Identity, Timestamp, ToolInput, Verdict, Viewer};
use crate::error::{Error, Result};

/// What an approver signs to approve a step-up call.
#[derive(Debug, Clone)]
pub struct StepUpOffer {
    /// `PublicKeyCredentialRequestOptionsJSON`.
    pub options_json: String,
    pub statement_json: String,
    /// Hex SHA-256 of the statement.
    pub statement_digest: String,
    /// base64url.
    pub nonce: String,
    pub expires_at: Timestamp,
}

/// Who asks to sign a step-up approval: as a decision names its approver.
pub struct StepUpAsker {
    pub approver: String,
    pub groups: Option<Vec<String>>,
    pub viewer: Viewer,
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0u8; N];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| Error::Internal("the system's random source failed".into()))?;
    Ok(bytes)
}

/// A WebAuthn user handle for `approver`: opaque, stable, and not their identity itself.
fn user_handle(approver: &str) -> String {
    b64url(&crate::domain::passkey::webauthn::sha256(&[approver.as_bytes()])[..16])
}

fn expiry() -> Timestamp {
    Timestamp::now().saturating_add(std::time::Duration::from_micros(
        CHALLENGE_LIFETIME_MICROS as u64,
    ))
}

impl Broker {
    /// The broker taking passkeys for relying party `rp` (`--passkey-*`).
    pub fn with_passkeys(mut self, rp: Arc<RelyingParty>) -> Self {
        self.relying_party = Some(rp);
        self
    }

    /// Who the broker is to authenticators; FAILED_PRECONDITION where passkeys are not served.
    pub fn relying_party(&self) -> Result<&Arc<RelyingParty>> {
        self.relying_party
            .as_ref()
            .ok_or_else(|| Error::FailedPrecondition("this broker serves no passkeys".into()))
    }

    /// Starts registering a passkey for `approver`: the registration id, and the creation
    /// options (WebAuthn's JSON form) whose challenge it is.
    pub async fn begin_passkey_registration(&self, approver: &str) -> Result<(String, String)> {
        let rp = self.relying_party()?;
        let challenge = b64url(&random::<32>()?);
        let existing = self.store.passkeys(Some(approver)).await?;
        let exclude: Vec<Value> = existing
            .iter()
            .filter(|p| p.revoked_at.is_none())
            .map(|p| json!({"type": "public-key", "id": p.credential_id}))
            .collect();
        self.store
            .issue_passkey_challenge(&Challenge {
                challenge: challenge.clone(),
                purpose: Purpose::Register,
                approver: approver.to_owned(),
                call: None,
                nonce: String::new(),
                statement_digest: String::new(),
                expires_at: expiry(),
            })
            .await?;
        let options = json!({
            "challenge": challenge,
            "rp": {"id": rp.id, "name": rp.name},
            "user": {"id": user_handle(approver), "name": approver, "displayName": approver},
            "pubKeyCredParams": cose::ALGORITHMS
                .iter()
                .map(|alg| json!({"type": "public-key", "alg": alg}))
                .collect::<Vec<_>>(),
            "timeout": CHALLENGE_LIFETIME_MICROS / 1000,
            "attestation": "none",
            "excludeCredentials": exclude,
            "authenticatorSelection": {
                "residentKey": "preferred",
                "userVerification": user_verification(rp),
            },
        });
        Ok((challenge, options.to_string()))
    }

    /// Keeps the passkey `credential_json` registers, once it answers `registration_id` (issued
    /// to `approver`) and every check holds.
    pub async fn finish_passkey_registration(
        &self,
        approver: &str,
        registration_id: &str,
        credential_json: &str,
        name: &str,
    ) -> Result<Passkey> {
        let rp = Arc::clone(self.relying_party()?);
        let passkey = self
            .store
            .register_passkey(crate::domain::passkey::Registration {
                registration_id: registration_id.to_owned(),
                approver: approver.to_owned(),
                credential_json: credential_json.to_owned(),
                name: name.to_owned(),
                relying_party: rp,
            })
            .await?;
        tracing::info!(
            approver,
            credential = %passkey.credential_id,
            "passkey registered"
        );
        Ok(passkey)
    }

    /// `approver`'s passkeys (everyone's: `None`).
    pub async fn passkeys(&self, approver: Option<&str>) -> Result<Vec<Passkey>> {
        self.store.passkeys(approver).await
    }

    /// Revokes a passkey, as admin `by`.
    pub async fn revoke_passkey(&self, credential_id: &str, by: &str) -> Result<Passkey> {
        let passkey = self.store.revoke_passkey(credential_id, by).await?;
        tracing::info!(credential = credential_id, by, "passkey revoked");
        Ok(passkey)
    }

    /// What `asker` must sign to approve call `key` (with `edited`, the input they will approve
    /// instead): the statement, its digest, a nonce kept for them and this call, and the request
    /// options. Refused as the decision would be refused, before anything is signed.
    pub async fn begin_step_up(
        &self,
        key: &CallKey,
        asker: &StepUpAsker,
        edited: Option<ToolInput>,
    ) -> Result<StepUpOffer> {
        let rp = self.relying_party()?;
        let call = self.visible_call(key, &asker.viewer).await?;
        if let Some(outcome) = &call.outcome {
            return Err(Error::FailedPrecondition(format!(
                "call `{}` is decided ({}); there is nothing to sign",
                key.call_id, outcome.kind
            )));
        }
        let Some(requirement) = call
            .approval
            .as_ref()
            .map(|a| &a.requirement)
            .filter(|r| r.needs_passkey())
        else {
            return Err(Error::FailedPrecondition(format!(
                "call `{}` needs no passkey: approve it with Decide alone",
                key.call_id
            )));
        };
        let person = Person::new(Identity::from_stored(&asker.approver), asker.groups.clone());
        Gate::of(&call).admit(&person, Verdict::Approve)?;
        // An "edit" that is the input itself is no edit (as `Decision::against` reads it).
        let edited =
            edited.filter(|e| !(e.is_stored_as(&call.input) || call.input.is_stored_as(e)));
        if edited.is_some() && requirement.approvers.quorum > 1 {
            return Err(Error::invalid(
                "edited_input_json",
                format!(
                    "call `{}` needs {} approvals; each approves the input as submitted, so \
                     none may edit it",
                    key.call_id, requirement.approvers.quorum
                ),
            ));
        }
        let credentials: Vec<Value> = self
            .store
            .passkeys(Some(&asker.approver))
            .await?
            .into_iter()
            .filter(|p| p.revoked_at.is_none())
            .map(|p| json!({"type": "public-key", "id": p.credential_id}))
            .collect();
        if credentials.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "call `{}` needs a passkey-signed approval and `{}` has no passkey: register \
                 one first (BeginPasskeyRegistration)",
                key.call_id, asker.approver
            )));
        }
        let approver = Identity::from_stored(&asker.approver).into_string();
        let shown = Shown::of(&approver, &call, edited.as_ref(), requirement);
        let statement_json = shown.statement();
        let digest = shown.digest();
        let nonce = random::<NONCE_BYTES>()?;
        let challenge = step_up::challenge(&digest, &nonce);
        let expires_at = expiry();
        let statement_digest = crate::domain::receipt::sha256_hex(statement_json.as_bytes());
        self.store
            .issue_passkey_challenge(&Challenge {
                challenge: challenge.clone(),
                purpose: Purpose::StepUp,
                approver: approver.clone(),
                call: Some(key.clone()),
                nonce: b64url(&nonce),
                statement_digest: statement_digest.clone(),
                expires_at,
            })
            .await?;
        let options = json!({
            "challenge": challenge,
            "rpId": rp.id,
            "allowCredentials": credentials,
            "userVerification": user_verification(rp),
            "timeout": CHALLENGE_LIFETIME_MICROS / 1000,
        });
        Ok(StepUpOffer {
            options_json: options.to_string(),
            statement_json,
            statement_digest,
            nonce: b64url(&nonce),
            expires_at,
        })
    }
}

fn user_verification(rp: &RelyingParty) -> &'static str {
    if rp.require_user_verification {
        "required"
    } else {
        "preferred"
    }
}
