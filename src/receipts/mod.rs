//! Signed receipts: every outcome the broker writes gets a DSSE envelope over an in-toto
//! Statement (`domain::receipt`), signed with the operator's Ed25519 key in the outcome's own
//! transaction and chained to the receipt before it, so a receipt exists exactly when its
//! outcome does and history cannot be deleted or reordered unnoticed.
//!
//! - [`Notary`]: the signing key (loaded from `--receipt-key`, or generated next to a SQLite
//!   database on first start) and what it signs with.
//! - [`PublicKey`]: what a verifier needs, in the forms the broker prints and serves.
//! - [`signer`]: a thread that signs beside SQLite's writer, so the writer only builds payloads.
//! - [`verify`]: the offline checks of one receipt or an exported chain
//!   (`approval-broker verify`), shared by the broker when it reports a receipt's status.
//! - [`trust`]: the keys a verifier trusts, several across key rotations, each with the time
//!   it was valid if known.
//!
//! The `verify` command, which reads databases too, is `commands::verify`.
//!
//! Never here: deciding anything about a call, or reading or writing the database.

mod key;
pub mod signer;
pub mod trust;
pub mod verify;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};

pub use key::{KeyHome, ReceiptsMode, notary};

use crate::domain::json::{self, ArrayWriter, ObjectWriter};
use crate::domain::receipt::{PAYLOAD_TYPE, sha256_hex};
use crate::error::{Error, Result};

/// The prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the DER of a `PUBLIC KEY` PEM is
/// these 12 bytes followed by the 32 bytes of the key.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The DSSE pre-authentication encoding of a payload: what is actually signed, so a signature
/// over one payload type can never be read as one over another.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload_type.len() + payload.len() + 32);
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(payload_type.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload);
    out
}

/// `bytes` in base64 as a JSON string, written straight into `out`: base64's alphabet needs no
/// escape, so it is its own canonical form (scanning a payload's base64 for escapes showed in
/// the signer thread's profile).
fn quoted_base64(bytes: &[u8], out: &mut String) {
    out.push('"');
    BASE64.encode_string(bytes, out);
    out.push('"');
}

/// The broker's receipt signing key.
pub struct Notary {
    pair: Ed25519KeyPair,
    public: PublicKey,
    /// [`PublicKey::key_id`], which every envelope carries: hashed once, not per receipt.
    key_id: String,
}

impl std::fmt::Debug for Notary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notary")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl Notary {
    fn from_pair(pair: Ed25519KeyPair) -> Self {
        let mut raw = [0u8; 32];
        raw.copy_from_slice(pair.public_key().as_ref());
        let public = PublicKey(raw);
        Self {
            pair,
            key_id: public.key_id(),
            public,
        }
    }

    /// A notary over a raw 32-byte Ed25519 seed (tests and benchmarks build keys this way).
    pub fn from_seed(seed: &[u8; 32]) -> Result<Self> {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed)
            .map_err(|e| Error::Internal(format!("an Ed25519 seed was refused: {e}")))?;
        Ok(Self::from_pair(pair))
    }

    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    /// The id of this key, which every envelope it seals names ([`PublicKey::key_id`]).
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The DSSE envelope (JSON text, canonical) signing `payload` with this key: [`envelope`]
    /// of the payload, this key's id and [`Notary::sign`]'s signature.
    pub fn seal(&self, payload: &str) -> String {
        envelope(payload, &self.key_id, &self.sign(payload))
    }

    /// The signature of `payload` as a DSSE envelope carries it (`sig`: base64 of the Ed25519
    /// signature of the payload's pre-authentication encoding). Always [`SIG_LEN`] bytes.
    pub fn sign(&self, payload: &str) -> String {
        let signature = self.pair.sign(&pae(PAYLOAD_TYPE, payload.as_bytes()));
        BASE64.encode(signature.as_ref())
    }
}

/// The length of every signature [`Notary::sign`] gives: 64 bytes, in base64.
pub const SIG_LEN: usize = 88;

/// The DSSE envelope (JSON text, canonical) of `payload` signed `sig` by key `key_id`:
/// `payload` (base64), `payloadType`, and `signatures`, one `{keyid, sig}`. Written as it goes,
/// as the payload is (`domain::receipt::payload`), not built as a tree first. The same parts
/// always give the same bytes, so an envelope rebuilt from a receipt stored in parts (its
/// payload as text, the key's id and the signature: `store::receipt_rows`) is the one sealed.
pub fn envelope(payload: &str, key_id: &str, sig: &str) -> String {
    // The JSON around the parts: member names, quotes, brackets (69 bytes) and the payload type.
    const FRAME: usize = 69 + PAYLOAD_TYPE.len();
    let mut out =
        String::with_capacity(payload.len().div_ceil(3) * 4 + key_id.len() + sig.len() + FRAME);
    let mut envelope = ObjectWriter::open(&mut out);
    quoted_base64(payload.as_bytes(), envelope.key("payload"));
    json::write_string(PAYLOAD_TYPE, envelope.key("payloadType"));
    let mut signatures = ArrayWriter::open(envelope.key("signatures"));
    let mut one = ObjectWriter::open(signatures.item());
    json::write_string(key_id, one.key("keyid"));
    json::write_string(sig, one.key("sig"));
    one.close();
    signatures.close();
    envelope.close();
    out
}

/// An Ed25519 public key that verifies receipts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// The 32 raw bytes, base64: the form the broker prints at start and serves.
    pub fn to_base64(&self) -> String {
        BASE64.encode(self.0)
    }

    /// The key id every signature carries: the SHA-256 (hex) of the raw key.
    pub fn key_id(&self) -> String {
        sha256_hex(&self.0)
    }

    /// The key as a `PUBLIC KEY` PEM (SubjectPublicKeyInfo), as `openssl pkey -pubout` writes.
    pub fn to_pem(&self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.0);
        key::pem("PUBLIC KEY", &der)
    }

    /// A key as the broker prints it (base64 of the 32 raw bytes) or as a `PUBLIC KEY` PEM.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let bytes = if text.starts_with("-----BEGIN") {
            let der = key::unpem("PUBLIC KEY", text)?;
            der.strip_prefix(&SPKI_PREFIX[..])
                .ok_or_else(|| Error::invalid("key", "is not an Ed25519 public key"))?
                .to_vec()
        } else {
            BASE64.decode(text).map_err(|_| {
                Error::invalid("key", "is neither a PUBLIC KEY PEM nor base64 of 32 bytes")
            })?
        };
        let raw: [u8; 32] = bytes
            .try_into()
            .map_err(|_| Error::invalid("key", "an Ed25519 public key has 32 bytes"))?;
        Ok(Self(raw))
    }

    /// Whether `signature` signs `message` with this key.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, self.0)
            .verify(message, signature)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The envelope written as it goes is the DSSE envelope built as a tree and made
    /// canonical, byte for byte (Ed25519 signs the same bytes alike every time).
    #[test]
    fn an_envelope_is_its_json_in_canonical_form() {
        let notary = Notary::from_seed(&[9; 32]).unwrap();
        for payload in ["", "a", "{\"q\":\"\\\"/\\n\"}", &"é".repeat(700)] {
            let signature = notary.pair.sign(&pae(PAYLOAD_TYPE, payload.as_bytes()));
            let tree = serde_json::json!({
                "payloadType": PAYLOAD_TYPE,
                "payload": BASE64.encode(payload.as_bytes()),
                "signatures": [{
                    "keyid": notary.key_id,
                    "sig": BASE64.encode(signature.as_ref()),
                }],
            });
            assert_eq!(notary.seal(payload), json::canonical(&tree), "{payload}");
        }
    }

    /// A receipt stored in parts is served as the envelope that was sealed: the parts give
    /// back the same bytes, whatever the payload (every remainder of base64's groups of three,
    /// escapes in JSON, multi-byte characters), and every signature has the length a stored
    /// receipt reserves for it before it is signed.
    #[test]
    fn an_envelope_rebuilt_from_its_parts_is_the_one_sealed() {
        let notary = Notary::from_seed(&[7; 32]).unwrap();
        for payload in [
            "",
            "a",
            "ab",
            "abc",
            "{\"q\":\"\\\"/\\n\"}",
            &"é".repeat(700),
        ] {
            let sig = notary.sign(payload);
            assert_eq!(sig.len(), SIG_LEN, "{payload}");
            assert_eq!(
                envelope(payload, notary.key_id(), &sig),
                notary.seal(payload),
                "{payload}"
            );
        }
    }
}
