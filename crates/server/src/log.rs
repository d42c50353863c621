//! LDM-style log lines (ldm-formats.md §5): `YYYYMMDDThhmmss.uuuuuuZ ldm7[pid] LEVEL message`
//! on standard error. Per-product lines are INFO, shown with `-v`; DEBUG with `-x`.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

use ldm7_types::Timestamp;

/// Levels, least to most severe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// Protocol detail.
    Debug = 0,
    /// One line per product.
    Info = 1,
    /// Sessions starting and ending.
    Notice = 2,
    /// Something went wrong for one peer.
    Warn = 3,
    /// Something went wrong for the server.
    Error = 4,
}

static THRESHOLD: AtomicU8 = AtomicU8::new(Level::Notice as u8);

/// Shows messages at `level` and above.
pub fn set_level(level: Level) {
    THRESHOLD.store(level as u8, Ordering::Relaxed);
}

/// Whether `level` is shown.
pub fn enabled(level: Level) -> bool {
    level as u8 >= THRESHOLD.load(Ordering::Relaxed)
}

fn emit(level: Level, name: &str, message: Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let stamp = now.to_string();
    // Timestamp prints YYYYMMDDhhmmss.uuuuuu; the log form puts a T after the date.
    let (date, time) = stamp.split_at(8.min(stamp.len()));
    let line = format!("{date}T{time}Z ldm7[{}] {name} {message}\n", std::process::id());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// A DEBUG line.
pub fn debug(message: Arguments<'_>) {
    emit(Level::Debug, "DEBUG", message);
}
/// An INFO line.
pub fn info(message: Arguments<'_>) {
    emit(Level::Info, "INFO", message);
}
/// A NOTE line.
pub fn notice(message: Arguments<'_>) {
    emit(Level::Notice, "NOTE", message);
}
/// A WARN line.
pub fn warn(message: Arguments<'_>) {
    emit(Level::Warn, "WARN", message);
}
/// An ERROR line.
pub fn error(message: Arguments<'_>) {
    emit(Level::Error, "ERROR", message);
}
