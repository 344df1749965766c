//! Passkeys as stored (`passkeys` and `passkey_challenges`, migrations 0024 SQLite / 0028
//! Postgres): the statements both backends run, and [`PasskeyTx`] written once over their
//! transactions ([`SqlTx`]), so a step-up vote takes its challenge and reads its credential in
//! the decision's own transaction on either backend.

use async_trait::async_trait;

use super::primitives::{Param, Run, SqlTx};
use super::rows::Columns;
use crate::domain::passkey::{Challenge, Passkey, Purpose};
use crate::domain::{AgentId, CallId, CallKey, SessionId, Timestamp};
use crate::error::{Error, Result};
use crate::operations::PasskeyTx;

/// Every column of `passkeys`, as [`passkey_from_row`] reads them.
macro_rules! select_passkeys {
    ($rest:literal) => {
        concat!(
            "SELECT credential_id, approver, name, public_key, algorithm, sign_count, \
             created_at, last_used_at, revoked_at, revoked_by FROM passkeys ",
            $rest
        )
    };
}

const DELETE_EXPIRED_CHALLENGES: &str = "DELETE FROM passkey_challenges WHERE expires_at <= $1";
const INSERT_CHALLENGE: &str = "INSERT INTO passkey_challenges \
     (challenge, purpose, approver, agent, session_id, call_id, nonce, statement_digest, \
     expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
const FIND_CHALLENGE: &str = "SELECT challenge, purpose, approver, agent, session_id, call_id, \
     nonce, statement_digest, expires_at FROM passkey_challenges \
     WHERE challenge = $1 AND purpose = $2";
const TAKE_CHALLENGE: &str = "DELETE FROM passkey_challenges WHERE challenge = $1 AND purpose = $2 \
     RETURNING challenge, purpose, approver, agent, session_id, call_id, nonce, \
     statement_digest, expires_at";
const INSERT_PASSKEY: &str = "INSERT INTO passkeys \
     (credential_id, approver, name, public_key, algorithm, sign_count, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (credential_id) DO NOTHING";
// Parameters are named in increasing order of first use (`store::statements` says why).
const REVOKE_PASSKEY: &str = "UPDATE passkeys SET revoked_at = $1, revoked_by = $2 \
     WHERE credential_id = $3 AND revoked_at IS NULL";
const RECORD_USE: &str =
    "UPDATE passkeys SET sign_count = $1, last_used_at = $2 WHERE credential_id = $3";

const FIND_PASSKEY: &str = select_passkeys!("WHERE credential_id = $1");
const PASSKEYS_OF: &str =
    select_passkeys!("WHERE approver = $1 ORDER BY created_at, credential_id");
const EVERY_PASSKEY: &str = select_passkeys!("ORDER BY created_at, credential_id");

fn passkey_from_row(row: &dyn Columns) -> Result<Passkey> {
    let public_key =
        crate::domain::passkey::webauthn::from_b64url("public_key", &row.text("public_key")?)
            .map_err(|_| {
                Error::Internal("a stored passkey's public key is not base64url".into())
            })?;
    Ok(Passkey {
        credential_id: row.text("credential_id")?,
        approver: row.text("approver")?,
        name: row.text("name")?,
        public_key,
        algorithm: row.int("algorithm")?,
        sign_count: row.int("sign_count")?,
        created_at: Timestamp::from_micros(row.int("created_at")?),
        last_used_at: row.opt_int("last_used_at")?.map(Timestamp::from_micros),
        revoked_at: row.opt_int("revoked_at")?.map(Timestamp::from_micros),
        revoked_by: row.opt_text("revoked_by")?,
    })
}

fn challenge_from_row(row: &dyn Columns) -> Result<Challenge> {
    let purpose = row.text("purpose")?;
    let call = match (
        row.opt_text("agent")?,
        row.opt_text("session_id")?,
        row.opt_text("call_id")?,
    ) {
        (Some(agent), Some(session), Some(call_id)) => Some(CallKey {
            agent: AgentId::from_stored(agent),
            session: SessionId::from_stored(session),
            call_id: CallId::from_stored(call_id),
        }),
        _ => None,
    };
    Ok(Challenge {
        challenge: row.text("challenge")?,
        purpose: Purpose::from_stored(&purpose)
            .ok_or_else(|| Error::Internal(format!("unknown challenge purpose `{purpose}`")))?,
        approver: row.text("approver")?,
        call,
        nonce: row.text("nonce")?,
        statement_digest: row.text("statement_digest")?,
        expires_at: Timestamp::from_micros(row.int("expires_at")?),
    })
}

#[async_trait]
impl<T: SqlTx> PasskeyTx for T {
    async fn insert_challenge(&mut self, challenge: &Challenge, now: Timestamp) -> Result<()> {
        let params = [Param::Int(now.as_micros())];
        self.execute(Run::write(DELETE_EXPIRED_CHALLENGES, &params))
            .await?;
        let key = challenge.call.as_ref();
        let params = [
            Param::Text(&challenge.challenge),
            Param::Text(challenge.purpose.as_str()),
            Param::Text(&challenge.approver),
            Param::OptText(key.map(|k| k.agent.as_str())),
            Param::OptText(key.map(|k| k.session.as_str())),
            Param::OptText(key.map(|k| k.call_id.as_str())),
            Param::Text(&challenge.nonce),
            Param::Text(&challenge.statement_digest),
            Param::Int(challenge.expires_at.as_micros()),
        ];
        self.execute(Run::write(INSERT_CHALLENGE, &params)).await?;
        Ok(())
    }

    async fn find_challenge(
        &mut self,
        challenge: &str,
        purpose: Purpose,
    ) -> Result<Option<Challenge>> {
        let params = [Param::Text(challenge), Param::Text(purpose.as_str())];
        let rows = self
            .rows(Run::read(FIND_CHALLENGE, &params), challenge_from_row)
            .await?;
        Ok(rows.into_iter().next())
    }

    async fn take_challenge(
        &mut self,
        challenge: &str,
        purpose: Purpose,
    ) -> Result<Option<Challenge>> {
        let params = [Param::Text(challenge), Param::Text(purpose.as_str())];
        let rows = self
            .rows(Run::write(TAKE_CHALLENGE, &params), challenge_from_row)
            .await?;
        Ok(rows.into_iter().next())
    }

    async fn insert_passkey(&mut self, p: &Passkey) -> Result<bool> {
        let public_key = crate::domain::passkey::webauthn::b64url(&p.public_key);
        let params = [
            Param::Text(&p.credential_id),
            Param::Text(&p.approver),
            Param::Text(&p.name),
            Param::Text(&public_key),
            Param::Int(p.algorithm),
            Param::Int(p.sign_count),
            Param::Int(p.created_at.as_micros()),
        ];
        Ok(self.execute(Run::write(INSERT_PASSKEY, &params)).await? > 0)
    }

    async fn find_passkey(&mut self, credential_id: &str) -> Result<Option<Passkey>> {
        let params = [Param::Text(credential_id)];
        let rows = self
            .rows(Run::read(FIND_PASSKEY, &params), passkey_from_row)
            .await?;
        Ok(rows.into_iter().next())
    }

    async fn passkeys_of(&mut self, approver: Option<&str>) -> Result<Vec<Passkey>> {
        match approver {
            Some(approver) => {
                let params = [Param::Text(approver)];
                self.rows(Run::read(PASSKEYS_OF, &params), passkey_from_row)
                    .await
            }
            None => {
                self.rows(Run::read(EVERY_PASSKEY, &[]), passkey_from_row)
                    .await
            }
        }
    }

    async fn revoke_passkey(
        &mut self,
        credential_id: &str,
        by: &str,
        now: Timestamp,
    ) -> Result<bool> {
        let params = [
            Param::Int(now.as_micros()),
            Param::Text(by),
            Param::Text(credential_id),
        ];
        Ok(self.execute(Run::write(REVOKE_PASSKEY, &params)).await? > 0)
    }

    async fn record_passkey_use(
        &mut self,
        credential_id: &str,
        sign_count: i64,
        now: Timestamp,
    ) -> Result<()> {
        let params = [
            Param::Int(sign_count),
            Param::Int(now.as_micros()),
            Param::Text(credential_id),
        ];
        self.execute(Run::write(RECORD_USE, &params)).await?;
        Ok(())
    }
}
