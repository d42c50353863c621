//! The thin layer that runs system commands (`ip`, `tc`, `iptables`, `vde_switch`, `wirefilter`).
//!
//! Every call goes through [`Cmd`], so every failure is a [`CommandError`] that names the exact
//! command line, its exit status and what it printed on stderr. Nothing here decides anything;
//! callers build the argument lists (mostly in pure, unit-tested planning code).

use std::fmt;
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};

/// A command that could not be started or that exited unsuccessfully.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The program could not be started at all (usually: not installed).
    #[error("could not run `{command}`: {source}; is {program} installed? ({hint})")]
    Spawn {
        /// The full command line.
        command: String,
        /// The program name.
        program: String,
        /// Which package provides it.
        hint: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The program ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The full command line.
        command: String,
        /// The exit status as text.
        status: String,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
}

impl CommandError {
    /// The stderr text of a failed command ("" when it could not start).
    pub fn stderr(&self) -> &str {
        match self {
            CommandError::Failed { stderr, .. } => stderr,
            CommandError::Spawn { .. } => "",
        }
    }
}

/// A command line to run, optionally inside a network namespace.
#[derive(Debug, Clone)]
pub struct Cmd {
    netns: Option<String>,
    program: String,
    args: Vec<String>,
}

impl Cmd {
    /// `program` with no arguments, in the current network namespace.
    pub fn new(program: &str) -> Cmd {
        Cmd { netns: None, program: program.to_string(), args: Vec::new() }
    }

    /// Runs the command inside network namespace `netns` (through `ip netns exec`).
    pub fn netns(mut self, netns: Option<&str>) -> Cmd {
        self.netns = netns.map(str::to_string);
        self
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Cmd {
        self.args.push(arg.into());
        self
    }

    /// Appends several arguments.
    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Runs the command, waits for it and returns its stdout.
    pub fn run(&self) -> Result<String, CommandError> {
        tracing::debug!(command = %self, "run");
        let output = self.command().stdin(Stdio::null()).output().map_err(|source| self.spawn_error(source))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(CommandError::Failed {
                command: self.to_string(),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            })
        }
    }

    /// Runs a program that daemonizes itself: its output goes to `log`, and the call returns when
    /// the foreground process exits. On failure the error carries the log's tail.
    pub fn run_daemon(&self, log: &Path) -> Result<(), CommandError> {
        tracing::debug!(command = %self, "start daemon");
        let out = File::create(log).map_err(|source| self.spawn_error(source))?;
        let err = out.try_clone().map_err(|source| self.spawn_error(source))?;
        let status = self
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .status()
            .map_err(|source| self.spawn_error(source))?;
        if status.success() {
            Ok(())
        } else {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            Err(CommandError::Failed {
                command: self.to_string(),
                status: status.to_string(),
                stderr: text.trim().chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect(),
            })
        }
    }

    /// Runs the command with the caller's stdin, stdout and stderr; returns its exit code
    /// (128 + signal number when killed by a signal).
    pub fn run_interactive(&self) -> Result<i32, CommandError> {
        let status = self.command().status().map_err(|source| self.spawn_error(source))?;
        Ok(status.code().unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            128 + status.signal().unwrap_or(0)
        }))
    }

    fn command(&self) -> Command {
        match &self.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, &self.program]).args(&self.args);
                command
            }
            None => {
                let mut command = Command::new(&self.program);
                command.args(&self.args);
                command
            }
        }
    }

    fn spawn_error(&self, source: std::io::Error) -> CommandError {
        let program = if self.netns.is_some() && source.kind() == std::io::ErrorKind::NotFound {
            "ip".to_string()
        } else {
            self.program.clone()
        };
        CommandError::Spawn { command: self.to_string(), hint: package_hint(&program), program, source }
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(netns) = &self.netns {
            write!(f, "ip netns exec {netns} ")?;
        }
        write!(f, "{}", self.program)?;
        for arg in &self.args {
            if arg.is_empty() || arg.contains(char::is_whitespace) {
                write!(f, " '{arg}'")?;
            } else {
                write!(f, " {arg}")?;
            }
        }
        Ok(())
    }
}

/// Which Debian package provides `program`.
fn package_hint(program: &str) -> &'static str {
    match program {
        "ip" | "tc" | "bridge" => "install iproute2",
        "iptables" => "apt-get install -y iptables",
        "vde_switch" => "apt-get install -y vde2 (package vde-switch)",
        "wirefilter" => "apt-get install -y vde2 (package vde-wirefilter)",
        "vde_plug" => "apt-get install -y vde2 (package vdeplug)",
        _ => "check PATH",
    }
}

/// True when `program` can be found on PATH.
pub fn program_exists(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_shows_the_namespace_and_quotes_spaces() {
        let cmd = Cmd::new("tc").netns(Some("lab-pub")).args(["qdisc", "show"]).arg("a b");
        assert_eq!(cmd.to_string(), "ip netns exec lab-pub tc qdisc show 'a b'");
    }

    #[test]
    fn failures_name_the_command_and_stderr() {
        let error = Cmd::new("sh").args(["-c", "echo oops >&2; exit 3"]).run().unwrap_err();
        let text = error.to_string();
        assert!(text.contains("`sh -c 'echo oops >&2; exit 3'` failed"), "{text}");
        assert!(text.contains("oops"), "{text}");
    }

    #[test]
    fn missing_programs_say_what_to_install() {
        let error = Cmd::new("wirefilter-does-not-exist").run().unwrap_err();
        assert!(matches!(error, CommandError::Spawn { .. }), "{error}");
    }
}
