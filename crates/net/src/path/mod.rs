//! Path services: the rate-guaranteed multipoint layer-2 path of a feed, with legs added and
//! removed as subscribers come and go (ARCHITECTURE.md "net"; spec `ldm7-multicast.md` §4.3).
//!
//! [`PathService`] is the one interface; drivers:
//! - [`static_paths::StaticPaths`]: pre-provisioned paths; validates requests, changes nothing;
//! - [`bridge::BridgePaths`]: one Linux bridge per feed, legs are ports (veths) attached and
//!   detached — a real dynamic multipoint L2 path on one host;
//! - [`vde::VdePaths`]: one `vde_switch` per feed driven through its management socket, each leg
//!   a `wirefilter` with one-way delay, loss and bandwidth between the switch and a TAP device;
//! - [`oess::OessPaths`]: Internet2 AL2S through the OESS web services (multipoint circuits).

pub mod bridge;
pub mod oess;
pub mod static_paths;
pub mod vde;

use std::path::PathBuf;
use std::time::Duration;

use crate::command::CommandError;
use ldm7_types::units::{LossPercent, Rate};

/// Where a leg attaches: a switch (node), a port (interface) and, on VLAN paths, a tag.
///
/// Meaning per driver: `oess` — AL2S node name, interface name, VLAN tag; `linux-bridge` — the
/// port device in the bridge's namespace (`node` is the host name, for messages); `vde` — `node`
/// is the network namespace of the host and `interface` its TAP device; `static` — any, matched
/// against the configured legs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    /// Switch or host.
    pub node: String,
    /// Port or interface.
    pub interface: String,
    /// VLAN tag, where the path is a VLAN.
    pub vlan_tag: Option<u16>,
}

impl Endpoint {
    /// An untagged endpoint.
    pub fn new(node: &str, interface: &str) -> Endpoint {
        Endpoint { node: node.to_string(), interface: interface.to_string(), vlan_tag: None }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.interface)?;
        if let Some(tag) = self.vlan_tag {
            write!(f, ".{tag}")?;
        }
        Ok(())
    }
}

/// A leg to add: its endpoint and the impairments the emulating drivers apply to it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Leg {
    /// Where it attaches.
    pub endpoint: Endpoint,
    /// One-way delay in each direction (vde only).
    pub one_way_delay: Duration,
    /// Loss in each direction (vde only).
    pub loss: LossPercent,
    /// Bandwidth of the leg; `None` = the path rate (vde: wirefilter `-b`; oess: endpoint
    /// bandwidth).
    pub bandwidth: Option<Rate>,
}

impl Leg {
    /// A leg with no impairments at the path rate.
    pub fn plain(endpoint: Endpoint) -> Leg {
        Leg { endpoint, one_way_delay: Duration::ZERO, loss: LossPercent::ZERO, bandwidth: None }
    }

    fn is_impaired(&self) -> bool {
        !self.one_way_delay.is_zero() || !self.loss.is_zero()
    }
}

/// What a driver reports about one path.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PathInfo {
    /// The path (feed) name.
    pub name: String,
    /// Its rate.
    pub rate: Rate,
    /// Its legs.
    pub legs: Vec<Endpoint>,
    /// Driver-specific identity (bridge name, switch socket, OESS circuit id).
    pub detail: String,
}

/// Why a path operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The named path is unknown to this driver.
    #[error("no path named {0:?}; create it first (known paths are listed by `ldm7 lab status`)")]
    NoSuchPath(String),
    /// The path exists already.
    #[error("a path named {0:?} exists already; remove it first or use another name")]
    PathExists(String),
    /// The leg is not on the path.
    #[error("path {path:?} has no leg at {endpoint}")]
    NoSuchLeg {
        /// The path.
        path: String,
        /// The endpoint.
        endpoint: Endpoint,
    },
    /// The driver cannot impair a leg (only `vde` emulates delay and loss).
    #[error(
        "the {driver} driver cannot give leg {endpoint} delay or loss; use the vde driver for emulated \
         impairments (in the lab, per-host loss is an iptables rule)"
    )]
    ImpairmentUnsupported {
        /// The driver.
        driver: &'static str,
        /// The leg's endpoint.
        endpoint: Endpoint,
    },
    /// The path name does not fit the driver's device names.
    #[error(
        "path name {name:?} must be 1–{max_len} characters (the bridge is br-NAME, at most 15); choose a shorter one"
    )]
    BadName {
        /// The name given.
        name: String,
        /// The longest name the driver accepts.
        max_len: usize,
    },
    /// A bridge of that name exists but ldm7 did not make it.
    #[error("bridge {bridge} was not made by ldm7 (its alias is not `ldm7 path rate=…`); not touching it")]
    NotOurs {
        /// The bridge device.
        bridge: String,
    },
    /// A static path that was never provisioned.
    #[error("static path {name:?} is not provisioned; provisioned paths: {provisioned:?}")]
    NotProvisioned {
        /// The path asked for.
        name: String,
        /// The provisioned paths.
        provisioned: Vec<String>,
    },
    /// More rate than a static path was provisioned with.
    #[error(
        "static path {name:?} is provisioned at {provisioned}; {requested} cannot be had without re-provisioning it"
    )]
    AboveProvisionedRate {
        /// The path.
        name: String,
        /// Its provisioned rate.
        provisioned: Rate,
        /// The rate asked for.
        requested: Rate,
    },
    /// A static path does not reach the endpoint.
    #[error("static path {name:?} does not reach {endpoint}; it reaches {reaches:?}")]
    NotReached {
        /// The path.
        name: String,
        /// The endpoint asked for.
        endpoint: Endpoint,
        /// The endpoints it reaches.
        reaches: Vec<String>,
    },
    /// Every port of a VDE switch is in use.
    #[error("the switch of path {name:?} has no free port (it has {ports}); remove a leg first")]
    NoFreePort {
        /// The path.
        name: String,
        /// Its number of ports.
        ports: u32,
    },
    /// A path's `vde_switch` did not come up.
    #[error("vde_switch for path {name:?} did not start; see {log}")]
    SwitchDidNotStart {
        /// The path.
        name: String,
        /// Its log file.
        log: PathBuf,
    },
    /// A leg's `wirefilter` did not attach to the switch.
    #[error("wirefilter for leg {endpoint} of path {name:?} did not attach to the switch; see {log}")]
    LegDidNotAttach {
        /// The path.
        name: String,
        /// The leg's endpoint.
        endpoint: Endpoint,
        /// The wirefilter's log file.
        log: PathBuf,
    },
    /// A VDE management command was refused.
    #[error("VDE `{command}` on {socket}: {source}")]
    Vde {
        /// The command sent.
        command: String,
        /// The management socket.
        socket: PathBuf,
        /// What VDE answered.
        source: vde::MgmtReplyError,
    },
    /// A system command failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// Talking to a management socket or writing a run file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The OESS web service refused or failed.
    #[error("OESS: {0}")]
    Oess(#[from] oess::OessError),
}

/// A provider of multipoint layer-2 paths, one per feed.
pub trait PathService {
    /// The driver name (`static`, `linux-bridge`, `vde`, `oess`).
    fn driver(&self) -> &'static str;

    /// Creates the path of feed `name` with guaranteed rate `rate`, with no legs yet.
    fn create_path(&mut self, name: &str, rate: Rate) -> Result<(), PathError>;

    /// Adds a leg (a subscriber's or the publisher's endpoint) to path `name`. Adding a leg that
    /// is already there is not an error.
    fn add_leg(&mut self, name: &str, leg: &Leg) -> Result<(), PathError>;

    /// Removes the leg at `endpoint` from path `name`; the endpoint stops receiving.
    fn remove_leg(&mut self, name: &str, endpoint: &Endpoint) -> Result<(), PathError>;

    /// Changes the guaranteed rate of path `name`.
    fn set_rate(&mut self, name: &str, rate: Rate) -> Result<(), PathError>;

    /// The paths this driver manages.
    fn list(&mut self) -> Result<Vec<PathInfo>, PathError>;

    /// Removes path `name` and all its legs. Removing a missing path is not an error.
    fn remove_path(&mut self, name: &str) -> Result<(), PathError>;
}
