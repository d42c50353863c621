//! `ldm7 lab idd` (root): a miniature IDD on this machine — a tiered network of real servers in
//! namespaces, fed a generated IDD workload, optionally under faults, and measured against the
//! same network as an all-LDM-6 tree in the same invocation (issue #41).
//!
//! The network (an `ldm7 lab`, built afresh for each mode):
//!
//! - `top`, the publisher. With LDM-7 (the first mode) it multicasts every feed (`MULTICAST ANY`)
//!   over one rate-guaranteed path (the lab feed `top`, HTB at `--rate`) to the relays; with
//!   LDM-6 (`--ldm6`, the baseline run after it) the relays `REQUEST ANY` from it over the same
//!   path, one TCP connection each;
//! - relays `r1` … `rN`: each serves its leaves by LDM-6 over a path of its own (the lab feed
//!   `rK`, HTB at `--relay-rate`);
//! - leaves `lKxJ`: each requests everything from its relay (`REQUEST ANY ".*"`) and files it with
//!   `ldm7 act` (an EXEC'd pqact with a pqact.conf of FILE entries per feed, as a site has);
//! - with `LDM_REF_BIN` (a Unidata LDM 6.15 build), `u1`: a reference relay fed by LDM-6 from
//!   `r1` (on `r1`'s path), with two ldm7 leaves `lu1x1`, `lu1x2` on a path of its own.
//!
//! Every leg's one-way delay (0–`--delay-max`) and every relay's and leaf's receive loss
//! (0–`--loss-max`) are drawn from `--seed`; any delay makes the paths VDE. The workload is
//! `ldm7 trace generate` (the IDD's eight feeds) for `--minutes` of traffic at `--scale` of the
//! IDD's rates, replayed in real time into the top's queue.
//!
//! With `--chaos SEED`, faults drawn from that seed during the replay, the same in both modes
//! and each logged with its time: a relay and a leaf killed with SIGKILL and started again 10 s
//! later (two of each in a run of 10 minutes or more), the top stopped and started again, a
//! relay's receive loss raised by 20% for a minute (iptables `statistic`), and a leaf's disk (a
//! tmpfs under its pqact's files) filled until its pqact's writes fail and freed 30 s later.
//!
//! Then every node must hold every product (checked by signature, and by MD5 of each product's
//! data) and each leaf's pqact must have filed every product byte. The results per node:
//! completeness, latency p50/p99 (insertion at the node − creation at the top, one clock),
//! products by FMTP / backstop / backlog, the top's egress per product byte (its feed path's
//! HTB bytes plus what left its control interface — the LDM-7 backstop and backlog and every
//! subscription go that way), each relay's path egress, CPU seconds and peak memory. A table
//! goes to standard output; a CSV per mode, the events, a comparison and a figure go to `--out`;
//! `ldm7 monitor` runs on the top's host with its dashboard over every node, and a screenshot
//! of the dashboard is taken at the end of each mode (with Chromium, when there is one).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ldm7_net::command::Cmd;
use ldm7_pq::Capacity;
use ldm7_types::{Rate, Timestamp};

use crate::reference::{Host, RefConfig, RefServer, Reference, Registry};
use crate::{
    Comparison, DeliveryMode, Egress, Lab, ProductRecord, Replay, ReplayOptions, Server, ServerConfig,
    latency_quantile_us,
};

/// What `ldm7 lab idd` builds and runs.
#[derive(Debug, Clone)]
pub struct IddOptions {
    /// Relays subscribed to the top by LDM-7.
    pub relays: usize,
    /// LDM-6 leaves per relay.
    pub leaves: usize,
    /// Minutes of traffic (trace time, replayed in real time).
    pub minutes: u32,
    /// The IDD's rates multiplied by this (the whole network must fit this machine).
    pub scale: f64,
    /// The seed of the workload, the delays and the losses.
    pub seed: u64,
    /// The top's path rate (HTB, and the FMTP pacing).
    pub rate: Rate,
    /// Each relay's path rate to its leaves.
    pub relay_rate: Rate,
    /// Largest one-way delay of a leg.
    pub delay_max: Duration,
    /// Largest receive loss of a relay or a leaf, percent.
    pub loss_max: f64,
    /// The seed of the faults (`None`: no faults).
    pub chaos: Option<u64>,
    /// The kinds of fault `chaos` draws from ([`FAULT_KINDS`]; empty: all of them).
    pub faults: Vec<String>,
    /// Keep the scratch directory (every node's log and state; not the queues nor the filed
    /// products) and say where.
    pub keep: bool,
    /// Also run the all-LDM-6 tree after the LDM-7 one (the baseline).
    pub ldm6: bool,
    /// Leave the monitor and its screenshot out.
    pub no_monitor: bool,
    /// Where the results go.
    pub out: PathBuf,
    /// Directory for the nodes' queues and logs (`None`: the system temporary directory).
    pub dir: Option<PathBuf>,
}

/// How the top feeds the relays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Ldm7,
    Ldm6,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Ldm7 => "ldm7",
            Mode::Ldm6 => "ldm6",
        }
    }
}

/// One node's results.
#[derive(Clone, Debug)]
struct NodeResult {
    name: String,
    tier: &'static str,
    software: &'static str,
    loss_percent: f64,
    delay_ms: f64,
    products: usize,
    missing: usize,
    corrupt: usize,
    received: usize,
    inserted: usize,
    backlog: usize,
    /// Blocks repaired by unicast or parity (FMTP deliveries).
    retx_blocks: u64,
    /// Datagrams its host dropped for want of receive-buffer room during the replay and the
    /// wait (its namespace's `Udp: RcvbufErrors`).
    udp_drops: Option<u64>,
    p50_ms: f64,
    p99_ms: f64,
    cpu_s: f64,
    peak_mib: f64,
    /// Egress per product byte (top: its path and control interface; relays: their path).
    egress_per_byte: Option<f64>,
    /// The top's multicast class, retransmission class and control interface shares of it.
    egress_split: Option<(f64, f64, f64)>,
    /// Bytes its pqact filed (leaves).
    filed_bytes: Option<u64>,
}

/// A small deterministic generator for the draws (the seed's stream, not the OS's).
struct Draws(u64);

impl Draws {
    fn next_unit(&mut self) -> f64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One of `0..n`.
    fn index(&mut self, n: usize) -> usize {
        ((self.next_unit() * n as f64) as usize).min(n.saturating_sub(1))
    }
}

/// The reference relay: its name, the relay that feeds it and its leaves.
struct RefPlan {
    name: String,
    parent: String,
    leaves: Vec<String>,
}

/// The network's hosts and the draws for them.
struct Plan {
    relays: Vec<String>,
    /// Per relay, its leaves.
    leaves: Vec<Vec<String>>,
    reference: Option<RefPlan>,
    /// The reference LDM-7 leaf subscribed to the top (`LDM7_REF_BIN`).
    reference7: Option<String>,
    loss: BTreeMap<String, f64>,
    /// One-way delay of each host's leg on the path it receives by, milliseconds.
    delay_ms: BTreeMap<String, u64>,
}

fn plan(args: &IddOptions, with_reference: bool, with_reference7: bool) -> Plan {
    let mut draws = Draws(args.seed);
    let relays: Vec<String> = (1..=args.relays).map(|k| format!("r{k}")).collect();
    let leaves: Vec<Vec<String>> =
        (1..=args.relays).map(|k| (1..=args.leaves).map(|j| format!("l{k}x{j}")).collect()).collect();
    let reference = with_reference.then(|| RefPlan {
        name: "u1".into(),
        parent: "r1".into(),
        leaves: vec!["lu1x1".into(), "lu1x2".into()],
    });
    let delay_max_ms = args.delay_max.as_millis() as f64;
    let mut loss = BTreeMap::new();
    let mut delay_ms = BTreeMap::new();
    // The reference's hosts are drawn last: the others' draws do not depend on it.
    let reference7 = with_reference7.then(|| "m1".to_owned());
    let extra: Vec<String> = reference
        .iter()
        .flat_map(|r| std::iter::once(r.name.clone()).chain(r.leaves.iter().cloned()))
        .chain(reference7.clone())
        .collect();
    for host in relays.iter().chain(leaves.iter().flatten()).chain(&extra) {
        // Losses in steps of 0.1%, delays in whole milliseconds.
        loss.insert(host.clone(), (draws.next_unit() * args.loss_max * 10.0).round() / 10.0);
        delay_ms.insert(host.clone(), (draws.next_unit() * delay_max_ms).round() as u64);
    }
    Plan { relays, leaves, reference, reference7, loss, delay_ms }
}

fn lab_spec(name: &str, args: &IddOptions, plan: &Plan, mode: Mode) -> String {
    let mut spec = format!("name = \"{name}\"\n[[hosts]]\nname = \"top\"\n");
    let mut hosts: Vec<String> = plan.relays.iter().chain(plan.leaves.iter().flatten()).cloned().collect();
    if let Some(reference) = &plan.reference {
        hosts.push(reference.name.clone());
        hosts.extend(reference.leaves.iter().cloned());
    }
    hosts.extend(plan.reference7.iter().cloned());
    for host in &hosts {
        let _ = write!(spec, "[[hosts]]\nname = \"{host}\"\nloss_percent = {:?}\n", plan.loss[host]);
    }
    let delays = |hosts: &[String]| -> String {
        let legs: Vec<String> = hosts.iter().map(|h| format!("{h} = \"{}ms\"", plan.delay_ms[h])).collect();
        format!("{{ {} }}", legs.join(", "))
    };
    let quoted = |hosts: &[String]| hosts.iter().map(|h| format!("\"{h}\"")).collect::<Vec<_>>().join(", ");
    // With LDM-7 the relays configure the FMTP addresses the top hands out (the reference
    // LDM-7 leaf is given one by the harness); with LDM-6 they need addresses of the lab's to
    // reach the top over the path.
    let top_subscribers: Vec<String> = plan.relays.iter().chain(&plan.reference7).cloned().collect();
    let _ = write!(
        spec,
        "[[feeds]]\nname = \"top\"\npublisher = \"top\"\nsubscribers = [{}]\nrate = \"{}\"\nbuffer = \"600 MB\"\n\
         multicast_port = 38800\nretx_port = 38801\nsubscriber_addresses = {}\ndelay = {}\n",
        quoted(&top_subscribers),
        args.rate,
        mode == Mode::Ldm6,
        delays(&top_subscribers)
    );
    for (relay, leaves) in plan.relays.iter().zip(&plan.leaves) {
        let mut subscribers = leaves.clone();
        if let Some(reference) = plan.reference.as_ref().filter(|r| &r.parent == relay) {
            subscribers.push(reference.name.clone());
        }
        let _ = write!(
            spec,
            "[[feeds]]\nname = \"{relay}\"\npublisher = \"{relay}\"\nsubscribers = [{}]\nrate = \"{}\"\n\
             buffer = \"600 MB\"\ndelay = {}\n",
            quoted(&subscribers),
            args.relay_rate,
            delays(&subscribers)
        );
    }
    if let Some(reference) = &plan.reference {
        let _ = write!(
            spec,
            "[[feeds]]\nname = \"{0}\"\npublisher = \"{0}\"\nsubscribers = [{1}]\nrate = \"{2}\"\n\
             buffer = \"600 MB\"\ndelay = {3}\n",
            reference.name,
            quoted(&reference.leaves),
            args.relay_rate,
            delays(&reference.leaves)
        );
    }
    spec
}

/// A site's pqact.conf: every product filed by its feed and its identifier's first field, per
/// hour, as decoders' FILE entries do.
const PQACT_CONF: &str = "# ldm7 lab idd: every product filed per feed, first field and hour\n\
ANY\t^([^ /]*)\tFILE\t-close\tdata/(\\1)/%H\n";

/// What an LDM-6-only server runs to report to the monitor, as an LDM 6 site does: `rtstats`
/// into its own queue (the monitor requests `rtstats-` products from every node), naming it
/// `name`. (A server with LDM-7 entries reports by its statistics products.)
fn rtstats_entries(name: &str) -> String {
    format!("ACCEPT EXP ^rtstats- ^127\\.0\\.0\\.1$\nEXEC \"rtstats -h 127.0.0.1 -H {name}\"\n")
}

/// How long a killed server stays down.
const DOWN_FOR: Duration = Duration::from_secs(10);
/// How long a relay's path loss stays raised.
const LOSS_FOR: Duration = Duration::from_secs(60);
/// The raised loss, percent.
const LOSS_RAISED: f64 = 20.0;
/// How long a leaf's disk stays full.
const FULL_FOR: Duration = Duration::from_secs(30);

/// One step of the faults.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Kill(String),
    Start(String),
    StopTop,
    StartTop,
    LossOn(String),
    LossOff(String),
    Fill(String),
    Free(String),
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Kill(node) => write!(f, "kill -9 {node}"),
            Action::Start(node) => write!(f, "start {node} again"),
            Action::StopTop => write!(f, "stop top (SIGTERM)"),
            Action::StartTop => write!(f, "start top again"),
            Action::LossOn(relay) => write!(f, "raise {relay}'s path loss by {LOSS_RAISED}%"),
            Action::LossOff(relay) => write!(f, "end {relay}'s raised loss"),
            Action::Fill(leaf) => write!(f, "fill {leaf}'s disk"),
            Action::Free(leaf) => write!(f, "free {leaf}'s disk"),
        }
    }
}

/// The kinds of fault of `--chaos`, in the order they come: a relay killed, a leaf killed, a
/// relay's loss raised, the top restarted, a leaf's disk filled.
pub const FAULT_KINDS: [&str; 5] = ["relay", "leaf", "loss", "top", "disk"];

/// The faults of `--chaos SEED` of the kinds `kinds` (empty: all): steps at times since the
/// replay's start, in time order.
fn chaos_steps(seed: u64, minutes: u32, plan: &Plan, kinds: &[String]) -> Vec<(Duration, Action)> {
    let mut draws = Draws(seed);
    let relays = &plan.relays;
    let leaves: Vec<String> = plan.leaves.iter().flatten().cloned().collect();
    let kills = if minutes >= 10 { 2 } else { 1 };
    // The faults in turn, each in a slot of its own; a victim is never hit twice by one kind.
    let mut faults: Vec<&str> = FAULT_KINDS.to_vec();
    for _ in 1..kills {
        faults.extend(["relay", "leaf"]);
    }
    faults.retain(|kind| kinds.is_empty() || kinds.iter().any(|wanted| wanted == kind));
    let slot = Duration::from_secs(u64::from(minutes) * 60) / (faults.len() as u32 + 1);
    let pick = |from: &[String], avoid: &[String], draws: &mut Draws| -> String {
        let choices: Vec<&String> = from.iter().filter(|name| !avoid.contains(name)).collect();
        let choices = if choices.is_empty() { from.iter().collect() } else { choices };
        choices[draws.index(choices.len())].clone()
    };
    let mut used: Vec<String> = Vec::new();
    let mut steps = Vec::new();
    for (k, fault) in faults.iter().enumerate() {
        let at = slot * (k as u32 + 1) + slot.mul_f64(draws.next_unit() / 3.0);
        match *fault {
            "relay" | "leaf" => {
                let node = pick(if *fault == "relay" { relays } else { &leaves }, &used, &mut draws);
                used.push(node.clone());
                steps.push((at, Action::Kill(node.clone())));
                steps.push((at + DOWN_FOR, Action::Start(node)));
            }
            "loss" => {
                let relay = pick(relays, &used, &mut draws);
                used.push(relay.clone());
                steps.push((at, Action::LossOn(relay.clone())));
                steps.push((at + LOSS_FOR, Action::LossOff(relay)));
            }
            "top" => {
                steps.push((at, Action::StopTop));
                steps.push((at + DOWN_FOR, Action::StartTop));
            }
            _ => {
                let leaf = pick(&leaves, &used, &mut draws);
                used.push(leaf.clone());
                steps.push((at, Action::Fill(leaf.clone())));
                steps.push((at + FULL_FOR, Action::Free(leaf)));
            }
        }
    }
    steps.sort_by_key(|(at, _)| *at);
    steps
}

/// A server of the network: ldm7's or the reference's.
enum Node {
    Ours(Server),
    Reference(RefServer),
}

impl Node {
    fn name(&self) -> &str {
        match self {
            Node::Ours(server) => server.name(),
            Node::Reference(server) => server.name(),
        }
    }

    fn software(&self) -> &'static str {
        match self {
            Node::Ours(_) => "ldm7",
            Node::Reference(server) if server.reference().multicast => "LDM 6.13.17",
            Node::Reference(_) => "LDM 6.15",
        }
    }

    fn dir(&self) -> &Path {
        match self {
            Node::Ours(server) => server.dir(),
            Node::Reference(server) => server.dir(),
        }
    }

    fn start(&mut self) -> anyhow::Result<()> {
        match self {
            Node::Ours(server) => server.start()?,
            Node::Reference(server) => server.start()?,
        }
        Ok(())
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        match self {
            Node::Ours(server) => server.stop()?,
            Node::Reference(server) => server.stop()?,
        }
        Ok(())
    }

    fn kill(&mut self) {
        match self {
            Node::Ours(server) => server.kill(),
            Node::Reference(server) => server.kill(),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Node::Ours(server) => server.pid(),
            Node::Reference(server) => server.pid(),
        }
    }

    fn log(&self) -> String {
        match self {
            Node::Ours(server) => server.log(),
            Node::Reference(server) => server.log(),
        }
    }

    /// What its queue holds (the reference's: signatures and MD5 only, no times).
    fn records(&self) -> anyhow::Result<Vec<ProductRecord>> {
        Ok(match self {
            Node::Ours(server) => server.records()?,
            // Statistics products are the servers' own, not the feed's (and their signature is
            // not their data's MD5), as `read_records` leaves them out of ldm7's.
            Node::Reference(server) => server
                .held()?
                .into_iter()
                .filter(|held| !held.info.contains(" ldm7-stats/"))
                .map(|held| ProductRecord {
                    signature: held.signature,
                    size: held.size,
                    created: Timestamp::ZERO,
                    inserted: Timestamp::ZERO,
                    latency_us: 0,
                    mode: None,
                    retransmitted_blocks: None,
                    intact: held.intact,
                    info: held.info,
                })
                .collect(),
        })
    }
}

/// A host-wide `net.core` setting raised for the run, put back when dropped (a network
/// namespace reads the host's and cannot set its own).
struct RaisedSysctl {
    path: &'static str,
    previous: String,
}

impl RaisedSysctl {
    /// `net.core.rmem_default`: the reference LDM-7's FMTP receiver leaves its multicast socket's
    /// buffer at the host's default (212,992 bytes here), where an ldm7 receiver asks for
    /// `receive_gap` (500 ms) of the path's rate, which the kernel doubles: with the default,
    /// the reference's host dropped 738 of its about 53,000 datagrams in a 4-minute run
    /// (100 Mbit/s bursts), each then retransmitted by the top.
    fn receive_buffer(bytes: usize) -> anyhow::Result<RaisedSysctl> {
        Self::raise(
            "/proc/sys/net/core/rmem_default",
            bytes,
            "the reference LDM-7 leaf's multicast socket gets the buffer an ldm7 receiver has",
        )
    }

    /// `net.core.wmem_default`: the VDE processes that carry the multipoint path (`vde_switch`,
    /// each leg's `wirefilter`) pass frames over unix datagram sockets, whose queued frames are
    /// charged to the sending socket's buffer. At the default (212,992 bytes, about 90 frames)
    /// a wirefilter that does not run for 40 ms — common on this 2-core host with every server
    /// of the run on it — loses the frames beyond: bursts of blocks a real path would not lose,
    /// each repaired by the top. The run's path holds what a receiver holds. (Two namespaces
    /// on one switch, 30,000 frames at 3.7 MB/s, the receiving leg's wirefilter stopped for
    /// 40 ms every 300 ms: 250 and 295 more frames lost at the default than without the
    /// stops, none more at 4 MiB; `net.unix.max_dgram_qlen` made no difference.)
    fn path_buffer(bytes: usize) -> anyhow::Result<RaisedSysctl> {
        Self::raise(
            "/proc/sys/net/core/wmem_default",
            bytes,
            "the emulated path's processes hold a stall's frames instead of dropping them",
        )
    }

    fn raise(path: &'static str, bytes: usize, why: &str) -> anyhow::Result<RaisedSysctl> {
        let previous = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
        let name = Self::name(path);
        if previous.trim().parse::<usize>().is_ok_and(|now| now >= bytes) {
            println!("ldm7 lab idd: {name} {} kept for the run ({why})", previous.trim());
            return Ok(RaisedSysctl { path, previous });
        }
        std::fs::write(path, bytes.to_string()).with_context(|| format!("write {path}"))?;
        println!("ldm7 lab idd: {name} {} → {bytes} for the run ({why})", previous.trim());
        Ok(RaisedSysctl { path, previous })
    }

    fn name(path: &str) -> String {
        path.trim_start_matches("/proc/sys/").replace('/', ".")
    }
}

impl Drop for RaisedSysctl {
    fn drop(&mut self) {
        if let Err(error) = std::fs::write(self.path, self.previous.trim()) {
            eprintln!("ldm7 lab idd: cannot put {} back to {}: {error}", Self::name(self.path), self.previous.trim());
        }
    }
}

/// A tmpfs mounted on a leaf's `data` directory (its pqact's files): unmounted when dropped.
struct Disk {
    dir: PathBuf,
}

impl Disk {
    fn mount(dir: &Path, bytes: u64) -> anyhow::Result<Disk> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .status()
            .context("run mount")?;
        if !status.success() {
            bail!("mount -t tmpfs on {}: {status}", dir.display());
        }
        Ok(Disk { dir: dir.to_path_buf() })
    }

    fn filler(&self) -> PathBuf {
        self.dir.join(".filler")
    }

    /// Takes every free block (a file with its blocks allocated).
    fn fill(&self) -> anyhow::Result<u64> {
        let stats = nix::sys::statvfs::statvfs(&self.dir).context("statvfs")?;
        let free = stats.blocks_available() * stats.fragment_size();
        let file = std::fs::File::create(self.filler()).context("create the filler")?;
        let _ = nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, free as libc::off_t);
        Ok(free)
    }

    fn free(&self) {
        let _ = std::fs::remove_file(self.filler());
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// The places of the nodes on the dashboard's map: the top at Boulder, each relay at a city,
/// its leaves around it.
const CITIES: [(f64, f64); 12] = [
    (47.61, -122.33),
    (37.77, -122.42),
    (34.05, -118.24),
    (33.45, -112.07),
    (29.76, -95.37),
    (41.88, -87.63),
    (39.95, -75.17),
    (42.36, -71.06),
    (33.75, -84.39),
    (44.98, -93.27),
    (35.47, -97.52),
    (38.91, -77.04),
];

/// Set by SIGINT or SIGTERM: the run stops at its next wait, and everything it made (servers,
/// the tmpfs, the lab) is taken down as it unwinds.
static INTERRUPTED: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicBool>> = std::sync::OnceLock::new();

fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|flag| flag.load(std::sync::atomic::Ordering::Relaxed))
}

/// Fails once interrupted.
fn check_interrupted() -> anyhow::Result<()> {
    if interrupted() {
        bail!("interrupted: the network is taken down");
    }
    Ok(())
}

/// Sleeps `duration`, or less when interrupted.
fn sleep_unless_interrupted(duration: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + duration;
    while let Some(left) = end.checked_duration_since(Instant::now()).filter(|left| !left.is_zero()) {
        check_interrupted()?;
        std::thread::sleep(left.min(Duration::from_millis(250)));
    }
    check_interrupted()
}

/// What one mode of the run came to.
struct ModeOutcome {
    mode: Mode,
    results: Vec<NodeResult>,
    events: Vec<String>,
    feed_bytes: u64,
    /// Latency of every delivery at a relay or leaf of ldm7's by tier and feed, milliseconds.
    feed_latencies_ms: BTreeMap<(&'static str, String), Vec<f64>>,
    /// Products and bytes the top published, by feed.
    feeds: BTreeMap<String, (usize, u64)>,
    /// What the top sent the reference LDM-7 leaf by unicast (LDM-7 mode), per product byte.
    reference7_egress: Option<f64>,
}

impl ModeOutcome {
    /// Latency of every delivery at a leaf of ldm7's, milliseconds.
    fn leaf_latencies_ms(&self) -> Vec<f64> {
        self.feed_latencies_ms
            .iter()
            .filter(|((tier, _), _)| *tier == "leaf")
            .flat_map(|(_, ms)| ms.iter().copied())
            .collect()
    }
}

/// Runs the network (LDM-7, then with `--ldm6` the all-LDM-6 tree) and prints and writes the
/// results.
pub fn run(args: &IddOptions) -> anyhow::Result<()> {
    ldm7_net::lab::require_root()?;
    if args.relays == 0 || args.relays > 12 || args.leaves == 0 || args.leaves > 4 {
        bail!("--relays must be 1 to 12 and --leaves 1 to 4 (the lab holds 64 hosts and 16 paths)");
    }
    if !(0.0..50.0).contains(&args.loss_max) {
        bail!("--loss-max is a percentage below 50");
    }
    if args.chaos.is_some() && args.minutes < 3 {
        bail!("--chaos needs --minutes 3 or more (its faults take two minutes and a half)");
    }
    if let Some(unknown) = args.faults.iter().find(|kind| !FAULT_KINDS.contains(&kind.as_str())) {
        bail!("--faults: no fault {unknown:?} (the kinds are {})", FAULT_KINDS.join(", "));
    }
    if !args.faults.is_empty() && args.chaos.is_none() {
        bail!("--faults chooses among the faults of --chaos SEED: give a seed too");
    }
    let flag = INTERRUPTED.get_or_init(Default::default).clone();
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, flag.clone()).context("handle SIGINT and SIGTERM")?;
    }
    let exe = std::env::current_exe().context("find the ldm7 executable")?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    let reference = Reference::ldm6()?;
    let scratch = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    let trace = scratch.path().join("idd.trace");
    let generated = Command::new(&exe)
        .args(["trace", "generate", "--duration", &format!("{}min", args.minutes)])
        .args(["--scale", &args.scale.to_string(), "--seed", &args.seed.to_string(), "-o"])
        .arg(&trace)
        .output()
        .context("run ldm7 trace generate")?;
    if !generated.status.success() {
        bail!("ldm7 trace generate: {}", String::from_utf8_lossy(&generated.stderr));
    }
    let (trace_products, trace_bytes) = trace_totals(&trace)?;
    let reference7 = Reference::ldm7()?;
    let plan = plan(args, reference.is_some(), reference7.is_some());
    let extra = plan.reference.as_ref().map_or(0, |r| 1 + r.leaves.len()) + plan.reference7.iter().count();
    let servers = 1 + args.relays * (1 + args.leaves) + extra;
    println!(
        "ldm7 lab idd: {servers} servers (1 top, {} relays, {} leaves{}); the IDD's 8 feeds at scale {} for {} min: \
         {trace_products} products, {:.1} MB ({:.1} Mbit/s on average); seed {}{}",
        args.relays,
        args.relays * args.leaves,
        match &plan.reference {
            Some(r) => format!(
                ", and the reference LDM 6.15 relay {} under {} with {} leaves",
                r.name,
                r.parent,
                r.leaves.len()
            ),
            None => String::new(),
        } + &plan
            .reference7
            .as_ref()
            .map(|name| format!(", and the reference LDM-7 leaf {name} under the top"))
            .unwrap_or_default(),
        args.scale,
        args.minutes,
        trace_bytes as f64 / 1e6,
        trace_bytes as f64 * 8.0 / (f64::from(args.minutes) * 60.0) / 1e6,
        args.seed,
        args.chaos.map_or(String::new(), |seed| format!("; faults from --chaos {seed}"))
    );
    if reference.is_none() {
        println!("ldm7 lab idd: no LDM_REF_BIN: no reference LDM 6.15 relay");
    }
    if reference7.is_none() {
        println!("ldm7 lab idd: no LDM7_REF_BIN: no reference LDM-7 leaf");
    }
    let steps = match args.chaos {
        Some(seed) => chaos_steps(seed, args.minutes, &plan, &args.faults),
        None => Vec::new(),
    };
    let modes: Vec<Mode> = if args.ldm6 { vec![Mode::Ldm7, Mode::Ldm6] } else { vec![Mode::Ldm7] };
    let label = format!(
        "idd-r{}-l{}-{}min-x{}-seed{}{}",
        args.relays,
        args.leaves,
        args.minutes,
        args.scale,
        args.seed,
        args.chaos.map_or(String::new(), |seed| format!("-chaos{seed}"))
    );
    // What an ldm7 receiver's multicast socket gets for the path's rate (SO_RCVBUF doubles
    // what it asks for).
    let path_bytes =
        2 * ldm7_fmtp::udp::receive_buffer_bytes(args.rate.bits_per_s(), ldm7_plan::repair::RECEIVE_GAP_DEFAULT);
    // Same settings for both receivers: the reference LDM-7's multicast socket gets the
    // receive buffer an ldm7 receiver sizes for the path.
    let _receive_buffer = match &plan.reference7 {
        Some(_) => Some(RaisedSysctl::receive_buffer(path_bytes)?),
        None => None,
    };
    // The same for both modes: the emulated links lose what the seed draws, not what a stalled
    // emulator process could not queue.
    let _path_buffer = RaisedSysctl::path_buffer(path_bytes)?;
    let mut outcomes = Vec::new();
    for mode in modes {
        println!("ldm7 lab idd: {} — building the network", mode_title(mode));
        let run = Run {
            args,
            exe: &exe,
            scratch: scratch.path(),
            trace: &trace,
            plan: &plan,
            reference: &reference,
            reference7: &reference7,
        };
        let outcome = run.mode(mode, trace_bytes, trace_products, &steps, &label)?;
        let table = table(&outcome.results);
        println!("{}:\n{table}", mode_title(mode));
        let base = args.out.join(format!("{label}-{}", mode.label()));
        // (Not `with_extension`: the label holds the scale's decimal point.)
        write_file(&PathBuf::from(format!("{}.csv", base.display())), &csv(&outcome.results))?;
        write_file(&PathBuf::from(format!("{}-summary.txt", base.display())), &table)?;
        if !outcome.events.is_empty() {
            write_file(&PathBuf::from(format!("{}-events.txt", base.display())), &(outcome.events.join("\n") + "\n"))?;
        }
        outcomes.push(outcome);
    }
    let comparison = comparison(&outcomes);
    println!("{comparison}");
    write_file(&args.out.join(format!("{label}-comparison.txt")), &comparison)?;
    let figure = args.out.join(format!("{label}-latency.png"));
    match latency_figure(&figure, &outcomes) {
        Ok(()) => println!("wrote {}", figure.display()),
        Err(error) => eprintln!("ldm7 lab idd: no figure: {error:#}"),
    }
    println!("wrote {}/{label}-*", args.out.display());
    if args.keep {
        let kept = scratch.keep();
        println!("kept every node's log and state (not the queues nor the filed products) in {}", kept.display());
    }
    let incomplete: Vec<String> = outcomes
        .iter()
        .flat_map(|outcome| {
            outcome
                .results
                .iter()
                .filter(|r| {
                    r.missing > 0 || r.corrupt > 0 || r.filed_bytes.is_some_and(|filed| filed < outcome.feed_bytes)
                })
                .map(move |r| format!("{} ({})", r.name, outcome.mode.label()))
        })
        .collect();
    if !incomplete.is_empty() {
        bail!("incomplete at {}", incomplete.join(", "));
    }
    Ok(())
}

fn mode_title(mode: Mode) -> &'static str {
    match mode {
        Mode::Ldm7 => "LDM-7 (the top multicasts to the relays)",
        Mode::Ldm6 => "all LDM-6 (the relays request from the top)",
    }
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
}

/// What every mode shares.
struct Run<'a> {
    args: &'a IddOptions,
    exe: &'a Path,
    scratch: &'a Path,
    trace: &'a Path,
    plan: &'a Plan,
    reference: &'a Option<Reference>,
    reference7: &'a Option<Reference>,
}

/// The servers of one mode, by name, in the order the results list them.
struct Nodes {
    list: Vec<(&'static str, Node)>,
}

impl Nodes {
    fn get(&mut self, name: &str) -> anyhow::Result<&mut Node> {
        self.list.iter_mut().map(|(_, node)| node).find(|node| node.name() == name).context("no such node")
    }
}

impl Run<'_> {
    fn mode(
        &self,
        mode: Mode,
        trace_bytes: u64,
        trace_products: u64,
        steps: &[(Duration, Action)],
        label: &str,
    ) -> anyhow::Result<ModeOutcome> {
        let Run { args, exe, plan, .. } = *self;
        let root = self.scratch.join(mode.label());
        std::fs::create_dir_all(&root).context("create the mode's directory")?;
        let name = format!("idd{}{}", std::process::id() % 10_000, &mode.label()[3..]);
        let lab = Lab::up(&lab_spec(&name, args, plan, mode))?;
        let spec = lab.spec().clone();
        let uses_vde = spec.feeds.iter().any(|feed| feed.uses_vde());
        // Every node holds the whole run, with room (queues are written out in full).
        let bytes = (trace_bytes as f64 * 1.3) as u64 + 100_000_000;
        let capacity = Capacity { bytes, slots: (trace_products * 2).max(10_000) };
        let path_settings = if uses_vde {
            format!("[path]\ndriver = \"vde\"\nrun_dir = \"{}\"\n", spec.run_dir().join("vde").display())
        } else {
            format!("[path]\ndriver = \"linux-bridge\"\nnetns = \"{name}-core\"\n")
        };
        let feed_address = |feed: &str, host: &str| -> anyhow::Result<String> {
            let address = spec.feed(feed).and_then(|f| f.address_of(host)).context("a feed address")?;
            Ok(address.address.to_string())
        };
        let control = |host: &str| -> anyhow::Result<String> { Ok(lab.control_ip(host)?.to_string()) };
        let top_feed = spec.feed("top").context("the top feed")?.clone();
        let top_address = feed_address("top", "top")?;
        // Each server is named in its statistics by the address its downstreams reach it at,
        // so that the monitor's links join up.
        let (top_conf, top_settings, top_name) = match mode {
            Mode::Ldm7 => (
                format!(
                    "ALLOW ANY ^10\\.\nMULTICAST ANY {}:38800 {top_address}:38801 24 0 dummy dummy\n",
                    top_feed.multicast_group
                ),
                Some(format!("[multicast]\nrate = \"{}\"\npath = \"top\"\n{path_settings}", args.rate)),
                control("top")?,
            ),
            // An LDM-6 top reports by rtstats, as an LDM 6 site does (the replay's inserts are
            // its products; it has no deliveries to make statistics products of).
            Mode::Ldm6 => ("ALLOW ANY ^10\\.\n".to_owned() + &rtstats_entries(&top_address), None, top_address.clone()),
        };
        let mut top_config = ServerConfig::new("top", Some(lab.netns("top")?), capacity, &top_conf)
            .args(["--stats-name", top_name.as_str()]);
        if let Some(settings) = &top_settings {
            top_config = top_config.settings(settings);
        }
        let mut nodes = Nodes { list: vec![("top", Node::Ours(Server::create(exe, &root, top_config)?))] };
        let mut stats_names: Vec<(String, String)> = vec![("top".into(), top_name.clone())];
        for relay in &plan.relays {
            let conf = match mode {
                Mode::Ldm7 => {
                    let port = spec.bridge_port("top", relay).unwrap_or_default();
                    let attachment = if uses_vde { format!("{name}-{relay} top") } else { format!("{relay} {port}") };
                    format!("ALLOW ANY ^10\\.\nRECEIVE ANY {top_name}:388 top {attachment}\n")
                }
                Mode::Ldm6 => format!("ALLOW ANY ^10\\.\nREQUEST ANY \".*\" {top_address}:388\n"),
            };
            let stats_name = feed_address(relay, relay)?;
            let conf = match mode {
                Mode::Ldm7 => conf,
                Mode::Ldm6 => conf + &rtstats_entries(&stats_name),
            };
            let mut config = ServerConfig::new(relay, Some(lab.netns(relay)?), capacity, &conf)
                .args(["--stats-name", stats_name.as_str()]);
            if mode == Mode::Ldm7 {
                config = config.settings(&format!(
                    "[receive]\nrate = \"{}\"\nretry_min = \"200ms\"\nretry_max = \"2s\"\n",
                    args.rate
                ));
            }
            nodes.list.push(("relay", Node::Ours(Server::create(exe, &root, config)?)));
            stats_names.push((relay.clone(), stats_name));
        }
        // A reference server in `name`'s namespace, its queue as large as ours.
        let reference_node = |reference: &Reference, name: &str, port: u16, conf: &str| -> anyhow::Result<Node> {
            let host = Host::in_lab(&lab.netns(name)?, lab.control_address(name)?);
            let queue_size = format!("{}M", bytes / 1_000_000);
            let config = RefConfig {
                name,
                host: &host,
                port,
                ldmd_conf: conf,
                queue_size: &queue_size,
                slots: Some(capacity.slots),
                registry: &Registry::default(),
            };
            Ok(Node::Reference(RefServer::create(reference, &root, config)?))
        };
        if let (Some(reference), Some(ref_plan)) = (self.reference, &plan.reference) {
            let parent = feed_address(&ref_plan.parent, &ref_plan.parent)?;
            let conf = format!("ALLOW ANY ^10\\.\nREQUEST ANY \".*\" {parent}:388\n");
            nodes.list.push(("relay", reference_node(reference, &ref_plan.name, 388, &conf)?));
            stats_names.push((ref_plan.name.clone(), feed_address(&ref_plan.name, &ref_plan.name)?));
        }
        // The reference LDM-7 leaf: subscribed to the top over the top's path (with LDM-7, from
        // an address the harness gives it, high in the feed's subnet, out of the way of the
        // addresses the top hands the relays; the top hands it its own, as the reference's
        // rule says for a subscriber that names no attachment). Its SUBSCRIBE, backlog and
        // repairs go over the path.
        // The reference LDM-7 leaf's own path address (LDM-7 mode).
        let mut reference7_address = None;
        if let (Some(reference), Some(leaf)) = (self.reference7, &plan.reference7) {
            let netns = lab.netns(leaf)?;
            let conf = match mode {
                Mode::Ldm7 => {
                    let top = top_feed.address_of("top").context("the top's address")?;
                    let own = ldm7_net::hostcfg::Ipv4Cidr {
                        // Host 251 of the path's subnet (a /24: the top is host 1).
                        address: std::net::Ipv4Addr::from((u32::from(top.address) & !0xff) | 251),
                        prefix_len: top.prefix_len,
                    };
                    ldm7_net::hostcfg::set_address(Some(&netns), "top", own)?;
                    reference7_address = Some(own.address);
                    format!("ALLOW ANY ^10\\.\nRECEIVE ANY {top_address}:388\n")
                }
                Mode::Ldm6 => format!("ALLOW ANY ^10\\.\nREQUEST ANY \".*\" {top_address}:388\n"),
            };
            // It runs as its build's user and serves no one: an unprivileged port.
            nodes.list.push(("leaf", reference_node(reference, leaf, 38388, &conf)?));
        }
        let full_leaf: Option<&String> = steps.iter().find_map(|(_, action)| match action {
            Action::Fill(leaf) => Some(leaf),
            _ => None,
        });
        let mut disk = None;
        let mut parents: Vec<(String, String)> = Vec::new();
        for (relay, leaves) in plan.relays.iter().zip(&plan.leaves) {
            parents.extend(leaves.iter().map(|leaf| (leaf.clone(), relay.clone())));
        }
        if let Some(ref_plan) = &plan.reference {
            parents.extend(ref_plan.leaves.iter().map(|leaf| (leaf.clone(), ref_plan.name.clone())));
        }
        for (leaf, parent) in &parents {
            let upstream = feed_address(parent, parent)?;
            let conf =
                format!("ALLOW EXP ^10\\.76\\.\nREQUEST ANY \".*\" {upstream}:388\nEXEC \"pqact -f ANY pqact.conf\"\n");
            let stats_name = control(leaf)?;
            let conf = conf + &rtstats_entries(&stats_name);
            let config = ServerConfig::new(leaf, Some(lab.netns(leaf)?), capacity, &conf)
                .args(["--stats-name", stats_name.as_str()]);
            let server = Server::create(exe, &root, config)?;
            std::fs::write(server.dir().join("pqact.conf"), PQACT_CONF).context("write pqact.conf")?;
            if full_leaf == Some(leaf) {
                // Room for the whole run's files and 64 MB more: the fault takes it all.
                disk = Some(Disk::mount(&server.dir().join("data"), (trace_bytes as f64 * 1.2) as u64 + (64 << 20))?);
            }
            nodes.list.push(("leaf", Node::Ours(server)));
            stats_names.push((leaf.clone(), stats_name));
        }
        for (_, node) in nodes.list.iter_mut() {
            node.start().with_context(|| format!("start {}", node.name()))?;
        }
        match mode {
            Mode::Ldm7 => {
                for (tier, node) in &nodes.list {
                    if let (&"relay", Node::Ours(server)) = (tier, node) {
                        server.wait_for_log("FMTP repair connection to", Duration::from_secs(120))?;
                    }
                }
                // A subscriber that sees no product for 5 s after its FMTP connection takes the
                // feed as quiet and asks for the backlog up to the newest product. The replay
                // starts after that decision, so that it is made on a quiet feed (a backlog of
                // none), as when subscribers join a running feed, and not on the replay's first
                // second, whose products it would then fetch twice (by backlog and by FMTP).
                sleep_unless_interrupted(Duration::from_secs(6))?;
            }
            Mode::Ldm6 => sleep_unless_interrupted(Duration::from_secs(5))?,
        }
        let monitor = if args.no_monitor {
            None
        } else {
            match Monitor::start(exe, &lab, &root, &stats_names, plan) {
                Ok(monitor) => Some(monitor),
                Err(error) => {
                    eprintln!("ldm7 lab idd: no monitor: {error:#}");
                    None
                }
            }
        };
        let top_ns = lab.netns("top")?;
        let counters = |ns: &str, dev: &str| -> anyhow::Result<(Egress, u64, u64)> {
            let egress = Egress::read(Some(ns), dev)?;
            let tc = ldm7_net::tc::read_counters(Some(ns), dev)?;
            let class = |c: Option<&ldm7_net::tc::ClassCounters>| c.map_or(0, |c| c.sent_bytes);
            Ok((egress, class(tc.multicast()), class(tc.retransmission())))
        };
        // What the top sends the reference LDM-7 leaf itself (its subscription, repairs and
        // backlog; not the multicast): a counting rule (no target) in the top's OUTPUT chain.
        if let Some(address) = reference7_address {
            Cmd::new("iptables")
                .netns(Some(&top_ns))
                .args(["-A", "OUTPUT", "-o", "top", "-d", &address.to_string()])
                .run()?;
        }
        let top_before = counters(&top_ns, "top")?;
        let ctl_before = Egress::read(Some(&top_ns), ldm7_net::lab::spec::CONTROL_INTERFACE)?;
        let drops = |node: &str| lab.netns(node).ok().and_then(|ns| crate::udp_receive_drops(Some(&ns)).ok());
        let drops_before: Vec<Option<u64>> = nodes.list.iter().map(|(_, node)| drops(node.name())).collect();
        let relay_before: Vec<Egress> =
            plan.relays.iter().map(|r| Ok(Egress::read(Some(&lab.netns(r)?), r)?)).collect::<anyhow::Result<_>>()?;
        println!("ldm7 lab idd: {}: every relay subscribed; replaying {} min of traffic", mode.label(), args.minutes);
        let top_queue = match &nodes.list[0].1 {
            Node::Ours(server) => server.queue_path(),
            Node::Reference(server) => server.queue_path(),
        };
        let replay = Replay::start(exe, &top_queue, &ReplayOptions::new(self.trace, 1.0))?;
        let began = Instant::now();
        let mut events = Vec::new();
        for (at, action) in steps {
            if let Some(wait) = at.checked_sub(began.elapsed()) {
                sleep_unless_interrupted(wait)?;
            }
            let outcome = self.act(action, &mut nodes, &lab, disk.as_ref());
            let line = format!("{:7.1} s  {action}{outcome}", began.elapsed().as_secs_f64());
            println!("ldm7 lab idd: {}: {line}", mode.label());
            events.push(line);
        }
        let replay = replay.wait();
        check_interrupted()?;
        let replay = replay?;
        // The feed's products: not the LDM-6 top's own rtstats reports.
        let published: Vec<ProductRecord> =
            nodes.list[0].1.records()?.into_iter().filter(|r| !r.info.contains(" rtstats-")).collect();
        let feed_bytes: u64 = published.iter().map(|r| r.size).sum();
        println!(
            "ldm7 lab idd: {}: {} products ({:.1} MB) inserted at the top in {:.0} s; waiting for every node",
            mode.label(),
            replay.products,
            feed_bytes as f64 / 1e6,
            replay.seconds
        );
        let mut beats = 0u32;
        let mut heartbeat = || {
            beats += 1;
            let name = format!("idd-heartbeat-{beats}");
            // Its name is its data: each has a signature of its own (the queue drops repeats).
            let inserted =
                std::fs::write(self.scratch.join(&name), &name).map_err(anyhow::Error::from).and_then(|()| {
                    let status = Command::new(exe)
                        .args(["insert", "-f", "EXP", "-q"])
                        .arg(&top_queue)
                        .arg(&name)
                        .current_dir(self.scratch)
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()?;
                    if !status.success() {
                        bail!("ldm7 insert: {status}");
                    }
                    Ok(())
                });
            if let Err(error) = inserted {
                eprintln!("ldm7 lab idd: heartbeat product: {error:#}");
            }
        };
        let heartbeat: Option<&mut dyn FnMut()> = plan.reference7.is_some().then_some(&mut heartbeat);
        wait_complete(&mut nodes, &published, Duration::from_secs(900), heartbeat)?;
        // Each leaf's pqact files what its server holds: every product byte at least (its
        // upstream's statistics products are filed too).
        for (tier, node) in &nodes.list {
            // (The reference LDM-7 leaf runs no pqact.)
            if *tier != "leaf" || matches!(node, Node::Reference(_)) {
                continue;
            }
            let data = node.dir().join("data");
            let filed = crate::wait_for(
                Duration::from_secs(180),
                &format!("{}'s pqact to file every product", node.name()),
                || Ok((bytes_under(&data) >= feed_bytes).then_some(())),
            );
            if let Err(error) = filed {
                eprintln!("ldm7 lab idd: {error}");
            }
        }
        let top_after = counters(&top_ns, "top")?;
        let ctl_after = Egress::read(Some(&top_ns), ldm7_net::lab::spec::CONTROL_INTERFACE)?;
        let top_path = top_after.0.since(top_before.0).htb_bytes;
        let ctl = ctl_after.since(ctl_before).tx_bytes;
        let per_byte = |bytes: u64| bytes as f64 / feed_bytes.max(1) as f64;
        let top_egress = per_byte(top_path + ctl);
        let split = (per_byte(top_after.1 - top_before.1), per_byte(top_after.2 - top_before.2), per_byte(ctl));
        let reference7_egress = match reference7_address {
            Some(address) => Some(per_byte(output_bytes_to(&top_ns, address)?)),
            None => None,
        };
        let mut relay_egress: BTreeMap<String, f64> = BTreeMap::new();
        for (relay, before) in plan.relays.iter().zip(relay_before) {
            let after = Egress::read(Some(&lab.netns(relay)?), relay)?;
            relay_egress.insert(relay.clone(), per_byte(after.since(before).htb_bytes));
        }
        if let Some(monitor) = monitor {
            let shot = self.args.out.join(format!("{label}-{}-dashboard.png", mode.label()));
            match monitor.finish(&shot) {
                Ok(report) => {
                    println!("ldm7 lab idd: {}: {report}", mode.label());
                    events.push(format!("monitor: {report}"));
                }
                Err(error) => eprintln!("ldm7 lab idd: the monitor: {error:#}"),
            }
        }
        let mut results = Vec::new();
        // The top's products only (not the statistics and rtstats products made below it), by
        // signature: their feed.
        let mut feed_of: std::collections::HashMap<_, &str> = std::collections::HashMap::new();
        let mut feeds: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        for record in &published {
            let feed = feed_of_info(&record.info);
            feed_of.insert(record.signature, feed);
            let entry = feeds.entry(feed.to_owned()).or_default();
            entry.0 += 1;
            entry.1 += record.size;
        }
        let mut feed_latencies_ms: BTreeMap<(&'static str, String), Vec<f64>> = BTreeMap::new();
        for ((tier, node), before) in nodes.list.iter().zip(drops_before) {
            let name = node.name().to_owned();
            let records = node.records().unwrap_or_default();
            let egress = match *tier {
                "top" => Some(top_egress),
                _ => relay_egress.get(&name).copied(),
            };
            let (loss, delay) = (plan.loss.get(&name).copied().unwrap_or(0.0), plan.delay_ms.get(&name).copied());
            let mut result = node_result(node, tier, loss, delay.unwrap_or(0), &published, &records, egress);
            if *tier == "top" {
                result.egress_split = Some(split);
            }
            result.udp_drops = before.zip(drops(&name)).map(|(before, after)| after.saturating_sub(before));
            // (The reference's queue has no times.)
            if *tier != "top" && matches!(node, Node::Ours(_)) {
                for record in &records {
                    let Some(feed) = feed_of.get(&record.signature) else { continue };
                    let ms = record.latency_us as f64 / 1e3;
                    feed_latencies_ms.entry((tier, (*feed).to_owned())).or_default().push(ms);
                }
            }
            results.push(result);
        }
        for (_, node) in nodes.list.iter_mut().rev() {
            if let Err(error) = node.stop() {
                eprintln!("ldm7 lab idd: stop {}: {error:#}", node.name());
            }
        }
        drop(nodes);
        drop(disk);
        lab.down()?;
        // The queues (written out in full; an ldm7 queue is a directory) and the leaves' filed
        // products go; the logs and state stay with the scratch directory.
        if let Ok(entries) = std::fs::read_dir(&root) {
            for entry in entries.flatten() {
                for big in ["q.pq", "data"] {
                    let path = entry.path().join(big);
                    let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
                }
            }
        }
        Ok(ModeOutcome { mode, results, events, feed_bytes, feed_latencies_ms, feeds, reference7_egress })
    }

    /// Does one step of the faults; what came of it, for the event line.
    fn act(&self, action: &Action, nodes: &mut Nodes, lab: &Lab, disk: Option<&Disk>) -> String {
        let result: anyhow::Result<String> = (|| match action {
            Action::Kill(name) => {
                nodes.get(name)?.kill();
                Ok(String::new())
            }
            Action::Start(name) => {
                nodes.get(name)?.start()?;
                Ok(String::new())
            }
            Action::StartTop => {
                nodes.get("top")?.start()?;
                Ok(String::new())
            }
            Action::StopTop => {
                nodes.get("top")?.stop()?;
                Ok(String::new())
            }
            Action::LossOn(relay) | Action::LossOff(relay) => {
                let verb = if matches!(action, Action::LossOn(_)) { "-I" } else { "-D" };
                let probability = format!("{:.6}", LOSS_RAISED / 100.0);
                let mut rule = vec![verb, "INPUT"];
                if verb == "-I" {
                    rule.push("1");
                }
                rule.extend(["-i", "top", "-m", "statistic", "--mode", "random", "--probability", &probability]);
                rule.extend(["-j", "DROP"]);
                Cmd::new("iptables").netns(Some(&lab.netns(relay)?)).args(rule).run()?;
                Ok(String::new())
            }
            Action::Fill(_) => {
                let disk = disk.context("no disk to fill")?;
                let taken = disk.fill()?;
                Ok(format!(" ({:.0} MB taken)", taken as f64 / 1e6))
            }
            Action::Free(leaf) => {
                let disk = disk.context("no disk to free")?;
                let held = nodes.get(leaf)?.log().contains("holding this product until there is room");
                disk.free();
                Ok(if held {
                    " (its pqact had held a product for want of room)".to_owned()
                } else {
                    " (its pqact had not met the full disk)".to_owned()
                })
            }
        })();
        match result {
            Ok(text) => text,
            Err(error) => format!(" FAILED: {error:#}"),
        }
    }
}

/// `ldm7 monitor` on the top's host, requesting every ldm7 node's statistics.
struct Monitor {
    child: Child,
    listen: String,
    netns: String,
    expected: Vec<String>,
}

impl Monitor {
    fn start(
        exe: &Path,
        lab: &Lab,
        root: &Path,
        stats_names: &[(String, String)],
        plan: &Plan,
    ) -> anyhow::Result<Monitor> {
        let dir = root.join("monitor");
        std::fs::create_dir_all(&dir).context("create the monitor's directory")?;
        let netns = lab.netns("top")?;
        let listen = format!("{}:8388", lab.control_ip("top")?);
        let mut places = String::new();
        let relay_city = |relay: &str| -> (f64, f64) {
            let k = plan.relays.iter().position(|r| r == relay).unwrap_or(0);
            CITIES[k % CITIES.len()]
        };
        let mut leaf_index: BTreeMap<String, usize> = BTreeMap::new();
        // rtstats links run from the products' origin (the replay's host name) to each host.
        let origin = [("origin".to_owned(), crate::replay::origin())];
        for (host, name) in stats_names.iter().chain(&origin) {
            let (lat, lon) = if host == "top" {
                (40.015, -105.27)
            } else if host == "origin" {
                (38.8, -104.0)
            } else if host.starts_with('r') {
                relay_city(host)
            } else if let Some(r) = plan.reference.as_ref().filter(|r| &r.name == host) {
                let (lat, lon) = relay_city(&r.parent);
                (lat - 1.5, lon + 1.5)
            } else {
                let parent = plan
                    .relays
                    .iter()
                    .zip(&plan.leaves)
                    .find(|(_, leaves)| leaves.contains(host))
                    .map(|(relay, _)| relay.clone())
                    .or_else(|| plan.reference.as_ref().map(|r| r.parent.clone()))
                    .unwrap_or_default();
                let k = leaf_index.entry(parent.clone()).or_default();
                *k += 1;
                let (lat, lon) = relay_city(&parent);
                let angle = *k as f64 * 2.1;
                (lat + 1.2 * angle.sin(), lon + 1.6 * angle.cos())
            };
            let _ = writeln!(places, "[[node]]\nname = \"{name}\"\nlatitude = {lat:.3}\nlongitude = {lon:.3}\n");
        }
        std::fs::write(dir.join("nodes.toml"), places).context("write nodes.toml")?;
        let reference = plan.reference.as_ref().map(|r| r.name.as_str());
        let ours: Vec<&(String, String)> =
            stats_names.iter().filter(|(host, _)| Some(host.as_str()) != reference).collect();
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &netns]).arg(exe).args(["monitor", "--db"]);
        command.arg(format!("sqlite:{}", dir.join("monitor.db").display()));
        command.args(["--listen", &listen, "--state-dir"]).arg(&dir).arg("--nodes").arg(dir.join("nodes.toml"));
        for (host, _) in &ours {
            command.args(["--upstream", &format!("{}:388", lab.control_ip(host)?)]);
        }
        let log = std::fs::File::create(dir.join("log")).context("the monitor's log")?;
        let child =
            command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().context("start ldm7 monitor")?;
        let expected = ours.iter().map(|(_, name)| name.clone()).collect();
        Ok(Monitor { child, listen, netns, expected })
    }

    /// Waits (up to two minutes) until the dashboard knows every node, takes its screenshot
    /// and stops the monitor; says how many nodes and links it showed.
    fn finish(mut self, shot: &Path) -> anyhow::Result<String> {
        // The nodes that have reported (a placed node that never did is grey).
        let names = |body: &str| -> Vec<String> {
            serde_json::from_str::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter(|node| node["color"].as_str().is_some_and(|color| color != "grey"))
                .filter_map(|node| node["name"].as_str().map(str::to_owned))
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut shown = Vec::new();
        while Instant::now() < deadline {
            shown = names(&self.get("/api/nodes").unwrap_or_default());
            if self.expected.iter().all(|name| shown.contains(name)) || interrupted() {
                break;
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        let links = serde_json::from_str::<serde_json::Value>(&self.get("/api/links").unwrap_or_default())
            .ok()
            .and_then(|v| v.as_array().map(Vec::len))
            .unwrap_or(0);
        let missing: Vec<&String> = self.expected.iter().filter(|name| !shown.contains(name)).collect();
        let screenshot = self.screenshot(shot);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let mut report = format!("the monitor showed {} reporting nodes and {links} links", shown.len());
        if !missing.is_empty() {
            let _ = write!(report, "; not reporting: {missing:?}");
        }
        match screenshot {
            Ok(()) => {
                let _ = write!(report, "; dashboard screenshot {}", shot.display());
            }
            Err(error) => {
                let _ = write!(report, "; no screenshot: {error:#}");
            }
        }
        Ok(report)
    }

    fn get(&self, path: &str) -> anyhow::Result<String> {
        let listen = self.listen.clone();
        let path = path.to_owned();
        let response = ldm7_net::netns::in_netns(&self.netns, move || {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(&listen)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
            let mut response = String::new();
            stream.read_to_string(&mut response)?;
            Ok::<_, std::io::Error>(response)
        })??;
        Ok(response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default())
    }

    /// The dashboard in headless Chromium, as an operator's browser shows it.
    fn screenshot(&self, shot: &Path) -> anyhow::Result<()> {
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        if !Path::new(&chromium).is_file() {
            bail!("no Chromium at {chromium} (set CHROMIUM)");
        }
        let output = Command::new("ip")
            .args(["netns", "exec", &self.netns, &chromium])
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1600,1100"])
            .args(["--virtual-time-budget=15000", &format!("--screenshot={}", shot.display())])
            .arg(format!("http://{}/", self.listen))
            .stdin(Stdio::null())
            .output()
            .context("run chromium")?;
        if !shot.is_file() {
            bail!("chromium wrote no screenshot: {}", crate::tail(&String::from_utf8_lossy(&output.stderr), 5));
        }
        Ok(())
    }
}

/// Waits until every node holds every product the top published, or a node's holdings stay
/// the same for [`STALLED`] (it is not catching up: reported as incomplete), or `within` passes.
/// Waits until every node holds every product of `published`; `heartbeat`, when given, is
/// called every [`HEARTBEAT_EVERY`] meanwhile.
fn wait_complete(
    nodes: &mut Nodes,
    published: &[ProductRecord],
    within: Duration,
    mut heartbeat: Option<&mut dyn FnMut()>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    let mut beat = Instant::now();
    // Per node still waited for: what it held last and since when.
    let mut waiting: BTreeMap<usize, (usize, Instant)> =
        (1..nodes.list.len()).map(|k| (k, (usize::MAX, Instant::now()))).collect();
    while !waiting.is_empty() {
        let mut stalled = Vec::new();
        waiting.retain(|&k, (held, since)| {
            let node = &nodes.list[k].1;
            let Ok(records) = node.records() else { return true };
            let comparison = Comparison::of(published, &records);
            if comparison.missing.is_empty() && comparison.corrupt.is_empty() {
                return false;
            }
            if records.len() != *held {
                (*held, *since) = (records.len(), Instant::now());
            } else if since.elapsed() >= STALLED {
                stalled.push(format!("{} ({} missing)", node.name(), comparison.missing.len()));
                return false;
            }
            true
        });
        if !stalled.is_empty() {
            eprintln!("ldm7 lab idd: no progress for {} s at {}", STALLED.as_secs(), stalled.join(", "));
        }
        if waiting.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let names: Vec<&str> = waiting.keys().map(|&k| nodes.list[k].1.name()).collect();
            eprintln!("ldm7 lab idd: still incomplete after {} s: {}", within.as_secs(), names.join(", "));
            break;
        }
        if let Some(heartbeat) = heartbeat.as_mut()
            && beat.elapsed() >= HEARTBEAT_EVERY
        {
            heartbeat();
            beat = Instant::now();
        }
        sleep_unless_interrupted(Duration::from_secs(3))?;
    }
    Ok(())
}

/// How often a one-byte product goes into the top's queue after the replay while some node is
/// incomplete, when the network has the reference LDM-7 leaf: that subscriber asks for its
/// backlog only when a product arrives by multicast after it subscribed, so after an outage
/// near the end of the replay it would wait forever on a feed gone quiet (the IDD never is).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);

/// How long a node incomplete after the replay may hold the same products before it is given up.
const STALLED: Duration = Duration::from_secs(180);

/// The two modes side by side, with the bars.
fn comparison(outcomes: &[ModeOutcome]) -> String {
    let mut out = String::from(
        "mode  nodes complete  top egress/byte  relay egress/byte (median)  leaf p50 ms  leaf p99 ms  (all leaf deliveries)\n",
    );
    let leaf_p99 = |outcome: &ModeOutcome, q: f64| quantile_ms(&outcome.leaf_latencies_ms(), q);
    for outcome in outcomes {
        let complete = outcome.results.iter().filter(|r| r.missing == 0 && r.corrupt == 0).count();
        let top = outcome.results.iter().find(|r| r.tier == "top").and_then(|r| r.egress_per_byte).unwrap_or(f64::NAN);
        let relays: Vec<f64> =
            outcome.results.iter().filter(|r| r.tier == "relay").filter_map(|r| r.egress_per_byte).collect();
        let _ = writeln!(
            out,
            "{:<5} {:>6} of {:<5} {:>15.3}  {:>26.3}  {:>11.0}  {:>11.0}",
            outcome.mode.label(),
            complete,
            outcome.results.len(),
            top,
            crate::median(relays),
            leaf_p99(outcome, 0.5),
            leaf_p99(outcome, 0.99)
        );
    }
    if let Some(ldm7) = outcomes.iter().find(|o| o.mode == Mode::Ldm7) {
        let top = ldm7.results.iter().find(|r| r.tier == "top").and_then(|r| r.egress_per_byte).unwrap_or(f64::NAN);
        let _ = writeln!(out, "bar: LDM-7 top egress {top:.3} ≤ 1.15: {}", if top <= 1.15 { "met" } else { "NOT met" });
        if let Some(reference) = ldm7.reference7_egress {
            let _ = writeln!(
                out,
                "  of which {reference:.3} went to the reference LDM-7 leaf by unicast (its repairs and backlog; IP \
                 bytes): {:.3} without it",
                top - reference
            );
        }
        if let Some(ldm6) = outcomes.iter().find(|o| o.mode == Mode::Ldm6) {
            let (a, b) = (leaf_p99(ldm7, 0.99), leaf_p99(ldm6, 0.99));
            let _ = writeln!(
                out,
                "bar: leaf p99 with LDM-7 {a:.0} ms ≤ the LDM-6 tree's {b:.0} ms: {}",
                if a <= b { "met" } else { "NOT met" }
            );
        }
    }
    for outcome in outcomes {
        let complete = outcome
            .results
            .iter()
            .all(|r| r.missing == 0 && r.corrupt == 0 && r.filed_bytes.is_none_or(|filed| filed >= outcome.feed_bytes));
        let _ = writeln!(
            out,
            "bar: completeness at every node with {}: {}",
            outcome.mode.label(),
            if complete { "met" } else { "NOT met" }
        );
    }
    let _ = writeln!(
        out,
        "\nper feed and tier: latency p50/p99 ms (creation at the top → insertion), every delivery at the tier's ldm7 nodes"
    );
    let mut header = format!("{:<10} {:>8} {:>8}  {:<6}", "feed", "products", "MB", "tier");
    for outcome in outcomes {
        let label = outcome.mode.label();
        let _ = write!(header, "  {:>9} {:>9}", format!("{label} p50"), format!("{label} p99"));
    }
    out.push_str(header.trim_end());
    out.push('\n');
    if let Some(first) = outcomes.first() {
        for (feed, (products, bytes)) in &first.feeds {
            for tier in ["relay", "leaf"] {
                let mut line = format!("{feed:<10} {products:>8} {:>8.1}  {tier:<6}", *bytes as f64 / 1e6);
                for outcome in outcomes {
                    let ms = outcome.feed_latencies_ms.get(&(tier, feed.clone()));
                    let quantile = |q: f64| ms.map_or(f64::NAN, |ms| quantile_ms(ms, q));
                    let _ = write!(line, "  {:>9.0} {:>9.0}", quantile(0.5), quantile(0.99));
                }
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    out
}

/// The latency of every leaf delivery, both modes: the fraction delivered within x.
fn latency_figure(path: &Path, outcomes: &[ModeOutcome]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    crate::figure::register_font()?;
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let leaf_latencies: Vec<Vec<f64>> = outcomes.iter().map(ModeOutcome::leaf_latencies_ms).collect();
    let max_ms = leaf_latencies.iter().flatten().copied().fold(10.0_f64, f64::max).max(10.0);
    let mut chart = ChartBuilder::on(&root)
        .caption("ldm7 lab idd: latency of every leaf delivery (creation at the top → insertion)", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((1.0_f64..max_ms * 1.2).log_scale(), 0.0_f64..1.0)?;
    chart.configure_mesh().x_desc("latency, ms (log)").y_desc("fraction of deliveries").draw()?;
    for ((outcome, mut values), color) in outcomes.iter().zip(leaf_latencies).zip([BLUE, RED]) {
        values.retain(|v| v.is_finite());
        values.sort_by(f64::total_cmp);
        let n = values.len().max(1) as f64;
        let points: Vec<(f64, f64)> =
            values.iter().enumerate().map(|(k, &ms)| (ms.max(1.0), (k + 1) as f64 / n)).collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(mode_title(outcome.mode))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The `q` quantile of latencies in milliseconds (NaN when there are none).
fn quantile_ms(ms: &[f64], q: f64) -> f64 {
    ldm7_types::quantile::quantile_of(ms.iter().map(|ms| (ms * 1000.0) as i64), q)
        .map_or(f64::NAN, |us| us as f64 / 1e3)
}

/// The feedtype of a product's printed metadata (`SIZE ARRIVAL FEEDTYPE SEQNO  IDENT`).
fn feed_of_info(info: &str) -> &str {
    info.split_whitespace().nth(2).unwrap_or("?")
}

/// Products and bytes of a trace file (`SIZE TIME [FEED]` lines).
fn trace_totals(trace: &Path) -> anyhow::Result<(u64, u64)> {
    let text = std::fs::read_to_string(trace).with_context(|| format!("read {}", trace.display()))?;
    let sizes = text.lines().filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok());
    Ok(sizes.fold((0, 0), |(n, bytes), size| (n + 1, bytes + size)))
}

fn node_result(
    node: &Node,
    tier: &'static str,
    loss_percent: f64,
    delay_ms: u64,
    published: &[ProductRecord],
    records: &[ProductRecord],
    egress_per_byte: Option<f64>,
) -> NodeResult {
    let comparison = Comparison::of(published, records);
    let count = |mode| records.iter().filter(|r| r.mode == Some(mode)).count();
    // Latency of the top's products only (not the statistics and rtstats products made below it).
    let ours: std::collections::HashSet<_> = published.iter().map(|r| r.signature).collect();
    let all: Vec<&ProductRecord> = records.iter().filter(|r| ours.contains(&r.signature)).collect();
    // The reference's queue says nothing of times.
    let timed = matches!(node, Node::Ours(_));
    let quantile_ms =
        |q| if timed { latency_quantile_us(&all, q).map_or(f64::NAN, |us| us as f64 / 1e3) } else { f64::NAN };
    NodeResult {
        name: node.name().to_owned(),
        tier,
        software: node.software(),
        loss_percent,
        delay_ms: delay_ms as f64,
        products: records.len(),
        missing: comparison.missing.len(),
        corrupt: comparison.corrupt.len(),
        received: count(DeliveryMode::Received),
        inserted: count(DeliveryMode::Inserted),
        backlog: count(DeliveryMode::Backlog),
        retx_blocks: records.iter().filter_map(|r| r.retransmitted_blocks).map(u64::from).sum(),
        udp_drops: None,
        p50_ms: quantile_ms(0.5),
        p99_ms: quantile_ms(0.99),
        cpu_s: node.pid().and_then(crate::measure::cpu_seconds).unwrap_or(f64::NAN),
        peak_mib: node
            .pid()
            .and_then(|pid| ldm7_io::peak_resident_bytes(Some(pid)))
            .map_or(f64::NAN, |bytes| bytes as f64 / 1_048_576.0),
        egress_per_byte,
        egress_split: None,
        filed_bytes: (tier == "leaf" && timed).then(|| bytes_under(&node.dir().join("data"))),
    }
}

/// Bytes (IP) the OUTPUT chain of namespace `netns` counted to `address` (its counting rule).
fn output_bytes_to(netns: &str, address: std::net::Ipv4Addr) -> anyhow::Result<u64> {
    let text = Cmd::new("iptables").netns(Some(netns)).args(["-L", "OUTPUT", "-v", "-x", "-n"]).run()?;
    let target = address.to_string();
    text.lines()
        .find(|line| line.split_whitespace().any(|word| word == target))
        .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
        .with_context(|| format!("no OUTPUT counting rule for {address} in {netns}:\n{text}"))
}

/// Bytes of the files below `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => bytes_under(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The columns of the table and the CSV: name, width in the table.
const COLUMNS: [(&str, usize); 22] = [
    ("node", 7),
    ("tier", 6),
    ("software", 11),
    ("loss_percent", 12),
    ("delay_ms", 8),
    ("products", 8),
    ("missing", 7),
    ("corrupt", 7),
    ("fmtp", 6),
    ("backstop", 8),
    ("backlog", 7),
    ("retx_blocks", 11),
    ("udp_drops", 9),
    ("p50_ms", 7),
    ("p99_ms", 7),
    ("cpu_s", 6),
    ("peak_mib", 8),
    ("egress_per_byte", 15),
    ("egress_mcast", 12),
    ("egress_retx", 11),
    ("egress_ctl", 10),
    ("filed_mb", 8),
];

impl NodeResult {
    /// The row's values, in [`COLUMNS`]' order (`-`: not measured for this node).
    fn values(&self) -> [String; 22] {
        let optional = |value: Option<String>| value.unwrap_or_else(|| "-".to_owned());
        [
            self.name.clone(),
            self.tier.to_owned(),
            self.software.to_owned(),
            format!("{:.1}", self.loss_percent),
            format!("{:.0}", self.delay_ms),
            self.products.to_string(),
            self.missing.to_string(),
            self.corrupt.to_string(),
            self.received.to_string(),
            self.inserted.to_string(),
            self.backlog.to_string(),
            self.retx_blocks.to_string(),
            optional(self.udp_drops.map(|d| d.to_string())),
            format!("{:.0}", self.p50_ms),
            format!("{:.0}", self.p99_ms),
            format!("{:.1}", self.cpu_s),
            format!("{:.0}", self.peak_mib),
            optional(self.egress_per_byte.map(|e| format!("{e:.3}"))),
            optional(self.egress_split.map(|(mcast, _, _)| format!("{mcast:.3}"))),
            optional(self.egress_split.map(|(_, retx, _)| format!("{retx:.3}"))),
            optional(self.egress_split.map(|(_, _, ctl)| format!("{ctl:.3}"))),
            optional(self.filed_bytes.map(|b| format!("{:.1}", b as f64 / 1e6))),
        ]
    }
}

fn table(results: &[NodeResult]) -> String {
    let line = |values: [String; 22]| -> String {
        let cells: Vec<String> = values
            .iter()
            .zip(COLUMNS)
            .enumerate()
            .map(|(k, (value, (_, width)))| if k < 3 { format!("{value:<width$}") } else { format!("{value:>width$}") })
            .collect();
        cells.join(" ") + "\n"
    };
    let mut out = line(COLUMNS.map(|(name, _)| name.to_owned()));
    for r in results {
        out.push_str(&line(r.values()));
    }
    for (tier, plural) in [("relay", "relays"), ("leaf", "leaves")] {
        let of: Vec<&NodeResult> = results.iter().filter(|r| r.tier == tier).collect();
        if of.is_empty() {
            continue;
        }
        // Medians over the nodes with times (the reference's have none).
        let mut p50: Vec<f64> = of.iter().map(|r| r.p50_ms).collect();
        let mut p99: Vec<f64> = of.iter().map(|r| r.p99_ms).collect();
        let complete = of.iter().filter(|r| r.missing == 0 && r.corrupt == 0).count();
        let _ = writeln!(
            out,
            "{plural}: {complete} of {} complete; latency p50 {:.0} ms and p99 {:.0} ms (medians over the {plural})",
            of.len(),
            crate::median(std::mem::take(&mut p50)),
            crate::median(std::mem::take(&mut p99))
        );
    }
    out
}

fn csv(results: &[NodeResult]) -> String {
    let mut out = COLUMNS.map(|(name, _)| name).join(",") + "\n";
    for r in results {
        out.push_str(&(r.values().map(|value| if value == "-" { String::new() } else { value }).join(",") + "\n"));
    }
    out
}
