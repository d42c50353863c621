//! Child processes of PIPE and EXEC entries.
//!
//! A PIPE decoder reads products on its standard input. The main loop never writes to it: each
//! decoder has a writer thread and a backlog of whole products (at most [`BACKLOG_MAX`] bytes),
//! so a slow decoder holds up only its own entry. A decoder that exits, or that takes no bytes
//! for the pipe timeout while products wait, is given up (a stalled one is killed); the products
//! it had not taken whole are handed to the decoder started for the next product, each at most
//! once more. Every child's standard error is logged line by line and its exit status when it
//! ends.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The most bytes of products waiting for one decoder before the main loop waits for it.
pub const BACKLOG_MAX: usize = 64 << 20;

/// How often an idle writer looks whether its decoder has ended.
const EXIT_CHECK: Duration = Duration::from_millis(50);

/// A product for a decoder: the bytes it is sent, and how many decoders it was given to.
#[derive(Debug)]
struct Message {
    bytes: Arc<Vec<u8>>,
    tries: u8,
}

#[derive(Debug)]
struct Backlog {
    messages: VecDeque<Message>,
    bytes: usize,
    closing: bool,
    /// Why the decoder can take nothing more.
    dead: Option<String>,
    last_progress: Instant,
    /// The writer has closed the decoder's input (it then waits for the decoder to end).
    input_closed: bool,
    /// The decoder has ended.
    exited: bool,
}

#[derive(Debug)]
struct Shared {
    backlog: Mutex<Backlog>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One running decoder.
#[derive(Debug)]
pub struct Decoder {
    command: String,
    pid: u32,
    shared: Arc<Shared>,
}

/// Products a decoder could not take, for the next one.
#[derive(Debug, Default)]
pub struct Leftovers(Vec<Message>);

impl Leftovers {
    /// How many products.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A decoder cannot be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the decoder \"{command}\": {source}")]
pub struct SpawnError {
    /// The command line.
    pub command: String,
    /// Why.
    pub source: std::io::Error,
}

fn command_line(argv: &[String]) -> String {
    argv.join(" ")
}

fn build(argv: &[String]) -> Command {
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    // Its own process group: signals for ldm7 act (a terminal's Ctrl-C, the server's SIGTERM
    // to its group) do not reach the decoders, which end when their input does.
    command.process_group(0);
    command.stderr(Stdio::piped());
    command
}

impl Decoder {
    /// Starts `argv` with its standard input a pipe from us, handing it `leftovers` first.
    pub fn start(argv: &[String], leftovers: Leftovers) -> Result<Self, SpawnError> {
        let text = command_line(argv);
        let mut command = build(argv);
        command.stdin(Stdio::piped());
        let mut child = command.spawn().map_err(|source| SpawnError { command: text.clone(), source })?;
        let pid = child.id();
        tracing::debug!("act: started decoder \"{text}\" [{pid}]");
        log_stderr(&text, pid, child.stderr.take());
        let bytes = leftovers.0.iter().map(|message| message.bytes.len()).sum();
        let shared = Arc::new(Shared {
            backlog: Mutex::new(Backlog {
                messages: leftovers.0.into(),
                bytes,
                closing: false,
                dead: None,
                last_progress: Instant::now(),
                input_closed: false,
                exited: false,
            }),
            changed: Condvar::new(),
        });
        {
            let shared = Arc::clone(&shared);
            let command = text.clone();
            // Detached: after closing the input it waits for the decoder to end and logs how.
            std::thread::Builder::new()
                .name("act-pipe".into())
                .spawn(move || write_loop(&command, child, &shared))
                .map_err(|source| SpawnError { command: text.clone(), source })?;
        }
        Ok(Self { command: text, pid, shared })
    }

    /// Whether the decoder can take nothing more (it exited or was given up).
    pub fn is_dead(&self) -> bool {
        self.shared.lock().dead.is_some()
    }

    /// Queues a product's bytes. Waits while the backlog is full; a decoder that takes nothing
    /// for `timeout` meanwhile is given up and `Err` returns the bytes.
    pub fn send(&self, bytes: Vec<u8>, timeout: Duration) -> Result<(), Vec<u8>> {
        let fits = |backlog: &Backlog| backlog.bytes == 0 || backlog.bytes + bytes.len() <= BACKLOG_MAX;
        let waited = self.wait_while(timeout, |backlog| backlog.dead.is_none() && !fits(backlog));
        let Some(mut backlog) = waited.filter(|backlog| backlog.dead.is_none()) else {
            return Err(bytes);
        };
        backlog.bytes += bytes.len();
        backlog.messages.push_back(Message { bytes: Arc::new(bytes), tries: 0 });
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Waits while `waiting` holds of the backlog; a decoder that takes nothing for `timeout`
    /// meanwhile is given up (`None`).
    fn wait_while(&self, timeout: Duration, waiting: impl Fn(&Backlog) -> bool) -> Option<MutexGuard<'_, Backlog>> {
        let mut backlog = self.shared.lock();
        while waiting(&backlog) {
            let stalled_for = backlog.last_progress.elapsed();
            if stalled_for >= timeout {
                drop(backlog);
                self.give_up(timeout);
                return None;
            }
            backlog = self
                .shared
                .changed
                .wait_timeout(backlog, timeout - stalled_for)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        Some(backlog)
    }

    /// Whether products have waited for `timeout` without the decoder taking a byte.
    pub fn is_stalled(&self, timeout: Duration) -> bool {
        let backlog = self.shared.lock();
        backlog.dead.is_none() && !backlog.messages.is_empty() && backlog.last_progress.elapsed() >= timeout
    }

    /// Marks a stalled decoder dead and kills it (its process group).
    pub fn give_up(&self, timeout: Duration) {
        let mut backlog = self.shared.lock();
        if backlog.dead.is_none() {
            backlog.dead = Some(format!("took no input for {timeout:?}"));
            tracing::warn!(
                "act: decoder \"{}\" [{}] took no input for {timeout:?} with {} product(s) waiting: killing it",
                self.command,
                self.pid,
                backlog.messages.len()
            );
            kill_group(self.pid);
            self.shared.changed.notify_all();
        }
    }

    /// Waits until the backlog is written (or the decoder is dead, or `timeout` passes without
    /// progress).
    pub fn drain(&self, timeout: Duration) {
        let _ = self.wait_while(timeout, |backlog| backlog.dead.is_none() && !backlog.messages.is_empty());
    }

    /// Ends a decoder: no more input (so it sees end of file), and what it did not take; then
    /// [`Ending::wait`] waits for it to exit.
    pub fn end(self, timeout: Duration) -> (Leftovers, usize, Ending) {
        let shared = Arc::clone(&self.shared);
        let (leftovers, lost) = self.finish(timeout);
        (leftovers, lost, Ending { shared })
    }

    /// Ends a decoder: no more input (so it sees end of file), waits for its writer. Returns
    /// the products it never took whole (those given to it fewer than twice; the others are
    /// counted in the second value and logged).
    pub fn finish(self, timeout: Duration) -> (Leftovers, usize) {
        self.drain(timeout);
        let mut backlog = self.shared.lock();
        backlog.closing = true;
        self.shared.changed.notify_all();
        while !backlog.input_closed {
            backlog = self.shared.changed.wait(backlog).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        let messages: Vec<Message> = backlog.messages.drain(..).collect();
        backlog.bytes = 0;
        let (mut again, mut lost) = (Vec::new(), 0);
        for mut message in messages {
            message.tries += 1;
            if message.tries < 2 {
                again.push(message);
            } else {
                lost += 1;
            }
        }
        if lost > 0 {
            tracing::error!(
                "act: {lost} product(s) for decoder \"{}\" were given to two decoders that did not take them: dropped",
                self.command
            );
        }
        (Leftovers(again), lost)
    }
}

/// A decoder whose input is closed, until it exits.
#[derive(Debug)]
pub struct Ending {
    shared: Arc<Shared>,
}

impl Ending {
    /// Whether it has exited.
    pub fn has_exited(&self) -> bool {
        self.shared.lock().exited
    }

    /// Waits until it has exited or `deadline` passes; whether it has.
    pub fn wait(&self, deadline: Instant) -> bool {
        let mut backlog = self.shared.lock();
        while !backlog.exited {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return false };
            backlog =
                self.shared.changed.wait_timeout(backlog, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
        true
    }
}

fn write_loop(command: &str, mut child: Child, shared: &Shared) {
    let mut stdin = child.stdin.take();
    loop {
        let mut backlog = shared.lock();
        while backlog.messages.is_empty() && !backlog.closing && backlog.dead.is_none() {
            backlog =
                shared.changed.wait_timeout(backlog, EXIT_CHECK).unwrap_or_else(std::sync::PoisonError::into_inner).0;
            // A decoder that ended while nothing was waiting for it is noticed now, not when
            // the next product is written into a pipe nobody reads.
            if backlog.messages.is_empty()
                && !backlog.closing
                && backlog.dead.is_none()
                && let Ok(Some(status)) = child.try_wait()
            {
                backlog.dead = Some(format!("it ended ({status})"));
                shared.changed.notify_all();
            }
        }
        if backlog.dead.is_some() || backlog.messages.is_empty() {
            break;
        }
        // It stays first in the backlog until written whole.
        let bytes = Arc::clone(&backlog.messages[0].bytes);
        drop(backlog);
        let result = match stdin.as_mut() {
            Some(pipe) => write_progressing(pipe, &bytes, shared),
            None => Err(std::io::Error::other("no input pipe")),
        };
        let mut backlog = shared.lock();
        match result {
            Ok(()) => {
                backlog.messages.pop_front();
                backlog.bytes -= bytes.len();
                backlog.last_progress = Instant::now();
            }
            Err(error) => {
                if backlog.dead.is_none() {
                    backlog.dead = Some(error.to_string());
                }
            }
        }
        shared.changed.notify_all();
    }
    drop(stdin);
    shared.lock().input_closed = true;
    shared.changed.notify_all();
    let status = child.wait();
    let reason = shared.lock().dead.clone();
    log_exit(command, child.id(), status, reason.as_deref());
    shared.lock().exited = true;
    shared.changed.notify_all();
}

/// Writes `bytes`, noting progress after each chunk the pipe takes.
fn write_progressing(pipe: &mut impl Write, bytes: &[u8], shared: &Shared) -> std::io::Result<()> {
    const CHUNK: usize = 1 << 20;
    for chunk in bytes.chunks(CHUNK) {
        pipe.write_all(chunk)?;
        shared.lock().last_progress = Instant::now();
    }
    Ok(())
}

fn log_exit(command: &str, pid: u32, status: std::io::Result<ExitStatus>, reason: Option<&str>) {
    match status {
        Ok(status) if status.success() => tracing::debug!("act: \"{command}\" [{pid}] exited 0"),
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => tracing::warn!("act: \"{command}\" [{pid}] exited with status {code}"),
            (None, Some(signal)) if reason.is_some() => {
                tracing::warn!("act: \"{command}\" [{pid}] ended by signal {signal} ({})", reason.unwrap_or_default());
            }
            (None, signal) => tracing::warn!("act: \"{command}\" [{pid}] ended by signal {}", signal.unwrap_or(0)),
        },
        Err(error) => tracing::warn!("act: cannot learn how \"{command}\" [{pid}] ended: {error}"),
    }
}

/// Logs each line a child writes on its standard error (a thread per child, ending with it).
fn log_stderr(command: &str, pid: u32, stderr: Option<ChildStderr>) {
    let Some(stderr) = stderr else { return };
    let command = command.to_owned();
    let _ = std::thread::Builder::new().name("act-stderr".into()).spawn(move || {
        for line in BufReader::new(stderr).split(b'\n') {
            let Ok(line) = line else { break };
            tracing::warn!("act: \"{command}\" [{pid}]: {}", String::from_utf8_lossy(&line).trim_end());
        }
    });
}

fn kill_group(pid: u32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// EXEC entries' programs: started without waiting (or waited for, `-wait`), reaped and their
/// exit status logged.
#[derive(Debug, Default)]
pub struct Programs {
    running: Vec<(String, Child)>,
}

impl Programs {
    /// Runs `argv` (standard input from `/dev/null`, standard error logged); with `wait`,
    /// until it exits. `Ok(false)` when it was waited for and failed.
    pub fn run(&mut self, argv: &[String], wait: bool) -> Result<bool, SpawnError> {
        let text = command_line(argv);
        let mut command = build(argv);
        command.stdin(Stdio::null());
        let mut child = command.spawn().map_err(|source| SpawnError { command: text.clone(), source })?;
        log_stderr(&text, child.id(), child.stderr.take());
        if wait {
            let pid = child.id();
            let status = child.wait();
            let ok = status.as_ref().is_ok_and(ExitStatus::success);
            log_exit(&text, pid, status, None);
            return Ok(ok);
        }
        self.running.push((text, child));
        self.reap();
        Ok(true)
    }

    /// Collects the programs that have ended, logging how.
    pub fn reap(&mut self) {
        self.running.retain_mut(|(text, child)| match child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                log_exit(text, child.id(), Ok(status), None);
                false
            }
            Err(error) => {
                log_exit(text, child.id(), Err(error), None);
                false
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| (*word).to_owned()).collect()
    }

    #[test]
    fn a_decoder_gets_every_product_in_order() {
        let dir = tempfile::tempdir().expect("dir");
        let out = dir.path().join("out");
        let decoder = Decoder::start(&argv(&["sh", "-c", &format!("cat > {}", out.display())]), Leftovers::default())
            .expect("start");
        for index in 0..100 {
            decoder.send(format!("product {index}\n").into_bytes(), Duration::from_secs(5)).expect("send");
        }
        let (leftovers, lost, ending) = decoder.end(Duration::from_secs(5));
        assert!(leftovers.is_empty() && lost == 0);
        assert!(ending.wait(Instant::now() + Duration::from_secs(5)));
        let text = std::fs::read_to_string(&out).expect("out");
        assert_eq!(text.lines().count(), 100);
        assert!(text.ends_with("product 99\n"));
    }

    #[test]
    fn a_decoder_that_died_is_noticed_before_a_product_is_lost_in_its_pipe() {
        let dir = tempfile::tempdir().expect("dir");
        let out = dir.path().join("out");
        // Reads nothing and exits: noticed while idle, so the product is handed back.
        let decoder = Decoder::start(&argv(&["sh", "-c", "exit 3"]), Leftovers::default()).expect("start");
        ldm7_testkit::wait_until(Duration::from_secs(10), "the decoder's exit to be noticed", || {
            decoder.is_dead().then_some(())
        });
        let bytes = decoder.send(b"one\n".to_vec(), Duration::from_secs(5)).expect_err("dead");
        assert_eq!(bytes, b"one\n");
        let (leftovers, lost, _) = decoder.end(Duration::from_secs(5));
        assert!(leftovers.is_empty() && lost == 0);
        let next =
            Decoder::start(&argv(&["sh", "-c", &format!("cat >> {}", out.display())]), leftovers).expect("start");
        next.send(bytes, Duration::from_secs(5)).expect("send");
        next.send(b"two\n".to_vec(), Duration::from_secs(5)).expect("send");
        let (leftovers, lost, ending) = next.end(Duration::from_secs(5));
        assert!(leftovers.is_empty() && lost == 0);
        assert!(ending.wait(Instant::now() + Duration::from_secs(5)));
        assert_eq!(std::fs::read_to_string(&out).expect("out"), "one\ntwo\n");
    }

    #[test]
    fn a_stalled_decoder_is_given_up_without_holding_the_caller() {
        let decoder = Decoder::start(&argv(&["sleep", "30"]), Leftovers::default()).expect("start");
        let started = Instant::now();
        // More than the pipe holds, less than the backlog: queued at once.
        for _ in 0..4 {
            decoder.send(vec![b'x'; 1 << 20], Duration::from_secs(30)).expect("queued");
        }
        // Queued, not written through: the caller was not held for the (30 s) send timeout.
        assert!(started.elapsed() < Duration::from_secs(10));
        // A fixed pause, kept on purpose: the stall detector is under test, and what it measures
        // is time without progress. 400 ms after every send returned, the decoder has taken
        // nothing for more than 300 ms, however loaded the machine.
        std::thread::sleep(Duration::from_millis(400));
        assert!(decoder.is_stalled(Duration::from_millis(300)));
        decoder.give_up(Duration::from_millis(300));
        assert!(decoder.is_dead());
        let (leftovers, _) = decoder.finish(Duration::from_millis(300));
        assert!(leftovers.len() >= 3, "{}", leftovers.len());
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
