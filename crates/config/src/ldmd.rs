//! `ldmd.conf` (ldm-formats.md §1): the entries ALLOW, ACCEPT, REQUEST (alias POLL), EXEC,
//! INCLUDE, and the LDM-7 entries MULTICAST and RECEIVE (ldm7-multicast.md §4.1).
//!
//! Lexical rules, as the reference scanner: keywords count only at the start of a line and in
//! any case; `#` starts a comment; fields are runs of non-blank characters without `"`, or
//! `"…"` strings in which a backslash makes the next character literal; an entry may span
//! lines (a newline is only whitespace to the grammar); a field has at most 1999 characters.
//! An error names the line where the bad entry starts: when an entry that runs onto further lines
//! is wrong but its first lines alone would be right, the first continuation line that starts
//! with an unquoted word is the bad entry (typically a misspelled keyword), and the error names
//! that line and that word.
//!
//! ```text
//! ALLOW   feedtypeExpr  hostERE  [okERE [notERE]]
//! ACCEPT  feedtypeExpr  prodIdERE  hostERE
//! REQUEST feedtypeExpr  prodIdERE  host[:port]  [PRIMARY|ALTERNATE]   # 4th field ignored
//! EXEC    "command args…"
//! INCLUDE pathname                                                    # relative to this file
//! MULTICAST feedtypeExpr group[:port] [fmtpServer[:port] subnetLen vlanId switchId switchPort]
//! RECEIVE   feedtypeExpr ldmServer[:port] [fmtpIface switchId portId [vlanTag]]
//! ```
//!
//! MULTICAST: the group is an IPv4 multicast address; its port defaults to the server's port.
//! The short form has FMTP server `0.0.0.0` with a port the system chooses, no subnet (subscribers
//! are authorized by their own address, §4.3) and no VLAN; the long form's `fmtpServer/subnetLen`
//! is the feed's private subnet, from which subscribers get their addresses (§4.2), and
//! `vlanId switchId switchPort` is the publisher's attachment to the feed's path (a `dummy`
//! switch or port means none). RECEIVE: `fmtpIface` is the interface on which the subscriber
//! configures the address the publisher hands out and joins the group (`<ifname>.<vlanTag>`
//! names a VLAN interface); `switchId portId vlanTag` is the subscriber's attachment, sent in
//! SUBSCRIBE so that the publisher can add it to the path.
//!
//! Host EREs are case-insensitive (matched against the peer's address and its name); product
//! EREs are checked here and matched case-sensitively at run time. Of several REQUESTs with the
//! same feedtype and pattern, the first is primary and the others alternate. EXEC commands are
//! split into words by blanks, honouring quotes and backslashes (no variable or glob expansion,
//! unlike `wordexp(3)`).

use std::fmt;
use std::path::{Path, PathBuf};

use ldm7_types::{FeedType, HostPort, Pattern, ProdClass, ProdSpec};

use crate::hosts::HostMatch;

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
    /// Hosts: an ERE (case-insensitive, against address and name), or an address or prefix
    /// ([`HostMatch`]).
    pub host: HostMatch,
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
    /// Hosts, as ALLOW's.
    pub host: HostMatch,
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

/// Where a host attaches to a feed's layer-2 path (the LDM-7 `VcEndPoint`): switch, port and
/// VLAN tag. Empty switch and port (or `dummy`) mean no path service is involved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attachment {
    /// Switch (AL2S node, or the lab host).
    pub switch: String,
    /// Port (interface).
    pub port: String,
    /// VLAN tag (0: none).
    pub vlan: u16,
}

impl Attachment {
    /// Whether this names a real attachment (not empty, not `dummy`).
    pub fn is_set(&self) -> bool {
        let dummy = |text: &str| text.is_empty() || text.eq_ignore_ascii_case("dummy");
        !(dummy(&self.switch) || dummy(&self.port))
    }
}

/// `MULTICAST`: a feed this server multicasts with FMTP (ldm7-multicast.md §4.1).
#[derive(Clone, Debug)]
pub struct Multicast {
    /// The feed.
    pub feedtype: FeedType,
    /// The multicast group: IPv4 (224.0.0.0/4), or IPv6 (ff00::/8; a source-specific group is
    /// in ff3x::/32) as an ldm7 extension.
    pub group: std::net::IpAddr,
    /// Its UDP port (`None`: the server's port).
    pub group_port: Option<u16>,
    /// The FMTP retransmission server's address (`0.0.0.0` or `::`: any), of the group's family.
    pub fmtp_server: std::net::IpAddr,
    /// Its TCP port (0: chosen by the system).
    pub fmtp_port: u16,
    /// Prefix length of the feed's private subnet around `fmtp_server` (0: none; subscribers
    /// are authorized by their own address).
    pub subnet_len: u8,
    /// The publisher's attachment to the feed's path.
    pub attachment: Attachment,
    /// Where.
    pub location: Location,
}

/// `RECEIVE`: a feed this server subscribes to by LDM-7 multicast.
#[derive(Clone, Debug)]
pub struct Receive {
    /// The feed.
    pub feedtype: FeedType,
    /// The upstream LDM server.
    pub host: String,
    /// Its port (`None`: the server's own port).
    pub port: Option<u16>,
    /// The interface for FMTP (address configuration and the join), if given.
    pub interface: Option<String>,
    /// This host's attachment to the feed's path.
    pub attachment: Attachment,
    /// Where.
    pub location: Location,
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
    /// MULTICAST entries.
    pub multicasts: Vec<Multicast>,
    /// RECEIVE entries.
    pub receives: Vec<Receive>,
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

/// What separates fields besides newlines: the ASCII blanks (as the reference's byte-wise
/// scanner; a non-ASCII space such as U+00A0 is part of a field).
fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\x0b' | '\x0c' | '\r')
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
            c if is_blank(c) => {
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
                    if is_blank(c) || c == '\n' || c == '"' || c == '#' {
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

/// For a wrong entry (`entry`: the keyword's token, then its fields) that runs onto further
/// lines: when the part before its first continuation line that starts with an unquoted word
/// would parse alone, that line is the bad entry — a word at the start of a line that is not a
/// keyword — and the error names it. `None` when the entry's first lines are wrong by themselves.
fn blame_continuation(
    keyword: &str,
    entry: &[Token],
    location: &Location,
    stack: &[PathBuf],
    error: &ConfigError,
) -> Option<ConfigError> {
    let split = (1..entry.len()).find(|&j| entry[j].at_line_start)?;
    let head: Vec<&str> = entry[1..split].iter().map(|t| t.text.as_str()).collect();
    // On a scratch configuration: the real one must not get the head's entry.
    Config::default().entry(keyword, &head, location, &mut stack.to_vec()).ok()?;
    let word = &entry[split];
    let why = match error {
        ConfigError::Entry { message, .. } => message.clone(),
        other => other.to_string(),
    };
    Some(entry_error(
        &Location { file: location.file.clone(), line: word.line },
        format!(
            "{:?} is not a keyword (ALLOW, ACCEPT, REQUEST, EXEC, INCLUDE, MULTICAST, RECEIVE at the start of a line); \
             read as more fields of the {keyword} entry on line {}, it makes that entry wrong: {why}",
            word.text, location.line
        ),
    ))
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
            if let Err(error) = self.entry(keyword, &fields, &location, stack) {
                return Err(blame_continuation(keyword, &tokens[k..end], &location, stack, &error).unwrap_or(error));
            }
            k = end;
        }
        Ok(())
    }

    /// One entry of ldmd.conf by its keyword. One function on purpose: a `match` with an arm per
    /// keyword (ALLOW, ACCEPT, REQUEST, EXEC, INCLUDE, MULTICAST, RECEIVE and the rest), each arm
    /// the few checks of its fields with the reference's messages, read like the manual's list;
    /// split, the keywords' rules would be spread over as many functions.
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
                let (host, port) = host_and_port(fields[2], location)?;
                self.requests.push(Request {
                    feedtype: feedtype(fields[0], location)?,
                    pattern: product_pattern(fields[1], location)?,
                    host,
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
            "MULTICAST" => {
                if fields.len() != 2 && fields.len() != 7 {
                    return Err(entry_error(
                        location,
                        format!(
                            "MULTICAST takes feedtype group[:port], or feedtype group[:port] fmtpServer[:port] \
                             subnetLen vlanId switchId switchPort; found {} field(s)",
                            fields.len()
                        ),
                    ));
                }
                let feedtype = feedtype(fields[0], location)?;
                let (group, group_port) = address_and_port(fields[1], "multicast group", location)?;
                if !group.is_multicast() {
                    return Err(entry_error(
                        location,
                        format!(
                            "{group} is not a multicast address: IPv4 224.0.0.0/4 (e.g. 239.77.1.1:38800) or IPv6 \
                             ff00::/8 (e.g. [ff3e::8000:1]:38800)"
                        ),
                    ));
                }
                let any = match group {
                    std::net::IpAddr::V4(_) => std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                    std::net::IpAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                };
                let mut entry = Multicast {
                    feedtype,
                    group,
                    group_port,
                    fmtp_server: any,
                    fmtp_port: 0,
                    subnet_len: 0,
                    attachment: Attachment::default(),
                    location: location.clone(),
                };
                if fields.len() == 7 {
                    let (server, port) = address_and_port(fields[2], "FMTP server", location)?;
                    if server.is_ipv4() != group.is_ipv4() {
                        return Err(entry_error(
                            location,
                            format!(
                                "the FMTP server {server} and the group {group} are of different families: give \
                                 both IPv4 or both IPv6"
                            ),
                        ));
                    }
                    entry.fmtp_server = server;
                    entry.fmtp_port = port.unwrap_or(0);
                    let longest = if server.is_ipv4() { 32 } else { 128 };
                    entry.subnet_len = fields[3].parse::<u8>().ok().filter(|len| *len <= longest).ok_or_else(|| {
                        entry_error(location, format!("subnetLen {:?} is not a prefix length 0–{longest}", fields[3]))
                    })?;
                    entry.attachment = Attachment {
                        vlan: vlan(fields[4], location)?,
                        switch: fields[5].to_owned(),
                        port: fields[6].to_owned(),
                    };
                }
                if self.multicasts.iter().any(|other| other.feedtype.intersects(entry.feedtype)) {
                    return Err(entry_error(
                        location,
                        format!(
                            "feed {feedtype} is already multicast by an earlier MULTICAST entry: one group per feed"
                        ),
                    ));
                }
                self.multicasts.push(entry);
            }
            "RECEIVE" => {
                if !(fields.len() == 2 || fields.len() == 5 || fields.len() == 6) {
                    return Err(entry_error(
                        location,
                        format!(
                            "RECEIVE takes feedtype ldmServer[:port], or feedtype ldmServer[:port] fmtpIface \
                             switchId portId [vlanTag]; found {} field(s)",
                            fields.len()
                        ),
                    ));
                }
                let (host, port) = host_and_port(fields[1], location)?;
                let mut entry = Receive {
                    feedtype: feedtype(fields[0], location)?,
                    host,
                    port,
                    interface: None,
                    attachment: Attachment::default(),
                    location: location.clone(),
                };
                if fields.len() >= 5 {
                    entry.interface = Some(fields[2].to_owned());
                    entry.attachment = Attachment {
                        switch: fields[3].to_owned(),
                        port: fields[4].to_owned(),
                        vlan: fields.get(5).map(|tag| vlan(tag, location)).transpose()?.unwrap_or(0),
                    };
                }
                self.receives.push(entry);
            }
            other => return Err(entry_error(location, format!("{other} is not handled"))),
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

/// `host[:port]`, `[v6]:port` or a bare IPv6 address ([`HostPort`]).
fn host_and_port(text: &str, location: &Location) -> Result<(String, Option<u16>), ConfigError> {
    let parsed = HostPort::parse(text).map_err(|error| entry_error(location, error.to_string()))?;
    Ok((parsed.host, parsed.port))
}

/// `a.b.c.d[:port]` or `[v6][:port]` (port 0: chosen by the system; [`HostPort`]'s forms, an
/// address rather than a name).
fn address_and_port(
    text: &str,
    what: &str,
    location: &Location,
) -> Result<(std::net::IpAddr, Option<u16>), ConfigError> {
    let usage = format!("give {what} as a.b.c.d[:port] or [IPv6 address][:port]");
    let parsed = HostPort::parse_any_port(text).map_err(|error| entry_error(location, format!("{error}; {usage}")))?;
    let address = parsed.host.parse::<std::net::IpAddr>().map_err(|_| {
        entry_error(location, format!("{what} {:?} is not an IPv4 or IPv6 address: {usage}", parsed.host))
    })?;
    Ok((address, parsed.port))
}

fn vlan(text: &str, location: &Location) -> Result<u16, ConfigError> {
    text.parse::<u16>()
        .ok()
        .filter(|tag| *tag < 4095)
        .ok_or_else(|| entry_error(location, format!("VLAN tag {text:?} is not a number 0–4094")))
}

fn feedtype(text: &str, location: &Location) -> Result<FeedType, ConfigError> {
    text.parse::<FeedType>().map_err(|error| entry_error(location, format!("feedtype {text:?}: {error}")))
}

fn host_pattern(text: &str, location: &Location) -> Result<HostMatch, ConfigError> {
    HostMatch::parse(text).map_err(|error| entry_error(location, error))
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

    /// Found by fuzzing (ldmd_conf): a vertical tab ended a field without being skipped as a
    /// blank, so the scanner made empty fields without end until memory ran out.
    #[test]
    fn every_ascii_blank_separates_fields_and_a_non_ascii_space_is_part_of_one() {
        let config = parse("ALLOW\x0bANY\x0b\x0b^host\\.edu$\x0c\r\nEXEC \"a\"\x0b\n").expect("parses");
        assert_eq!(config.allows.len(), 1);
        assert_eq!(config.execs.len(), 1);
        let error = parse("ALLOW\u{a0}ANY .*\n").expect_err("ALLOW\u{a0}ANY is one word, not a keyword");
        assert!(error.to_string().contains("not a keyword"), "{error}");
    }

    #[test]
    fn the_recommended_default_lines_parse() {
        let config = parse(
            "# comment\nALLOW ANY ^((localhost|loopback)|(127\\.0\\.0\\.1\\.?))$\nallow ANY \\.unidata\\.ucar\\.edu$\n",
        )
        .unwrap();
        assert_eq!(config.allows.len(), 2);
        assert_eq!(config.allows[0].feedtype, FeedType::ANY);
        let ip = "192.0.2.1".parse().unwrap();
        assert!(config.allows[0].host.matches(ip, Some("LOCALHOST")));
        assert!(config.allows[0].host.matches("127.0.0.1".parse().unwrap(), None));
        assert!(config.allows[1].host.matches(ip, Some("idd.unidata.ucar.edu")));
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
        // A misspelled keyword on line 2 is line 2's error, not too many fields for line 1's ALLOW.
        let error = parse("ALLOW ANY ^localhost$\nALOW ANY ^other\\.edu$\n").unwrap_err().to_string();
        assert!(error.starts_with("/etc/ldmd.conf:2: \"ALOW\" is not a keyword"), "{error}");
        assert!(error.contains("ALLOW entry on line 1") && error.contains("ALLOW takes"), "{error}");
        // After a comment and a blank line, and with an ACCEPT whose continuation breaks its pattern.
        let error = parse("# c\n\nACCEPT EXP .* ^h$\nACCPT EXP ( x\n").unwrap_err().to_string();
        assert!(error.starts_with("/etc/ldmd.conf:4: \"ACCPT\""), "{error}");
        // An entry wrong on its first line stays that line's error, continuation or not.
        let error = parse("REQUEST NOSUCHFEED .*\n  host\n").unwrap_err().to_string();
        assert!(error.starts_with("/etc/ldmd.conf:1:") && error.contains("NOSUCHFEED"), "{error}");
        let error = parse("REQUEST EXP\n  .* host:notaport\n").unwrap_err().to_string();
        assert!(error.starts_with("/etc/ldmd.conf:1:"), "{error}");
        // A well-formed entry on several lines is still one entry.
        assert_eq!(parse("ALLOW ANY\n  ^localhost$\n").unwrap().allows.len(), 1);
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
        assert_eq!((config.allows.len(), config.requests.len(), config.multicasts.len()), (1, 1, 1));
        std::fs::write(dir.path().join("etc/more.conf"), "INCLUDE ldmd.conf\n").unwrap();
        let error = Config::load(&dir.path().join("etc/ldmd.conf")).unwrap_err().to_string();
        assert!(error.contains("cycle"), "{error}");
    }

    #[test]
    fn multicast_and_receive_entries() {
        let config = parse(
            "MULTICAST NGRID 239.77.1.1:38800\n\
             MULTICAST IDS|DDPLUS 239.77.2.1 10.77.2.1:38801 24 332 sdn-sw-1 eth1/1\n\
             RECEIVE NGRID pub.example.edu\n\
             RECEIVE EXP pub.example.edu:3880 eth1.332 sdn-sw-2 eth2/7 332\n",
        )
        .unwrap();
        let short = &config.multicasts[0];
        assert_eq!((short.group.to_string(), short.group_port), ("239.77.1.1".into(), Some(38800)));
        assert_eq!(
            (short.fmtp_server, short.fmtp_port, short.subnet_len),
            (std::net::IpAddr::from(std::net::Ipv4Addr::UNSPECIFIED), 0, 0)
        );
        assert!(!short.attachment.is_set());
        let long = &config.multicasts[1];
        assert_eq!((long.fmtp_server.to_string(), long.fmtp_port, long.subnet_len), ("10.77.2.1".into(), 38801, 24));
        assert_eq!(long.attachment, Attachment { switch: "sdn-sw-1".into(), port: "eth1/1".into(), vlan: 332 });
        assert_eq!(long.group_port, None);
        assert_eq!((config.receives[0].host.as_str(), config.receives[0].port), ("pub.example.edu", None));
        let full = &config.receives[1];
        assert_eq!((full.port, full.interface.as_deref()), (Some(3880), Some("eth1.332")));
        let v6 = parse(
            "MULTICAST EXP [ff3e::8000:1]:38800 [fd00:77:1::1]:38801 64 0 dummy dummy\nRECEIVE EXP [fd00:76::1]:388\n",
        )
        .unwrap();
        let multicast = &v6.multicasts[0];
        assert_eq!((multicast.group.to_string(), multicast.group_port), ("ff3e::8000:1".into(), Some(38800)));
        assert_eq!((multicast.fmtp_server.to_string(), multicast.subnet_len), ("fd00:77:1::1".into(), 64));
        assert_eq!((v6.receives[0].host.as_str(), v6.receives[0].port), ("fd00:76::1", Some(388)));
        let bare = parse("MULTICAST EXP ff3e::8000:2\n").unwrap();
        assert_eq!(
            (bare.multicasts[0].group.to_string(), bare.multicasts[0].fmtp_server.to_string()),
            ("ff3e::8000:2".into(), "::".into())
        );
        assert_eq!(full.attachment.vlan, 332);
        for (bad, why) in [
            ("MULTICAST EXP 10.0.0.1\n", "not a multicast address: IPv4 224.0.0.0/4"),
            ("MULTICAST EXP [fd00::1]:38800\n", "or IPv6 ff00::/8"),
            ("MULTICAST EXP [ff3e::1]:38800 10.0.0.1 24 0 s p\n", "different families"),
            ("MULTICAST EXP [ff3e::1]:38800 [fd00::1]:1 129 0 s p\n", "prefix length 0–128"),
            ("MULTICAST EXP [239.1.1.1]:38800\n", "[IPv6 address][:port]"),
            ("MULTICAST EXP [ff3e::1:38800\n", "no closing bracket"),
            ("MULTICAST EXP 239.1.1.1 10.0.0.1 24\n", "MULTICAST takes"),
            ("MULTICAST EXP 239.1.1.1 10.0.0.1 33 0 s p\n", "subnetLen"),
            ("MULTICAST EXP 239.1.1.1 10.0.0.1 24 5000 s p\n", "VLAN tag"),
            ("MULTICAST EXP group.example\n", "not an IPv4 or IPv6 address"),
            ("MULTICAST ANY 239.1.1.1\nMULTICAST EXP 239.1.1.2\n", "already multicast"),
            ("RECEIVE EXP\n", "RECEIVE takes"),
            ("RECEIVE EXP host:0\n", "invalid port"),
        ] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
    }

    #[test]
    fn words_split_like_a_shell() {
        assert_eq!(split_words(r#"a "b c" d\ e 'f g'"#), ["a", "b c", "d e", "f g"]);
        assert!(split_words("   ").is_empty());
    }
}
