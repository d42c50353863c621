//! The lab spec (`lab.toml`): raw TOML → validated [`LabSpec`] with every derived name.
//!
//! Pure: nothing here touches the system, so every rule is unit-tested. Names derived here are
//! the only names the lab ever creates or deletes:
//! - network namespace of host H: `LAB-H`; of the bridges: `LAB-core`;
//! - feed interface in every member host: the feed name (a veth end, or a TAP for VDE feeds);
//! - bridge of feed F (in `LAB-core`): `br-F`, its ports `F-I` (I = host index);
//! - run directory (state, VDE sockets, logs): `/run/ldm7-lab/LAB/`.
//!
//! ```toml
//! name = "ngrid"                # lab name = prefix of everything it creates
//! [[hosts]]
//! name = "pub"
//! [[hosts]]
//! name = "sub1"
//! loss_percent = 5.0            # drop 5% of what arrives on its feed interfaces
//! [[feeds]]
//! name = "ngrid"                # interface name in every member host
//! publisher = "pub"
//! subscribers = ["sub1"]
//! rate = "40 Mbit/s"            # HTB rate at the publisher (and the path rate)
//! buffer = "600 MB"             # BFIFO per HTB class (default 600 MB, as in the research)
//! delay = { sub1 = "20ms" }     # one-way delay per leg; any delay makes the feed use VDE
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use crate::hostcfg::Ipv4Cidr;
use ldm7_types::units::{ByteSize, LossPercent, Rate, parse_delay};

/// Where every lab keeps its run directory.
pub const LAB_RUN_BASE: &str = "/run/ldm7-lab";
/// Most hosts in one lab.
pub const MAX_HOSTS: usize = 64;
/// Most feeds in one lab.
pub const MAX_FEEDS: usize = 16;
/// The host name reserved for the namespace holding the bridges.
pub const CORE_HOST: &str = "core";

/// A spec that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lab spec: {0}")]
pub struct SpecError(pub String);

/// A validated lab.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LabSpec {
    /// The lab name, the prefix of everything it creates.
    pub name: String,
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
    /// UDP port of the multicast data, for classification (all multicast UDP if unset).
    pub multicast_port: Option<u16>,
    /// TCP port of the retransmission server, for classification (all TCP if unset).
    pub retx_port: Option<u16>,
    /// Share of the rate assured to retransmissions.
    pub retx_share: f64,
    /// One-way delay per member leg (absent = none).
    pub delay: BTreeMap<String, Duration>,
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

    /// The address (with prefix) of member `host` on this feed.
    pub fn address_of(&self, host: &str) -> Option<Ipv4Cidr> {
        let index = self.members().position(|m| m == host)?;
        let address = self.subnet.nth(index as u32 + 1)?;
        Some(Ipv4Cidr { address, prefix_len: self.subnet.prefix_len })
    }

    /// The one-way delay of `host`'s leg.
    pub fn delay_of(&self, host: &str) -> Duration {
        self.delay.get(host).copied().unwrap_or(Duration::ZERO)
    }
}

impl LabSpec {
    /// Parses and validates TOML text.
    pub fn from_toml_str(text: &str) -> Result<LabSpec, SpecError> {
        let raw: RawLab = toml::from_str(text).map_err(|e| SpecError(format!("not valid TOML for a lab: {e}")))?;
        raw.validate()
    }

    /// Reads, parses and validates a spec file.
    pub fn from_file(path: &std::path::Path) -> Result<LabSpec, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError(format!("cannot read {}: {e}; pass --spec with a lab TOML file", path.display())))?;
        LabSpec::from_toml_str(&text).map_err(|SpecError(message)| SpecError(format!("{}: {message}", path.display())))
    }

    /// The namespace of host `host`.
    pub fn netns_of(&self, host: &str) -> String {
        netns_name(&self.name, host)
    }

    /// The namespace that holds the bridges.
    pub fn core_netns(&self) -> String {
        netns_name(&self.name, CORE_HOST)
    }

    /// True when some feed uses a Linux bridge (so the core namespace exists).
    pub fn uses_bridge(&self) -> bool {
        self.feeds.iter().any(|f| !f.uses_vde())
    }

    /// All namespaces the lab creates, in creation order.
    pub fn namespaces(&self) -> Vec<String> {
        let mut names: Vec<String> = self.hosts.iter().map(|h| self.netns_of(&h.name)).collect();
        if self.uses_bridge() {
            names.push(self.core_netns());
        }
        names
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
            return Err(SpecError(format!(
                "a lab needs 1 to {MAX_HOSTS} [[hosts]]; this one has {}",
                self.hosts.len()
            )));
        }
        if self.feeds.len() > MAX_FEEDS {
            return Err(SpecError(format!(
                "a lab has at most {MAX_FEEDS} [[feeds]]; this one has {}",
                self.feeds.len()
            )));
        }
        let mut hosts = Vec::new();
        let mut host_names = BTreeSet::new();
        for raw in self.hosts {
            check_name("host name", &raw.name, 15, false)?;
            if raw.name == CORE_HOST {
                return Err(SpecError(format!(
                    "host name {CORE_HOST:?} is reserved for the namespace of the bridges; rename the host"
                )));
            }
            if !host_names.insert(raw.name.clone()) {
                return Err(SpecError(format!("host {:?} is listed twice", raw.name)));
            }
            let loss =
                LossPercent::new(raw.loss_percent).map_err(|e| SpecError(format!("host {:?}: {e}", raw.name)))?;
            hosts.push(HostSpec { name: raw.name, loss });
        }
        let mut feeds: Vec<FeedSpec> = Vec::new();
        for (index, raw) in self.feeds.into_iter().enumerate() {
            let feed = raw.validate(index, &host_names)?;
            if feeds.iter().any(|f| f.name == feed.name) {
                return Err(SpecError(format!("feed {:?} is listed twice", feed.name)));
            }
            if let Some(other) = feeds.iter().find(|f| overlaps(f.subnet, feed.subnet)) {
                return Err(SpecError(format!(
                    "feed {:?}: subnet {} overlaps feed {:?}'s {}; give each feed its own subnet",
                    feed.name, feed.subnet, other.name, other.subnet
                )));
            }
            feeds.push(feed);
        }
        Ok(LabSpec { name: self.name, hosts, feeds })
    }
}

impl RawFeed {
    fn validate(self, index: usize, hosts: &BTreeSet<String>) -> Result<FeedSpec, SpecError> {
        let name = self.name;
        check_name("feed name", &name, 11, true)?;
        if name == "lo" {
            return Err(SpecError("feed name \"lo\" is the loopback interface of every host; choose another".into()));
        }
        let context = |message: String| SpecError(format!("feed {name:?}: {message}"));
        if !hosts.contains(&self.publisher) {
            return Err(context(format!("publisher {:?} is not one of the [[hosts]]", self.publisher)));
        }
        let mut seen = BTreeSet::from([self.publisher.clone()]);
        for subscriber in &self.subscribers {
            if !hosts.contains(subscriber) {
                return Err(context(format!("subscriber {subscriber:?} is not one of the [[hosts]]")));
            }
            if !seen.insert(subscriber.clone()) {
                return Err(context(format!("{subscriber:?} is listed twice (or is also the publisher)")));
            }
        }
        let rate: Rate = self.rate.text().parse().map_err(|e| context(format!("rate: {e}")))?;
        let buffer: ByteSize = match self.buffer {
            Some(raw) => raw.text().parse().map_err(|e| context(format!("buffer: {e}")))?,
            None => ByteSize::from_bytes(600_000_000),
        };
        if buffer.bytes() > u64::from(u32::MAX) {
            return Err(context(format!("buffer {buffer} is larger than BFIFO's limit of 4294967295 bytes")));
        }
        let subnet: Ipv4Cidr = match &self.subnet {
            Some(text) => text.parse().map_err(|e| context(format!("subnet: {e}")))?,
            None => Ipv4Cidr { address: Ipv4Addr::new(10, 77, index as u8 + 1, 0), prefix_len: 24 },
        };
        let members = 1 + self.subscribers.len();
        if subnet.prefix_len > 30 || subnet.nth(members as u32 + 1).is_none() {
            return Err(context(format!(
                "subnet {subnet} cannot hold {members} hosts plus network and broadcast addresses"
            )));
        }
        let multicast_group: Ipv4Addr = match &self.multicast_group {
            Some(text) => {
                text.parse().map_err(|_| context(format!("multicast_group {text:?} is not an IPv4 address")))?
            }
            None => Ipv4Addr::new(239, 77, index as u8 + 1, 1),
        };
        if !multicast_group.is_multicast() {
            return Err(context(format!("multicast_group {multicast_group} is not in 224.0.0.0/4")));
        }
        let retx_share = self.retx_share.unwrap_or(0.5);
        if !(0.01..=0.99).contains(&retx_share) {
            return Err(context(format!("retx_share {retx_share} must be between 0.01 and 0.99")));
        }
        let mut delay = BTreeMap::new();
        for (host, text) in self.delay {
            if !seen.contains(&host) {
                return Err(context(format!("delay is given for {host:?}, which is not a member of this feed")));
            }
            delay.insert(host.clone(), parse_delay(&text).map_err(|e| context(format!("delay of {host:?}: {e}")))?);
        }
        Ok(FeedSpec {
            name,
            publisher: self.publisher,
            subscribers: self.subscribers,
            rate,
            buffer,
            subnet: Ipv4Cidr { address: subnet.network(), prefix_len: subnet.prefix_len },
            multicast_group,
            multicast_port: self.multicast_port,
            retx_port: self.retx_port,
            retx_share,
            delay,
        })
    }
}

fn check_name(what: &str, name: &str, max_len: usize, letter_first: bool) -> Result<(), SpecError> {
    let valid = !name.is_empty()
        && name.len() <= max_len
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && (!letter_first || name.starts_with(|c: char| c.is_ascii_lowercase()));
    if valid {
        Ok(())
    } else {
        let first = if letter_first { ", starting with a letter" } else { "" };
        Err(SpecError(format!("{what} {name:?} must be 1–{max_len} lowercase letters or digits{first}")))
    }
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
}
