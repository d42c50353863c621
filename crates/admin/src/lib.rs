//! `ldm7 admin` (installed also as `ldmadmin`): an ldm7 site run as an LDM site is, from one
//! settings file (`ldm7.toml`, whose site sections are LDM's registry: `ldm7_config::site`).
//!
//! - [`control`]: `start` with LDM's pre-checks (the queue, ldmd.conf, every pqact
//!   configuration its EXEC entries name), the pid file, `stop`, `isrunning`, `pqactHUP`;
//! - [`checks`]: `check` — the server running, the clock (SNTP), the age of the newest product,
//!   the queue's minimum residence time against the maximum latency with the fix to make;
//! - [`import`]: an existing LDM home (registry.xml, ldmd.conf, the pqact and scour
//!   configurations, the REQUESTs' `.info` resume files) into an ldm7 home, with a report.
//!
//! The command-line parsing is the binary's; everything it does is here.

use std::path::{Path, PathBuf};

use ldm7_config::settings::Settings;
use ldm7_config::site::SiteSettings;

pub mod checks;
pub mod control;
pub mod import;
pub mod pqact;
pub mod registry;
pub mod sntp;

/// Why an admin command cannot do what it was asked; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The settings file cannot be used.
    #[error(transparent)]
    Settings(#[from] ldm7_config::settings::SettingsError),
    /// A pre-check failed: the server was not started.
    #[error("not starting the server: {0}")]
    PreCheck(String),
    /// The server is running when it must not be.
    #[error("the server is running (pid {pid}): {what}")]
    Running {
        /// Its process.
        pid: u32,
        /// What to do.
        what: String,
    },
    /// The server is not running when it must be.
    #[error("the server is not running{0}")]
    NotRunning(String),
    /// The server did not start.
    #[error("the server did not start: {0}")]
    StartFailed(String),
    /// The server did not stop.
    #[error("the server (pid {pid}) did not stop within {seconds} s: see {log}")]
    StopFailed {
        /// Its process.
        pid: u32,
        /// How long was waited.
        seconds: u64,
        /// Its log file.
        log: String,
    },
    /// A file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Something else, said in full.
    #[error("{0}")]
    Other(String),
}

impl AdminError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AdminError + '_ {
        move |source| AdminError::Io { path: path.to_owned(), source }
    }
}

/// A site: its settings file and what it says, and the `ldm7` binary that runs its programs.
#[derive(Clone, Debug)]
pub struct Site {
    /// The settings file.
    pub settings_file: PathBuf,
    /// Its site sections.
    pub site: SiteSettings,
    /// The `ldm7` executable.
    pub exe: PathBuf,
}

impl Site {
    /// Reads the site's settings file; `exe` runs the server and the site's programs.
    pub fn load(settings_file: &Path, exe: PathBuf) -> Result<Self, AdminError> {
        let settings_file = std::path::absolute(settings_file).map_err(AdminError::io(settings_file))?;
        if !settings_file.is_file() {
            return Err(AdminError::Other(format!(
                "no settings file {}: give --settings FILE or set LDM7_HOME (the file is $LDM7_HOME/etc/ldm7.toml); \
                 `ldm7 import LDMHOME` makes one from an LDM installation",
                settings_file.display()
            )));
        }
        let settings = Settings::load(&settings_file)?;
        let site = settings.site.unwrap_or_else(|| SiteSettings::defaults(&SiteSettings::default_home(&settings_file)));
        Ok(Self { settings_file, site, exe })
    }

    /// The site's settings as `ldm7 admin config` prints them (one `key = value` a line).
    pub fn describe(&self) -> String {
        let site = &self.site;
        let path = |path: &Path| path.display().to_string();
        let mut lines = vec![
            ("settings file", path(&self.settings_file)),
            ("home", path(&site.home)),
            ("queue.path", path(&site.queue.path)),
            ("queue.size", site.queue.size.to_string()),
            ("queue.slots", site.queue.slots.map_or("default".into(), |slots| slots.to_string())),
            ("server.config", path(&site.server.config)),
            ("server.listen", site.server.listen.to_string()),
            ("server.port", site.server.port.to_string()),
            ("server.max_clients", site.server.max_clients.to_string()),
            ("server.max_latency", format!("{} s", site.server.max_latency.as_secs())),
            ("server.time_offset", format!("{} s", site.server.time_offset.as_secs())),
            ("server.hostname", site.server.hostname.clone().unwrap_or_else(|| "(the host's name)".into())),
            ("server.state_dir", path(&site.server.state_dir)),
            ("server.pid_file", path(&site.server.pid_file)),
            ("server.metrics", site.server.metrics.map_or("(none)".into(), |addr| addr.to_string())),
            ("log.file", path(&site.log.file)),
            ("log.count", site.log.count.to_string()),
            ("log.rotate", site.log.rotate.to_string()),
            ("pqact.config", path(&site.pqact.config)),
            ("pqact.datadir", path(&site.pqact.datadir)),
            ("scour.config", path(&site.scour_config)),
            ("check.time_servers", site.check.time_servers.join(", ")),
            ("check.time_limit", format!("{} s", site.check.time_limit.as_secs())),
            ("check.insertion_interval", format!("{} s", site.check.insertion_interval.as_secs())),
        ];
        lines.push(("ldm7", path(&self.exe)));
        lines.iter().map(|(key, value)| format!("{key:<26} {value}\n")).collect()
    }
}

/// The settings file when none is given: `$LDM7_SETTINGS`, else `$LDM7_HOME/etc/ldm7.toml`, else
/// `/etc/ldm7/ldm7.toml` (the package's).
pub fn default_settings_file() -> PathBuf {
    if let Some(file) = std::env::var_os("LDM7_SETTINGS") {
        return PathBuf::from(file);
    }
    if let Some(home) = std::env::var_os("LDM7_HOME") {
        return Path::new(&home).join("etc/ldm7.toml");
    }
    PathBuf::from("/etc/ldm7/ldm7.toml")
}
