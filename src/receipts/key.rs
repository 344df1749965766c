//! Where the signing key comes from: the operator's `--receipt-key` file, or, with SQLite and no
//! key given, one generated next to the database on first start (mode 0600) and reused after.
//! Postgres replicas must share one key, so there the operator gives it; without one, `auto`
//! leaves receipts off and says so, and `on` refuses to start.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::rand::{SecureRandom as _, SystemRandom};
use ring::signature::Ed25519KeyPair;

use super::Notary;
use crate::error::{Error, Result};

const KEY_FIELD: &str = "--receipt-key";

/// Whether receipts are signed (`--receipts`): `auto` (on with SQLite, and with Postgres when a
/// key is given), `on` (refuse to start without a key), `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiptsMode {
    Auto,
    On,
    Off,
}

impl std::str::FromStr for ReceiptsMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ReceiptsMode::Auto),
            "on" => Ok(ReceiptsMode::On),
            "off" => Ok(ReceiptsMode::Off),
            other => Err(format!("expected `auto`, `on` or `off`, got `{other}`")),
        }
    }
}

/// The DER of an Ed25519 PKCS#8 v1 private key (RFC 8410) up to its 32-byte seed.
const PKCS8_V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// Where a key is kept when none is given: beside a SQLite database's file, generated there on
/// first start; or nowhere, for a database replicas share (Postgres), whose operator gives it.
#[derive(Debug, Clone, Copy)]
pub enum KeyHome<'a> {
    BesideFile(&'a Path),
    Shared,
}

/// The notary receipts are signed with, as the settings and the database say: `None` when
/// receipts are off.
pub fn notary(mode: ReceiptsMode, key: Option<&Path>, home: KeyHome<'_>) -> Result<Option<Notary>> {
    if mode == ReceiptsMode::Off {
        return Ok(None);
    }
    let notary = match (key, home) {
        (Some(path), _) => load(path)?,
        (None, KeyHome::BesideFile(path)) => load_or_create(&beside(path))?,
        (None, KeyHome::Shared) if mode == ReceiptsMode::On => {
            return Err(Error::invalid(
                KEY_FIELD,
                "is required for receipts on Postgres: every replica must sign with the same key",
            ));
        }
        (None, KeyHome::Shared) => {
            tracing::warn!(
                "receipts are OFF: on Postgres the replicas' shared key must be given \
                 (--receipt-key / APPROVALS_RECEIPT_KEY)"
            );
            return Ok(None);
        }
    };
    let public = notary.public_key();
    tracing::info!(
        key_id = %public.key_id(),
        public_key = %public.to_base64(),
        "receipts on: every outcome is signed with this Ed25519 key"
    );
    Ok(Some(notary))
}

/// The key file generated for a SQLite database: `<database>.receipt-key.pem`.
pub fn beside(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(".receipt-key.pem");
    PathBuf::from(name)
}

/// Reads a PKCS#8 `PRIVATE KEY` PEM (what `openssl genpkey -algorithm ed25519` writes, or the
/// broker generated), or a file of exactly 32 bytes: a raw Ed25519 seed.
pub fn load(path: &Path) -> Result<Notary> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::invalid(KEY_FIELD, format!("cannot read {}: {e}", path.display())))?;
    if bytes.len() == 32 {
        let seed: [u8; 32] = bytes.try_into().expect("32 bytes");
        return Notary::from_seed(&seed);
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| not_a_key(path))?;
    let der = unpem("PRIVATE KEY", text).map_err(|_| not_a_key(path))?;
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| {
        Error::invalid(
            KEY_FIELD,
            format!("{} is not an Ed25519 PKCS#8 key: {e}", path.display()),
        )
    })?;
    Ok(Notary::from_pair(pair))
}

fn not_a_key(path: &Path) -> Error {
    Error::invalid(
        KEY_FIELD,
        format!(
            "{} holds neither a PKCS#8 PRIVATE KEY PEM nor a 32-byte Ed25519 seed",
            path.display()
        ),
    )
}

/// Loads `path`, or creates it with a new key (readable by this user only) if it does not exist.
fn load_or_create(path: &Path) -> Result<Notary> {
    if path.exists() {
        return load(path);
    }
    let mut seed = [0u8; 32];
    SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| Error::Internal("no randomness to generate a receipt key".into()))?;
    // PKCS#8 v1, as `openssl genpkey` writes it (OpenSSL 3.0 cannot read ring's v2), so
    // `openssl pkey -pubout` derives the public key from the file.
    let mut pkcs8 = PKCS8_V1_PREFIX.to_vec();
    pkcs8.extend_from_slice(&seed);
    let written = crate::private_files::new_private_file()
        .open(path)
        .and_then(|mut file| {
            file.write_all(pem("PRIVATE KEY", &pkcs8).as_bytes())?;
            file.sync_all()
        });
    written
        .map_err(|e| Error::invalid(KEY_FIELD, format!("cannot create {}: {e}", path.display())))?;
    tracing::info!(path = %path.display(), "generated the receipt signing key");
    load(path)
}

/// `der` as a PEM block labelled `label`.
pub(super) fn pem(label: &str, der: &[u8]) -> String {
    let body = BASE64.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The DER inside the first PEM block labelled `label` in `text`.
pub(super) fn unpem(label: &str, text: &str) -> Result<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let bad = || Error::invalid("key", format!("is not a {label} PEM"));
    let start = text.find(&begin).ok_or_else(bad)? + begin.len();
    let stop = text[start..].find(&end).ok_or_else(bad)? + start;
    let body: String = text[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    BASE64.decode(body).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_is_private_to_its_user_and_the_same_key_on_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db.receipt-key.pem");
        let first = load_or_create(&path).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let again = load_or_create(&path).unwrap();
        assert_eq!(first.public_key(), again.public_key());
    }

    #[test]
    fn an_openssl_pkcs8_key_and_a_raw_seed_both_load() {
        // `openssl genpkey -algorithm ed25519` (PKCS#8 v1, no public key inside).
        let pem_text = "-----BEGIN PRIVATE KEY-----\n\
            MC4CAQAwBQYDK2VwBCIEIGl3fE5TTcjNnSQRTXkIejEeCNMbUNzIGY+iu8ygJGeR\n\
            -----END PRIVATE KEY-----\n";
        let dir = tempfile::tempdir().unwrap();
        let pem_path = dir.path().join("key.pem");
        std::fs::write(&pem_path, pem_text).unwrap();
        let from_pem = load(&pem_path).unwrap();
        let der = unpem("PRIVATE KEY", pem_text).unwrap();
        let seed: [u8; 32] = der[der.len() - 32..].try_into().unwrap();
        let seed_path = dir.path().join("key.seed");
        std::fs::write(&seed_path, seed).unwrap();
        assert_eq!(
            from_pem.public_key(),
            load(&seed_path).unwrap().public_key()
        );
    }

    #[test]
    fn a_file_that_is_no_key_is_refused_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        std::fs::write(&path, "not a key").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.starts_with("--receipt-key:"), "{err}");
    }

    #[test]
    fn a_public_key_reads_back_from_its_pem_and_its_base64() {
        let notary = Notary::from_seed(&[7; 32]).unwrap();
        let key = notary.public_key();
        assert_eq!(super::super::PublicKey::parse(&key.to_pem()).unwrap(), *key);
        assert_eq!(
            super::super::PublicKey::parse(&key.to_base64()).unwrap(),
            *key
        );
    }
}
