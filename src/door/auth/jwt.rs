//! JWT bearer tokens from the organisation's identity provider, verified against its published
//! keys (JWKS), so approvers, admins and agents can be the people and service clients the
//! provider knows instead of lines in a token file.
//!
//! A token is accepted only when its signature verifies with a key the issuer published
//! (RS256, ES256 or EdDSA; never `none`, never a symmetric algorithm, whose "secret" would be
//! the public key), its `iss` is the configured issuer, its `aud` names the configured
//! audience (or, for people only, the inbox's OpenID client id: the ID tokens of people signed
//! in to the inbox), and `exp`/`nbf` hold within a small clock skew. Every refusal says which check
//! failed and never repeats the token. Who the caller is comes from the claims (see
//! [`ClaimMapping`]), canonicalised by [`Identity::parse`] like every identity.
//!
//! Keys are cached. A token signed by a key id the cache lacks makes the broker fetch the
//! JWKS again, at most once per `refetch_interval`, so forged tokens with made-up key ids
//! cannot make it hammer the provider; while the provider is unreachable, cached keys keep
//! verifying tokens until they expire, and a token with an unknown key id is refused, saying
//! the keys could not be fetched. Nothing here fails open. Verified tokens are remembered
//! (by their SHA-256, at most [`MAX_CACHED_TOKENS`]) until they expire, so each RPC after the
//! first costs a hash and a lookup.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, UnparsedPublicKey};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tonic::Status;

use super::Role;
use crate::domain::Identity;
use crate::domain::policy::group_name;

/// Verified tokens remembered at most; past it, expired ones are dropped, then all.
pub const MAX_CACHED_TOKENS: usize = 4096;
/// The longest token read at all (an RPC header; real ones are a few kilobytes).
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Where the issuer's keys come from: the JWKS document as text, or why it could not be had.
pub trait KeySource: Send + Sync {
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + '_>>;
    /// Where the keys come from, for logs and errors.
    fn describe(&self) -> String;
}

/// How claims become a caller (documented in docs/identity.md).
#[derive(Debug, Clone)]
pub struct ClaimMapping {
    /// The claim naming a person (`email` or `sub`).
    pub identity_claim: String,
    /// The claim naming a service client, for tokens whose role is `agent` (`client_id`,
    /// `azp`, `sub`).
    pub agent_claim: String,
    /// The claims whose values map to roles (`roles`, `groups`, `scope`...); a string value is
    /// read as space-separated values.
    pub role_claims: Vec<String>,
    /// Claim value → role. A token holding values of several roles gets the strongest
    /// (admin, approver, auditor, agent); a token holding none is refused.
    pub roles: Vec<(String, Role)>,
    /// The claim listing a person's approver groups.
    pub groups_claim: String,
}

impl ClaimMapping {
    /// Parses `ROLE=VALUE[,VALUE...]` entries separated by `;` (`admin=broker-admins;
    /// approver=approvers,security;agent=approval-agents`).
    pub fn parse_roles(text: &str) -> Result<Vec<(String, Role)>, String> {
        let mut roles = Vec::new();
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (role, values) = entry
                .split_once('=')
                .ok_or_else(|| format!("`{entry}` is not ROLE=VALUE[,VALUE]"))?;
            let role = Role::parse(role.trim()).ok_or_else(|| {
                format!(
                    "`{}`: a role is agent, approver, auditor or admin",
                    role.trim()
                )
            })?;
            for value in values.split(',').map(str::trim) {
                if value.is_empty() {
                    return Err(format!("`{entry}` names an empty value"));
                }
                if let Some((_, other)) = roles.iter().find(|(v, _)| v == value) {
                    return Err(format!(
                        "the value `{value}` is mapped twice (to {other} and to {role})"
                    ));
                }
                roles.push((value.to_owned(), role));
            }
        }
        if roles.is_empty() {
            return Err("maps no claim value to a role".to_owned());
        }
        Ok(roles)
    }
}

/// What the verifier needs to know about the issuer.
#[derive(Debug, Clone)]
pub struct Settings {
    pub issuer: String,
    pub audience: String,
    /// The inbox's OpenID client id (`--inbox-oidc-client-id`): a token whose `aud` names it
    /// (the ID token of a person signed in to the inbox) is accepted too, for a person only,
    /// never for an agent.
    pub person_audience: Option<String>,
    pub clock_skew: Duration,
    pub refetch_interval: Duration,
    pub claims: ClaimMapping,
}

/// Who a verified token says the caller is.
#[derive(Debug, Clone)]
pub struct Principal {
    pub role: Role,
    pub identity: Arc<str>,
    pub groups: Arc<[String]>,
}

/// A token the verifier would not take: UNAUTHENTICATED (it does not prove who sent it) or
/// PERMISSION_DENIED (it does, but names no role here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Unauthenticated(String),
    NoRole(String),
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Status {
        match refusal {
            Refusal::Unauthenticated(why) => Status::unauthenticated(why),
            Refusal::NoRole(why) => Status::permission_denied(why),
        }
    }
}

fn refused(why: impl Into<String>) -> Refusal {
    Refusal::Unauthenticated(format!("JWT refused: {}", why.into()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alg {
    Rs256,
    Es256,
    EdDsa,
}

impl Alg {
    fn name(self) -> &'static str {
        match self {
            Alg::Rs256 => "RS256",
            Alg::Es256 => "ES256",
            Alg::EdDsa => "EdDSA",
        }
    }
}

/// One published public key.
#[derive(Debug, Clone)]
enum Key {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// The uncompressed point, `04 || x || y`.
    P256(Vec<u8>),
    Ed25519(Vec<u8>),
}

impl Key {
    fn alg(&self) -> Alg {
        match self {
            Key::Rsa { .. } => Alg::Rs256,
            Key::P256(_) => Alg::Es256,
            Key::Ed25519(_) => Alg::EdDsa,
        }
    }

    fn verifies(&self, message: &[u8], sig: &[u8]) -> bool {
        match self {
            Key::Rsa { n, e } => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
                .is_ok(),
            Key::P256(point) => UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(message, sig)
                .is_ok(),
            Key::Ed25519(x) => UnparsedPublicKey::new(&signature::ED25519, x)
                .verify(message, sig)
                .is_ok(),
        }
    }
}

/// The keys of one JWKS document, by key id (keys without one under the empty id).
#[derive(Debug, Default)]
struct KeySet {
    keys: Vec<(String, Key)>,
}

impl KeySet {
    /// Parses a JWKS document; keys this verifier cannot use (encryption keys, other curves,
    /// symmetric keys) are skipped, and a document with no usable key is an error.
    fn parse(text: &str) -> Result<KeySet, String> {
        let doc: Value =
            serde_json::from_str(text).map_err(|e| format!("the JWKS is not JSON: {e}"))?;
        let keys = doc
            .get("keys")
            .and_then(Value::as_array)
            .ok_or("the JWKS has no `keys` array")?;
        let mut set = KeySet::default();
        for jwk in keys {
            let text = |name: &str| jwk.get(name).and_then(Value::as_str);
            if text("use").is_some_and(|u| u != "sig") {
                continue;
            }
            let bytes = |name: &str| text(name).and_then(|v| URL_SAFE_NO_PAD.decode(v).ok());
            let key = match (text("kty"), text("crv")) {
                (Some("RSA"), _) => match (bytes("n"), bytes("e")) {
                    (Some(n), Some(e)) => Key::Rsa { n, e },
                    _ => continue,
                },
                (Some("EC"), Some("P-256")) => match (bytes("x"), bytes("y")) {
                    (Some(x), Some(y)) if x.len() == 32 && y.len() == 32 => {
                        Key::P256([&[4u8][..], &x, &y].concat())
                    }
                    _ => continue,
                },
                (Some("OKP"), Some("Ed25519")) => match bytes("x") {
                    Some(x) if x.len() == 32 => Key::Ed25519(x),
                    _ => continue,
                },
                _ => continue,
            };
            // A key published for one algorithm is used for that one only.
            if text("alg").is_some_and(|alg| alg != key.alg().name()) {
                continue;
            }
            set.keys
                .push((text("kid").unwrap_or_default().to_owned(), key));
        }
        if set.keys.is_empty() {
            return Err("the JWKS holds no RS256, ES256 or EdDSA signing key".to_owned());
        }
        Ok(set)
    }

    /// The keys a token with this key id and algorithm may be checked with.
    fn candidates<'a>(&'a self, kid: Option<&'a str>, alg: Alg) -> impl Iterator<Item = &'a Key> {
        self.keys
            .iter()
            .filter(move |(id, key)| kid.is_none_or(|kid| kid == id) && key.alg() == alg)
            .map(|(_, key)| key)
    }

    fn knows(&self, kid: &str) -> bool {
        self.keys.iter().any(|(id, _)| id == kid)
    }
}

/// A token split and its header read; nothing verified yet.
struct Parts<'a> {
    signed: &'a str,
    payload: &'a str,
    signature: &'a str,
    alg: Alg,
    kid: Option<String>,
}

/// Reads a token's header: the algorithm must be one the verifier takes.
fn split(token: &str) -> Result<Parts<'_>, Refusal> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(refused("the token is longer than any this broker reads"));
    }
    let mut pieces = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (pieces.next(), pieces.next(), pieces.next(), pieces.next())
    else {
        return Err(refused("not a JWS compact token (three base64url parts)"));
    };
    let header: Value = URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| refused("its header is not base64url JSON"))?;
    let alg = match header.get("alg").and_then(Value::as_str) {
        Some("RS256") => Alg::Rs256,
        Some("ES256") => Alg::Es256,
        Some("EdDSA") => Alg::EdDsa,
        Some(none) if none.eq_ignore_ascii_case("none") => {
            return Err(refused("`alg: none` (an unsigned token) is never accepted"));
        }
        Some(hs) if hs.starts_with("HS") => {
            return Err(refused(
                "a symmetric algorithm (HS*) is never accepted: only the issuer's published \
                 public keys (RS256, ES256, EdDSA) verify tokens",
            ));
        }
        Some(_) => return Err(refused("its algorithm is not RS256, ES256 or EdDSA")),
        None => return Err(refused("its header names no algorithm")),
    };
    if header.get("crit").is_some() {
        return Err(refused(
            "its header has critical extensions this broker does not know",
        ));
    }
    let kid = header.get("kid").and_then(Value::as_str).map(str::to_owned);
    Ok(Parts {
        signed: &token[..token.len() - signature.len() - 1],
        payload,
        signature,
        alg,
        kid,
    })
}

/// What the last fetch of the keys did.
#[derive(Debug, Default)]
struct FetchState {
    last_attempt: Option<Instant>,
    last_error: Option<String>,
}

/// Verifies JWTs of one issuer (see the module doc).
pub struct Verifier {
    settings: Settings,
    source: Arc<dyn KeySource>,
    keys: RwLock<Arc<KeySet>>,
    state: Mutex<FetchState>,
    /// Held while fetching, so concurrent requests with a new key id cause one fetch.
    fetching: tokio::sync::Mutex<()>,
    /// Tokens verified already (by SHA-256), with their `exp` in milliseconds.
    verified: Mutex<HashMap<[u8; 32], (Principal, i64)>>,
}

impl Verifier {
    pub fn new(settings: Settings, source: Arc<dyn KeySource>) -> Verifier {
        Verifier {
            settings,
            source,
            keys: RwLock::default(),
            state: Mutex::default(),
            fetching: tokio::sync::Mutex::new(()),
            verified: Mutex::default(),
        }
    }

    pub fn issuer(&self) -> &str {
        &self.settings.issuer
    }

    /// Whether `token` is shaped like a JWT (three dot-separated parts), so a static token
    /// that matched nothing is not reported as a malformed JWT.
    pub fn looks_like_jwt(token: &str) -> bool {
        token.split('.').count() == 3 && token.starts_with("eyJ")
    }

    /// Fetches the keys in the background, so the broker starts even while the provider is
    /// down; until a fetch succeeds it retries every refetch interval (at least a second),
    /// and JWTs are refused saying the keys could not be fetched. Stops when the verifier goes.
    pub fn fetch_keys_in_background(self: &Arc<Self>) {
        let verifier = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(this) = verifier.upgrade() else {
                    return;
                };
                let source = this.source.describe();
                match this.fetch_keys().await {
                    Ok(n) => {
                        tracing::info!(keys = n, %source, "identity provider keys fetched");
                        return;
                    }
                    Err(why) => tracing::warn!(
                        %source,
                        "identity provider keys could not be fetched: {why}; JWTs are refused \
                         until they can be (static tokens keep working), retrying"
                    ),
                }
                let pause = this.settings.refetch_interval.max(Duration::from_secs(1));
                drop(this);
                tokio::time::sleep(pause).await;
                if verifier
                    .upgrade()
                    .is_some_and(|v| !v.current_keys().keys.is_empty())
                {
                    return;
                }
            }
        });
    }

    /// Fetches the keys now, whatever the rate limit (at start); says how it went.
    pub async fn fetch_keys(&self) -> Result<usize, String> {
        let _one = self.fetching.lock().await;
        self.fetch_locked().await
    }

    async fn fetch_locked(&self) -> Result<usize, String> {
        self.lock_state().last_attempt = Some(Instant::now());
        let fetched = self
            .source
            .fetch()
            .await
            .and_then(|text| KeySet::parse(&text));
        let mut state = self.lock_state();
        match fetched {
            Ok(set) => {
                let n = set.keys.len();
                *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(set);
                state.last_error = None;
                Ok(n)
            }
            Err(why) => {
                // The keys already cached stay: tokens they sign keep working until they expire.
                state.last_error = Some(why.clone());
                Err(why)
            }
        }
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, FetchState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Before the gate verifies `token`: if it names a key id the cache lacks, fetch the keys
    /// again, unless a fetch happened within the refetch interval. Never fails: the gate then
    /// refuses what it still cannot verify.
    pub async fn prepare(&self, token: &str) {
        if self.needs_keys(token) {
            self.refetch_if_due().await
        }
    }

    /// Whether `token` names a key not cached (or no key while none is): then [`prepare`]
    /// may fetch. A token that is no JWT needs nothing; the gate refuses it.
    ///
    /// [`prepare`]: Verifier::prepare
    pub fn needs_keys(&self, token: &str) -> bool {
        let Ok(parts) = split(token) else {
            return false;
        };
        let keys = self.current_keys();
        match parts.kid {
            Some(kid) => !keys.knows(&kid),
            None => keys.keys.is_empty(),
        }
    }

    async fn refetch_if_due(&self) {
        let _one = self.fetching.lock().await;
        let due = self
            .lock_state()
            .last_attempt
            .is_none_or(|at| at.elapsed() >= self.settings.refetch_interval);
        if due {
            match self.fetch_locked().await {
                Ok(n) => tracing::info!(
                    keys = n,
                    source = %self.source.describe(),
                    "identity provider keys fetched again (a token named a key id not cached)"
                ),
                Err(why) => tracing::warn!(
                    source = %self.source.describe(),
                    "identity provider keys could not be fetched: {why}"
                ),
            }
        }
    }

    fn current_keys(&self) -> Arc<KeySet> {
        Arc::clone(&self.keys.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Verifies `token` now, to the millisecond: a token is refused as soon as `exp` plus the
    /// clock skew has passed, not up to a second later (its `exp` is in whole seconds; the time
    /// read in whole seconds would keep accepting it until the next one).
    pub fn verify(&self, token: &str) -> Result<Principal, Refusal> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.verify_at_ms(token, now_ms)
    }

    /// Verifies `token` as of `now` (seconds since the epoch).
    pub fn verify_at(&self, token: &str, now: i64) -> Result<Principal, Refusal> {
        self.verify_at_ms(token, now.saturating_mul(1000))
    }

    /// Verifies `token` as of `now_ms` (milliseconds since the epoch).
    fn verify_at_ms(&self, token: &str, now_ms: i64) -> Result<Principal, Refusal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let skew_ms = self.skew_ms();
        let live = |exp_ms: i64| now_ms <= exp_ms.saturating_add(skew_ms);
        if let Some((principal, exp_ms)) = self.lock_verified().get(&digest)
            && live(*exp_ms)
        {
            return Ok(principal.clone());
        }
        let (principal, exp_ms) = self.verify_uncached(token, now_ms)?;
        let mut verified = self.lock_verified();
        if verified.len() >= MAX_CACHED_TOKENS {
            verified.retain(|_, (_, exp_ms)| live(*exp_ms));
            if verified.len() >= MAX_CACHED_TOKENS {
                verified.clear();
            }
        }
        verified.insert(digest, (principal.clone(), exp_ms));
        Ok(principal)
    }

    /// The clock skew allowed either way, in milliseconds.
    fn skew_ms(&self) -> i64 {
        i64::try_from(self.settings.clock_skew.as_millis()).unwrap_or(i64::MAX)
    }

    fn lock_verified(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], (Principal, i64)>> {
        self.verified.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn verify_uncached(&self, token: &str, now_ms: i64) -> Result<(Principal, i64), Refusal> {
        let parts = split(token)?;
        let signature = URL_SAFE_NO_PAD
            .decode(parts.signature)
            .map_err(|_| refused("its signature is not base64url"))?;
        let keys = self.current_keys();
        let mut candidates = keys.candidates(parts.kid.as_deref(), parts.alg).peekable();
        if candidates.peek().is_none() {
            let fetch_error = self.lock_state().last_error.clone();
            return Err(refused(match (fetch_error, parts.kid.is_some()) {
                (Some(why), _) => format!(
                    "it is signed by a key this broker has not cached, and the issuer's keys \
                     could not be fetched ({why})"
                ),
                (None, true) => format!(
                    "it is signed by a key id the issuer does not publish for {}",
                    parts.alg.name()
                ),
                (None, false) => format!(
                    "it names no key id and the issuer publishes no {} key",
                    parts.alg.name()
                ),
            }));
        }
        if !candidates.any(|key| key.verifies(parts.signed.as_bytes(), &signature)) {
            return Err(refused(
                "its signature does not verify with the issuer's published key",
            ));
        }
        let claims: Value = URL_SAFE_NO_PAD
            .decode(parts.payload)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .filter(Value::is_object)
            .ok_or_else(|| refused("its payload is not a base64url JSON object"))?;
        let (exp, audience) = self.check_claims(&claims, now_ms)?;
        Ok((self.principal(&claims, audience)?, exp))
    }

    /// `iss`, `aud`, `exp` and `nbf` (as of `now_ms`); returns `exp` (in milliseconds, as the
    /// claim gives it, fractions kept) and which audience the token is for.
    fn check_claims(&self, claims: &Value, now_ms: i64) -> Result<(i64, Audience), Refusal> {
        let settings = &self.settings;
        if claims.get("iss").and_then(Value::as_str) != Some(settings.issuer.as_str()) {
            return Err(refused(format!(
                "it was issued by another issuer than `{}`",
                settings.issuer
            )));
        }
        let names = |audience: &str| match claims.get("aud") {
            Some(Value::String(aud)) => aud == audience,
            Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(audience)),
            _ => false,
        };
        let audience = if names(&settings.audience) {
            Audience::Broker
        } else if settings.person_audience.as_deref().is_some_and(names) {
            Audience::Inbox
        } else {
            return Err(refused(match &settings.person_audience {
                None => format!(
                    "its audience (`aud`) does not include `{}`",
                    settings.audience
                ),
                Some(inbox) => format!(
                    "its audience (`aud`) does not include `{}` (nor the inbox's client id \
                     `{inbox}`)",
                    settings.audience
                ),
            }));
        };
        let skew_ms = self.skew_ms();
        // NumericDate: seconds, maybe fractional; in milliseconds (`as` saturates).
        let time = |name: &str| {
            claims
                .get(name)
                .and_then(Value::as_f64)
                .map(|t| (t * 1000.0) as i64)
        };
        let exp = time("exp").ok_or_else(|| refused("it has no expiry (`exp`)"))?;
        if now_ms > exp.saturating_add(skew_ms) {
            return Err(refused("it has expired (`exp` is past)"));
        }
        if let Some(nbf) = time("nbf")
            && now_ms < nbf.saturating_sub(skew_ms)
        {
            return Err(refused("it is not valid yet (`nbf` is in the future)"));
        }
        Ok((exp, audience))
    }

    /// The role, identity and groups the claims give (see [`ClaimMapping`]).
    fn principal(&self, claims: &Value, audience: Audience) -> Result<Principal, Refusal> {
        let mapping = &self.settings.claims;
        let mut role = None;
        for claim in &mapping.role_claims {
            for value in values(claims, claim) {
                if let Some((_, mapped)) = mapping.roles.iter().find(|(v, _)| *v == value) {
                    role = strongest(role, *mapped);
                }
            }
        }
        let role = role.ok_or_else(|| {
            Refusal::NoRole(format!(
                "the token is valid, but no value of its `{}` claim is mapped to a role here \
                 (--jwt-roles)",
                mapping.role_claims.join("`/`")
            ))
        })?;
        if role == Role::Agent && audience == Audience::Inbox {
            return Err(Refusal::NoRole(
                "the token was issued to the inbox (its `aud` is the inbox's client id), which \
                 signs in people, but its roles make it an agent"
                    .to_owned(),
            ));
        }
        let claim = if role == Role::Agent {
            &mapping.agent_claim
        } else {
            &mapping.identity_claim
        };
        let text = lookup(claims, claim)
            .and_then(Value::as_str)
            .ok_or_else(|| refused(format!("it has no `{claim}` claim to name the caller")))?;
        if claim == "email" && claims.get("email_verified") == Some(&Value::Bool(false)) {
            return Err(refused(
                "its `email` is not verified (`email_verified: false`)",
            ));
        }
        let identity = Identity::parse(claim, text)
            .map_err(|e| refused(format!("its `{claim}` claim is not an identity: {e}")))?
            .into_string();
        let mut groups: Vec<String> = if role == Role::Agent {
            Vec::new()
        } else {
            values(claims, &mapping.groups_claim)
                .into_iter()
                // A group name this broker cannot hold (`/ops`, a display name) gives no
                // group: fewer rights, never more.
                .filter_map(|g| group_name("groups", &g).ok())
                .collect()
        };
        groups.sort();
        groups.dedup();
        Ok(Principal {
            role,
            identity: Arc::from(identity),
            groups: groups.into(),
        })
    }
}

/// Whom a token was issued to: the broker (`--jwt-audience`), or the inbox (its OpenID client
/// id), whose tokens name people only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Audience {
    Broker,
    Inbox,
}

fn strongest(current: Option<Role>, new: Role) -> Option<Role> {
    let rank = |r: Role| match r {
        Role::Admin => 3,
        Role::Approver => 2,
        Role::Auditor => 1,
        Role::Agent => 0,
    };
    Some(match current {
        Some(c) if rank(c) >= rank(new) => c,
        _ => new,
    })
}

/// A claim by name, or by a dotted path into nested objects (`realm_access.roles`) when no
/// claim has the whole name.
fn lookup<'a>(claims: &'a Value, name: &str) -> Option<&'a Value> {
    claims.get(name).or_else(|| {
        name.split('.')
            .try_fold(claims, |value, step| value.get(step))
    })
}

/// A claim's values: the strings of an array, or a string's space-separated words.
fn values(claims: &Value, name: &str) -> Vec<String> {
    match lookup(claims, name) {
        Some(Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
