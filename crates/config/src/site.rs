//! The site's settings in `ldm7.toml`: what Unidata LDM keeps in its registry (`registry.xml`,
//! ldm-formats.md §6) and `ldmadmin` reads — where the queue, the configuration files, the log
//! and the data live, the server's port and limits, the checks' thresholds. `ldm7 admin`
//! builds the server's command line from them; the programs it starts (EXEC children such as
//! `pqact` and `scour`) take their defaults from them through `LDM7_SETTINGS`.
//!
//! ```toml
//! home = "/var/lib/ldm7"          # LDMHOME: relative paths below are under it [default: the
//!                                 # parent of the directory holding this file, as LDM's
//!                                 # $LDMHOME/etc/registry.xml]
//! [queue]
//! path = "var/queues/ldm.pq"      # /queue/path
//! size = "500M"                   # /queue/size
//! slots = "default"               # /queue/slots: a number, or "default" (from the size)
//!
//! [server]
//! config = "etc/ldmd.conf"        # /server/config-path
//! listen = "::"                   # /server/ip-addr ("::": IPv6 and IPv4)
//! port = 388                      # /server/port
//! max_clients = 256               # /server/max-clients
//! max_latency = "3600s"           # /server/max-latency
//! time_offset = "3600s"           # /server/time-offset
//! hostname = "idd.example.edu"    # /hostname: the name in statistics [default: the host's]
//! state_dir = "."                 # the REQUESTs' `.<md5>.info` resume files (LDM: LDMHOME)
//! pid_file = "ldmd.pid"           # written by `ldm7 admin start`
//! user = "ldm"                    # run as this user after binding the port (root only)
//! metrics = "127.0.0.1:9388"      # serve Prometheus metrics here [default: none]
//!
//! [log]
//! file = "var/logs/ldmd.log"      # /log/file
//! count = 7                       # /log/count: old files `ldm7 admin newlog` keeps
//! rotate = true                   # /log/rotate: `ldm7 admin start` rotates first
//!
//! [pqact]
//! config = "etc/pqact.conf"       # /pqact/config-path: pqact's default configuration
//! datadir = "var/data"            # /pqact/datadir-path: relative FILE paths are under it
//!
//! [scour]
//! config = "etc/scour.conf"       # /scour/config-path
//!
//! [check]
//! time_servers = ["pool.ntp.org"] # /check-time: SNTP servers asked by `check` ([] = off)
//! time_limit = "10s"              # /check-time/limit: the clock may be off by this much
//! insertion_interval = "300s"     # /insertion-check-interval: newest product at most this old
//!
//! [rtstats]
//! hosts = ["rtstats.unidata.ucar.edu"]   # the server runs `rtstats -h HOST` for each, as an
//!                                 # `EXEC "rtstats -h HOST"` entry would [default: none]
//! ```

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ldm7_types::units::{ByteSize, parse_duration};
use serde::Deserialize;

/// The site's settings, every path absolute (resolved against `home`).
#[derive(Clone, Debug, PartialEq)]
pub struct SiteSettings {
    /// LDMHOME.
    pub home: PathBuf,
    /// The product queue.
    pub queue: QueueSite,
    /// The server.
    pub server: ServerSite,
    /// The server's log.
    pub log: LogSite,
    /// pqact's defaults.
    pub pqact: PqactSite,
    /// scour's configuration.
    pub scour_config: PathBuf,
    /// What `ldm7 admin check` checks.
    pub check: CheckSite,
    /// The hosts the server sends rtstats reports to (beside EXEC "rtstats" entries).
    pub rtstats_hosts: Vec<String>,
}

/// `[queue]`.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSite {
    /// The queue.
    pub path: PathBuf,
    /// Its size.
    pub size: ByteSize,
    /// Its product slots (`None`: from the size, `ldm7 queue create`'s default).
    pub slots: Option<u64>,
}

/// `[server]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerSite {
    /// ldmd.conf.
    pub config: PathBuf,
    /// Address to listen on.
    pub listen: IpAddr,
    /// TCP port.
    pub port: u16,
    /// Most connections at once.
    pub max_clients: u32,
    /// Older products are ignored.
    pub max_latency: Duration,
    /// How far back a fresh REQUEST asks.
    pub time_offset: Duration,
    /// The name in statistics (`None`: the host's).
    pub hostname: Option<String>,
    /// Where the REQUESTs' resume files are.
    pub state_dir: PathBuf,
    /// The running server's process id.
    pub pid_file: PathBuf,
    /// The user to run as after binding (`None`: stay).
    pub user: Option<String>,
    /// Where Prometheus metrics are served.
    pub metrics: Option<std::net::SocketAddr>,
}

/// `[log]`.
#[derive(Clone, Debug, PartialEq)]
pub struct LogSite {
    /// The server's log file.
    pub file: PathBuf,
    /// Old files kept by `newlog`.
    pub count: u32,
    /// Whether `start` rotates the log first.
    pub rotate: bool,
}

/// `[pqact]`.
#[derive(Clone, Debug, PartialEq)]
pub struct PqactSite {
    /// pqact's default configuration file.
    pub config: PathBuf,
    /// pqact's default data directory.
    pub datadir: PathBuf,
}

/// `[check]`.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckSite {
    /// SNTP servers (`host` or `host:port`); empty: the clock is not checked.
    pub time_servers: Vec<String>,
    /// Largest clock offset accepted.
    pub time_limit: Duration,
    /// Largest age of the newest product accepted.
    pub insertion_interval: Duration,
}

impl SiteSettings {
    /// The defaults (LDM's registry defaults) for a site at `home`.
    pub fn defaults(home: &Path) -> Self {
        let at = |relative: &str| home.join(relative);
        Self {
            home: home.to_owned(),
            queue: QueueSite { path: at("var/queues/ldm.pq"), size: ByteSize::from_bytes(500_000_000), slots: None },
            server: ServerSite {
                config: at("etc/ldmd.conf"),
                listen: IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                port: 388,
                max_clients: 256,
                max_latency: Duration::from_secs(3600),
                time_offset: Duration::from_secs(3600),
                hostname: None,
                state_dir: home.to_owned(),
                pid_file: at("ldmd.pid"),
                user: None,
                metrics: None,
            },
            log: LogSite { file: at("var/logs/ldmd.log"), count: 7, rotate: true },
            pqact: PqactSite { config: at("etc/pqact.conf"), datadir: at("var/data") },
            scour_config: at("etc/scour.conf"),
            check: CheckSite {
                time_servers: vec!["pool.ntp.org".into()],
                time_limit: Duration::from_secs(10),
                insertion_interval: Duration::from_secs(300),
            },
            rtstats_hosts: Vec::new(),
        }
    }

    /// The home of a settings file at `path` when it names none: the parent of its directory
    /// (`HOME/etc/ldm7.toml`), made absolute.
    pub fn default_home(path: &Path) -> PathBuf {
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let dir = absolute.parent().unwrap_or(Path::new("/"));
        dir.parent().unwrap_or(dir).to_owned()
    }
}

/// The keys as written (every one optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueueKeys {
    path: Option<PathBuf>,
    size: Option<String>,
    slots: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerKeys {
    config: Option<PathBuf>,
    listen: Option<IpAddr>,
    port: Option<u16>,
    max_clients: Option<u32>,
    max_latency: Option<String>,
    time_offset: Option<String>,
    hostname: Option<String>,
    state_dir: Option<PathBuf>,
    pid_file: Option<PathBuf>,
    user: Option<String>,
    metrics: Option<std::net::SocketAddr>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogKeys {
    file: Option<PathBuf>,
    count: Option<u32>,
    rotate: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PqactKeys {
    config: Option<PathBuf>,
    datadir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScourKeys {
    config: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckKeys {
    time_servers: Option<Vec<String>>,
    time_limit: Option<String>,
    insertion_interval: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RtstatsKeys {
    hosts: Option<Vec<String>>,
}

/// The site's sections of the file.
#[derive(Debug, Default)]
pub(crate) struct SiteKeys {
    pub home: Option<PathBuf>,
    pub queue: QueueKeys,
    pub server: ServerKeys,
    pub log: LogKeys,
    pub pqact: PqactKeys,
    pub scour: ScourKeys,
    pub check: CheckKeys,
    pub rtstats: RtstatsKeys,
}

impl SiteKeys {
    /// The typed settings; `origin` is the file (its place gives the default home); `value`
    /// makes the error of a key.
    pub(crate) fn typed(
        self,
        origin: &Path,
        value: &dyn Fn(String, String) -> crate::settings::SettingsError,
    ) -> Result<SiteSettings, crate::settings::SettingsError> {
        let home = match self.home {
            Some(home) if home.is_absolute() => home,
            Some(home) => SiteSettings::default_home(origin).join(home),
            None => SiteSettings::default_home(origin),
        };
        let mut site = SiteSettings::defaults(&home);
        // `home.join(".")` is `home` (components drop the `.`).
        let at = |path: PathBuf| {
            let joined = if path.is_absolute() { path } else { home.join(path) };
            joined.components().collect::<PathBuf>()
        };
        let duration = |key: &str, text: &str| {
            parse_duration(text).map_err(|error| value(key.into(), format!("{error}: e.g. \"3600s\" or \"1h\"")))
        };
        if let Some(path) = self.queue.path {
            site.queue.path = at(path);
        }
        if let Some(size) = self.queue.size {
            site.queue.size = size
                .parse::<ByteSize>()
                .map_err(|error| value("queue.size".into(), format!("{error}: e.g. \"500M\"")))?;
        }
        match self.queue.slots {
            None => {}
            Some(toml::Value::String(text)) if text == "default" => {}
            Some(toml::Value::Integer(slots)) if slots > 0 => site.queue.slots = Some(slots as u64),
            Some(other) => {
                return Err(value("queue.slots".into(), format!("{other}: a positive number or \"default\"")));
            }
        }
        let server = self.server;
        if let Some(config) = server.config {
            site.server.config = at(config);
        }
        if let Some(listen) = server.listen {
            site.server.listen = listen;
        }
        if let Some(port) = server.port {
            site.server.port = port;
        }
        if let Some(max) = server.max_clients {
            if max == 0 {
                return Err(value("server.max_clients".into(), "give at least 1".into()));
            }
            site.server.max_clients = max;
        }
        if let Some(text) = server.max_latency {
            site.server.max_latency = duration("server.max_latency", &text)?;
        }
        if let Some(text) = server.time_offset {
            site.server.time_offset = duration("server.time_offset", &text)?;
        }
        site.server.hostname = server.hostname;
        if let Some(dir) = server.state_dir {
            site.server.state_dir = at(dir);
        }
        if let Some(file) = server.pid_file {
            site.server.pid_file = at(file);
        }
        site.server.user = server.user;
        site.server.metrics = server.metrics;
        if let Some(file) = self.log.file {
            site.log.file = at(file);
        }
        if let Some(count) = self.log.count {
            site.log.count = count;
        }
        if let Some(rotate) = self.log.rotate {
            site.log.rotate = rotate;
        }
        if let Some(config) = self.pqact.config {
            site.pqact.config = at(config);
        }
        if let Some(datadir) = self.pqact.datadir {
            site.pqact.datadir = at(datadir);
        }
        if let Some(config) = self.scour.config {
            site.scour_config = at(config);
        }
        if let Some(servers) = self.check.time_servers {
            site.check.time_servers = servers;
        }
        if let Some(text) = self.check.time_limit {
            site.check.time_limit = duration("check.time_limit", &text)?;
        }
        if let Some(text) = self.check.insertion_interval {
            site.check.insertion_interval = duration("check.insertion_interval", &text)?;
        }
        site.rtstats_hosts = self.rtstats.hosts.unwrap_or_default();
        Ok(site)
    }
}
