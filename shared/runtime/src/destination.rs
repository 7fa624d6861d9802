//! Where callbacks may go: not to loopback, private, link-local (the cloud
//! metadata service at 169.254.169.254), multicast, unspecified or other
//! special-purpose addresses, unless the allow-list names them. The gateway
//! refuses a literal address at POST time; the notifier checks every address a
//! name resolves to when it connects.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use url::{Host, Url};

use crate::config::Settings;

/// Whether the gateway takes a request's `callbackUrl`: callbacks must be
/// on, and a literal address must be one callbacks may reach.
#[derive(Debug, Clone, Default)]
pub struct CallbackAcceptance {
    pub enabled: bool,
    pub policy: AddressPolicy,
}

impl CallbackAcceptance {
    /// As `settings` configure it (`callbacks.enabled`, `callbacks.allow`).
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            enabled: settings.callbacks_enabled(),
            policy: AddressPolicy::new(settings.callbacks.allowed()),
        }
    }

    /// Why `callback_url` (a valid http or https URL) is refused, if it is.
    pub fn refusal(&self, callback_url: &str) -> Option<String> {
        if !self.enabled {
            return Some("callbacks are not enabled on this deployment (callbacks.enabled)".into());
        }
        let url = Url::parse(callback_url).ok()?;
        self.policy.literal_refusal(&url)
    }
}

/// The addresses callbacks may reach.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    allowed: Vec<IpNet>,
}

impl AddressPolicy {
    pub fn new(allowed: Vec<IpNet>) -> Self {
        Self { allowed }
    }

    /// Why `address` may not be reached, or `None` if it may.
    pub fn refusal(&self, address: IpAddr) -> Option<&'static str> {
        let address = canonical(address);
        if self.allowed.iter().any(|net| net.contains(&address)) {
            return None;
        }
        special(address)
    }

    /// Why the literal address in `url`'s host may not be reached; `None` for
    /// a permitted address and for a name (checked when it is resolved).
    pub fn literal_refusal(&self, url: &Url) -> Option<String> {
        let address = match url.host()? {
            Host::Ipv4(v4) => IpAddr::V4(v4),
            Host::Ipv6(v6) => IpAddr::V6(v6),
            Host::Domain(_) => return None,
        };
        self.refusal(address)
            .map(|kind| format!("{address} is {kind}, which callbacks may not reach"))
    }
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is judged as IPv4.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

fn special(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = v4.octets();
    if v4.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if v4.is_loopback() {
        Some("loopback")
    } else if v4.is_private() {
        Some("private")
    } else if v4.is_link_local() {
        Some("link-local")
    } else if v4.is_multicast() {
        Some("multicast")
    } else if v4.is_broadcast() || a >= 240 {
        Some("reserved")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared (carrier-grade NAT)")
    } else {
        None
    }
}

fn special_v6(v6: Ipv6Addr) -> Option<&'static str> {
    let first = v6.segments()[0];
    if v6.is_unspecified() {
        Some("unspecified")
    } else if v6.is_loopback() {
        Some("loopback")
    } else if v6.is_multicast() {
        Some("multicast")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if first & 0xfe00 == 0xfc00 {
        Some("private (unique local)")
    } else if let Some(v4) = v6.to_ipv4() {
        // IPv4-compatible and NAT64-free embeddings judged by their IPv4 part.
        special_v4(v4)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::AddressPolicy;

    fn refused(policy: &AddressPolicy, url: &str) -> bool {
        policy
            .literal_refusal(&url::Url::parse(url).expect("url"))
            .is_some()
    }

    #[test]
    fn special_addresses_are_refused() {
        let policy = AddressPolicy::default();
        for url in [
            "http://169.254.169.254/latest/meta-data",
            "http://10.0.0.1/",
            "http://172.16.5.4/",
            "http://192.168.1.1/",
            "http://127.0.0.1:8080/",
            "http://[::1]/",
            "http://[::ffff:10.0.0.1]/",
            "http://[fe80::1]/",
            "http://[fd00::1]/",
            "http://0.0.0.0/",
            "http://224.0.0.1/",
            "http://100.64.0.1/",
        ] {
            assert!(refused(&policy, url), "{url} should be refused");
        }
    }

    #[test]
    fn public_addresses_and_names_pass_the_literal_check() {
        let policy = AddressPolicy::default();
        for url in [
            "https://93.184.215.14/hook",
            "https://[2606:4700::1]/",
            "https://example.com/",
            "http://localhost/",
        ] {
            assert!(!refused(&policy, url), "{url} should pass");
        }
    }

    #[test]
    fn the_allow_list_admits_what_it_names() {
        let policy = AddressPolicy::new(vec!["127.0.0.0/8".parse().expect("net")]);
        assert!(!refused(&policy, "http://127.0.0.1:9000/"));
        assert!(refused(&policy, "http://10.0.0.1/"));
        assert!(refused(&policy, "http://[::1]/"));
    }
}
