//! Who may do what (ldm6-protocol.md §6, ldm-formats.md §1): ALLOW decides which downstreams
//! may connect and what they receive; ACCEPT decides which pushes are taken.
//!
//! * A host is allowed if some ALLOW entry's host ERE matches its address (dotted quad) or its
//!   name. Otherwise the connection is refused as the reference refuses it.
//! * A request is reduced spec by spec: the first ALLOW entry for the host whose feedtype
//!   overlaps the spec's decides; the spec keeps the overlap, and products must also match that
//!   entry's OK ERE and not its NOT ERE ([`ProductFilter`]). Nothing left → refused
//!   (AUTH_TOOWEAK); less than asked → RECLASS; else OK.
//! * A push offer is reduced the same way against ACCEPT entries for the host.

use std::fmt;
use std::net::IpAddr;

use ldm7_types::{FeedType, Pattern, ProdClass, ProdInfo, ProdSpec};

use crate::hosts::{HostMatch, peer_address};
use crate::ldmd::Config;

/// The peer of a connection: its address and, when it resolves, its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerHost {
    /// The address.
    pub ip: IpAddr,
    /// The name from reverse DNS, if any.
    pub name: Option<String>,
}

impl PeerHost {
    /// A peer known by address only (an IPv4-mapped address as its IPv4 address).
    pub fn from_ip(ip: IpAddr) -> Self {
        Self { ip: peer_address(ip), name: None }
    }

    /// The name LDM puts in a relayed origin: the host name, else the address.
    pub fn origin_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.ip.to_string())
    }

    /// Whether an entry's host field names this peer (address or name).
    pub fn matches(&self, host: &HostMatch) -> bool {
        host.matches(self.ip, self.name.as_deref())
    }
}

impl fmt::Display for PeerHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "{name} [{}]", self.ip),
            None => write!(f, "{}", self.ip),
        }
    }
}

/// Whether the host may connect at all: an ALLOW or an ACCEPT entry names it (as the
/// reference's `lcf_isHostOk`; what it may then ask for or send is decided per call).
pub fn is_host_allowed(config: &Config, peer: &PeerHost) -> bool {
    config.allows.iter().any(|allow| peer.matches(&allow.host))
        || config.accepts.iter().any(|accept| peer.matches(&accept.host))
}

/// The per-product test an upstream applies on top of the class: the OK and NOT EREs of the
/// ALLOW entry that admitted each spec.
#[derive(Clone, Debug)]
pub struct ProductFilter {
    rules: Vec<Rule>,
}

#[derive(Clone, Debug)]
struct Rule {
    feedtype: FeedType,
    ok: Pattern,
    not: Option<Pattern>,
}

impl ProductFilter {
    /// Lets nothing through.
    pub fn nothing() -> Self {
        Self { rules: Vec::new() }
    }

    /// Whether the product may be sent.
    pub fn allows(&self, info: &ProdInfo) -> bool {
        self.rules.iter().any(|rule| {
            rule.feedtype.intersects(info.feedtype)
                && rule.ok.is_match(&info.ident)
                && !rule.not.as_ref().is_some_and(|not| not.is_match(&info.ident))
        })
    }
}

/// The outcome of reducing a request to what ALLOW permits.
#[derive(Clone, Debug)]
pub enum Allowed {
    /// Everything asked is allowed.
    Ok(ProductFilter),
    /// Only this class is allowed.
    Reclass(ProdClass, ProductFilter),
    /// Nothing asked is allowed.
    Nothing,
    /// No ALLOW entry names the host.
    NotAllowedHost,
}

/// Reduces a request to what the ALLOW entries for `peer` permit.
pub fn reduce_to_allowed(config: &Config, peer: &PeerHost, class: &ProdClass) -> Allowed {
    let entries: Vec<_> = config.allows.iter().filter(|allow| peer.matches(&allow.host)).collect();
    if entries.is_empty() {
        return Allowed::NotAllowedHost;
    }
    let mut specs = Vec::new();
    let mut rules = Vec::new();
    for spec in &class.specs {
        let Some(allow) = entries.iter().find(|allow| allow.feedtype.intersects(spec.feedtype)) else { continue };
        let feedtype = FeedType(spec.feedtype.bits() & allow.feedtype.bits());
        specs.push(ProdSpec { feedtype, pattern: spec.pattern.clone() });
        rules.push(Rule { feedtype, ok: allow.ok.clone(), not: allow.not.clone() });
    }
    if specs.is_empty() {
        return Allowed::Nothing;
    }
    let filter = ProductFilter { rules };
    let same = specs.len() == class.specs.len()
        && specs.iter().zip(&class.specs).all(|(allowed, asked)| allowed.feedtype == asked.feedtype);
    if same { Allowed::Ok(filter) } else { Allowed::Reclass(ProdClass { specs, ..class.clone() }, filter) }
}

/// The outcome of matching a push offer against ACCEPT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptDecision {
    /// The whole offer.
    Ok,
    /// Only this class.
    Reclass(ProdClass),
    /// Nothing.
    Refuse,
}

/// Matches a HIYA offer against the ACCEPT entries for `peer`; the accepted class is returned
/// with it so that pushed products can be checked.
pub fn accept(config: &Config, peer: &PeerHost, offered: &ProdClass) -> (AcceptDecision, ProdClass) {
    let entries: Vec<_> = config.accepts.iter().filter(|accept| peer.matches(&accept.host)).collect();
    let mut specs = Vec::new();
    let mut whole = true;
    for spec in &offered.specs {
        let mut covered = FeedType::NONE;
        for accept in entries.iter().filter(|accept| accept.feedtype.intersects(spec.feedtype)) {
            let feedtype = FeedType(spec.feedtype.bits() & accept.feedtype.bits());
            covered = covered | feedtype;
            // The offer's pattern stands if the entry takes every product; else the entry's.
            let pattern =
                if accept.pattern.matches_everything() { spec.pattern.clone() } else { accept.pattern.clone() };
            if !accept.pattern.matches_everything() {
                whole = false;
            }
            specs.push(ProdSpec { feedtype, pattern });
        }
        if covered != spec.feedtype {
            whole = false;
        }
    }
    let class = ProdClass { specs, ..offered.clone() };
    if class.specs.is_empty() {
        (AcceptDecision::Refuse, class)
    } else if whole {
        (AcceptDecision::Ok, class)
    } else {
        (AcceptDecision::Reclass(class.clone()), class)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use ldm7_types::{Signature, Timestamp};

    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, Path::new("ldmd.conf")).unwrap()
    }

    fn local() -> PeerHost {
        PeerHost { ip: "127.0.0.1".parse().unwrap(), name: Some("localhost".into()) }
    }

    fn class(feedtype: FeedType, pattern: &str) -> ProdClass {
        ProdClass::new(feedtype, pattern).unwrap()
    }

    fn info(feedtype: FeedType, ident: &str) -> ProdInfo {
        ProdInfo {
            arrival: Timestamp::ZERO,
            signature: Signature([0; 16]),
            origin: "o".into(),
            feedtype,
            seqno: 0,
            ident: ident.into(),
            size: 0,
        }
    }

    #[test]
    fn hosts_match_by_address_or_name_case_insensitively() {
        let by_name = config("ALLOW ANY ^LOCALHOST$\n");
        assert!(is_host_allowed(&by_name, &local()));
        let by_ip = config("ALLOW ANY ^127\\.0\\.0\\.1$\n");
        assert!(is_host_allowed(&by_ip, &PeerHost::from_ip("127.0.0.1".parse().unwrap())));
        let other = config("ALLOW ANY \\.ucar\\.edu$\n");
        assert!(!is_host_allowed(&other, &local()));
        // A host that only pushes (ACCEPT) connects too.
        assert!(is_host_allowed(&config("ACCEPT EXP ^rtstats- ^localhost$\n"), &local()));
        assert!(matches!(reduce_to_allowed(&other, &local(), &class(FeedType::EXP, ".*")), Allowed::NotAllowedHost));
    }

    #[test]
    fn requests_are_reduced_to_the_allowed_feeds() {
        let config = config("ALLOW EXP ^localhost$\n");
        assert!(matches!(reduce_to_allowed(&config, &local(), &class(FeedType::EXP, ".*")), Allowed::Ok(_)));
        // The capture's case: EXP|PPS asked, EXP allowed → RECLASS to EXP.
        match reduce_to_allowed(&config, &local(), &class(FeedType(0x4000_0001), ".*")) {
            Allowed::Reclass(reduced, _) => assert_eq!(reduced.feedtype(), FeedType::EXP),
            other => panic!("{other:?}"),
        }
        assert!(matches!(reduce_to_allowed(&config, &local(), &class(FeedType::IDS, ".*")), Allowed::Nothing));
    }

    #[test]
    fn ok_and_not_patterns_filter_products() {
        let config = config("ALLOW ANY ^localhost$ ^TEST/ \\.secret$\n");
        let Allowed::Ok(filter) = reduce_to_allowed(&config, &local(), &class(FeedType::ANY, ".*")) else { panic!() };
        assert!(filter.allows(&info(FeedType::EXP, "TEST/cap.1")));
        assert!(!filter.allows(&info(FeedType::EXP, "OTHER/cap.1")));
        assert!(!filter.allows(&info(FeedType::EXP, "TEST/x.secret")));
        assert!(!ProductFilter::nothing().allows(&info(FeedType::EXP, "TEST/cap.1")));
    }

    #[test]
    fn push_offers_are_matched_against_accept() {
        let config = config("ACCEPT EXP .* ^((localhost|loopback)|(127\\.0\\.0\\.1\\.?))$\nACCEPT IDS ^SA localhost\n");
        assert_eq!(accept(&config, &local(), &class(FeedType::EXP, ".*")).0, AcceptDecision::Ok);
        match accept(&config, &local(), &class(FeedType(FeedType::EXP.bits() | FeedType::IDS.bits()), ".*")).0 {
            AcceptDecision::Reclass(class) => assert_eq!(class.specs.len(), 2),
            other => panic!("{other:?}"),
        }
        assert_eq!(accept(&config, &local(), &class(FeedType::NEXRAD3, ".*")).0, AcceptDecision::Refuse);
        let stranger = PeerHost::from_ip("10.1.2.3".parse().unwrap());
        assert_eq!(accept(&config, &stranger, &class(FeedType::EXP, ".*")).0, AcceptDecision::Refuse);
    }
}
