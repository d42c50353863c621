//! A trace replayed into a queue by `ldm7 insert --replay` in the background (a process of its
//! own, as an operator's `pqinsert` would be): the products' creation time is their insertion
//! time at the publisher.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{Result, TestbedError, io_error};

/// What to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// The trace (`SIZE YYYYMMDDhhmmss.fff [FEED]` lines).
    pub trace: PathBuf,
    /// Only the trace's first span of trace time (`None`: all of it).
    pub span: Option<Duration>,
    /// Replay speed (1 = the trace's pace, 0 = as fast as possible).
    pub speed: f64,
    /// Seed of the synthetic contents (another seed gives other signatures).
    pub seed: u64,
    /// At most this many products.
    pub limit: Option<usize>,
}

impl ReplayOptions {
    /// All of `trace` at `speed`, seed 1.
    pub fn new(trace: &Path, speed: f64) -> Self {
        Self { trace: trace.to_path_buf(), span: None, speed, seed: 1, limit: None }
    }
}

/// What `ldm7 insert --replay` reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplaySummary {
    /// Products inserted.
    pub products: u64,
    /// Seconds the replay took.
    pub seconds: f64,
}

/// A replay under way.
#[derive(Debug)]
pub struct Replay {
    queue: PathBuf,
    child: Option<Child>,
}

impl Replay {
    /// Starts replaying into `queue` with `exe insert`.
    pub fn start(exe: &Path, queue: &Path, options: &ReplayOptions) -> Result<Replay> {
        let mut command = Command::new(exe);
        command.arg("insert").arg("-q").arg(queue).arg("--replay").arg(&options.trace);
        command.args(["--speed", &options.speed.to_string(), "--seed", &options.seed.to_string()]);
        if let Some(span) = options.span {
            command.args(["--span", &format!("{}ms", span.as_millis())]);
        }
        if let Some(limit) = options.limit {
            command.args(["--limit", &limit.to_string()]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_error(format!("start {} insert", exe.display())))?;
        Ok(Replay { queue: queue.to_path_buf(), child: Some(child) })
    }

    /// Waits for the replay to finish and returns its summary.
    pub fn wait(mut self) -> Result<ReplaySummary> {
        let Some(child) = self.child.take() else {
            return Err(TestbedError::Replay { queue: self.queue.clone(), message: "already waited for".into() });
        };
        let output = child.wait_with_output().map_err(io_error("wait for ldm7 insert"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        let failure = |message: String| TestbedError::Replay { queue: self.queue.clone(), message };
        if !output.status.success() {
            return Err(failure(format!("exited with {}: {}", output.status, text.trim())));
        }
        parse_summary(&text).ok_or_else(|| failure(format!("no summary line in {:?}", text.trim())))
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Reads `replayed N products (X MB) in S s: …`.
fn parse_summary(text: &str) -> Option<ReplaySummary> {
    let line = text.lines().find(|line| line.starts_with("replayed "))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let products = words.get(1)?.parse().ok()?;
    let at = words.iter().position(|word| *word == "in")?;
    let seconds = words.get(at + 1)?.parse().ok()?;
    Some(ReplaySummary { products, seconds })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_is_read() {
        let text = "replayed 575 products (66.1 MB) in 11.94 s: 48 products/s, 5.5 MB/s; 0 duplicates, 0 evicted\n";
        assert_eq!(parse_summary(text), Some(ReplaySummary { products: 575, seconds: 11.94 }));
        assert_eq!(parse_summary("nothing"), None);
    }
}
