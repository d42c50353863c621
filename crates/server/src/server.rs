//! The daemon: listens for LDM connections, runs the REQUEST downstreams and the EXEC
//! children, reloads the configuration on SIGHUP and drains on SIGTERM/SIGINT.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use ldm7_io::Stop;
use ldm7_io::children::{ChildProgram, Children, Restart};
use ldm7_ldm_proto::FeedMode;
use ldm7_pq::Queue;
use ldm7_types::Timestamp;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::access::PeerHost;
use crate::config::Config;
use crate::limits::{ConnectionRefusal, ConnectionRefusals, Feeders, HostConnections};
use crate::multicast::Multicaster;
use crate::multicast::downstream7::{self, SubscriberContext, SubscriberCounters};
use crate::request::RequestSpec;
use crate::settings::Settings;
use crate::{conn, request};

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// ldmd.conf.
    pub config_path: PathBuf,
    /// The product queue.
    pub queue_path: PathBuf,
    /// Where to listen (LDM: 0.0.0.0:388; ldm7: [::]:388, both families).
    pub listen: SocketAddr,
    /// More addresses to listen on, at the same port as `listen` (`-I` given more than once).
    pub also_listen: Vec<std::net::IpAddr>,
    /// Where REQUEST resume points are kept.
    pub state_dir: PathBuf,
    /// How far back a fresh REQUEST asks (`-o`, default 3600 s).
    pub time_offset: Duration,
    /// Older products are ignored by downstreams (`-m`, default 3600 s).
    pub max_latency: Duration,
    /// A downstream closes after this long without a message (300 s).
    pub silence: Duration,
    /// First reconnection delay of a downstream; doubles up to `retry_max`.
    pub retry_min: Duration,
    /// Longest reconnection delay (LDM: 60 s).
    pub retry_max: Duration,
    /// Most connections served at once (LDM's `/server/max-clients`: 256).
    pub max_clients: usize,
    /// The settings file (multicast, path service, subscribers).
    pub settings: Arc<Settings>,
    /// This server's name in its statistics products [default: the host name, with `:port`
    /// when the port is not 388].
    pub stats_name: Option<String>,
    /// Where to serve Prometheus metrics (`GET /metrics`), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// The server's log file, if it logs to one: its EXEC children log there too
    /// (`LDM7_LOG_FILE`), each reopening it on SIGUSR1 as the server does.
    pub log_file: Option<PathBuf>,
    /// The user to run as once the port is bound (a server started as root to bind 388); its
    /// EXEC children run as it too.
    pub run_as: Option<String>,
}

impl ServerOptions {
    /// LDM's defaults for the given files and address.
    pub fn new(config_path: PathBuf, queue_path: PathBuf, listen: SocketAddr) -> Self {
        Self {
            config_path,
            queue_path,
            listen,
            also_listen: Vec::new(),
            state_dir: PathBuf::from("."),
            time_offset: Duration::from_secs(3600),
            max_latency: Duration::from_secs(3600),
            silence: Duration::from_secs(300),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            max_clients: 256,
            settings: Arc::new(Settings::default()),
            stats_name: None,
            metrics_listen: None,
            log_file: None,
            run_as: None,
        }
    }
}

/// Counters of the whole server.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections refused or closed by the server, by reason (with their rate-limited log).
    pub refusals: ConnectionRefusals,
    /// Products sent to downstreams.
    pub products_sent: AtomicU64,
    /// Products received and inserted.
    pub products_received: AtomicU64,
    /// Products received that the queue already had.
    pub duplicates: AtomicU64,
    /// Products that could not be inserted.
    pub insert_errors: AtomicU64,
    /// Malformed records (each closes its connection) and products whose data did not match
    /// their metadata.
    pub malformed: AtomicU64,
    /// Calls answered PROG_UNAVAIL, PROG_MISMATCH or PROC_UNAVAIL (e.g. an LDM-5 or LDM-7 peer).
    pub unserved_calls: AtomicU64,
}

/// What every thread of the server shares.
#[derive(Debug)]
pub struct Shared {
    pub(crate) options: ServerOptions,
    pub(crate) queue: Arc<Queue>,
    pub(crate) multicaster: Arc<Multicaster>,
    /// The counters of each RECEIVE, by name.
    pub(crate) subscriber_counters: Mutex<Vec<(String, Arc<SubscriberCounters>)>>,
    config: RwLock<Arc<Config>>,
    /// Given by [`Server::stop`]; every blocked thread wakes on it (`ldm7_io::stop`).
    pub(crate) stop: Stop,
    pub(crate) counters: Counters,
    /// Open connections by address (`connections_per_host_max`).
    pub(crate) host_connections: Arc<HostConnections>,
    /// The feeds being sent, by downstream address (one feeder per host and feed).
    pub(crate) feeders: Arc<Feeders>,
    /// Per-minute delivery statistics, published as products.
    pub(crate) stats: Arc<crate::stats::StatsPublisher>,
    active_connections: AtomicUsize,
    /// The accept loop runs (the watchdog's sign of life, [`Health`]).
    accepting: AtomicBool,
    session_ids: AtomicU32,
}

impl Shared {
    /// Connections being served.
    pub(crate) fn active_connections(&self) -> usize {
        self.active_connections.load(Ordering::Relaxed)
    }

    /// The current configuration.
    pub(crate) fn config(&self) -> Arc<Config> {
        self.config.read().map_or_else(|poisoned| poisoned.into_inner().clone(), |config| config.clone())
    }

    /// Whether the configuration has LDM-7 feeds (MULTICAST or RECEIVE): such a server
    /// publishes a statistics product every minute (its heartbeat).
    fn has_ldm7_feeds(&self) -> bool {
        let config = self.config();
        !config.multicasts.is_empty() || !config.receives.is_empty()
    }

    pub(crate) fn next_session_id(&self) -> u32 {
        std::process::id().wrapping_mul(1000).wrapping_add(self.session_ids.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn is_alive(&self, id: u32) -> bool {
        id.wrapping_sub(std::process::id().wrapping_mul(1000)) < self.session_ids.load(Ordering::Relaxed)
    }

    /// Sleeps, waking early when the server stops.
    pub(crate) fn sleep(&self, duration: Duration) {
        self.stop.wait(duration);
    }

    /// Whether the server is stopping.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stop.is_stopped()
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is wrong.
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    /// The queue cannot be opened.
    #[error("cannot open the product queue {path}: {source}")]
    Queue {
        /// The queue.
        path: String,
        /// Why.
        source: ldm7_pq::OpenError,
    },
    /// The port cannot be listened on (with a hint when a port below 1024 was refused for want of
    /// privilege, or the port is taken).
    #[error("cannot listen on {address}: {source}{}", listen_hint(.address, .source))]
    Listen {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The LDM-7 runtime cannot start.
    #[error("cannot start the LDM-7 subscriber threads: {0}")]
    Runtime(#[source] std::io::Error),
    /// The server cannot become the user it is to run as.
    #[error("cannot run as user {user}: {why}")]
    User {
        /// The user.
        user: String,
        /// Why.
        why: String,
    },
    /// The stop signal cannot be made (the process is out of file descriptors).
    #[error("cannot make the stop signal: {0}: raise the open-files limit (ulimit -n)")]
    Stop(#[source] std::io::Error),
    /// The state directory cannot be used.
    #[error("cannot use the state directory {path}: {source}")]
    StateDir {
        /// The directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// What to do about a failed listen: ports below 1024 need root (or `CAP_NET_BIND_SERVICE`) only
/// when that is why the port was refused; a taken port needs another.
fn listen_hint(address: &SocketAddr, error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::PermissionDenied if address.port() < 1024 => {
            " (ports below 1024 need root: run as root or choose a port of 1024 or more with --port)"
        }
        std::io::ErrorKind::AddrInUse => " (another process listens there: stop it or choose another --port)",
        _ => "",
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    /// The REQUEST downstreams, changed by a reload.
    requests: Mutex<Requests>,
    children: Option<Children>,
    /// The RECEIVE subscribers' runtime, their stop signal and their tasks.
    subscribers: Option<Subscribers>,
    /// The Prometheus endpoint.
    metrics: Option<ldm7_prometheus::Endpoint>,
}

/// Whether a running server is well: its accept loop runs and it is not stopping (what the
/// service manager's watchdog is told).
#[derive(Clone)]
pub struct Health(Arc<Shared>);

impl std::fmt::Debug for Health {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Health").field("alive", &self.is_alive()).finish()
    }
}

impl Health {
    /// Whether the server accepts connections and is not stopping.
    pub fn is_alive(&self) -> bool {
        self.0.accepting.load(Ordering::Relaxed) && !self.0.is_stopping()
    }
}

impl Server {
    /// Its health, for a watchdog.
    pub fn health(&self) -> Health {
        Health(self.shared.clone())
    }

    /// Loads the configuration, opens the queue, listens, starts the REQUEST downstreams and
    /// the EXEC children.
    pub fn start(options: ServerOptions) -> Result<Self, ServerError> {
        let config = Config::load(&options.config_path)?;
        let queue = Queue::open(&options.queue_path)
            .map_err(|source| ServerError::Queue { path: options.queue_path.display().to_string(), source })?;
        std::fs::create_dir_all(&options.state_dir)
            .map_err(|source| ServerError::StateDir { path: options.state_dir.display().to_string(), source })?;
        let listener =
            listen(options.listen).map_err(|source| ServerError::Listen { address: options.listen, source })?;
        let local_addr =
            listener.local_addr().map_err(|source| ServerError::Listen { address: options.listen, source })?;
        listener.set_nonblocking(true).map_err(|source| ServerError::Listen { address: options.listen, source })?;
        let mut listeners = vec![listener];
        for ip in &options.also_listen {
            // The port the first one took (a port 0 is chosen once for all).
            let address = SocketAddr::new(*ip, local_addr.port());
            let more = listen(address).map_err(|source| ServerError::Listen { address, source })?;
            more.set_nonblocking(true).map_err(|source| ServerError::Listen { address, source })?;
            listeners.push(more);
        }
        if let Some(user) = &options.run_as {
            run_as(user)?;
        }
        let queue = Arc::new(queue);
        let multicaster = Arc::new(Multicaster::new(
            queue.clone(),
            options.state_dir.clone(),
            options.settings.clone(),
            local_addr.port(),
        ));
        let stats_name = options.stats_name.clone().unwrap_or_else(|| {
            let host =
                hostname::get().ok().and_then(|name| name.into_string().ok()).unwrap_or_else(|| "localhost".into());
            crate::stats::node_name(&host, local_addr.port())
        });
        let shared = Arc::new(Shared {
            stats: Arc::new(crate::stats::StatsPublisher::new(stats_name)),
            options,
            queue,
            multicaster,
            subscriber_counters: Mutex::new(Vec::new()),
            config: RwLock::new(Arc::new(config)),
            stop: Stop::new().map_err(ServerError::Stop)?,
            counters: Counters::default(),
            host_connections: Arc::default(),
            feeders: Arc::default(),
            active_connections: AtomicUsize::new(0),
            accepting: AtomicBool::new(true),
            session_ids: AtomicU32::new(0),
        });
        let more: String = shared
            .options
            .also_listen
            .iter()
            .map(|ip| format!(", {}", SocketAddr::new(*ip, local_addr.port())))
            .collect();
        tracing::info!("Starting Up (ldm7 {}), listening on {local_addr}{more}", env!("CARGO_PKG_VERSION"));
        let mut threads = Vec::new();
        let acceptor = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("accept".into())
                .spawn(move || {
                    // Cleared however the loop ends: the watchdog stops answering for the server.
                    struct Accepting(Arc<Shared>);
                    impl Drop for Accepting {
                        fn drop(&mut self) {
                            self.0.accepting.store(false, Ordering::Relaxed);
                        }
                    }
                    let accepting = Accepting(acceptor.clone());
                    accept_loop(&accepting.0, &listeners);
                })
                .expect("spawn"),
        );
        let publisher = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("statistics".into())
                .spawn(move || publish_statistics(&publisher))
                .expect("spawn"),
        );
        let config = shared.config();
        // The EXEC children first, as the reference does: a pqact without a position starts at
        // the products that arrive after it, and the REQUESTs bring the first ones.
        let exec = &shared.options.settings.exec;
        let restart = exec.restart.then_some(Restart { max: exec.restart_max });
        let started = ldm7_types::Timestamp::from_system_time(std::time::SystemTime::now());
        let children = Children::start(exec_programs(&config, &shared.options, shared.queue.path(), started), restart)
            .map_err(ServerError::Stop)?;
        let mut running = Vec::new();
        for request in requests(&config, local_addr.port()) {
            running.push(RunningRequest::start(&shared, request).map_err(ServerError::Stop)?);
        }
        let subscribers = start_subscribers(&shared, &config, local_addr.port())?;
        let metrics = match shared.options.metrics_listen {
            Some(listen) => Some(
                crate::prometheus::start(shared.clone(), listen)
                    .map_err(|source| ServerError::Listen { address: listen, source })?,
            ),
            None => None,
        };
        let requests = Mutex::new(Requests { running, ending: Vec::new() });
        Ok(Self { shared, local_addr, threads, requests, children: Some(children), subscribers, metrics })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the threads share (counters).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Re-reads the whole configuration: new connections see the new ALLOW/ACCEPT entries at
    /// once; REQUESTs removed end (saving their resume points) and REQUESTs added start, each
    /// change logged; EXEC, MULTICAST and RECEIVE changes are logged as taking effect at the
    /// next start. A configuration that does not load changes nothing.
    pub fn reload(&self) -> Result<(), ServerError> {
        let config = Config::load(&self.shared.options.config_path)?;
        let previous = self.shared.config();
        let wanted = requests(&config, self.local_addr.port());
        for (what, before, after) in [
            ("EXEC", format!("{:?}", previous.execs), format!("{:?}", config.execs)),
            ("MULTICAST", format!("{:?}", previous.multicasts), format!("{:?}", config.multicasts)),
            ("RECEIVE", format!("{:?}", previous.receives), format!("{:?}", config.receives)),
        ] {
            if before != after {
                tracing::warn!("{what} entries changed: they take effect when the server starts again");
            }
        }
        *self.shared.config.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
        self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner).reload(&self.shared, wanted);
        tracing::info!("Configuration reloaded from {}", self.shared.options.config_path.display());
        Ok(())
    }

    /// The server's product queue (one process opens a queue once: share this one).
    pub fn queue(&self) -> Arc<Queue> {
        self.shared.queue.clone()
    }

    /// Where the Prometheus metrics are served, if they are.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|endpoint| endpoint.address)
    }

    /// Stops: no new connections, sessions end after their current product, downstreams save
    /// their resume points, statistics are published, EXEC children get SIGTERM.
    pub fn stop(mut self) {
        tracing::info!("Exiting");
        if let Some(metrics) = self.metrics.take() {
            metrics.stop();
        }
        // Multicasting ends first, while the subscriptions are up: receivers finish what was
        // multicast before their subscriptions end.
        self.shared.multicaster.finish();
        self.shared.stop.stop();
        // Threads waiting for the queue to change (feeding a downstream, multicasting) wake now.
        self.shared.queue.wake_waiters();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        // The connections' threads end their sessions: a subscription's end gives its address
        // back and removes its path leg, which a process exiting midway would leave half done.
        let waited = std::time::Instant::now();
        while self.shared.active_connections.load(Ordering::Relaxed) > 0 && waited.elapsed() < CONNECTIONS_STOP_WAIT {
            std::thread::sleep(Duration::from_millis(10));
        }
        let open = self.shared.active_connections.load(Ordering::Relaxed);
        if open > 0 {
            tracing::warn!("{open} connections had not ended {} s after the stop", CONNECTIONS_STOP_WAIT.as_secs());
        }
        let requests = std::mem::take(&mut *self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        requests.stop();
        if let Some(Subscribers { runtime, stop, tasks }) = self.subscribers.take() {
            // Each subscriber ends its session and saves its resume point before the runtime
            // goes (dropping the runtime would cancel the tasks where they wait).
            let _ = stop.send(true);
            runtime.block_on(async {
                let all = join_all(tasks);
                if tokio::time::timeout(SUBSCRIBERS_STOP_WAIT, all).await.is_err() {
                    tracing::warn!(
                        "the LDM-7 subscribers did not stop within {} s; their resume points may be behind",
                        SUBSCRIBERS_STOP_WAIT.as_secs()
                    );
                }
            });
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
        self.shared.multicaster.stop();
        // The feeds' queue readers, flagged by that, wake now.
        self.shared.queue.wake_waiters();
        let heartbeat = self.shared.has_ldm7_feeds();
        self.shared.stats.publish_all(
            &self.shared.queue,
            Timestamp::from_system_time(std::time::SystemTime::now()),
            heartbeat,
        );
        if let Some(children) = self.children.take() {
            children.stop();
        }
    }
}

/// Publishes each minute's statistics shortly after it ends, until the server stops.
fn publish_statistics(shared: &Shared) {
    while !shared.is_stopping() {
        let heartbeat = shared.has_ldm7_feeds();
        shared.stats.publish_due(&shared.queue, Timestamp::from_system_time(std::time::SystemTime::now()), heartbeat);
        shared.stop.wait(Duration::from_secs(1));
    }
}

/// Accepts connections until the server stops: blocked in `poll(2)` on the listening socket and
/// the stop signal together, so a stop ends it at once (the socket is non-blocking: a
/// connection another thread took first is no error).
fn accept_loop(shared: &Arc<Shared>, listeners: &[TcpListener]) {
    let per_host_max = shared.options.settings.ldm6.connections_per_host_max;
    while !shared.is_stopping() {
        let mut fds: Vec<PollFd<'_>> = listeners
            .iter()
            .map(|listener| PollFd::new(listener.as_fd(), PollFlags::POLLIN))
            .chain([PollFd::new(shared.stop.as_fd(), PollFlags::POLLIN)])
            .collect();
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(error) => {
                tracing::warn!("waiting for connections: {error}");
                shared.sleep(Duration::from_millis(100));
                continue;
            }
        }
        if shared.is_stopping() {
            break;
        }
        let ready: Vec<bool> =
            fds.iter().map(|fd| fd.revents().is_some_and(|events| events.contains(PollFlags::POLLIN))).collect();
        drop(fds);
        for (listener, _) in listeners.iter().zip(ready).filter(|(_, ready)| *ready) {
            accept_one(shared, listener, per_host_max);
        }
    }
}

/// Takes one connection from a listener that polled readable (none: another thread took it).
fn accept_one(shared: &Arc<Shared>, listener: &TcpListener, per_host_max: usize) {
    match listener.accept() {
        Ok((stream, address)) => {
            // An IPv4 peer of a dual-stack listener by its IPv4 address.
            let address = SocketAddr::new(ldm7_config::hosts::peer_address(address.ip()), address.port());
            let _ = stream.set_nonblocking(false);
            shared.counters.connections.fetch_add(1, Ordering::Relaxed);
            let active = shared.active_connections.fetch_add(1, Ordering::Relaxed);
            if active >= shared.options.max_clients {
                shared.active_connections.fetch_sub(1, Ordering::Relaxed);
                shared.counters.refusals.refuse(ConnectionRefusal::Busy, || {
                    format!("refusing {address}: {active} connections already (the limit; raise --max-clients)")
                });
                return;
            }
            // Before anything is spent on the connection (no thread, no name lookup).
            let slot = match shared.host_connections.acquire(address.ip(), per_host_max) {
                Ok(slot) => slot,
                Err(open) => {
                    shared.active_connections.fetch_sub(1, Ordering::Relaxed);
                    shared.counters.refusals.refuse(ConnectionRefusal::PerHost, || {
                        format!(
                            "refusing {address}: {open} connections from {} already (the limit; raise \
                             ldm6.connections_per_host_max in ldm7.toml)",
                            address.ip()
                        )
                    });
                    return;
                }
            };
            let shared = shared.clone();
            let spawned = std::thread::Builder::new().name(format!("conn {address}")).spawn(move || {
                let peer = resolve(address.ip());
                conn::serve(shared.clone(), stream, peer);
                drop(slot);
                shared.active_connections.fetch_sub(1, Ordering::Relaxed);
            });
            if let Err(error) = spawned {
                tracing::error!("cannot start a thread for {address}: {error}");
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(error) => {
            tracing::warn!("accept: {error}");
            shared.sleep(Duration::from_millis(100));
        }
    }
}

/// The REQUEST downstreams running, and those a reload removed that are still ending.
#[derive(Debug, Default)]
struct Requests {
    running: Vec<RunningRequest>,
    ending: Vec<RunningRequest>,
}

/// One REQUEST's thread and its stop (the server's stop, or a reload that removed it).
#[derive(Debug)]
struct RunningRequest {
    spec: RequestSpec,
    stop: Arc<Stop>,
    thread: JoinHandle<()>,
}

impl RunningRequest {
    fn start(shared: &Arc<Shared>, spec: RequestSpec) -> std::io::Result<Self> {
        let stop = Arc::new(Stop::new()?);
        let (thread_shared, thread_spec, thread_stop) = (shared.clone(), spec.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("request {}", spec.host))
            .spawn(move || request::run(thread_shared, thread_spec, thread_stop))?;
        Ok(Self { spec, stop, thread })
    }

    /// What tells two REQUESTs apart: upstream, class and mode.
    fn key(spec: &RequestSpec) -> String {
        format!("{} {} {:?}", spec.address(), spec.class, spec.mode)
    }
}

impl Requests {
    /// Ends the REQUESTs not `wanted` any more and starts the new ones, logging each. Those
    /// ending are not waited for here (one may be connecting for up to 30 s): the stop joins
    /// them.
    fn reload(&mut self, shared: &Arc<Shared>, wanted: Vec<RequestSpec>) {
        let wanted_keys: Vec<String> = wanted.iter().map(RunningRequest::key).collect();
        let (kept, removed): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|running| wanted_keys.contains(&RunningRequest::key(&running.spec)));
        for running in removed {
            tracing::info!("REQUEST removed: {}", RunningRequest::key(&running.spec));
            running.stop.stop();
            self.ending.push(running);
        }
        self.running = kept;
        for spec in wanted {
            let key = RunningRequest::key(&spec);
            if self.running.iter().any(|running| RunningRequest::key(&running.spec) == key) {
                continue;
            }
            match RunningRequest::start(shared, spec) {
                Ok(running) => {
                    tracing::info!("REQUEST added: {key}");
                    self.running.push(running);
                }
                Err(error) => tracing::error!("REQUEST {key}: cannot start it: {error}"),
            }
        }
        self.ending.retain(|running| !running.thread.is_finished());
    }

    /// Stops every REQUEST and waits for each (each saves its resume point).
    fn stop(self) {
        let all: Vec<RunningRequest> = self.running.into_iter().chain(self.ending).collect();
        for running in &all {
            running.stop.stop();
        }
        for running in all {
            let _ = running.thread.join();
        }
    }
}

/// The REQUEST entries as downstream runs; the first of a feed/pattern is primary.
fn requests(config: &Config, default_port: u16) -> Vec<RequestSpec> {
    config
        .requests
        .iter()
        .map(|entry| RequestSpec {
            class: entry.class(),
            host: entry.host.clone(),
            port: entry.port.unwrap_or(default_port),
            mode: if entry.primary { FeedMode::Primary } else { FeedMode::Alternate },
        })
        .collect()
}

/// How long a stopping server waits for its connections' threads to end their sessions (each
/// is woken by the stop at once; a session ends after the product it is sending).
const CONNECTIONS_STOP_WAIT: Duration = Duration::from_secs(2);

/// How long a stopping server waits for its LDM-7 subscribers to end their sessions.
const SUBSCRIBERS_STOP_WAIT: Duration = Duration::from_secs(10);

/// The RECEIVE subscribers: one task each on a runtime of their own.
#[derive(Debug)]
struct Subscribers {
    runtime: tokio::runtime::Runtime,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Waits for every task.
async fn join_all(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        let _ = task.await;
    }
}

/// One task per RECEIVE entry on a runtime of their own.
fn start_subscribers(
    shared: &Arc<Shared>,
    config: &Config,
    server_port: u16,
) -> Result<Option<Subscribers>, ServerError> {
    if config.receives.is_empty() {
        return Ok(None);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ldm7-receive")
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::with_capacity(config.receives.len());
    for receive in &config.receives {
        let context = SubscriberContext {
            queue: shared.queue.clone(),
            state_dir: shared.options.state_dir.clone(),
            server_port,
            stop: stop_rx.clone(),
            stats: shared.stats.clone(),
        };
        let settings = shared.options.settings.receive(receive.feedtype).clone();
        let counters = Arc::new(SubscriberCounters::default());
        shared
            .subscriber_counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((format!("{} {}", receive.host, receive.feedtype), counters.clone()));
        tasks.push(runtime.spawn(downstream7::run(context, receive.clone(), settings, counters)));
    }
    Ok(Some(Subscribers { runtime, stop, tasks }))
}

/// The classic LDM programs this executable is when called by their names (`pqact`,
/// `pqinsert`, …): an EXEC of one of them that is not on `PATH` runs this executable under that
/// name, so `EXEC "pqact etc/pqact.conf"` works with nothing but `ldm7` installed.
const OWN_PROGRAMS: [&str; 11] =
    ["pqact", "pqinsert", "pqcat", "notifyme", "ldmsend", "pqcreate", "pqmon", "pqcheck", "ldmd", "rtstats", "scour"];

/// The EXEC entries' programs, each started with `LDM7_QUEUE` set to the server's queue (so a
/// `pqact` or `pqinsert` without `-q` uses it, as the reference's read its queue from the
/// registry) and `LDM7_SERVER_STARTED` to the server's start (Unix microseconds: a pqact with no
/// position starts there, not missing what the REQUESTs brought while it was starting) and,
/// when the server logs to a file, `LDM7_LOG_FILE` to it; watched, their exits logged,
/// restarted as `[exec]` says (`ldm7_io::children`).
fn exec_programs(
    config: &Config,
    options: &ServerOptions,
    queue: &std::path::Path,
    started: ldm7_types::Timestamp,
) -> Vec<ChildProgram> {
    // `[rtstats] hosts`: an rtstats sender for each, as an `EXEC "rtstats -h HOST"` would be.
    let rtstats = options
        .settings
        .site
        .iter()
        .flat_map(|site| &site.rtstats_hosts)
        .map(|host| vec!["rtstats".to_owned(), "-h".to_owned(), host.clone()]);
    config
        .execs
        .iter()
        .map(|exec| exec.argv.clone())
        .chain(rtstats)
        .filter(|argv| !argv.is_empty())
        .map(|argv| {
            let queue = queue.to_path_buf();
            let log_file = options.log_file.clone();
            ChildProgram {
                name: format!("{argv:?}"),
                // A process group of its own: the stop's SIGTERM reaches what a script started.
                spawn: Box::new(move || {
                    use std::os::unix::process::CommandExt;
                    let mut command = exec_command(&argv[0]);
                    command
                        .args(&argv[1..])
                        .env("LDM7_QUEUE", &queue)
                        .env("LDM7_SERVER_STARTED", started.as_unix_micros().to_string())
                        // Its children stop when their parent is no longer this process.
                        .env("LDM7_SERVER_PID", std::process::id().to_string());
                    if let Some(file) = &log_file {
                        command.env("LDM7_LOG_FILE", file);
                    }
                    command.process_group(0).spawn()
                }),
            }
        })
        .collect()
}

fn exec_command(program: &str) -> Command {
    use std::os::unix::process::CommandExt;
    if OWN_PROGRAMS.contains(&program)
        && !on_path(program)
        && let Ok(exe) = std::env::current_exe()
    {
        let mut command = Command::new(exe);
        command.arg0(program);
        return command;
    }
    Command::new(program)
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Becomes `user` (its group and supplementary groups, then its user id), for good: a server
/// started as root to bind port 388 gives root up before it reads a byte from the network.
fn run_as(user: &str) -> Result<(), ServerError> {
    use nix::unistd::{Uid, User, initgroups, setgid, setuid};
    let failed = |why: String| ServerError::User { user: user.to_owned(), why };
    let account = User::from_name(user)
        .map_err(|error| failed(error.to_string()))?
        .ok_or_else(|| failed("no such user (create it, or remove --user / [server] user)".into()))?;
    if Uid::effective() == account.uid {
        return Ok(());
    }
    if !Uid::effective().is_root() {
        return Err(failed("only root can change users: start the server as root, or as that user".into()));
    }
    let name = std::ffi::CString::new(user).map_err(|_| failed("a NUL byte in the name".into()))?;
    initgroups(&name, account.gid).map_err(|error| failed(format!("initgroups: {error}")))?;
    setgid(account.gid).map_err(|error| failed(format!("setgid: {error}")))?;
    setuid(account.uid).map_err(|error| failed(format!("setuid: {error}")))?;
    if setuid(Uid::from_raw(0)).is_ok() {
        return Err(failed("root could be regained after setuid".into()));
    }
    tracing::info!("Running as user {user} (uid {}, gid {})", account.uid, account.gid);
    Ok(())
}

/// A listening socket on `address`. On `[::]` it is dual-stack (IPv4 peers come as IPv4-mapped
/// addresses and are matched by their IPv4 address); where the kernel has no IPv6, `[::]`
/// falls back to `0.0.0.0` with a warning.
fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let open = |address: SocketAddr| -> std::io::Result<TcpListener> {
        let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
        if address.is_ipv6() && address.ip().is_unspecified() {
            socket.set_only_v6(false)?;
        }
        socket.set_reuse_address(true)?;
        socket.bind(&address.into())?;
        socket.listen(1024)?;
        Ok(socket.into())
    };
    match open(address) {
        Err(error)
            if address.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                && error.raw_os_error() == Some(nix::libc::EAFNOSUPPORT) =>
        {
            let v4 = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), address.port());
            tracing::warn!("this host has no IPv6 ({error}): listening on {v4} only");
            open(v4)
        }
        other => other,
    }
}

/// The peer at `ip` with its name looked up (reverse DNS; a failure leaves it nameless); an
/// IPv4-mapped address is taken as the IPv4 address it maps.
fn resolve(ip: std::net::IpAddr) -> PeerHost {
    let ip = ldm7_config::hosts::peer_address(ip);
    let name = dns_lookup::lookup_addr(&ip).ok().filter(|name| name.parse::<std::net::IpAddr>().is_err());
    PeerHost { ip, name }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen_error(address: SocketAddr, source: std::io::Error) -> String {
        ServerError::Listen { address, source }.to_string()
    }

    #[test]
    fn the_root_hint_is_only_for_a_refused_low_port() {
        let denied = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let low = listen_error("0.0.0.0:388".parse().unwrap(), denied());
        assert!(low.contains("ports below 1024 need root"), "{low}");
        let high = listen_error("0.0.0.0:38800".parse().unwrap(), denied());
        assert!(!high.contains("1024"), "{high}");
        let other = listen_error("0.0.0.0:388".parse().unwrap(), std::io::Error::other("no such address"));
        assert!(!other.contains("1024"), "{other}");
        // A port taken by another listener: a real bind.
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap();
        let error = TcpListener::bind(address).unwrap_err();
        let text = listen_error(address, error);
        assert!(text.contains("another process listens there") && !text.contains("1024"), "{text}");
    }
}
