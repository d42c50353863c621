//! The host field of ALLOW and ACCEPT (docs/server.md "IPv6"): which peers an entry names.
//!
//! * As in the reference, an ERE, matched case-insensitively against the peer's address as
//!   text and against its name (reverse DNS). An IPv4 peer's text is its dotted quad; an IPv6
//!   peer's is its RFC 5952 form (`2001:db8::1`, lower case, the longest run of zeros as `::`).
//! * An ldm7 extension: an address prefix, IPv4 or IPv6 (`10.0.0.0/8`, `2001:db8::/32`), names
//!   every peer inside it; an IPv6 address (`2001:db8::1`) names that peer. IPv4-mapped forms
//!   (`::ffff:192.0.2.0/120`) are taken as the IPv4 prefix they map.
//! * A dotted quad without a prefix stays an ERE, as the reference reads it.
//! * Peers are matched by their IPv4 address when they come as IPv4-mapped IPv6 addresses to a
//!   dual-stack listener ([`peer_address`]), so IPv4 entries keep working unchanged.
//!
//! Text made only of address characters (hex digits, `.`, `:`, `/`, then perhaps `%` and an interface) with a `/` or two
//! colons is taken for an address or prefix and must be one: a mistyped prefix is refused with
//! what to write rather than read as an ERE that names nobody.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use ldm7_types::Pattern;

/// The peers an ALLOW or ACCEPT entry names.
#[derive(Clone, Debug)]
pub enum HostMatch {
    /// An ERE against the address text and the name.
    Pattern(Pattern),
    /// Every address in a prefix.
    Network(IpNet),
    /// One IPv6 address.
    Address(IpAddr),
}

impl HostMatch {
    /// Reads an entry's host field.
    pub fn parse(text: &str) -> Result<Self, String> {
        // An interface may follow `%` (fe80::1%eth0).
        let before_scope = text.split('%').next().unwrap_or_default();
        let address_like = !before_scope.is_empty()
            && before_scope.chars().all(|c| c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '/'))
            && (before_scope.contains('/') || before_scope.matches(':').count() >= 2);
        if !address_like {
            return Pattern::new_case_insensitive(text)
                .map(Self::Pattern)
                .map_err(|error| format!("host pattern: {error}"));
        }
        if text.contains('%') {
            return Err(format!(
                "{text:?}: an interface (%…) is not matched: write the address or prefix without it, \
                 as fe80::/10"
            ));
        }
        if let Ok(network) = text.parse::<IpNet>() {
            return Ok(Self::Network(unmapped(network).trunc()));
        }
        if let Ok(address) = text.parse::<IpAddr>() {
            return Ok(match address {
                IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                    Some(v4) => Self::Address(IpAddr::V4(v4)),
                    None => Self::Address(address),
                },
                IpAddr::V4(_) => unreachable!("a dotted quad has neither a / nor colons"),
            });
        }
        let why = match text.split_once('/') {
            Some((_, length)) if length.parse::<u8>().is_err() => " (the prefix length is a number after /)",
            Some((address, _)) if address.contains(':') => " (an IPv6 prefix length is at most 128)",
            Some(_) => " (an IPv4 prefix is a.b.c.d/n, n at most 32)",
            None => "",
        };
        Err(format!(
            "{text:?} is neither an address nor a prefix{why}: write an IPv6 address (2001:db8::1), \
             a prefix (2001:db8::/32 or 192.0.2.0/24), or an ERE such as ^2001:db8:"
        ))
    }

    /// Whether the entry names the peer at `ip` (already [`peer_address`]) called `name`.
    pub fn matches(&self, ip: IpAddr, name: Option<&str>) -> bool {
        match self {
            Self::Pattern(pattern) => {
                pattern.is_match(&ip.to_string()) || name.is_some_and(|name| pattern.is_match(name))
            }
            Self::Network(network) => network.contains(&ip),
            Self::Address(address) => *address == ip,
        }
    }

    /// The field as written (an address or prefix in its normal form).
    pub fn text(&self) -> String {
        match self {
            Self::Pattern(pattern) => pattern.as_str().to_owned(),
            Self::Network(network) => network.to_string(),
            Self::Address(address) => address.to_string(),
        }
    }
}

impl fmt::Display for HostMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

/// The address a peer is matched and named by: an IPv4-mapped IPv6 address (an IPv4 peer of
/// a dual-stack listener) as the IPv4 address it maps.
pub fn peer_address(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// An IPv6 prefix inside `::ffff:0:0/96` as the IPv4 prefix it maps.
fn unmapped(network: IpNet) -> IpNet {
    match network {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).expect("a length ≤ 32"),
            None => network,
        },
        _ => network,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn host(text: &str) -> HostMatch {
        HostMatch::parse(text).unwrap_or_else(|error| panic!("{error}"))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn prefixes_and_addresses() {
        let v6 = host("2001:db8::/32");
        assert!(v6.matches(ip("2001:db8:0:1::7"), None));
        assert!(!v6.matches(ip("2001:db9::1"), None));
        assert!(!v6.matches(ip("192.0.2.1"), None));
        let v4 = host("192.0.2.0/24");
        assert!(v4.matches(ip("192.0.2.200"), None));
        assert!(!v4.matches(ip("192.0.3.1"), None));
        let one = host("2001:DB8::1");
        assert!(one.matches(ip("2001:db8::1"), None));
        assert!(!one.matches(ip("2001:db8::10"), None));
        // Host bits are dropped, as a router would.
        assert_eq!(host("2001:db8::5/32").text(), "2001:db8::/32");
        // IPv4-mapped forms are the IPv4 they map.
        assert!(host("::ffff:192.0.2.0/120").matches(ip("192.0.2.9"), None));
        assert!(host("::ffff:192.0.2.9").matches(ip("192.0.2.9"), None));
    }

    #[test]
    fn eres_stay_eres() {
        // A dotted quad is an ERE, as the reference reads it: its dots match any character.
        let quad = host("192.0.2.1");
        assert!(matches!(quad, HostMatch::Pattern(_)));
        assert!(quad.matches(ip("192.0.2.10"), None));
        assert!(host("^2001:db8:").matches(ip("2001:db8::1"), None));
        assert!(host("^localhost$").matches(ip("::1"), Some("LOCALHOST")));
        assert!(host(".*").matches(ip("fe80::1"), None));
        // An IPv6 peer's text is its RFC 5952 form.
        assert!(host("^2001:db8::1$").matches(ip("2001:0DB8:0:0:0:0:0:1"), None));
    }

    #[test]
    fn malformed_prefixes_say_what_to_write() {
        for (text, says) in [
            ("2001:db8::/129", "at most 128"),
            ("192.0.2.0/33", "at most 32"),
            ("2001:db8:::1", "neither an address nor a prefix"),
            ("2001:db8:", "^2001:db8:"),
            ("fe80::1%eth0", "without it"),
        ] {
            let error = HostMatch::parse(text).unwrap_err();
            assert!(error.contains(says) && error.contains(text), "{text}: {error}");
        }
        // Not only address characters: an ERE (that names nobody), as the reference reads it.
        assert!(matches!(host("2001:db8::/x"), HostMatch::Pattern(_)));
        assert!(HostMatch::parse("^[a").unwrap_err().contains("host pattern"));
    }

    proptest! {
        /// A dual-stack listener sees an IPv4 peer as IPv4-mapped; every entry names it exactly
        /// when it names the IPv4 address (the IPv4 behaviour is kept).
        #[test]
        fn mapped_peers_are_matched_as_ipv4(a in any::<[u8; 4]>(), b in any::<[u8; 4]>(), length in 0u8..=32, octets in 1usize..=4) {
            let v4 = std::net::Ipv4Addr::from(a);
            let mapped = IpAddr::V6(v4.to_ipv6_mapped());
            let other = std::net::Ipv4Addr::from(b);
            let quad = other.octets()[..octets].iter().map(u8::to_string).collect::<Vec<_>>().join(r"\.");
            let entries = [
                host(&format!("{other}/{length}")),
                host(&format!("::ffff:{other}/{}", u32::from(length) + 96)),
                host(&format!("^{quad}")),
                host(&other.to_string()),
            ];
            for entry in &entries {
                prop_assert_eq!(entry.matches(peer_address(mapped), None), entry.matches(IpAddr::V4(v4), None), "{}", entry);
            }
        }

        /// A prefix names exactly the addresses that share its first `length` bits.
        #[test]
        fn ipv6_prefixes_by_bits(a in any::<u128>(), b in any::<u128>(), length in 0u8..=128) {
            let entry = host(&format!("{}/{length}", std::net::Ipv6Addr::from(a)));
            let peer = IpAddr::V6(std::net::Ipv6Addr::from(b));
            let mask = if length == 0 { 0 } else { u128::MAX << (128 - u32::from(length)) };
            // Mapped peers are compared as IPv4; keep to the rest.
            prop_assume!(std::net::Ipv6Addr::from(b).to_ipv4_mapped().is_none());
            prop_assume!(std::net::Ipv6Addr::from(a).to_ipv4_mapped().is_none() || length < 96);
            prop_assert_eq!(entry.matches(peer, None), a & mask == b & mask);
        }
    }
}
