//! Signed approval links (issue 49, docs/answers.md): a URL for an email or any notifier that
//! opens one call in the inbox, after sign-in. The broker signs the call's identity and an
//! expiry with an HMAC-SHA256 key of its own, kept like the receipt key (a 0600 file beside a
//! SQLite database, generated at first start, or `--link-key`); the inbox hands the link back
//! (`OpenCallLink`) and is told which call to show, once the signature, the expiry and the
//! reader's right to see the call hold.
//!
//! What a link must never do: decide anything. It names a call; deciding it takes a signed-in
//! person and the gate, exactly as without a link. A link that is forged, expired, or signed
//! for another call is refused.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use hmac::{KeyInit, Mac};

use crate::domain::{AgentId, CallId, CallKey, SessionId, Timestamp};
use crate::error::{Error, Result};

type HmacSha256 = hmac::Hmac<sha2_hmac::Sha256>;

/// What a link signs, before the call's identity: so a link's MAC is never one over anything else.
const CONTEXT: &str = "approval-broker call link v1";
const KEY_BYTES: usize = 32;
/// The setting a key error names.
const KEY_FIELD: &str = "--link-key";

/// The `--link-*` settings (docs/answers.md, "Signed approval links").
#[derive(Debug, Clone, clap::Args)]
pub struct LinkFlags {
    /// The key approval links are signed with (HMAC-SHA256): a file of 32 random bytes
    /// (`head -c 32 /dev/urandom > link-key`, mode 0600). Default with SQLite: `<database
    /// file>.link-key`, created (mode 0600) on first start. Every replica of a Postgres broker
    /// must be given the same one; without it a Postgres broker makes no links. A new key
    /// voids every link made before.
    #[arg(long, env = "APPROVALS_LINK_KEY")]
    pub link_key: Option<PathBuf>,

    /// How long a link opens its call: links made by `CreateCallLink` (and carried by webhooks)
    /// are refused after this.
    #[arg(long, env = "APPROVALS_LINK_LIFETIME", default_value = "24h", value_parser = crate::domain::time::parse_duration)]
    pub link_lifetime: std::time::Duration,
}

impl LinkFlags {
    /// The key, as the settings and the database say: given, beside a SQLite database
    /// (`sqlite_file`), or none.
    pub fn key(&self, sqlite_file: Option<&Path>) -> Result<Option<LinkKey>> {
        match (&self.link_key, sqlite_file) {
            (Some(path), _) => LinkKey::load(path).map(Some),
            (None, Some(database)) => LinkKey::load_or_create(&LinkKey::beside(database)).map(Some),
            (None, None) => Ok(None),
        }
    }
}

/// The key links are signed with.
pub struct LinkKey {
    key: [u8; KEY_BYTES],
}

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKey(..)")
    }
}

/// A link's parts, as the inbox hands them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallLink {
    pub call: CallKey,
    /// Unix seconds after which the link is refused.
    pub expires: i64,
    pub signature: String,
}

impl LinkKey {
    /// The key file beside a SQLite database: `<database>.link-key`.
    pub fn beside(database: &Path) -> PathBuf {
        let mut name = database.as_os_str().to_owned();
        name.push(".link-key");
        PathBuf::from(name)
    }

    /// The key in `path`, created there (mode 0600, 32 random bytes) if the file is missing.
    pub fn load_or_create(path: &Path) -> Result<Self> {
        match crate::private_files::new_private_file().open(path) {
            Ok(mut file) => {
                let mut key = [0u8; KEY_BYTES];
                ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
                    .map_err(|_| Error::Internal("no randomness for the link key".into()))?;
                file.write_all(&key)
                    .and_then(|()| file.sync_all())
                    .map_err(|e| key_error(path, e))?;
                tracing::info!(path = %path.display(), "generated the key approval links are signed with");
                Ok(Self { key })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Self::load(path),
            Err(e) => Err(key_error(path, e)),
        }
    }

    /// The key in `path`: exactly 32 bytes.
    pub fn load(path: &Path) -> Result<Self> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| key_error(path, e))?;
        crate::private_files::warn_if_shared([path]);
        let key: [u8; KEY_BYTES] = bytes.try_into().map_err(|b: Vec<u8>| {
            Error::invalid(
                KEY_FIELD,
                format!(
                    "{} must hold exactly {KEY_BYTES} bytes, holds {}",
                    path.display(),
                    b.len()
                ),
            )
        })?;
        Ok(Self { key })
    }

    #[cfg(test)]
    fn of(key: [u8; KEY_BYTES]) -> Self {
        Self { key }
    }

    fn mac(&self, call: &CallKey, expires: i64) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.key).expect("any key length");
        // Each part's length first, so no two (agent, session, call, expiry) sign the same bytes.
        for part in [
            CONTEXT,
            call.agent.as_str(),
            call.session.as_str(),
            call.call_id.as_str(),
            &expires.to_string(),
        ] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }

    /// A link to `call` that expires at `expires`.
    pub fn sign(&self, call: &CallKey, expires: Timestamp) -> CallLink {
        let expires = expires.as_micros().div_euclid(1_000_000);
        let signature = BASE64URL.encode(self.mac(call, expires).finalize().into_bytes());
        CallLink {
            call: call.clone(),
            expires,
            signature,
        }
    }

    /// The link's call, if it was signed with this key for that call and has not expired.
    pub fn check(&self, link: &CallLink, now: Timestamp) -> Result<CallKey> {
        let given = BASE64URL.decode(&link.signature).map_err(|_| forged())?;
        // Constant time, by the MAC's own comparison.
        self.mac(&link.call, link.expires)
            .verify_slice(&given)
            .map_err(|_| forged())?;
        // To the microsecond: expired as soon as its second has passed, not a second later.
        if now.as_micros() > link.expires.saturating_mul(1_000_000) {
            return Err(Error::FailedPrecondition(
                "the link has expired: open the inbox and find the call there, or ask for a new \
                 link"
                    .into(),
            ));
        }
        Ok(link.call.clone())
    }
}

fn forged() -> Error {
    Error::PermissionDenied(
        "the link's signature does not verify: it was changed, made for another call, or signed \
         by another broker"
            .into(),
    )
}

fn key_error(path: &Path, e: std::io::Error) -> Error {
    Error::invalid(KEY_FIELD, format!("{}: {e}", path.display()))
}

impl CallLink {
    /// The inbox URL of this link: `<base>/#link=<agent>/<session>/<call>/<expires>/<signature>`,
    /// each part percent-encoded. The fragment never reaches a server's logs.
    pub fn url(&self, base: &str) -> String {
        format!("{}/#link={}", base.trim_end_matches('/'), self.token())
    }

    /// The link's parts as one text, as the inbox hands it to `OpenCallLink`.
    pub fn token(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            percent(self.call.agent.as_str()),
            percent(self.call.session.as_str()),
            percent(self.call.call_id.as_str()),
            self.expires,
            self.signature
        )
    }

    /// Reads a token; errors name `field`.
    pub fn parse(field: &str, token: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(
                field,
                "is not a call link (agent/session/call/expires/signature)",
            )
        };
        let parts: Vec<&str> = token.split('/').collect();
        let [agent, session, call, expires, signature] = parts[..] else {
            return Err(bad());
        };
        let text = |s: &str| unpercent(s).ok_or_else(bad);
        Ok(Self {
            call: CallKey {
                agent: AgentId::parse(&format!("{field}.agent"), text(agent)?)?,
                session: SessionId::parse(&format!("{field}.session"), text(session)?)?,
                call_id: CallId::parse(&format!("{field}.call"), text(call)?)?,
            },
            expires: expires.parse().map_err(|_| bad())?,
            signature: signature.to_owned(),
        })
    }
}

fn percent(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn unpercent(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(call: &str) -> CallKey {
        CallKey {
            agent: AgentId::from_stored("build-bot".into()),
            session: SessionId::from_stored("s 1/é".into()),
            call_id: CallId::from_stored(call.into()),
        }
    }

    #[test]
    fn a_link_opens_its_call_until_it_expires_and_never_another() {
        let signer = LinkKey::of([7; KEY_BYTES]);
        let now = Timestamp::from_micros(1_800_000_000_000_000);
        let later = now.saturating_add(std::time::Duration::from_secs(3600));
        let link = signer.sign(&key("c1"), later);
        // Through its text and back.
        let read = CallLink::parse("link", &link.token()).unwrap();
        assert_eq!(read, link);
        assert!(
            link.url("https://approvals.example.com/")
                .starts_with("https://approvals.example.com/#link=build-bot/s%201%2F%C3%A9/c1/")
        );
        assert_eq!(signer.check(&read, now).unwrap(), key("c1"));
        // Valid to its second, expired a microsecond after it (not a whole second later).
        assert_eq!(signer.check(&read, later).unwrap(), key("c1"));
        let after = later.saturating_add(std::time::Duration::from_micros(1));
        let err = signer.check(&read, after).unwrap_err();
        assert!(err.to_string().contains("expired"), "{err}");
        // For another call, with a longer life, or signed by another key: forged.
        let other = CallLink {
            call: key("c2"),
            ..link.clone()
        };
        let longer = CallLink {
            expires: link.expires + 86_400,
            ..link.clone()
        };
        let elsewhere = LinkKey::of([8; KEY_BYTES]);
        for (what, result) in [
            ("another call", signer.check(&other, now)),
            ("a longer life", signer.check(&longer, now)),
            ("another key", elsewhere.check(&link, now)),
            (
                "no signature",
                signer.check(
                    &CallLink {
                        signature: String::new(),
                        ..link.clone()
                    },
                    now,
                ),
            ),
        ] {
            let err = result.unwrap_err();
            assert_eq!(err.code(), tonic::Code::PermissionDenied, "{what}");
        }
        assert!(CallLink::parse("link", "a/b/c").is_err());
    }

    #[test]
    fn a_key_file_is_made_private_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = LinkKey::beside(&dir.path().join("approvals.db"));
        let first = LinkKey::load_or_create(&path).unwrap();
        let again = LinkKey::load_or_create(&path).unwrap();
        assert_eq!(first.key, again.key);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(&path, b"short").unwrap();
        assert!(LinkKey::load(&path).is_err());
    }
}
