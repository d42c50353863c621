//! A host and port as written in ldmd.conf and on command lines (docs/server.md "IPv6"):
//!
//! * `host` and `host:port`: a name or an IPv4 address (the reference's forms);
//! * `[v6]` and `[v6]:port`: an IPv6 address in brackets, with or without a port;
//! * `v6`: a bare IPv6 address, without a port (its colons leave no room for one);
//! * a link-local IPv6 address names its interface (`[fe80::1%eth0]:388`): without one, the
//!   kernel cannot tell which link is meant, so it is refused with that fix.

use core::net::Ipv6Addr;
use std::fmt;

/// A host and an optional port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    /// A name, an IPv4 address or an IPv6 address without brackets (`fe80::1%eth0` with a
    /// scope): what the resolver takes.
    pub host: String,
    /// The port, when given (1–65535).
    pub port: Option<u16>,
}

impl HostPort {
    /// Parses `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address.
    pub fn parse(text: &str) -> Result<Self, HostPortError> {
        Self::parse_with(text, false)
    }

    /// [`HostPort::parse`], with port 0 (chosen by the system) accepted too.
    pub fn parse_any_port(text: &str) -> Result<Self, HostPortError> {
        Self::parse_with(text, true)
    }

    fn parse_with(text: &str, zero_port: bool) -> Result<Self, HostPortError> {
        let error = |kind| Err(HostPortError { text: text.to_owned(), kind });
        if text.is_empty() {
            return error(HostPortErrorKind::NoHost);
        }
        if text.contains(char::is_whitespace) {
            return error(HostPortErrorKind::Whitespace);
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let Some((inside, after)) = rest.split_once(']') else {
                return error(HostPortErrorKind::Unclosed);
            };
            if let Err(kind) = check_ipv6(inside) {
                return error(kind);
            }
            let port = match after {
                "" => None,
                _ => match after.strip_prefix(':') {
                    Some(port) => Some(port),
                    None => return error(HostPortErrorKind::AfterBracket),
                },
            };
            (inside, port)
        } else {
            match text.matches(':').count() {
                0 => (text, None),
                1 => {
                    let (host, port) = text.split_once(':').expect("one colon");
                    (host, Some(port))
                }
                _ => {
                    if let Err(kind) = check_ipv6(text) {
                        return error(match kind {
                            HostPortErrorKind::NotIpv6 => HostPortErrorKind::Colons,
                            other => other,
                        });
                    }
                    (text, None)
                }
            }
        };
        if host.is_empty() {
            return error(HostPortErrorKind::NoHost);
        }
        let port = match port {
            None => None,
            Some(port) => match port.parse::<u16>() {
                Ok(port) if port > 0 || zero_port => Some(port),
                _ => return error(HostPortErrorKind::Port(port.to_owned())),
            },
        };
        Ok(Self { host: host.to_owned(), port })
    }

    /// The host as written back: in brackets when it is an IPv6 address.
    pub fn host_text(&self) -> String {
        bracketed(&self.host)
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}", join(&self.host, port)),
            None => write!(f, "{}", self.host_text()),
        }
    }
}

/// `host:port`, with an IPv6 host in brackets (`[2001:db8::1]:388`).
pub fn join(host: &str, port: u16) -> String {
    format!("{}:{port}", bracketed(host))
}

/// The host in brackets when it is an IPv6 address (it holds a colon), else as it is.
pub fn bracketed(host: &str) -> String {
    if host.contains(':') { format!("[{host}]") } else { host.to_owned() }
}

/// `address[%scope]`, an IPv6 address; a link-local one must name its interface.
fn check_ipv6(text: &str) -> Result<(), HostPortErrorKind> {
    let (address, scope) = match text.split_once('%') {
        Some((address, scope)) => (address, Some(scope)),
        None => (text, None),
    };
    let Ok(address) = address.parse::<Ipv6Addr>() else {
        return Err(HostPortErrorKind::NotIpv6);
    };
    match scope {
        Some("") => Err(HostPortErrorKind::EmptyScope),
        None if address.is_unicast_link_local() => Err(HostPortErrorKind::LinkLocal(address)),
        _ => Ok(()),
    }
}

/// Text that is not a host and port.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?}: {kind}")]
pub struct HostPortError {
    /// What was written.
    pub text: String,
    /// What is wrong with it.
    pub kind: HostPortErrorKind,
}

/// What is wrong with a host and port.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostPortErrorKind {
    /// Nothing before the port.
    #[error("no host: give host[:port], or [IPv6 address]:port")]
    NoHost,
    /// A space or tab.
    #[error("a host and port hold no spaces")]
    Whitespace,
    /// `[` without `]`.
    #[error("no closing bracket: write an IPv6 address as [2001:db8::1] or [2001:db8::1]:388")]
    Unclosed,
    /// Something other than `:port` after `]`.
    #[error("after the closing bracket only :port may follow, as in [2001:db8::1]:388")]
    AfterBracket,
    /// Brackets around something other than an IPv6 address.
    #[error("not an IPv6 address inside the brackets: write [2001:db8::1]:388")]
    NotIpv6,
    /// More than one colon, and not an IPv6 address.
    #[error(
        "more than one colon, yet not an IPv6 address: write host:port, or an IPv6 address in brackets \
         with its port, [2001:db8::1]:388"
    )]
    Colons,
    /// `%` with nothing after it.
    #[error("an empty interface after %: write [fe80::1%eth0]")]
    EmptyScope,
    /// A link-local address without its interface.
    #[error("{0} is link-local: name its interface, as in [{0}%eth0]:388")]
    LinkLocal(Ipv6Addr),
    /// Not a port.
    #[error("invalid port {0:?}: give a port from 1 to 65535")]
    Port(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> (String, Option<u16>) {
        let parsed = HostPort::parse(text).unwrap_or_else(|error| panic!("{error}"));
        (parsed.host, parsed.port)
    }

    fn kind(text: &str) -> HostPortErrorKind {
        HostPort::parse(text).unwrap_err().kind
    }

    #[test]
    fn the_reference_forms_are_unchanged() {
        assert_eq!(ok("idd.unidata.ucar.edu"), ("idd.unidata.ucar.edu".into(), None));
        assert_eq!(ok("host.edu:3880"), ("host.edu".into(), Some(3880)));
        assert_eq!(ok("192.0.2.7:388"), ("192.0.2.7".into(), Some(388)));
        assert_eq!(kind("host:0"), HostPortErrorKind::Port("0".into()));
        assert_eq!(HostPort::parse_any_port("[::1]:0").map(|parsed| parsed.port), Ok(Some(0)));
        assert_eq!(kind("host:x"), HostPortErrorKind::Port("x".into()));
        assert_eq!(kind(":388"), HostPortErrorKind::NoHost);
        assert_eq!(kind(""), HostPortErrorKind::NoHost);
    }

    #[test]
    fn ipv6_in_brackets_and_bare() {
        assert_eq!(ok("[2001:db8::1]:388"), ("2001:db8::1".into(), Some(388)));
        assert_eq!(ok("[::1]"), ("::1".into(), None));
        assert_eq!(ok("2001:db8::1"), ("2001:db8::1".into(), None));
        assert_eq!(ok("::ffff:192.0.2.1"), ("::ffff:192.0.2.1".into(), None));
        assert_eq!(ok("[fe80::1%eth0]:388"), ("fe80::1%eth0".into(), Some(388)));
        assert_eq!(ok("fe80::1%2"), ("fe80::1%2".into(), None));
    }

    #[test]
    fn malformed_ipv6_says_what_to_write() {
        assert_eq!(kind("2001:db8::1:388:x"), HostPortErrorKind::Colons);
        assert_eq!(kind("2001:db8:::1"), HostPortErrorKind::Colons);
        assert_eq!(kind("[2001:db8::1"), HostPortErrorKind::Unclosed);
        assert_eq!(kind("[2001:db8::1]388"), HostPortErrorKind::AfterBracket);
        assert_eq!(kind("[host.edu]:388"), HostPortErrorKind::NotIpv6);
        assert_eq!(kind("[2001:db8::g]:388"), HostPortErrorKind::NotIpv6);
        assert_eq!(kind("[2001:db8::1]:65536"), HostPortErrorKind::Port("65536".into()));
        assert_eq!(kind("[fe80::1%]:388"), HostPortErrorKind::EmptyScope);
        let link_local = HostPort::parse("[fe80::1]:388").unwrap_err();
        assert_eq!(link_local.kind, HostPortErrorKind::LinkLocal("fe80::1".parse().unwrap()));
        assert!(link_local.to_string().contains("[fe80::1%eth0]:388"), "{link_local}");
    }

    #[test]
    fn written_back_with_brackets() {
        assert_eq!(HostPort::parse("[2001:db8::1]:388").unwrap().to_string(), "[2001:db8::1]:388");
        assert_eq!(HostPort::parse("2001:db8::1").unwrap().to_string(), "[2001:db8::1]");
        assert_eq!(HostPort::parse("host.edu:3880").unwrap().to_string(), "host.edu:3880");
        assert_eq!(join("::1", 388), "[::1]:388");
        assert_eq!(join("127.0.0.1", 388), "127.0.0.1:388");
    }
}
