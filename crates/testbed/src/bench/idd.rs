//! `ldm7 lab idd` (root): a miniature IDD on this machine — a tiered network of real servers in
//! namespaces, fed a generated IDD workload — and what it delivered where (issue #41, first
//! step: the network, the workload and the results; faults, the all-LDM-6 baseline and the
//! reference nodes come next).
//!
//! The network (an `ldm7 lab`):
//!
//! - `top`, the publisher: every feed (`ANY`) multicast by LDM-7 over one rate-guaranteed path
//!   (the lab feed `top`, HTB at `--rate`) to the relays;
//! - relays `r1` … `rN`: each subscribes by LDM-7 (`RECEIVE`) and serves its leaves by LDM-6 over
//!   a path of its own (the lab feed `rK`, HTB at `--relay-rate`);
//! - leaves `lKJ`: each requests everything from its relay (`REQUEST ANY ".*"`) and files it with
//!   `ldm7 act` (an EXEC'd pqact with a pqact.conf of FILE entries per feed, as a site has).
//!
//! Every leg's one-way delay (0–`--delay-max`, per relay leg and per leaf leg) and every relay's
//! and leaf's receive loss (0–`--loss-max`) are drawn from `--seed`; any delay makes the paths
//! VDE. The workload is `ldm7 trace generate` (the 2018 IDD set of eight feeds) for `--minutes`
//! of traffic at `--scale` of the IDD's rates, replayed in real time into the top's queue. Then
//! every node must hold every product (checked by signature, and by MD5 of each product's data);
//! the results per tier: completeness, latency p50/p99 (insertion at the node − creation at the
//! top, one clock), products by FMTP / backstop / backlog at the relays, the top's and each
//! relay's egress per product byte (their paths' HTB counters), CPU seconds and peak memory per
//! node. A table goes to standard output and a CSV per node to `--out`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use ldm7_pq::Capacity;
use ldm7_types::Rate;

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
    /// Where the CSV files go.
    pub out: PathBuf,
    /// Directory for the nodes' queues and logs (`None`: the system temporary directory).
    pub dir: Option<PathBuf>,
}

/// One node's results.
#[derive(Clone, Debug)]
struct NodeResult {
    name: String,
    tier: &'static str,
    loss_percent: f64,
    delay_ms: f64,
    products: usize,
    missing: usize,
    corrupt: usize,
    received: usize,
    inserted: usize,
    backlog: usize,
    p50_ms: f64,
    p99_ms: f64,
    cpu_s: f64,
    peak_mib: f64,
    /// Egress per product byte of its own path (top and relays).
    egress_per_byte: Option<f64>,
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
}

/// The network's hosts and the draws for them.
struct Plan {
    relays: Vec<String>,
    /// Per relay, its leaves.
    leaves: Vec<Vec<String>>,
    loss: std::collections::BTreeMap<String, f64>,
    /// One-way delay of each host's leg on the path it receives by, milliseconds.
    delay_ms: std::collections::BTreeMap<String, u64>,
}

fn plan(args: &IddOptions) -> Plan {
    let mut draws = Draws(args.seed);
    let relays: Vec<String> = (1..=args.relays).map(|k| format!("r{k}")).collect();
    let leaves: Vec<Vec<String>> =
        (1..=args.relays).map(|k| (1..=args.leaves).map(|j| format!("l{k}x{j}")).collect()).collect();
    let delay_max_ms = args.delay_max.as_millis() as f64;
    let mut loss = std::collections::BTreeMap::new();
    let mut delay_ms = std::collections::BTreeMap::new();
    for host in relays.iter().chain(leaves.iter().flatten()) {
        // Losses in steps of 0.1%, delays in whole milliseconds.
        loss.insert(host.clone(), (draws.next_unit() * args.loss_max * 10.0).round() / 10.0);
        delay_ms.insert(host.clone(), (draws.next_unit() * delay_max_ms).round() as u64);
    }
    Plan { relays, leaves, loss, delay_ms }
}

fn lab_spec(name: &str, args: &IddOptions, plan: &Plan) -> String {
    let mut spec = format!("name = \"{name}\"\n[[hosts]]\nname = \"top\"\n");
    for host in plan.relays.iter().chain(plan.leaves.iter().flatten()) {
        let _ = write!(spec, "[[hosts]]\nname = \"{host}\"\nloss_percent = {:?}\n", plan.loss[host]);
    }
    let delays = |hosts: &[String]| -> String {
        let legs: Vec<String> = hosts.iter().map(|h| format!("{h} = \"{}ms\"", plan.delay_ms[h])).collect();
        format!("{{ {} }}", legs.join(", "))
    };
    let quoted = |hosts: &[String]| hosts.iter().map(|h| format!("\"{h}\"")).collect::<Vec<_>>().join(", ");
    let _ = write!(
        spec,
        "[[feeds]]\nname = \"top\"\npublisher = \"top\"\nsubscribers = [{}]\nrate = \"{}\"\nbuffer = \"600 MB\"\n\
         multicast_port = 38800\nretx_port = 38801\nsubscriber_addresses = false\ndelay = {}\n",
        quoted(&plan.relays),
        args.rate,
        delays(&plan.relays)
    );
    for (relay, leaves) in plan.relays.iter().zip(&plan.leaves) {
        let _ = write!(
            spec,
            "[[feeds]]\nname = \"{relay}\"\npublisher = \"{relay}\"\nsubscribers = [{}]\nrate = \"{}\"\n\
             buffer = \"600 MB\"\ndelay = {}\n",
            quoted(leaves),
            args.relay_rate,
            delays(leaves)
        );
    }
    spec
}

/// A site's pqact.conf: every product filed by its feed and its identifier's first field, per
/// hour, as decoders' FILE entries do.
const PQACT_CONF: &str = "# ldm7 lab idd: every product filed per feed, first field and hour\n\
ANY\t^([^ /]*)\tFILE\t-close\tdata/(\\1)/%H\n";

/// Runs the network and prints and writes the results.
pub fn run(args: &IddOptions) -> anyhow::Result<()> {
    ldm7_net::lab::require_root()?;
    if args.relays == 0 || args.relays > 12 || args.leaves == 0 || args.leaves > 4 {
        bail!("--relays must be 1 to 12 and --leaves 1 to 4 (the lab holds 64 hosts and 16 paths)");
    }
    if !(0.0..50.0).contains(&args.loss_max) {
        bail!("--loss-max is a percentage below 50");
    }
    let exe = std::env::current_exe().context("find the ldm7 executable")?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    let scratch = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    let trace = scratch.path().join("idd.trace");
    let generated = std::process::Command::new(&exe)
        .args(["trace", "generate", "--duration", &format!("{}min", args.minutes)])
        .args(["--scale", &args.scale.to_string(), "--seed", &args.seed.to_string(), "-o"])
        .arg(&trace)
        .output()
        .context("run ldm7 trace generate")?;
    if !generated.status.success() {
        bail!("ldm7 trace generate: {}", String::from_utf8_lossy(&generated.stderr));
    }
    let (trace_products, trace_bytes) = trace_totals(&trace)?;
    let plan = plan(args);
    let servers = 1 + args.relays * (1 + args.leaves);
    println!(
        "ldm7 lab idd: {servers} servers (1 top, {} relays by LDM-7, {} leaves by LDM-6); the IDD's 8 feeds at scale \
         {} for {} min: {trace_products} products, {:.1} MB ({:.1} Mbit/s on average); seed {}",
        args.relays,
        args.relays * args.leaves,
        args.scale,
        args.minutes,
        trace_bytes as f64 / 1e6,
        trace_bytes as f64 * 8.0 / (f64::from(args.minutes) * 60.0) / 1e6,
        args.seed
    );
    let name = format!("idd{}", std::process::id() % 100_000);
    let lab = Lab::up(&lab_spec(&name, args, &plan))?;
    let uses_vde = lab.spec().feeds.iter().any(|feed| feed.uses_vde());
    // Every node holds the whole run, with room (queues are written out in full).
    let bytes = (trace_bytes as f64 * 1.3) as u64 + 100_000_000;
    let capacity = Capacity { bytes, slots: (trace_products * 2).max(10_000) };
    let path_settings = if uses_vde {
        format!("[path]\ndriver = \"vde\"\nrun_dir = \"{}\"\n", lab.spec().run_dir().join("vde").display())
    } else {
        format!("[path]\ndriver = \"linux-bridge\"\nnetns = \"{name}-core\"\n")
    };
    let top_feed = lab.spec().feed("top").context("the top feed")?.clone();
    let top_address = top_feed.address_of("top").context("the top's feed address")?.address;
    let top_conf = format!(
        "ALLOW ANY ^10\\.76\\.0\\.[0-9]+$\nMULTICAST ANY {}:38800 {top_address}:38801 24 0 dummy dummy\n",
        top_feed.multicast_group
    );
    let top_settings = format!("[multicast]\nrate = \"{}\"\npath = \"top\"\n{path_settings}", args.rate);
    let mut top = Server::create(
        &exe,
        scratch.path(),
        ServerConfig::new("top", Some(lab.netns("top")?), capacity, &top_conf).settings(&top_settings),
    )?;
    top.start()?;
    let mut relays = Vec::new();
    for relay in &plan.relays {
        let port = lab.spec().bridge_port("top", relay).unwrap_or_default();
        let attachment = if uses_vde { format!("{name}-{relay} top") } else { format!("{relay} {port}") };
        let conf = format!("ALLOW ANY ^10\\.77\\.[0-9]+\\.[0-9]+$\nRECEIVE ANY 10.76.0.1:388 top {attachment}\n");
        let settings = format!("[receive]\nrate = \"{}\"\nretry_min = \"200ms\"\nretry_max = \"2s\"\n", args.rate);
        let config = ServerConfig::new(relay, Some(lab.netns(relay)?), capacity, &conf).settings(&settings);
        let mut server = Server::create(&exe, scratch.path(), config)?;
        server.start()?;
        relays.push(server);
    }
    let mut leaves = Vec::new();
    for (relay, hosts) in plan.relays.iter().zip(&plan.leaves) {
        let relay_address = lab.spec().feed(relay).and_then(|feed| feed.address_of(relay)).context("relay address")?;
        for host in hosts {
            let conf = format!("REQUEST ANY \".*\" {}:388\nEXEC \"pqact -f ANY pqact.conf\"\n", relay_address.address);
            let config = ServerConfig::new(host, Some(lab.netns(host)?), capacity, &conf);
            let server = Server::create(&exe, scratch.path(), config)?;
            std::fs::write(server.dir().join("pqact.conf"), PQACT_CONF).context("write pqact.conf")?;
            leaves.push(server);
        }
    }
    for server in &mut leaves {
        server.start()?;
    }
    for server in &relays {
        server.wait_for_log("FMTP repair connection to", Duration::from_secs(120))?;
    }
    let egress_of =
        |host: &str, feed: &str| -> anyhow::Result<Egress> { Ok(Egress::read(Some(&lab.netns(host)?), feed)?) };
    let top_before = egress_of("top", "top")?;
    let relay_before: Vec<Egress> = plan.relays.iter().map(|r| egress_of(r, r)).collect::<anyhow::Result<_>>()?;
    println!("ldm7 lab idd: every relay subscribed; replaying {} min of traffic", args.minutes);
    let replay = Replay::start(&exe, &top.queue_path(), &ReplayOptions::new(&trace, 1.0))?.wait()?;
    let published = top.records()?;
    let feed_bytes: u64 = published.iter().map(|r| r.size).sum();
    println!(
        "ldm7 lab idd: {} products ({:.1} MB) inserted at the top in {:.0} s; waiting for every node",
        replay.products,
        feed_bytes as f64 / 1e6,
        replay.seconds
    );
    let deadline = Duration::from_secs(600);
    for server in relays.iter_mut().chain(leaves.iter_mut()) {
        wait_complete(server, &published, deadline)?;
    }
    // Each leaf's pqact files what its server holds: every product byte at least (its
    // upstream's statistics products are filed too).
    for server in &leaves {
        let data = server.dir().join("data");
        let filed = crate::wait_for(
            Duration::from_secs(120),
            &format!("{}'s pqact to file every product", server.name()),
            || Ok((bytes_under(&data) >= feed_bytes).then_some(())),
        );
        if let Err(error) = filed {
            eprintln!("ldm7 lab idd: {error}");
        }
    }
    let top_egress = egress_of("top", "top")?.since(top_before);
    let relay_egress: Vec<Egress> = plan
        .relays
        .iter()
        .zip(relay_before)
        .map(|(r, before)| Ok(egress_of(r, r)?.since(before)))
        .collect::<anyhow::Result<_>>()?;
    let mut results = vec![node_result(&top, "top", 0.0, 0, &published, &published, Some(top_egress), feed_bytes)];
    for ((server, egress), host) in relays.iter().zip(relay_egress).zip(&plan.relays) {
        let records = server.records()?;
        let delay = plan.delay_ms[host];
        results.push(node_result(
            server,
            "relay",
            plan.loss[host],
            delay,
            &published,
            &records,
            Some(egress),
            feed_bytes,
        ));
    }
    for (server, host) in leaves.iter().zip(plan.leaves.iter().flatten()) {
        let records = server.records()?;
        let delay = plan.delay_ms[host];
        results.push(node_result(server, "leaf", plan.loss[host], delay, &published, &records, None, feed_bytes));
    }
    for server in leaves.iter_mut().chain(relays.iter_mut()).chain([&mut top]) {
        server.stop()?;
    }
    let table = table(&results);
    println!("{table}");
    let label = format!("idd-r{}-l{}-{}min-x{}-seed{}", args.relays, args.leaves, args.minutes, args.scale, args.seed);
    let csv_path = args.out.join(format!("{label}.csv"));
    std::fs::write(&csv_path, csv(&results)).with_context(|| format!("write {}", csv_path.display()))?;
    let summary_path = args.out.join(format!("{label}-summary.txt"));
    std::fs::write(&summary_path, &table).with_context(|| format!("write {}", summary_path.display()))?;
    drop((top, relays, leaves));
    lab.down()?;
    println!("wrote {} and {}", csv_path.display(), summary_path.display());
    let incomplete: Vec<&str> = results
        .iter()
        .filter(|r| r.missing > 0 || r.corrupt > 0 || r.filed_bytes.is_some_and(|filed| filed < feed_bytes))
        .map(|r| r.name.as_str())
        .collect();
    if !incomplete.is_empty() {
        bail!("incomplete at {}", incomplete.join(", "));
    }
    Ok(())
}

/// Products and bytes of a trace file (`SIZE TIME [FEED]` lines).
fn trace_totals(trace: &Path) -> anyhow::Result<(u64, u64)> {
    let text = std::fs::read_to_string(trace).with_context(|| format!("read {}", trace.display()))?;
    let sizes = text.lines().filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok());
    Ok(sizes.fold((0, 0), |(n, bytes), size| (n + 1, bytes + size)))
}

/// Waits until `server` holds every product the top published (or the deadline passes).
fn wait_complete(server: &mut Server, published: &[ProductRecord], within: Duration) -> anyhow::Result<()> {
    let name = server.name().to_owned();
    let done = crate::wait_for(within, &format!("{name} to hold every product"), || {
        Ok(Comparison::of(published, &server.records()?).is_exact().then_some(()))
    });
    if let Err(error) = done {
        eprintln!("ldm7 lab idd: {error}");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn node_result(
    server: &Server,
    tier: &'static str,
    loss_percent: f64,
    delay_ms: u64,
    published: &[ProductRecord],
    records: &[ProductRecord],
    egress: Option<Egress>,
    feed_bytes: u64,
) -> NodeResult {
    let comparison = Comparison::of(published, records);
    let count = |mode| records.iter().filter(|r| r.mode == Some(mode)).count();
    let all: Vec<&ProductRecord> = records.iter().collect();
    let quantile_ms = |q| latency_quantile_us(&all, q).map_or(f64::NAN, |us| us as f64 / 1e3);
    NodeResult {
        name: server.name().to_owned(),
        tier,
        loss_percent,
        delay_ms: delay_ms as f64,
        products: records.len(),
        missing: comparison.missing.len(),
        corrupt: comparison.corrupt.len(),
        received: count(DeliveryMode::Received),
        inserted: count(DeliveryMode::Inserted),
        backlog: count(DeliveryMode::Backlog),
        p50_ms: quantile_ms(0.5),
        p99_ms: quantile_ms(0.99),
        cpu_s: server.cpu_seconds().unwrap_or(f64::NAN),
        peak_mib: server
            .pid()
            .and_then(|pid| ldm7_io::peak_resident_bytes(Some(pid)))
            .map_or(f64::NAN, |bytes| bytes as f64 / 1_048_576.0),
        egress_per_byte: egress.map(|e| e.htb_bytes as f64 / feed_bytes.max(1) as f64),
        filed_bytes: (tier == "leaf").then(|| bytes_under(&server.dir().join("data"))),
    }
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
const COLUMNS: [(&str, usize); 16] = [
    ("node", 7),
    ("tier", 6),
    ("loss_percent", 12),
    ("delay_ms", 8),
    ("products", 8),
    ("missing", 7),
    ("corrupt", 7),
    ("fmtp", 6),
    ("backstop", 8),
    ("backlog", 7),
    ("p50_ms", 7),
    ("p99_ms", 7),
    ("cpu_s", 6),
    ("peak_mib", 8),
    ("egress_per_byte", 15),
    ("filed_mb", 8),
];

impl NodeResult {
    /// The row's values, in [`COLUMNS`]' order (`-`: not measured for this node).
    fn values(&self) -> [String; 16] {
        let optional = |value: Option<String>| value.unwrap_or_else(|| "-".to_owned());
        [
            self.name.clone(),
            self.tier.to_owned(),
            format!("{:.1}", self.loss_percent),
            format!("{:.0}", self.delay_ms),
            self.products.to_string(),
            self.missing.to_string(),
            self.corrupt.to_string(),
            self.received.to_string(),
            self.inserted.to_string(),
            self.backlog.to_string(),
            format!("{:.0}", self.p50_ms),
            format!("{:.0}", self.p99_ms),
            format!("{:.1}", self.cpu_s),
            format!("{:.0}", self.peak_mib),
            optional(self.egress_per_byte.map(|e| format!("{e:.3}"))),
            optional(self.filed_bytes.map(|b| format!("{:.1}", b as f64 / 1e6))),
        ]
    }
}

fn table(results: &[NodeResult]) -> String {
    let line = |values: [String; 16]| -> String {
        let cells: Vec<String> = values
            .iter()
            .zip(COLUMNS)
            .enumerate()
            .map(|(k, (value, (_, width)))| if k < 2 { format!("{value:<width$}") } else { format!("{value:>width$}") })
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
