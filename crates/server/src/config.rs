//! `ldmd.conf` (ldm-formats.md §1): the entries ALLOW, ACCEPT, REQUEST (alias POLL), EXEC and
//! INCLUDE; MULTICAST and RECEIVE are recognised and reported as not supported yet.
//!
//! Lexical rules, as the reference scanner: keywords count only at the start of a line and in
//! any case; `#` starts a comment; fields are runs of non-blank characters without `"`, or
//! `"…"` strings in which a backslash makes the next character literal; an entry may span
//! lines (a newline is only whitespace to the grammar); a field has at most 1999 characters.
//!
//! ```text
//! ALLOW   feedtypeExpr  hostERE  [okERE [notERE]]
//! ACCEPT  feedtypeExpr  prodIdERE  hostERE
//! REQUEST feedtypeExpr  prodIdERE  host[:port]  [PRIMARY|ALTERNATE]   # 4th field ignored
//! EXEC    "command args…"
//! INCLUDE pathname                                                    # relative to this file
//! ```
//!
//! Host EREs are case-insensitive (matched against the peer's address and its name); product
//! EREs are checked here and matched case-sensitively at run time. Of several REQUESTs with the
//! same feedtype and pattern, the first is primary and the others alternate. EXEC commands are
//! split into words by blanks, honouring quotes and backslashes (no variable or glob expansion,
//! unlike `wordexp(3)`).

use std::fmt;
use std::path::{Path, PathBuf};

use ldm7_types::{FeedType, Pattern, ProdClass, ProdSpec};

/// Longest field (the reference's `char string[2000]`).
pub const FIELD_MAX: usize = 1999;

/// Where an entry was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub file: PathBuf,
    /// 1-based line of the keyword.
    pub line: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// `ALLOW`: which downstream hosts may request which products.
#[derive(Clone, Debug)]
pub struct Allow {
    /// Feeds allowed.
    pub feedtype: FeedType,
    /// Hosts (case-insensitive, against address and name).
    pub host: Pattern,
    /// Products must match this.
    pub ok: Pattern,
    /// Products must not match this.
    pub not: Option<Pattern>,
    /// Where.
    pub location: Location,
}

/// `ACCEPT`: which hosts may push which products.
#[derive(Clone, Debug)]
pub struct Accept {
    /// Feeds accepted.
    pub feedtype: FeedType,
    /// Products accepted.
    pub pattern: Pattern,
    /// Hosts (case-insensitive).
    pub host: Pattern,
    /// Where.
    pub location: Location,
}

/// `REQUEST`: a feed to pull from an upstream.
#[derive(Clone, Debug)]
pub struct Request {
    /// The feeds.
    pub feedtype: FeedType,
    /// The products.
    pub pattern: Pattern,
    /// The upstream host.
    pub host: String,
    /// Its port (`None`: the server's own port).
    pub port: Option<u16>,
    /// First REQUEST of this feed and pattern (else alternate).
    pub primary: bool,
    /// Where.
    pub location: Location,
}

impl Request {
    /// The class requested (all times; the session sets `from`).
    pub fn class(&self) -> ProdClass {
        ProdClass {
            from: ldm7_types::Timestamp::ZERO,
            to: ldm7_types::Timestamp::END,
            specs: vec![ProdSpec { feedtype: self.feedtype, pattern: self.pattern.clone() }],
        }
    }
}

/// `EXEC`: a program started with the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Where.
    pub location: Location,
}

/// An entry recognised but not supported yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// The keyword.
    pub keyword: String,
    /// Its fields.
    pub fields: Vec<String>,
    /// Where.
    pub location: Location,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} {}", self.location, self.keyword, self.fields.join(" "))
    }
}

/// A parsed configuration (INCLUDEs expanded, in file order).
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// ALLOW entries.
    pub allows: Vec<Allow>,
    /// ACCEPT entries.
    pub accepts: Vec<Accept>,
    /// REQUEST entries.
    pub requests: Vec<Request>,
    /// EXEC entries.
    pub execs: Vec<Exec>,
    /// MULTICAST and RECEIVE entries (later releases).
    pub unsupported: Vec<Unsupported>,
}

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// An entry is wrong.
    #[error("{location}: {message}")]
    Entry {
        /// Where.
        location: Location,
        /// What is wrong and how to fix it.
        message: String,
    },
}

fn entry_error(location: &Location, message: impl Into<String>) -> ConfigError {
    ConfigError::Entry { location: location.clone(), message: message.into() }
}

/// A lexical token: a field and the line it starts on, or a keyword at a line start.
#[derive(Debug, PartialEq, Eq)]
struct Token {
    text: String,
    line: usize,
    /// Unquoted and first on its line: may be a keyword.
    at_line_start: bool,
}

fn tokenize(text: &str, file: &Path) -> Result<Vec<Token>, ConfigError> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    let mut line_start = true;
    while let Some(&c) = chars.peek() {
        match c {
            '\n' => {
                chars.next();
                line += 1;
                line_start = true;
            }
            ' ' | '\t' | '\x0c' | '\r' => {
                chars.next();
            }
            '#' => {
                while chars.peek().is_some_and(|c| *c != '\n') {
                    chars.next();
                }
            }
            '"' => {
                chars.next();
                let start_line = line;
                let mut field = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(next) => {
                                if next == '\n' {
                                    line += 1;
                                }
                                field.push(next);
                            }
                            None => break,
                        },
                        Some(other) => {
                            if other == '\n' {
                                line += 1;
                            }
                            field.push(other);
                        }
                        None => {
                            let location = Location { file: file.to_path_buf(), line: start_line };
                            return Err(entry_error(&location, "unterminated quoted string: add the closing \""));
                        }
                    }
                }
                check_len(&field, file, start_line)?;
                tokens.push(Token { text: field, line: start_line, at_line_start: false });
                line_start = false;
            }
            _ => {
                let mut field = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == '"' || c == '#' {
                        break;
                    }
                    field.push(c);
                    chars.next();
                }
                check_len(&field, file, line)?;
                tokens.push(Token { text: field, line, at_line_start: line_start });
                line_start = false;
            }
        }
    }
    Ok(tokens)
}

fn check_len(field: &str, file: &Path, line: usize) -> Result<(), ConfigError> {
    if field.chars().count() > FIELD_MAX {
        let location = Location { file: file.to_path_buf(), line };
        return Err(entry_error(&location, format!("field of {} characters: at most {FIELD_MAX}", field.len())));
    }
    Ok(())
}

const KEYWORDS: [&str; 8] = ["ALLOW", "ACCEPT", "REQUEST", "POLL", "EXEC", "INCLUDE", "MULTICAST", "RECEIVE"];

fn keyword(token: &Token) -> Option<&'static str> {
    if !token.at_line_start {
        return None;
    }
    // POLL is recognised only as exactly `POLL` or `poll`.
    if token.text == "POLL" || token.text == "poll" {
        return Some("REQUEST");
    }
    KEYWORDS.iter().copied().filter(|k| *k != "POLL").find(|k| token.text.eq_ignore_ascii_case(k))
}

impl Config {
    /// Reads a configuration file and the files it includes.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut config = Config::default();
        let mut stack = Vec::new();
        config.load_file(path, &mut stack)?;
        config.mark_alternates();
        Ok(config)
    }

    /// Parses configuration text; INCLUDEs are relative to `origin`'s directory.
    pub fn parse(text: &str, origin: &Path) -> Result<Self, ConfigError> {
        let mut config = Config::default();
        let mut stack = vec![origin.to_path_buf()];
        config.parse_into(text, origin, &mut stack)?;
        config.mark_alternates();
        Ok(config)
    }

    fn load_file(&mut self, path: &Path, stack: &mut Vec<PathBuf>) -> Result<(), ConfigError> {
        let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if stack.contains(&canonical) {
            let chain: Vec<String> = stack.iter().map(|p| p.display().to_string()).collect();
            return Err(ConfigError::Io {
                path: path.display().to_string(),
                source: std::io::Error::other(format!("INCLUDE cycle: {} → {}", chain.join(" → "), path.display())),
            });
        }
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Io { path: path.display().to_string(), source })?;
        stack.push(canonical);
        let result = self.parse_into(&text, path, stack);
        stack.pop();
        result
    }

    fn parse_into(&mut self, text: &str, file: &Path, stack: &mut Vec<PathBuf>) -> Result<(), ConfigError> {
        let tokens = tokenize(text, file)?;
        let mut k = 0;
        while k < tokens.len() {
            let location = Location { file: file.to_path_buf(), line: tokens[k].line };
            let Some(keyword) = keyword(&tokens[k]) else {
                return Err(entry_error(
                    &location,
                    format!(
                        "{:?} is not a keyword (ALLOW, ACCEPT, REQUEST, EXEC, INCLUDE, MULTICAST, RECEIVE at the start of a line)",
                        tokens[k].text
                    ),
                ));
            };
            let end = (k + 1..tokens.len()).find(|&j| self::keyword(&tokens[j]).is_some()).unwrap_or(tokens.len());
            let fields: Vec<&str> = tokens[k + 1..end].iter().map(|t| t.text.as_str()).collect();
            self.entry(keyword, &fields, &location, stack)?;
            k = end;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        keyword: &str,
        fields: &[&str],
        location: &Location,
        stack: &mut Vec<PathBuf>,
    ) -> Result<(), ConfigError> {
        let count = |min: usize, max: usize, usage: &str| {
            if fields.len() < min || fields.len() > max {
                Err(entry_error(location, format!("{keyword} takes {usage}; found {} field(s)", fields.len())))
            } else {
                Ok(())
            }
        };
        match keyword {
            "ALLOW" => {
                count(2, 4, "feedtype hostERE [okERE [notERE]]")?;
                self.allows.push(Allow {
                    feedtype: feedtype(fields[0], location)?,
                    host: host_pattern(fields[1], location)?,
                    ok: fields.get(2).map_or_else(|| Ok(Pattern::everything()), |p| product_pattern(p, location))?,
                    not: fields.get(3).map(|p| product_pattern(p, location)).transpose()?,
                    location: location.clone(),
                });
            }
            "ACCEPT" => {
                count(3, 3, "feedtype prodIdERE hostERE")?;
                self.accepts.push(Accept {
                    feedtype: feedtype(fields[0], location)?,
                    pattern: product_pattern(fields[1], location)?,
                    host: host_pattern(fields[2], location)?,
                    location: location.clone(),
                });
            }
            "REQUEST" => {
                count(3, 4, "feedtype prodIdERE host[:port] [PRIMARY|ALTERNATE]")?;
                let (host, port) = match fields[2].split_once(':') {
                    Some((host, port)) => {
                        let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                            entry_error(location, format!("invalid port in {:?}: give host[:port]", fields[2]))
                        })?;
                        (host, Some(port))
                    }
                    None => (fields[2], None),
                };
                if host.is_empty() {
                    return Err(entry_error(location, "REQUEST without a host"));
                }
                self.requests.push(Request {
                    feedtype: feedtype(fields[0], location)?,
                    pattern: product_pattern(fields[1], location)?,
                    host: host.to_owned(),
                    port,
                    primary: true,
                    location: location.clone(),
                });
            }
            "EXEC" => {
                count(1, 1, "one (quoted) command line")?;
                let argv = split_words(fields[0]);
                if argv.is_empty() {
                    return Err(entry_error(location, "EXEC with an empty command"));
                }
                self.execs.push(Exec { argv, location: location.clone() });
            }
            "INCLUDE" => {
                count(1, 1, "one pathname")?;
                let path = Path::new(fields[0]);
                let path = if path.is_relative() {
                    location.file.parent().unwrap_or(Path::new(".")).join(path)
                } else {
                    path.to_path_buf()
                };
                self.load_file(&path, stack).map_err(|error| match error {
                    ConfigError::Io { path, source } => entry_error(location, format!("INCLUDE {path}: {source}")),
                    other => other,
                })?;
            }
            _ => self.unsupported.push(Unsupported {
                keyword: keyword.to_owned(),
                fields: fields.iter().map(|f| (*f).to_owned()).collect(),
                location: location.clone(),
            }),
        }
        Ok(())
    }

    /// Of REQUESTs with the same feed and pattern, the first is primary.
    fn mark_alternates(&mut self) {
        for k in 0..self.requests.len() {
            let earlier = self.requests[..k].iter().any(|r| {
                r.feedtype == self.requests[k].feedtype && r.pattern.as_str() == self.requests[k].pattern.as_str()
            });
            self.requests[k].primary = !earlier;
        }
    }
}

fn feedtype(text: &str, location: &Location) -> Result<FeedType, ConfigError> {
    text.parse::<FeedType>().map_err(|error| entry_error(location, format!("feedtype {text:?}: {error}")))
}

fn host_pattern(text: &str, location: &Location) -> Result<Pattern, ConfigError> {
    Pattern::new_case_insensitive(text).map_err(|error| entry_error(location, format!("host pattern: {error}")))
}

fn product_pattern(text: &str, location: &Location) -> Result<Pattern, ConfigError> {
    Pattern::new_case_insensitive(text).map_err(|error| entry_error(location, format!("product pattern: {error}")))?;
    Pattern::new(text).map_err(|error| entry_error(location, format!("product pattern: {error}")))
}

/// Splits a command line into words: blanks separate, quotes group, backslash escapes.
pub fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') | (None, '\\') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
                in_word = true;
            }
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/ldmd.conf"))
    }

    #[test]
    fn the_recommended_default_lines_parse() {
        let config = parse(
            "# comment\nALLOW ANY ^((localhost|loopback)|(127\\.0\\.0\\.1\\.?))$\nallow ANY \\.unidata\\.ucar\\.edu$\n",
        )
        .unwrap();
        assert_eq!(config.allows.len(), 2);
        assert_eq!(config.allows[0].feedtype, FeedType::ANY);
        assert!(config.allows[0].host.is_match("LOCALHOST"));
        assert!(config.allows[0].host.is_match("127.0.0.1"));
        assert!(config.allows[1].host.is_match("idd.unidata.ucar.edu"));
        assert!(config.allows[0].ok.matches_everything() && config.allows[0].not.is_none());
    }

    #[test]
    fn lexical_rules() {
        let config = parse(
            "REQUEST EXP\n  \"with space\\\" and quote\"   host.edu:3880 PRIMARY # trailing comment\n\
             EXEC \"pqact -f ANY etc/pqact.conf\"\n\
             ACCEPT EXP .* host # ALLOW here is a comment\n",
        )
        .unwrap();
        assert_eq!(config.requests.len(), 1);
        assert_eq!(config.requests[0].pattern.as_str(), "with space\" and quote");
        assert_eq!((config.requests[0].host.as_str(), config.requests[0].port), ("host.edu", Some(3880)));
        assert_eq!(config.execs[0].argv, ["pqact", "-f", "ANY", "etc/pqact.conf"]);
        assert_eq!(config.accepts.len(), 1);
        assert_eq!(config.accepts[0].location.line, 4);
        // A keyword not at the start of a line is a field: ALLOW's fields run on.
        let error = parse("ALLOW ANY host.edu ok not ALLOW\n").unwrap_err().to_string();
        assert!(error.contains("ALLOW takes"), "{error}");
        // POLL is an alias of REQUEST only as POLL or poll.
        assert_eq!(parse("POLL EXP .* h\npoll EXP .* h").unwrap().requests.len(), 2);
        assert!(parse("Poll EXP .* h").is_err());
    }

    #[test]
    fn errors_name_the_line() {
        let error = parse("ALLOW ANY .*\n\nREQUEST NOSUCHFEED .* h\n").unwrap_err().to_string();
        assert!(error.starts_with("/etc/ldmd.conf:3:"), "{error}");
        assert!(error.contains("NOSUCHFEED"), "{error}");
        let error = parse("ACCEPT EXP ( host\n").unwrap_err().to_string();
        assert!(error.contains(":1:") && error.contains("pattern"), "{error}");
        assert!(parse("EXEC \"unterminated\n").unwrap_err().to_string().contains("unterminated"));
        assert!(parse("FROB x\n").unwrap_err().to_string().contains("not a keyword"));
        assert!(parse("REQUEST EXP .* host:notaport\n").is_err());
    }

    #[test]
    fn duplicate_requests_make_alternates() {
        let config = parse("REQUEST EXP .* a:399\nREQUEST EXP .* b\nREQUEST IDS .* b\n").unwrap();
        let primary: Vec<bool> = config.requests.iter().map(|r| r.primary).collect();
        assert_eq!(primary, [true, false, true]);
        assert_eq!(config.requests[1].port, None);
    }

    #[test]
    fn includes_are_relative_and_cycles_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/ldmd.conf"), "ALLOW ANY .*\nINCLUDE more.conf\n").unwrap();
        std::fs::write(dir.path().join("etc/more.conf"), "REQUEST EXP .* up\nMULTICAST EXP 224.0.0.1:38800\n").unwrap();
        let config = Config::load(&dir.path().join("etc/ldmd.conf")).unwrap();
        assert_eq!((config.allows.len(), config.requests.len(), config.unsupported.len()), (1, 1, 1));
        std::fs::write(dir.path().join("etc/more.conf"), "INCLUDE ldmd.conf\n").unwrap();
        let error = Config::load(&dir.path().join("etc/ldmd.conf")).unwrap_err().to_string();
        assert!(error.contains("cycle"), "{error}");
    }

    #[test]
    fn words_split_like_a_shell() {
        assert_eq!(split_words(r#"a "b c" d\ e 'f g'"#), ["a", "b c", "d e", "f g"]);
        assert!(split_words("   ").is_empty());
    }
}
