//! The commands besides serving that drive several parts at once, kept above them so that no
//! part reaches up into another: `verify` (signed receipts, checked offline or against what a
//! database holds) and `export` (the audit of a time range as JSON Lines).

pub mod export;
pub mod verify;
pub mod verify_database;
