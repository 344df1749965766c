//! The door, both ways: who comes in and what goes out. Bearer tokens, JWTs and roles (`auth`),
//! caps on connections (`connections/`) and streams (`stream_slots`), signed approval links
//! (`links`), and the one way out for every HTTP request the broker sends itself (`outbound`).

pub mod auth;
pub mod connections;
pub mod links;
pub mod outbound;
pub mod passkeys;
pub mod stream_slots;
