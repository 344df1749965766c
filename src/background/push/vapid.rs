//! The broker's VAPID identity (RFC 8292): an ECDSA P-256 key pair that push services see on
//! every request, as `Authorization: vapid t=<JWT>, k=<public key>`. Browsers bind a
//! subscription to the public key the page subscribed with, so the key is generated once, kept
//! in a file readable by this user only (beside a SQLite database, or where `--push-vapid-key`
//! says), and reused; a new key orphans every subscription (docs/notifications.md: rotation).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD as B64};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};

use crate::error::{Error, Result};

const KEY_FIELD: &str = "--push-vapid-key";
/// How long a token is good for: RFC 8292 allows at most 24 hours; push services refuse more.
pub const TOKEN_LIFETIME_SECS: i64 = 12 * 3600;

/// The signing key and its public half (65 bytes, uncompressed), as the page's
/// `applicationServerKey` and the `k=` parameter carry it.
pub struct Vapid {
    pair: EcdsaKeyPair,
    rng: SystemRandom,
}

impl std::fmt::Debug for Vapid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vapid")
            .field("public_key", &self.public_key_b64())
            .finish_non_exhaustive()
    }
}

/// The key file generated for a SQLite database: `<database>.vapid-key.pem`.
pub fn beside(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(".vapid-key.pem");
    PathBuf::from(name)
}

impl Vapid {
    /// Reads a PKCS#8 `PRIVATE KEY` PEM holding a P-256 key (what the broker generates; from
    /// OpenSSL: `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid(KEY_FIELD, format!("cannot read {}: {e}", path.display()))
        })?;
        let der = unpem(&text).ok_or_else(|| {
            Error::invalid(
                KEY_FIELD,
                format!("{} holds no PRIVATE KEY PEM block", path.display()),
            )
        })?;
        Self::from_pkcs8(&der).map_err(|e| {
            Error::invalid(
                KEY_FIELD,
                format!("{} is not a P-256 PKCS#8 key: {e}", path.display()),
            )
        })
    }

    /// Loads `path`, or creates it with a new key (mode 0600) if it does not exist.
    pub fn load_or_create(path: &Path) -> Result<Self> {
        if path.exists() {
            return Self::load(path);
        }
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| Error::Internal("cannot generate a VAPID key".into()))?;
        let written = crate::private_files::new_private_file()
            .open(path)
            .and_then(|mut file| {
                file.write_all(pem(pkcs8.as_ref()).as_bytes())?;
                file.sync_all()
            });
        written.map_err(|e| {
            Error::invalid(KEY_FIELD, format!("cannot create {}: {e}", path.display()))
        })?;
        tracing::info!(path = %path.display(), "generated the Web Push (VAPID) key");
        Self::load(path)
    }

    pub fn from_pkcs8(der: &[u8]) -> std::result::Result<Self, String> {
        let rng = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der, &rng)
            .map_err(|e| e.to_string())?;
        Ok(Self { pair, rng })
    }

    /// The public key, uncompressed (65 bytes).
    pub fn public_key(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    /// The public key in base64url without padding: the page's `applicationServerKey`.
    pub fn public_key_b64(&self) -> String {
        B64.encode(self.public_key())
    }

    /// The JWT (ES256) for requests to `audience` (the push endpoint's origin), good until
    /// `now + TOKEN_LIFETIME_SECS`, naming `subject` (a `mailto:` or `https:` contact).
    pub fn token(&self, audience: &str, subject: &str, now_secs: i64) -> Result<String> {
        let header = B64.encode(br#"{"typ":"JWT","alg":"ES256"}"#);
        let claims = serde_json::json!({
            "aud": audience,
            "exp": now_secs + TOKEN_LIFETIME_SECS,
            "sub": subject,
        });
        let claims = B64.encode(claims.to_string());
        let signing_input = format!("{header}.{claims}");
        let signature = self
            .pair
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|_| Error::Internal("cannot sign the VAPID token".into()))?;
        Ok(format!(
            "{signing_input}.{}",
            B64.encode(signature.as_ref())
        ))
    }

    /// The `Authorization` header's value for a request to `audience`.
    pub fn authorization(&self, audience: &str, subject: &str, now_secs: i64) -> Result<String> {
        Ok(format!(
            "vapid t={}, k={}",
            self.token(audience, subject, now_secs)?,
            self.public_key_b64()
        ))
    }
}

fn pem(der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let mut out = String::from("-----BEGIN PRIVATE KEY-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str("-----END PRIVATE KEY-----\n");
    out
}

fn unpem(text: &str) -> Option<Vec<u8>> {
    let begin = "-----BEGIN PRIVATE KEY-----";
    let start = text.find(begin)? + begin.len();
    let stop = text[start..].find("-----END PRIVATE KEY-----")? + start;
    let body: String = text[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    STANDARD.decode(body).ok()
}

#[cfg(test)]
mod tests {
    use ring::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};

    use super::*;

    #[test]
    fn the_token_verifies_with_the_public_key_and_says_audience_expiry_and_subject() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db.vapid-key.pem");
        let vapid = Vapid::load_or_create(&path).unwrap();
        let header = vapid
            .authorization("https://push.example.net", "mailto:ops@example.com", 1_000)
            .unwrap();
        let rest = header.strip_prefix("vapid t=").unwrap();
        let (token, k) = rest.split_once(", k=").unwrap();
        assert_eq!(B64.decode(k).unwrap(), vapid.public_key());
        assert_eq!(vapid.public_key().len(), 65);

        let (signing_input, signature) = token.rsplit_once('.').unwrap();
        let signature = B64.decode(signature).unwrap();
        assert_eq!(signature.len(), 64, "ES256 in JWS is r || s, 64 bytes");
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, B64.decode(k).unwrap())
            .verify(signing_input.as_bytes(), &signature)
            .expect("the token verifies with k");
        let mut forged = signing_input.as_bytes().to_vec();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        assert!(
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, vapid.public_key())
                .verify(&forged, &signature)
                .is_err()
        );

        let (head, claims) = signing_input.split_once('.').unwrap();
        let head: serde_json::Value = serde_json::from_slice(&B64.decode(head).unwrap()).unwrap();
        assert_eq!(head["alg"], "ES256");
        let claims: serde_json::Value =
            serde_json::from_slice(&B64.decode(claims).unwrap()).unwrap();
        assert_eq!(claims["aud"], "https://push.example.net");
        assert_eq!(claims["sub"], "mailto:ops@example.com");
        let exp = claims["exp"].as_i64().unwrap();
        assert!(exp > 1_000 && exp <= 1_000 + 24 * 3600, "{exp}");

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let again = Vapid::load_or_create(&path).unwrap();
        assert_eq!(again.public_key(), vapid.public_key(), "the key is kept");
    }

    #[test]
    fn a_file_that_is_no_key_is_refused_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.pem");
        std::fs::write(&path, "nope").unwrap();
        let err = Vapid::load(&path).unwrap_err().to_string();
        assert!(err.starts_with("--push-vapid-key:"), "{err}");
    }
}
