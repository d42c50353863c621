//! `ldm7 demo`: the LDM-7 system at work with no set-up and no root, on loopback multicast.
//!
//! A publisher and three subscribers run as separate `ldm7 serve` processes in a temporary
//! directory, each with its own product queue. The subscribers RECEIVE the feed by LDM-7: they
//! subscribe (each keeping its own address, as on any feed that is on no circuit), join the
//! multicast group and receive by FMTP into their queues. The real one-hour NGRID trace is replayed into the publisher's queue
//! at speed; one subscriber drops 2% of what it receives (its FMTP repairs them), and one is
//! killed (SIGKILL) and restarted halfway (what it missed comes through the backlog). A live
//! line per subscriber shows its products, FMTP delivery ratio, retransmitted blocks, backstop
//! and backlog counts, from its delivery log. Independently of the servers, the demo follows
//! every subscriber's queue, checks each product's MD5 against its signature, and finally
//! compares the products each subscriber has with those the publisher had: the summary proves
//! that every product reached every subscriber.
//!
//! Whatever way the demo ends — done, failed, or interrupted by SIGINT (Ctrl-C) or SIGTERM — it
//! stops its processes (SIGTERM, then SIGKILL after a grace period) and removes its directory
//! (queues of a gigabyte or more each), unless `--keep`. A second SIGINT or SIGTERM during that
//! clean-up exits at once.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ldm7_metrics::{DeliveryLine, DeliveryMode};
use ldm7_pq::{Capacity, Queue};
use ldm7_types::trace::TraceProduct;
use ldm7_types::{ByteSize, FeedType, Rate, Signature, Timestamp};
use md5::{Digest, Md5};

use crate::replay::replay_into;
use crate::trace::{keep_span, read_trace};
use crate::{RunError, Server, ServerConfig, bad_input, runtime};

const DEFAULT_TRACE: &str = "data/traces/unidata_ldm_NGRID_1hr_20150615T00Z.txt";
/// The demo gives up waiting for the subscribers after this long without progress.
const STALL_LIMIT: Duration = Duration::from_secs(60);
/// How often the live lines are printed.
const LIVE_EVERY: Duration = Duration::from_secs(3);
/// How long the demo's servers get to end after SIGTERM before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Exit status of a process ended by a second interrupting signal during the clean-up.
const SECOND_SIGNAL_EXIT: i32 = 2;

/// What `ldm7 demo` runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Trace to replay (`None`: the one-hour NGRID trace in the shared directory,
    /// [`find_shared`]).
    pub trace: Option<PathBuf>,
    /// Replay speed: 60 = the trace's hour in a minute (0 = as fast as possible).
    pub speed: f64,
    /// Replay only the trace's first span (`None`: all of it).
    pub span: Option<Duration>,
    /// The FMTP sending rate (the path rate).
    pub rate: Rate,
    /// Subscribers (2 or more: one loses packets, one is killed and restarted).
    pub subscribers: u32,
    /// Share of multicast datagrams the lossy subscriber drops, in [0, 1).
    pub loss: f64,
    /// Capacity of each queue (products are checked as they arrive, so queues may evict).
    pub queue_size: ByteSize,
    /// Keep the demo's directory (queues, configurations, logs) instead of removing it.
    pub keep: bool,
}

/// The result of the demo's steps.
type DemoResult<T = ()> = Result<T, RunError>;

/// Runs the demo.
pub fn run(args: &DemoOptions) -> DemoResult {
    let trace = match &args.trace {
        Some(trace) => trace.clone(),
        None => find_shared(DEFAULT_TRACE)?,
    };
    let mut products = read_trace(&trace).map_err(bad_input)?;
    if let Some(span) = args.span {
        keep_span(&mut products, span);
    }
    if products.is_empty() {
        return Err(bad_input("the trace (or its --span) holds no product"));
    }
    let interrupt = Interrupt::register()?;
    let dir = tempfile::Builder::new().prefix("ldm7-demo-").tempdir().map_err(runtime)?;
    let result = run_in(&dir, args, &trace, &products, &interrupt);
    if args.keep {
        let kept = dir.keep();
        println!("kept {}", kept.display());
    } else {
        let path = dir.path().to_path_buf();
        match dir.close() {
            Ok(()) if interrupt.signal().is_some() => println!("removed {}", path.display()),
            Ok(()) => {}
            Err(error) => eprintln!("ldm7 demo: cannot remove {}: {error}; remove it by hand", path.display()),
        }
    }
    result
}

/// The demo in `dir`; its processes are stopped when it returns, whatever the outcome.
fn run_in(
    dir: &tempfile::TempDir,
    args: &DemoOptions,
    trace: &Path,
    products: &[TraceProduct],
    interrupt: &Interrupt,
) -> DemoResult {
    let started = Instant::now();
    let total_bytes: u64 = products.iter().map(|product| u64::from(product.size)).sum();
    let trace_span =
        products.last().map(|p| p.created).unwrap_or_default().saturating_duration_since(products[0].created);
    let replay_secs = if args.speed > 0.0 { trace_span.as_secs_f64() / args.speed } else { 0.0 };
    println!("== ldm7 demo: LDM-7 multicast on loopback ==");
    println!(
        "trace     {} ({} products, {:.2} GB over {:.0} min), replayed at {}x (about {replay_secs:.0} s)",
        trace.display(),
        products.len(),
        total_bytes as f64 / 1e9,
        trace_span.as_secs_f64() / 60.0,
        args.speed
    );
    let mut lab = Lab::create(dir.path(), args, total_bytes, interrupt)?;
    println!(
        "processes publisher pid {} (MULTICAST NGRID to {} at {}), {} subscribers: {}",
        lab.publisher.pid(),
        lab.group,
        args.rate,
        lab.subscribers.len(),
        lab.subscribers.iter().map(|s| format!("{} pid {}", s.name(), s.pid())).collect::<Vec<_>>().join(", ")
    );
    println!(
        "dashboard {} (ldm7 monitor pid {}): the servers report at the end of each minute",
        lab.monitor.url,
        lab.monitor.process.pid()
    );
    println!(
        "directory {}{}",
        dir.path().display(),
        if args.keep { " (kept)" } else { " (removed at the end, also on Ctrl-C)" }
    );
    // The Followers' threads run until `stop`.
    let stop = Arc::new(AtomicBool::new(false));
    let result = drive(&mut lab, args, trace, products, started, replay_secs, &stop, interrupt);
    stop.store(true, Ordering::Relaxed);
    lab.stop();
    result
}

/// Subscribes, replays, follows and checks; the caller stops the processes.
#[allow(clippy::too_many_arguments)]
fn drive(
    lab: &mut Lab,
    args: &DemoOptions,
    trace: &Path,
    products: &[TraceProduct],
    started: Instant,
    replay_secs: f64,
    stop: &Arc<AtomicBool>,
    interrupt: &Interrupt,
) -> DemoResult {
    lab.wait_subscribed(interrupt)?;
    println!("all {} subscribers subscribed; replaying", lab.subscribers.len());

    // The publisher's products as the replay inserts them, and each subscriber's as they arrive
    // (each queue opened once in this process: LMDB allows one environment per file).
    let publisher_queue = Arc::new(Queue::open(&lab.publisher.server.queue_path()).map_err(runtime)?);
    let expected = Arc::new(Follower::start(publisher_queue.clone(), stop.clone(), false));
    let checks: Vec<Arc<Follower>> = lab
        .subscribers
        .iter()
        .map(|subscriber| {
            let queue = Queue::open(&subscriber.server.queue_path()).map_err(runtime)?;
            Ok(Arc::new(Follower::start(Arc::new(queue), stop.clone(), true)))
        })
        .collect::<DemoResult<_>>()?;

    let replay = {
        let trace = trace.to_path_buf();
        let products = products.to_vec();
        let speed = args.speed;
        std::thread::spawn(move || {
            replay_into(&publisher_queue, &trace, &products, FeedType::NGRID, true, speed, 1, None)
        })
    };
    let replay_started = Instant::now();
    let victim = lab.subscribers.len() - 1;
    let (kill_at, restart_at) = (replay_secs * 0.35, replay_secs * 0.55);
    let mut killed = false;
    let mut restarted = false;
    let mut last_live = Instant::now();
    let mut last_progress = (0u64, Instant::now());
    let replay_result = loop {
        std::thread::sleep(Duration::from_millis(100));
        // An interrupted replay thread is left to the process's exit: it only writes into the
        // publisher's queue, whose files go with the directory.
        interrupt.check()?;
        let elapsed = replay_started.elapsed().as_secs_f64();
        if !killed && elapsed >= kill_at {
            lab.subscribers[victim].kill();
            println!("[{elapsed:5.1} s] {} killed (SIGKILL)", lab.subscribers[victim].name());
            killed = true;
        }
        if killed && !restarted && elapsed >= restart_at {
            lab.subscribers[victim].start()?;
            lab.monitor.latest_start = Instant::now();
            println!(
                "[{elapsed:5.1} s] {} restarted: it resubscribes and asks for its backlog",
                lab.subscribers[victim].name()
            );
            restarted = true;
        }
        if last_live.elapsed() >= LIVE_EVERY {
            lab.print_live(elapsed, &expected, &checks);
            last_live = Instant::now();
        }
        if replay.is_finished() {
            break replay.join().map_err(|_| runtime(anyhow::anyhow!("the replay thread panicked")))?;
        }
    };
    let summary = replay_result?;
    if !restarted {
        if !killed {
            lab.subscribers[victim].kill();
        }
        lab.subscribers[victim].start()?;
        lab.monitor.latest_start = Instant::now();
    }
    let published = summary.inserted;
    println!(
        "[{:5.1} s] replay done: {published} products, {:.2} GB; waiting for the subscribers",
        replay_started.elapsed().as_secs_f64(),
        summary.bytes as f64 / 1e9
    );
    // Wait until every subscriber holds every product, or nothing moves for a minute.
    loop {
        interrupt.check()?;
        let have: u64 = checks.iter().map(|check| check.count().min(published)).sum();
        if checks.iter().all(|check| check.count() >= published) {
            break;
        }
        if have > last_progress.0 {
            last_progress = (have, Instant::now());
        } else if last_progress.1.elapsed() > STALL_LIMIT {
            println!("no progress for {} s: giving up waiting", STALL_LIMIT.as_secs());
            break;
        }
        if last_live.elapsed() >= LIVE_EVERY {
            lab.print_live(replay_started.elapsed().as_secs_f64(), &expected, &checks);
            last_live = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    lab.print_live(replay_started.elapsed().as_secs_f64(), &expected, &checks);
    lab.monitor.wait_and_tell(interrupt)?;
    stop.store(true, Ordering::Relaxed);
    lab.stop();
    let complete = lab.summary(published, &expected, &checks);
    println!("total time {:.1} s", started.elapsed().as_secs_f64());
    if !complete {
        return Err(runtime(anyhow::anyhow!("not every product reached every subscriber (see above)")));
    }
    Ok(())
}

/// The processes of the demo.
struct Lab {
    publisher: DemoServer,
    subscribers: Vec<DemoServer>,
    monitor: Monitor,
    group: String,
}

impl Lab {
    fn create(root: &Path, args: &DemoOptions, replay_bytes: u64, interrupt: &Interrupt) -> DemoResult<Self> {
        let exe = std::env::current_exe().map_err(runtime)?;
        let port = ldm7_io::free_port().map_err(runtime)?;
        let group = format!("239.255.{}.7:{}", std::process::id() % 250 + 1, ldm7_io::free_port().map_err(runtime)?);
        let names: Vec<String> = (1..=args.subscribers).map(|k| format!("sub{k}")).collect();
        // Every server's statistics name and port, the publisher first: the monitor's upstreams.
        let mut reporters = vec![(format!("127.0.0.1:{port}"), port)];
        // The subscribers name their publisher by the address they receive from.
        let publisher = ServerConfig::local(
            "pub",
            port,
            queue_capacity(args.queue_size.bytes().max(replay_bytes * 11 / 10)),
            &format!("ALLOW ANY ^127\\.0\\.0\\.1$\nMULTICAST NGRID {group} 127.0.0.1:0 24 0 dummy dummy\n"),
        )
        .settings(&format!("[multicast]\nrate = \"{}\"\n", args.rate))
        .args(["-I", "127.0.0.1", "--stats-name", &reporters[0].0]);
        // With three or more subscribers the second one is lossy (the last is killed); with two,
        // the first.
        let lossy = if args.subscribers >= 3 { 1 } else { 0 };
        let mut configs = vec![(publisher, false)];
        for (k, name) in names.iter().enumerate() {
            let drop = if k == lossy { args.loss } else { 0.0 };
            let subscriber_port = ldm7_io::free_port().map_err(runtime)?;
            // The monitor requests the subscriber's statistics (feed EXP) from it.
            let config = ServerConfig::local(
                name,
                subscriber_port,
                queue_capacity(args.queue_size.bytes()),
                &format!("ALLOW EXP ^127\\.0\\.0\\.1$\nRECEIVE NGRID 127.0.0.1:{port}\n"),
            )
            .settings(&format!(
                "[receive]\nretry_min = \"200ms\"\nretry_max = \"2s\"\nrate = \"{}\"\ndrop = {drop}\n",
                args.rate
            ))
            .args(["-I", "127.0.0.1", "--stats-name", name]);
            configs.push((config, drop > 0.0));
            reporters.push((name.clone(), subscriber_port));
        }
        // The servers' directories and queues are made in parallel (each queue is written full
        // at creation). The publisher's holds the whole replay, so that every product a
        // subscriber asks for is still there; the subscribers' may evict (the demo checks
        // products as they arrive).
        let creations: Vec<_> = configs
            .into_iter()
            .map(|(config, lossy)| {
                let (exe, root) = (exe.clone(), root.to_path_buf());
                std::thread::spawn(move || {
                    Server::create(&exe, &root, config).map(|server| DemoServer::new(server, lossy))
                })
            })
            .collect();
        // Every creation is waited for, even after an interrupt: nothing may still write in the
        // directory when it is removed.
        let outcomes: Vec<_> = creations.into_iter().map(std::thread::JoinHandle::join).collect();
        interrupt.check()?;
        let mut servers = Vec::new();
        for outcome in outcomes {
            servers.push(
                outcome
                    .map_err(|_| runtime(anyhow::anyhow!("creating a server's queue panicked")))?
                    .map_err(|error| runtime(anyhow::anyhow!("cannot create a server: {error}")))?,
            );
        }
        let publisher = servers.remove(0);
        let subscribers = servers;
        let monitor = Monitor::prepare(&exe, root, &reporters)?;
        // Started as members of the lab at once, so that a failed start stops those started.
        let mut lab = Self { publisher, subscribers, monitor, group };
        lab.publisher.start()?;
        for subscriber in &mut lab.subscribers {
            subscriber.start()?;
        }
        lab.monitor.process.start()?;
        Ok(lab)
    }

    fn wait_subscribed(&mut self, interrupt: &Interrupt) -> DemoResult {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            interrupt.check()?;
            if self.subscribers.iter().all(|s| s.server.log().contains("FMTP repair connection to")) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(runtime(anyhow::anyhow!(
                    "the subscribers did not subscribe within 30 s; see the logs under {}",
                    self.publisher.server.dir().parent().unwrap_or(Path::new(".")).display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn print_live(&mut self, elapsed: f64, expected: &Follower, checks: &[Arc<Follower>]) {
        println!("[{elapsed:5.1} s] published {} products ({:.2} GB)", expected.count(), expected.bytes() as f64 / 1e9);
        for (subscriber, check) in self.subscribers.iter_mut().zip(checks) {
            let modes = subscriber.deliveries();
            let total = modes.received + modes.inserted + modes.backlog;
            let ratio = if total > 0 { 100.0 * modes.received as f64 / total as f64 } else { 100.0 };
            println!(
                "          {:<5} {:>6} products  FMTP {:>6} ({ratio:5.1}%, {:>5} blocks retransmitted)  backstop {:>4}  backlog {:>5}{}",
                subscriber.name(),
                check.count(),
                modes.received,
                modes.retransmitted_blocks,
                modes.inserted,
                modes.backlog,
                if subscriber.server.pid().is_none() {
                    "  [down]"
                } else if subscriber.lossy {
                    "  [lossy]"
                } else {
                    ""
                }
            );
        }
    }

    /// Stops every process: SIGTERM to all, then SIGKILL to those still running after
    /// [`STOP_GRACE`].
    fn stop(&mut self) {
        for demo_server in self.subscribers.iter().chain([&self.publisher]) {
            demo_server.server.terminate();
        }
        self.monitor.process.signal_terminate();
        let deadline = Instant::now() + STOP_GRACE;
        for demo_server in self.subscribers.iter_mut().chain([&mut self.publisher]) {
            demo_server.server.wait_exit(deadline);
        }
        self.monitor.process.reap(deadline);
    }

    /// Prints the summary; returns whether every subscriber has every product, intact.
    fn summary(&mut self, published: u64, expected: &Follower, checks: &[Arc<Follower>]) -> bool {
        let wanted = expected.signatures();
        println!("== summary ==");
        println!("publisher {} products, {:.2} GB", wanted.len(), expected.bytes() as f64 / 1e9);
        let mut complete = wanted.len() as u64 == published;
        for (subscriber, check) in self.subscribers.iter_mut().zip(checks) {
            let got = check.signatures();
            let missing = wanted.difference(&got).count();
            let extra = got.difference(&wanted).count();
            let modes = subscriber.deliveries();
            let ok = missing == 0 && extra == 0 && check.corrupt() == 0 && check.skipped() == 0;
            complete &= ok;
            println!(
                "{:<9} {} products, MD5 checked {} ({} corrupt), missing {missing}, duplicates dropped {}, by FMTP {} \
                 ({} blocks retransmitted), backstop {}, backlog {}: {}",
                subscriber.name(),
                got.len(),
                check.count(),
                check.corrupt(),
                modes.duplicates,
                modes.received,
                modes.retransmitted_blocks,
                modes.inserted,
                modes.backlog,
                if ok { "every product, intact" } else { "INCOMPLETE" }
            );
        }
        println!(
            "{}",
            if complete {
                "every product reached every subscriber's queue, each one checked by MD5"
            } else {
                "SOME PRODUCTS DID NOT ARRIVE"
            }
        );
        complete
    }
}

/// A server of the demo, with what its delivery log has said so far.
struct DemoServer {
    server: Server,
    /// Whether it drops some of what it receives (`[receive] drop`).
    lossy: bool,
    log_offset: u64,
    modes: Modes,
}

/// Delivery counts read from a subscriber's log.
#[derive(Clone, Copy, Debug, Default)]
struct Modes {
    received: u64,
    inserted: u64,
    backlog: u64,
    retransmitted_blocks: u64,
    duplicates: u64,
}

/// The demo's queues: the size asked for, with at least 40,000 slots (NGRID's small products).
fn queue_capacity(bytes: u64) -> Capacity {
    Capacity { bytes, slots: Capacity::default_slots(bytes).max(40_000) }
}

impl DemoServer {
    fn new(server: Server, lossy: bool) -> Self {
        Self { server, lossy, log_offset: 0, modes: Modes::default() }
    }

    fn name(&self) -> &str {
        self.server.name()
    }

    fn pid(&self) -> u32 {
        self.server.pid().unwrap_or(0)
    }

    fn start(&mut self) -> DemoResult {
        self.server.start().map_err(runtime)
    }

    fn kill(&mut self) {
        self.server.kill();
    }

    /// Delivery counts so far (reads what the log gained since the last call).
    fn deliveries(&mut self) -> Modes {
        let Ok(mut file) = std::fs::File::open(self.server.dir().join("log")) else { return self.modes };
        if file.seek(SeekFrom::Start(self.log_offset)).is_err() {
            return self.modes;
        }
        let mut text = String::new();
        if file.read_to_string(&mut text).is_err() {
            return self.modes;
        }
        let complete = text.rfind('\n').map_or(0, |at| at + 1);
        for line in text[..complete].lines() {
            match DeliveryLine::parse(line) {
                Some(DeliveryLine { mode: DeliveryMode::Received, retransmitted_blocks, .. }) => {
                    self.modes.received += 1;
                    self.modes.retransmitted_blocks += u64::from(retransmitted_blocks.unwrap_or(0));
                }
                Some(DeliveryLine { mode: DeliveryMode::Inserted, .. }) => self.modes.inserted += 1,
                Some(DeliveryLine { mode: DeliveryMode::Backlog, .. }) => self.modes.backlog += 1,
                None if line.contains("Duplicate data-product") => self.modes.duplicates += 1,
                None => {}
            }
        }
        self.log_offset += complete as u64;
        self.modes
    }
}

/// The demo's `ldm7 monitor` process (its servers are [`Server`]s).
struct Process {
    exe: PathBuf,
    dir: PathBuf,
    name: String,
    /// Its arguments (run in `dir`; standard error into `dir/stderr`).
    args: Vec<String>,
    child: Option<Child>,
}

impl Process {
    fn new(exe: &Path, dir: &Path, name: &str, args: Vec<String>) -> Self {
        Self { exe: exe.to_path_buf(), dir: dir.to_path_buf(), name: name.to_owned(), args, child: None }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn start(&mut self) -> DemoResult {
        let stderr = std::fs::File::create(self.dir.join("stderr"))
            .map_err(|error| runtime(anyhow::anyhow!("cannot start {}: {error}", self.name)))?;
        let child = Command::new(&self.exe)
            .args(&self.args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|error| runtime(anyhow::anyhow!("cannot start {}: {error}", self.name)))?;
        self.child = Some(child);
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn signal_terminate(&self) {
        if let Some(child) = &self.child {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }

    /// Waits for the process to end until `deadline`, then kills it.
    fn reap(&mut self, deadline: Instant) {
        if let Some(mut child) = self.child.take() {
            crate::server::wait_or_kill(&mut child, deadline);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Follows a queue from its beginning in a thread: collects signatures and, when checking,
/// verifies each product's MD5.
struct Follower {
    state: Arc<Mutex<HashSet<Signature>>>,
    count: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    corrupt: Arc<AtomicU64>,
    skipped: Arc<AtomicU64>,
}

impl Follower {
    fn start(queue: Arc<Queue>, stop: Arc<AtomicBool>, check: bool) -> Self {
        let follower = Self {
            state: Arc::new(Mutex::new(HashSet::new())),
            count: Arc::new(AtomicU64::new(0)),
            bytes: Arc::new(AtomicU64::new(0)),
            corrupt: Arc::new(AtomicU64::new(0)),
            skipped: Arc::new(AtomicU64::new(0)),
        };
        let (state, count, bytes, corrupt, skipped) = (
            follower.state.clone(),
            follower.count.clone(),
            follower.bytes.clone(),
            follower.corrupt.clone(),
            follower.skipped.clone(),
        );
        std::thread::spawn(move || {
            let mut cursor = queue.follow(Timestamp::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let next = cursor.next_with(Some(Duration::from_millis(200)), |product| {
                    // A server's own per-minute statistics products are not part of the feed.
                    if ldm7_metrics::StatsProduct::is_stats_ident(&product.info.ident) {
                        return None;
                    }
                    let intact = !check || Signature(Md5::digest(product.data).into()) == product.info.signature;
                    Some((product.info.signature, product.data.len() as u64, intact))
                });
                if let Ok(Some(Some((signature, size, intact)))) = next {
                    if !intact {
                        corrupt.fetch_add(1, Ordering::Relaxed);
                    }
                    let new = state.lock().map(|mut set| set.insert(signature)).unwrap_or(false);
                    if new {
                        count.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(size, Ordering::Relaxed);
                    }
                }
                skipped.store(cursor.skipped(), Ordering::Relaxed);
            }
        });
        follower
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn corrupt(&self) -> u64 {
        self.corrupt.load(Ordering::Relaxed)
    }

    fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    fn signatures(&self) -> HashSet<Signature> {
        self.state.lock().map(|set| set.clone()).unwrap_or_default()
    }
}

/// Where the demo's nodes are on the dashboard's map (latitude, longitude): the publisher in
/// Boulder, the subscribers at universities across the country.
const PLACES: [(f64, f64); 17] = [
    (40.015, -105.27),  // Boulder, CO
    (43.073, -89.401),  // Madison, WI
    (47.655, -122.303), // Seattle, WA
    (25.721, -80.279),  // Miami, FL
    (35.209, -97.445),  // Norman, OK
    (42.686, -73.824),  // Albany, NY
    (40.763, -111.848), // Salt Lake City, UT
    (40.820, -96.700),  // Lincoln, NE
    (38.987, -76.943),  // College Park, MD
    (32.232, -110.951), // Tucson, AZ
    (40.110, -88.228),  // Urbana, IL
    (33.584, -101.875), // Lubbock, TX
    (33.948, -83.377),  // Athens, GA
    (39.544, -119.816), // Reno, NV
    (46.818, -92.085),  // Duluth, MN
    (40.798, -77.860),  // State College, PA
    (44.565, -123.276), // Corvallis, OR
];

/// How long after the monitor or a server starts the demo waits, at most, for every server's
/// first report: servers report at the end of each minute (plus a grace of two seconds), and the
/// monitor reconnects to a restarted server within seconds.
const FIRST_REPORTS_WITHIN: Duration = Duration::from_secs(70);

/// The demo's `ldm7 monitor`: it requests the statistics products of the publisher and of each
/// subscriber, stores them in SQLite and serves the dashboard.
struct Monitor {
    process: Process,
    url: String,
    /// The servers' statistics names, the publisher first.
    nodes: Vec<String>,
    /// The latest start of the monitor or of a server: each server reports at the end of the
    /// minute it runs in, so every one has reported within [`FIRST_REPORTS_WITHIN`] after it.
    latest_start: Instant,
}

impl Monitor {
    /// Writes its node placements; `reporters` are the servers' statistics names and ports.
    fn prepare(exe: &Path, root: &Path, reporters: &[(String, u16)]) -> DemoResult<Self> {
        let dir = root.join("monitor");
        std::fs::create_dir_all(&dir).map_err(runtime)?;
        let mut places = String::from("# Where the demo's servers are on the map.\n");
        for ((name, _), (latitude, longitude)) in reporters.iter().zip(PLACES.iter().cycle()) {
            places.push_str(&format!("[[node]]\nname = \"{name}\"\nlatitude = {latitude}\nlongitude = {longitude}\n"));
        }
        std::fs::write(dir.join("nodes.toml"), places).map_err(runtime)?;
        let listen = format!("127.0.0.1:{}", ldm7_io::free_port().map_err(runtime)?);
        let mut args: Vec<String> =
            ["monitor", "--db", "sqlite:monitor.db", "--state-dir", ".", "--nodes", "nodes.toml"]
                .iter()
                .map(ToString::to_string)
                .collect();
        args.extend(["--listen".to_owned(), listen.clone()]);
        for (_, port) in reporters {
            args.extend(["--upstream".to_owned(), format!("127.0.0.1:{port}")]);
        }
        Ok(Self {
            process: Process::new(exe, &dir, "monitor", args),
            url: format!("http://{listen}/"),
            nodes: reporters.iter().map(|(name, _)| name.clone()).collect(),
            latest_start: Instant::now(),
        })
    }

    /// The nodes that have reported, and the publisher's links with delivery statistics.
    fn reports(&self) -> Result<(Vec<String>, usize), String> {
        let get = |path: &str| -> Result<serde_json::Value, String> {
            let url = format!("{}{path}", self.url);
            let response = ureq::get(&url).timeout(Duration::from_secs(5)).call().map_err(|error| error.to_string())?;
            response.into_json().map_err(|error| format!("{url}: {error}"))
        };
        let nodes = get("api/nodes")?;
        let reported = nodes
            .as_array()
            .into_iter()
            .flatten()
            .filter(|node| !node["last_report"].is_null())
            .filter_map(|node| node["name"].as_str().map(str::to_owned))
            .collect();
        let links = get("api/links")?;
        let publisher = &self.nodes[0];
        let links = links.as_array().into_iter().flatten().filter(|link| link["publisher"] == *publisher).count();
        Ok((reported, links))
    }

    /// Waits until every node has reported to the monitor and every subscriber's link carries
    /// delivery statistics (at most until [`FIRST_REPORTS_WITHIN`] after the latest start), and
    /// says what the dashboard shows.
    fn wait_and_tell(&self, interrupt: &Interrupt) -> DemoResult {
        let deadline = self.latest_start + FIRST_REPORTS_WITHIN;
        let mut told = false;
        let (reported, links) = loop {
            interrupt.check()?;
            let reports = self.reports();
            // Every node has reported, and each subscriber's link from the publisher carries
            // delivery statistics (a node's first report can come before its link's).
            let all = reports.as_ref().is_ok_and(|(reported, links)| {
                self.nodes.iter().all(|node| reported.contains(node)) && *links + 1 >= self.nodes.len()
            });
            if all || Instant::now() >= deadline {
                break reports.unwrap_or_default();
            }
            if !told {
                println!(
                    "waiting up to {:.0} s for every server's first per-minute report to reach the monitor",
                    deadline.saturating_duration_since(Instant::now()).as_secs_f64()
                );
                told = true;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let missing: Vec<&str> =
            self.nodes.iter().filter(|node| !reported.contains(node)).map(String::as_str).collect();
        if missing.is_empty() {
            println!(
                "dashboard {}: every server reported ({}), {links} links from the publisher with delivery statistics",
                self.url,
                self.nodes.join(", ")
            );
        } else {
            println!(
                "dashboard {}: NOT REPORTED {} (see {})",
                self.url,
                missing.join(", "),
                self.process.dir.join("stderr").display()
            );
        }
        Ok(())
    }
}

/// SIGINT and SIGTERM, caught for the demo's lifetime: the first is noted (the demo stops at its
/// next check and cleans up), a second one exits at once.
struct Interrupt {
    signal: Arc<AtomicUsize>,
}

impl Interrupt {
    fn register() -> DemoResult<Self> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let signal = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicBool::new(false));
        for number in [SIGINT, SIGTERM] {
            // Registered first, so it sees `seen` as the previous signal left it.
            signal_hook::flag::register_conditional_shutdown(number, SECOND_SIGNAL_EXIT, seen.clone())
                .map_err(runtime)?;
            signal_hook::flag::register(number, seen.clone()).map_err(runtime)?;
            signal_hook::flag::register_usize(number, signal.clone(), number as usize).map_err(runtime)?;
        }
        Ok(Self { signal })
    }

    /// The signal received, if any.
    fn signal(&self) -> Option<&'static str> {
        match self.signal.load(Ordering::Relaxed) as i32 {
            0 => None,
            signal_hook::consts::SIGINT => Some("SIGINT"),
            _ => Some("SIGTERM"),
        }
    }

    /// An error when a signal has been received.
    fn check(&self) -> DemoResult {
        match self.signal() {
            None => Ok(()),
            Some(name) => {
                println!("interrupted by {name}: stopping the demo's processes (again to exit at once)");
                Err(runtime(anyhow::anyhow!("interrupted by {name}")))
            }
        }
    }
}

/// Finds `relative` (e.g. `data/traces/…`) in the shared directory: `$LDM7_SHARED` when it is
/// set — a value that does not hold the file is an error, never a silent fallback — else
/// `../shared` or `./shared` from the current directory, else `../shared` next to the workspace
/// this binary was built in.
pub fn find_shared(relative: &str) -> DemoResult<PathBuf> {
    if let Some(shared) = std::env::var_os("LDM7_SHARED").filter(|value| !value.is_empty()) {
        let path = Path::new(&shared).join(relative);
        if path.is_file() {
            return Ok(path);
        }
        let why = if Path::new(&shared).is_dir() { "does not hold" } else { "is not a directory holding" };
        return Err(bad_input(format!(
            "LDM7_SHARED={} {why} {relative}: point it at the shared directory (the one holding data/), \
             or unset it, or pass --trace FILE",
            Path::new(&shared).display()
        )));
    }
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(current) = std::env::current_dir() {
        roots.extend(current.parent().map(|parent| parent.join("shared")));
        roots.push(current.join("shared"));
    }
    // This crate is WORKSPACE/crates/testbed.
    roots.extend(Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(3).map(|parent| parent.join("shared")));
    roots.into_iter().map(|root| root.join(relative)).find(|path| path.is_file()).ok_or_else(|| {
        bad_input(format!(
            "cannot find {relative} in ../shared: set LDM7_SHARED to the shared directory or pass --trace FILE"
        ))
    })
}
