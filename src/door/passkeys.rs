//! The `--passkey-*` settings: who this broker is to WebAuthn authenticators (the relying party
//! id every passkey is bound to, and its name) and the browser origins a passkey may be used
//! from. Read once at start; an id or origin that cannot work (an origin whose host is not the
//! id or under it) stops the broker rather than leaving every passkey refused later.

use crate::domain::passkey::RelyingParty;
use crate::error::{Error, Result};

/// The `--passkey-*` settings (docs/identity.md, "Passkeys").
#[derive(Debug, Clone, clap::Args)]
pub struct PasskeyFlags {
    /// The WebAuthn relying party id passkeys are registered for and checked against: a host
    /// name, the inbox's or a parent domain of it (`approvals.example.com`, `example.com`).
    /// Default: the host of `--webhooks-inbox-url`, else `localhost`. Changing it makes every
    /// passkey registered before unusable.
    #[arg(long, env = "APPROVALS_PASSKEY_RP_ID")]
    pub passkey_rp_id: Option<String>,

    /// The name authenticators show for the relying party.
    #[arg(
        long,
        env = "APPROVALS_PASSKEY_RP_NAME",
        default_value = "Approval broker"
    )]
    pub passkey_rp_name: String,

    /// The origins (`https://approvals.example.com`, comma-separated) a passkey may be used
    /// from: the inbox's. Default: the origin of `--webhooks-inbox-url`, else
    /// `http(s)://localhost:<port>` of the port the broker serves.
    #[arg(long, env = "APPROVALS_PASSKEY_ORIGIN", value_delimiter = ',')]
    pub passkey_origin: Vec<String>,

    /// `preferred`: a passkey needs the person present (UP); `required`: also verified by the
    /// authenticator (PIN or biometrics, UV).
    #[arg(
        long,
        env = "APPROVALS_PASSKEY_USER_VERIFICATION",
        default_value = "preferred",
        value_parser = ["preferred", "required"]
    )]
    pub passkey_user_verification: String,
}

impl Default for PasskeyFlags {
    fn default() -> Self {
        Self {
            passkey_rp_id: None,
            passkey_rp_name: "Approval broker".into(),
            passkey_origin: Vec::new(),
            passkey_user_verification: "preferred".into(),
        }
    }
}

/// An origin's scheme and host, if it is `http(s)://host[:port]` and nothing more.
fn origin_host(origin: &str) -> Option<&str> {
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))?;
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    let host = match rest.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => rest,
    };
    (!host.is_empty()).then_some(host)
}

/// Whether `id` can be a relying party id: a host name of letters, digits, `.` and `-`.
fn is_host_name(id: &str) -> bool {
    !id.is_empty()
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
}

/// The origin of a URL (`https://host:8443/inbox` gives `https://host:8443`).
fn origin_of(url: &str) -> Option<String> {
    let scheme_end = url.find("://")? + 3;
    let end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    let origin = &url[..end];
    origin_host(origin).map(|_| origin.to_owned())
}

impl PasskeyFlags {
    /// The relying party, from the settings, the inbox's URL (`--webhooks-inbox-url`) and the
    /// port and scheme the broker serves on. INVALID_ARGUMENT naming the setting otherwise.
    pub fn relying_party(
        &self,
        inbox_url: Option<&str>,
        port: u16,
        tls: bool,
    ) -> Result<RelyingParty> {
        // The inbox's URL counts only where its host can be a relying party id (an IPv6
        // literal cannot): otherwise the defaults are localhost's, and the broker starts.
        let inbox_origin = inbox_url
            .and_then(origin_of)
            .filter(|origin| origin_host(origin).is_some_and(is_host_name));
        let origins = if !self.passkey_origin.is_empty() {
            self.passkey_origin.clone()
        } else if let Some(origin) = &inbox_origin {
            vec![origin.clone()]
        } else {
            let scheme = if tls { "https" } else { "http" };
            vec![format!("{scheme}://localhost:{port}")]
        };
        let id = match &self.passkey_rp_id {
            Some(id) => id.clone(),
            None => inbox_origin
                .as_deref()
                .and_then(origin_host)
                .unwrap_or("localhost")
                .to_owned(),
        };
        if !is_host_name(&id) {
            return Err(Error::invalid(
                "--passkey-rp-id",
                format!("`{id}` is not a host name (letters, digits, `.` and `-`)"),
            ));
        }
        for origin in &origins {
            let Some(host) = origin_host(origin) else {
                return Err(Error::invalid(
                    "--passkey-origin",
                    format!("`{origin}` is not an origin (`https://host[:port]`)"),
                ));
            };
            if host != id && !host.ends_with(&format!(".{id}")) {
                return Err(Error::invalid(
                    "--passkey-origin",
                    format!(
                        "`{origin}` is not on `{id}` (--passkey-rp-id) or under it: browsers \
                         would refuse every passkey there"
                    ),
                ));
            }
        }
        Ok(RelyingParty {
            id,
            name: self.passkey_rp_name.clone(),
            origins,
            require_user_verification: self.passkey_user_verification == "required",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relying_party_defaults_to_the_inbox_or_localhost_and_refuses_origins_off_its_id() {
        let flags = PasskeyFlags::default();
        let local = flags.relying_party(None, 50051, false).unwrap();
        assert_eq!(local.id, "localhost");
        assert_eq!(local.origins, ["http://localhost:50051"]);
        let inbox = flags
            .relying_party(Some("https://approvals.example.com/inbox"), 443, true)
            .unwrap();
        assert_eq!(inbox.id, "approvals.example.com");
        assert_eq!(inbox.origins, ["https://approvals.example.com"]);
        let parent = PasskeyFlags {
            passkey_rp_id: Some("example.com".into()),
            passkey_origin: vec![
                "https://a.example.com".into(),
                "https://example.com:8443".into(),
            ],
            ..PasskeyFlags::default()
        };
        assert_eq!(
            parent.relying_party(None, 1, true).unwrap().origins.len(),
            2
        );
        let off = PasskeyFlags {
            passkey_rp_id: Some("example.com".into()),
            passkey_origin: vec!["https://evilexample.com".into()],
            ..PasskeyFlags::default()
        };
        let err = off.relying_party(None, 1, true).unwrap_err().to_string();
        assert!(err.starts_with("--passkey-origin"), "{err}");
        let path = PasskeyFlags {
            passkey_origin: vec!["http://localhost:1/x".into()],
            ..PasskeyFlags::default()
        };
        assert!(path.relying_party(None, 1, false).is_err());
        // An inbox at an IPv6 literal cannot be a relying party: localhost's defaults apply.
        let v6 = flags
            .relying_party(Some("https://[::1]:8443/"), 8443, true)
            .unwrap();
        assert_eq!(v6.id, "localhost");
    }
}
