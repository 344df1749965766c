//! Slack's request signature: `X-Slack-Signature: v0=<hex HMAC-SHA256>` over
//! `v0:<X-Slack-Request-Timestamp>:<raw body>`, keyed by the app's signing secret. A request is
//! taken only when the signature verifies (ring's constant-time comparison), its timestamp is
//! within five minutes of the broker's clock, and the same signature was not already taken
//! within that window (a captured click replayed is refused, not applied twice). Nothing here
//! decides a call: it only says whether the request came from Slack.

use std::collections::HashMap;
use std::sync::Mutex;

use ring::hmac;

/// How far a request's timestamp may be from now, either way (Slack's documented window).
pub const WINDOW_SECS: i64 = 5 * 60;

/// The most signatures remembered; a flood beyond it is refused rather than forgotten (a
/// forgotten signature could be replayed).
const MAX_REMEMBERED: usize = 100_000;

/// Why a request was refused (told to the sender in a fixed text, and logged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    MissingHeaders,
    Stale,
    BadSignature,
    Replayed,
    TooMany,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::MissingHeaders => {
                "the request carries no X-Slack-Signature and X-Slack-Request-Timestamp"
            }
            Refusal::Stale => "the request's timestamp is more than five minutes from now",
            Refusal::BadSignature => "the request's signature does not verify",
            Refusal::Replayed => "this signed request was already received",
            Refusal::TooMany => "too many signed requests within five minutes",
        })
    }
}

/// Verifies requests signed with one signing secret, remembering the signatures it took.
pub struct Verifier {
    key: hmac::Key,
    /// Signatures taken, with their timestamps, for [`WINDOW_SECS`].
    seen: Mutex<HashMap<String, i64>>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verifier { .. }")
    }
}

/// The `v0=` signature of `body` sent at `timestamp`: what Slack computes (tests sign with it).
pub fn sign(secret: &str, timestamp: &str, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let tag = hmac::sign(&key, &base_string(timestamp, body));
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("v0={hex}")
}

fn base_string(timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut base = Vec::with_capacity(body.len() + timestamp.len() + 4);
    base.extend_from_slice(b"v0:");
    base.extend_from_slice(timestamp.as_bytes());
    base.push(b':');
    base.extend_from_slice(body);
    base
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Verifier {
    pub fn new(signing_secret: &str) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, signing_secret.as_bytes()),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a request (its two headers and raw body) at `now` (Unix seconds), or says why not.
    pub fn verify(
        &self,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<(), Refusal> {
        let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
            return Err(Refusal::MissingHeaders);
        };
        let sent: i64 = timestamp.trim().parse().map_err(|_| Refusal::Stale)?;
        if (now - sent).abs() > WINDOW_SECS {
            return Err(Refusal::Stale);
        }
        let tag = signature
            .strip_prefix("v0=")
            .and_then(decode_hex)
            .ok_or(Refusal::BadSignature)?;
        hmac::verify(&self.key, &base_string(timestamp, body), &tag)
            .map_err(|_| Refusal::BadSignature)?;
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.retain(|_, at| (now - *at).abs() <= WINDOW_SECS);
        if seen.contains_key(signature) {
            return Err(Refusal::Replayed);
        }
        if seen.len() >= MAX_REMEMBERED {
            return Err(Refusal::TooMany);
        }
        seen.insert(signature.to_owned(), sent);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of Slack's "Verifying requests from Slack" page.
    #[test]
    fn slacks_documented_example_verifies() {
        let secret = "8f742231b10e8888abcd99yyyzzz85a5";
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        let expected = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
        assert_eq!(sign(secret, "1531420618", body), expected);
        let verifier = Verifier::new(secret);
        assert_eq!(
            verifier.verify(Some("1531420618"), Some(expected), body, 1531420618 + 10),
            Ok(())
        );
        assert_eq!(
            verifier.verify(Some("1531420618"), Some(expected), body, 1531420618 + 11),
            Err(Refusal::Replayed)
        );
    }

    #[test]
    fn forged_stale_and_unsigned_requests_are_refused() {
        let verifier = Verifier::new("secret");
        let now = 1_800_000_000;
        let ts = now.to_string();
        let good = sign("secret", &ts, b"payload=1");
        let forged = sign("other", &ts, b"payload=1");
        assert_eq!(
            verifier.verify(Some(&ts), Some(&forged), b"payload=1", now),
            Err(Refusal::BadSignature)
        );
        assert_eq!(
            verifier.verify(Some(&ts), Some(&good), b"payload=2", now),
            Err(Refusal::BadSignature)
        );
        assert_eq!(
            verifier.verify(Some(&ts), Some(&good), b"payload=1", now + WINDOW_SECS + 1),
            Err(Refusal::Stale)
        );
        assert_eq!(
            verifier.verify(None, Some(&good), b"payload=1", now),
            Err(Refusal::MissingHeaders)
        );
        assert_eq!(
            verifier.verify(Some(&ts), Some("v0=zz"), b"payload=1", now),
            Err(Refusal::BadSignature)
        );
        assert_eq!(
            verifier.verify(Some(&ts), Some(&good), b"payload=1", now),
            Ok(())
        );
    }
}
