//! `pqact.conf` as the reference reads it (ldm-formats.md §2):
//!
//! ```text
//! feedtypeExpr <TAB> prodIdERE <TAB> ACTION <TAB> [options] args...
//! ```
//!
//! A line starting with `#` is a comment and blank lines are skipped; trailing blanks are
//! removed; a line starting with blanks continues the entry before it (the newline and the
//! blanks become one TAB). Fields are separated by TABs (a pattern may hold spaces); the action
//! is followed by blanks. Options come first and are known by their first two letters after the
//! `-`, as the reference matches them; the rest of the line is the argument template that
//! [`super::subst`] expands for each product and that is then split on blanks, `"…"` keeping
//! blanks together.

use std::fmt;
use std::sync::Arc;

use ldm7_types::{FeedType, Pattern};

/// A parsed configuration.
#[derive(Clone, Debug, Default)]
pub struct Conf {
    /// The entries in file order.
    pub entries: Vec<Entry>,
}

/// One entry.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Where it starts: file name and 1-based line.
    pub source: Source,
    /// The feedtype expression as written.
    pub feed_text: String,
    /// Its value.
    pub feed: FeedType,
    /// The identifier pattern.
    pub pattern: EntryPattern,
    /// What to do.
    pub action: Action,
}

/// Where an entry starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The configuration file as named.
    pub file: Arc<str>,
    /// 1-based line of the entry's first line.
    pub line: usize,
}

impl fmt::Display for Source {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}:{}", self.file, self.line)
    }
}

/// An entry's identifier pattern.
#[derive(Clone, Debug)]
pub enum EntryPattern {
    /// `^_ELSE_$`: matches a product no earlier entry matched (and whose identifier does not
    /// start with `_`).
    Else,
    /// An extended regular expression; its groups feed the back-references.
    Ere(Pattern),
}

impl EntryPattern {
    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Else => ELSE,
            Self::Ere(pattern) => pattern.as_str(),
        }
    }
}

/// The `^_ELSE_$` pattern.
pub const ELSE: &str = "^_ELSE_$";

/// The kinds of action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActionKind {
    /// Nothing (an entry that keeps `^_ELSE_$` from matching).
    Noop,
    /// Write the product to a file (`write(2)`).
    File,
    /// Write the product to a file through a buffered stream.
    StdioFile,
    /// Store the product in a key-value database file.
    DbFile,
    /// Write the product to a child process's standard input.
    Pipe,
    /// Run a program.
    Exec,
}

impl ActionKind {
    /// The name as written in pqact.conf.
    pub fn name(self) -> &'static str {
        match self {
            Self::Noop => "NOOP",
            Self::File => "FILE",
            Self::StdioFile => "STDIOFILE",
            Self::DbFile => "DBFILE",
            Self::Pipe => "PIPE",
            Self::Exec => "EXEC",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Noop, Self::File, Self::StdioFile, Self::DbFile, Self::Pipe, Self::Exec]
            .into_iter()
            .find(|kind| kind.name().eq_ignore_ascii_case(name))
    }

    /// The options this action takes (by their full names).
    fn options(self) -> &'static [&'static str] {
        match self {
            Self::Noop => &[],
            Self::File => &["overwrite", "flush", "close", "strip", "log", "metadata", "edex", "removewmo"],
            Self::StdioFile => &["overwrite", "flush", "close", "strip", "log", "removewmo"],
            Self::DbFile => &["close", "dblocksize"],
            Self::Pipe => &["transient", "strip", "metadata", "nodata", "removewmo", "flush", "close"],
            Self::Exec => &["wait"],
        }
    }
}

/// An action's options (all off unless given).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[allow(clippy::struct_excessive_bools)]
pub struct Options {
    /// `-overwrite`: truncate the file for each product instead of appending.
    pub overwrite: bool,
    /// `-flush`: sync (FILE) or flush (STDIOFILE, PIPE) after each product.
    pub flush: bool,
    /// `-close`: close the file or pipe after each product.
    pub close: bool,
    /// `-strip`: drop control characters other than newline.
    pub strip: bool,
    /// `-log`: log each filing.
    pub log: bool,
    /// `-metadata`: write the metadata record before the data.
    pub metadata: bool,
    /// `-edex`: tell an EDEX ingest about each file written.
    pub edex: bool,
    /// `-removewmo`: drop the WMO header.
    pub removewmo: bool,
    /// `-transient`: a pipe that is not kept open between products.
    pub transient: bool,
    /// `-nodata`: metadata only (implies `-metadata`).
    pub nodata: bool,
    /// `-wait`: wait for the program to exit.
    pub wait: bool,
    /// `-dblocksize n`.
    pub dblocksize: Option<u32>,
}

/// An entry's action.
#[derive(Clone, Debug)]
pub struct Action {
    /// Which.
    pub kind: ActionKind,
    /// Its options.
    pub options: Options,
    /// The argument template (after the options), expanded per product and then split.
    pub args: String,
}

/// Why a configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {message}")]
pub struct ConfError {
    /// Where.
    pub at: Source,
    /// What is wrong.
    pub message: String,
}

/// Parses a configuration; `file` names it in errors and in each entry's [`Source`].
pub fn parse(file: &str, text: &str) -> Result<Conf, ConfError> {
    let file: Arc<str> = Arc::from(file);
    let mut logical: Vec<(usize, String)> = Vec::new();
    for (index, raw) in text.split('\n').enumerate() {
        let line = raw.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let source = Source { file: Arc::clone(&file), line: index + 1 };
        if line.starts_with([' ', '\t']) {
            let Some((_, entry)) = logical.last_mut() else {
                return Err(ConfError {
                    at: source,
                    message: "a continuation line (it starts with a blank) before any entry".into(),
                });
            };
            entry.push('\t');
            entry.push_str(line.trim_start());
        } else {
            logical.push((index + 1, line.to_owned()));
        }
    }
    let entries = logical
        .into_iter()
        .map(|(line, text)| parse_entry(Source { file: Arc::clone(&file), line }, &text))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Conf { entries })
}

fn parse_entry(source: Source, text: &str) -> Result<Entry, ConfError> {
    let error = |message: String| ConfError { at: source.clone(), message };
    let (feed_text, rest) = next_field(text);
    let (pattern_text, action_text) = next_field(rest);
    let feed_text = feed_text.trim().to_owned();
    if action_text.trim().is_empty() {
        return Err(error(format!("{text:?}: an entry is a feedtype, a pattern and an action, separated by tabs")));
    }
    if pattern_text.is_empty() {
        return Err(error("the pattern is empty (fields are separated by tabs)".into()));
    }
    let feed: FeedType = feed_text.parse().map_err(|problem| error(format!("{problem}")))?;
    let pattern = if pattern_text == ELSE {
        EntryPattern::Else
    } else {
        EntryPattern::Ere(Pattern::new_capturing(pattern_text).map_err(|problem| error(problem.to_string()))?)
    };
    let action = parse_action(action_text).map_err(error)?;
    Ok(Entry { source, feed_text, feed, pattern, action })
}

/// The text up to the first tab, and what follows the tabs after it.
fn next_field(text: &str) -> (&str, &str) {
    match text.split_once('\t') {
        Some((field, rest)) => (field, rest.trim_start_matches('\t')),
        None => (text, ""),
    }
}

fn parse_action(text: &str) -> Result<Action, String> {
    let text = text.trim();
    let name_end = text.find([' ', '\t']).unwrap_or(text.len());
    let name = &text[..name_end];
    let kind = ActionKind::from_name(name)
        .ok_or_else(|| format!("unknown action {name:?} (one of NOOP, FILE, STDIOFILE, DBFILE, PIPE, EXEC)"))?;
    let mut options = Options::default();
    let mut rest = text[name_end..].trim_start();
    while let Some(option) = rest.strip_prefix('-') {
        let end = option.find([' ', '\t']).unwrap_or(option.len());
        let word = &option[..end];
        let full = kind
            .options()
            .iter()
            .find(|full| word.get(..2).is_some_and(|prefix| full.starts_with(prefix)))
            .ok_or_else(|| format!("{} takes no option -{word}", kind.name()))?;
        rest = option[end..].trim_start();
        match *full {
            "overwrite" => options.overwrite = true,
            "flush" => options.flush = true,
            "close" => options.close = true,
            "strip" => options.strip = true,
            "log" => options.log = true,
            "metadata" => options.metadata = true,
            "edex" => options.edex = true,
            "removewmo" => options.removewmo = true,
            "transient" => options.transient = true,
            "nodata" => {
                options.nodata = true;
                options.metadata = true;
            }
            "wait" => options.wait = true,
            _ => {
                let end = rest.find([' ', '\t']).unwrap_or(rest.len());
                let size =
                    rest[..end].parse().map_err(|_| format!("-{word} needs a block size, not {:?}", &rest[..end]))?;
                options.dblocksize = Some(size);
                rest = rest[end..].trim_start();
            }
        }
    }
    if kind != ActionKind::Noop && rest.is_empty() {
        let what = match kind {
            ActionKind::Pipe | ActionKind::Exec => "a program",
            _ => "a path",
        };
        return Err(format!("{} needs {what}", kind.name()));
    }
    Ok(Action { kind, options, args: rest.to_owned() })
}

/// Splits an expanded argument string on blanks; `"…"` keeps blanks together (the quotes are
/// removed).
pub fn split_args(text: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let mut in_arg = false;
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                in_arg = true;
            }
            ' ' | '\t' if !quoted => {
                if in_arg {
                    args.push(std::mem::take(&mut current));
                    in_arg = false;
                }
            }
            other => {
                current.push(other);
                in_arg = true;
            }
        }
    }
    if in_arg {
        args.push(current);
    }
    args
}

impl fmt::Display for Entry {
    /// The entry as parsed, for `ldm7 act --check`.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let options = &self.action.options;
        let mut flags: Vec<String> = [
            ("overwrite", options.overwrite),
            ("flush", options.flush),
            ("close", options.close),
            ("strip", options.strip),
            ("log", options.log),
            ("metadata", options.metadata && !options.nodata),
            ("edex", options.edex),
            ("removewmo", options.removewmo),
            ("transient", options.transient),
            ("nodata", options.nodata),
            ("wait", options.wait),
        ]
        .into_iter()
        .filter(|&(_, on)| on)
        .map(|(name, _)| format!("-{name}"))
        .collect();
        if let Some(size) = options.dblocksize {
            flags.push(format!("-dblocksize {size}"));
        }
        write!(
            formatter,
            "{}: feed {} ({}), pattern {:?}, {}",
            self.source,
            self.feed_text,
            self.feed,
            self.pattern.as_str(),
            self.action.kind.name()
        )?;
        for flag in flags {
            write!(formatter, " {flag}")?;
        }
        if !self.action.args.is_empty() {
            write!(formatter, " {:?}", self.action.args)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_continuations_comments_and_options() {
        let text = "# comment\n\
                    \n\
                    WMO\t^SAUS.. (KWBC) ([0-3][0-9])\tFILE\t-overwrite -cl\tdata/\\1.txt   \n\
                    NEXRAD3|NIMAGE\t^(...)\n\
                    \tPIPE\t-st\n\
                    \t\tdecoder -v \"a b\"\n\
                    ANY\t^_ELSE_$\tNOOP\n\
                    EXP\tx y\tEXEC -wait prog\n";
        let conf = parse("pqact.conf", text).expect("valid");
        assert_eq!(conf.entries.len(), 4);
        let file = &conf.entries[0];
        assert_eq!(file.source.to_string(), "pqact.conf:3");
        assert_eq!(file.action.kind, ActionKind::File);
        assert!(file.action.options.overwrite && file.action.options.close && !file.action.options.flush);
        assert_eq!(file.action.args, r"data/\1.txt");
        let pipe = &conf.entries[1];
        assert_eq!(pipe.source.line, 4);
        assert_eq!(pipe.pattern.as_str(), "^(...)");
        assert_eq!(pipe.action.kind, ActionKind::Pipe);
        assert!(pipe.action.options.strip);
        assert_eq!(split_args(&pipe.action.args), ["decoder", "-v", "a b"]);
        assert!(matches!(conf.entries[2].pattern, EntryPattern::Else));
        let exec = &conf.entries[3];
        assert_eq!(exec.pattern.as_str(), "x y");
        assert!(exec.action.options.wait);
        assert_eq!(exec.action.args, "prog");
    }

    /// Found by fuzzing (pqact_conf): an option whose second byte is inside a multi-byte
    /// character was cut there (a panic); it is an unknown option.
    #[test]
    fn an_option_with_a_non_ascii_letter_is_refused_not_a_panic() {
        let error = parse("p.conf", "EXP\t^TEST\n\tPIPE\t-c\u{544}lose\tdecoder\n").expect_err("no such option");
        assert!(error.to_string().contains("PIPE takes no option -c\u{544}lose"), "{error}");
        let error = parse("p.conf", "EXP\t^TEST\n\tFILE\t-\u{e9}\tout\n").expect_err("no such option");
        assert!(error.to_string().contains("takes no option"), "{error}");
    }

    #[test]
    fn errors_name_the_line_where_the_entry_starts() {
        let bad = |text: &str| parse("p.conf", text).expect_err("invalid").to_string();
        assert!(bad("WMO\t^x\n\tFILE\t-bogus a\n").starts_with("p.conf:1: FILE takes no option -bogus"));
        assert!(bad("\tFILE x\n").starts_with("p.conf:1: a continuation line"));
        assert!(bad("# c\nNOSUCHFEED\t^x\tNOOP\n").starts_with("p.conf:2:"));
        assert!(bad("WMO\t(unclosed\tNOOP\n").contains("p.conf:1"));
        assert!(bad("WMO\t^x\n").contains("separated by tabs"));
        assert!(bad("WMO\t^x\tFILE\n").ends_with("FILE needs a path"));
        assert!(bad("WMO\t^x\tMAIL x\n").contains("unknown action \"MAIL\""));
        assert!(bad("WMO\t^x\tDBFILE -db x y\n").contains("needs a block size"));
    }

    #[test]
    fn nodata_implies_metadata_and_dblocksize_takes_a_value() {
        let conf = parse("p", "ANY\t.*\tPIPE -nodata prog\nANY\t.*\tDBFILE -dblocksize 1024 db key\n").expect("valid");
        assert!(conf.entries[0].action.options.metadata);
        assert_eq!(conf.entries[1].action.options.dblocksize, Some(1024));
        assert_eq!(conf.entries[1].action.args, "db key");
    }
}
