//! Where `ldm7 act` left off: the insertion time of the last product it processed (and that
//! product's signature), kept in `<configuration>.state` as pqact keeps it
//! (ldm-formats.md §2), so a restart neither misses nor repeats products still in the queue.
//!
//! The file is the reference's: comment lines, then `seconds.microseconds` on a line of its
//! own. The signature follows on a comment line (`# signature <32 hex digits>`), which the
//! reference skips, so either program can resume from the other's file. It is written to
//! `<file>.tmp` and renamed over the old one, so a crash leaves the old or the new position.

use std::io;
use std::path::{Path, PathBuf};

use ldm7_types::{Signature, Timestamp};

/// The position of a product in the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Its insertion time in the queue.
    pub insertion: Timestamp,
    /// Its signature, when known (a file the reference wrote has none).
    pub signature: Option<Signature>,
}

/// Why a state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// It cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Its content is not a position.
    #[error("{path}: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The state file of a configuration file: the same path with `.state` appended.
pub fn state_path(conf: &Path) -> PathBuf {
    let mut name = conf.as_os_str().to_owned();
    name.push(".state");
    PathBuf::from(name)
}

const HEADER: &str = "# The following line contains the insertion-time of the last, successfully-\n\
                      # processed data-product.  Do not modify it unless you know exactly what\n\
                      # you're doing!\n";

const SIGNATURE_PREFIX: &str = "# signature ";

/// Reads a state file; `Ok(None)` when there is none.
pub fn read(path: &Path) -> Result<Option<Position>, StateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StateError::Io { path: path.to_owned(), source }),
    };
    parse(&text).map(Some).map_err(|message| StateError::Corrupt { path: path.to_owned(), message })
}

fn parse(text: &str) -> Result<Position, String> {
    let mut lines = text.lines().map(str::trim);
    let time = lines
        .by_ref()
        .find(|line| !line.starts_with('#') && !line.is_empty())
        .ok_or("no insertion time in it (expected a line seconds.microseconds)")?;
    let (secs, micros) = time.split_once('.').ok_or_else(|| format!("{time:?} is not seconds.microseconds"))?;
    let secs: i64 = secs.parse().map_err(|_| format!("{time:?} is not seconds.microseconds"))?;
    let micros: i64 = micros.parse().map_err(|_| format!("{time:?} is not seconds.microseconds"))?;
    if secs < 0 || !(0..1_000_000).contains(&micros) {
        return Err(format!("{time:?} is not a time after 1970"));
    }
    let signature = lines
        .filter_map(|line| line.strip_prefix(SIGNATURE_PREFIX))
        .find_map(|hex| hex.trim().parse::<Signature>().ok());
    Ok(Position { insertion: Timestamp::from_unix_micros(secs * 1_000_000 + micros), signature })
}

/// Writes a state file (through `<path>.tmp` and a rename).
pub fn write(path: &Path, position: &Position) -> Result<(), StateError> {
    let micros = position.insertion.as_unix_micros();
    let mut text = format!("{HEADER}{}.{:06}\n", micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    if let Some(signature) = position.signature {
        text.push_str(&format!("{SIGNATURE_PREFIX}{signature}\n"));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| StateError::Io { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_the_reference_form() {
        let dir = tempfile::tempdir().expect("dir");
        let path = state_path(&dir.path().join("pqact.conf"));
        assert!(path.ends_with("pqact.conf.state"));
        assert_eq!(read(&path).expect("none"), None);
        let position = Position {
            insertion: Timestamp::from_unix_micros(1_700_000_000_000_042),
            signature: Some(Signature([0xab; 16])),
        };
        write(&path, &position).expect("write");
        let text = std::fs::read_to_string(&path).expect("text");
        assert!(text.starts_with("# The following line"), "{text}");
        assert!(text.contains("\n1700000000.000042\n# signature abab"), "{text}");
        assert_eq!(read(&path).expect("read"), Some(position));
        // What the reference writes: no signature.
        std::fs::write(&path, format!("{HEADER}1700000000.5\n")).expect("write");
        assert_eq!(
            read(&path).expect("read"),
            Some(Position { insertion: Timestamp::from_unix_micros(1_700_000_000_000_005), signature: None })
        );
        std::fs::write(&path, "# only a comment\n").expect("write");
        assert!(read(&path).unwrap_err().to_string().contains("no insertion time"));
    }
}
