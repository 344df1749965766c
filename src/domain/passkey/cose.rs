//! A passkey's public key as the authenticator hands it over: a COSE key (RFC 9053), read once
//! at registration and stored as those bytes, and the signature check an assertion needs. The
//! algorithms are those browsers ask for by default: ES256 (P-256, what every platform
//! authenticator makes), EdDSA (Ed25519) and RS256, each verified by `ring`.

use ring::signature::{self, UnparsedPublicKey};

use super::cbor::{self, Cbor};

/// COSE algorithm identifiers (IANA "COSE Algorithms").
pub const ES256: i64 = -7;
pub const EDDSA: i64 = -8;
pub const RS256: i64 = -257;

/// The algorithms a registration may use, in the order `pubKeyCredParams` offers them.
pub const ALGORITHMS: [i64; 3] = [ES256, EDDSA, RS256];

/// A credential's public key, checked to be one of [`ALGORITHMS`] with a well-formed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoseKey {
    pub algorithm: i64,
    /// What `ring` verifies with: the uncompressed P-256 point (`04 || x || y`), the Ed25519
    /// key, or the RSA modulus and exponent.
    material: Material,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Material {
    P256(Vec<u8>),
    Ed25519(Vec<u8>),
    Rsa { n: Vec<u8>, e: Vec<u8> },
}

impl CoseKey {
    /// Reads a COSE key from its CBOR; errors say which label is wrong.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let key = cbor::read_all(bytes).map_err(|e| format!("the COSE key: {e}"))?;
        Self::from_cbor(&key)
    }

    pub(super) fn from_cbor(key: &Cbor) -> Result<Self, String> {
        let int = |label: i64| -> Result<i64, String> {
            key.get_int(label)
                .map_err(|e| format!("the COSE key: {e}"))?
                .and_then(Cbor::as_int)
                .ok_or_else(|| format!("the COSE key has no integer label {label}"))
        };
        let bytes = |label: i64| -> Result<Vec<u8>, String> {
            key.get_int(label)
                .map_err(|e| format!("the COSE key: {e}"))?
                .and_then(Cbor::as_bytes)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| format!("the COSE key has no byte string at label {label}"))
        };
        let (kty, algorithm) = (int(1)?, int(3)?);
        let material = match (kty, algorithm) {
            // EC2, P-256.
            (2, ES256) => {
                let crv = int(-1)?;
                if crv != 1 {
                    return Err(format!(
                        "an ES256 key must be on P-256 (crv 1), not crv {crv}"
                    ));
                }
                let (x, y) = (bytes(-2)?, bytes(-3)?);
                if x.len() != 32 || y.len() != 32 {
                    return Err("a P-256 key's x and y are 32 bytes each".into());
                }
                let mut point = Vec::with_capacity(65);
                point.push(4);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                Material::P256(point)
            }
            // OKP, Ed25519.
            (1, EDDSA) => {
                let crv = int(-1)?;
                if crv != 6 {
                    return Err(format!(
                        "an EdDSA key must be Ed25519 (crv 6), not crv {crv}"
                    ));
                }
                let x = bytes(-2)?;
                if x.len() != 32 {
                    return Err("an Ed25519 key is 32 bytes".into());
                }
                Material::Ed25519(x)
            }
            // RSA.
            (3, RS256) => {
                let (n, e) = (bytes(-1)?, bytes(-2)?);
                if n.len() < 256 {
                    return Err("an RS256 key needs a modulus of at least 2048 bits".into());
                }
                Material::Rsa { n, e }
            }
            (kty, alg) => {
                return Err(format!(
                    "COSE key type {kty} with algorithm {alg} is not accepted (the accepted \
                     algorithms are ES256 (-7), EdDSA (-8) and RS256 (-257))"
                ));
            }
        };
        Ok(Self {
            algorithm,
            material,
        })
    }

    /// Whether `signature` is this key's over `message`.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        match &self.material {
            Material::P256(point) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, point)
                    .verify(message, signature)
                    .is_ok()
            }
            Material::Ed25519(key) => UnparsedPublicKey::new(&signature::ED25519, key)
                .verify(message, signature)
                .is_ok(),
            Material::Rsa { n, e } => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, signature)
                .is_ok(),
        }
    }

    /// The algorithm's name, for people.
    pub fn algorithm_name(&self) -> &'static str {
        match self.material {
            Material::P256(_) => "ES256",
            Material::Ed25519(_) => "EdDSA",
            Material::Rsa { .. } => "RS256",
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair};

    use super::*;

    /// A COSE key's CBOR for an uncompressed P-256 point: `{1: 2, 3: -7, -1: 1, -2: x, -3: y}`.
    pub(crate) fn es256_cose(point: &[u8]) -> Vec<u8> {
        let mut out = vec![0xa5, 0x01, 0x02, 0x03, 0x26, 0x20, 0x01, 0x21, 0x58, 32];
        out.extend_from_slice(&point[1..33]);
        out.extend_from_slice(&[0x22, 0x58, 32]);
        out.extend_from_slice(&point[33..65]);
        out
    }

    #[test]
    fn an_es256_key_verifies_its_own_signature_and_no_other() {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_ASN1_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        let key = CoseKey::parse(&es256_cose(pair.public_key().as_ref())).unwrap();
        assert_eq!(key.algorithm, ES256);
        let sig = pair.sign(&rng, b"approve").unwrap();
        assert!(key.verifies(b"approve", sig.as_ref()));
        assert!(!key.verifies(b"approve!", sig.as_ref()));
    }

    #[test]
    fn an_ed25519_key_verifies_its_own_signature() {
        let rng = SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        // {1: 1, 3: -8, -1: 6, -2: x}
        let mut cose = vec![0xa4, 0x01, 0x01, 0x03, 0x27, 0x20, 0x06, 0x21, 0x58, 32];
        cose.extend_from_slice(pair.public_key().as_ref());
        let key = CoseKey::parse(&cose).unwrap();
        assert_eq!(key.algorithm_name(), "EdDSA");
        let sig = pair.sign(b"m");
        assert!(key.verifies(b"m", sig.as_ref()));
        assert!(!key.verifies(b"n", sig.as_ref()));
    }

    #[test]
    fn keys_of_other_curves_algorithms_or_sizes_are_refused_naming_why() {
        // ES256 on curve 2 (P-384).
        let mut p384 = es256_cose(&[4; 65]);
        p384[6] = 0x02;
        assert!(CoseKey::parse(&p384).unwrap_err().contains("crv 2"));
        // ES384 (-35).
        let mut es384 = es256_cose(&[4; 65]);
        es384[4] = 0x38;
        es384.insert(5, 0x22);
        assert!(CoseKey::parse(&es384).unwrap_err().contains("not accepted"));
        // A short x.
        let short = [
            0xa5, 0x01, 0x02, 0x03, 0x26, 0x20, 0x01, 0x21, 0x41, 0, 0x22, 0x41, 0,
        ];
        assert!(CoseKey::parse(&short).unwrap_err().contains("32 bytes"));
        assert!(CoseKey::parse(&[0xa0]).unwrap_err().contains("label 1"));
    }
}
