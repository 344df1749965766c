//! The keys a verifier trusts, so that a chain signed across key rotations verifies in one run:
//! every receipt names its key (`keyid`, the SHA-256 of the raw public key) and is checked with
//! that key, which must have been valid when the receipt's outcome was decided, if the key set
//! says when it was.
//!
//! A key set is read from `--key` values (each a file or the key itself), one key or several:
//! `PUBLIC KEY` PEM blocks, and lines of base64 (the 32 raw bytes, as the broker prints and
//! serves a key), a line optionally followed by `from=<RFC 3339>` and `until=<RFC 3339>`, the
//! key's validity window (`from` included, `until` excluded). Blank lines and lines starting with
//! `#` are comments.

use std::time::SystemTime;

use super::PublicKey;
use crate::error::{Error, Result};

/// One trusted key, and when it signed receipts, if the key set says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedKey {
    pub key: PublicKey,
    pub key_id: String,
    pub from: Option<SystemTime>,
    pub until: Option<SystemTime>,
}

impl TrustedKey {
    /// A key trusted whenever it signed (no window).
    pub fn new(key: PublicKey) -> Self {
        Self {
            key_id: key.key_id(),
            key,
            from: None,
            until: None,
        }
    }

    /// Why a receipt decided at `decided_at` (RFC 3339, as receipts write it) may not be signed
    /// by this key, if it may not: outside the key's window, or with no time to judge by.
    pub fn refuses(&self, decided_at: Option<&str>) -> Option<String> {
        if self.from.is_none() && self.until.is_none() {
            return None;
        }
        let Some(at) = decided_at.and_then(|t| humantime::parse_rfc3339_weak(t).ok()) else {
            return Some(format!(
                "key {} has a validity window, and the receipt has no decision time to judge by",
                self.key_id
            ));
        };
        let before = self.from.is_some_and(|from| at < from);
        let after = self.until.is_some_and(|until| at >= until);
        (before || after).then(|| {
            format!(
                "decided at {} but signed with key {}, valid {}",
                decided_at.unwrap_or_default(),
                self.key_id,
                self.window()
            )
        })
    }

    fn window(&self) -> String {
        let at = |t: Option<SystemTime>| t.map(|t| humantime::format_rfc3339(t).to_string());
        match (at(self.from), at(self.until)) {
            (Some(from), Some(until)) => format!("from {from} until {until}"),
            (Some(from), None) => format!("from {from}"),
            (None, Some(until)) => format!("until {until}"),
            (None, None) => "always".into(),
        }
    }
}

/// The keys a verifier trusts, each once, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySet {
    keys: Vec<TrustedKey>,
}

impl KeySet {
    /// The key set `values` name: each `--key` value is a file holding keys, or keys itself.
    pub fn from_values(values: &[String]) -> Result<Self> {
        let mut set = Self::default();
        for value in values {
            let text = match std::fs::read_to_string(value) {
                Ok(text) => text,
                Err(_) => value.clone(),
            };
            set.read(&text)?;
        }
        if set.keys.is_empty() {
            return Err(Error::invalid("--key", "names no key"));
        }
        Ok(set)
    }

    /// Adds the keys in `text` (see the module's doc).
    pub fn read(&mut self, text: &str) -> Result<()> {
        let mut rest = text;
        while !rest.trim().is_empty() {
            let line_end = rest.find('\n').map_or(rest.len(), |i| i + 1);
            let line = rest[..line_end].trim();
            if line.starts_with("-----BEGIN") {
                let end = "-----END PUBLIC KEY-----";
                let stop = rest
                    .find(end)
                    .ok_or_else(|| Error::invalid("key", "a PEM block has no END line"))?;
                self.add(TrustedKey::new(PublicKey::parse(
                    &rest[..stop + end.len()],
                )?))?;
                rest = &rest[stop + end.len()..];
                continue;
            }
            rest = &rest[line_end..];
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let mut key = TrustedKey::new(PublicKey::parse(words.next().unwrap_or_default())?);
            for word in words {
                let (name, at) = word.split_once('=').unwrap_or((word, ""));
                let at = humantime::parse_rfc3339_weak(at).map_err(|e| {
                    Error::invalid(
                        "key",
                        format!("`{word}` is not `{name}=<RFC 3339 time>`: {e}"),
                    )
                });
                match name {
                    "from" => key.from = Some(at?),
                    "until" => key.until = Some(at?),
                    _ => {
                        return Err(Error::invalid(
                            "key",
                            format!("`{word}`: after a key, only `from=` and `until=` may follow"),
                        ));
                    }
                }
            }
            self.add(key)?;
        }
        Ok(())
    }

    /// The keys a broker serves (`ListReceiptKeys`) and checks its receipts with: `current`
    /// first, then the `retired` ones, newest first (by `until`, then `from`; those with no
    /// window last). The current key's `from` is the one a line of `retired` naming it gives,
    /// else the latest `until` of the retired keys (it took over then), else unknown. `None`
    /// current: no receipts are signed, and no key is served.
    pub fn of_broker(current: Option<PublicKey>, retired: &KeySet) -> Self {
        let Some(current) = current else {
            return Self::default();
        };
        let named = retired.by_id(&current.key_id());
        let mut older: Vec<TrustedKey> = retired
            .keys
            .iter()
            .filter(|k| k.key != current)
            .cloned()
            .collect();
        older.sort_by_key(|k| std::cmp::Reverse((k.until, k.from)));
        let mut head = TrustedKey::new(current);
        head.from = named
            .and_then(|k| k.from)
            .or_else(|| older.iter().filter_map(|k| k.until).max());
        let mut keys = vec![head];
        keys.extend(older);
        Self { keys }
    }

    /// Reads a key file (`--receipt-retired-keys`): the format of the module's doc, possibly
    /// naming no key at all (a broker that never rotated).
    pub fn from_file(setting: &str, path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::invalid(setting, format!("cannot read {}: {e}", path.display())))?;
        let mut set = Self::default();
        set.read(&text)
            .map_err(|e| Error::invalid(setting, format!("{}: {e}", path.display())))?;
        Ok(set)
    }

    /// Adds one key; the same key twice is one key, unless its windows differ.
    pub fn add(&mut self, key: TrustedKey) -> Result<()> {
        match self.keys.iter().find(|k| k.key_id == key.key_id) {
            None => self.keys.push(key),
            // The same key named twice (a file and the broker's reply, say) is one key, unless
            // the two say different things about when it was valid.
            Some(known) if known.from == key.from && known.until == key.until => {}
            Some(_) => {
                return Err(Error::invalid(
                    "key",
                    format!("key {} is given twice with different validity", key.key_id),
                ));
            }
        }
        Ok(())
    }

    pub fn keys(&self) -> &[TrustedKey] {
        &self.keys
    }
}

impl From<PublicKey> for KeySet {
    fn from(key: PublicKey) -> Self {
        Self {
            keys: vec![TrustedKey::new(key)],
        }
    }
}

/// What [`super::verify`] checks signatures against: one key (the broker's own) or a key set.
pub trait Keys {
    /// The trusted key whose id is `key_id`.
    fn by_id(&self, key_id: &str) -> Option<TrustedKey>;
    /// Every trusted key, for a signature that names none the verifier knows.
    fn all(&self) -> Vec<TrustedKey>;
}

impl Keys for PublicKey {
    fn by_id(&self, key_id: &str) -> Option<TrustedKey> {
        (self.key_id() == key_id).then(|| TrustedKey::new(*self))
    }

    fn all(&self) -> Vec<TrustedKey> {
        vec![TrustedKey::new(*self)]
    }
}

impl Keys for KeySet {
    fn by_id(&self, key_id: &str) -> Option<TrustedKey> {
        self.keys.iter().find(|k| k.key_id == key_id).cloned()
    }

    fn all(&self) -> Vec<TrustedKey> {
        self.keys.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receipts::Notary;

    fn key(seed: u8) -> PublicKey {
        *Notary::from_seed(&[seed; 32]).unwrap().public_key()
    }

    #[test]
    fn a_key_set_reads_pem_blocks_and_base64_lines_with_their_windows() {
        let text = format!(
            "# retired on 2026-06-01\n{} until=2026-06-01T00:00:00Z\n\n{}\n{} from=2026-06-01T00:00:00Z\n",
            key(1).to_base64(),
            key(2).to_pem(),
            key(3).to_base64(),
        );
        let mut set = KeySet::default();
        set.read(&text).unwrap();
        let ids: Vec<&str> = set.keys().iter().map(|k| k.key_id.as_str()).collect();
        assert_eq!(ids, [key(1).key_id(), key(2).key_id(), key(3).key_id()]);
        let old = set.by_id(&key(1).key_id()).unwrap();
        assert!(old.refuses(Some("2026-05-31T23:59:59.999999Z")).is_none());
        let why = old.refuses(Some("2026-06-01T00:00:00.000000Z")).unwrap();
        assert!(why.contains("valid until 2026-06-01T00:00:00Z"), "{why}");
        assert!(set.by_id(&key(2).key_id()).unwrap().refuses(None).is_none());
        let new = set.by_id(&key(3).key_id()).unwrap();
        assert!(new.refuses(Some("2026-05-01T00:00:00Z")).is_some());
        assert!(new.refuses(None).is_some(), "no time, no judging a window");
    }

    #[test]
    fn a_key_given_twice_is_one_key_and_nonsense_is_refused() {
        let mut set = KeySet::default();
        set.read(&key(1).to_base64()).unwrap();
        set.read(&key(1).to_pem()).unwrap();
        assert_eq!(set.keys().len(), 1);
        let twice = format!("{0}\n{0} until=2026-01-01T00:00:00Z", key(1).to_base64());
        assert!(KeySet::default().read(&twice).is_err());
        let bad = format!("{} since=2026-01-01T00:00:00Z", key(1).to_base64());
        assert!(KeySet::default().read(&bad).is_err());
        assert!(KeySet::default().read("not a key").is_err());
        assert!(KeySet::from_values(&["# nothing\n".into()]).is_err());
    }
}
