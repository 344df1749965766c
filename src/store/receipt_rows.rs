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
//!
//! A receipt is stored whole (its DSSE envelope in `envelope`) or in parts (its payload as
//! text, the key's id and the signature, `envelope` empty; migrations sqlite 0018, postgres
//! 0020), and served as the same envelope either way ([`receipt_from_row`]). SQLite's writer
//! stores parts: without the payload's base64, two receipts share a page up to inputs of about
//! 1 KiB (an envelope took a page of its own), and signing rewrites 88 bytes in place.
//! Postgres still stores whole envelopes, which replicas of the version before read during a
//! rolling update.

use super::primitives::{Param, no_outcome};
use super::rows::Columns;
use crate::domain::receipt::{self, ChainLink, sha256_hex};
use crate::domain::{Call, CallKey};
use crate::error::Result;
use crate::receipts::{SIG_LEN, envelope};

/// The chain's head: the last receipt's sequence (0 before the first) and payload digest.
pub const CHAIN_HEAD: &str = "SELECT seq, digest FROM receipt_chain WHERE id = 1";
/// Postgres: [`CHAIN_HEAD`], locked until the transaction ends. Writers of every replica run
/// concurrently there; SQLite's are serialised already.
pub const CHAIN_HEAD_LOCKED: &str = "SELECT seq, digest FROM receipt_chain WHERE id = 1 FOR UPDATE";
/// A receipt: its sequence `$1`, call (`$2`, `$3`, `$4`), payload digest `$5`, envelope `$6`,
/// the call's row `$7`, and, stored in parts, its payload `$8`, key id `$9` and signature
/// `$10` (see [`ReceiptForm`]).
pub const INSERT_RECEIPT: &str = "INSERT INTO receipts \
     (seq, agent, session_id, call_id, digest, envelope, call_row, payload, keyid, sig) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
/// Receipt `$2`'s signature becomes `$1`: SQLite's writer inserts a receipt in parts as its
/// write runs (so a row that cannot be stored fails that write alone), with a signature of the
/// final length ([`UNSIGNED`]), and signs it just before the commit, in place.
pub const SEAL_RECEIPT: &str = "UPDATE receipts SET sig = $1 WHERE seq = $2";
/// The signature a receipt stored in parts holds until it is signed: as long as every signature
/// ([`SIG_LEN`]), so signing overwrites it where it lies.
pub const UNSIGNED: &str = match std::str::from_utf8(&[b' '; SIG_LEN]) {
    Ok(spaces) => spaces,
    Err(_) => panic!("spaces are UTF-8"),
};
/// The chain's head moves to receipt `$1` with digest `$2`.
pub const ADVANCE_CHAIN: &str = "UPDATE receipt_chain SET seq = $1, digest = $2 WHERE id = 1";
/// The receipts of the calls decided under (`$1`, `$2`, `$3`): first the stored call's, then
/// the unlinked ones newest first (calls pruned, and receipts written before they named their
/// call's row). More than one only when the id was used again after retention pruned its call
/// (migrations sqlite 0015, postgres 0017).
pub const RECEIPTS_OF_CALL_ID: &str = "SELECT r.seq, r.envelope, r.payload, r.keyid, r.sig, \
     1 AS linked \
     FROM calls c JOIN receipts r ON r.call_row = c.id \
     WHERE c.agent = $1 AND c.session_id = $2 AND c.call_id = $3 \
     UNION ALL \
     SELECT seq, envelope, payload, keyid, sig, 0 AS linked FROM receipts \
     WHERE agent = $1 AND session_id = $2 AND call_id = $3 AND call_row IS NULL \
     ORDER BY linked DESC, seq DESC";
/// At most `$2` receipts after sequence `$1`, in chain order.
pub const RECEIPTS_AFTER: &str = "SELECT seq, envelope, payload, keyid, sig FROM receipts \
     WHERE seq > $1 ORDER BY seq LIMIT $2";

/// How a receipt's signature is stored: in its whole envelope, or in parts beside its payload.
#[derive(Debug, Clone, Copy)]
pub enum ReceiptForm<'a> {
    /// The DSSE envelope sealing the payload.
    Whole(&'a str),
    /// The key's id and the signature (or [`UNSIGNED`], to be signed before the commit).
    Parts { keyid: &'a str, sig: &'a str },
}

/// A receipt to append: its row but the signature, and the payload it signs.
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

    /// [`INSERT_RECEIPT`]'s parameters, the receipt stored in `form`.
    pub fn params<'a>(&'a self, form: ReceiptForm<'a>) -> [Param<'a>; 10] {
        let (envelope, payload, keyid, sig) = match form {
            ReceiptForm::Whole(envelope) => (envelope, None, None, None),
            ReceiptForm::Parts { keyid, sig } => {
                ("", Some(self.payload.as_str()), Some(keyid), Some(sig))
            }
        };
        [
            Param::Int(self.sequence),
            Param::Text(self.key.agent.as_str()),
            Param::Text(self.key.session.as_str()),
            Param::Text(self.key.call_id.as_str()),
            Param::Text(&self.digest),
            Param::Text(envelope),
            Param::Int(self.call_row),
            Param::OptText(payload),
            Param::OptText(keyid),
            Param::OptText(sig),
        ]
    }
}

/// A stored receipt: its place in the chain and its DSSE envelope (JSON text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredReceipt {
    pub sequence: u64,
    pub envelope: String,
}

/// A receipt's row as served: its envelope, stored whole or built from its parts.
pub fn receipt_from_row(row: &impl Columns) -> Result<StoredReceipt> {
    let envelope = match row.opt_text("payload")? {
        Some(payload) => envelope(&payload, &row.text("keyid")?, &row.text("sig")?),
        None => row.text("envelope")?,
    };
    Ok(StoredReceipt {
        sequence: row.int("seq")? as u64,
        envelope,
    })
}
