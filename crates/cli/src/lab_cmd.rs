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
}

/// Runs a lab subcommand. `exec` exits with the command's own status when it is not 0.
pub fn run(command: &LabCommand) -> CmdResult {
    match command {
        LabCommand::Up { spec } => up(spec).map_err(failure),
        LabCommand::Down { spec, name } => down(spec.as_deref(), name.as_deref()),
        LabCommand::Status { name, json } => status(name.as_deref(), *json).map_err(failure),
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
    if json {
        println!("{}", lab::statuses_json(&statuses));
    } else if statuses.is_empty() {
        println!("no lab is up");
    } else {
        for status in &statuses {
            print!("{status}");
        }
    }
    Ok(())
}

/// A lab error with its exit class.
fn failure(error: LabError) -> exit::Failure {
    if error.exit_code() == 1 { exit::input(error) } else { exit::runtime(error) }
}
