//! The messages of passkeys at the edge (docs/identity.md, "Passkeys"): whose passkey a caller
//! may register or list, a passkey's name, the assertion a Decide carries (decoded here, checked
//! in the decision's transaction), and a registered passkey and a step-up offer rendered back.

use std::sync::Arc;

use crate::broker::StepUpOffer;
use crate::domain::Identity;
use crate::domain::passkey::{Passkey, PasskeyVote, RelyingParty, webauthn};
use crate::door::auth::Caller;
use crate::error::{Error, Result};
use crate::proto::v1 as pb;

use super::render;

/// The most bytes of a passkey's name.
const MAX_NAME_BYTES: usize = 64;

/// Whose passkeys the caller registers and lists: their token's identity. A passkey belongs to
/// a person the broker knows: while auth is off it cannot tell who that is (FAILED_PRECONDITION);
/// an auditor decides nothing, so holds none (PERMISSION_DENIED).
pub fn owner(caller: &Caller) -> Result<String> {
    match caller {
        Caller::Anonymous => Err(Error::FailedPrecondition(
            "passkeys belong to signed-in approvers, and authentication is off on this broker \
             (--tokens-file, APPROVALS_TOKENS or JWTs): it cannot tell whose passkey this is"
                .into(),
        )),
        caller => {
            Ok(Identity::parse("token identity", &caller.approver(String::new())?)?.into_string())
        }
    }
}

/// A passkey's name: up to 64 bytes, no control characters (empty is allowed).
pub fn name(field: &str, name: String) -> Result<String> {
    if name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            format!("at most {MAX_NAME_BYTES} bytes, with no control characters"),
        ));
    }
    Ok(name)
}

/// An approver named by an admin's filter (empty: everyone).
pub fn approver_filter(field: &str, approver: &str) -> Result<Option<String>> {
    if approver.is_empty() {
        return Ok(None);
    }
    Ok(Some(Identity::parse(field, approver)?.into_string()))
}

/// A Decide's `passkey`: decoded (the checks run in the decision's transaction), with the
/// relying party it must have been made for. Only an approval carries one.
pub fn assertion(
    assertion: pb::PasskeyAssertion,
    approves: bool,
    rp: &Arc<RelyingParty>,
) -> Result<Arc<PasskeyVote>> {
    if !approves {
        return Err(Error::invalid(
            "passkey",
            "is only for DECISION_APPROVE: a denial or a response needs no passkey",
        ));
    }
    Ok(Arc::new(PasskeyVote {
        assertion: webauthn::read_assertion("passkey.credential_json", &assertion.credential_json)?,
        relying_party: Arc::clone(rp),
    }))
}

pub fn passkey(p: &Passkey) -> pb::Passkey {
    pb::Passkey {
        credential_id: p.credential_id.clone(),
        approver: p.approver.clone(),
        name: p.name.clone(),
        algorithm: p.algorithm,
        created_at: Some(render::timestamp(p.created_at)),
        last_used_at: p.last_used_at.map(render::timestamp),
        revoked_at: p.revoked_at.map(render::timestamp),
        revoked_by: p.revoked_by.clone().unwrap_or_default(),
        public_key: webauthn::b64url(&p.public_key),
    }
}

pub fn step_up_offer(offer: StepUpOffer) -> pb::BeginStepUpResponse {
    pb::BeginStepUpResponse {
        options_json: offer.options_json,
        statement_digest: offer.statement_digest,
        nonce: offer.nonce,
        statement_json: offer.statement_json,
        expires_at: Some(render::timestamp(offer.expires_at)),
    }
}
