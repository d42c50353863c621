//! The lab spec (`lab.toml`): raw TOML → validated [`LabSpec`] with every derived name.
//!
//! Pure: nothing here touches the system, so every rule is unit-tested. Names derived here are
//! the only names the lab ever creates or deletes:
//! - network namespace of host H: `LAB-H`; of the bridges: `LAB-core`;
//! - feed interface in every member host: the feed name (a veth end, or a TAP for VDE feeds);
//! - bridge of feed F (in `LAB-core`): `br-F`, its ports `F-I` (I = host index);
//! - control network: interface `ctl` in every host, a veth whose peer `ctl-I` is a port of
//!   bridge `br-ctl` in `LAB-core`; host I (0-based, spec order) has address I+1 of
//!   `control_subnet` (hence the feed name `ctl` is reserved);
//! - run directory (state, VDE sockets, logs): `/run/ldm7-lab/LAB/`.
//!
//! ```toml
//! name = "ngrid"                # lab name = prefix of everything it creates
//! control_subnet = "10.76.0.0/24"   # the control network (default); must not overlap a feed
//! family = "ipv4"               # addresses: "ipv4" (default), "ipv6" or "dual" (both)
//! control_subnet6 = "fd00:4c37:76::/64"   # the control network's IPv6 prefix (default)
//! [[hosts]]
//! name = "pub"
//! [[hosts]]
//! name = "sub1"
//! loss_percent = 5.0            # drop 5% of what arrives on its feed interfaces
//! family = "ipv6"               # this host's addresses (default: the lab's family)
//! [[feeds]]
//! name = "ngrid"                # interface name in every member host
//! publisher = "pub"
//! subscribers = ["sub1"]
//! rate = "40 Mbit/s"            # HTB rate at the publisher (and the path rate)
//! buffer = "600 MB"             # BFIFO per HTB class (default 600 MB, as in the research)
//! delay = { sub1 = "20ms" }     # one-way delay per leg; any delay makes the feed use VDE
//! subscriber_addresses = true   # false: subscribers' feed interfaces get no address
//! subnet6 = "fd00:4c37:77:1::/64"   # the feed's IPv6 prefix (default: fd00:4c37:77:N::/64)
//! multicast_group6 = "ff3e::8000:1" # its IPv6 source-specific group (default ff3e::8000:N)
//! ```
//!
//! IPv6 addresses are numbered as the IPv4 ones (host I of the control network has
//! `control_subnet6` + I+1, a feed's members the feed's `subnet6` + 1, 2 …), and are given
//! only to hosts whose family has IPv6 (IPv4 addresses only to those whose family has IPv4).
//! They are added without duplicate address detection (`nodad`), usable at once.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use ipnet::Ipv6Net;
use std::time::Duration;

use crate::hostcfg::{CidrError, Ipv4Cidr};
use ldm7_types::units::{ByteSize, LossPercent, QuantityError, Rate, parse_delay};

/// Where every lab keeps its run directory.
pub const LAB_RUN_BASE: &str = "/run/ldm7-lab";
/// Most hosts in one lab.
pub const MAX_HOSTS: usize = 64;
/// Most feeds in one lab.
pub const MAX_FEEDS: usize = 16;
/// The host name reserved for the namespace holding the bridges.
pub const CORE_HOST: &str = "core";
/// The control interface in every host (and the name no feed may have).
pub const CONTROL_INTERFACE: &str = "ctl";
/// The control network's subnet when the spec gives none.
pub const DEFAULT_CONTROL_SUBNET: Ipv4Cidr = Ipv4Cidr { address: Ipv4Addr::new(10, 76, 0, 0), prefix_len: 24 };

/// The control network's IPv6 prefix when the spec gives none.
pub const DEFAULT_CONTROL_SUBNET6: Ipv6Net = match Ipv6Net::new(Ipv6Addr::new(0xfd00, 0x4c37, 0x76, 0, 0, 0, 0, 0), 64)
{
    Ok(net) => net,
    Err(_) => panic!("a /64"),
};

/// The address families a host has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// IPv4 only (the default).
    #[default]
    Ipv4,
    /// IPv6 only.
    Ipv6,
    /// Both.
    Dual,
}

impl Family {
    /// Whether the host has IPv4 addresses.
    pub fn has_ipv4(self) -> bool {
        matches!(self, Self::Ipv4 | Self::Dual)
    }

    /// Whether the host has IPv6 addresses.
    pub fn has_ipv6(self) -> bool {
        matches!(self, Self::Ipv6 | Self::Dual)
    }
}

/// Address `n` of an IPv6 prefix (`n` = 0 is the prefix itself), with the prefix's length.
pub fn nth6(net: Ipv6Net, n: u32) -> Ipv6Net {
    let address = Ipv6Addr::from(u128::from(net.network()) + u128::from(n));
    Ipv6Net::new(address, net.prefix_len()).expect("the prefix's own length")
}

/// A spec that cannot be used, and why. Displayed after `lab spec: ` by [`super::LabError`].
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The spec file cannot be read.
    #[error("cannot read {path}: {source}; pass --spec with a lab TOML file")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A problem in a spec file.
    #[error("{path}: {source}")]
    InFile {
        /// The file.
        path: PathBuf,
        /// The problem.
        source: Box<SpecError>,
    },
    /// Not TOML, or TOML with unknown or missing fields.
    #[error("not valid TOML for a lab: {0}")]
    Toml(#[source] toml::de::Error),
    /// A lab, host or feed name that cannot name namespaces and interfaces.
    #[error(
        "{what} {name:?} must be 1–{max_len} lowercase letters or digits{}",
        if *.letter_first { ", starting with a letter" } else { "" }
    )]
    BadName {
        /// Which name (`lab name`, `host name`, `feed name`).
        what: &'static str,
        /// The name given.
        name: String,
        /// The longest name allowed.
        max_len: usize,
        /// Whether it must start with a letter.
        letter_first: bool,
    },
    /// Too few or too many hosts.
    #[error("a lab needs 1 to {MAX_HOSTS} [[hosts]]; this one has {count}")]
    HostCount {
        /// How many the spec has.
        count: usize,
    },
    /// Too many feeds.
    #[error("a lab has at most {MAX_FEEDS} [[feeds]]; this one has {count}")]
    FeedCount {
        /// How many the spec has.
        count: usize,
    },
    /// A host named like the bridges' namespace.
    #[error("host name {CORE_HOST:?} is reserved for the namespace of the bridges; rename the host")]
    ReservedHost,
    /// A host listed twice.
    #[error("host {host:?} is listed twice")]
    DuplicateHost {
        /// The host.
        host: String,
    },
    /// A host's loss is not a percentage.
    #[error("host {host:?}: {source}")]
    HostLoss {
        /// The host.
        host: String,
        /// Why the loss is refused.
        source: QuantityError,
    },
    /// A feed named `lo`.
    #[error("feed name \"lo\" is the loopback interface of every host; choose another")]
    LoopbackFeed,
    /// A feed named like the control interface.
    #[error(
        "feed name {CONTROL_INTERFACE:?} is the control interface of every host (bridge br-{CONTROL_INTERFACE}); choose another"
    )]
    ControlFeed,
    /// The control subnet is not a prefix.
    #[error("control_subnet: {0}")]
    ControlSubnet(#[source] CidrError),
    /// The control network's IPv6 prefix is not one, or too small.
    #[error("control_subnet6: {0}")]
    ControlSubnet6(String),
    /// The control network's IPv6 prefix overlaps a feed's.
    #[error("control_subnet6 {subnet} overlaps feed {feed:?}'s subnet6 {feed_subnet}; give another prefix")]
    ControlSubnetOverlap6 {
        /// The control prefix.
        subnet: Ipv6Net,
        /// The feed.
        feed: String,
        /// That feed's prefix.
        feed_subnet: Ipv6Net,
    },
    /// The control subnet cannot number the hosts.
    #[error(
        "control_subnet {subnet} cannot hold {hosts} hosts plus network and broadcast addresses; give a larger \
         control_subnet (a /24 holds {MAX_HOSTS})"
    )]
    ControlSubnetTooSmall {
        /// The subnet.
        subnet: Ipv4Cidr,
        /// How many hosts the lab has.
        hosts: usize,
    },
    /// The control subnet overlaps a feed's subnet.
    #[error(
        "control_subnet {subnet} overlaps feed {feed:?}'s subnet {feed_subnet}; give control_subnet (default \
         {DEFAULT_CONTROL_SUBNET}) or the feed's subnet another prefix"
    )]
    ControlSubnetOverlap {
        /// The control subnet.
        subnet: Ipv4Cidr,
        /// The feed.
        feed: String,
        /// That feed's subnet.
        feed_subnet: Ipv4Cidr,
    },
    /// A feed listed twice.
    #[error("feed {feed:?} is listed twice")]
    DuplicateFeed {
        /// The feed.
        feed: String,
    },
    /// Two feeds with overlapping subnets.
    #[error("feed {feed:?}: subnet {subnet} overlaps feed {other:?}'s {other_subnet}; give each feed its own subnet")]
    SubnetOverlap {
        /// The feed.
        feed: String,
        /// Its subnet.
        subnet: Ipv4Cidr,
        /// The feed it overlaps.
        other: String,
        /// That feed's subnet.
        other_subnet: Ipv4Cidr,
    },
    /// A problem in one feed.
    #[error("feed {feed:?}: {problem}")]
    Feed {
        /// The feed.
        feed: String,
        /// What is wrong with it.
        problem: FeedProblem,
    },
}

/// What is wrong with one `[[feeds]]` entry.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FeedProblem {
    /// The publisher is not a host of the lab.
    #[error("publisher {host:?} is not one of the [[hosts]]")]
    UnknownPublisher {
        /// The host named.
        host: String,
    },
    /// A subscriber is not a host of the lab.
    #[error("subscriber {host:?} is not one of the [[hosts]]")]
    UnknownSubscriber {
        /// The host named.
        host: String,
    },
    /// A member listed twice.
    #[error("{host:?} is listed twice (or is also the publisher)")]
    DuplicateMember {
        /// The host.
        host: String,
    },
    /// The rate is not a rate.
    #[error("rate: {0}")]
    Rate(#[source] QuantityError),
    /// The buffer is not a size.
    #[error("buffer: {0}")]
    Buffer(#[source] QuantityError),
    /// The buffer exceeds what BFIFO takes.
    #[error("buffer {buffer} is larger than BFIFO's limit of 4294967295 bytes; give a smaller buffer")]
    BufferTooLarge {
        /// The buffer given.
        buffer: ByteSize,
    },
    /// The subnet is not a prefix.
    #[error("subnet: {0}")]
    Subnet(#[source] CidrError),
    /// The IPv6 prefix is not one, or too small.
    #[error("subnet6: {0}")]
    Subnet6(String),
    /// The subnet cannot number the members.
    #[error("subnet {subnet} cannot hold {members} hosts plus network and broadcast addresses; give a larger subnet")]
    SubnetTooSmall {
        /// The subnet.
        subnet: Ipv4Cidr,
        /// The feed's members.
        members: usize,
    },
    /// The multicast group is not an address.
    #[error("multicast group {text:?} is not an address (multicast_group: IPv4, multicast_group6: IPv6)")]
    GroupNotAnAddress {
        /// The text given.
        text: String,
    },
    /// The multicast group is not a multicast address.
    #[error("multicast_group {group} is not in 224.0.0.0/4")]
    GroupNotMulticast {
        /// The address given.
        group: Ipv4Addr,
    },
    /// The IPv6 multicast group is not a multicast address.
    #[error("multicast_group6 {group} is not in ff00::/8 (a source-specific group is in ff3e::/96)")]
    Group6NotMulticast {
        /// The address given.
        group: Ipv6Addr,
    },
    /// The retransmission share is out of range.
    #[error("retx_share {share} must be between 0.01 and 0.99")]
    RetxShare {
        /// The share given.
        share: f64,
    },
    /// A delay for a host that is not a member.
    #[error("delay is given for {host:?}, which is not a member of this feed")]
    DelayForNonMember {
        /// The host.
        host: String,
    },
    /// A delay that is not a duration.
    #[error("delay of {host:?}: {source}")]
    Delay {
        /// The host.
        host: String,
        /// Why the delay is refused.
        source: QuantityError,
    },
}

/// A validated lab.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LabSpec {
    /// The lab name, the prefix of everything it creates.
    pub name: String,
    /// The control network's subnet (network address, prefix); host I gets address I+1.
    pub control_subnet: Ipv4Cidr,
    /// The control network's IPv6 prefix; host I gets address I+1.
    pub control_subnet6: Ipv6Net,
    /// The hosts, in spec order.
    pub hosts: Vec<HostSpec>,
    /// The feeds, in spec order.
    pub feeds: Vec<FeedSpec>,
}

/// One host (a network namespace).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HostSpec {
    /// Its name.
    pub name: String,
    /// Loss applied to what arrives on its feed interfaces.
    pub loss: LossPercent,
    /// Its address families.
    pub family: Family,
}

/// One feed: its multipoint path, members and publisher traffic control.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FeedSpec {
    /// The feed name (also the interface name in each member host).
    pub name: String,
    /// The publishing host.
    pub publisher: String,
    /// The subscribing hosts.
    pub subscribers: Vec<String>,
    /// The path rate, enforced by HTB at the publisher.
    pub rate: Rate,
    /// The BFIFO limit of each HTB class.
    pub buffer: ByteSize,
    /// The feed's private subnet; the publisher gets the first host address.
    pub subnet: Ipv4Cidr,
    /// The multicast group routed out of the feed interface.
    pub multicast_group: Ipv4Addr,
    /// The feed's IPv6 prefix; the publisher gets address 1.
    pub subnet6: Ipv6Net,
    /// The IPv6 multicast group routed out of the feed interface.
    pub multicast_group6: Ipv6Addr,
    /// UDP port of the multicast data, for classification (all multicast UDP if unset).
    pub multicast_port: Option<u16>,
    /// TCP port of the retransmission server, for classification (all TCP if unset).
    pub retx_port: Option<u16>,
    /// Share of the rate assured to retransmissions.
    pub retx_share: f64,
    /// One-way delay per member leg (absent = none).
    pub delay: BTreeMap<String, Duration>,
    /// Whether the lab gives subscribers their feed addresses (else each configures its own, as
    /// the LDM-7 publisher hands them out); the publisher always has the first host address.
    pub subscriber_addresses: bool,
}

impl FeedSpec {
    /// The publisher, then the subscribers.
    pub fn members(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.publisher.as_str()).chain(self.subscribers.iter().map(String::as_str))
    }

    /// True when some leg has a delay, so the path must be VDE rather than a bridge.
    pub fn uses_vde(&self) -> bool {
        self.delay.values().any(|d| !d.is_zero())
    }

    /// The address (with prefix) the lab gives member `host` on this feed: the publisher's
    /// always, a subscriber's only with `subscriber_addresses` (else `None`: see
    /// [`FeedSpec::numbered_address_of`]).
    pub fn address_of(&self, host: &str) -> Option<Ipv4Cidr> {
        if host != self.publisher && !self.subscriber_addresses {
            return None;
        }
        self.numbered_address_of(host)
    }

    /// The address (with prefix) numbered by `host`'s place among the members (publisher `.1`,
    /// subscribers `.2, .3 …`), whether or not the lab configures it.
    pub fn numbered_address_of(&self, host: &str) -> Option<Ipv4Cidr> {
        let index = self.members().position(|m| m == host)?;
        let address = self.subnet.nth(index as u32 + 1)?;
        Some(Ipv4Cidr { address, prefix_len: self.subnet.prefix_len })
    }

    /// The IPv6 address (with prefix) numbered by `host`'s place among the members, whether or
    /// not the lab configures it.
    pub fn numbered_address6_of(&self, host: &str) -> Option<Ipv6Net> {
        let index = self.members().position(|m| m == host)?;
        Some(nth6(self.subnet6, index as u32 + 1))
    }

    /// True when `host` is the publisher or a subscriber of this feed.
    pub fn is_member(&self, host: &str) -> bool {
        self.members().any(|m| m == host)
    }

    /// The one-way delay of `host`'s leg.
    pub fn delay_of(&self, host: &str) -> Duration {
        self.delay.get(host).copied().unwrap_or(Duration::ZERO)
    }
}

impl LabSpec {
    /// Parses and validates TOML text.
    pub fn from_toml_str(text: &str) -> Result<LabSpec, SpecError> {
        let raw: RawLab = toml::from_str(text).map_err(SpecError::Toml)?;
        raw.validate()
    }

    /// Reads, parses and validates a spec file.
    pub fn from_file(path: &Path) -> Result<LabSpec, SpecError> {
        LabSpec::read_file(path).map(|(spec, _text)| spec)
    }

    /// Reads, parses and validates a spec file; returns the spec and the file's text (which `up`
    /// records in the lab's state).
    pub fn read_file(path: &Path) -> Result<(LabSpec, String), SpecError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| SpecError::Read { path: path.to_path_buf(), source })?;
        let spec = LabSpec::from_toml_str(&text)
            .map_err(|problem| SpecError::InFile { path: path.to_path_buf(), source: Box::new(problem) })?;
        Ok((spec, text))
    }

    /// The namespace of host `host`.
    pub fn netns_of(&self, host: &str) -> String {
        netns_name(&self.name, host)
    }

    /// The namespace that holds the bridges.
    pub fn core_netns(&self) -> String {
        netns_name(&self.name, CORE_HOST)
    }

    /// True when some feed uses a Linux bridge path.
    pub fn uses_bridge(&self) -> bool {
        self.feeds.iter().any(|f| !f.uses_vde())
    }

    /// All namespaces the lab creates, in creation order: the hosts, then the core namespace
    /// (which always exists: it holds the control network's bridge).
    pub fn namespaces(&self) -> Vec<String> {
        let mut names: Vec<String> = self.hosts.iter().map(|h| self.netns_of(&h.name)).collect();
        names.push(self.core_netns());
        names
    }

    /// The control network's bridge (in the core namespace).
    pub fn control_bridge(&self) -> String {
        format!("br-{CONTROL_INTERFACE}")
    }

    /// The control network's bridge port (in the core namespace) of `host`.
    pub fn control_port(&self, host: &str) -> Option<String> {
        let index = self.hosts.iter().position(|h| h.name == host)?;
        Some(format!("{CONTROL_INTERFACE}-{index}"))
    }

    /// The address (with prefix) of `host` on the control network.
    pub fn control_address_of(&self, host: &str) -> Option<Ipv4Cidr> {
        let index = self.hosts.iter().position(|h| h.name == host)?;
        let address = self.control_subnet.nth(index as u32 + 1)?;
        Some(Ipv4Cidr { address, prefix_len: self.control_subnet.prefix_len })
    }

    /// The IPv6 address (with prefix) of `host` on the control network.
    pub fn control_address6_of(&self, host: &str) -> Option<Ipv6Net> {
        let index = self.hosts.iter().position(|h| h.name == host)?;
        Some(nth6(self.control_subnet6, index as u32 + 1))
    }

    /// The families of `host`.
    pub fn family_of(&self, host: &str) -> Family {
        self.host(host).map_or(Family::Ipv4, |h| h.family)
    }

    /// The address `host` is reached at on the control network: IPv4 when it has IPv4, else
    /// IPv6.
    pub fn control_ip_of(&self, host: &str) -> Option<std::net::IpAddr> {
        if self.family_of(host).has_ipv4() {
            self.control_address_of(host).map(|cidr| cidr.address.into())
        } else {
            self.control_address6_of(host).map(|net| net.addr().into())
        }
    }

    /// The `/etc/hosts` of every host of the lab: loopback, then each host's control addresses
    /// (those of its families) named `HOST.LAB.test` and `HOST`; the first name is the one a
    /// reverse lookup gives.
    pub fn hosts_file(&self) -> String {
        let mut text = String::from(
            "# Written by ldm7 lab: every host of the lab by name.\n127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
        );
        for host in &self.hosts {
            let names = format!("{}.{}.test {}", host.name, self.name, host.name);
            if host.family.has_ipv4() {
                let address = self.control_address_of(&host.name).expect("a host of the spec").address;
                text.push_str(&format!("{address} {names}\n"));
            }
            if host.family.has_ipv6() {
                let address = self.control_address6_of(&host.name).expect("a host of the spec").addr();
                text.push_str(&format!("{address} {names}\n"));
            }
        }
        text
    }

    /// The run directory of this lab.
    pub fn run_dir(&self) -> PathBuf {
        run_dir(&self.name)
    }

    /// The bridge port (in the core namespace) of `host`'s leg on `feed`.
    pub fn bridge_port(&self, feed: &str, host: &str) -> Option<String> {
        let index = self.hosts.iter().position(|h| h.name == host)?;
        Some(format!("{feed}-{index}"))
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Option<&HostSpec> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// The feed named `name`.
    pub fn feed(&self, name: &str) -> Option<&FeedSpec> {
        self.feeds.iter().find(|f| f.name == name)
    }

    /// A digest of the validated spec, to tell whether a running lab matches it.
    pub fn digest(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        // FNV-1a, 64 bits: stable across builds, unlike std's hasher.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in text.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{hash:016x}")
    }
}

/// The namespace name of `host` in lab `lab`.
pub fn netns_name(lab: &str, host: &str) -> String {
    format!("{lab}-{host}")
}

/// The run directory of lab `lab`.
pub fn run_dir(lab: &str) -> PathBuf {
    PathBuf::from(LAB_RUN_BASE).join(lab)
}

/// Checks a lab name given on the command line (same rules as in a spec).
pub fn check_lab_name(name: &str) -> Result<(), SpecError> {
    check_name("lab name", name, 12, true)
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLab {
    name: String,
    control_subnet: Option<String>,
    control_subnet6: Option<String>,
    #[serde(default)]
    family: Family,
    #[serde(default)]
    hosts: Vec<RawHost>,
    #[serde(default)]
    feeds: Vec<RawFeed>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: String,
    #[serde(default)]
    loss_percent: f64,
    family: Option<Family>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFeed {
    name: String,
    publisher: String,
    #[serde(default)]
    subscribers: Vec<String>,
    rate: RawQuantity,
    buffer: Option<RawQuantity>,
    subnet: Option<String>,
    multicast_group: Option<String>,
    multicast_port: Option<u16>,
    retx_port: Option<u16>,
    retx_share: Option<f64>,
    #[serde(default)]
    delay: BTreeMap<String, String>,
    subscriber_addresses: Option<bool>,
    subnet6: Option<String>,
    multicast_group6: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum RawQuantity {
    Text(String),
    Integer(u64),
}

impl RawQuantity {
    fn text(&self) -> String {
        match self {
            RawQuantity::Text(text) => text.clone(),
            RawQuantity::Integer(n) => n.to_string(),
        }
    }
}

impl RawLab {
    fn validate(self) -> Result<LabSpec, SpecError> {
        check_lab_name(&self.name)?;
        if self.hosts.is_empty() || self.hosts.len() > MAX_HOSTS {
            return Err(SpecError::HostCount { count: self.hosts.len() });
        }
        if self.feeds.len() > MAX_FEEDS {
            return Err(SpecError::FeedCount { count: self.feeds.len() });
        }
        let mut hosts = Vec::new();
        let mut host_names = BTreeSet::new();
        for raw in self.hosts {
            check_name("host name", &raw.name, 15, false)?;
            if raw.name == CORE_HOST {
                return Err(SpecError::ReservedHost);
            }
            if !host_names.insert(raw.name.clone()) {
                return Err(SpecError::DuplicateHost { host: raw.name });
            }
            let loss = LossPercent::new(raw.loss_percent)
                .map_err(|source| SpecError::HostLoss { host: raw.name.clone(), source })?;
            hosts.push(HostSpec { name: raw.name, loss, family: raw.family.unwrap_or(self.family) });
        }
        let mut feeds: Vec<FeedSpec> = Vec::new();
        for (index, raw) in self.feeds.into_iter().enumerate() {
            let share_given = raw.retx_share.is_some();
            let mut feed = raw.validate(index, &host_names)?;
            if !share_given {
                feed.retx_share = planned_retx_share(&feed, &hosts);
            }
            if feeds.iter().any(|f| f.name == feed.name) {
                return Err(SpecError::DuplicateFeed { feed: feed.name });
            }
            if let Some(other) = feeds.iter().find(|f| overlaps(f.subnet, feed.subnet)) {
                return Err(SpecError::SubnetOverlap {
                    feed: feed.name,
                    subnet: feed.subnet,
                    other: other.name.clone(),
                    other_subnet: other.subnet,
                });
            }
            feeds.push(feed);
        }
        let control_subnet = match &self.control_subnet {
            Some(text) => text.parse().map_err(SpecError::ControlSubnet)?,
            None => DEFAULT_CONTROL_SUBNET,
        };
        if control_subnet.prefix_len > 30 || control_subnet.nth(hosts.len() as u32 + 1).is_none() {
            return Err(SpecError::ControlSubnetTooSmall { subnet: control_subnet, hosts: hosts.len() });
        }
        let control_subnet = Ipv4Cidr { address: control_subnet.network(), prefix_len: control_subnet.prefix_len };
        if let Some(feed) = feeds.iter().find(|f| overlaps(f.subnet, control_subnet)) {
            return Err(SpecError::ControlSubnetOverlap {
                subnet: control_subnet,
                feed: feed.name.clone(),
                feed_subnet: feed.subnet,
            });
        }
        let control_subnet6 = match &self.control_subnet6 {
            Some(text) => ipv6_prefix(text, hosts.len()).map_err(SpecError::ControlSubnet6)?,
            None => DEFAULT_CONTROL_SUBNET6,
        };
        if let Some(feed) =
            feeds.iter().find(|f| f.subnet6.contains(&control_subnet6) || control_subnet6.contains(&f.subnet6))
        {
            return Err(SpecError::ControlSubnetOverlap6 {
                subnet: control_subnet6,
                feed: feed.name.clone(),
                feed_subnet: feed.subnet6,
            });
        }
        Ok(LabSpec { name: self.name, control_subnet, control_subnet6, hosts, feeds })
    }
}

impl RawFeed {
    fn validate(self, index: usize, hosts: &BTreeSet<String>) -> Result<FeedSpec, SpecError> {
        let name = self.name;
        check_name("feed name", &name, 11, true)?;
        if name == "lo" {
            return Err(SpecError::LoopbackFeed);
        }
        if name == CONTROL_INTERFACE {
            return Err(SpecError::ControlFeed);
        }
        let problem = |problem: FeedProblem| SpecError::Feed { feed: name.clone(), problem };
        if !hosts.contains(&self.publisher) {
            return Err(problem(FeedProblem::UnknownPublisher { host: self.publisher }));
        }
        let mut seen = BTreeSet::from([self.publisher.clone()]);
        for subscriber in &self.subscribers {
            if !hosts.contains(subscriber) {
                return Err(problem(FeedProblem::UnknownSubscriber { host: subscriber.clone() }));
            }
            if !seen.insert(subscriber.clone()) {
                return Err(problem(FeedProblem::DuplicateMember { host: subscriber.clone() }));
            }
        }
        let rate: Rate = self.rate.text().parse().map_err(|e| problem(FeedProblem::Rate(e)))?;
        let buffer: ByteSize = match self.buffer {
            Some(raw) => raw.text().parse().map_err(|e| problem(FeedProblem::Buffer(e)))?,
            None => ByteSize::from_bytes(600_000_000),
        };
        if buffer.bytes() > u64::from(u32::MAX) {
            return Err(problem(FeedProblem::BufferTooLarge { buffer }));
        }
        let subnet: Ipv4Cidr = match &self.subnet {
            Some(text) => text.parse().map_err(|e| problem(FeedProblem::Subnet(e)))?,
            None => Ipv4Cidr { address: Ipv4Addr::new(10, 77, index as u8 + 1, 0), prefix_len: 24 },
        };
        let members = 1 + self.subscribers.len();
        if subnet.prefix_len > 30 || subnet.nth(members as u32 + 1).is_none() {
            return Err(problem(FeedProblem::SubnetTooSmall { subnet, members }));
        }
        let multicast_group: Ipv4Addr = match &self.multicast_group {
            Some(text) => text.parse().map_err(|_| problem(FeedProblem::GroupNotAnAddress { text: text.clone() }))?,
            None => Ipv4Addr::new(239, 77, index as u8 + 1, 1),
        };
        if !multicast_group.is_multicast() {
            return Err(problem(FeedProblem::GroupNotMulticast { group: multicast_group }));
        }
        let subnet6 = match &self.subnet6 {
            Some(text) => ipv6_prefix(text, members).map_err(|why| problem(FeedProblem::Subnet6(why)))?,
            None => Ipv6Net::new(Ipv6Addr::new(0xfd00, 0x4c37, 0x77, index as u16 + 1, 0, 0, 0, 0), 64).expect("a /64"),
        };
        let multicast_group6: Ipv6Addr = match &self.multicast_group6 {
            Some(text) => text.parse().map_err(|_| problem(FeedProblem::GroupNotAnAddress { text: text.clone() }))?,
            None => Ipv6Addr::new(0xff3e, 0, 0, 0, 0, 0, 0x8000, index as u16 + 1),
        };
        if !multicast_group6.is_multicast() {
            return Err(problem(FeedProblem::Group6NotMulticast { group: multicast_group6 }));
        }
        let retx_share = self.retx_share.unwrap_or(crate::tc::DEFAULT_RETX_SHARE);
        if !(0.01..=0.99).contains(&retx_share) {
            return Err(problem(FeedProblem::RetxShare { share: retx_share }));
        }
        let mut delay = BTreeMap::new();
        for (host, text) in self.delay {
            if !seen.contains(&host) {
                return Err(problem(FeedProblem::DelayForNonMember { host }));
            }
            let one_way =
                parse_delay(&text).map_err(|source| problem(FeedProblem::Delay { host: host.clone(), source }))?;
            delay.insert(host, one_way);
        }
        Ok(FeedSpec {
            name,
            publisher: self.publisher,
            subscribers: self.subscribers,
            rate,
            buffer,
            subnet: Ipv4Cidr { address: subnet.network(), prefix_len: subnet.prefix_len },
            multicast_group,
            subnet6,
            multicast_group6,
            multicast_port: self.multicast_port,
            retx_port: self.retx_port,
            retx_share,
            delay,
            subscriber_addresses: self.subscriber_addresses.unwrap_or(true),
        })
    }
}

/// An IPv6 prefix (as its network) with room for `hosts` numbered hosts.
fn ipv6_prefix(text: &str, hosts: usize) -> Result<Ipv6Net, String> {
    let net: Ipv6Net =
        text.parse().map_err(|_| format!("{text:?} is not an IPv6 prefix; write e.g. fd00:4c37:76::/64"))?;
    if net.prefix_len() > 120 || (net.prefix_len() > 96 && (1u64 << (128 - net.prefix_len())) <= hosts as u64 + 1) {
        return Err(format!("{net} is too small for {hosts} hosts; give a /64"));
    }
    Ok(net.trunc())
}

/// The share of a feed's path rate its repairs need, as `ldm7 plan` computes it
/// (`ldm7_plan::repair`): parity repair as ldm7 peers negotiate it, for the feed's subscribers
/// at the largest loss among them; at least [`crate::tc::DEFAULT_RETX_SHARE`].
fn planned_retx_share(feed: &FeedSpec, hosts: &[HostSpec]) -> f64 {
    let loss = hosts
        .iter()
        .filter(|host| feed.subscribers.contains(&host.name))
        .map(|host| host.loss.percent() / 100.0)
        .fold(0.0, f64::max);
    let subscribers = u32::try_from(feed.subscribers.len()).unwrap_or(u32::MAX);
    let budget = ldm7_plan::repair_budget(subscribers, loss, ldm7_plan::repair::parity_for(subscribers, loss));
    let share = budget.path_share();
    if share.is_finite() { share.clamp(crate::tc::DEFAULT_RETX_SHARE, 0.99) } else { crate::tc::DEFAULT_RETX_SHARE }
}

fn check_name(what: &'static str, name: &str, max_len: usize, letter_first: bool) -> Result<(), SpecError> {
    let valid = !name.is_empty()
        && name.len() <= max_len
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && (!letter_first || name.starts_with(|c: char| c.is_ascii_lowercase()));
    if valid { Ok(()) } else { Err(SpecError::BadName { what, name: name.to_string(), max_len, letter_first }) }
}

fn overlaps(a: Ipv4Cidr, b: Ipv4Cidr) -> bool {
    let (a0, a1) = (u32::from(a.network()), u32::from(a.broadcast()));
    let (b0, b1) = (u32::from(b.network()), u32::from(b.broadcast()));
    a0 <= b1 && b0 <= a1
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"
name = "t1"
[[hosts]]
name = "pub"
[[hosts]]
name = "sub1"
loss_percent = 5.0
[[hosts]]
name = "sub2"
[[feeds]]
name = "ngrid"
publisher = "pub"
subscribers = ["sub1", "sub2"]
rate = "40 Mbit/s"
[[feeds]]
name = "conduit"
publisher = "sub2"
subscribers = ["pub"]
rate = 20000000
buffer = "20MB"
subnet = "10.88.0.0/16"
multicast_group = "239.1.2.3"
multicast_port = 38800
delay = { pub = "20ms" }
"#;

    #[test]
    fn the_repair_share_follows_the_plan_unless_given() {
        let spec = LabSpec::from_toml_str(SPEC).unwrap();
        // ngrid: two subscribers, the lossier at 5%: parity shards for the worse of two
        // binomial(256, 0.05) counts per group of 256, about 5.6%.
        let planned = spec.feed("ngrid").unwrap().retx_share;
        let budget = ldm7_plan::repair_budget(2, 0.05, ldm7_plan::repair::parity_for(2, 0.05));
        assert!((planned - budget.path_share()).abs() < 1e-12, "{planned} {budget:?}");
        assert!((0.05..0.07).contains(&planned), "{planned}");
        // conduit: no loss, the floor.
        assert_eq!(spec.feed("conduit").unwrap().retx_share, crate::tc::DEFAULT_RETX_SHARE);
        let given =
            LabSpec::from_toml_str(&SPEC.replace("rate = \"40 Mbit/s\"", "rate = \"40 Mbit/s\"\nretx_share = 0.5"));
        assert_eq!(given.unwrap().feed("ngrid").unwrap().retx_share, 0.5);
    }

    #[test]
    fn a_valid_spec_gets_defaults_and_derived_names() {
        let spec = LabSpec::from_toml_str(SPEC).unwrap();
        let ngrid = spec.feed("ngrid").unwrap();
        assert_eq!(ngrid.buffer.bytes(), 600_000_000);
        assert_eq!(ngrid.subnet.to_string(), "10.77.1.0/24");
        assert_eq!(ngrid.multicast_group, Ipv4Addr::new(239, 77, 1, 1));
        assert_eq!(ngrid.address_of("pub").unwrap().to_string(), "10.77.1.1/24");
        assert_eq!(ngrid.address_of("sub2").unwrap().to_string(), "10.77.1.3/24");
        assert!(!ngrid.uses_vde());
        let conduit = spec.feed("conduit").unwrap();
        assert!(conduit.uses_vde());
        assert_eq!(conduit.rate.bits_per_s(), 20_000_000);
        assert_eq!(conduit.delay_of("pub"), Duration::from_millis(20));
        assert_eq!(conduit.address_of("sub2").unwrap().to_string(), "10.88.0.1/16");
        assert_eq!(spec.namespaces(), ["t1-pub", "t1-sub1", "t1-sub2", "t1-core"]);
        assert_eq!(spec.bridge_port("ngrid", "sub2").unwrap(), "ngrid-2");
        assert_eq!(spec.run_dir(), PathBuf::from("/run/ldm7-lab/t1"));
        assert_eq!(spec.host("sub1").unwrap().loss.percent(), 5.0);
        assert_eq!(spec.digest(), LabSpec::from_toml_str(SPEC).unwrap().digest());
    }

    #[test]
    fn ipv6_addresses_are_numbered_as_the_ipv4_ones() {
        let spec =
            LabSpec::from_toml_str(&SPEC.replace("name = \"sub2\"\n", "name = \"sub2\"\nfamily = \"ipv6\"\n")).unwrap();
        assert_eq!(spec.family_of("pub"), Family::Ipv4);
        assert_eq!(spec.family_of("sub2"), Family::Ipv6);
        assert_eq!(spec.control_address6_of("sub2").unwrap().to_string(), "fd00:4c37:76::3/64");
        assert_eq!(spec.control_ip_of("sub2").unwrap().to_string(), "fd00:4c37:76::3");
        assert_eq!(spec.control_ip_of("pub").unwrap().to_string(), "10.76.0.1");
        let ngrid = spec.feed("ngrid").unwrap();
        assert_eq!(ngrid.numbered_address6_of("sub1").unwrap().to_string(), "fd00:4c37:77:1::2/64");
        assert_eq!(ngrid.multicast_group6.to_string(), "ff3e::8000:1");
        let dual =
            LabSpec::from_toml_str(&format!("family = \"dual\"\ncontrol_subnet6 = \"fd00:1::9/64\"\n{SPEC}")).unwrap();
        assert!(dual.hosts.iter().all(|h| h.family == Family::Dual));
        assert_eq!(dual.control_address6_of("pub").unwrap().to_string(), "fd00:1::1/64");
        for (bad, says) in [
            ("control_subnet6 = \"fd00::/127\"", "too small"),
            ("control_subnet6 = \"10.0.0.0/8\"", "not an IPv6 prefix"),
            ("control_subnet6 = \"fd00:4c37:77::/48\"", "overlaps feed"),
            ("family = \"ipv5\"", "ipv5"),
        ] {
            let error = LabSpec::from_toml_str(&format!("{bad}\n{SPEC}")).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
        let group = SPEC.replace("multicast_group = \"239.1.2.3\"", "multicast_group6 = \"fd00::1\"");
        assert!(LabSpec::from_toml_str(&group).unwrap_err().to_string().contains("ff3e::/96"));
    }

    #[test]
    fn every_host_has_a_control_address_in_spec_order() {
        let spec = LabSpec::from_toml_str(SPEC).unwrap();
        assert_eq!(spec.control_subnet, DEFAULT_CONTROL_SUBNET);
        assert_eq!(spec.control_bridge(), "br-ctl");
        let addresses: Vec<String> =
            spec.hosts.iter().map(|h| spec.control_address_of(&h.name).unwrap().to_string()).collect();
        assert_eq!(addresses, ["10.76.0.1/24", "10.76.0.2/24", "10.76.0.3/24"]);
        assert_eq!(spec.control_port("sub2").unwrap(), "ctl-2");
        assert_eq!(spec.control_address_of("nobody"), None);

        let custom = LabSpec::from_toml_str(&format!("control_subnet = \"192.168.9.77/29\"\n{SPEC}")).unwrap();
        assert_eq!(custom.control_subnet.to_string(), "192.168.9.72/29", "kept as its network address");
        assert_eq!(custom.control_address_of("pub").unwrap().to_string(), "192.168.9.73/29");
        assert_ne!(custom.digest(), spec.digest());
        // Three hosts need network + 3 + broadcast = 5 addresses: a /30 has 4.
        let exact = LabSpec::from_toml_str(&format!("control_subnet = \"10.5.0.0/29\"\n{SPEC}")).unwrap();
        assert_eq!(exact.control_address_of("sub2").unwrap().to_string(), "10.5.0.3/29");
        // Without a bridge feed the core namespace still holds the control bridge.
        let vde_only =
            LabSpec::from_toml_str(&SPEC.replace("rate = \"40 Mbit/s\"", "rate = \"40M\"\ndelay = { pub = \"1ms\" }"))
                .unwrap();
        assert!(!vde_only.uses_bridge());
        assert_eq!(vde_only.namespaces().last().unwrap(), "t1-core");
    }

    #[test]
    fn control_subnet_mistakes_say_what_to_do() {
        let with = |subnet: &str| {
            LabSpec::from_toml_str(&format!("control_subnet = \"{subnet}\"\n{SPEC}")).unwrap_err().to_string()
        };
        assert_eq!(
            with("10.76.0.0/30"),
            "control_subnet 10.76.0.0/30 cannot hold 3 hosts plus network and broadcast addresses; give a larger \
             control_subnet (a /24 holds 64)"
        );
        assert!(with("10.76.0.0/31").contains("cannot hold 3 hosts"));
        assert_eq!(
            with("10.77.0.0/16"),
            "control_subnet 10.77.0.0/16 overlaps feed \"ngrid\"'s subnet 10.77.1.0/24; give control_subnet \
             (default 10.76.0.0/24) or the feed's subnet another prefix"
        );
        assert!(with("10.88.7.0/24").contains("overlaps feed \"conduit\"'s subnet 10.88.0.0/16"));
        assert!(with("10.76.0.0").starts_with("control_subnet: \"10.76.0.0\" is not an IPv4 prefix"));
        assert!(error_of(|s| s.replace("name = \"conduit\"", "name = \"ctl\"")).contains("control interface"));
        let default_overlap = error_of(|s| s.replace("10.88.0.0/16", "10.76.0.128/25"));
        assert!(
            default_overlap.starts_with("control_subnet 10.76.0.0/24 overlaps feed \"conduit\""),
            "{default_overlap}"
        );
    }

    #[test]
    fn subscriber_addresses_false_leaves_subscribers_without_lab_addresses() {
        let spec = LabSpec::from_toml_str(SPEC).unwrap();
        assert!(spec.feed("ngrid").unwrap().subscriber_addresses, "default: the lab numbers subscribers");
        let text = SPEC.replacen("rate = \"40 Mbit/s\"", "rate = \"40 Mbit/s\"\nsubscriber_addresses = false", 1);
        let spec = LabSpec::from_toml_str(&text).unwrap();
        let ngrid = spec.feed("ngrid").unwrap();
        assert!(!ngrid.subscriber_addresses);
        assert_eq!(ngrid.address_of("pub").unwrap().to_string(), "10.77.1.1/24", "the publisher keeps .1");
        assert_eq!(ngrid.address_of("sub1"), None);
        assert_eq!(ngrid.numbered_address_of("sub1").unwrap().to_string(), "10.77.1.2/24");
        assert!(ngrid.is_member("sub2") && !ngrid.is_member("nobody"));
        assert!(spec.feed("conduit").unwrap().subscriber_addresses, "only the feed that says so");
        let wrong_type =
            error_of(|s| s.replacen("rate = \"40 Mbit/s\"", "rate = \"40M\"\nsubscriber_addresses = \"no\"", 1));
        assert!(wrong_type.contains("subscriber_addresses") || wrong_type.contains("invalid type"), "{wrong_type}");
    }

    fn error_of(edit: impl Fn(&str) -> String) -> String {
        LabSpec::from_toml_str(&edit(SPEC)).unwrap_err().to_string()
    }

    #[test]
    fn mistakes_are_reported_with_what_to_do() {
        assert!(error_of(|s| s.replace("name = \"t1\"", "name = \"T-1\"")).contains("lab name \"T-1\""));
        assert!(
            error_of(|s| s.replace("publisher = \"pub\"", "publisher = \"nobody\""))
                .contains("not one of the [[hosts]]")
        );
        assert!(error_of(|s| s.replace("\"sub1\", \"sub2\"", "\"sub1\", \"sub1\"")).contains("listed twice"));
        assert!(error_of(|s| s.replace("\"40 Mbit/s\"", "\"fast\"")).contains("rate"));
        assert!(error_of(|s| s.replace("\"20ms\"", "\"20\"")).contains("delay of \"pub\""));
        assert!(error_of(|s| s.replace("pub = \"20ms\"", "sub1 = \"20ms\"")).contains("not a member"));
        assert!(error_of(|s| s.replace("loss_percent = 5.0", "loss_percent = 105.0")).contains("loss_percent"));
        assert!(error_of(|s| s.replace("10.88.0.0/16", "10.77.0.0/16")).contains("overlaps"));
        assert!(error_of(|s| s.replace("239.1.2.3", "10.1.2.3")).contains("not in 224.0.0.0/4"));
        assert!(
            error_of(|s| s.replace("[[hosts]]\nname = \"sub2\"", "[[hosts]]\nname = \"core\"")).contains("reserved")
        );
        assert!(error_of(|s| format!("{s}\nbogus = 1\n")).contains("unknown field"));
        assert!(error_of(|s| s.replace("name = \"conduit\"", "name = \"conduitfeed12\"")).contains("feed name"));
    }

    #[test]
    fn file_errors_name_the_file() {
        let missing = LabSpec::read_file(Path::new("/no/such/lab.toml")).unwrap_err().to_string();
        assert!(missing.starts_with("cannot read /no/such/lab.toml: "), "{missing}");
        assert!(missing.ends_with("pass --spec with a lab TOML file"), "{missing}");
        let directory = std::env::temp_dir().join(format!("ldm7-spec-test-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let file = directory.join("lab.toml");
        std::fs::write(&file, SPEC.replace("\"40 Mbit/s\"", "\"fast\"")).unwrap();
        let error = LabSpec::read_file(&file).unwrap_err();
        std::fs::remove_dir_all(&directory).unwrap();
        assert!(matches!(&error, SpecError::InFile { source, .. } if matches!(**source, SpecError::Feed { .. })));
        let text = error.to_string();
        assert!(text.starts_with(&format!("{}: feed \"ngrid\": rate: ", file.display())), "{text}");
    }
}
