//! Mints JWTs for the tests, as an identity provider would (and as an attacker would): ES256
//! and Ed25519 keys generated here, RS256 from the committed fixtures in tests/fixtures/jwt,
//! their JWKS, and forged tokens (`alg: none`, HS256 keyed with a public key). Shared by the
//! verifier's unit tests (`src/door/auth/jwt/tests.rs`) and the black-box tests in `jwt.rs`.

#![allow(dead_code)]

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair as _};
use serde_json::{Value, json};

enum Pair {
    Es256(signature::EcdsaKeyPair),
    Rs256(signature::RsaKeyPair),
    EdDsa(signature::Ed25519KeyPair),
}

/// A signing key with its key id.
pub struct Signer {
    pub kid: String,
    pair: Pair,
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The RSA fixture `name` (in tests/fixtures/jwt).
pub fn rsa_fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/jwt/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

impl Signer {
    pub fn es256(kid: &str) -> Signer {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("generate");
        let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("load");
        Signer {
            kid: kid.to_owned(),
            pair: Pair::Es256(pair),
        }
    }

    pub fn ed25519(kid: &str) -> Signer {
        let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("gen");
        let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("load");
        Signer {
            kid: kid.to_owned(),
            pair: Pair::EdDsa(pair),
        }
    }

    /// RS256 with the fixture `rsa-2048.der` (`other`: `rsa-2048-other.der`).
    pub fn rs256(kid: &str, other: bool) -> Signer {
        let file = if other {
            "rsa-2048-other.der"
        } else {
            "rsa-2048.der"
        };
        let pair = signature::RsaKeyPair::from_der(&rsa_fixture(file)).expect("RSA fixture");
        Signer {
            kid: kid.to_owned(),
            pair: Pair::Rs256(pair),
        }
    }

    pub fn alg(&self) -> &'static str {
        match self.pair {
            Pair::Es256(_) => "ES256",
            Pair::Rs256(_) => "RS256",
            Pair::EdDsa(_) => "EdDSA",
        }
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Value {
        match &self.pair {
            Pair::Es256(pair) => {
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig", "alg": "ES256",
                       "x": b64(&point[1..33]), "y": b64(&point[33..65])})
            }
            Pair::Rs256(pair) => {
                let parts: signature::RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
                json!({"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256",
                       "n": b64(&parts.n), "e": b64(&parts.e)})
            }
            Pair::EdDsa(pair) => {
                json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid, "use": "sig",
                       "x": b64(pair.public_key().as_ref())})
            }
        }
    }

    /// The bytes a careless verifier might use as an HMAC secret: the public key's JWK text.
    pub fn public_bytes(&self) -> Vec<u8> {
        self.jwk().to_string().into_bytes()
    }

    /// A token with these claims, signed with this key.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with_header(
            json!({"alg": self.alg(), "typ": "JWT", "kid": self.kid}),
            claims,
        )
    }

    pub fn sign_with_header(&self, header: Value, claims: &Value) -> String {
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = SystemRandom::new();
        let sig = match &self.pair {
            Pair::Es256(pair) => pair
                .sign(&rng, signed.as_bytes())
                .expect("sign")
                .as_ref()
                .to_vec(),
            Pair::EdDsa(pair) => pair.sign(signed.as_bytes()).as_ref().to_vec(),
            Pair::Rs256(pair) => {
                let mut sig = vec![0; pair.public().modulus_len()];
                pair.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signed.as_bytes(),
                    &mut sig,
                )
                .expect("sign");
                sig
            }
        };
        format!("{signed}.{}", b64(&sig))
    }
}

/// The JWKS publishing these keys.
pub fn jwks(signers: &[&Signer]) -> String {
    json!({"keys": signers.iter().map(|s| s.jwk()).collect::<Vec<_>>()}).to_string()
}

/// An unsigned token (`alg: none`).
pub fn unsigned(kid: &str, claims: &Value) -> String {
    let header = json!({"alg": "none", "typ": "JWT", "kid": kid});
    format!(
        "{}.{}.",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    )
}

/// HS256 keyed with `secret` (an attacker's guess: the issuer's public key).
pub fn hs256(kid: &str, secret: &[u8], claims: &Value) -> String {
    let header = json!({"alg": "HS256", "typ": "JWT", "kid": kid});
    let signed = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, signed.as_bytes());
    format!("{signed}.{}", b64(tag.as_ref()))
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}
