//! The egress policy: which addresses webhook delivery may connect to. An endpoint's URL is an
//! admin's input, but it must not aim the broker inward: at its own ports, a cloud's metadata
//! service (`169.254.169.254`), a database on the private network. So by default delivery
//! refuses every address that is not a public unicast one (loopback, link-local, private,
//! shared CGNAT, unique-local, multicast, unspecified, reserved, and IPv4 ones written as IPv6);
//! `--webhook-allow-hosts` names the internal receivers an operator means, by network or by name.
//!
//! Checked twice: when an endpoint is created or changed (a literal address, or a `localhost`
//! name), and on every connection, after DNS, on the one address then connected to. Nothing here
//! may resolve a name and let the caller connect to another answer than the one it checked: that
//! is how DNS rebinding would get past.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use crate::domain::webhook::WebhookUrl;

/// The setting that widens the policy, named in every refusal.
pub const SETTING: &str = "--webhook-allow-hosts";

/// One entry of `--webhook-allow-hosts`: a network (`10.1.0.0/16`, `127.0.0.1`, `fd00::/8`),
/// whose addresses delivery may connect to whatever name led there; or a host name
/// (`hooks.internal`), whose URLs may connect to whatever it resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHost {
    Network { address: IpAddr, prefix: u8 },
    Name(String),
}

impl AllowedHost {
    fn admits_address(&self, ip: IpAddr) -> bool {
        let AllowedHost::Network { address, prefix } = self else {
            return false;
        };
        match (canonical(*address), canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => same_prefix(net.to_bits(), ip.to_bits(), *prefix),
            (IpAddr::V6(net), IpAddr::V6(ip)) => same_prefix(net.to_bits(), ip.to_bits(), *prefix),
            _ => false,
        }
    }

    fn admits_name(&self, host: &str) -> bool {
        matches!(self, AllowedHost::Name(name) if *name == normal_name(host))
    }
}

/// Whether `a` and `b` share their first `prefix` bits.
fn same_prefix<T>(a: T, b: T, prefix: u8) -> bool
where
    T: Copy + std::ops::BitXor<Output = T> + std::ops::Shr<u32, Output = T> + PartialEq + From<u8>,
{
    let bits = (std::mem::size_of::<T>() * 8) as u32;
    let prefix = u32::from(prefix);
    prefix == 0 || (a ^ b) >> (bits - prefix) == T::from(0)
}

impl FromStr for AllowedHost {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("an empty entry (use a network such as 10.0.0.0/8, or a host name)".into());
        }
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let bare = address.trim_start_matches('[').trim_end_matches(']');
        if let Ok(address) = bare.parse::<IpAddr>() {
            let most = if address.is_ipv4() { 32 } else { 128 };
            let prefix =
                match prefix {
                    None => most,
                    Some(p) => p.parse::<u8>().ok().filter(|p| *p <= most).ok_or_else(|| {
                        format!("`{text}`: the prefix length must be 0 to {most}")
                    })?,
                };
            return Ok(AllowedHost::Network { address, prefix });
        }
        if prefix.is_some() {
            return Err(format!("`{text}` is not a network (such as 10.0.0.0/8)"));
        }
        let name = normal_name(text);
        let valid = name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
        if !valid || name.len() > 253 {
            return Err(format!(
                "`{text}` is neither an address, a network nor a host name"
            ));
        }
        Ok(AllowedHost::Name(name))
    }
}

impl fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowedHost::Network { address, prefix } => write!(f, "{address}/{prefix}"),
            AllowedHost::Name(name) => f.write_str(name),
        }
    }
}

/// A host name as compared: lower case, without a trailing dot.
fn normal_name(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Which addresses delivery may connect to: public unicast ones, and those the allow-list names.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    allowed: Vec<AllowedHost>,
}

impl EgressPolicy {
    pub fn new(allowed: Vec<AllowedHost>) -> Self {
        Self { allowed }
    }

    /// Why a URL is refused before anything is resolved: its host is a literal address the
    /// policy refuses, or a `localhost` name (RFC 6761: always loopback). Other names are checked
    /// at delivery, on the address they resolve to then.
    pub fn check_url(&self, url: &WebhookUrl) -> Result<(), String> {
        let Some(host) = url_host(url) else {
            return Ok(());
        };
        if self.allowed.iter().any(|a| a.admits_name(&host)) {
            return Ok(());
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return match self.refusal(ip) {
                Some(class) => Err(format!(
                    "{host} is {class} address: webhooks may not reach internal addresses \
                     unless `{SETTING}` names them"
                )),
                None => Ok(()),
            };
        }
        let name = normal_name(&host);
        if name == "localhost" || name.ends_with(".localhost") {
            return Err(format!(
                "{host} is a loopback name: webhooks may not reach internal addresses unless \
                 `{SETTING}` names them"
            ));
        }
        Ok(())
    }

    /// The address to connect to for `host`, out of what it resolved to: the first the policy
    /// admits (all of them when the allow-list names the host). `Err`: why none is admitted.
    pub fn pick(&self, host: &str, resolved: &[SocketAddr]) -> Result<SocketAddr, String> {
        if self.allowed.iter().any(|a| a.admits_name(host)) {
            return resolved
                .first()
                .copied()
                .ok_or_else(|| format!("{host} resolved to no address"));
        }
        let mut refused = None;
        for address in resolved {
            match self.refusal(address.ip()) {
                None => return Ok(*address),
                Some(class) => {
                    refused.get_or_insert((address.ip(), class));
                }
            }
        }
        Err(match refused {
            Some((ip, class)) => format!(
                "refused by the egress policy: {host} resolved to {ip}, {class} address \
                 (`{SETTING}` names the internal receivers to allow)"
            ),
            None => format!("{host} resolved to no address"),
        })
    }

    /// The class of `ip` (`"a loopback"`, ...) when the policy refuses it.
    fn refusal(&self, ip: IpAddr) -> Option<&'static str> {
        let class = internal_class(ip)?;
        (!self.allowed.iter().any(|a| a.admits_address(ip))).then_some(class)
    }
}

/// The URL's host without brackets (`[::1]` is `::1`), if it has one.
fn url_host(url: &WebhookUrl) -> Option<String> {
    let uri: hyper::Uri = url.as_str().parse().ok()?;
    let host = uri.host()?;
    Some(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    )
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) as the IPv4 address it reaches.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// What kind of address `ip` is, with its article, when it is not a public unicast one.
pub fn internal_class(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(match (a, b) {
        _ if ip.is_unspecified() => "an unspecified",
        (0, _) => "a this-network (0.0.0.0/8)",
        (127, _) => "a loopback",
        (10, _) | (192, 168) => "a private",
        (172, 16..=31) => "a private",
        (169, 254) => "a link-local",
        (100, 64..=127) => "a shared (CGNAT, 100.64.0.0/10)",
        (192, 0) if ip.octets()[2] == 0 => "an IETF protocol (192.0.0.0/24)",
        (198, 18..=19) => "a benchmarking (198.18.0.0/15)",
        (224..=239, _) => "a multicast",
        (240..=255, _) => "a reserved or broadcast",
        _ => return None,
    })
}

fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    let segments = ip.segments();
    Some(match segments[0] {
        _ if ip.is_unspecified() => "an unspecified",
        _ if ip.is_loopback() => "a loopback",
        // ::a.b.c.d (IPv4-compatible, deprecated) and the rest of ::/96.
        0 if segments[..6] == [0; 6] => "an IPv4-compatible",
        // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
        0x64 if segments[1..6] == [0xff9b, 0, 0, 0, 0] => {
            let embedded = Ipv4Addr::from_bits(ip.to_bits() as u32);
            return v4_class(embedded);
        }
        // 6to4 (2002::/16) reaches the IPv4 address in bits 16 to 48.
        0x2002 => {
            let embedded = Ipv4Addr::from_bits((ip.to_bits() >> 80) as u32);
            return v4_class(embedded);
        }
        s if s & 0xfe00 == 0xfc00 => "a unique-local",
        s if s & 0xffc0 == 0xfe80 => "a link-local",
        s if s & 0xffc0 == 0xfec0 => "a site-local",
        s if s & 0xff00 == 0xff00 => "a multicast",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allowed: &[&str]) -> EgressPolicy {
        EgressPolicy::new(allowed.iter().map(|a| a.parse().unwrap()).collect())
    }

    fn url(text: &str) -> WebhookUrl {
        WebhookUrl::parse("url", text).unwrap()
    }

    #[test]
    fn every_internal_address_class_is_refused_and_public_addresses_are_not() {
        for (ip, class) in [
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "this-network"),
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "shared"),
            ("100.127.255.1", "shared"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fc00::1", "unique-local"),
            ("fd12:3456::1", "unique-local"),
            ("ff02::1", "multicast"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:0.0.0.0", "unspecified"),
            ("::127.0.0.1", "IPv4-compatible"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("2002:7f00:1::", "loopback"),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let found = internal_class(ip).unwrap_or_else(|| panic!("{ip} was not refused"));
            assert!(found.contains(class), "{ip}: {found}, not {class}");
        }
        for ip in [
            "93.184.216.34",
            "172.32.0.1",
            "100.128.0.1",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:93.184.216.34",
            "64:ff9b::808:808",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(internal_class(ip), None, "{ip}");
        }
    }

    #[test]
    fn literal_internal_addresses_and_localhost_are_refused_at_creation_naming_the_setting() {
        let none = policy(&[]);
        for refused in [
            "http://127.0.0.1:8080/h",
            "http://[::1]/h",
            "http://[::ffff:7f00:1]/h",
            "https://169.254.169.254/latest/meta-data",
            "http://LOCALHOST./h",
            "http://api.localhost/h",
        ] {
            let err = none.check_url(&url(refused)).unwrap_err();
            assert!(err.contains(SETTING), "{refused}: {err}");
        }
        // Names are judged on what they resolve to, at delivery.
        assert!(none.check_url(&url("https://hooks.example.com/h")).is_ok());
        assert!(none.check_url(&url("https://93.184.216.34/h")).is_ok());

        let allowed = policy(&["127.0.0.0/8", "::1", "localhost"]);
        for url_text in [
            "http://127.0.0.1:8080/h",
            "http://[::1]/h",
            "http://localhost/h",
        ] {
            assert!(allowed.check_url(&url(url_text)).is_ok(), "{url_text}");
        }
        assert!(allowed.check_url(&url("http://10.0.0.1/h")).is_err());
    }

    /// The check after DNS: a name resolving to internal addresses is refused whatever the name;
    /// among several answers the first admitted one is what delivery connects to.
    #[test]
    fn resolved_addresses_are_checked_and_only_an_admitted_one_is_picked() {
        let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 443);
        let none = policy(&[]);
        let err = none
            .pick("hooks.example.com", &[at("169.254.169.254")])
            .unwrap_err();
        assert!(
            err.contains("169.254.169.254") && err.contains("link-local"),
            "{err}"
        );
        assert!(
            none.pick("rebound.example", &[at("::ffff:127.0.0.1")])
                .is_err()
        );
        assert_eq!(
            none.pick("mixed.example", &[at("10.0.0.1"), at("93.184.216.34")]),
            Ok(at("93.184.216.34"))
        );
        assert!(none.pick("nothing.example", &[]).is_err());

        let networks = policy(&["10.1.0.0/16", "fd00::/8"]);
        assert_eq!(networks.pick("a", &[at("10.1.2.3")]), Ok(at("10.1.2.3")));
        assert_eq!(
            networks.pick("a", &[at("::ffff:10.1.2.3")]),
            Ok(at("::ffff:10.1.2.3"))
        );
        assert_eq!(networks.pick("a", &[at("fd00::5")]), Ok(at("fd00::5")));
        assert!(networks.pick("a", &[at("10.2.0.1")]).is_err());
        assert!(networks.pick("a", &[at("127.0.0.1")]).is_err());

        let named = policy(&["Hooks.Internal."]);
        assert_eq!(
            named.pick("hooks.internal", &[at("10.9.9.9")]),
            Ok(at("10.9.9.9"))
        );
        assert!(named.pick("other.internal", &[at("10.9.9.9")]).is_err());
    }

    #[test]
    fn allow_list_entries_parse_or_say_what_is_wrong() {
        assert_eq!(
            "10.0.0.0/8".parse(),
            Ok(AllowedHost::Network {
                address: "10.0.0.0".parse().unwrap(),
                prefix: 8
            })
        );
        assert_eq!(
            "[::1]".parse(),
            Ok(AllowedHost::Network {
                address: "::1".parse().unwrap(),
                prefix: 128
            })
        );
        assert_eq!(
            "Hooks.Internal".parse(),
            Ok(AllowedHost::Name("hooks.internal".into()))
        );
        for bad in ["", "10.0.0.0/33", "::/129", "hooks/8", "a b", "a..b"] {
            assert!(bad.parse::<AllowedHost>().is_err(), "{bad}");
        }
        assert!(
            policy(&["0.0.0.0/0"])
                .pick("a", &[SocketAddr::from(([10, 0, 0, 1], 1))])
                .is_ok()
        );
    }
}
