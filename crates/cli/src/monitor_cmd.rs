//! `ldm7 monitor`: the statistics of LDM-7 servers (and LDM 6 rtstats) into a database, and the
//! JSON API over it (docs/monitoring.md).
//!
//! The distribution system carries its own statistics: with `--upstream HOST[:PORT]` (any
//! number) the monitor runs an LDM server of its own whose only entries are
//! `REQUEST EXP "^(ldm7-stats/|rtstats-)" HOST[:PORT]`, into the monitor's queue; the monitor
//! follows that queue (as `ldm7 act` does) and stores each statistics product once. Without
//! upstreams it follows `--queue` — e.g. the queue of the server it runs beside.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use ldm7_monitor::{IngestCounters, Store};
use ldm7_pq::{Capacity, Queue};
use ldm7_server::{Server, ServerOptions};
use ldm7_types::Timestamp;

use crate::exit::{CmdResult, bad_input, input, runtime};

/// Arguments of `ldm7 monitor`.
#[derive(clap::Args, Debug)]
pub struct MonitorArgs {
    /// The database: sqlite:PATH (created if absent) or postgres://USER@HOST/DB.
    #[arg(long, value_name = "URL", default_value = "sqlite:monitor.db")]
    pub db: String,
    /// Where to serve the API (and the dashboard).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8388")]
    pub listen: SocketAddr,
    /// An LDM server to request statistics from, HOST[:PORT] (repeat for more).
    #[arg(long = "upstream", value_name = "HOST[:PORT]")]
    pub upstreams: Vec<String>,
    /// The queue statistics products arrive in [default: monitor.pq in --state-dir, created
    /// if absent].
    #[arg(short = 'q', long = "queue", value_name = "PATH")]
    pub queue: Option<PathBuf>,
    /// Directory for the monitor's queue, its server's configuration and resume points.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub state_dir: PathBuf,
    /// Where nodes are on the map (TOML: [[node]] name, latitude, longitude).
    #[arg(long, value_name = "FILE")]
    pub nodes: Option<PathBuf>,
}

/// Runs the monitor until SIGTERM or SIGINT.
pub fn run(args: &MonitorArgs) -> CmdResult {
    let places = match &args.nodes {
        Some(path) => ldm7_monitor::nodes::read(path).map_err(bad_input)?,
        None => Vec::new(),
    };
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("create {}", args.state_dir.display()))
        .map_err(input)?;
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(runtime)?;
    let store = tokio.block_on(Store::open(&args.db)).map_err(|error| match error {
        ldm7_monitor::StoreError::Url(_) => bad_input(error),
        other => runtime(other),
    })?;
    for place in &places {
        tokio.block_on(store.set_location(&place.name, place.latitude, place.longitude)).map_err(runtime)?;
    }
    let queue_path = match &args.queue {
        Some(path) => path.clone(),
        None => {
            let path = args.state_dir.join("monitor.pq");
            if !path.exists() {
                Queue::create(&path, Capacity { bytes: 100_000_000, slots: 20_000 }, false).map_err(runtime)?;
            }
            path
        }
    };
    let server = if args.upstreams.is_empty() { None } else { Some(start_server(args, &queue_path)?) };
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone()).map_err(runtime)?;
    }
    let counters = Arc::new(IngestCounters::default());
    let ingester = {
        let (store, counters, stop, handle) = (store.clone(), counters.clone(), stop.clone(), tokio.handle().clone());
        let queue = match &server {
            Some(server) => server.queue(),
            None => Arc::new(crate::common::open_queue(&queue_path)?),
        };
        std::thread::Builder::new()
            .name("ingest".into())
            .spawn(move || follow(&queue, &store, &counters, &stop, &handle))
            .map_err(runtime)?
    };
    let listener = tokio
        .block_on(tokio::net::TcpListener::bind(args.listen))
        .map_err(|error| input(anyhow::anyhow!("cannot listen on {}: {error}", args.listen)))?;
    let address = listener.local_addr().map_err(runtime)?;
    tracing::info!("monitor: API at http://{address}/api/nodes, database {}", args.db);
    eprintln!("monitor: http://{address}/ (API: /api/nodes, /api/links, /api/series)");
    let served = {
        let stop = stop.clone();
        tokio.block_on(async move {
            let shutdown = async move {
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            axum::serve(listener, ldm7_monitor::api::router(store)).with_graceful_shutdown(shutdown).await
        })
    };
    stop.store(true, Ordering::Relaxed);
    let _ = ingester.join();
    if let Some(server) = server {
        server.stop();
    }
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    tracing::info!(
        "monitor: {} statistics products stored ({} refused, {} seen before), {} rtstats ({} refused)",
        load(&counters.stats),
        load(&counters.stats_bad),
        load(&counters.repeated),
        load(&counters.rtstats),
        load(&counters.rtstats_bad)
    );
    served.map_err(runtime)
}

/// The monitor's own LDM server: REQUESTs for the statistics of each upstream, into its queue.
fn start_server(args: &MonitorArgs, queue: &Path) -> CmdResult<Server> {
    let mut config = String::from("# Written by ldm7 monitor: the statistics of each upstream.\n");
    for upstream in &args.upstreams {
        upstream.parse::<ldm7_client::ServerAddress>().map_err(bad_input)?;
        config.push_str(&format!("REQUEST EXP \"^(ldm7-stats/|rtstats-)\" {upstream}\n"));
    }
    let config_path = args.state_dir.join("monitor-ldmd.conf");
    std::fs::write(&config_path, config).with_context(|| format!("write {}", config_path.display())).map_err(input)?;
    let mut options = ServerOptions::new(config_path, queue.to_path_buf(), "127.0.0.1:0".parse().expect("an address"));
    options.state_dir = args.state_dir.clone();
    options.retry_max = Duration::from_secs(30);
    options.stats_name = Some("monitor".into());
    Server::start(options).map_err(runtime)
}

/// Follows the queue from its oldest product, storing every statistics product.
fn follow(
    queue: &Queue,
    store: &Store,
    counters: &IngestCounters,
    stop: &AtomicBool,
    runtime: &tokio::runtime::Handle,
) {
    let mut follower = queue.follow(Timestamp::ZERO);
    while !stop.load(Ordering::Relaxed) {
        let next = follower.next_with(Some(Duration::from_millis(200)), |product| {
            let ident = &product.info.ident;
            let wanted =
                ldm7_metrics::StatsProduct::is_stats_ident(ident) || ldm7_metrics::RtStats::is_rtstats_ident(ident);
            wanted.then(|| {
                (product.info.signature.to_string(), ident.clone(), product.data.to_vec(), product.info.arrival.secs)
            })
        });
        match next {
            Ok(Some(Some((signature, ident, data, arrival)))) => {
                let stored =
                    runtime.block_on(ldm7_monitor::ingest(store, counters, &signature, &ident, &data, arrival));
                if let Err(error) = stored {
                    tracing::error!("monitor: cannot store {ident}: {error}");
                }
            }
            Ok(_) => {}
            Err(error) => {
                tracing::error!("monitor: the queue: {error}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}
