//! Passkeys' storage, written once for both backends over their transactions ([`Transact`]):
//! each ceremony step (a challenge issued, a registration checked and kept, a listing, a
//! revocation) is one transaction of `operations::passkeys`, on Postgres on the pool shared by
//! every replica (a challenge issued by one is answered on any), on SQLite on the one writer.
//! The step-up check of a vote is not here: it runs in the decision's own transaction.

use async_trait::async_trait;

use super::Passkeys;
use super::primitives::Transact;
use crate::domain::passkey::{Challenge, Passkey, Registration};
use crate::error::Result;
use crate::operations::passkeys;

#[async_trait]
impl<S: Transact> Passkeys for S {
    async fn issue_passkey_challenge(&self, challenge: &Challenge) -> Result<()> {
        let challenge = challenge.clone();
        self.transaction(move |tx| async move { passkeys::issue(tx, &challenge).await })
            .await
    }

    async fn register_passkey(&self, registration: Registration) -> Result<Passkey> {
        self.transaction(move |tx| async move { passkeys::register(tx, &registration).await })
            .await
    }

    async fn passkeys(&self, approver: Option<&str>) -> Result<Vec<Passkey>> {
        let approver = approver.map(str::to_owned);
        self.transaction(move |tx| async move { passkeys::list(tx, approver.as_deref()).await })
            .await
    }

    async fn revoke_passkey(&self, credential_id: &str, by: &str) -> Result<Passkey> {
        let (credential_id, by) = (credential_id.to_owned(), by.to_owned());
        self.transaction(move |tx| async move { passkeys::revoke(tx, &credential_id, &by).await })
            .await
    }
}
