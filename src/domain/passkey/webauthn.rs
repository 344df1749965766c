//! The two WebAuthn ceremonies (Level 3) as the broker checks them, with nothing but the bytes
//! the browser sent and what the broker itself chose (the challenge, the relying party): a
//! registration (`navigator.credentials.create`, its `toJSON()`), which yields a credential id
//! and a COSE public key to keep, and an assertion (`navigator.credentials.get`), which proves
//! that the authenticator holding that key signed the challenge. Every refusal names the check
//! that failed, in words a person can act on.
//!
//! Attestation is not verified: any `fmt` is read as `none`. The broker trusts a credential
//! because a signed-in approver registered it, not because of its maker (docs/identity.md,
//! "Passkeys").

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::cbor::{self, Cbor};
use super::cose::CoseKey;
use crate::error::{Error, Result};

/// Who the broker is to authenticators: the relying party id (a host name: `localhost`,
/// `approvals.example.com`) whose SHA-256 every authenticator data must start with, its name
/// for people, and the origins a browser may have run the ceremony in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelyingParty {
    pub id: String,
    pub name: String,
    pub origins: Vec<String>,
    /// Whether the authenticator must have verified the user (PIN, biometrics): the UV flag.
    pub require_user_verification: bool,
}

/// Authenticator data flags (WebAuthn §6.1).
const USER_PRESENT: u8 = 0x01;
const USER_VERIFIED: u8 = 0x04;
const ATTESTED: u8 = 0x40;
const EXTENSIONS: u8 = 0x80;

/// A registered credential as the broker keeps it: its id (raw bytes) and COSE key bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCredential {
    pub id: Vec<u8>,
    pub public_key: Vec<u8>,
    pub algorithm: i64,
    pub sign_count: u32,
}

/// An assertion as the browser's `PublicKeyCredential.toJSON()` gives it, decoded but not yet
/// checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assertion {
    pub credential_id: Vec<u8>,
    pub client_data_json: Vec<u8>,
    pub authenticator_data: Vec<u8>,
    pub signature: Vec<u8>,
    /// The challenge the client data names (base64url, as written there).
    pub challenge: String,
}

/// base64url without padding, as WebAuthn's JSON forms write binary.
pub fn b64url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Reads base64url (padding tolerated), naming `field` if it is not.
pub fn from_b64url(field: &str, text: &str) -> Result<Vec<u8>> {
    URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|_| Error::invalid(field, "must be base64url"))
}

/// The SHA-256 of `parts` one after the other.
pub fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().into()
}

fn text<'v>(value: &'v Value, field: &str, key: &str) -> Result<&'v str> {
    value
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid(format!("{field}.{key}"), "is missing (a string)"))
}

fn binary(value: &Value, field: &str, key: &str) -> Result<Vec<u8>> {
    from_b64url(&format!("{field}.{key}"), text(value, field, key)?)
}

/// The credential JSON's outer form: `{id, rawId, type: "public-key", response: {...}}`; the
/// credential id (from `rawId`, which must be `id`) and `response`.
fn credential<'v>(field: &str, json: &'v Value) -> Result<(Vec<u8>, &'v Value)> {
    if json.get("type").and_then(Value::as_str) != Some("public-key") {
        return Err(Error::invalid(
            format!("{field}.type"),
            "must be \"public-key\" (a PublicKeyCredential's toJSON())",
        ));
    }
    let id = binary(json, field, "id")?;
    let raw = binary(json, field, "rawId")?;
    if id != raw || id.is_empty() {
        return Err(Error::invalid(
            format!("{field}.rawId"),
            "must be the credential id, as `id` names it",
        ));
    }
    let response = json
        .get("response")
        .filter(|r| r.is_object())
        .ok_or_else(|| Error::invalid(format!("{field}.response"), "is missing (an object)"))?;
    Ok((id, response))
}

fn parse_json(field: &str, json: &str) -> Result<Value> {
    serde_json::from_str(json).map_err(|e| Error::invalid(field, format!("is not JSON: {e}")))
}

/// Checks the client data of a ceremony of `kind` (`webauthn.create` or `webauthn.get`): its
/// type, that it names `challenge` (base64url), and an origin the relying party allows.
fn check_client_data(
    field: &str,
    client_data: &[u8],
    kind: &str,
    challenge: &str,
    rp: &RelyingParty,
) -> Result<()> {
    let data: Value = serde_json::from_slice(client_data)
        .map_err(|_| Error::invalid(format!("{field}.response.clientDataJSON"), "is not JSON"))?;
    let field = format!("{field}.response.clientDataJSON");
    let got = data.get("type").and_then(Value::as_str).unwrap_or("");
    if got != kind {
        return Err(Error::invalid(
            format!("{field}.type"),
            format!("is `{got}`; this ceremony is `{kind}`"),
        ));
    }
    if data.get("challenge").and_then(Value::as_str) != Some(challenge) {
        return Err(Error::PermissionDenied(format!(
            "the passkey signed another challenge than the broker issued for this {} \
             (clientDataJSON.challenge): ask for a new one and sign again",
            if kind == "webauthn.get" {
                "approval"
            } else {
                "registration"
            }
        )));
    }
    let origin = data.get("origin").and_then(Value::as_str).unwrap_or("");
    if !rp.origins.iter().any(|o| o == origin) {
        return Err(Error::PermissionDenied(format!(
            "the passkey was used from origin `{origin}`, which this broker does not accept \
             (--passkey-origin: {})",
            rp.origins.join(", ")
        )));
    }
    if data.get("crossOrigin").and_then(Value::as_bool) == Some(true) {
        return Err(Error::PermissionDenied(
            "the passkey was used from a cross-origin frame, which this broker does not accept"
                .into(),
        ));
    }
    Ok(())
}

/// The start of authenticator data, checked: the relying party's hash, user presence (and
/// verification where required). Returns the flags and the sign count.
fn check_authenticator_data(data: &[u8], rp: &RelyingParty) -> Result<(u8, u32)> {
    if data.len() < 37 {
        return Err(Error::invalid(
            "authenticatorData",
            format!("is {} bytes; it has at least 37", data.len()),
        ));
    }
    if data[..32] != sha256(&[rp.id.as_bytes()]) {
        return Err(Error::PermissionDenied(format!(
            "the passkey was made for another relying party than `{}` (rpIdHash): register \
             one for this broker",
            rp.id
        )));
    }
    let flags = data[32];
    if flags & USER_PRESENT == 0 {
        return Err(Error::PermissionDenied(
            "the authenticator did not confirm a person was present (the UP flag)".into(),
        ));
    }
    if rp.require_user_verification && flags & USER_VERIFIED == 0 {
        return Err(Error::PermissionDenied(
            "the authenticator did not verify the user (PIN or biometrics; the UV flag), which \
             this broker requires (--passkey-user-verification required)"
                .into(),
        ));
    }
    let count = u32::from_be_bytes([data[33], data[34], data[35], data[36]]);
    Ok((flags, count))
}

/// Checks a registration (`credential_json`: `PublicKeyCredential.toJSON()` of
/// `navigator.credentials.create`) against the challenge the broker issued (base64url) and the
/// relying party; the credential to keep. `field` names the request field in errors.
pub fn verify_registration(
    field: &str,
    credential_json: &str,
    challenge: &str,
    rp: &RelyingParty,
) -> Result<NewCredential> {
    let json = parse_json(field, credential_json)?;
    let (id, response) = credential(field, &json)?;
    let response_field = format!("{field}.response");
    let client_data = binary(response, &response_field, "clientDataJSON")?;
    check_client_data(field, &client_data, "webauthn.create", challenge, rp)?;
    let object = binary(response, &response_field, "attestationObject")?;
    let object = cbor::read_all(&object).map_err(|e| {
        Error::invalid(format!("{response_field}.attestationObject"), e.to_string())
    })?;
    let auth_data = object
        .get_text("authData")
        .ok()
        .flatten()
        .and_then(Cbor::as_bytes)
        .ok_or_else(|| {
            Error::invalid(
                format!("{response_field}.attestationObject"),
                "has no authData (a byte string)",
            )
        })?;
    let (flags, sign_count) = check_authenticator_data(auth_data, rp)?;
    if flags & ATTESTED == 0 {
        return Err(Error::invalid(
            format!("{response_field}.attestationObject"),
            "its authenticator data holds no credential (the AT flag is off)",
        ));
    }
    // aaguid (16), credential id length (2), credential id, COSE key, extensions.
    let rest = &auth_data[37..];
    let malformed = |why: &str| {
        Error::invalid(
            format!("{response_field}.attestationObject"),
            format!("its attested credential data {why}"),
        )
    };
    if rest.len() < 18 {
        return Err(malformed("is cut short"));
    }
    let id_len = usize::from(u16::from_be_bytes([rest[16], rest[17]]));
    let Some(attested_id) = rest.get(18..18 + id_len) else {
        return Err(malformed("is cut short"));
    };
    if attested_id != id.as_slice() {
        return Err(malformed("names another credential id than `rawId`"));
    }
    let key_bytes = &rest[18 + id_len..];
    let (key, used) = cbor::read(key_bytes).map_err(|e| malformed(&format!("has {e}")))?;
    if used != key_bytes.len() && flags & EXTENSIONS == 0 {
        return Err(malformed(
            "has bytes after the public key and no extensions",
        ));
    }
    let cose = CoseKey::from_cbor(&key)
        .map_err(|why| Error::invalid(format!("{response_field}.attestationObject"), why))?;
    Ok(NewCredential {
        id,
        public_key: key_bytes[..used].to_vec(),
        algorithm: cose.algorithm,
        sign_count,
    })
}

/// Decodes an assertion (`PublicKeyCredential.toJSON()` of `navigator.credentials.get`),
/// without checking it: which credential it names and which challenge its client data names,
/// so the broker can find both.
pub fn read_assertion(field: &str, credential_json: &str) -> Result<Assertion> {
    let json = parse_json(field, credential_json)?;
    let (credential_id, response) = credential(field, &json)?;
    let response_field = format!("{field}.response");
    let client_data_json = binary(response, &response_field, "clientDataJSON")?;
    let challenge = serde_json::from_slice::<Value>(&client_data_json)
        .ok()
        .and_then(|d| d.get("challenge")?.as_str().map(str::to_owned))
        .ok_or_else(|| {
            Error::invalid(
                format!("{response_field}.clientDataJSON"),
                "is not JSON naming a challenge",
            )
        })?;
    Ok(Assertion {
        credential_id,
        client_data_json,
        authenticator_data: binary(response, &response_field, "authenticatorData")?,
        signature: binary(response, &response_field, "signature")?,
        challenge,
    })
}

/// Checks `assertion` against the challenge the broker issued (base64url), the relying party,
/// and the credential's stored COSE key: client data, authenticator data, then the signature
/// over `authenticatorData || SHA-256(clientDataJSON)`. The authenticator's sign count.
pub fn verify_assertion(
    field: &str,
    assertion: &Assertion,
    challenge: &str,
    rp: &RelyingParty,
    public_key: &[u8],
) -> Result<u32> {
    check_client_data(
        field,
        &assertion.client_data_json,
        "webauthn.get",
        challenge,
        rp,
    )?;
    let (_, count) = check_authenticator_data(&assertion.authenticator_data, rp)?;
    check_signature(assertion, public_key)?;
    Ok(count)
}

/// Whether the signature of `assertion` is the key's over `authenticatorData ||
/// SHA-256(clientDataJSON)`.
pub fn check_signature(assertion: &Assertion, public_key: &[u8]) -> Result<()> {
    let key = CoseKey::parse(public_key)
        .map_err(|why| Error::Internal(format!("a stored passkey's public key: {why}")))?;
    let mut signed = assertion.authenticator_data.clone();
    signed.extend_from_slice(&sha256(&[&assertion.client_data_json]));
    if !key.verifies(&signed, &assertion.signature) {
        return Err(Error::PermissionDenied(format!(
            "the passkey's signature ({}) does not verify with the registered public key",
            key.algorithm_name()
        )));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
    use serde_json::json;

    use super::super::cose::tests::es256_cose;
    use super::*;

    pub(crate) fn rp() -> RelyingParty {
        RelyingParty {
            id: "localhost".into(),
            name: "approvals".into(),
            origins: vec!["http://localhost:8080".into()],
            require_user_verification: false,
        }
    }

    /// A software authenticator: one P-256 key, as a test drives the ceremonies with it.
    pub(crate) struct Soft {
        pair: EcdsaKeyPair,
        pub id: Vec<u8>,
        rng: SystemRandom,
    }

    impl Soft {
        pub(crate) fn new() -> Self {
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
                    .unwrap();
            Self {
                pair,
                id: vec![7; 16],
                rng,
            }
        }

        fn client_data(kind: &str, challenge: &str, origin: &str) -> Vec<u8> {
            json!({"type": kind, "challenge": challenge, "origin": origin})
                .to_string()
                .into_bytes()
        }

        pub(crate) fn register(&self, challenge: &str, rp_id: &str, origin: &str) -> String {
            let mut auth = sha256(&[rp_id.as_bytes()]).to_vec();
            auth.push(USER_PRESENT | ATTESTED);
            auth.extend_from_slice(&0u32.to_be_bytes());
            auth.extend_from_slice(&[0; 16]);
            auth.extend_from_slice(&(self.id.len() as u16).to_be_bytes());
            auth.extend_from_slice(&self.id);
            auth.extend_from_slice(&es256_cose(self.pair.public_key().as_ref()));
            // {"fmt": "none", "attStmt": {}, "authData": bytes}
            let mut object = vec![0xa3, 0x63];
            object.extend_from_slice(b"fmt");
            object.push(0x64);
            object.extend_from_slice(b"none");
            object.push(0x67);
            object.extend_from_slice(b"attStmt");
            object.push(0xa0);
            object.push(0x68);
            object.extend_from_slice(b"authData");
            object.extend_from_slice(&[0x59, (auth.len() >> 8) as u8, auth.len() as u8]);
            object.extend_from_slice(&auth);
            json!({
                "id": b64url(&self.id), "rawId": b64url(&self.id), "type": "public-key",
                "response": {
                    "clientDataJSON": b64url(&Self::client_data("webauthn.create", challenge, origin)),
                    "attestationObject": b64url(&object),
                },
            })
            .to_string()
        }

        pub(crate) fn assert(
            &self,
            challenge: &str,
            rp_id: &str,
            origin: &str,
            count: u32,
        ) -> String {
            let mut auth = sha256(&[rp_id.as_bytes()]).to_vec();
            auth.push(USER_PRESENT);
            auth.extend_from_slice(&count.to_be_bytes());
            let client = Self::client_data("webauthn.get", challenge, origin);
            let mut signed = auth.clone();
            signed.extend_from_slice(&sha256(&[&client]));
            let sig = self.pair.sign(&self.rng, &signed).unwrap();
            json!({
                "id": b64url(&self.id), "rawId": b64url(&self.id), "type": "public-key",
                "response": {
                    "clientDataJSON": b64url(&client),
                    "authenticatorData": b64url(&auth),
                    "signature": b64url(sig.as_ref()),
                },
            })
            .to_string()
        }
    }

    const ORIGIN: &str = "http://localhost:8080";

    #[test]
    fn a_registration_then_an_assertion_verify_with_the_key_registered() {
        let soft = Soft::new();
        let made = verify_registration(
            "c",
            &soft.register("abc", "localhost", ORIGIN),
            "abc",
            &rp(),
        )
        .unwrap();
        assert_eq!(made.id, soft.id);
        assert_eq!(made.algorithm, -7);
        let assertion = read_assertion("c", &soft.assert("xyz", "localhost", ORIGIN, 5)).unwrap();
        assert_eq!(assertion.challenge, "xyz");
        let count = verify_assertion("c", &assertion, "xyz", &rp(), &made.public_key).unwrap();
        assert_eq!(count, 5);
    }

    #[test]
    fn every_failed_check_is_refused_naming_it() {
        let soft = Soft::new();
        let key = verify_registration(
            "c",
            &soft.register("abc", "localhost", ORIGIN),
            "abc",
            &rp(),
        )
        .unwrap()
        .public_key;
        let refuse = |json: String, challenge: &str| {
            let a = read_assertion("c", &json).unwrap();
            verify_assertion("c", &a, challenge, &rp(), &key)
                .unwrap_err()
                .to_string()
        };
        assert!(
            refuse(soft.assert("x", "localhost", ORIGIN, 0), "y").contains("another challenge")
        );
        assert!(refuse(soft.assert("x", "evil.test", ORIGIN, 0), "x").contains("rpIdHash"));
        assert!(
            refuse(soft.assert("x", "localhost", "https://evil.test", 0), "x").contains("origin")
        );
        // Another key's signature.
        let other = Soft::new();
        assert!(refuse(other.assert("x", "localhost", ORIGIN, 0), "x").contains("does not verify"));
        // A registration's client data used for an assertion.
        let reg = soft.register("x", "localhost", ORIGIN);
        let err = verify_registration(
            "c",
            &reg,
            "x",
            &RelyingParty {
                origins: vec![],
                ..rp()
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("origin"), "{err}");
        let mut uv = rp();
        uv.require_user_verification = true;
        let a = read_assertion("c", &soft.assert("x", "localhost", ORIGIN, 0)).unwrap();
        assert!(
            verify_assertion("c", &a, "x", &uv, &key)
                .unwrap_err()
                .to_string()
                .contains("UV")
        );
        let bad = read_assertion(
            "c",
            r#"{"type":"public-key","id":"AA","rawId":"AB","response":{}}"#,
        );
        assert!(bad.unwrap_err().to_string().contains("rawId"));
    }
}
