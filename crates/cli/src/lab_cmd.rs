//! `ldm7 lab up | down | status | exec`: the flags of the namespace test bed and their runner, over
//! the typed functions of `ldm7_net::lab` (`docs/lab.md`).
//!
//! Exit codes: 1 for bad input (spec, arguments, not root, unknown lab or host, missing tool), 2
//! for runtime failures, and for `exec` the command's own status.

use std::path::PathBuf;

use ldm7_net::lab::{self, LabError, LabSpec};

use crate::exit::{self, CmdResult};

/// The namespace test bed: hosts as network namespaces, one multipoint path per feed.
#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Bring a lab up from a spec (idempotent: a lab already up with the same spec is left alone).
    Up {
        /// The lab spec (TOML; see docs/lab.md and examples/lab/).
        #[arg(long, value_name = "LAB.toml")]
        spec: PathBuf,
    },
    /// Take a lab down, removing everything it created (without --spec or --name: the one lab
    /// that is up).
    Down {
        /// The spec it was brought up from (removes exactly the names the spec uses).
        #[arg(long, value_name = "LAB.toml", conflicts_with = "name")]
        spec: Option<PathBuf>,
        /// The lab name (uses the lab's state file).
        #[arg(long)]
        name: Option<String>,
    },
    /// Show the labs that are up: namespaces, control network, paths, legs and publisher tc counters.
    Status {
        /// Only this lab.
        #[arg(long)]
        name: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a command inside a lab host: `ldm7 lab exec HOST -- CMD ARGS…`.
    Exec {
        /// The lab (needed when more than one is up).
        #[arg(long)]
        name: Option<String>,
        /// The host to run in.
        host: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// A miniature IDD (root): a top publisher multicasting every feed by LDM-7 to relays, each
    /// relay feeding LDM-6 leaves that file with pqact; a generated IDD workload replayed in real
    /// time, optionally under faults (`--chaos`) and against an all-LDM-6 tree (`--ldm6`);
    /// completeness, latency, delivery modes, egress, CPU and memory per node; the monitor's
    /// dashboard.
    Idd(Box<IddArgs>),
}

/// Arguments of `ldm7 lab idd`.
#[derive(clap::Args, Debug, Clone)]
pub struct IddArgs {
    /// Relays subscribed to the top by LDM-7.
    #[arg(long, default_value_t = 8)]
    pub relays: usize,
    /// LDM-6 leaves per relay.
    #[arg(long, default_value_t = 3)]
    pub leaves: usize,
    /// Minutes of traffic (replayed in real time).
    #[arg(long, default_value_t = 20)]
    pub minutes: u32,
    /// The IDD's rates multiplied by this, so that the network fits the machine.
    #[arg(long, default_value_t = 0.02)]
    pub scale: f64,
    /// Seed of the workload, the delays and the losses.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The top's path rate.
    #[arg(long, default_value = "100 Mbit/s")]
    pub rate: ldm7_types::Rate,
    /// Each relay's path rate to its leaves.
    #[arg(long, default_value = "100 Mbit/s")]
    pub relay_rate: ldm7_types::Rate,
    /// Largest one-way delay of a leg, milliseconds (0: no delay, Linux bridges).
    #[arg(long, default_value_t = 20)]
    pub delay_max_ms: u64,
    /// Largest receive loss of a relay or a leaf, percent.
    #[arg(long, default_value_t = 1.0)]
    pub loss_max: f64,
    /// Faults during the replay, drawn from this seed: relays and leaves killed and started
    /// again, the top restarted, a relay's loss raised by 20% for a minute, a leaf's disk
    /// filled and freed. The same faults in both modes.
    #[arg(long, value_name = "SEED")]
    pub chaos: Option<u64>,
    /// Only these kinds of fault, comma-separated: relay, leaf, loss, top, disk [default: all].
    #[arg(long, value_name = "KINDS", value_delimiter = ',', requires = "chaos")]
    pub faults: Vec<String>,
    /// Keep the scratch directory (every node's log and state, not the queues nor the filed
    /// products) and print where.
    #[arg(long)]
    pub keep: bool,
    /// Then run the same network as an all-LDM-6 tree (the relays request from the top), same
    /// workload, same faults: the baseline, in the same invocation.
    #[arg(long)]
    pub ldm6: bool,
    /// Run no monitor (and take no dashboard screenshot).
    #[arg(long)]
    pub no_monitor: bool,
    /// Where the results go.
    #[arg(long, default_value = "experiments/results")]
    pub out: PathBuf,
    /// Directory for the nodes' queues and logs (default: the system temporary directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Runs a lab subcommand. `exec` exits with the command's own status when it is not 0.
pub fn run(command: &LabCommand) -> CmdResult {
    match command {
        LabCommand::Up { spec } => up(spec).map_err(failure),
        LabCommand::Down { spec, name } => down(spec.as_deref(), name.as_deref()),
        LabCommand::Status { name, json } => status(name.as_deref(), *json).map_err(failure),
        LabCommand::Idd(args) => ldm7_testbed::bench::idd::run(&ldm7_testbed::bench::idd::IddOptions {
            relays: args.relays,
            leaves: args.leaves,
            minutes: args.minutes,
            scale: args.scale,
            seed: args.seed,
            rate: args.rate,
            relay_rate: args.relay_rate,
            delay_max: std::time::Duration::from_millis(args.delay_max_ms),
            loss_max: args.loss_max,
            chaos: args.chaos,
            faults: args.faults.clone(),
            keep: args.keep,
            ldm6: args.ldm6,
            no_monitor: args.no_monitor,
            out: args.out.clone(),
            dir: args.dir.clone(),
        })
        .map_err(exit::runtime),
        LabCommand::Exec { name, host, command } => {
            let lab = match name {
                Some(name) => name.clone(),
                None => lab::only_lab().map_err(failure)?,
            };
            match lab::exec(&lab, host, command).map_err(failure)? {
                0 => Ok(()),
                code => std::process::exit(code),
            }
        }
    }
}

fn up(path: &std::path::Path) -> Result<(), LabError> {
    let (spec, text) = LabSpec::read_file(path)?;
    let created = lab::up_with_progress(&spec, &text, &mut |step| eprintln!("lab {}: {step}", spec.name))?;
    if created {
        eprintln!(
            "lab {}: up ({} hosts, {} feeds); try `ldm7 lab status --name {}`",
            spec.name,
            spec.hosts.len(),
            spec.feeds.len(),
            spec.name
        );
    } else {
        eprintln!("lab {}: already up with this spec; nothing to do", spec.name);
    }
    Ok(())
}

fn down(spec: Option<&std::path::Path>, name: Option<&str>) -> CmdResult {
    let (lab, removed) = match (spec, name) {
        (Some(path), _) => {
            let spec = LabSpec::from_file(path).map_err(|error| failure(error.into()))?;
            let removed = lab::down_spec(&spec).map_err(failure)?;
            (spec.name, removed)
        }
        (None, Some(name)) => (name.to_string(), lab::down(name).map_err(failure)?),
        (None, None) => match lab::down_only().map_err(failure)? {
            Some(name) => (name, true),
            None => {
                eprintln!("no lab is up; nothing to do");
                return Ok(());
            }
        },
    };
    if removed {
        eprintln!("lab {lab}: down; everything it created was removed");
    } else {
        eprintln!("lab {lab}: not up; nothing to do");
    }
    Ok(())
}

fn status(name: Option<&str>, json: bool) -> Result<(), LabError> {
    let names = match name {
        Some(name) => vec![name.to_string()],
        None => lab::labs(),
    };
    let statuses = names.iter().map(|name| lab::status(name)).collect::<Result<Vec<_>, _>>()?;
    let text = if json {
        format!("{}\n", lab::statuses_json(&statuses))
    } else if statuses.is_empty() {
        "no lab is up\n".to_owned()
    } else {
        statuses.iter().map(ToString::to_string).collect()
    };
    // A reader that stops early (`| head`) is not an error.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(())
}

/// A lab error with its exit class.
fn failure(error: LabError) -> exit::Failure {
    if error.exit_code() == 1 { exit::input(error) } else { exit::runtime(error) }
}
