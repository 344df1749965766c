//! The verifier's promises, one refusal reason at a time, with keys made in the test and a
//! key source that counts its fetches.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use super::*;

#[path = "../../../../tests/api/jwt_tokens.rs"]
mod tokens;
use tokens::{Signer, hs256, jwks, unsigned};

const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "approval-broker";
/// The inbox's OpenID client id: the audience of signed-in people's ID tokens.
const INBOX_CLIENT: &str = "approvals-inbox";
const NOW: i64 = 1_800_000_000;

/// Serves one JWKS (or an error), counting fetches.
struct Fake {
    answer: Mutex<Result<String, String>>,
    fetches: AtomicUsize,
}

impl KeySource for Fake {
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + '_>> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let answer = self.answer.lock().unwrap().clone();
        Box::pin(async move { answer })
    }

    fn describe(&self) -> String {
        "the fake".to_owned()
    }
}

fn settings(refetch_interval: Duration) -> Settings {
    Settings {
        issuer: ISSUER.to_owned(),
        audience: AUDIENCE.to_owned(),
        person_audience: Some(INBOX_CLIENT.to_owned()),
        clock_skew: Duration::from_secs(60),
        refetch_interval,
        claims: ClaimMapping {
            identity_claim: "email".to_owned(),
            agent_claim: "client_id".to_owned(),
            role_claims: vec!["roles".to_owned(), "scope".to_owned()],
            roles: ClaimMapping::parse_roles(
                "admin=broker-admin; approver=approver,security; auditor=audit; agent=agent",
            )
            .unwrap(),
            groups_claim: "groups".to_owned(),
        },
    }
}

fn verifier_with(answer: Result<String, String>, refetch: Duration) -> (Verifier, Arc<Fake>) {
    let fake = Arc::new(Fake {
        answer: Mutex::new(answer),
        fetches: AtomicUsize::new(0),
    });
    let verifier = Verifier::new(settings(refetch), fake.clone() as Arc<dyn KeySource>);
    (verifier, fake)
}

async fn verifier(signers: &[&Signer]) -> (Verifier, Arc<Fake>) {
    let (verifier, fake) = verifier_with(Ok(jwks(signers)), Duration::from_secs(3600));
    verifier.fetch_keys().await.expect("keys");
    (verifier, fake)
}

fn person(email: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "exp": NOW + 300, "iat": NOW, "sub": "u-1",
           "email": email, "roles": ["approver"], "groups": ["ops", "sec", "/bad name"]})
}

fn unauthenticated(result: Result<Principal, Refusal>) -> String {
    match result {
        Err(Refusal::Unauthenticated(why)) => why,
        other => panic!("expected UNAUTHENTICATED, got {other:?}"),
    }
}

#[tokio::test]
async fn tokens_signed_by_the_issuers_rs256_es256_and_eddsa_keys_name_the_caller_canonically() {
    let (rsa, ec, ed) = (
        Signer::rs256("r1", false),
        Signer::es256("e1"),
        Signer::ed25519("d1"),
    );
    let (verifier, _) = verifier(&[&rsa, &ec, &ed]).await;
    for signer in [&rsa, &ec, &ed] {
        let principal = verifier
            .verify_at(&signer.sign(&person(" Alice@Example.COM")), NOW)
            .unwrap_or_else(|e| panic!("{}: {e:?}", signer.alg()));
        assert_eq!(principal.role, Role::Approver);
        assert_eq!(&*principal.identity, "alice@example.com");
        // An invalid group name gives no group, never an error or more rights.
        assert_eq!(&*principal.groups, ["ops", "sec"]);
    }
}

#[tokio::test]
async fn unsigned_symmetric_and_wrongly_signed_tokens_are_refused_saying_which() {
    let ec = Signer::es256("k1");
    let (verifier, _) = verifier(&[&ec]).await;
    let claims = person("alice@example.com");
    let why = unauthenticated(verifier.verify_at(&unsigned("k1", &claims), NOW));
    assert!(why.contains("`alg: none`"), "{why}");
    let why = unauthenticated(verifier.verify_at(&hs256("k1", &ec.public_bytes(), &claims), NOW));
    assert!(why.contains("symmetric"), "{why}");
    // Another key under the same key id.
    let forger = Signer::es256("k1");
    let why = unauthenticated(verifier.verify_at(&forger.sign(&claims), NOW));
    assert!(why.contains("signature does not verify"), "{why}");
    // A payload changed after signing.
    let token = ec.sign(&claims);
    let mut parts: Vec<&str> = token.split('.').collect();
    let other = ec.sign(&person("mallory@example.com"));
    parts[1] = other.split('.').nth(1).unwrap();
    let why = unauthenticated(verifier.verify_at(&parts.join("."), NOW));
    assert!(why.contains("signature does not verify"), "{why}");
    // An RS256 header on an EC key's id finds no key for that algorithm.
    let rsa = Signer::rs256("k1", false);
    let why = unauthenticated(verifier.verify_at(&rsa.sign(&claims), NOW));
    assert!(why.contains("key id"), "{why}");
    // Nothing refused repeats the token.
    let token = forger.sign(&claims);
    let why = unauthenticated(verifier.verify_at(&token, NOW));
    for part in token.split('.') {
        assert!(!why.contains(part), "{why}");
    }
}

#[tokio::test]
async fn another_issuer_another_audience_and_expired_or_early_tokens_are_refused_saying_which() {
    let ec = Signer::es256("k1");
    let (verifier, _) = verifier(&[&ec]).await;
    let with = |key: &str, value: Value| {
        let mut claims = person("alice@example.com");
        claims[key] = value;
        ec.sign(&claims)
    };
    let cases = [
        (with("iss", json!("https://evil.test")), "another issuer"),
        (with("aud", json!("another-app")), "audience"),
        (with("aud", json!(["a", "b"])), "audience"),
        (with("exp", json!(NOW - 61)), "expired"),
        (with("exp", Value::Null), "no expiry"),
        (with("nbf", json!(NOW + 61)), "not valid yet"),
    ];
    for (token, expected) in cases {
        let why = unauthenticated(verifier.verify_at(&token, NOW));
        assert!(why.contains(expected), "{expected}: {why}");
    }
    // An audience list that includes ours is fine.
    assert!(
        verifier
            .verify_at(&with("aud", json!(["other", AUDIENCE])), NOW)
            .is_ok()
    );
}

#[tokio::test]
async fn clocks_may_disagree_by_the_configured_skew_and_no_more() {
    let ec = Signer::es256("k1");
    let (verifier, _) = verifier(&[&ec]).await;
    let mut claims = person("alice@example.com");
    claims["exp"] = json!(NOW - 60);
    claims["nbf"] = json!(NOW - 200);
    assert!(verifier.verify_at(&ec.sign(&claims), NOW).is_ok());
    claims["exp"] = json!(NOW + 600);
    claims["nbf"] = json!(NOW + 60);
    assert!(verifier.verify_at(&ec.sign(&claims), NOW).is_ok());
    claims["nbf"] = json!(NOW + 61);
    assert!(verifier.verify_at(&ec.sign(&claims), NOW).is_err());
    // A remembered token expires like a fresh one.
    let mut claims = person("alice@example.com");
    claims["exp"] = json!(NOW + 10);
    let token = ec.sign(&claims);
    assert!(verifier.verify_at(&token, NOW).is_ok());
    assert!(verifier.verify_at(&token, NOW + 70).is_ok());
    let why = unauthenticated(verifier.verify_at(&token, NOW + 71));
    assert!(why.contains("expired"), "{why}");
    // To the millisecond: refused as soon as `exp` plus the skew has passed, remembered or
    // not, where the time in whole seconds (NOW + 70 still) would accept it for a second more.
    let last_ms = (NOW + 70) * 1000;
    assert!(verifier.verify_at_ms(&token, last_ms).is_ok());
    let why = unauthenticated(verifier.verify_at_ms(&token, last_ms + 1));
    assert!(why.contains("expired"), "{why}");
    claims["sub"] = json!("u-2");
    let unseen = ec.sign(&claims);
    let why = unauthenticated(verifier.verify_at_ms(&unseen, last_ms + 999));
    assert!(why.contains("expired"), "{why}");
    assert!(verifier.verify_at_ms(&unseen, last_ms).is_ok());
    // A fractional `exp` (a NumericDate may have one) counts to its millisecond.
    claims["exp"] = json!(NOW as f64 + 10.5);
    let fractional = ec.sign(&claims);
    let why = unauthenticated(verifier.verify_at_ms(&fractional, last_ms + 501));
    assert!(why.contains("expired"), "{why}");
    assert!(verifier.verify_at_ms(&fractional, last_ms + 500).is_ok());
}

#[tokio::test]
async fn roles_identities_and_groups_come_from_the_configured_claims() {
    let ec = Signer::es256("k1");
    let (verifier, _) = verifier(&[&ec]).await;
    // The strongest mapped role wins; `scope` is read as space-separated values.
    let mut claims = person("root@example.com");
    claims["roles"] = json!(["approver", "broker-admin"]);
    assert_eq!(
        verifier.verify_at(&ec.sign(&claims), NOW).unwrap().role,
        Role::Admin
    );
    // A service client: its identity from `client_id`, whatever `email` or the request says.
    let agent = json!({"iss": ISSUER, "aud": AUDIENCE, "exp": NOW + 300, "client_id": "CI-Bot",
                       "scope": "openid agent", "groups": ["ops"]});
    let principal = verifier.verify_at(&ec.sign(&agent), NOW).unwrap();
    assert_eq!(
        (principal.role, &*principal.identity),
        (Role::Agent, "ci-bot")
    );
    assert!(principal.groups.is_empty());
    // No mapped role: valid, but PERMISSION_DENIED naming the claim.
    let mut claims = person("bob@example.com");
    claims["roles"] = json!(["viewer"]);
    match verifier.verify_at(&ec.sign(&claims), NOW) {
        Err(Refusal::NoRole(why)) => assert!(why.contains("`roles`"), "{why}"),
        other => panic!("{other:?}"),
    }
    // No identity claim, an unverified email, an identity that reads as two people.
    let mut claims = person("x");
    claims.as_object_mut().unwrap().remove("email");
    let why = unauthenticated(verifier.verify_at(&ec.sign(&claims), NOW));
    assert!(why.contains("no `email` claim"), "{why}");
    let mut claims = person("bob@example.com");
    claims["email_verified"] = json!(false);
    let why = unauthenticated(verifier.verify_at(&ec.sign(&claims), NOW));
    assert!(why.contains("not verified"), "{why}");
    let why = unauthenticated(verifier.verify_at(&ec.sign(&person("a,b")), NOW));
    assert!(why.contains("not an identity"), "{why}");
}

#[test]
fn role_mappings_are_parsed_strictly() {
    let roles = ClaimMapping::parse_roles("admin=a; approver = b , c").unwrap();
    assert_eq!(roles.len(), 3);
    for bad in ["", "admin", "root=a", "admin=a;approver=a", "admin=a,,b"] {
        assert!(ClaimMapping::parse_roles(bad).is_err(), "{bad}");
    }
}

#[tokio::test]
async fn an_unknown_key_id_refetches_the_keys_at_most_once_per_interval() {
    let old = Signer::es256("old");
    let new = Signer::es256("new");
    let (verifier, fake) = verifier_with(Ok(jwks(&[&old])), Duration::from_secs(3600));
    verifier.fetch_keys().await.unwrap();
    // The provider rotates to a new key; the first token naming it triggers no fetch within
    // the interval (the start's fetch was just now), so forged key ids cannot hammer it.
    *fake.answer.lock().unwrap() = Ok(jwks(&[&old, &new]));
    let token = new.sign(&person("alice@example.com"));
    for _ in 0..20 {
        verifier
            .prepare(&Signer::es256("forged").sign(&person("x@y")))
            .await;
        verifier.prepare(&token).await;
    }
    assert_eq!(fake.fetches.load(Ordering::SeqCst), 1);
    assert!(verifier.verify_at(&token, NOW).is_err());
    // With the interval passed (zero here), the unknown key id fetches once and then verifies;
    // a known key id fetches nothing.
    let (verifier, fake) = verifier_with(Ok(jwks(&[&old])), Duration::ZERO);
    verifier.fetch_keys().await.unwrap();
    *fake.answer.lock().unwrap() = Ok(jwks(&[&old, &new]));
    verifier.prepare(&token).await;
    assert_eq!(fake.fetches.load(Ordering::SeqCst), 2);
    assert!(verifier.verify_at(&token, NOW).is_ok());
    verifier.prepare(&token).await;
    verifier
        .prepare(&old.sign(&person("bob@example.com")))
        .await;
    assert_eq!(fake.fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn with_the_provider_down_cached_keys_keep_working_and_unknown_keys_are_refused() {
    let old = Signer::es256("old");
    let (verifier, fake) = verifier_with(Ok(jwks(&[&old])), Duration::ZERO);
    verifier.fetch_keys().await.unwrap();
    *fake.answer.lock().unwrap() = Err("connection refused".to_owned());
    let unknown = Signer::es256("new").sign(&person("alice@example.com"));
    verifier.prepare(&unknown).await;
    assert_eq!(fake.fetches.load(Ordering::SeqCst), 2);
    let why = unauthenticated(verifier.verify_at(&unknown, NOW));
    assert!(
        why.contains("could not be fetched (connection refused)"),
        "{why}"
    );
    assert!(
        verifier
            .verify_at(&old.sign(&person("bob@example.com")), NOW)
            .is_ok()
    );
    // Started with the provider down: nothing verifies, and the refusal says why.
    let (verifier, _) = verifier_with(Err("timed out".to_owned()), Duration::ZERO);
    assert!(verifier.fetch_keys().await.is_err());
    let why = unauthenticated(verifier.verify_at(&old.sign(&person("bob@example.com")), NOW));
    assert!(why.contains("could not be fetched (timed out)"), "{why}");
}

#[test]
fn a_jwks_without_usable_signing_keys_is_refused() {
    assert!(KeySet::parse("{}").is_err());
    assert!(KeySet::parse(r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).is_err());
    let ec = Signer::es256("k");
    let mut jwk = ec.jwk();
    jwk["use"] = json!("enc");
    assert!(KeySet::parse(&json!({"keys": [jwk]}).to_string()).is_err());
    let mut jwk = ec.jwk();
    jwk["alg"] = json!("ES384");
    assert!(KeySet::parse(&json!({"keys": [jwk]}).to_string()).is_err());
}

#[tokio::test]
async fn an_id_token_issued_to_the_inbox_names_a_person_never_an_agent() {
    let ec = Signer::es256("k1");
    let (verifier, _) = verifier(&[&ec]).await;
    let mut id_token = person("Alice@Example.com");
    id_token["aud"] = json!(INBOX_CLIENT);
    id_token["nonce"] = json!("n-1");
    let principal = verifier.verify_at(&ec.sign(&id_token), NOW).unwrap();
    assert_eq!(principal.role, Role::Approver);
    assert_eq!(&*principal.identity, "alice@example.com");
    assert_eq!(&*principal.groups, ["ops", "sec"]);
    // Its roles may not make it an agent.
    let mut agent = id_token.clone();
    agent["roles"] = json!(["agent"]);
    agent["client_id"] = json!("approvals-inbox");
    match verifier.verify_at(&ec.sign(&agent), NOW) {
        Err(Refusal::NoRole(why)) => assert!(why.contains("inbox"), "{why}"),
        other => panic!("expected PERMISSION_DENIED, got {other:?}"),
    }
    // Another client's ID token is refused, naming both audiences accepted.
    let mut other = id_token.clone();
    other["aud"] = json!("another-app");
    let why = unauthenticated(verifier.verify_at(&ec.sign(&other), NOW));
    assert!(
        why.contains(AUDIENCE) && why.contains(INBOX_CLIENT),
        "{why}"
    );
}
