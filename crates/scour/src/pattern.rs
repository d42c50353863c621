//! The PATTERN field of a scour.conf line: a shell pattern matched against a file's name (not
//! its path) by the C library's `fnmatch(3)` with `FNM_PATHNAME`, exactly as LDM's scour matches
//! it: `*`, `?`, bracket expressions with `!` or `^`, ranges and `[:classes:]`, backslash
//! escapes. Without `FNM_PERIOD`, `*` and `?` match a leading `.` too: the default pattern `*`
//! deletes hidden files, as LDM's scour does (its manual says otherwise; its binary does so).
//!
//! The C library's matcher is used rather than a reimplementation because its corner cases
//! (unterminated brackets are literal, an unknown class matches nothing, a trailing backslash
//! matches nothing) are what sites' patterns have been tested against.

use std::ffi::{CStr, CString};
use std::fmt;

/// The pattern used when a line has none: every file.
pub const ALL_FILES: &str = "*";

/// A compiled PATTERN.
#[derive(Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    c_text: CString,
}

/// A pattern that cannot be handed to `fnmatch`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pattern {text:?} holds a NUL byte")]
pub struct PatternError {
    /// The text given.
    pub text: String,
}

impl Pattern {
    /// The pattern `text`.
    pub fn new(text: &str) -> Result<Pattern, PatternError> {
        Pattern::from_bytes(text.as_bytes())
    }

    /// The pattern of a configuration field (any bytes but NUL: names need not be UTF-8).
    pub fn from_bytes(bytes: &[u8]) -> Result<Pattern, PatternError> {
        let text = String::from_utf8_lossy(bytes).into_owned();
        match CString::new(bytes) {
            Ok(c_text) => Ok(Pattern { text, c_text }),
            Err(_) => Err(PatternError { text }),
        }
    }

    /// `*`.
    pub fn all() -> Pattern {
        Pattern { text: ALL_FILES.to_owned(), c_text: c"*".to_owned() }
    }

    /// The pattern as written (invalid UTF-8 replaced, for messages).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The pattern's bytes as written.
    pub fn as_bytes(&self) -> &[u8] {
        self.c_text.to_bytes()
    }

    /// Whether a file name (one path component) matches.
    pub fn matches(&self, name: &CStr) -> bool {
        // SAFETY: both pointers are to NUL-terminated strings that live across the call
        // (`self.c_text` and `name` are borrowed for it); fnmatch only reads them, and it is
        // MT-safe (it reads the locale, which this process never changes).
        #[allow(unsafe_code)]
        let result = unsafe { libc::fnmatch(self.c_text.as_ptr(), name.as_ptr(), libc::FNM_PATHNAME) };
        result == 0
    }

    /// Whether a name given as bytes matches (false for a name holding a NUL byte).
    pub fn matches_bytes(&self, name: &[u8]) -> bool {
        CString::new(name).is_ok_and(|name| self.matches(&name))
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({:?})", self.text)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, name: &str) -> bool {
        Pattern::new(pattern).unwrap().matches_bytes(name.as_bytes())
    }

    #[test]
    fn stars_and_questions_match_a_leading_dot_as_ldm_does() {
        assert!(matches("*", ".hidden"));
        assert!(matches("*", "file.nc"));
        assert!(matches("*.nc", ".nc"));
        assert!(matches("?x", ".x"));
        assert!(Pattern::all().matches(c".scour*"));
        assert!(!matches("*.nc", "file.nc.gz"));
        assert!(matches("*eta.nc", "gfs_eta.nc"));
        assert!(matches("a*b*c", "aXbYc"));
        assert!(matches("sp ace", "sp ace"));
    }

    #[test]
    fn brackets_follow_posix_and_glibc() {
        for (pattern, name, expected) in [
            ("[!a]", "b", true),
            ("[^a]", "b", true),
            ("[!a]", "a", false),
            ("[]]", "]", true),
            ("[!]]", "a", true),
            ("[a-]", "-", true),
            ("[-a]", "-", true),
            ("[z-a]", "m", false),
            ("[[:digit:]]*", "2024.nc", true),
            ("[[:digit:]]*", "x2024.nc", false),
            ("[[:alpha:]-z]", "-", true),
            ("[[.a.]-c]", "b", true),
            ("[[=a=]]", "a", true),
            ("[a\\-z]", "-", true),
            ("[a\\-z]", "m", false),
            ("[a/]b", "ab", true),
        ] {
            assert_eq!(matches(pattern, name), expected, "{pattern:?} against {name:?}");
        }
    }

    #[test]
    fn corner_cases_are_the_c_librarys() {
        // An unterminated bracket is a literal `[`.
        assert!(matches("[", "["));
        assert!(matches("a[", "a["));
        assert!(matches("[!", "[!"));
        // An unknown class matches nothing; so does a trailing backslash.
        assert!(!matches("[[:foo:]]", "a"));
        assert!(!matches("a\\", "a\\"));
        assert!(!matches("a\\", "a"));
        // A backslash escapes.
        assert!(matches("\\*", "*"));
        assert!(!matches("\\*", "x"));
        // A slash never matches a name (FNM_PATHNAME; names hold none).
        assert!(!matches("*/x", "x"));
        // Bytes, not characters: neither process sets a locale, so fnmatch works in the C
        // locale, where the two bytes of UTF-8 "é" are two characters.
        assert!(matches("??", "é"));
        assert!(!matches("?", "é"));
    }

    #[test]
    fn a_nul_byte_is_refused() {
        assert!(Pattern::new("a\0b").is_err());
        assert!(!Pattern::all().matches_bytes(b"a\0b"));
    }
}
