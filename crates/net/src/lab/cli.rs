//! `ldm7 lab …`: the clap subcommands and their runner, so that the `ldm7` binary wires the lab
//! with one line (`Command::Lab(command) => ldm7_net::lab::run_lab(command)`).

use std::path::PathBuf;

use super::{LabError, LabSpec, spec};

/// The namespace test bed: hosts as network namespaces, one multipoint path per feed.
#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Bring a lab up from a spec (idempotent: a lab already up with the same spec is left alone).
    Up {
        /// The lab spec (TOML; see docs/lab.md and examples/lab/).
        #[arg(long, value_name = "LAB.toml")]
        spec: PathBuf,
    },
    /// Take a lab down, removing everything it created.
    Down {
        /// The spec it was brought up from (removes exactly the names the spec uses).
        #[arg(long, value_name = "LAB.toml", required_unless_present = "name", conflicts_with = "name")]
        spec: Option<PathBuf>,
        /// The lab name (uses the lab's state file).
        #[arg(long)]
        name: Option<String>,
    },
    /// Show the labs that are up: namespaces, paths, legs and publisher tc counters.
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

/// Runs a lab subcommand. Errors carry their exit class ([`LabError::exit_code`]); for `exec`, a
/// command that exits non-zero yields [`LabError::ExecStatus`], whose code the binary should exit
/// with without printing anything more.
pub fn run_lab(command: LabCommand) -> Result<(), LabError> {
    match command {
        LabCommand::Up { spec } => {
            let text = std::fs::read_to_string(&spec).map_err(|e| {
                spec::SpecError(format!("cannot read {}: {e}; pass --spec with a lab TOML file", spec.display()))
            })?;
            let lab = LabSpec::from_toml_str(&text)
                .map_err(|spec::SpecError(message)| spec::SpecError(format!("{}: {message}", spec.display())))?;
            let created = super::up_with_progress(&lab, &text, &mut |step| eprintln!("lab {}: {step}", lab.name))?;
            if created {
                eprintln!(
                    "lab {}: up ({} hosts, {} feeds); try `ldm7 lab status --name {}`",
                    lab.name,
                    lab.hosts.len(),
                    lab.feeds.len(),
                    lab.name
                );
            } else {
                eprintln!("lab {}: already up with this spec; nothing to do", lab.name);
            }
            Ok(())
        }
        LabCommand::Down { spec, name } => {
            let (lab, removed) = match (spec, name) {
                (Some(path), _) => {
                    let lab = LabSpec::from_file(&path)?;
                    let removed = super::down_spec(&lab)?;
                    (lab.name, removed)
                }
                (None, Some(name)) => {
                    let removed = super::down(&name)?;
                    (name, removed)
                }
                (None, None) => return Err(spec::SpecError("lab down needs --spec or --name".into()).into()),
            };
            if removed {
                eprintln!("lab {lab}: down; everything it created was removed");
            } else {
                eprintln!("lab {lab}: not up; nothing to do");
            }
            Ok(())
        }
        LabCommand::Status { name, json } => {
            let names = match name {
                Some(name) => vec![name],
                None => super::labs(),
            };
            let mut statuses = Vec::new();
            for name in names {
                statuses.push(super::status(&name)?);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&statuses).unwrap_or_default());
            } else if statuses.is_empty() {
                println!("no lab is up");
            } else {
                for status in &statuses {
                    print_status(status);
                }
            }
            Ok(())
        }
        LabCommand::Exec { name, host, command } => {
            let lab = match name {
                Some(name) => name,
                None => only_lab()?,
            };
            match super::exec(&lab, &host, &command)? {
                0 => Ok(()),
                code => Err(LabError::ExecStatus(code)),
            }
        }
    }
}

fn only_lab() -> Result<String, LabError> {
    let labs = super::labs();
    match labs.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(LabError::NotFound("no lab is up; bring one up with `ldm7 lab up --spec LAB.toml`".into())),
        many => Err(LabError::NotFound(format!("several labs are up ({many:?}); say which with --name"))),
    }
}

fn print_status(status: &super::LabStatus) {
    println!("lab {}{}", status.name, if status.complete { "" } else { " (incomplete: run `ldm7 lab down`)" });
    for (namespace, exists) in &status.namespaces {
        println!("  netns {namespace:<24} {}", if *exists { "present" } else { "MISSING" });
    }
    for path in &status.paths {
        let legs: Vec<String> = path.legs.iter().map(ToString::to_string).collect();
        println!("  path {:<12} {:>14}  {}  legs: {}", path.name, path.rate.to_string(), path.detail, legs.join(", "));
    }
    for (feed, counters) in &status.publishers {
        match counters {
            Ok(counters) => {
                for class in &counters.classes {
                    let role = match class.class_id.as_str() {
                        crate::tc::PATH_CLASS => "path",
                        crate::tc::MULTICAST_CLASS => "multicast",
                        crate::tc::RETX_CLASS => "retransmission",
                        _ => "other",
                    };
                    println!(
                        "  tc {feed:<12} {:<5} {role:<14} sent {} B {} pkt, dropped {}, overlimits {}, backlog {} B {} pkt",
                        class.class_id,
                        class.sent_bytes,
                        class.sent_packets,
                        class.dropped_packets,
                        class.overlimits,
                        class.backlog_bytes,
                        class.backlog_packets
                    );
                }
            }
            Err(error) => println!("  tc {feed:<12} unreadable: {error}"),
        }
    }
}
