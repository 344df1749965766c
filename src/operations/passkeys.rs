//! Passkeys, as transactions: issuing a challenge, registering a credential against one,
//! listing and revoking credentials, and, inside a decision's own transaction, the check that
//! makes a step-up approval count ([`check_step_up`]): the challenge taken (so a nonce signs one
//! vote), the credential found, its owner the voter and not revoked, the statement rebuilt from
//! the call as read under the decision's locks, and the assertion verified with the stored key.
//!
//! Written once over [`PasskeyTx`], which both backends implement over their transactions
//! (`store::passkey_rows`), so SQLite and every Postgres replica take and check the same rows.

use async_trait::async_trait;

use super::tx::WriteTx;
use crate::domain::passkey::step_up::{self, Shown, SignedApproval};
use crate::domain::passkey::webauthn::{self, from_b64url};
use crate::domain::passkey::{Challenge, MAX_PER_APPROVER, Passkey, Purpose, Registration};
use crate::domain::{Call, Decision, Identity, Timestamp, Verdict};
use crate::error::{Error, Result};

/// The passkey primitives of a write transaction.
#[async_trait]
pub trait PasskeyTx: Send {
    /// Deletes the challenges that expired before `now`, then stores `challenge`.
    async fn insert_challenge(&mut self, challenge: &Challenge, now: Timestamp) -> Result<()>;
    /// Challenge `challenge` of `purpose`, if it is there (read, not taken).
    async fn find_challenge(
        &mut self,
        challenge: &str,
        purpose: Purpose,
    ) -> Result<Option<Challenge>>;
    /// Deletes challenge `challenge` of `purpose` and returns it, if it was there: the one
    /// transaction that commits this answered it (on Postgres, a concurrent one waits for the
    /// row and then finds it gone).
    async fn take_challenge(
        &mut self,
        challenge: &str,
        purpose: Purpose,
    ) -> Result<Option<Challenge>>;
    /// Stores a credential; `false` if its id is registered already (nothing written).
    async fn insert_passkey(&mut self, passkey: &Passkey) -> Result<bool>;
    async fn find_passkey(&mut self, credential_id: &str) -> Result<Option<Passkey>>;
    /// `approver`'s credentials (every approver's: `None`), oldest first.
    async fn passkeys_of(&mut self, approver: Option<&str>) -> Result<Vec<Passkey>>;
    /// Marks a credential revoked unless it is; whether it did.
    async fn revoke_passkey(
        &mut self,
        credential_id: &str,
        by: &str,
        now: Timestamp,
    ) -> Result<bool>;
    /// Records a counted use: the authenticator's sign count and when.
    async fn record_passkey_use(
        &mut self,
        credential_id: &str,
        sign_count: i64,
        now: Timestamp,
    ) -> Result<()>;
}

/// Stores a challenge the broker just issued, and commits.
pub async fn issue(mut tx: impl WriteTx, challenge: &Challenge) -> Result<()> {
    tx.insert_challenge(challenge, Timestamp::now()).await?;
    tx.commit().await
}

/// Registers the credential a registration's browser made, for the approver its challenge was
/// issued to, and commits. The challenge is used up whether or not the credential checks.
pub async fn register(mut tx: impl WriteTx, registration: &Registration) -> Result<Passkey> {
    let Registration {
        registration_id,
        approver,
        credential_json,
        name,
        relying_party: rp,
    } = registration;
    let now = Timestamp::now();
    let challenge = tx
        .take_challenge(registration_id, Purpose::Register)
        .await?
        .filter(|c| Identity::from_stored(approver).is(&c.approver))
        .ok_or_else(|| {
            Error::FailedPrecondition(
                "registration_id: no registration of yours is waiting under this id (it was \
                 used, or never issued to you): call BeginPasskeyRegistration again"
                    .into(),
            )
        })?;
    if challenge.expires_at <= now {
        tx.commit().await?;
        return Err(Error::FailedPrecondition(
            "registration_id: this registration expired (5 minutes): call \
             BeginPasskeyRegistration again"
                .into(),
        ));
    }
    let made = match webauthn::verify_registration(
        "credential_json",
        credential_json,
        registration_id,
        rp,
    ) {
        Ok(made) => made,
        Err(refused) => {
            // The challenge is spent either way: commit its removal.
            tx.commit().await?;
            return Err(refused);
        }
    };
    let existing = tx.passkeys_of(Some(&challenge.approver)).await?;
    if existing.iter().filter(|p| p.revoked_at.is_none()).count() >= MAX_PER_APPROVER {
        return Err(Error::ResourceExhausted(format!(
            "`{}` has {MAX_PER_APPROVER} passkeys, the most one approver may keep: ask an admin \
             to revoke one",
            challenge.approver
        )));
    }
    let passkey = Passkey {
        credential_id: webauthn::b64url(&made.id),
        approver: challenge.approver.clone(),
        name: name.to_owned(),
        public_key: made.public_key,
        algorithm: made.algorithm,
        sign_count: i64::from(made.sign_count),
        created_at: now,
        last_used_at: None,
        revoked_at: None,
        revoked_by: None,
    };
    if !tx.insert_passkey(&passkey).await? {
        return Err(Error::AlreadyExists(format!(
            "passkey `{}` is registered already",
            passkey.credential_id
        )));
    }
    tx.commit().await?;
    Ok(passkey)
}

/// The credentials of `approver` (every approver's: `None`).
pub async fn list(mut tx: impl WriteTx, approver: Option<&str>) -> Result<Vec<Passkey>> {
    let passkeys = tx.passkeys_of(approver).await?;
    tx.commit().await?;
    Ok(passkeys)
}

/// Revokes credential `credential_id` (by admin `by`), and commits: the credential as it
/// stands. NOT_FOUND if there is none.
pub async fn revoke(mut tx: impl WriteTx, credential_id: &str, by: &str) -> Result<Passkey> {
    tx.revoke_passkey(credential_id, by, Timestamp::now())
        .await?;
    let passkey = tx
        .find_passkey(credential_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no passkey `{credential_id}`")))?;
    tx.commit().await?;
    Ok(passkey)
}

/// Whether `decision` needs a passkey on `call`: an approval (or edit) of a call whose
/// requirement asks for `step_up: passkey`.
pub fn needs_passkey(call: &Call, decision: &Decision) -> bool {
    decision.verdict == Verdict::Approve
        && call
            .approval
            .as_ref()
            .is_some_and(|a| a.requirement.needs_passkey())
}

/// In the decision's transaction, under its call's lock: checks the passkey assertion an
/// approval of a step-up call carries, takes its challenge, and returns it as the vote keeps
/// it. Refused (nothing counted, nothing written) when it is missing, its challenge is not one the broker issued to this approver
/// for this call (or was used, or expired), the statement it signed is not this call, input
/// and requirement, the credential is not the voter's own or is revoked, or a WebAuthn check
/// fails (each refusal says which).
pub async fn check_step_up(
    tx: &mut impl WriteTx,
    call: &Call,
    decision: &Decision,
    now: Timestamp,
) -> Result<SignedApproval> {
    let requirement = &call
        .approval
        .as_ref()
        .ok_or_else(|| Error::Internal("a step-up check of a call without a requirement".into()))?
        .requirement;
    let Some(vote) = &decision.passkey else {
        return Err(missing(call, &requirement.name()));
    };
    let assertion = &vote.assertion;
    let unknown = || {
        Error::FailedPrecondition(format!(
            "passkey: the assertion's challenge is not one this broker issued, or it was used \
             already (a nonce signs one vote): call BeginStepUp for call `{}` and sign again",
            call.key.call_id
        ))
    };
    // Read first and taken last, once every check held: a refused vote writes nothing.
    let challenge = tx
        .find_challenge(&assertion.challenge, Purpose::StepUp)
        .await?
        .ok_or_else(unknown)?;
    let voter = Identity::from_stored(&decision.approver);
    if !voter.is(&challenge.approver) {
        return Err(Error::PermissionDenied(format!(
            "passkey: the assertion answers a challenge issued to `{}`, not to `{}`",
            challenge.approver,
            voter.as_str()
        )));
    }
    if challenge.call.as_ref() != Some(&call.key) {
        let other = challenge
            .call
            .as_ref()
            .map_or_else(String::new, |k| format!(" `{}`", k.call_id));
        return Err(Error::PermissionDenied(format!(
            "passkey: the assertion was made for another call{other}, not call `{}`",
            call.key.call_id
        )));
    }
    if challenge.expires_at <= now {
        return Err(Error::FailedPrecondition(
            "passkey: the step-up challenge expired (5 minutes): call BeginStepUp and sign again"
                .into(),
        ));
    }
    let shown = Shown::of(
        voter.as_str(),
        call,
        decision.edited_input.as_ref(),
        requirement,
    );
    let digest = shown.digest();
    let issued = step_up::digest_from_hex("passkey", &challenge.statement_digest)?;
    if digest != issued {
        return Err(Error::PermissionDenied(format!(
            "passkey: the assertion approves another statement than this decision makes (another \
             input{}): call BeginStepUp with the input you approve and sign again",
            if decision.edited_input.is_some() {
                " than the edit"
            } else {
                ", an edit"
            }
        )));
    }
    let nonce = from_b64url("passkey", &challenge.nonce)?;
    let credential_id = webauthn::b64url(&assertion.credential_id);
    let passkey = tx
        .find_passkey(&credential_id)
        .await?
        .filter(|p| voter.is(&p.approver))
        .ok_or_else(|| {
            Error::PermissionDenied(format!(
                "passkey: `{credential_id}` is not a passkey `{}` registered",
                voter.as_str()
            ))
        })?;
    if passkey.revoked_at.is_some() {
        return Err(Error::PermissionDenied(format!(
            "passkey: `{credential_id}` was revoked{}; register another",
            passkey
                .revoked_by
                .as_deref()
                .map_or_else(String::new, |by| format!(" by `{by}`"))
        )));
    }
    let expected = step_up::challenge(&digest, &nonce);
    let count = webauthn::verify_assertion(
        "passkey.credential_json",
        assertion,
        &expected,
        &vote.relying_party,
        &passkey.public_key,
    )?;
    let count = i64::from(count);
    if (count != 0 || passkey.sign_count != 0) && count <= passkey.sign_count {
        return Err(Error::PermissionDenied(format!(
            "passkey: the authenticator's sign count ({count}) did not increase past {}: the \
             credential may have been cloned",
            passkey.sign_count
        )));
    }
    // Taken now: a concurrent vote with the same assertion (another replica) finds it gone.
    if tx
        .take_challenge(&assertion.challenge, Purpose::StepUp)
        .await?
        .is_none()
    {
        return Err(unknown());
    }
    tx.record_passkey_use(&credential_id, count, now).await?;
    Ok(SignedApproval::of(
        assertion,
        &passkey.public_key,
        &nonce,
        &digest,
        &vote.relying_party.id,
    ))
}

/// The refusal of an approval that carries no assertion.
fn missing(call: &Call, requirement: &str) -> Error {
    Error::PermissionDenied(format!(
        "call `{}` needs a passkey-signed approval ({requirement} asks for step_up passkey): \
         call BeginStepUp, sign its challenge with your passkey, and send the assertion as \
         `passkey` with the decision",
        call.key.call_id
    ))
}
