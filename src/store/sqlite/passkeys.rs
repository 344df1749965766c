//! Passkeys on SQLite: each ceremony step its own small transaction on the one writer thread,
//! between groups of writes, run by `operations::passkeys` (the step-up check itself runs
//! inside the decision's transaction, in its group).

use async_trait::async_trait;

use super::SqliteStore;
use crate::domain::passkey::{Challenge, Passkey, Registration};
use crate::error::Result;
use crate::operations::{Transactions, passkeys};
use crate::store::Passkeys;

#[async_trait]
impl Passkeys for SqliteStore {
    async fn issue_passkey_challenge(&self, challenge: &Challenge) -> Result<()> {
        let challenge = challenge.clone();
        self.group
            .alone(move |writer| async move {
                passkeys::issue(writer.begin_write().await?, &challenge).await
            })
            .await
    }

    async fn register_passkey(&self, registration: Registration) -> Result<Passkey> {
        self.group
            .alone(move |writer| async move {
                passkeys::register(writer.begin_write().await?, &registration).await
            })
            .await
    }

    async fn passkeys(&self, approver: Option<&str>) -> Result<Vec<Passkey>> {
        let approver = approver.map(str::to_owned);
        self.group
            .alone(move |writer| async move {
                passkeys::list(writer.begin_write().await?, approver.as_deref()).await
            })
            .await
    }

    async fn revoke_passkey(&self, credential_id: &str, by: &str) -> Result<Passkey> {
        let (credential_id, by) = (credential_id.to_owned(), by.to_owned());
        self.group
            .alone(move |writer| async move {
                passkeys::revoke(writer.begin_write().await?, &credential_id, &by).await
            })
            .await
    }
}
