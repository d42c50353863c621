//! The settings file (`ldm7.toml`, `ldm7 serve --settings FILE`): what `ldmd.conf` has no place
//! for and the reference keeps in its registry — the multicast rate, the retransmission deadline
//! policy, the path service, the subscriber's interface and limits. Every key is optional; the
//! defaults below are what a server without the file uses.
//!
//! ```toml
//! [multicast]                     # every MULTICAST feed (publisher side)
//! rate = "100 Mbit/s"             # FMTP pacing rate = the feed's path rate
//! retx_timeout = "5min"           # retransmission deadline per product (reference: 300 s)
//! deadline = "constant"           # or "proportional": max(factor × size / rate, max RTT, min)
//! deadline_factor = 50.0          # proportional only
//! deadline_min = "1s"             # proportional only
//! ttl = 1                         # multicast TTL
//! interface = "10.77.1.1"         # address of the interface to multicast from (default: the
//!                                 # MULTICAST entry's FMTP server address, else the address
//!                                 # of the interface the route to the group leaves by)
//! linger = "1min"                 # a feed keeps multicasting this long after its last
//!                                 # subscriber left (a resubscription finds it running)
//! catch_up = "1min"               # a feed started again multicasts what was inserted since
//!                                 # its last product, up to this far back (once for every
//!                                 # subscriber, instead of each one's backlog); "0s": from now
//! catch_up_wait = "1500ms"        # … after waiting up to this, from its first FMTP receiver's
//!                                 # connection, for as many as it had (keep it below the 2 s
//!                                 # after which an ldm7 subscriber takes a silent feed as quiet)
//! subscribers_max = 256           # per feed; more SUBSCRIBEs are refused
//! index_map_capacity = 1048576    # products the product-index map remembers
//! product_queue_max = 1024        # products handed to FMTP and not yet multicast
//! mac_level = 0                   # MAC of each multicast datagram: 0 none, 1 HMAC-SHA-256,
//!                                 # 2 Ed25519 (subscribers must use the same; docs/security.md)
//! identity = "publisher.key"      # sign each FMTP key exchange (`ldm7 fmtp keygen`), for
//!                                 # subscribers that pin it (ldm7 subscribers only)
//! mac_rotation = "1h"             # a new MAC key this often, handed to every subscriber over
//!                                 # its repair connection (ldm7 subscribers only; off by default)
//! parity = "auto"                 # repair by parity multicast for ldm7 subscribers, who offer it
//!                                 # when they subscribe: "auto" chooses GROUP/SHARDS from
//!                                 # subscribers_max and parity_loss (docs/parity.md), "992/32"
//!                                 # names them, "off" refuses (unicast repairs only)
//! parity_loss = 0.01              # the loss "auto" plans for (each subscriber's, independent)
//!
//! [multicast.feeds.NGRID]         # per-feed overrides of the keys above, and:
//! rate = "40 Mbit/s"
//! path = "ngrid"                  # the path's name for the path service (default: the feed name)
//!
//! [multicast.feeds.NGRID.rate_control]   # the online latency-violation monitor (off without
//!                                 # this table; in [multicast.rate_control] for every feed)
//! steps = ["20 Mbit/s", "50 Mbit/s", "100 Mbit/s"]   # path rates, ascending: the feed starts at
//!                                 # the first (its `rate`, if given, must be it); the last is
//!                                 # the ceiling
//! interval = "60s"                # how often violations are tallied and the rate decided
//! wait = "2ms"                    # W: how much longer than expected a product may take
//! alpha = 0.1                     # α: share of a subscriber's products that may violate
//! beta = 0.01                     # β: share of subscribers that may violate before a raise
//! epsilon = "2ms"                 # c of the repair-time allowance ε = RTT × rounds + c
//! lower_after = 3                 # calm intervals in a row before the rate steps down
//! enabled = true                  # false: off for this feed despite [multicast.rate_control]
//!
//! [path]                          # how legs are added to and removed from a feed's path
//! driver = "none"                 # none | linux-bridge | vde | oess
//! netns = "lab-core"              # linux-bridge: the namespace that holds the bridges
//! run_dir = "/run/ldm7-lab/lab/vde"   # vde: the run directory of the switches
//! oess_url = "https://…/oess/services-kerb"   # oess (with oess_user, oess_password_file,
//! oess_workgroup, oess_api = "circuit" | "provisioning")
//!
//! [receive]                       # every RECEIVE feed (subscriber side)
//! time_offset = "1h"              # backlog asked for when there is no previous session
//! retry_min = "1s"                # reconnection back-off (doubles) …
//! retry_max = "60s"               # … up to this
//! spool_dir = "fmtp-spool"        # products being received (relative to --state-dir)
//! in_flight_bytes_max = "600 MB"  # bound on the spool
//! rate = "100 Mbit/s"             # expected multicast rate (socket buffer, receive timer)
//! drop = 0.0                      # test knob: drop this share of multicast datagrams on receipt
//! mac_level = 0                   # the publisher's MAC level
//! pin = "publisher.key.pub"       # accept only a key exchange signed by this publisher key
//! parity = "auto"                 # offer parity repair when subscribing ("off": don't); the
//!                                 # publisher's answer decides the coding
//! receive_gap = "500ms"           # longest time the host may not read the multicast socket:
//!                                 # its buffer holds rate × this (docs/ldm7.md "Receive path")
//!
//! [receive.feeds.NGRID]           # per-feed overrides of the keys above
//! drop = 0.02
//!
//! [ldm6]                          # the LDM-6 server's bounds (docs/server.md "Bounds")
//! connections_per_host_max = 64   # connections from one address at once; more are refused
//! first_call_timeout = "120s"     # a connection that starts no session (FEEDME, NOTIFYME,
//!                                 # HIYA) within this is closed (reference: 4 × interval)
//! push_idle_timeout = "720s"      # a HIYA connection that sends nothing this long is closed
//! call_bytes_max = "64 KiB"       # longest record before a session, and from a downstream
//! one_feeder_per_host = true      # a host's FEEDME ends this server's older feed to that host
//!                                 # of the same feed (the reference's anti-DoS rule)
//!
//! [exec]                          # the EXEC entries' children (docs/server.md "EXEC")
//! restart = false                 # start a child that exited again, after a back-off doubling
//!                                 # from 1 s to restart_max (the reference does not restart)
//! restart_max = "60s"             # longest back-off; a child that ran longer resets it
//! ```
//!
//! The site's sections — `home`, `[queue]`, `[server]`, `[log]`, `[pqact]`, `[scour]`,
//! `[check]`, `[rtstats]`: LDM's registry — are in [`crate::site`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ldm7_fmtp_proto::mac::{MAC_ROTATION_MIN, MacLevel};
use ldm7_fmtp_proto::{PLANNED_LOSS_DEFAULT, ParityChoice, ParityConfig};

use ldm7_types::units::{ByteSize, Rate, parse_duration};
use ldm7_types::{FeedType, QuantityError};

/// Why the settings file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file cannot be read.
    #[error("cannot read the settings file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys.
    #[error("settings file {path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// What the TOML reader said (with the line).
        message: String,
    },
    /// A value is out of range or of the wrong kind.
    #[error("settings file {path}: {key}: {message}")]
    Value {
        /// The file.
        path: PathBuf,
        /// The key, e.g. `multicast.feeds.NGRID.rate`.
        key: String,
        /// What is wrong and what is expected.
        message: String,
    },
}

/// The reference's retransmission timeout (registry `/fmtp-retx-timeout`, ldm7-multicast.md §3.8).
pub const RETX_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);

/// How long a feed keeps multicasting after its last subscriber left, by default: a subscriber
/// that resubscribes (a restart, a MAC level being fixed) finds it running, with its product
/// index going on; the reference's sender runs on until `ldmd` stops.
pub const LINGER_DEFAULT: Duration = Duration::from_secs(60);

/// How far back a feed started again multicasts what it had not (`[multicast] catch_up`).
pub const CATCH_UP_DEFAULT: Duration = Duration::from_secs(60);

/// How long a feed started again waits, from its first FMTP receiver's connection, for the
/// others before it catches up: below `TAIL_QUIET` (2 s), after which an ldm7 subscriber that
/// got no datagram asks for the backlog up to the newest product.
pub const CATCH_UP_WAIT_DEFAULT: Duration = Duration::from_millis(1500);

/// Products a feed's product-index map remembers unless `index_map_capacity` says otherwise.
pub const INDEX_MAP_CAPACITY_DEFAULT: u32 = 1 << 20;

/// How long a product stays available for repairs (RESEARCH.md §3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Deadline {
    /// A constant per feed (the adopted form).
    Constant(Duration),
    /// `max(factor × size × 8 / rate, max RTT, min)` (the early form).
    Proportional {
        /// `f_snd`.
        factor: f64,
        /// The floor.
        min: Duration,
    },
}

/// The online latency-violation monitor of one feed (docs/planning.md, "The online monitor in
/// the publisher"); the defaults are the research's (W = 2 ms, α = 0.1, β = 0.01).
#[derive(Clone, Debug, PartialEq)]
pub struct RateControlSettings {
    /// The path rates, ascending: the first is where the feed starts and the floor, the last
    /// the ceiling.
    pub steps: Vec<Rate>,
    /// How often violations are tallied and the rate decided.
    pub interval: Duration,
    /// `W`.
    pub wait: Duration,
    /// `α`.
    pub alpha: f64,
    /// `β`.
    pub beta: f64,
    /// `c` of `ε = RTT × rounds + c`.
    pub epsilon: Duration,
    /// Calm intervals in a row before the rate steps down.
    pub lower_after: u32,
}

/// The default interval of the monitor.
pub const RATE_CONTROL_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

impl RateControlSettings {
    /// The research's monitor over `steps`, deciding every minute.
    pub fn research(steps: Vec<Rate>) -> Self {
        let defaults = ldm7_plan::violation::MonitorConfig::research(Vec::new());
        Self {
            steps,
            interval: RATE_CONTROL_INTERVAL_DEFAULT,
            wait: Duration::from_secs_f64(defaults.wait_max_s),
            alpha: defaults.alpha,
            beta: defaults.beta,
            epsilon: Duration::from_secs_f64(defaults.epsilon_s),
            lower_after: defaults.lower_after,
        }
    }

    /// The monitor's configuration.
    pub fn monitor_config(&self) -> ldm7_plan::violation::MonitorConfig {
        ldm7_plan::violation::MonitorConfig {
            wait_max_s: self.wait.as_secs_f64(),
            alpha: self.alpha,
            beta: self.beta,
            epsilon_s: self.epsilon.as_secs_f64(),
            rate_steps_bps: self.steps.iter().map(|rate| rate.bits_per_s() as f64).collect(),
            lower_after: self.lower_after,
        }
    }
}

/// Publisher settings of one multicast feed.
#[derive(Clone, Debug, PartialEq)]
pub struct MulticastSettings {
    /// FMTP pacing rate (the path rate).
    pub rate: Rate,
    /// Retransmission deadline policy.
    pub deadline: Deadline,
    /// Multicast TTL.
    pub ttl: u32,
    /// The interface to multicast from, by address (`None`: from the MULTICAST entry).
    pub interface: Option<std::net::IpAddr>,
    /// How long the feed keeps multicasting after its last subscriber left.
    pub linger: Duration,
    /// A feed started again multicasts the products inserted since its last one, up to this
    /// far back (zero: from now).
    pub catch_up: Duration,
    /// How long it waits first, from its first FMTP receiver's connection, for as many as it
    /// had.
    pub catch_up_wait: Duration,
    /// Bound: subscribers of the feed at once.
    pub subscribers_max: usize,
    /// Products the product-index map remembers.
    pub index_map_capacity: u32,
    /// Bound: products handed to FMTP and not yet multicast.
    pub product_queue_max: usize,
    /// The path's name for the path service (`None`: the feed's name).
    pub path: Option<String>,
    /// The online monitor stepping the path rate (`None`: off, the rate stays `rate`).
    pub rate_control: Option<RateControlSettings>,
    /// MAC of each multicast datagram (subscribers must use the same level).
    pub mac_level: MacLevel,
    /// The publisher identity signing each FMTP key exchange (a PKCS#8 PEM Ed25519 key file).
    pub identity: Option<PathBuf>,
    /// A new MAC key this often (`None`: one key for the sender's life).
    pub mac_rotation: Option<Duration>,
    /// At MAC level 2, sign digest lists while every subscriber of the feed is ldm7 (`true`,
    /// `mac_signing = "auto"`, the default) or each datagram always (`"datagram"`, the
    /// reference's way).
    pub mac_lists: bool,
    /// Repair by parity multicast for ldm7 subscribers that offer it (an ldm7 extension).
    pub parity: ParityChoice,
    /// The loss [`ParityChoice::Auto`] plans for.
    pub parity_loss: f64,
}

impl MulticastSettings {
    /// The feed's parity coding: the choice, `auto` planned for `subscribers_max` subscribers at
    /// `parity_loss`.
    pub fn parity_config(&self) -> Option<ParityConfig> {
        self.parity.resolve(u32::try_from(self.subscribers_max).unwrap_or(u32::MAX), self.parity_loss)
    }
}

impl Default for MulticastSettings {
    fn default() -> Self {
        Self {
            rate: Rate::from_megabits_per_s(100),
            deadline: Deadline::Constant(RETX_TIMEOUT_DEFAULT),
            ttl: 1,
            interface: None,
            linger: LINGER_DEFAULT,
            catch_up: CATCH_UP_DEFAULT,
            catch_up_wait: CATCH_UP_WAIT_DEFAULT,
            subscribers_max: 256,
            index_map_capacity: INDEX_MAP_CAPACITY_DEFAULT,
            product_queue_max: 1024,
            path: None,
            rate_control: None,
            mac_level: MacLevel::None,
            identity: None,
            mac_rotation: None,
            mac_lists: true,
            parity: ParityChoice::Auto,
            parity_loss: PLANNED_LOSS_DEFAULT,
        }
    }
}

/// Which path service adds and removes legs.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum PathSettings {
    /// None: the path is static or not needed (loopback, a campus LAN).
    #[default]
    None,
    /// One Linux bridge per feed in a namespace (`ldm7 lab`).
    LinuxBridge {
        /// The namespace holding the bridges (`None`: this one).
        netns: Option<String>,
    },
    /// One `vde_switch` per feed.
    Vde {
        /// The switches' run directory.
        run_dir: PathBuf,
    },
    /// Internet2 AL2S through OESS.
    Oess {
        /// The services URL.
        url: String,
        /// HTTP Basic user.
        user: String,
        /// File holding the password (not the password itself).
        password_file: PathBuf,
        /// The workgroup owning the circuits.
        workgroup: u64,
        /// `circuit` (current) or `provisioning` (deprecated, as LDM 7 used).
        api: String,
    },
}

/// Subscriber settings of one received feed.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceiveSettings {
    /// Backlog asked for when there is no previous session.
    pub time_offset: Duration,
    /// First reconnection delay.
    pub retry_min: Duration,
    /// Longest reconnection delay.
    pub retry_max: Duration,
    /// Where products being received are spooled (relative: to the state directory).
    pub spool_dir: PathBuf,
    /// Bound: bytes of products being received.
    pub in_flight_bytes_max: ByteSize,
    /// Expected multicast rate.
    pub rate: Rate,
    /// Test knob: share of multicast datagrams dropped on receipt.
    pub drop: f64,
    /// The publisher's MAC level.
    pub mac_level: MacLevel,
    /// The publisher's identity public key: the key exchange must be signed by it.
    pub pin: Option<PathBuf>,
    /// Offer parity repair when subscribing (anything but [`ParityChoice::Off`]; the
    /// publisher's answer gives the coding).
    pub parity: ParityChoice,
    /// The longest time the host may not read the multicast socket (sizes its buffer).
    pub receive_gap: Duration,
}

impl Default for ReceiveSettings {
    fn default() -> Self {
        Self {
            time_offset: Duration::from_secs(3600),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            spool_dir: PathBuf::from("fmtp-spool"),
            in_flight_bytes_max: ByteSize::from_bytes(600_000_000),
            rate: Rate::from_megabits_per_s(100),
            drop: 0.0,
            mac_level: MacLevel::None,
            pin: None,
            parity: ParityChoice::Auto,
            receive_gap: ldm7_plan::repair::RECEIVE_GAP_DEFAULT,
        }
    }
}

/// The LDM-6 server's bounds (`[ldm6]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Ldm6Settings {
    /// Bound: connections from one address at once.
    pub connections_per_host_max: usize,
    /// A connection that starts no session within this is closed.
    pub first_call_timeout: Duration,
    /// A HIYA connection that sends nothing this long is closed.
    pub push_idle_timeout: Duration,
    /// Bound: bytes of a record (all its fragments) before a session receives products.
    pub call_bytes_max: ByteSize,
    /// Whether a host's accepted FEEDME ends the feeds this server already sends that host
    /// and that the request covers.
    pub one_feeder_per_host: bool,
}

/// The default per-host bound: a quarter of the default `--max-clients`, and more than the
/// REQUEST lines even a large relay sends one upstream (a feed split ten ways, several feeds,
/// notifyme and pushes).
pub const CONNECTIONS_PER_HOST_MAX_DEFAULT: usize = 64;

impl Default for Ldm6Settings {
    fn default() -> Self {
        Self {
            connections_per_host_max: CONNECTIONS_PER_HOST_MAX_DEFAULT,
            first_call_timeout: ldm7_ldm_proto::FIRST_CALL_LIMIT,
            push_idle_timeout: ldm7_ldm_proto::PUSH_IDLE_TIMEOUT,
            call_bytes_max: ByteSize::from_bytes(ldm7_ldm_proto::CALL_BYTES_MAX as u64),
            one_feeder_per_host: true,
        }
    }
}

/// What the server does with the children of its EXEC entries (`[exec]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecSettings {
    /// Whether a child that exited is started again (after a back-off).
    pub restart: bool,
    /// The longest back-off between restarts; a child that ran longer resets it to 1 s.
    pub restart_max: Duration,
}

impl Default for ExecSettings {
    fn default() -> Self {
        Self { restart: false, restart_max: Duration::from_secs(60) }
    }
}

/// The settings file, typed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    multicast: MulticastSettings,
    multicast_feeds: BTreeMap<String, MulticastSettings>,
    /// The path service.
    pub path: PathSettings,
    receive: ReceiveSettings,
    receive_feeds: BTreeMap<String, ReceiveSettings>,
    /// The LDM-6 server's bounds.
    pub ldm6: Ldm6Settings,
    /// The EXEC entries' children.
    pub exec: ExecSettings,
    /// The site: where its queue, configuration, log and data are (`None`: defaults, no file).
    pub site: Option<crate::site::SiteSettings>,
    /// Where the settings came from (`None`: defaults).
    pub source: Option<PathBuf>,
}

impl Settings {
    /// Reads and checks a settings file.
    pub fn load(path: &Path) -> Result<Self, SettingsError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| SettingsError::Io { path: path.to_path_buf(), source })?;
        Self::parse(&text, path)
    }

    /// Parses settings text (`origin` names it in errors).
    pub fn parse(text: &str, origin: &Path) -> Result<Self, SettingsError> {
        let raw: raw::File = toml::from_str(text)
            .map_err(|error| SettingsError::Syntax { path: origin.to_path_buf(), message: error.to_string() })?;
        let value = |key: String, message: String| SettingsError::Value { path: origin.to_path_buf(), key, message };
        let (multicast, multicast_feeds) = raw.multicast.typed("multicast", &value)?;
        let (receive, receive_feeds) = raw.receive.typed("receive", &value)?;
        let path = raw.path.typed(&value)?;
        let ldm6 = raw.ldm6.typed(&value)?;
        let exec = raw.exec.typed(&value)?;
        let site = crate::site::SiteKeys {
            home: raw.home,
            queue: raw.queue,
            server: raw.server,
            log: raw.log,
            pqact: raw.pqact,
            scour: raw.scour,
            check: raw.check,
            rtstats: raw.rtstats,
        }
        .typed(origin, &value)?;
        Ok(Self {
            multicast,
            multicast_feeds,
            path,
            receive,
            receive_feeds,
            ldm6,
            exec,
            site: Some(site),
            source: Some(origin.to_path_buf()),
        })
    }

    /// The publisher settings of `feed` (its overrides, else the defaults).
    pub fn multicast(&self, feed: FeedType) -> &MulticastSettings {
        self.multicast_feeds.get(&feed.to_string().to_ascii_uppercase()).unwrap_or(&self.multicast)
    }

    /// The subscriber settings of `feed`.
    pub fn receive(&self, feed: FeedType) -> &ReceiveSettings {
        self.receive_feeds.get(&feed.to_string().to_ascii_uppercase()).unwrap_or(&self.receive)
    }
}

fn check_feed(name: &str) -> Result<(), String> {
    name.parse::<FeedType>().map(|_| ()).map_err(|error| format!("{name:?} is not a feedtype: {error}"))
}

/// The file as written: every key optional, quantities as text.
mod raw {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct File {
        #[serde(default)]
        pub multicast: Section<MulticastKeys>,
        #[serde(default)]
        pub path: PathFile,
        #[serde(default)]
        pub receive: Section<ReceiveKeys>,
        #[serde(default)]
        pub ldm6: Ldm6Keys,
        #[serde(default)]
        pub exec: ExecKeys,
        pub home: Option<PathBuf>,
        #[serde(default)]
        pub queue: crate::site::QueueKeys,
        #[serde(default)]
        pub server: crate::site::ServerKeys,
        #[serde(default)]
        pub log: crate::site::LogKeys,
        #[serde(default)]
        pub pqact: crate::site::PqactKeys,
        #[serde(default)]
        pub scour: crate::site::ScourKeys,
        #[serde(default)]
        pub check: crate::site::CheckKeys,
        #[serde(default)]
        pub rtstats: crate::site::RtstatsKeys,
    }

    /// `[exec]`.
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct ExecKeys {
        restart: Option<bool>,
        restart_max: Option<String>,
    }

    impl ExecKeys {
        pub(super) fn typed(&self, value: Value<'_>) -> Result<ExecSettings, SettingsError> {
            let mut settings = ExecSettings::default();
            if let Some(restart) = self.restart {
                settings.restart = restart;
            }
            if let Some(text) = &self.restart_max {
                let max = parse_duration(text)
                    .map_err(|error| value("exec.restart_max".into(), format!("{error}: e.g. \"60s\"")))?;
                if max < Duration::from_secs(1) {
                    return Err(value("exec.restart_max".into(), "at least 1s (the first back-off)".into()));
                }
                settings.restart_max = max;
            }
            Ok(settings)
        }
    }

    /// `[ldm6]`.
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Ldm6Keys {
        connections_per_host_max: Option<usize>,
        first_call_timeout: Option<String>,
        push_idle_timeout: Option<String>,
        call_bytes_max: Option<String>,
        one_feeder_per_host: Option<bool>,
    }

    impl Ldm6Keys {
        pub(super) fn typed(&self, value: Value<'_>) -> Result<Ldm6Settings, SettingsError> {
            let mut settings = Ldm6Settings::default();
            if let Some(max) = self.connections_per_host_max {
                if max == 0 {
                    return Err(value("ldm6.connections_per_host_max".into(), "give at least 1".into()));
                }
                settings.connections_per_host_max = max;
            }
            for (name, text, target) in [
                ("first_call_timeout", &self.first_call_timeout, &mut settings.first_call_timeout),
                ("push_idle_timeout", &self.push_idle_timeout, &mut settings.push_idle_timeout),
            ] {
                if let Some(timeout) = quantity(text, "ldm6", name, parse_duration, value)? {
                    if timeout.is_zero() {
                        return Err(value(format!("ldm6.{name}"), "give a positive duration, e.g. \"120s\"".into()));
                    }
                    *target = timeout;
                }
            }
            if let Some(bytes) =
                quantity(&self.call_bytes_max, "ldm6", "call_bytes_max", str::parse::<ByteSize>, value)?
            {
                // A FEEDME or HIYA of 32 specs of 255-byte patterns takes under 9 KiB.
                if bytes.bytes() < 16 << 10 {
                    return Err(value(
                        "ldm6.call_bytes_max".into(),
                        format!("{bytes} is too small for the largest FEEDME or HIYA: give at least 16 KiB"),
                    ));
                }
                settings.call_bytes_max = bytes;
            }
            if let Some(one) = self.one_feeder_per_host {
                settings.one_feeder_per_host = one;
            }
            Ok(settings)
        }
    }

    /// `[multicast]` or `[receive]`: the defaults, and per-feed overrides under `feeds.FEED`.
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Section<K> {
        #[serde(flatten)]
        keys: K,
        #[serde(default = "BTreeMap::new")]
        feeds: BTreeMap<String, K>,
    }

    /// The keys of a section, applied over the settings they override.
    pub(super) trait Keys {
        type Typed: Clone + Default;
        fn apply(&self, base: &Self::Typed, key: &str, value: Value<'_>) -> Result<Self::Typed, SettingsError>;
    }

    /// A section's settings and each feed's (keyed by the upper-case feed name).
    pub(super) type Typed<K> = (<K as Keys>::Typed, BTreeMap<String, <K as Keys>::Typed>);

    impl<K: Keys> Section<K> {
        /// The section's settings and each feed's.
        pub(super) fn typed(&self, name: &str, value: Value<'_>) -> Result<Typed<K>, SettingsError> {
            let defaults = self.keys.apply(&K::Typed::default(), name, value)?;
            let mut feeds = BTreeMap::new();
            for (feed, overrides) in &self.feeds {
                let key = format!("{name}.feeds.{feed}");
                check_feed(feed).map_err(|message| value(key.clone(), message))?;
                feeds.insert(feed.to_ascii_uppercase(), overrides.apply(&defaults, &key, value)?);
            }
            Ok((defaults, feeds))
        }
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct MulticastKeys {
        rate: Option<String>,
        retx_timeout: Option<String>,
        deadline: Option<String>,
        deadline_factor: Option<f64>,
        deadline_min: Option<String>,
        ttl: Option<u32>,
        interface: Option<String>,
        linger: Option<String>,
        catch_up: Option<String>,
        catch_up_wait: Option<String>,
        subscribers_max: Option<usize>,
        index_map_capacity: Option<u32>,
        product_queue_max: Option<usize>,
        path: Option<String>,
        rate_control: Option<RateControlKeys>,
        mac_level: Option<u8>,
        identity: Option<PathBuf>,
        mac_rotation: Option<String>,
        mac_signing: Option<String>,
        parity: Option<String>,
        parity_loss: Option<f64>,
    }

    /// `rate_control` of a multicast section.
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct RateControlKeys {
        enabled: Option<bool>,
        steps: Option<Vec<String>>,
        interval: Option<String>,
        wait: Option<String>,
        alpha: Option<f64>,
        beta: Option<f64>,
        epsilon: Option<String>,
        lower_after: Option<u32>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct PathFile {
        driver: Option<String>,
        netns: Option<String>,
        run_dir: Option<PathBuf>,
        oess_url: Option<String>,
        oess_user: Option<String>,
        oess_password_file: Option<PathBuf>,
        oess_workgroup: Option<u64>,
        oess_api: Option<String>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct ReceiveKeys {
        time_offset: Option<String>,
        retry_min: Option<String>,
        retry_max: Option<String>,
        spool_dir: Option<PathBuf>,
        in_flight_bytes_max: Option<String>,
        rate: Option<String>,
        drop: Option<f64>,
        mac_level: Option<u8>,
        pin: Option<PathBuf>,
        parity: Option<String>,
        receive_gap: Option<String>,
    }

    type Value<'a> = &'a dyn Fn(String, String) -> SettingsError;

    fn mac_level(level: u8, key: &str, value: Value<'_>) -> Result<MacLevel, SettingsError> {
        MacLevel::from_number(level).ok_or_else(|| {
            value(
                format!("{key}.mac_level"),
                format!("{level} is not a MAC level: give 0 (none), 1 (HMAC-SHA-256) or 2 (Ed25519)"),
            )
        })
    }

    /// A `parity = "auto" | "off" | "GROUP/SHARDS"` value.
    fn parity(text: &Option<String>, key: &str, value: Value<'_>) -> Result<Option<ParityChoice>, SettingsError> {
        text.as_deref()
            .map(|text| text.parse::<ParityChoice>().map_err(|error| value(format!("{key}.parity"), error.0)))
            .transpose()
    }

    fn quantity<T>(
        text: &Option<String>,
        key: &str,
        name: &str,
        parse: impl Fn(&str) -> Result<T, QuantityError>,
        value: Value<'_>,
    ) -> Result<Option<T>, SettingsError> {
        text.as_deref()
            .map(|text| parse(text).map_err(|error| value(format!("{key}.{name}"), error.to_string())))
            .transpose()
    }

    impl Keys for MulticastKeys {
        type Typed = MulticastSettings;

        /// One `[multicast]` key onto the settings. One function on purpose: an arm per key with
        /// its check and its message, in the order docs/ldm7.md lists them.
        fn apply(
            &self,
            base: &MulticastSettings,
            key: &str,
            value: Value<'_>,
        ) -> Result<MulticastSettings, SettingsError> {
            let mut settings = base.clone();
            if let Some(rate) = quantity(&self.rate, key, "rate", str::parse::<Rate>, value)? {
                settings.rate = rate;
            }
            let timeout = quantity(&self.retx_timeout, key, "retx_timeout", parse_duration, value)?;
            let minimum = quantity(&self.deadline_min, key, "deadline_min", parse_duration, value)?;
            let proportional = match self.deadline.as_deref().map(str::to_ascii_lowercase).as_deref() {
                None => matches!(settings.deadline, Deadline::Proportional { .. }),
                Some("constant") => false,
                Some("proportional") => true,
                Some(other) => {
                    return Err(value(
                        format!("{key}.deadline"),
                        format!("{other:?} is not a deadline policy: give \"constant\" or \"proportional\""),
                    ));
                }
            };
            settings.deadline = if proportional {
                let (factor, min) = match settings.deadline {
                    Deadline::Proportional { factor, min } => (factor, min),
                    Deadline::Constant(_) => (50.0, Duration::from_secs(1)),
                };
                let factor = self.deadline_factor.unwrap_or(factor);
                if !(factor.is_finite() && factor >= 0.0) {
                    return Err(value(format!("{key}.deadline_factor"), "give a finite number ≥ 0".into()));
                }
                Deadline::Proportional { factor, min: minimum.unwrap_or(min) }
            } else {
                let previous = match settings.deadline {
                    Deadline::Constant(previous) => previous,
                    Deadline::Proportional { .. } => RETX_TIMEOUT_DEFAULT,
                };
                Deadline::Constant(timeout.unwrap_or(previous))
            };
            if let Some(linger) = quantity(&self.linger, key, "linger", parse_duration, value)? {
                settings.linger = linger;
            }
            if let Some(catch_up) = quantity(&self.catch_up, key, "catch_up", parse_duration, value)? {
                settings.catch_up = catch_up;
            }
            if let Some(wait) = quantity(&self.catch_up_wait, key, "catch_up_wait", parse_duration, value)? {
                settings.catch_up_wait = wait;
            }
            if let Some(ttl) = self.ttl {
                if !(1..=255).contains(&ttl) {
                    return Err(value(format!("{key}.ttl"), "give a TTL of 1–255".into()));
                }
                settings.ttl = ttl;
            }
            if let Some(interface) = &self.interface {
                settings.interface = Some(interface.parse().map_err(|_| {
                    value(format!("{key}.interface"), format!("{interface:?} is not an IPv4 or IPv6 address"))
                })?);
            }
            if let Some(max) = self.subscribers_max {
                if max == 0 {
                    return Err(value(format!("{key}.subscribers_max"), "give at least 1".into()));
                }
                settings.subscribers_max = max;
            }
            if let Some(capacity) = self.index_map_capacity {
                if capacity < 1024 {
                    return Err(value(format!("{key}.index_map_capacity"), "give at least 1024 products".into()));
                }
                settings.index_map_capacity = capacity;
            }
            if let Some(max) = self.product_queue_max {
                if max == 0 {
                    return Err(value(format!("{key}.product_queue_max"), "give at least 1".into()));
                }
                settings.product_queue_max = max;
            }
            if let Some(path) = &self.path {
                settings.path = Some(path.clone());
            }
            if let Some(level) = self.mac_level {
                settings.mac_level = mac_level(level, key, value)?;
            }
            if let Some(path) = &self.identity {
                crate::keys::read_identity(path)
                    .map_err(|error| value(format!("{key}.identity"), error.to_string()))?;
                settings.identity = Some(path.clone());
            }
            if let Some(every) = quantity(&self.mac_rotation, key, "mac_rotation", parse_duration, value)? {
                if every < MAC_ROTATION_MIN {
                    return Err(value(format!("{key}.mac_rotation"), format!("give at least {:?}", MAC_ROTATION_MIN)));
                }
                settings.mac_rotation = Some(every);
            }
            if let Some(signing) = &self.mac_signing {
                settings.mac_lists = match signing.trim() {
                    "auto" => true,
                    "datagram" => false,
                    other => {
                        return Err(value(
                            format!("{key}.mac_signing"),
                            format!(
                                "give \"auto\" (level 2 signs digest lists while every subscriber is ldm7) or \"datagram\" \
                                 (a signature on each datagram always), not {other:?}"
                            ),
                        ));
                    }
                };
            }
            if let Some(choice) = parity(&self.parity, key, value)? {
                settings.parity = choice;
            }
            if let Some(loss) = self.parity_loss {
                if !(0.0..0.5).contains(&loss) {
                    return Err(value(format!("{key}.parity_loss"), "give a share in [0, 0.5), e.g. 0.01".into()));
                }
                settings.parity_loss = loss;
            }
            if let Some(keys) = &self.rate_control {
                settings.rate_control =
                    keys.apply(settings.rate_control.as_ref(), &format!("{key}.rate_control"), value)?;
            }
            if let Some(control) = &settings.rate_control {
                let first = control.steps[0];
                match self.rate.as_ref().map(|_| settings.rate) {
                    Some(rate) if rate != first => {
                        return Err(value(
                            format!("{key}.rate"),
                            format!(
                                "{rate} is not the first rate step ({first}): with rate_control the feed starts at \
                                 its first step; leave rate out or make it the first step"
                            ),
                        ));
                    }
                    _ => settings.rate = first,
                }
            }
            Ok(settings)
        }
    }

    impl RateControlKeys {
        /// The monitor's settings: these keys over `base` (inherited from the defaults); `None`
        /// when it is off.
        fn apply(
            &self,
            base: Option<&RateControlSettings>,
            key: &str,
            value: Value<'_>,
        ) -> Result<Option<RateControlSettings>, SettingsError> {
            if self.enabled == Some(false) {
                return Ok(None);
            }
            let named = |name: &str| format!("{key}.{name}");
            let steps = match &self.steps {
                Some(texts) => {
                    let mut steps = Vec::with_capacity(texts.len());
                    for text in texts {
                        steps.push(text.parse::<Rate>().map_err(|error| value(named("steps"), error.to_string()))?);
                    }
                    steps
                }
                None => match base {
                    Some(base) => base.steps.clone(),
                    None => {
                        return Err(value(
                            named("steps"),
                            "give the path rates to step through, e.g. [\"20 Mbit/s\", \"50 Mbit/s\"]".into(),
                        ));
                    }
                },
            };
            if steps.is_empty()
                || steps.iter().any(|rate| rate.bits_per_s() == 0)
                || steps.windows(2).any(|pair| pair[1] <= pair[0])
            {
                return Err(value(
                    named("steps"),
                    "give at least one rate, each positive and larger than the one before".into(),
                ));
            }
            let mut settings = base.cloned().unwrap_or_else(|| RateControlSettings::research(Vec::new()));
            settings.steps = steps;
            if let Some(interval) = quantity(&self.interval, key, "interval", parse_duration, value)? {
                if interval.is_zero() {
                    return Err(value(named("interval"), "give a positive interval, e.g. \"60s\"".into()));
                }
                settings.interval = interval;
            }
            if let Some(wait) = quantity(&self.wait, key, "wait", parse_duration, value)? {
                settings.wait = wait;
            }
            if let Some(epsilon) = quantity(&self.epsilon, key, "epsilon", parse_duration, value)? {
                settings.epsilon = epsilon;
            }
            for (name, share, target) in
                [("alpha", self.alpha, &mut settings.alpha), ("beta", self.beta, &mut settings.beta)]
            {
                if let Some(share) = share {
                    if !(0.0..=1.0).contains(&share) {
                        return Err(value(named(name), format!("{share} is not a share: give one in [0, 1]")));
                    }
                    *target = share;
                }
            }
            if let Some(lower_after) = self.lower_after {
                if lower_after == 0 {
                    return Err(value(named("lower_after"), "give at least 1 interval".into()));
                }
                settings.lower_after = lower_after;
            }
            Ok(Some(settings))
        }
    }

    impl PathFile {
        pub(super) fn typed(&self, value: Value<'_>) -> Result<PathSettings, SettingsError> {
            let missing =
                |name: &str, driver: &str| value(format!("path.{name}"), format!("the {driver} driver needs it"));
            match self.driver.as_deref().unwrap_or("none") {
                "none" => Ok(PathSettings::None),
                "linux-bridge" => Ok(PathSettings::LinuxBridge { netns: self.netns.clone() }),
                "vde" => {
                    Ok(PathSettings::Vde { run_dir: self.run_dir.clone().ok_or_else(|| missing("run_dir", "vde"))? })
                }
                "oess" => {
                    let api = self.oess_api.clone().unwrap_or_else(|| "circuit".into());
                    if api != "circuit" && api != "provisioning" {
                        return Err(value("path.oess_api".into(), "give \"circuit\" or \"provisioning\"".into()));
                    }
                    Ok(PathSettings::Oess {
                        url: self.oess_url.clone().ok_or_else(|| missing("oess_url", "oess"))?,
                        user: self.oess_user.clone().ok_or_else(|| missing("oess_user", "oess"))?,
                        password_file: self
                            .oess_password_file
                            .clone()
                            .ok_or_else(|| missing("oess_password_file", "oess"))?,
                        workgroup: self.oess_workgroup.ok_or_else(|| missing("oess_workgroup", "oess"))?,
                        api,
                    })
                }
                other => Err(value(
                    "path.driver".into(),
                    format!("{other:?} is not a path driver: give none, linux-bridge, vde or oess"),
                )),
            }
        }
    }

    impl Keys for ReceiveKeys {
        type Typed = ReceiveSettings;

        fn apply(&self, base: &ReceiveSettings, key: &str, value: Value<'_>) -> Result<ReceiveSettings, SettingsError> {
            let mut settings = base.clone();
            if let Some(offset) = quantity(&self.time_offset, key, "time_offset", parse_duration, value)? {
                settings.time_offset = offset;
            }
            if let Some(min) = quantity(&self.retry_min, key, "retry_min", parse_duration, value)? {
                settings.retry_min = min;
            }
            if let Some(max) = quantity(&self.retry_max, key, "retry_max", parse_duration, value)? {
                settings.retry_max = max;
            }
            if settings.retry_min.is_zero() || settings.retry_max < settings.retry_min {
                return Err(value(format!("{key}.retry_min"), "give 0 < retry_min ≤ retry_max".into()));
            }
            if let Some(dir) = &self.spool_dir {
                settings.spool_dir = dir.clone();
            }
            if let Some(bytes) =
                quantity(&self.in_flight_bytes_max, key, "in_flight_bytes_max", str::parse::<ByteSize>, value)?
            {
                settings.in_flight_bytes_max = bytes;
            }
            if let Some(rate) = quantity(&self.rate, key, "rate", str::parse::<Rate>, value)? {
                settings.rate = rate;
            }
            if let Some(drop) = self.drop {
                if !(0.0..1.0).contains(&drop) {
                    return Err(value(format!("{key}.drop"), "give a share in [0, 1), e.g. 0.02".into()));
                }
                settings.drop = drop;
            }
            if let Some(level) = self.mac_level {
                settings.mac_level = mac_level(level, key, value)?;
            }
            if let Some(path) = &self.pin {
                crate::keys::read_pin(path).map_err(|error| value(format!("{key}.pin"), error.to_string()))?;
                settings.pin = Some(path.clone());
            }
            if let Some(choice) = parity(&self.parity, key, value)? {
                settings.parity = choice;
            }
            if let Some(gap) = quantity(&self.receive_gap, key, "receive_gap", parse_duration, value)? {
                if gap.is_zero() || gap > Duration::from_secs(60) {
                    return Err(value(format!("{key}.receive_gap"), "give more than 0 and at most 60s".into()));
                }
                settings.receive_gap = gap;
            }
            Ok(settings)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Settings, SettingsError> {
        Settings::parse(text, Path::new("ldm7.toml"))
    }

    #[test]
    fn defaults_without_a_file() {
        let settings = parse("").unwrap();
        let ngrid = settings.multicast(FeedType::from_name("NGRID").unwrap());
        assert_eq!(ngrid.rate, Rate::from_megabits_per_s(100));
        assert_eq!(ngrid.deadline, Deadline::Constant(Duration::from_secs(300)));
        assert_eq!(settings.receive(FeedType::ANY).time_offset, Duration::from_secs(3600));
        assert_eq!(settings.path, PathSettings::None);
        assert_eq!(settings.ldm6, Ldm6Settings::default());
        assert_eq!(settings.ldm6.first_call_timeout, Duration::from_secs(120));
        assert!(settings.ldm6.one_feeder_per_host);
    }

    #[test]
    fn the_exec_children() {
        assert_eq!(parse("").unwrap().exec, ExecSettings::default());
        let settings = parse("[exec]\nrestart = true\nrestart_max = \"5m\"\n").unwrap();
        assert!(settings.exec.restart);
        assert_eq!(settings.exec.restart_max, Duration::from_secs(300));
        let error = parse("[exec]\nrestart_max = \"100ms\"\n").unwrap_err().to_string();
        assert!(error.contains("exec.restart_max") && error.contains("at least 1s"), "{error}");
    }

    #[test]
    fn the_ldm6_bounds() {
        let settings = parse(
            "[ldm6]\nconnections_per_host_max = 4\nfirst_call_timeout = \"2s\"\npush_idle_timeout = \"1h\"\n\
             call_bytes_max = \"32 KiB\"\none_feeder_per_host = false\n",
        )
        .unwrap();
        assert_eq!(settings.ldm6.connections_per_host_max, 4);
        assert_eq!(settings.ldm6.first_call_timeout, Duration::from_secs(2));
        assert_eq!(settings.ldm6.push_idle_timeout, Duration::from_secs(3600));
        assert_eq!(settings.ldm6.call_bytes_max.bytes(), 32 << 10);
        assert!(!settings.ldm6.one_feeder_per_host);
    }

    #[test]
    fn feeds_override_the_defaults() {
        let settings = parse(
            r#"
[multicast]
rate = "40 Mbit/s"
retx_timeout = "2min"
[multicast.feeds.NGRID]
rate = "500M"
path = "ngrid"
parity = "128/16"
[multicast.feeds.EXP]
deadline = "proportional"
deadline_factor = 20
[multicast.feeds.IDS]
parity = "off"
[multicast.feeds.HDS]
subscribers_max = 570
parity_loss = 0.05
[path]
driver = "linux-bridge"
netns = "lab-core"
[receive]
retry_max = "10s"
[receive.feeds.ngrid]
drop = 0.02
"#,
        )
        .unwrap();
        let feed = |name| FeedType::from_name(name).unwrap();
        assert_eq!(settings.multicast(feed("NGRID")).rate, Rate::from_megabits_per_s(500));
        assert_eq!(settings.multicast(feed("NGRID")).deadline, Deadline::Constant(Duration::from_secs(120)));
        assert_eq!(settings.multicast(feed("NGRID")).path.as_deref(), Some("ngrid"));
        let parity = settings.multicast(feed("NGRID")).parity_config().expect("parity for NGRID");
        assert_eq!((parity.group_blocks, parity.shards), (128, 16));
        assert_eq!(settings.multicast(feed("IDS")).parity_config(), None);
        // Parity is on unless refused: "auto" plans for subscribers_max at parity_loss.
        let auto = settings.multicast(feed("EXP")).parity_config().expect("parity for EXP");
        assert_eq!((auto.group_blocks, auto.shards), (992, 32));
        let planned = settings.multicast(feed("HDS")).parity_config().expect("parity for HDS");
        assert_eq!((planned.group_blocks, planned.shards), (896, 128));
        assert_eq!(settings.receive(feed("NGRID")).parity, ParityChoice::Auto);
        assert_eq!(settings.multicast(feed("IDS")).rate, Rate::from_megabits_per_s(40));
        assert_eq!(
            settings.multicast(feed("EXP")).deadline,
            Deadline::Proportional { factor: 20.0, min: Duration::from_secs(1) }
        );
        assert_eq!(settings.path, PathSettings::LinuxBridge { netns: Some("lab-core".into()) });
        assert_eq!(settings.receive(feed("NGRID")).drop, 0.02);
        assert_eq!(settings.receive(feed("NGRID")).retry_max, Duration::from_secs(10));
        assert_eq!(settings.receive(feed("EXP")).drop, 0.0);
    }

    #[test]
    fn rate_control_is_off_by_default_and_starts_the_feed_at_its_first_step() {
        let feed = |name| FeedType::from_name(name).unwrap();
        assert_eq!(parse("").unwrap().multicast(feed("NGRID")).rate_control, None);
        let settings = parse(
            r#"
[multicast.rate_control]
steps = ["20 Mbit/s", "50 Mbit/s", "100 Mbit/s"]
[multicast.feeds.NGRID.rate_control]
interval = "2s"
wait = "1ms"
alpha = 0.2
lower_after = 2
[multicast.feeds.EXP]
rate = "5 Mbit/s"
rate_control = { steps = ["5 Mbit/s", "20 Mbit/s"] }
[multicast.feeds.IDS.rate_control]
enabled = false
"#,
        )
        .unwrap();
        let ngrid = settings.multicast(feed("NGRID"));
        let control = ngrid.rate_control.as_ref().expect("on");
        assert_eq!(ngrid.rate, Rate::from_megabits_per_s(20));
        assert_eq!(control.steps.len(), 3);
        assert_eq!(
            (control.interval, control.wait, control.epsilon),
            (Duration::from_secs(2), Duration::from_millis(1), Duration::from_millis(2))
        );
        assert_eq!((control.alpha, control.beta, control.lower_after), (0.2, 0.01, 2));
        // The defaults of every feed: the research's.
        let other = settings.multicast(feed("NEXRAD3")).rate_control.as_ref().expect("on");
        assert_eq!(
            (other.interval, other.wait, other.alpha, other.beta),
            (Duration::from_secs(60), Duration::from_millis(2), 0.1, 0.01)
        );
        let exp = settings.multicast(feed("EXP"));
        assert_eq!(exp.rate, Rate::from_megabits_per_s(5));
        assert_eq!(exp.rate_control.as_ref().map(|c| c.steps.len()), Some(2));
        assert_eq!(settings.multicast(feed("IDS")).rate_control, None);
        let config = control.monitor_config();
        assert_eq!(config.rate_steps_bps, vec![20e6, 50e6, 100e6]);
        assert!(ldm7_plan::violation::ViolationMonitor::new(config).is_ok());
    }

    #[test]
    fn bad_values_name_the_key_and_the_fix() {
        for (text, why) in [
            ("[multicast]\nrate = \"fast\"\n", "multicast.rate"),
            ("[multicast]\nmac_level = 3\n", "multicast.mac_level"),
            ("[multicast]\nmac_rotation = \"10ms\"\n", "multicast.mac_rotation"),
            ("[multicast]\nmac_signing = \"each\"\n", "multicast.mac_signing"),
            ("[multicast.feeds.EXP]\nidentity = \"/nonexistent/publisher.key\"\n", "multicast.feeds.EXP.identity"),
            ("[receive]\npin = \"/nonexistent/publisher.key.pub\"\n", "receive.pin"),
            ("[multicast]\nparity = \"40/32\"\n", "multicast.parity"),
            ("[multicast]\nparity_loss = 0.7\n", "multicast.parity_loss"),
            ("[receive]\nreceive_gap = \"0s\"\n", "receive.receive_gap"),
            (
                "[receive.feeds.EXP]\nparity = \"256\"\n",
                "receive.feeds.EXP.parity: parity \"256\": expected GROUP/SHARDS, data blocks and parity shards per \
                 group (e.g. 256/32); or \"auto\" (the default) or \"off\"",
            ),
            ("[multicast]\nretx_timeout = \"inf\"\n", "multicast.retx_timeout"),
            ("[multicast]\ndeadline = \"sometimes\"\n", "deadline policy"),
            ("[multicast.feeds.NOSUCH]\nrate = \"1M\"\n", "not a feedtype"),
            ("[multicast]\nrte = \"1M\"\n", "unknown field"),
            ("[path]\ndriver = \"carrier-pigeon\"\n", "not a path driver"),
            ("[path]\ndriver = \"vde\"\n", "path.run_dir"),
            ("[receive]\ndrop = 1.5\n", "receive.drop"),
            ("[receive]\nretry_min = \"0\"\n", "retry_min"),
            ("[ldm6]\nconnections_per_host_max = 0\n", "ldm6.connections_per_host_max"),
            ("[ldm6]\nfirst_call_timeout = \"0\"\n", "ldm6.first_call_timeout"),
            ("[ldm6]\ncall_bytes_max = \"1 KiB\"\n", "at least 16 KiB"),
            ("[ldm6]\nidle = 1\n", "unknown field"),
            ("[multicast.rate_control]\ninterval = \"1s\"\n", "multicast.rate_control.steps: give"),
            ("[multicast.rate_control]\nsteps = [\"50M\", \"20M\"]\n", "multicast.rate_control.steps"),
            ("[multicast.rate_control]\nsteps = [\"fast\"]\n", "multicast.rate_control.steps"),
            ("[multicast.rate_control]\nsteps = [\"5M\"]\nalpha = 2\n", "multicast.rate_control.alpha"),
            ("[multicast.rate_control]\nsteps = [\"5M\"]\nlower_after = 0\n", "rate_control.lower_after"),
            ("[multicast.rate_control]\nsteps = [\"5M\"]\ninterval = \"0\"\n", "rate_control.interval"),
            ("[multicast.rate_control]\nsteps = [\"5M\"]\nwhen = 1\n", "unknown field"),
            (
                "[multicast.feeds.EXP]\nrate = \"40M\"\nrate_control = { steps = [\"20M\", \"40M\"] }\n",
                "multicast.feeds.EXP.rate: 40",
            ),
        ] {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(why), "{text:?}: {error}");
        }
    }
}
