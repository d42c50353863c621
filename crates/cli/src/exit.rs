//! Exit codes and the error type of the `ldm7` command: 0 ok, 1 bad usage or input, 2 runtime
//! failure. Every error says what was wrong and what to do.

use std::fmt;

/// The class of a failure, which decides the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Bad usage or input: exit 1.
    Input,
    /// The work failed while running: exit 2.
    Runtime,
    /// Reported already, or silent by design (`ldm7 admin isrunning`): exit with this code and
    /// print nothing more.
    Quiet(i32),
}

/// A failure with its class.
#[derive(Debug)]
pub struct Failure {
    /// Exit class.
    pub class: Class,
    /// What went wrong, with context.
    pub error: anyhow::Error,
}

impl Failure {
    /// The process exit code.
    pub fn exit_code(&self) -> i32 {
        match self.class {
            Class::Input => 1,
            Class::Runtime => 2,
            Class::Quiet(code) => code,
        }
    }

    /// A failure that exits with `code` and prints nothing (a child's status passed on).
    pub fn quiet(code: i32) -> Self {
        Self { class: Class::Quiet(code), error: anyhow::anyhow!("exit status {code}") }
    }

    /// Whether nothing is to be printed.
    pub fn is_quiet(&self) -> bool {
        matches!(self.class, Class::Quiet(_))
    }
}

/// The error and its causes, `: `-separated; a cause whose message the text already holds (errors
/// that print their source themselves) is not repeated.
impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.error.to_string();
        for cause in self.error.chain().skip(1) {
            let message = cause.to_string();
            if !text.contains(&message) {
                text.push_str(": ");
                text.push_str(&message);
            }
        }
        f.write_str(&text)
    }
}

/// Result of a subcommand.
pub type CmdResult<T = ()> = Result<T, Failure>;

/// Marks an error as bad input (exit 1).
pub fn input(error: impl Into<anyhow::Error>) -> Failure {
    Failure { class: Class::Input, error: error.into() }
}

/// Marks an error as a runtime failure (exit 2).
pub fn runtime(error: impl Into<anyhow::Error>) -> Failure {
    Failure { class: Class::Runtime, error: error.into() }
}

/// Shorthand: a bad-input failure from a message.
pub fn bad_input(message: impl fmt::Display) -> Failure {
    input(anyhow::anyhow!("{message}"))
}

/// The test bed's failures (the demo, a replay): bad input exits 1, the rest 2.
impl From<ldm7_testbed::RunError> for Failure {
    fn from(error: ldm7_testbed::RunError) -> Self {
        match error {
            ldm7_testbed::RunError::Input(message) => bad_input(message),
            ldm7_testbed::RunError::Runtime(error) => runtime(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open {path}: {source}")]
    struct Open {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn causes_are_printed_once() {
        let open = Open { path: "q.pq", source: std::io::Error::other("no such queue") };
        assert_eq!(runtime(open).to_string(), "cannot open q.pq: no such queue");
        let io = std::io::Error::other("refused");
        let failure = runtime(anyhow::Error::new(io).context("cannot connect to h:388"));
        assert_eq!(failure.to_string(), "cannot connect to h:388: refused");
    }
}
