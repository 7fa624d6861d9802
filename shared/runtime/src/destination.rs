//! Where callbacks may go: not to loopback, private, link-local (the cloud
//! metadata service at 169.254.169.254), multicast, unspecified or other
//! special-purpose addresses (Azure's WireServer at 168.63.129.16, the
//! benchmarking, documentation and IETF ranges, Teredo), unless the
//! allow-list names them. An IPv6 address that carries an IPv4 one (mapped,
//! NAT64, 6to4) is judged by it. The gateway refuses a literal address at POST
//! time; the notifier checks every address a name resolves to when it connects.

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

    /// Why `address` may not be reached, or `None` if it may. An IPv6
    /// address that carries an IPv4 one (mapped, NAT64, 6to4) is judged by
    /// that IPv4 address, and the allow-list admits it by either.
    pub fn refusal(&self, address: IpAddr) -> Option<&'static str> {
        let v4 = as_v4(address).map(IpAddr::V4);
        if self
            .allowed
            .iter()
            .any(|net| net.contains(&address) || v4.is_some_and(|v4| net.contains(&v4)))
        {
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

/// The IPv4 address an IPv6 address carries where it stands for that IPv4
/// destination: IPv4-mapped (`::ffff:10.0.0.1`) and IPv4-compatible
/// (`::10.0.0.1`), NAT64 (`64:ff9b::/96`, and local-use `64:ff9b:1::/96`:
/// RFC 6052's /96 form) and 6to4 (`2002:AABB:CCDD::/48`, RFC 3056).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let low = Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7]));
    match s {
        [0x0064, 0xff9b, 0, 0, 0, 0, ..] | [0x0064, 0xff9b, 1, 0, 0, 0, ..] => Some(low),
        [0x2002, high, low16, ..] => {
            Some(Ipv4Addr::from((u32::from(high) << 16) | u32::from(low16)))
        }
        _ => v6.to_ipv4(),
    }
}

/// `address` as the IPv4 address it stands for, when it carries one.
fn as_v4(address: IpAddr) -> Option<Ipv4Addr> {
    match address {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(v6) => embedded_v4(v6),
    }
}

fn special(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

/// Azure's WireServer and host DNS: a public address every Azure VM reaches.
const AZURE_HOST: Ipv4Addr = Ipv4Addr::new(168, 63, 129, 16);

fn special_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = v4.octets();
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
    } else if v4 == AZURE_HOST {
        Some("the Azure host service (WireServer)")
    } else if (a, b, c) == (192, 0, 0) {
        Some("an IETF protocol assignment")
    } else if a == 198 && (b == 18 || b == 19) {
        Some("for benchmarking")
    } else if matches!((a, b, c), (192, 0, 2) | (198, 51, 100) | (203, 0, 113)) {
        Some("for documentation")
    } else {
        None
    }
}

fn special_v6(v6: Ipv6Addr) -> Option<&'static str> {
    let [first, second, third, ..] = v6.segments();
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
    } else if (first, second) == (0x2001, 0x0db8) {
        Some("for documentation")
    } else if (first, second) == (0x2001, 0) {
        // Teredo tunnels to an address its server and relay choose.
        Some("a Teredo tunnel")
    } else if let Some(v4) = embedded_v4(v6) {
        special_v4(v4)
    } else if (first, second, third) == (0x0064, 0xff9b, 1) {
        // Local-use NAT64 with a prefix longer than /48 and shorter than
        // /96 puts the IPv4 address where no fixed rule can read it.
        Some("local-use NAT64 whose IPv4 address cannot be read")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::AddressPolicy;

    fn refused(policy: &AddressPolicy, url: &str) -> bool {
        policy
            .literal_refusal(&url::Url::parse(url).expect("url"))
            .is_some()
    }

    fn address(text: &str) -> IpAddr {
        text.parse().expect("an address")
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

    /// Each range the review of 2026-11-28 found open, with what it is.
    const RANGES: [(&str, &str); 14] = [
        ("168.63.129.16", "the Azure host service (WireServer)"),
        ("192.0.0.8", "an IETF protocol assignment"),
        ("192.0.0.170", "an IETF protocol assignment"),
        ("198.18.0.1", "for benchmarking"),
        ("198.19.255.254", "for benchmarking"),
        ("192.0.2.10", "for documentation"),
        ("198.51.100.7", "for documentation"),
        ("203.0.113.200", "for documentation"),
        ("2001:db8::1", "for documentation"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a Teredo tunnel"),
        // NAT64 and 6to4 judged by the IPv4 address they carry.
        ("64:ff9b::a00:1", "private"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("64:ff9b:1::7f00:1", "loopback"),
        ("2002:a9fe:a9fe::1", "link-local"),
    ];

    #[test]
    fn the_ranges_left_open_before_are_refused_with_what_they_are() {
        let policy = AddressPolicy::default();
        for (text, kind) in RANGES {
            assert_eq!(policy.refusal(address(text)), Some(kind), "{text}");
        }
        for (text, kind) in [
            ("64:ff9b::a83f:8110", "the Azure host service (WireServer)"),
            ("2002:c0a8:101::", "private"),
            ("2002:a83f:8110:1::", "the Azure host service (WireServer)"),
            ("64:ff9b:1:0:0:0:6440:1", "shared (carrier-grade NAT)"),
            (
                "64:ff9b:1:ab00::a00:1",
                "local-use NAT64 whose IPv4 address cannot be read",
            ),
        ] {
            assert_eq!(policy.refusal(address(text)), Some(kind), "{text}");
        }
    }

    #[test]
    fn the_new_ranges_are_refused_as_literals() {
        let policy = AddressPolicy::default();
        for (text, kind) in RANGES {
            let host = match address(text) {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            };
            let url = url::Url::parse(&format!("https://{host}/hook")).expect("url");
            let refusal = policy.literal_refusal(&url).expect(text);
            assert!(refusal.contains(kind), "{text}: {refusal}");
        }
    }

    #[test]
    fn nat64_and_6to4_of_public_addresses_pass() {
        let policy = AddressPolicy::default();
        for text in [
            "64:ff9b::5db8:d70e",
            "64:ff9b:1::5db8:d70e",
            "2002:5db8:d70e::1",
            "168.63.129.17",
            "198.20.0.1",
            "2001:db9::1",
            "2001:1::1",
        ] {
            assert_eq!(policy.refusal(address(text)), None, "{text}");
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

    #[test]
    fn the_allow_list_wins_over_the_new_ranges_and_admits_an_embedded_address() {
        let policy = AddressPolicy::new(
            ["168.63.129.16/32", "10.0.0.0/8", "2001:db8::/32"]
                .map(|net| net.parse().expect("net"))
                .to_vec(),
        );
        for text in [
            "168.63.129.16",
            "2001:db8::1",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "::ffff:10.0.0.1",
        ] {
            assert_eq!(policy.refusal(address(text)), None, "{text}");
        }
        assert!(policy.refusal(address("64:ff9b::c0a8:101")).is_some());
    }
}
