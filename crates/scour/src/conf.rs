//! scour.conf and the excludes file, as LDM's scour reads them (docs/operations.md "scour").
//!
//! A scour.conf line is `DIRECTORY AGE [PATTERN]`, fields separated by blanks or tabs; lines
//! whose first field starts with `#` and blank lines are skipped. [`parse`] turns the text into
//! entries and per-line problems (a bad line never stops the others); [`Resolver`] then makes
//! each DIRECTORY a path: `~/dir` and `~user/dir` expanded, a relative path taken relative to
//! the data directory, a directory that does not exist or is a whole home directory refused (as
//! LDM refuses `~`, `~/`, `~user` and the user's own home).
//!
//! The excludes file ([`Excludes`]) lists directories, one a line, that are neither scoured nor
//! removed. LDM compares them with the paths it builds as strings; here both sides are
//! normalized first (relative to the data directory, `//`, `/./` and a trailing `/` dropped), so
//! every line LDM honours is honoured, and a few spellings LDM misses are too.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::age::{Age, AgeError};
use crate::pattern::{Pattern, PatternError};

/// Most lines an excludes file may list (LDM's scour allows 100).
pub const EXCLUDES_MAX: usize = 10_000;

/// One scour.conf entry, as written.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its line in the file, from 1.
    pub line: usize,
    /// DIRECTORY as written (before `~` expansion).
    pub directory: PathBuf,
    /// AGE as written.
    pub age_text: String,
    /// AGE.
    pub age: Age,
    /// PATTERN, or `*`.
    pub pattern: Pattern,
}

/// A line that is not an entry, or an entry whose directory cannot be scoured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The configuration file.
    pub file: PathBuf,
    /// The line, from 1.
    pub line: usize,
    /// What is wrong.
    pub kind: ProblemKind,
}

/// What is wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProblemKind {
    /// A directory without an age.
    #[error("{directory:?} has no age: give DIRECTORY AGE [PATTERN], e.g. \"{directory} 2\"")]
    NoAge {
        /// The one field.
        directory: String,
    },
    /// More than three fields.
    #[error("{count} fields: give DIRECTORY AGE [PATTERN] (a pattern cannot hold blanks; use ? or [ ] for one)")]
    TooManyFields {
        /// How many.
        count: usize,
    },
    /// A bad AGE.
    #[error(transparent)]
    Age(#[from] AgeError),
    /// A bad PATTERN.
    #[error(transparent)]
    Pattern(#[from] PatternError),
    /// The directory cannot be scoured.
    #[error(transparent)]
    Directory(#[from] ResolveError),
}

impl Problem {
    /// Whether this is only a directory that does not exist (yet): a warning, not an error.
    pub fn is_missing_directory(&self) -> bool {
        matches!(self.kind, ProblemKind::Directory(ResolveError::Missing { .. }))
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.kind)
    }
}

/// The entries of a scour.conf and the problems of its other lines.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The entries, in file order.
    pub entries: Vec<Entry>,
    /// The lines that are not entries.
    pub problems: Vec<Problem>,
}

/// Parses the text of a scour.conf (`file` names it in problems).
pub fn parse(text: &[u8], file: &Path) -> Parsed {
    let mut parsed = Parsed::default();
    for (index, line) in text.split(|byte| *byte == b'\n').enumerate() {
        let fields: Vec<&[u8]> =
            line.split(|byte| byte.is_ascii_whitespace()).filter(|field| !field.is_empty()).collect();
        let Some(first) = fields.first() else { continue };
        if first.starts_with(b"#") {
            continue;
        }
        let problem = |kind| Problem { file: file.to_path_buf(), line: index + 1, kind };
        match parse_fields(&fields, index + 1) {
            Ok(entry) => parsed.entries.push(entry),
            Err(kind) => parsed.problems.push(problem(kind)),
        }
    }
    parsed
}

fn parse_fields(fields: &[&[u8]], line: usize) -> Result<Entry, ProblemKind> {
    let directory = PathBuf::from(OsStr::from_bytes(fields[0]));
    let (age_field, pattern) = match fields {
        [_] => return Err(ProblemKind::NoAge { directory: directory.display().to_string() }),
        [_, age] => (*age, Pattern::all()),
        [_, age, pattern] => (*age, Pattern::from_bytes(pattern)?),
        _ => return Err(ProblemKind::TooManyFields { count: fields.len() }),
    };
    let age_text = String::from_utf8_lossy(age_field).into_owned();
    let age = Age::parse(&age_text)?;
    Ok(Entry { line, directory, age_text, age, pattern })
}

/// Why a DIRECTORY cannot be scoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// `~`, `~/` or `~user`: a whole home directory.
    #[error(
        "{given:?} is a whole home directory, which scour refuses (as LDM's scour): name a directory under it, e.g. ~ldm/var/data"
    )]
    WholeHome {
        /// The directory as written.
        given: String,
    },
    /// `~user/…` for a user the system does not know.
    #[error("{given:?}: there is no user {user:?} on this system")]
    UnknownUser {
        /// The directory as written.
        given: String,
        /// The user.
        user: String,
    },
    /// `~/…` without a home directory.
    #[error("{given:?}: this process has no home directory (HOME is unset and the user has no passwd entry)")]
    NoHome {
        /// The directory as written.
        given: String,
    },
    /// The directory does not exist (or cannot be looked at).
    #[error("directory {} does not exist or cannot be read ({reason}): skipped", path.display())]
    Missing {
        /// The path.
        path: PathBuf,
        /// The system's reason.
        reason: String,
    },
    /// The path names something else than a directory.
    #[error("{} is not a directory: skipped", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The home directory of the user running scour.
    #[error("{} is the home directory of the user running scour, which scour refuses (as LDM's scour): name a directory under it", path.display())]
    IsHome {
        /// The path.
        path: PathBuf,
    },
}

/// Turns DIRECTORY fields into the paths to scour.
#[derive(Debug, Clone)]
pub struct Resolver {
    /// Where relative directories are (absolute).
    pub datadir: PathBuf,
    /// The home directory of the user running scour (`~/…`, and refused as a directory).
    pub home: Option<PathBuf>,
}

impl Resolver {
    /// Relative to `datadir` (made absolute against the current directory); the home directory
    /// from `HOME`, else from the passwd entry of the effective user.
    pub fn new(datadir: &Path) -> std::io::Result<Resolver> {
        let datadir = std::path::absolute(datadir)?;
        let home = std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(PathBuf::from)
            .or_else(|| nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map(|user| user.dir));
        Ok(Resolver { datadir, home })
    }

    /// The path to scour for a DIRECTORY field: expanded, absolute, normalized, an existing
    /// directory (a symbolic link to one is scoured through, as LDM does), and not a home
    /// directory.
    pub fn resolve(&self, directory: &Path) -> Result<PathBuf, ResolveError> {
        let expanded = self.expand_tilde(directory)?;
        let path = normalize(&self.datadir.join(expanded));
        match std::fs::metadata(&path) {
            Err(error) => return Err(ResolveError::Missing { path, reason: error.to_string() }),
            Ok(metadata) if !metadata.is_dir() => return Err(ResolveError::NotADirectory { path }),
            Ok(_) => {}
        }
        if let Some(home) = &self.home {
            let same = match (std::fs::canonicalize(&path), std::fs::canonicalize(home)) {
                (Ok(path), Ok(home)) => path == home,
                _ => path == normalize(home),
            };
            if same {
                return Err(ResolveError::IsHome { path });
            }
        }
        Ok(path)
    }

    fn expand_tilde(&self, directory: &Path) -> Result<PathBuf, ResolveError> {
        let bytes = directory.as_os_str().as_bytes();
        let Some(rest) = bytes.strip_prefix(b"~") else { return Ok(directory.to_path_buf()) };
        let given = || directory.display().to_string();
        let (user, under) = match rest.iter().position(|byte| *byte == b'/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => return Err(ResolveError::WholeHome { given: given() }),
        };
        if under.iter().all(|byte| *byte == b'/') {
            return Err(ResolveError::WholeHome { given: given() });
        }
        let home = if user.is_empty() {
            self.home.clone().ok_or_else(|| ResolveError::NoHome { given: given() })?
        } else {
            let name = String::from_utf8_lossy(user).into_owned();
            match nix::unistd::User::from_name(&name) {
                Ok(Some(entry)) => entry.dir,
                _ => return Err(ResolveError::UnknownUser { given: given(), user: name }),
            }
        };
        // `under` starts with '/': relative to the home directory.
        Ok(home.join(OsStr::from_bytes(under.trim_ascii_start_slashes())))
    }
}

/// Leading slashes of `~user//dir` dropped, so that the join stays under the home directory.
trait TrimSlashes {
    fn trim_ascii_start_slashes(&self) -> &Self;
}

impl TrimSlashes for [u8] {
    fn trim_ascii_start_slashes(&self) -> &[u8] {
        let start = self.iter().position(|byte| *byte != b'/').unwrap_or(self.len());
        &self[start..]
    }
}

/// `a//b/./c/` → `a/b/c` (lexically: `..` is kept, symbolic links are not looked at).
pub fn normalize(path: &Path) -> PathBuf {
    path.components().filter(|component| *component != Component::CurDir).collect()
}

/// The directories of an excludes file.
#[derive(Debug, Clone, Default)]
pub struct Excludes {
    paths: HashSet<PathBuf>,
}

/// An excludes file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ExcludesError {
    /// It exists but cannot be read.
    #[error("cannot read the excludes file {}: {source}: fix its permissions or give another with -e", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Too many lines.
    #[error("the excludes file {} lists more than {EXCLUDES_MAX} directories", path.display())]
    TooMany {
        /// The file.
        path: PathBuf,
    },
}

impl Excludes {
    /// Reads an excludes file: one directory a line (blank lines and `#` lines skipped),
    /// relative ones relative to `datadir`. A file that does not exist excludes nothing
    /// (`Ok(None)`), as in LDM.
    pub fn load(path: &Path, datadir: &Path) -> Result<Option<Excludes>, ExcludesError> {
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ExcludesError::Read { path: path.to_path_buf(), source }),
        };
        let excludes = Excludes::parse(&text, datadir);
        if excludes.paths.len() > EXCLUDES_MAX {
            return Err(ExcludesError::TooMany { path: path.to_path_buf() });
        }
        Ok(Some(excludes))
    }

    /// The directories listed in `text`.
    pub fn parse(text: &[u8], datadir: &Path) -> Excludes {
        let paths = text
            .split(|byte| *byte == b'\n')
            .map(<[u8]>::trim_ascii)
            .filter(|line| !line.is_empty() && !line.starts_with(b"#"))
            .map(|line| normalize(&datadir.join(OsStr::from_bytes(line))))
            .collect();
        Excludes { paths }
    }

    /// Whether `path` (normalized) is excluded.
    pub fn contains(&self, path: &Path) -> bool {
        !self.paths.is_empty() && self.paths.contains(path)
    }

    /// How many directories are excluded.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Whether nothing is excluded.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Parsed {
        parse(text.as_bytes(), Path::new("etc/scour.conf"))
    }

    #[test]
    fn entries_comments_and_blank_lines_parse_as_ldm_reads_them() {
        let parsed = parse_text(
            "# Directory\tDays-old\tpattern\n\
             \n   \t \n\
             dir1 2\n\
             dir2\t\t2\t*.foo\n\
             \x20 # an indented comment\n\
             ~ldm/var/logs 1 *.stats\n\
             dir3 0-09:30 *.boo\r\n",
        );
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        let summary: Vec<(usize, String, Age, String)> = parsed
            .entries
            .iter()
            .map(|entry| (entry.line, entry.directory.display().to_string(), entry.age, entry.pattern.to_string()))
            .collect();
        let age = |text| Age::parse(text).unwrap();
        assert_eq!(
            summary,
            [
                (4, "dir1".into(), age("2"), "*".into()),
                (5, "dir2".into(), age("2"), "*.foo".into()),
                (7, "~ldm/var/logs".into(), age("1"), "*.stats".into()),
                (8, "dir3".into(), age("0-09:30"), "*.boo".into()),
            ]
        );
    }

    #[test]
    fn bad_lines_are_reported_with_file_and_line_and_the_others_kept() {
        let parsed = parse_text("good 2\nlonely\nbad 3-\ntoo many fields here\nbad2 2-113055 *.nc\nalso/good 1 *.nc\n");
        assert_eq!(parsed.entries.iter().map(|entry| entry.line).collect::<Vec<_>>(), [1, 6]);
        let problems: Vec<String> = parsed.problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].starts_with("etc/scour.conf:2: \"lonely\" has no age"), "{}", problems[0]);
        assert!(problems[1].starts_with("etc/scour.conf:3: age \"3-\" is not D, -hh"), "{}", problems[1]);
        assert!(problems[2].starts_with("etc/scour.conf:4: 4 fields"), "{}", problems[2]);
        assert!(problems[3].starts_with("etc/scour.conf:5: age \"2-113055\""), "{}", problems[3]);
        assert!(!parsed.problems[0].is_missing_directory());
    }

    fn resolver(datadir: &Path, home: &Path) -> Resolver {
        Resolver { datadir: datadir.to_path_buf(), home: Some(home.to_path_buf()) }
    }

    #[test]
    fn directories_resolve_relative_to_the_datadir_and_tilde_to_homes() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let home = dir.path().join("home");
        for sub in ["data/decoded", "home/var/data", "elsewhere"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let resolver = resolver(&data, &home);
        assert_eq!(resolver.resolve(Path::new("decoded")).unwrap(), data.join("decoded"));
        assert_eq!(resolver.resolve(Path::new("./decoded//")).unwrap(), data.join("decoded"));
        assert_eq!(resolver.resolve(Path::new("~/var/data")).unwrap(), home.join("var/data"));
        assert_eq!(resolver.resolve(Path::new("~//var/data")).unwrap(), home.join("var/data"));
        let elsewhere = dir.path().join("elsewhere");
        assert_eq!(resolver.resolve(&elsewhere).unwrap(), elsewhere);
        // ~root/… through the passwd database.
        let root_home = nix::unistd::User::from_name("root").unwrap().unwrap().dir;
        assert!(matches!(
            resolver.resolve(Path::new("~root/surely-not-there")),
            Err(ResolveError::Missing { path, .. }) if path == root_home.join("surely-not-there")
        ));
    }

    #[test]
    fn whole_homes_unknown_users_and_missing_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let resolver = resolver(dir.path(), &home);
        for whole in ["~", "~/", "~root", "~root/", "~//"] {
            assert!(matches!(resolver.resolve(Path::new(whole)), Err(ResolveError::WholeHome { .. })), "{whole}");
        }
        assert!(matches!(
            resolver.resolve(Path::new("~no-such-user-here/x")),
            Err(ResolveError::UnknownUser { user, .. }) if user == "no-such-user-here"
        ));
        assert!(matches!(resolver.resolve(Path::new("absent")), Err(ResolveError::Missing { .. })));
        assert!(matches!(resolver.resolve(Path::new("file")), Err(ResolveError::NotADirectory { .. })));
        assert!(matches!(resolver.resolve(&home), Err(ResolveError::IsHome { .. })));
        assert!(matches!(resolver.resolve(Path::new("home/.")), Err(ResolveError::IsHome { .. })));
        let no_home = Resolver { datadir: dir.path().to_path_buf(), home: None };
        assert!(matches!(no_home.resolve(Path::new("~/x")), Err(ResolveError::NoHome { .. })));
    }

    #[test]
    fn excludes_are_normalized_paths_relative_to_the_datadir() {
        let datadir = Path::new("/data");
        let excludes = Excludes::parse(b"/data/keep\n# comment\n\nrelative/skip/\n/a//b/./c\n  /spaced  \n", datadir);
        assert_eq!(excludes.len(), 4);
        for excluded in ["/data/keep", "/data/relative/skip", "/a/b/c", "/spaced"] {
            assert!(excludes.contains(Path::new(excluded)), "{excluded}");
        }
        assert!(!excludes.contains(Path::new("/data")));
        assert!(!excludes.contains(Path::new("/data/keep/sub")));
        let dir = tempfile::tempdir().unwrap();
        assert!(Excludes::load(&dir.path().join("absent"), datadir).unwrap().is_none());
        let many: String = (0..=EXCLUDES_MAX).map(|n| format!("/d{n}\n")).collect();
        std::fs::write(dir.path().join("many"), many).unwrap();
        assert!(matches!(Excludes::load(&dir.path().join("many"), datadir), Err(ExcludesError::TooMany { .. })));
    }
}
