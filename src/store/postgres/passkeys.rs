//! Passkeys on Postgres: each ceremony step its own transaction on the pool, shared by every
//! replica (a challenge issued by one is answered on any), run by `operations::passkeys`.

use async_trait::async_trait;

use super::PostgresStore;
use crate::domain::passkey::{Challenge, Passkey, Registration};
use crate::error::Result;
use crate::operations::{Transactions, passkeys};
use crate::store::Passkeys;

#[async_trait]
impl Passkeys for PostgresStore {
    async fn issue_passkey_challenge(&self, challenge: &Challenge) -> Result<()> {
        passkeys::issue(self.begin_write().await?, challenge).await
    }

    async fn register_passkey(&self, registration: Registration) -> Result<Passkey> {
        passkeys::register(self.begin_write().await?, &registration).await
    }

    async fn passkeys(&self, approver: Option<&str>) -> Result<Vec<Passkey>> {
        passkeys::list(self.begin_write().await?, approver).await
    }

    async fn revoke_passkey(&self, credential_id: &str, by: &str) -> Result<Passkey> {
        passkeys::revoke(self.begin_write().await?, credential_id, by).await
    }
}
