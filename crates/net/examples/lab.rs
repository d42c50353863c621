//! A stand-alone `lab` binary with the subcommands of `ldm7 lab`, for trying the lab without the
//! `ldm7` binary: `cargo run -p ldm7-net --example lab -- up --spec examples/lab/one-receiver.toml`.
//!
//! ```text
//! lab up --spec LAB.toml
//! lab down [--spec LAB.toml | --name LAB]     # neither: the one lab that is up
//! lab status [--name LAB] [--json]
//! lab exec [--name LAB] HOST -- CMD [ARGS…]
//! ```
//!
//! Exit status: 0 ok, 1 bad usage or input (not root, bad spec, unknown lab or host), 2 runtime
//! failure, and for `exec` the command's own status.

use std::path::PathBuf;
use std::process::ExitCode;

use ldm7_net::lab::{self, LabError, LabSpec};

const USAGE: &str = "usage: lab up --spec LAB.toml | lab down [--spec LAB.toml | --name LAB] | \
                     lab status [--name LAB] [--json] | lab exec [--name LAB] HOST -- CMD [ARGS…]";

fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = Command::parse(&arguments) else {
        eprintln!("{USAGE}");
        return ExitCode::from(1);
    };
    match command.run() {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2))
        }
    }
}

/// A parsed command line.
enum Command {
    Up { spec: PathBuf },
    Down { spec: Option<PathBuf>, name: Option<String> },
    Status { name: Option<String>, json: bool },
    Exec { name: Option<String>, host: String, command: Vec<String> },
}

impl Command {
    /// `None` on bad usage.
    fn parse(arguments: &[String]) -> Option<Command> {
        let (subcommand, rest) = arguments.split_first()?;
        let (options, command) = match rest.iter().position(|a| a == "--") {
            Some(dash) => (&rest[..dash], rest[dash + 1..].to_vec()),
            None => (rest, Vec::new()),
        };
        let (mut spec, mut name, mut json, mut positional) = (None, None, false, Vec::new());
        let mut options = options.iter();
        while let Some(option) = options.next() {
            match option.as_str() {
                "--spec" => spec = Some(PathBuf::from(options.next()?)),
                "--name" => name = Some(options.next()?.clone()),
                "--json" => json = true,
                other if other.starts_with('-') => return None,
                other => positional.push(other.to_string()),
            }
        }
        match (subcommand.as_str(), positional.as_slice()) {
            ("up", []) if name.is_none() && !json && command.is_empty() => Some(Command::Up { spec: spec? }),
            ("down", []) if (spec.is_none() || name.is_none()) && !json => Some(Command::Down { spec, name }),
            ("status", []) if spec.is_none() => Some(Command::Status { name, json }),
            ("exec", [host]) if spec.is_none() && !json && !command.is_empty() => {
                Some(Command::Exec { name, host: host.clone(), command })
            }
            _ => None,
        }
    }

    /// Runs the command; returns the exit status.
    fn run(self) -> Result<i32, LabError> {
        match self {
            Command::Up { spec } => {
                let (lab, text) = LabSpec::read_file(&spec)?;
                let created = lab::up_with_progress(&lab, &text, &mut |step| eprintln!("lab {}: {step}", lab.name))?;
                eprintln!("lab {}: {}", lab.name, if created { "up" } else { "already up with this spec" });
                Ok(0)
            }
            Command::Down { spec, name } => {
                let removed = match (spec, name) {
                    (Some(path), _) => lab::down_spec(&LabSpec::from_file(&path)?)?,
                    (None, Some(name)) => lab::down(&name)?,
                    (None, None) => match lab::down_only()? {
                        Some(name) => {
                            eprint!("{name}: ");
                            true
                        }
                        None => {
                            eprintln!("no lab is up; nothing to do");
                            return Ok(0);
                        }
                    },
                };
                eprintln!("{}", if removed { "down" } else { "not up; nothing to do" });
                Ok(0)
            }
            Command::Status { name, json } => {
                let names = name.map_or_else(lab::labs, |name| vec![name]);
                let statuses = names.iter().map(|name| lab::status(name)).collect::<Result<Vec<_>, _>>()?;
                if json {
                    println!("{}", lab::statuses_json(&statuses));
                } else {
                    statuses.iter().for_each(|status| print!("{status}"));
                }
                Ok(0)
            }
            Command::Exec { name, host, command } => {
                let name = match name {
                    Some(name) => name,
                    None => lab::only_lab()?,
                };
                lab::exec(&name, &host, &command)
            }
        }
    }
}
