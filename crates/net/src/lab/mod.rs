//! The namespace lab: hosts as network namespaces, one multipoint path per feed (a Linux bridge,
//! or VDE when a leg has delay), publisher HTB/BFIFO, per-host loss, per-leg one-way delay, and a
//! control network (interface `ctl` in every host, one bridge) for control, subscriptions and
//! the unicast backstop.
//!
//! Invariants:
//! - everything created is named from the validated spec ([`spec`]) and carries the lab name;
//! - the state file (`/run/ldm7-lab/LAB/state.json`) is written *before* each object is created,
//!   so `down` (or the cleanup after a failed `up`) finds everything, even after a crash;
//! - `down` deletes only what the state (or the spec) names, and signals only processes whose
//!   command line names the lab's run directory, or that run inside the lab's namespaces;
//! - `up` is idempotent: a lab that is up with the same spec is left alone; a stale or different
//!   one is taken down first;
//! - the control network is independent of every feed path: it has its own bridge and its own
//!   veths, no HTB and no loss rule, so removing a feed leg never cuts a host's control traffic;
//! - every object lives inside one of the lab's namespaces (or is a VDE process named by the
//!   state), so deleting the namespaces removes the bridges, veths, TAPs, qdiscs and rules.
//!
//! The `ldm7 lab` subcommands (crates/cli) are thin: they parse flags and call [`up_with_progress`],
//! [`down`] / [`down_spec`], [`status`] (printed through [`LabStatus`]'s `Display`) and [`exec`].

pub mod probe;
pub mod spec;

use std::path::{Path, PathBuf};

use crate::command::{Cmd, CommandError, program_exists};
use crate::hostcfg;
use crate::netns;
use crate::path::bridge::BridgePaths;
use crate::path::vde::VdePaths;
use crate::path::{Endpoint, Leg, PathError, PathInfo, PathService};
use crate::tc::{self, HtbPlan, TcCounters};
use ldm7_types::units::LossPercent;

pub use spec::{FeedProblem, FeedSpec, HostSpec, LabSpec, SpecError};

use crate::hostcfg::Ipv4Cidr;

/// Why a lab command failed. [`LabError::exit_code`] gives the CLI's exit status.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Not running as root.
    #[error(
        "ldm7 lab needs root: it creates network namespaces, bridges, TAP devices, tc qdiscs and iptables rules; \
         run it as root (e.g. with sudo)"
    )]
    NotRoot,
    /// The spec or the lab name is wrong.
    #[error("lab spec: {0}")]
    Spec(#[from] SpecError),
    /// A required program is missing.
    #[error("{program} is not installed; {hint}")]
    MissingTool {
        /// The program.
        program: &'static str,
        /// How to install it.
        hint: &'static str,
    },
    /// The lab has no state: it is not up.
    #[error("lab {lab:?} is not up (no state)")]
    NotUp {
        /// The lab.
        lab: String,
    },
    /// The lab has no such host.
    #[error("lab {lab:?} has no host {host:?}; its hosts are {hosts:?}")]
    NoSuchHost {
        /// The lab.
        lab: String,
        /// The host asked for.
        host: String,
        /// The lab's hosts.
        hosts: Vec<String>,
    },
    /// No lab is up (and none was named).
    #[error("no lab is up; bring one up with `ldm7 lab up --spec LAB.toml`")]
    NoLabUp,
    /// Several labs are up and none was named.
    #[error("several labs are up: {}; say which with --name", labs.join(", "))]
    SeveralLabsUp {
        /// The labs that are up.
        labs: Vec<String>,
    },
    /// Namespaces of the lab's names exist without a state file.
    #[error(
        "namespaces named like lab {lab:?} exist but it has no state in {run_dir}; run `ldm7 lab down --spec …` \
         first (it removes exactly the names this spec uses)"
    )]
    Unrecorded {
        /// The lab.
        lab: String,
        /// Where its state would be.
        run_dir: PathBuf,
    },
    /// `exec` was given no command.
    #[error("exec needs a command after `--`, e.g. `ldm7 lab exec pub -- ip addr`")]
    NoCommand,
    /// A system command failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// A path operation failed.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// `up` failed part-way; what it had created was removed.
    #[error("lab {lab:?} could not be brought up: {source}; everything it had created was removed")]
    UpFailed {
        /// The lab.
        lab: String,
        /// The first failure.
        source: Box<LabError>,
    },
}

impl LabError {
    /// 1 for bad input (spec, arguments, not root, unknown lab or host, missing tool), 2 for
    /// runtime failures.
    pub fn exit_code(&self) -> i32 {
        match self {
            LabError::NotRoot
            | LabError::Spec(_)
            | LabError::MissingTool { .. }
            | LabError::NotUp { .. }
            | LabError::NoSuchHost { .. }
            | LabError::NoLabUp
            | LabError::SeveralLabsUp { .. }
            | LabError::Unrecorded { .. }
            | LabError::NoCommand => 1,
            LabError::UpFailed { source, .. } => source.exit_code(),
            LabError::Command(_) | LabError::Path(_) | LabError::Io { .. } => 2,
        }
    }
}

/// What `up` left behind, as recorded in the state file.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LabState {
    /// The lab name.
    pub name: String,
    /// Digest of the spec it was brought up from.
    pub spec_digest: String,
    /// Whether `up` completed.
    pub complete: bool,
    /// Namespaces created (or about to be), in order.
    pub namespaces: Vec<String>,
    /// Feeds whose VDE path was created (or about to be).
    pub vde_feeds: Vec<String>,
    /// The spec, for `status` and `exec`.
    pub spec_toml: String,
}

impl LabState {
    fn path(name: &str) -> PathBuf {
        spec::run_dir(name).join("state.json")
    }

    /// Reads the state of lab `name`, if it has one.
    pub fn read(name: &str) -> Option<LabState> {
        let text = std::fs::read_to_string(LabState::path(name)).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn write(&self) -> Result<(), LabError> {
        let dir = spec::run_dir(&self.name);
        std::fs::create_dir_all(&dir)
            .map_err(|source| LabError::Io { what: format!("creating {}", dir.display()), source })?;
        let path = LabState::path(&self.name);
        let temporary = path.with_extension("tmp");
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        std::fs::write(&temporary, text)
            .and_then(|()| std::fs::rename(&temporary, &path))
            .map_err(|source| LabError::Io { what: format!("writing {}", path.display()), source })
    }
}

/// The names of the labs that have a run directory on this machine.
pub fn labs() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(spec::LAB_RUN_BASE)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().join("state.json").exists())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The one lab that is up, for commands that may omit `--name`.
pub fn only_lab() -> Result<String, LabError> {
    let mut labs = labs();
    match labs.len() {
        1 => Ok(labs.remove(0)),
        0 => Err(LabError::NoLabUp),
        _ => Err(LabError::SeveralLabsUp { labs }),
    }
}

/// Fails with [`LabError::NotRoot`] unless the effective user is root.
pub fn require_root() -> Result<(), LabError> {
    if nix::unistd::geteuid().is_root() { Ok(()) } else { Err(LabError::NotRoot) }
}

/// Brings lab `spec` up (see the module doc for idempotence). Returns true when it created the
/// lab, false when the same lab was already up.
pub fn up(spec: &LabSpec, spec_toml: &str) -> Result<bool, LabError> {
    up_with_progress(spec, spec_toml, &mut |_| {})
}

/// [`up`], reporting each step to `progress`.
pub fn up_with_progress(spec: &LabSpec, spec_toml: &str, progress: &mut dyn FnMut(&str)) -> Result<bool, LabError> {
    require_root()?;
    check_tools(spec)?;
    if let Some(state) = LabState::read(&spec.name) {
        if state.complete && state.spec_digest == spec.digest() && healthy(spec) {
            return Ok(false);
        }
        progress("a stale or different lab of this name is up; taking it down first");
        down_state(&state)?;
    } else if spec.namespaces().iter().any(|n| netns::exists(n)) {
        return Err(LabError::Unrecorded { lab: spec.name.clone(), run_dir: spec.run_dir() });
    }
    let mut state = LabState {
        name: spec.name.clone(),
        spec_digest: spec.digest(),
        spec_toml: spec_toml.to_string(),
        ..LabState::default()
    };
    match build(spec, &mut state, progress) {
        Ok(()) => {
            state.complete = true;
            state.write()?;
            Ok(true)
        }
        Err(error) => {
            if let Err(cleanup) = down_state(&state) {
                tracing::error!(%cleanup, "cleanup after the failed lab up also failed");
            }
            Err(LabError::UpFailed { lab: spec.name.clone(), source: Box::new(error) })
        }
    }
}

/// Takes lab `name` down using its state file. Returns false when there was nothing to do.
pub fn down(name: &str) -> Result<bool, LabError> {
    require_root()?;
    spec::check_lab_name(name)?;
    match LabState::read(name) {
        Some(state) => {
            down_state(&state)?;
            Ok(true)
        }
        None => {
            let dir = spec::run_dir(name);
            if dir.exists() {
                remove_run_dir(&dir)?;
                return Ok(true);
            }
            Ok(false)
        }
    }
}

/// Takes down the one lab that is up, for `down` without a name: its name, or `None` when no lab
/// is up; [`LabError::SeveralLabsUp`] (which lists them) when more than one is.
pub fn down_only() -> Result<Option<String>, LabError> {
    require_root()?;
    match only_lab() {
        Ok(name) => {
            down(&name)?;
            Ok(Some(name))
        }
        Err(LabError::NoLabUp) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Takes down everything spec `spec` would create, whether or not a state file exists.
pub fn down_spec(spec: &LabSpec) -> Result<bool, LabError> {
    require_root()?;
    let mut state = LabState::read(&spec.name).unwrap_or_default();
    state.name = spec.name.clone();
    for namespace in spec.namespaces() {
        if !state.namespaces.contains(&namespace) {
            state.namespaces.push(namespace);
        }
    }
    for feed in spec.feeds.iter().filter(|f| f.uses_vde()) {
        if !state.vde_feeds.contains(&feed.name) {
            state.vde_feeds.push(feed.name.clone());
        }
    }
    let anything = state.namespaces.iter().any(|n| netns::exists(n)) || spec.run_dir().exists();
    down_state(&state)?;
    Ok(anything)
}

/// What `status` reports about one lab.
#[derive(Debug, serde::Serialize)]
pub struct LabStatus {
    /// The lab.
    pub name: String,
    /// Whether `up` completed.
    pub complete: bool,
    /// Each namespace and whether it exists.
    pub namespaces: Vec<(String, bool)>,
    /// The control network (`None` when the recorded spec cannot be read).
    pub control: Option<ControlStatus>,
    /// The paths (bridge and VDE).
    pub paths: Vec<PathInfo>,
    /// Publisher counters per feed (JSON: `{"Ok": counters}` or `{"Err": "message"}`).
    #[serde(serialize_with = "serialize_publishers")]
    pub publishers: Vec<(String, Result<TcCounters, CommandError>)>,
}

/// The control network as `status` sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ControlStatus {
    /// Its bridge (in the core namespace).
    pub bridge: String,
    /// Its subnet.
    pub subnet: Ipv4Cidr,
    /// Its IPv6 prefix, when a host has IPv6.
    pub subnet6: Option<ipnet::Ipv6Net>,
    /// Whether the bridge exists.
    pub present: bool,
    /// Each host's interface `ctl`, in spec order.
    pub hosts: Vec<ControlHost>,
}

/// One host on the control network.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ControlHost {
    /// The host.
    pub host: String,
    /// Its IPv4 address on interface `ctl` (numbered even when its family has no IPv4).
    pub address: Ipv4Cidr,
    /// Its IPv6 address there, when its family has IPv6.
    pub address6: Option<ipnet::Ipv6Net>,
    /// Whether its family has IPv4 (else `address` is not configured).
    pub ipv4: bool,
    /// Whether its bridge port is attached to the control bridge.
    pub attached: bool,
}

/// Lines as `ldm7 lab status` prints them: the lab, its namespaces, control network, paths and
/// tc counters.
impl std::fmt::Display for LabStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "lab {}{}", self.name, if self.complete { "" } else { " (incomplete: run `ldm7 lab down`)" })?;
        for (namespace, exists) in &self.namespaces {
            writeln!(f, "  netns {namespace:<24} {}", if *exists { "present" } else { "MISSING" })?;
        }
        if let Some(control) = &self.control {
            writeln!(
                f,
                "  control {:<22} {:<18} {}",
                control.bridge,
                control.subnet6.map_or_else(|| control.subnet.to_string(), |v6| format!("{} {v6}", control.subnet)),
                if control.present { "present" } else { "MISSING" }
            )?;
            for host in &control.hosts {
                // The addresses of its families: IPv4, IPv6, or both.
                let addresses: Vec<String> = host
                    .ipv4
                    .then(|| host.address.to_string())
                    .into_iter()
                    .chain(host.address6.map(|address| address.to_string()))
                    .collect();
                writeln!(
                    f,
                    "  ctl {:<26} {:<18} {}",
                    host.host,
                    addresses.join(" "),
                    if host.attached { "attached" } else { "DETACHED" }
                )?;
            }
        }
        for path in &self.paths {
            let legs: Vec<String> = path.legs.iter().map(ToString::to_string).collect();
            writeln!(
                f,
                "  path {:<12} {:>14}  {}  legs: {}",
                path.name,
                path.rate.to_string(),
                path.detail,
                legs.join(", ")
            )?;
        }
        for (feed, counters) in &self.publishers {
            match counters {
                Ok(counters) => {
                    for class in &counters.classes {
                        let role = match class.class_id.as_str() {
                            tc::PATH_CLASS => "path",
                            tc::MULTICAST_CLASS => "multicast",
                            tc::RETX_CLASS => "retransmission",
                            _ => "other",
                        };
                        writeln!(
                            f,
                            "  tc {feed:<12} {:<5} {role:<14} sent {} B {} pkt, dropped {}, overlimits {}, backlog {} B {} pkt",
                            class.class_id,
                            class.sent_bytes,
                            class.sent_packets,
                            class.dropped_packets,
                            class.overlimits,
                            class.backlog_bytes,
                            class.backlog_packets
                        )?;
                    }
                }
                Err(error) => writeln!(f, "  tc {feed:<12} unreadable: {error}")?,
            }
        }
        Ok(())
    }
}

/// The statuses as `ldm7 lab status --json` prints them (an array of objects).
pub fn statuses_json(statuses: &[LabStatus]) -> String {
    // Serializing plain data (strings, numbers, booleans) to a String cannot fail.
    serde_json::to_string_pretty(statuses).unwrap_or_default()
}

/// Serializes the publishers' counters as serde serializes `Result<TcCounters, String>`, the
/// error as its message.
fn serialize_publishers<S: serde::Serializer>(
    publishers: &[(String, Result<TcCounters, CommandError>)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = serializer.serialize_seq(Some(publishers.len()))?;
    for (feed, counters) in publishers {
        let counters: Result<&TcCounters, String> = counters.as_ref().map_err(ToString::to_string);
        seq.serialize_element(&(feed, counters))?;
    }
    seq.end()
}

/// The status of lab `name`.
pub fn status(name: &str) -> Result<LabStatus, LabError> {
    let state = LabState::read(name).ok_or_else(|| LabError::NotUp { lab: name.to_string() })?;
    let spec = LabSpec::from_toml_str(&state.spec_toml).ok();
    let namespaces = state.namespaces.iter().map(|n| (n.clone(), netns::exists(n))).collect();
    let control = spec.as_ref().map(control_status);
    let mut paths = Vec::new();
    let mut publishers = Vec::new();
    if let Some(spec) = &spec {
        if spec.uses_bridge() && netns::exists(&spec.core_netns()) {
            paths.extend(BridgePaths::new(Some(&spec.core_netns())).list().unwrap_or_default());
        }
        paths.extend(VdePaths::new(spec.run_dir().join("vde")).list().unwrap_or_default());
        for feed in &spec.feeds {
            publishers.push((feed.name.clone(), tc::read_counters(Some(&spec.netns_of(&feed.publisher)), &feed.name)));
        }
    }
    Ok(LabStatus { name: name.to_string(), complete: state.complete, namespaces, control, paths, publishers })
}

/// The control network of `spec` as it is on the machine.
fn control_status(spec: &LabSpec) -> ControlStatus {
    let core = spec.core_netns();
    let bridge = spec.control_bridge();
    let present = netns::exists(&core) && hostcfg::link_exists(Some(&core), &bridge);
    let ports = if present { hostcfg::bridge_ports(&core, &bridge).unwrap_or_default() } else { Vec::new() };
    let hosts = spec
        .hosts
        .iter()
        .filter_map(|h| {
            let address = spec.control_address_of(&h.name)?;
            let address6 = spec.control_address6_of(&h.name).filter(|_| h.family.has_ipv6());
            let attached = spec.control_port(&h.name).is_some_and(|port| ports.contains(&port));
            Some(ControlHost { host: h.name.clone(), address, address6, ipv4: h.family.has_ipv4(), attached })
        })
        .collect();
    let subnet6 = spec.hosts.iter().any(|h| h.family.has_ipv6()).then_some(spec.control_subnet6);
    ControlStatus { bridge, subnet: spec.control_subnet, subnet6, present, hosts }
}

/// The spec lab `name` was brought up from.
pub fn spec_of(name: &str) -> Result<LabSpec, LabError> {
    let state = LabState::read(name).ok_or_else(|| LabError::NotUp { lab: name.to_string() })?;
    Ok(LabSpec::from_toml_str(&state.spec_toml)?)
}

/// Runs `command` inside host `host` of lab `lab` with this process's stdio; returns its status.
pub fn exec(lab: &str, host: &str, command: &[String]) -> Result<i32, LabError> {
    require_root()?;
    let spec = spec_of(lab)?;
    if spec.host(host).is_none() {
        let hosts = spec.hosts.iter().map(|h| h.name.clone()).collect();
        return Err(LabError::NoSuchHost { lab: lab.to_string(), host: host.to_string(), hosts });
    }
    let (program, args) = command.split_first().ok_or(LabError::NoCommand)?;
    Ok(Cmd::new(program).netns(Some(&spec.netns_of(host))).args(args.iter().cloned()).run_interactive()?)
}

fn check_tools(spec: &LabSpec) -> Result<(), LabError> {
    let mut needed = vec![("ip", "apt-get install -y iproute2"), ("tc", "apt-get install -y iproute2")];
    if spec.hosts.iter().any(|h| !h.loss.is_zero()) {
        needed.push(("iptables", "apt-get install -y iptables"));
    }
    if spec.feeds.iter().any(FeedSpec::uses_vde) {
        needed.push(("vde_switch", "apt-get install -y vde2 (legs with delay use VDE)"));
        needed.push(("wirefilter", "apt-get install -y vde2 (legs with delay use VDE)"));
    }
    for (program, hint) in needed {
        if !program_exists(program) {
            return Err(LabError::MissingTool { program, hint });
        }
    }
    Ok(())
}

fn healthy(spec: &LabSpec) -> bool {
    let vde = VdePaths::new(spec.run_dir().join("vde"));
    spec.namespaces().iter().all(|n| netns::exists(n))
        && control_status(spec).hosts.iter().all(|h| h.attached)
        && spec.feeds.iter().filter(|f| f.uses_vde()).all(|f| {
            let pids = vde.pids(&f.name);
            pids.len() == 1 + f.members().count()
        })
}

fn build(spec: &LabSpec, state: &mut LabState, progress: &mut dyn FnMut(&str)) -> Result<(), LabError> {
    progress(&format!("creating namespaces {}", spec.namespaces().join(", ")));
    for namespace in spec.namespaces() {
        state.namespaces.push(namespace.clone());
        state.write()?;
        netns::add(&namespace)?;
    }
    progress(&format!(
        "control network: {} in {}, interface {} in every host, {}",
        spec.control_bridge(),
        spec.core_netns(),
        spec::CONTROL_INTERFACE,
        spec.control_subnet
    ));
    build_control_network(spec)?;
    progress("host names: /etc/netns/NAMESPACE/hosts names every host's control addresses (HOST and HOST.LAB.test)");
    let hosts = spec.hosts_file();
    for namespace in spec.namespaces() {
        netns::write_hosts(&namespace, &hosts).map_err(|source| LabError::Io {
            what: format!("write {}/hosts", netns::etc_dir(&namespace).display()),
            source,
        })?;
    }
    let mut vde = VdePaths::new(spec.run_dir().join("vde"));
    let mut bridges = BridgePaths::new(Some(&spec.core_netns()));
    for feed in &spec.feeds {
        let kind = if feed.uses_vde() { "VDE switch with wirefilter legs" } else { "Linux bridge" };
        progress(&format!(
            "feed {}: {} at {}, members {}",
            feed.name,
            kind,
            feed.rate,
            feed.members().collect::<Vec<_>>().join(", ")
        ));
        if feed.uses_vde() {
            state.vde_feeds.push(feed.name.clone());
            state.write()?;
            vde.create_path(&feed.name, feed.rate)?;
        } else {
            bridges.create_path(&feed.name, feed.rate)?;
        }
        for host in feed.members() {
            let netns = spec.netns_of(host);
            if feed.uses_vde() {
                hostcfg::create_tap(&netns, &feed.name)?;
            } else {
                let port = spec.bridge_port(&feed.name, host).expect("members are validated hosts");
                hostcfg::create_veth(&netns, &feed.name, &spec.core_netns(), &port)?;
                // Loss at a receiver then drops datagrams one by one, as on a real path (a TAP
                // for VDE gets them one by one already).
                hostcfg::one_datagram_at_a_time(&netns, &feed.name)?;
            }
            configure_host(spec, feed, host)?;
            let leg = leg_of(spec, feed, host);
            if feed.uses_vde() {
                vde.add_leg(&feed.name, &leg)?;
            } else {
                bridges.add_leg(&feed.name, &leg)?;
            }
        }
    }
    Ok(())
}

/// The control network: one bridge in the core namespace, a veth from every host to it, the
/// host's control address on its end. No HTB, no loss rule.
fn build_control_network(spec: &LabSpec) -> Result<(), LabError> {
    let core = spec.core_netns();
    let bridge = spec.control_bridge();
    hostcfg::create_bridge(&core, &bridge)?;
    for host in &spec.hosts {
        let netns = spec.netns_of(&host.name);
        let port = spec.control_port(&host.name).expect("hosts of the spec have a control port");
        let address = spec.control_address_of(&host.name).expect("validated: the control subnet numbers every host");
        hostcfg::create_veth(&netns, spec::CONTROL_INTERFACE, &core, &port)?;
        hostcfg::attach_to_bridge(&core, &port, &bridge)?;
        if host.family.has_ipv4() {
            hostcfg::set_address(Some(&netns), spec::CONTROL_INTERFACE, address)?;
        }
        if host.family.has_ipv6() {
            let address6 = spec.control_address6_of(&host.name).expect("a host of the spec");
            hostcfg::set_address6(Some(&netns), spec::CONTROL_INTERFACE, address6)?;
        }
        hostcfg::link_up(Some(&netns), spec::CONTROL_INTERFACE)?;
    }
    Ok(())
}

/// The leg of `host` on `feed`, as the lab's path service knows it.
pub fn leg_of(spec: &LabSpec, feed: &FeedSpec, host: &str) -> Leg {
    if feed.uses_vde() {
        Leg { one_way_delay: feed.delay_of(host), ..Leg::plain(Endpoint::new(&spec.netns_of(host), &feed.name)) }
    } else {
        Leg::plain(Endpoint::new(host, &spec.bridge_port(&feed.name, host).unwrap_or_default()))
    }
}

/// The path service the lab uses for `feed`.
pub fn path_service(spec: &LabSpec, feed: &FeedSpec) -> Box<dyn PathService> {
    if feed.uses_vde() {
        Box::new(VdePaths::new(spec.run_dir().join("vde")))
    } else {
        Box::new(BridgePaths::new(Some(&spec.core_netns())))
    }
}

fn configure_host(spec: &LabSpec, feed: &FeedSpec, host: &str) -> Result<(), LabError> {
    let netns = spec.netns_of(host);
    let netns = Some(netns.as_str());
    let family = spec.family_of(host);
    // `None` for a subscriber of a feed without `subscriber_addresses`: it configures its own.
    if let Some(address) = feed.address_of(host).filter(|_| family.has_ipv4()) {
        hostcfg::set_address(netns, &feed.name, address)?;
    }
    let numbered6 = host == feed.publisher || feed.subscriber_addresses;
    if let Some(address) = feed.numbered_address6_of(host).filter(|_| family.has_ipv6() && numbered6) {
        hostcfg::set_address6(netns, &feed.name, address)?;
    }
    hostcfg::link_up(netns, &feed.name)?;
    if family.has_ipv4() {
        hostcfg::add_multicast_route(netns, &feed.name, feed.multicast_group)?;
    }
    if family.has_ipv6() {
        hostcfg::add_multicast_route6(netns, &feed.name, feed.multicast_group6)?;
    }
    if host == feed.publisher {
        let plan = HtbPlan {
            multicast_port: feed.multicast_port,
            retx_port: feed.retx_port,
            retx_share: feed.retx_share,
            ..HtbPlan::new(feed.rate, feed.buffer)
        };
        tc::install(netns, &feed.name, &plan)?;
    }
    let loss = spec.host(host).map_or(LossPercent::ZERO, |h| h.loss);
    if family.has_ipv4() {
        hostcfg::install_receive_loss(netns, &feed.name, loss)?;
    }
    if family.has_ipv6() {
        hostcfg::install_receive_loss6(netns, &feed.name, loss)?;
    }
    Ok(())
}

fn down_state(state: &LabState) -> Result<(), LabError> {
    let dir = spec::run_dir(&state.name);
    let mut vde = VdePaths::new(dir.join("vde"));
    let mut first_error = None;
    for feed in &state.vde_feeds {
        if let Err(error) = vde.remove_path(feed) {
            first_error.get_or_insert(LabError::from(error));
        }
    }
    for namespace in state.namespaces.iter().rev() {
        if let Err(error) = netns::delete(namespace) {
            first_error.get_or_insert(LabError::from(error));
        }
    }
    if let Err(error) = remove_run_dir(&dir) {
        first_error.get_or_insert(error);
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

fn remove_run_dir(dir: &Path) -> Result<(), LabError> {
    // Any VDE process still holding a socket here is ours: its command line names this directory.
    if let Ok(entries) = std::fs::read_dir(dir.join("vde")) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let _ = VdePaths::new(dir.join("vde")).remove_path(&name);
        }
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(LabError::Io { what: format!("removing {}", dir.display()), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::ClassCounters;

    fn status() -> LabStatus {
        let counters = TcCounters {
            classes: vec![ClassCounters {
                class_id: tc::MULTICAST_CLASS.into(),
                sent_bytes: 1490,
                sent_packets: 1,
                ..Default::default()
            }],
        };
        let unreadable = CommandError::Failed {
            command: "tc -s class show dev conduit".into(),
            status: "exit status: 1".into(),
            stderr: "Cannot find device \"conduit\"".into(),
        };
        LabStatus {
            name: "t1".into(),
            complete: true,
            namespaces: vec![("t1-pub".into(), true), ("t1-sub".into(), false)],
            control: Some(ControlStatus {
                bridge: "br-ctl".into(),
                subnet: "10.76.0.0/24".parse().unwrap(),
                subnet6: Some("fd00:4c37:76::/64".parse().unwrap()),
                present: true,
                hosts: vec![
                    ControlHost {
                        host: "pub".into(),
                        address: "10.76.0.1/24".parse().unwrap(),
                        address6: None,
                        ipv4: true,
                        attached: true,
                    },
                    ControlHost {
                        host: "sub".into(),
                        address: "10.76.0.2/24".parse().unwrap(),
                        address6: Some("fd00:4c37:76::2/64".parse().unwrap()),
                        ipv4: false,
                        attached: false,
                    },
                ],
            }),
            paths: Vec::new(),
            publishers: vec![("ngrid".into(), Ok(counters)), ("conduit".into(), Err(unreadable))],
        }
    }

    #[test]
    fn status_json_keeps_counters_or_the_error_text() {
        let json: serde_json::Value = serde_json::from_str(&statuses_json(&[status()])).unwrap();
        let publishers = &json[0]["publishers"];
        assert_eq!(publishers[0][0], "ngrid");
        assert_eq!(publishers[0][1]["Ok"]["classes"][0]["sent_bytes"], 1490);
        assert_eq!(publishers[1][0], "conduit");
        let error = publishers[1][1]["Err"].as_str().unwrap();
        assert!(error.starts_with("`tc -s class show dev conduit` failed"), "{error}");
        let control = &json[0]["control"];
        assert_eq!(control["bridge"], "br-ctl");
        assert_eq!(control["present"], true);
        assert_eq!(control["subnet"]["address"], "10.76.0.0");
        assert_eq!(control["subnet"]["prefix_len"], 24);
        assert_eq!(control["hosts"][1]["host"], "sub");
        assert_eq!(control["hosts"][1]["address"]["address"], "10.76.0.2");
        assert_eq!(control["hosts"][1]["attached"], false);
    }

    #[test]
    fn status_text_has_a_line_per_namespace_and_class() {
        let text = status().to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "lab t1");
        assert!(lines[1].contains("t1-pub") && lines[1].ends_with("present"), "{text}");
        assert!(lines[2].ends_with("MISSING"), "{text}");
        assert!(lines[3].starts_with("  control br-ctl") && lines[3].contains("10.76.0.0/24"), "{text}");
        assert!(lines[3].ends_with("present"), "{text}");
        assert!(lines[4].starts_with("  ctl pub") && lines[4].contains("10.76.0.1/24"), "{text}");
        assert!(lines[4].ends_with("attached"), "{text}");
        assert!(lines[5].starts_with("  ctl sub") && lines[5].ends_with("DETACHED"), "{text}");
        // An IPv6-only host shows its IPv6 address only.
        assert!(lines[5].contains("fd00:4c37:76::2/64") && !lines[5].contains("10.76.0.2"), "{text}");
        assert!(lines[6].contains("1:10  multicast") && lines[6].contains("sent 1490 B 1 pkt"), "{text}");
        assert!(lines[7].contains("conduit") && lines[7].contains("unreadable: `tc -s class show"), "{text}");
    }

    #[test]
    fn input_errors_exit_1_and_failures_2() {
        assert_eq!(LabError::NoLabUp.exit_code(), 1);
        assert_eq!(LabError::SeveralLabsUp { labs: vec!["a".into(), "b".into()] }.exit_code(), 1);
        let spec = LabError::from(spec::check_lab_name("Bad").unwrap_err());
        assert_eq!(spec.exit_code(), 1);
        assert!(spec.to_string().starts_with("lab spec: lab name \"Bad\""), "{spec}");
        let io = LabError::Io { what: "writing x".into(), source: std::io::Error::other("disk full") };
        assert_eq!(io.exit_code(), 2);
        let up_failed = LabError::UpFailed { lab: "t1".into(), source: Box::new(io) };
        assert_eq!(up_failed.exit_code(), 2);
    }
}
