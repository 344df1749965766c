//! The receipt statements both backends run, written once, and their rows decoded. Parameters
//! are `$1`, `$2`, ... in the order they first appear (see `statements`). The chain's head is
//! one row (`receipt_chain`, id 1): reading it is how an outcome's transaction learns the link
//! its receipt continues, and on Postgres locking it is how replicas take turns at the chain.
//!
//! A receipt names the row of its call (`call_row`) while the call is stored, and is found
//! through it; deleting the call (retention prunes it) unlinks it (`ON DELETE SET NULL`), and
//! an unlinked receipt is found by its call's key (migrations sqlite 0016, postgres 0018).
//! Indexed by key, every receipt dirtied an index page of its own when many sessions were
//! decided at once; indexed by call row, the receipts of one commit share the index's last page.

use super::primitives::{Param, no_outcome};
use super::rows::Columns;
use crate::domain::receipt::{self, ChainLink, sha256_hex};
use crate::domain::{Call, CallKey};
use crate::error::Result;

/// The chain's head: the last receipt's sequence (0 before the first) and payload digest.
pub const CHAIN_HEAD: &str = "SELECT seq, digest FROM receipt_chain WHERE id = 1";
/// Postgres: [`CHAIN_HEAD`], locked until the transaction ends. Writers of every replica run
/// concurrently there; SQLite's are serialised already.
pub const CHAIN_HEAD_LOCKED: &str = "SELECT seq, digest FROM receipt_chain WHERE id = 1 FOR UPDATE";
/// A receipt: its sequence `$1`, call (`$2`, `$3`, `$4`), payload digest `$5`, envelope `$6`,
/// and the call's row `$7`.
pub const INSERT_RECEIPT: &str = "INSERT INTO receipts \
     (seq, agent, session_id, call_id, digest, envelope, call_row) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
/// Receipt `$2`'s envelope becomes `$1`: SQLite's writer inserts a receipt as its write runs
/// (so a row that cannot be stored fails that write alone), with an envelope of the final
/// length, and seals it just before the commit, in place.
pub const SEAL_RECEIPT: &str = "UPDATE receipts SET envelope = $1 WHERE seq = $2";
/// The chain's head moves to receipt `$1` with digest `$2`.
pub const ADVANCE_CHAIN: &str = "UPDATE receipt_chain SET seq = $1, digest = $2 WHERE id = 1";
/// The receipts of the calls decided under (`$1`, `$2`, `$3`): first the stored call's, then
/// the unlinked ones newest first (calls pruned, and receipts written before they named their
/// call's row). More than one only when the id was used again after retention pruned its call
/// (migrations sqlite 0015, postgres 0017).
pub const RECEIPTS_OF_CALL_ID: &str = "SELECT r.seq, r.envelope, 1 AS linked \
     FROM calls c JOIN receipts r ON r.call_row = c.id \
     WHERE c.agent = $1 AND c.session_id = $2 AND c.call_id = $3 \
     UNION ALL \
     SELECT seq, envelope, 0 AS linked FROM receipts \
     WHERE agent = $1 AND session_id = $2 AND call_id = $3 AND call_row IS NULL \
     ORDER BY linked DESC, seq DESC";
/// At most `$2` receipts after sequence `$1`, in chain order.
pub const RECEIPTS_AFTER: &str =
    "SELECT seq, envelope FROM receipts WHERE seq > $1 ORDER BY seq LIMIT $2";

/// A receipt to append: its row but the envelope, and the payload the envelope signs.
#[derive(Debug)]
pub struct NewReceipt {
    pub sequence: i64,
    pub key: CallKey,
    /// The row of the call in `calls`.
    pub call_row: i64,
    /// The payload's SHA-256 (hex), the link the next receipt names.
    pub digest: String,
    pub payload: String,
}

impl NewReceipt {
    /// The receipt of `call` (decided, stored as row `call_row`) at `link`: its statement's
    /// canonical JSON and digest.
    pub fn of(call: &Call, call_row: i64, link: &ChainLink) -> Result<Self> {
        let payload = receipt::payload(call, link).ok_or_else(|| no_outcome(call))?;
        Ok(Self {
            sequence: link.sequence as i64,
            key: call.key.clone(),
            call_row,
            digest: sha256_hex(payload.as_bytes()),
            payload,
        })
    }

    /// [`INSERT_RECEIPT`]'s parameters, with the envelope that seals the payload.
    pub fn params<'a>(&'a self, envelope: &'a str) -> [Param<'a>; 7] {
        [
            Param::Int(self.sequence),
            Param::Text(self.key.agent.as_str()),
            Param::Text(self.key.session.as_str()),
            Param::Text(self.key.call_id.as_str()),
            Param::Text(&self.digest),
            Param::Text(envelope),
            Param::Int(self.call_row),
        ]
    }
}

/// A stored receipt: its place in the chain and its DSSE envelope (JSON text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredReceipt {
    pub sequence: u64,
    pub envelope: String,
}

pub fn receipt_from_row(row: &impl Columns) -> Result<StoredReceipt> {
    Ok(StoredReceipt {
        sequence: row.int("seq")? as u64,
        envelope: row.text("envelope")?,
    })
}
