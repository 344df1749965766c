//! Who may call what: bearer tokens with a role (`agent`, `approver`, `auditor`, `admin`), an
//! identity and, for approvers, the groups they belong to (which calls they may decide, see
//! `domain::policy::Approvers`).
//!
//! Tokens are configured as SHA-256 hashes, never in clear, and a presented token is compared
//! against every configured hash in constant time. Each service is wrapped in a [`Gate`] that
//! admits its role (and `admin`, which may call everything) and hands the handler a [`Caller`].
//! With auth on, an agent's identity owns its sessions (calls are keyed by it), and the approver
//! recorded in an outcome is the token's identity, never a field of the request. An auditor is
//! admitted where an approver is and sees every call, but may not decide. With no tokens
//! configured, auth is off: every caller is [`Caller::Anonymous`] (the laptop default).
//!
//! Beside the static tokens, an identity provider's JWTs ([`jwt`]): the gate tries the static
//! tokens first, then verifies a JWT against the issuer's keys ([`jwks`] fetches them, and
//! [`KeyPrefetch`] does so before the gate when a token names a key not cached yet), and takes
//! its role, identity and groups from its claims. Either way the handler gets one [`Caller`].

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tonic::service::Interceptor;
use tonic::{Request, Status};

pub mod jwks;
pub mod jwt;

use crate::domain::policy::group_name;
use crate::domain::{AgentId, Identity, Viewer};
use crate::error::{Error, Result};
use tonic::codegen::http;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Agent,
    Approver,
    /// Sees every call an approver service shows, whatever its groups; decides none.
    Auditor,
    Admin,
}

impl Role {
    fn parse(s: &str) -> Option<Role> {
        match s {
            "agent" => Some(Role::Agent),
            "approver" => Some(Role::Approver),
            "auditor" => Some(Role::Auditor),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// Whether a caller with this role may call a service that requires `required`.
    fn admits(self, required: Role) -> bool {
        self == required
            || self == Role::Admin
            || (self == Role::Auditor && required == Role::Approver)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Agent => "agent",
            Role::Approver => "approver",
            Role::Auditor => "auditor",
            Role::Admin => "admin",
        })
    }
}

/// One configured token: its hash, role and identity.
#[derive(Debug)]
struct Entry {
    hash: [u8; 32],
    role: Role,
    /// Its identity, canonical ([`Identity`]).
    identity: String,
    /// The identity as the token file spells it (for errors).
    typed: String,
    /// The approver groups it belongs to (`groups=a,b`), sorted.
    groups: Arc<[String]>,
}

/// The configured tokens.
#[derive(Debug, Default)]
pub struct Tokens {
    entries: Vec<Entry>,
    /// The entry number each of `entries` was read from, for errors.
    lines: Vec<usize>,
}

/// The line to configure `token` with: `sha256:<hex>`.
pub fn hash_token(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl Tokens {
    /// Parses token lines `ROLE IDENTITY sha256:HEX [groups=A,B]` (blank lines and `#` comment lines
    /// ignored, whatever they hold; `;` also separates entries, for environment variables).
    /// `source` names where they came from in errors.
    pub fn parse(text: &str, source: &str) -> Result<Tokens> {
        let mut tokens = Tokens::default();
        let entries = text
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .flat_map(|line| line.split(';'));
        for (n, line) in entries.enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| {
                Error::invalid(
                    source,
                    format!(
                        "entry {}: {why} (expected `ROLE IDENTITY sha256:HEX [groups=A,B]`)",
                        n + 1
                    ),
                )
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (role, identity, hash, groups) = match fields[..] {
                [role, identity, hash] => (role, identity, hash, None),
                [role, identity, hash, groups] => (role, identity, hash, Some(groups)),
                _ => return Err(bad("wrong number of fields")),
            };
            let role = Role::parse(role)
                .ok_or_else(|| bad("role must be agent, approver, auditor or admin"))?;
            let groups = match groups {
                None => Vec::new(),
                Some(text) => parse_groups(text).map_err(|why| bad(&why))?,
            };
            let hash = hash
                .strip_prefix("sha256:")
                .and_then(decode_hex)
                .ok_or_else(|| bad("the hash must be sha256: and 64 hex digits"))?;
            // One canonical form (NFKC, case-folded): `Alice` and `alice` are one person, and
            // two entries that spell one person two ways are refused, naming both, rather than
            // counted as two approvers.
            let typed = identity;
            let identity = Identity::parse("identity", typed)
                .map_err(|e| bad(&e.to_string()))?
                .into_string();
            if let Some(first) = tokens
                .entries
                .iter()
                .position(|e| e.identity == identity && e.typed != typed)
            {
                return Err(bad(&format!(
                    "the identity `{typed}` is the identity `{}` of entry {} written another \
                     way (identities are compared in one form: Unicode NFKC, case-folded); \
                     spell one person one way",
                    tokens.entries[first].typed, tokens.lines[first]
                )));
            }
            // One token, one role and identity: a second listing would make the role depend on
            // the order of lines, so it is refused rather than resolved.
            if let Some(first) = tokens.entries.iter().position(|e| e.hash == hash) {
                let earlier = &tokens.entries[first];
                return Err(bad(&format!(
                    "this token is already configured by entry {} (role {}, identity {}); a \
                     token may have only one role and identity",
                    tokens.lines[first], earlier.role, earlier.identity
                )));
            }
            tokens.entries.push(Entry {
                hash,
                role,
                typed: typed.to_owned(),
                identity,
                groups: groups.into(),
            });
            tokens.lines.push(n + 1);
        }
        Ok(tokens)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The approver groups the token file gives `identity` (canonical): those of every token of
    /// it that may decide (`approver`, `admin`), merged and sorted; `None` when no such token
    /// names it. Slack app mode gives them to a Slack user mapped to the identity.
    pub fn approver_groups(&self, identity: &str) -> Option<Vec<String>> {
        let mut found: Option<Vec<String>> = None;
        for entry in self
            .entries
            .iter()
            .filter(|e| e.identity == identity && matches!(e.role, Role::Approver | Role::Admin))
        {
            let groups = found.get_or_insert_with(Vec::new);
            for group in entry.groups.iter() {
                if !groups.contains(group) {
                    groups.push(group.clone());
                }
            }
        }
        found.map(|mut groups| {
            groups.sort();
            groups
        })
    }

    /// The entry `token` hashes to. Every entry is compared, in constant time, whatever matches.
    fn authenticate(&self, token: &str) -> Option<&Entry> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for entry in &self.entries {
            let diff = entry
                .hash
                .iter()
                .zip(presented.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 {
                found = Some(entry);
            }
        }
        found
    }
}

/// `groups=a,b`: distinct group names, sorted.
fn parse_groups(text: &str) -> std::result::Result<Vec<String>, String> {
    let list = text
        .strip_prefix("groups=")
        .ok_or("the fourth field must be `groups=A,B`")?;
    let mut groups = Vec::new();
    for name in list.split(',') {
        let name = group_name("groups", name).map_err(|e| e.to_string())?;
        if !groups.contains(&name) {
            groups.push(name);
        }
    }
    groups.sort();
    Ok(groups)
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The caller of an RPC, as the gate admitted it.
#[derive(Debug, Clone)]
pub enum Caller {
    /// Auth is off.
    Anonymous,
    Authenticated {
        role: Role,
        identity: Arc<str>,
        /// Its approver groups (empty for most tokens).
        groups: Arc<[String]>,
    },
}

impl Caller {
    /// The caller of `request` (anonymous if no gate ran, as for tests of a handler alone).
    pub fn of<T>(request: &Request<T>) -> Caller {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or(Caller::Anonymous)
    }

    /// The agent that owns the sessions this caller submits to: its token's identity, or the
    /// default owner while auth is off.
    pub fn agent(&self) -> Result<AgentId> {
        match self {
            Caller::Anonymous => Ok(AgentId::default_owner()),
            Caller::Authenticated { identity, .. } => AgentId::parse("token identity", &**identity),
        }
    }

    /// Who acts as an administrator (recorded when grants are revoked): the token's identity,
    /// or `admin` while auth is off.
    pub fn admin_identity(&self) -> String {
        match self {
            Caller::Authenticated { identity, .. } => identity.to_string(),
            Caller::Anonymous => "admin".to_owned(),
        }
    }

    /// Who decides: the token's identity; while auth is off, the request's `approver` field,
    /// which is then required. An auditor decides nothing: PERMISSION_DENIED.
    pub fn approver(&self, from_request: String) -> Result<String> {
        match self {
            Caller::Authenticated {
                role: Role::Auditor,
                ..
            } => Err(Error::PermissionDenied(
                "a token with role `auditor` sees every call but may not decide".into(),
            )),
            Caller::Authenticated { identity, .. } => Ok(identity.to_string()),
            Caller::Anonymous if from_request.is_empty() => {
                Err(Error::invalid("approver", "must name who decides"))
            }
            Caller::Anonymous => Ok(Identity::parse("approver", &from_request)?.into_string()),
        }
    }
}

/// Where the gate writes down whom it admitted, for the RPC's log line if the RPC is refused
/// later (`grpc::observed` puts one in each request; the log outlives the request).
#[derive(Debug, Clone, Default)]
pub struct CallerNote(Arc<std::sync::OnceLock<Arc<str>>>);

impl CallerNote {
    /// The caller's identity, once its token is known (`anonymous` while auth is off); `None`
    /// if it had no valid token or no gate ran.
    pub fn get(&self) -> Option<&str> {
        self.0.get().map(|identity| &**identity)
    }

    fn note(request: &Request<()>, identity: Arc<str>) {
        if let Some(note) = request.extensions().get::<CallerNote>() {
            let _ = note.0.set(identity);
        }
    }
}

impl Caller {
    /// The approver groups this caller belongs to; `None` while auth is off, when nobody's
    /// groups are known and calls are not routed by group (see docs/approver-routing.md).
    pub fn groups(&self) -> Option<Vec<String>> {
        match self {
            Caller::Anonymous => None,
            Caller::Authenticated { groups, .. } => Some(groups.to_vec()),
        }
    }

    /// Who this caller is as a reader of calls (see [`Viewer`], whose [`Call::visible_to`] is
    /// the one visibility rule): an admin or an auditor sees every call, as does anyone while
    /// auth is off; an agent its own; an approver the calls its groups may decide.
    ///
    /// [`Call::visible_to`]: crate::domain::Call::visible_to
    pub fn viewer(&self) -> Viewer {
        match self {
            Caller::Anonymous => Viewer::Operator,
            Caller::Authenticated {
                role,
                identity,
                groups,
            } => match role {
                Role::Admin | Role::Auditor => Viewer::Operator,
                Role::Approver => Viewer::Approver {
                    groups: groups.to_vec(),
                },
                Role::Agent => Viewer::Agent(AgentId::from_stored(identity.to_string())),
            },
        }
    }
}

/// Admits the callers of one service: a valid bearer token whose role is `required` or `admin`.
#[derive(Clone)]
pub struct Gate {
    tokens: Option<Arc<Tokens>>,
    jwt: Option<Arc<jwt::Verifier>>,
    required: Role,
}

impl Gate {
    /// `tokens: None` (and no JWT issuer, see [`Gate::with_jwt`]) means auth is off and
    /// everyone is admitted anonymously.
    pub fn new(tokens: Option<Arc<Tokens>>, required: Role) -> Self {
        Self {
            tokens,
            jwt: None,
            required,
        }
    }

    /// Also admits JWTs this verifier accepts (auth is then on, static tokens or not).
    pub fn with_jwt(mut self, jwt: Option<Arc<jwt::Verifier>>) -> Self {
        self.jwt = jwt;
        self
    }

    /// The role, identity and groups `token` stands for: a static token, else a JWT.
    fn authenticate(&self, token: &str) -> Result<jwt::Principal, Status> {
        if let Some(entry) = self.tokens.as_deref().and_then(|t| t.authenticate(token)) {
            return Ok(jwt::Principal {
                role: entry.role,
                identity: Arc::from(entry.identity.as_str()),
                groups: Arc::clone(&entry.groups),
            });
        }
        match &self.jwt {
            Some(verifier) if jwt::Verifier::looks_like_jwt(token) => {
                verifier.verify(token).map_err(Status::from)
            }
            _ => Err(Status::unauthenticated("unknown token")),
        }
    }
}

/// The bearer token of `headers`, if it carries one.
fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get("authorization")?.to_str().ok()?;
    value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
}

/// Before any gate runs: a JWT naming a signing key the verifier has not cached makes it fetch
/// the issuer's keys (rate-limited, see [`jwt::Verifier::prepare`]), since the gate itself
/// cannot wait. Every other request passes straight through. It admits and refuses nothing; the
/// gate does.
#[derive(Clone)]
pub struct KeyPrefetch {
    jwt: Option<Arc<jwt::Verifier>>,
}

impl KeyPrefetch {
    pub fn new(jwt: Option<Arc<jwt::Verifier>>) -> Self {
        Self { jwt }
    }
}

impl<S> tower_layer::Layer<S> for KeyPrefetch {
    type Service = KeyPrefetchService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyPrefetchService {
            jwt: self.jwt.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct KeyPrefetchService<S> {
    jwt: Option<Arc<jwt::Verifier>>,
    inner: S,
}

impl<S, B> tower_service::Service<http::Request<B>> for KeyPrefetchService<S>
where
    S: tower_service::Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    /// The inner call as it is, unless a JWT's keys must be fetched first: no allocation on the
    /// path of static tokens, or with no issuer configured.
    type Future = futures_util::future::Either<
        S::Future,
        std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send + 'static>,
        >,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let token = self.jwt.as_ref().and_then(|jwt| {
            bearer(request.headers())
                .filter(|t| jwt::Verifier::looks_like_jwt(t) && jwt.needs_keys(t))
                .map(|t| (Arc::clone(jwt), t.to_owned()))
        });
        let Some((jwt, token)) = token else {
            return futures_util::future::Either::Left(self.inner.call(request));
        };
        // The clone that was made ready is the one called (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        futures_util::future::Either::Right(Box::pin(async move {
            jwt.prepare(&token).await;
            inner.call(request).await
        }))
    }
}

impl Interceptor for Gate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if self.tokens.is_none() && self.jwt.is_none() {
            CallerNote::note(&request, Arc::from("anonymous"));
            request.extensions_mut().insert(Caller::Anonymous);
            return Ok(request);
        }
        let header = request
            .metadata()
            .get("authorization")
            .ok_or_else(|| Status::unauthenticated("missing `authorization: Bearer <token>`"))?;
        let token = header
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| Status::unauthenticated("`authorization` must be `Bearer <token>`"))?;
        let jwt::Principal {
            role,
            identity,
            groups,
        } = self.authenticate(token)?;
        crate::door::connections::vouch(request.extensions());
        CallerNote::note(&request, Arc::clone(&identity));
        if !role.admits(self.required) {
            return Err(Status::permission_denied(format!(
                "a token with role `{role}` may not call this service (it needs `{}`)",
                self.required
            )));
        }
        request.extensions_mut().insert(Caller::Authenticated {
            role,
            identity,
            groups,
        });
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_configured_as_hashes_and_matched_by_hash() {
        let line = format!("agent build-bot {}", hash_token("s3cret"));
        let text = format!("# comment; with a semicolon\n  # indented\n{line}\n");
        let tokens = Tokens::parse(&text, "tokens").unwrap();
        assert_eq!(tokens.len(), 1);
        let entry = tokens.authenticate("s3cret").expect("matches");
        assert_eq!(
            (entry.role, entry.identity.as_str()),
            (Role::Agent, "build-bot")
        );
        assert!(tokens.authenticate("s3cret ").is_none());
        assert!(tokens.authenticate("").is_none());
    }

    #[test]
    fn one_person_spelt_two_ways_is_refused_naming_both_and_identities_are_canonical() {
        let text = format!(
            "approver alice {}\napprover bob {}\napprover Alice {}",
            hash_token("a"),
            hash_token("b"),
            hash_token("c")
        );
        let err = Tokens::parse(&text, "tokens").unwrap_err().to_string();
        assert!(err.starts_with("tokens: entry 3"), "{err}");
        assert!(
            err.contains("`Alice`") && err.contains("`alice` of entry 1"),
            "{err}"
        );
        // Fullwidth letters are the same person too.
        let text = format!(
            "approver alice {}\napprover ａｌｉｃｅ {}",
            hash_token("a"),
            hash_token("c")
        );
        assert!(Tokens::parse(&text, "tokens").is_err());
        // The same spelling on two tokens (a laptop and a phone) is one person with two tokens.
        let text = format!(
            "approver Alice {}\napprover Alice {}",
            hash_token("a"),
            hash_token("c")
        );
        let tokens = Tokens::parse(&text, "tokens").unwrap();
        assert_eq!(tokens.authenticate("c").unwrap().identity, "alice");
        // A comma would read as a list of people.
        let text = format!("approver x,y {}", hash_token("a"));
        let err = Tokens::parse(&text, "tokens").unwrap_err().to_string();
        assert!(err.contains("comma"), "{err}");
    }

    #[test]
    fn the_same_token_under_two_roles_is_refused_naming_both_entries() {
        let hash = hash_token("shared");
        let text = format!(
            "agent bot {hash}\napprover alice {}\napprover alice {hash}",
            hash_token("x")
        );
        let err = Tokens::parse(&text, "tokens").unwrap_err().to_string();
        assert!(err.starts_with("tokens: entry 3"), "{err}");
        assert!(err.contains("entry 1 (role agent, identity bot)"), "{err}");
        // Listed twice with the same role is as ambiguous to a reader: refused too.
        let text = format!("agent bot {hash}; agent bot {hash}");
        assert!(Tokens::parse(&text, "tokens").is_err());
    }

    #[test]
    fn malformed_token_lines_are_refused_naming_the_source() {
        for bad in [
            "agent only-two",
            "root someone sha256:00",
            "agent a md5:0123",
            &format!("agent a sha256:{}", "z".repeat(64)),
        ] {
            let err = Tokens::parse(bad, "APPROVALS_TOKENS")
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("APPROVALS_TOKENS: entry 1"), "{err}");
        }
    }

    #[test]
    fn an_optional_fourth_field_names_the_groups_and_old_lines_stay_valid() {
        let text = format!(
            "approver alice {} groups=sec,ops,ops\napprover bob {}",
            hash_token("a"),
            hash_token("b")
        );
        let tokens = Tokens::parse(&text, "tokens").unwrap();
        assert_eq!(&*tokens.authenticate("a").unwrap().groups, ["ops", "sec"]);
        assert!(tokens.authenticate("b").unwrap().groups.is_empty());
        for bad in ["groups=", "groups=a b", "teams=a", "groups=a,,b"] {
            let line = format!("approver alice {} {bad}", hash_token("a"));
            let err = Tokens::parse(&line, "tokens").unwrap_err().to_string();
            assert!(err.starts_with("tokens: entry 1"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_auditor_is_admitted_as_an_approver_but_may_not_decide() {
        assert!(Role::Auditor.admits(Role::Approver));
        assert!(!Role::Auditor.admits(Role::Admin));
        assert!(!Role::Auditor.admits(Role::Agent));
        let auditor = Caller::Authenticated {
            role: Role::Auditor,
            identity: Arc::from("eve"),
            groups: Arc::from(Vec::new()),
        };
        assert_eq!(auditor.viewer(), Viewer::Operator);
        let err = auditor.approver(String::new()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn admin_is_admitted_everywhere_and_other_roles_only_to_their_service() {
        assert!(Role::Admin.admits(Role::Agent));
        assert!(Role::Admin.admits(Role::Approver));
        assert!(Role::Agent.admits(Role::Agent));
        assert!(!Role::Agent.admits(Role::Approver));
        assert!(!Role::Approver.admits(Role::Admin));
    }
}
