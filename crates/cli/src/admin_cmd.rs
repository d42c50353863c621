//! `ldm7 admin` (`ldmadmin`): LDM's `ldmadmin` subcommands over an ldm7 site, its settings read
//! from one file (`ldm7.toml`; docs/operations.md has the table of subcommands). The work is
//! `ldm7_admin`'s; subcommands that are other `ldm7` commands (`mkqueue`, `queuecheck`,
//! `watch`, `scour`) run them with the site's paths.

use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use clap::Subcommand;
use ldm7_admin::control::StartOptions;
use ldm7_admin::import::{ImportPlan, import};
use ldm7_admin::{Site, default_settings_file};

use crate::common::duration_arg;
use crate::exit::{CmdResult, Failure, bad_input, input, runtime};
use crate::logging::LogArgs;

/// Arguments of `ldm7 admin` / `ldmadmin`.
#[derive(clap::Args, Debug)]
#[command(arg_required_else_help = true)]
pub struct AdminArgs {
    /// The site's settings file [default: $LDM7_SETTINGS, else $LDM7_HOME/etc/ldm7.toml, else
    /// /etc/ldm7/ldm7.toml].
    #[arg(long = "settings", value_name = "LDM7_TOML", global = true)]
    pub settings: Option<PathBuf>,
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// LDM's `ldmadmin` subcommands.
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Start the server in the background after LDM's pre-checks (-v/-x are the global flags).
    Start(StartArgs),
    /// Stop the server (it drains and exits).
    Stop,
    /// Run the server in the foreground (for systemd's ExecStart; not in LDM): the pid file,
    /// then the server in this process.
    Run(StartArgs),
    /// Only the pre-checks of start (for systemd's ExecStartPre; not in LDM).
    Precheck(StartArgs),
    /// Stop the server if it runs, then start it.
    Restart(StartArgs),
    /// Create the product queue with the settings' size and slots.
    Mkqueue(MkqueueArgs),
    /// Delete the product queue (not while the server runs).
    Delqueue(QueueArg),
    /// Not applicable: ldm7 has no pqsurf.
    Mksurfqueue,
    /// Not applicable: ldm7 has no pqsurf.
    Delsurfqueue,
    /// Rotate the log file (FILE → FILE.1 …), and have the server reopen it.
    Newlog(NewlogArgs),
    /// Delete old files from the directories of the site's scour.conf.
    Scour(ScourArgs),
    /// Exit 0 if the server runs, else 1.
    Isrunning,
    /// Check that a product was inserted recently.
    Checkinsertion,
    /// Vet the queue's size against the maximum latency (its minimum residence time).
    Vetqueuesize,
    /// Check everything: running, clock, insertion, queue size; exit 1 with what to do.
    Check,
    /// Print a line per product as it arrives.
    Watch(WatchArgs),
    /// Check the pqact configurations ldmd.conf's EXEC entries name (or -p FILE).
    Pqactcheck(PqactcheckArgs),
    /// Have the server's pqact children reread their configuration (SIGHUP).
    #[command(name = "pqactHUP", alias = "pqacthup")]
    PqactHup,
    /// Check the product queue for corruption (reads every product).
    Queuecheck,
    /// Print the site's settings.
    Config,
    /// Page through the log file.
    Log,
    /// Follow the log file.
    Tail,
    /// Check the clock against the time servers.
    Checktime,
    /// Clean up after an abnormal end (a stale pid file).
    Clean,
    /// Not applicable: see `ldm7 serve --metrics` (Prometheus) and the monitor.
    Printmetrics,
    /// Not applicable: see `ldm7 serve --metrics` (Prometheus) and the monitor.
    Addmetrics,
    /// Not applicable: see `ldm7 serve --metrics` (Prometheus) and the monitor's dashboard.
    Plotmetrics,
    /// Not applicable: see `ldm7 serve --metrics` (Prometheus) and the monitor.
    Newmetrics,
    /// Print the site's settings (as `config`).
    Showsettings,
    /// Not applicable: the GEMPAK tables are GEMPAK's.
    Updategempaktables,
    /// Print this usage.
    Usage,
}

/// `start` and `restart`'s flags (ldmadmin's).
#[derive(clap::Args, Debug)]
pub struct StartArgs {
    /// Ignore products older than this, e.g. 3600 (seconds) [default: [server] max_latency].
    #[arg(short = 'm', value_name = "MAX_LATENCY", value_parser = duration_arg)]
    pub max_latency: Option<Duration>,
    /// How far back a fresh REQUEST asks [default: [server] time_offset].
    #[arg(short = 'o', value_name = "OFFSET", value_parser = duration_arg)]
    pub time_offset: Option<Duration>,
    /// The product queue [default: [queue] path].
    #[arg(short = 'q', value_name = "QUEUE")]
    pub queue: Option<PathBuf>,
    /// Most clients at once [default: [server] max_clients].
    #[arg(short = 'M', value_name = "MAX_CLIENTS")]
    pub max_clients: Option<u32>,
    /// The configuration file [default: [server] config].
    #[arg(value_name = "CONF_FILE")]
    pub config: Option<PathBuf>,
}

/// `mkqueue`'s flags.
#[derive(clap::Args, Debug)]
pub struct MkqueueArgs {
    /// Replace an existing queue (its products are lost; LDM's clobber).
    #[arg(short = 'c')]
    pub clobber: bool,
    /// Accepted for LDM's "fast" creation; an ldm7 queue is always written out in full.
    #[arg(short = 'f')]
    pub fast: bool,
    #[command(flatten)]
    pub queue: QueueArg,
}

/// A queue other than the settings'.
#[derive(clap::Args, Debug)]
pub struct QueueArg {
    /// The product queue [default: [queue] path].
    #[arg(short = 'q', value_name = "QUEUE")]
    pub queue: Option<PathBuf>,
}

/// `newlog`'s flags.
#[derive(clap::Args, Debug)]
pub struct NewlogArgs {
    /// Old log files kept [default: [log] count].
    #[arg(short = 'n', value_name = "NUMLOGS")]
    pub count: Option<u32>,
}

/// `scour`'s flags.
#[derive(clap::Args, Debug)]
pub struct ScourArgs {
    /// Also delete directories that are or become empty.
    #[arg(short = 'd')]
    pub delete_dirs: bool,
}

/// `watch`'s flags.
#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// Only products of this feedtype expression.
    #[arg(short = 'f', value_name = "FEEDSET", default_value = "ANY")]
    pub feed: String,
}

/// `pqactcheck`'s flags.
#[derive(clap::Args, Debug)]
pub struct PqactcheckArgs {
    /// Check this pqact configuration file only.
    #[arg(short = 'p', value_name = "PQACT_CONF")]
    pub pqact_conf: Option<PathBuf>,
    /// The ldmd.conf whose EXEC entries name the files [default: [server] config].
    #[arg(value_name = "LDMD_CONF", conflicts_with = "pqact_conf")]
    pub ldmd_conf: Option<PathBuf>,
}

/// Arguments of `ldm7 import`.
#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// The LDM home (LDMHOME: where ldmd runs, with etc/registry.xml and the .info files).
    #[arg(value_name = "LDMHOME")]
    pub ldm_home: PathBuf,
    /// The registry [default: LDMHOME/etc/registry.xml].
    #[arg(long = "registry", value_name = "FILE")]
    pub registry: Option<PathBuf>,
    /// The ldm7 home to write [default: $LDM7_HOME].
    #[arg(long = "to", value_name = "DIR")]
    pub to: Option<PathBuf>,
}

/// Runs `ldm7 import`.
pub fn import_home(args: &ImportArgs) -> CmdResult {
    let home = match (&args.to, std::env::var_os("LDM7_HOME")) {
        (Some(to), _) => to.clone(),
        (None, Some(home)) => PathBuf::from(home),
        (None, None) => return Err(bad_input("give the ldm7 home to write with --to DIR (or set LDM7_HOME)")),
    };
    let plan = ImportPlan {
        registry: args.registry.clone().unwrap_or_else(|| args.ldm_home.join("etc/registry.xml")),
        ldm_home: args.ldm_home.clone(),
        home: home.clone(),
        exe: std::env::current_exe().map_err(runtime)?,
    };
    let report = import(&plan).map_err(input)?;
    print!("{report}");
    println!(
        "next: ldm7 admin --settings {0}/etc/ldm7.toml mkqueue; ldm7 admin --settings {0}/etc/ldm7.toml start",
        home.display()
    );
    Ok(())
}

/// Runs `ldm7 admin`.
pub fn run(args: &AdminArgs, log: &LogArgs) -> CmdResult {
    if let AdminCommand::Usage = args.command {
        print_usage();
        return Ok(());
    }
    if let Some(why) = not_applicable(&args.command) {
        return Err(bad_input(why));
    }
    let settings = args.settings.clone().unwrap_or_else(default_settings_file);
    let site = Site::load(&settings, std::env::current_exe().map_err(runtime)?).map_err(input)?;
    let queue_of = |arg: &Option<PathBuf>| arg.clone().unwrap_or_else(|| site.site.queue.path.clone());
    match &args.command {
        AdminCommand::Start(start) => {
            let pid = site.start(&start_options(start, log)).map_err(input)?;
            println!("the server runs (pid {pid}); log: {}", site.site.log.file.display());
        }
        AdminCommand::Run(start) => return Err(input(site.run_in_foreground(&start_options(start, log)))),
        AdminCommand::Precheck(start) => {
            site.pre_checks(&start_options(start, log)).map_err(input)?;
            println!(
                "pre-checks passed: the queue, {} and its pqact configurations",
                site.site.server.config.display()
            );
        }
        AdminCommand::Stop => {
            let pid = site.stop().map_err(input)?;
            println!("the server (pid {pid}) stopped");
        }
        AdminCommand::Restart(start) => {
            if site.running().is_some() {
                site.stop().map_err(input)?;
            }
            let pid = site.start(&start_options(start, log)).map_err(input)?;
            println!("the server runs (pid {pid})");
        }
        AdminCommand::Mkqueue(mkqueue) => {
            let queue = queue_of(&mkqueue.queue.queue);
            if mkqueue.clobber && site.running().is_some() {
                return Err(bad_input("the server is running: stop it before replacing its queue"));
            }
            if let Some(dir) = queue.parent() {
                std::fs::create_dir_all(dir).map_err(runtime)?;
            }
            let mut command = site_program(&site, ["queue", "create", "--path"]);
            command.arg(&queue).args(["--size", &site.site.queue.size.to_string()]);
            if let Some(slots) = site.site.queue.slots {
                command.args(["--slots", &slots.to_string()]);
            }
            if mkqueue.clobber {
                command.arg("--force");
            }
            status_of(command)?;
            site.give_to_user(&[queue]).map_err(runtime)?;
        }
        AdminCommand::Delqueue(queue) => {
            if let Some(pid) = site.running() {
                return Err(bad_input(format!("the server is running (pid {pid}): stop it before deleting its queue")));
            }
            let queue = queue_of(&queue.queue);
            ldm7_pq::Queue::remove(&queue).map_err(input)?;
            println!("deleted product queue {}", queue.display());
        }
        AdminCommand::Newlog(newlog) => {
            site.newlog(newlog.count.unwrap_or(site.site.log.count)).map_err(runtime)?;
            println!("rotated {}", site.site.log.file.display());
        }
        AdminCommand::Scour(scour) => {
            let mut command = site_program(&site, ["scour", "--datadir"]);
            command.arg(&site.site.pqact.datadir);
            if scour.delete_dirs {
                command.arg("-d");
            }
            command.arg(&site.site.scour_config);
            status_of(command)?;
        }
        AdminCommand::Isrunning => {
            if site.running().is_none() {
                return Err(Failure::quiet(1));
            }
        }
        AdminCommand::Checkinsertion | AdminCommand::Vetqueuesize => {
            let queue = ldm7_pq::Queue::open(&site.site.queue.path).map_err(input)?;
            let stats = queue.stats().map_err(runtime)?;
            let finding = if let AdminCommand::Vetqueuesize = args.command {
                site.vet_queue_size(&stats)
            } else {
                site.check_insertion(&stats, ldm7_types::Timestamp::from_system_time(std::time::SystemTime::now()))
            };
            report(&[finding])?;
        }
        AdminCommand::Checktime => report(&[site.check_time()])?,
        AdminCommand::Check => report(&site.check())?,
        AdminCommand::Watch(watch) => {
            let mut command = site_program(&site, ["watch", "-f", &watch.feed, "-q"]);
            command.arg(&site.site.queue.path);
            status_of(command)?;
        }
        AdminCommand::Pqactcheck(check) => pqactcheck(&site, check)?,
        AdminCommand::PqactHup => {
            let children = site.hup_pqact().map_err(input)?;
            if children.is_empty() {
                return Err(bad_input("the server has no pqact child to signal"));
            }
            println!("sent SIGHUP to pqact {children:?}");
        }
        AdminCommand::Queuecheck => {
            let mut command = site_program(&site, ["queue", "check", "--path"]);
            command.arg(&site.site.queue.path);
            status_of(command)?;
        }
        AdminCommand::Config | AdminCommand::Showsettings => print!("{}", site.describe()),
        AdminCommand::Log => {
            let pager = std::env::var("PAGER").unwrap_or_else(|_| "less".into());
            let mut command = if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                Command::new(pager)
            } else {
                Command::new("cat")
            };
            command.arg(&site.site.log.file);
            status_of(command)?;
        }
        AdminCommand::Tail => {
            let mut command = Command::new("tail");
            command.arg("-F").arg(&site.site.log.file);
            status_of(command)?;
        }
        AdminCommand::Clean => {
            let removed = site.clean().map_err(input)?;
            if removed.is_empty() {
                println!("nothing to clean");
            }
            for path in removed {
                println!("removed {}", path.display());
            }
        }
        AdminCommand::Mksurfqueue
        | AdminCommand::Delsurfqueue
        | AdminCommand::Printmetrics
        | AdminCommand::Addmetrics
        | AdminCommand::Plotmetrics
        | AdminCommand::Newmetrics
        | AdminCommand::Updategempaktables
        | AdminCommand::Usage => unreachable!("answered above"),
    }
    Ok(())
}

/// Why a subcommand of LDM's does not apply to ldm7, if it does not.
fn not_applicable(command: &AdminCommand) -> Option<&'static str> {
    Some(match command {
        AdminCommand::Mksurfqueue | AdminCommand::Delsurfqueue => {
            "not applicable: ldm7 has no pqsurf (its queue is pqsurf's; surface products are filed by pqact entries)"
        }
        AdminCommand::Printmetrics | AdminCommand::Addmetrics | AdminCommand::Newmetrics => {
            "not applicable: ldm7 serves its metrics to Prometheus (`[server] metrics`, /metrics) and publishes \
             per-minute statistics to the monitor; LDM's metrics file (top and netstat samples) is not kept"
        }
        AdminCommand::Plotmetrics => {
            "not applicable: the monitor's dashboard plots ldm7's statistics (`ldm7 monitor`); LDM's metrics file is not kept"
        }
        AdminCommand::Updategempaktables => {
            "not applicable: the GEMPAK tables belong to GEMPAK (Unidata's script fetches them; run it as before)"
        }
        _ => return None,
    })
}

fn start_options(args: &StartArgs, log: &LogArgs) -> StartOptions {
    StartOptions {
        verbose: log.verbose,
        debug: log.debug,
        max_latency: args.max_latency,
        time_offset: args.time_offset,
        queue: args.queue.clone(),
        max_clients: args.max_clients,
        config: args.config.clone(),
    }
}

/// Another `ldm7` command run for the site: in its home, with its settings.
fn site_program<const N: usize>(site: &Site, args: [&str; N]) -> Command {
    let mut command = Command::new(&site.exe);
    command.args(args).current_dir(&site.site.home).env("LDM7_SETTINGS", &site.settings_file);
    command
}

/// Runs a command to its end: its exit status is this one's.
fn status_of(mut command: Command) -> CmdResult {
    let status: ExitStatus = command.status().map_err(|error| runtime(anyhow::anyhow!("{command:?}: {error}")))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => Err(Failure::quiet(code)),
        None => Err(runtime(anyhow::anyhow!("{command:?}: {status}"))),
    }
}

/// Prints findings; a problem among them makes the exit status 1.
fn report(findings: &[ldm7_admin::checks::Finding]) -> CmdResult {
    for finding in findings {
        println!("{finding}");
    }
    let problems = findings.iter().filter(|finding| finding.problem).count();
    if problems > 0 {
        return Err(bad_input(format!("{problems} problem(s): see above")));
    }
    Ok(())
}

fn pqactcheck(site: &Site, args: &PqactcheckArgs) -> CmdResult {
    let checks = match &args.pqact_conf {
        Some(file) => vec![(format!("{}", file.display()), file.clone(), ldm7_admin::pqact::check_file(file))],
        None => {
            let conf = args.ldmd_conf.clone().unwrap_or_else(|| site.site.server.config.clone());
            let config = ldm7_config::ldmd::Config::load(&conf).map_err(input)?;
            ldm7_admin::pqact::check_execs(site, &config)
                .into_iter()
                .map(|check| (check.exec, check.file, check.result))
                .collect()
        }
    };
    if checks.is_empty() {
        println!("no EXEC entry runs pqact");
    }
    let mut failed = 0;
    for (exec, file, result) in checks {
        match result {
            Ok(entries) => println!("ok       {}: {entries} entries ({exec})", file.display()),
            Err(error) => {
                failed += 1;
                println!("PROBLEM  {error} ({exec})");
            }
        }
    }
    if failed > 0 {
        return Err(bad_input(format!("{failed} pqact configuration(s) have errors: see above")));
    }
    Ok(())
}

fn print_usage() {
    use clap::CommandFactory;
    #[derive(clap::Parser)]
    #[command(name = "ldm7 admin")]
    struct Usage {
        #[command(flatten)]
        args: AdminArgs,
    }
    let _ = Usage::command().print_long_help();
}
