//! Product classes: which products a subscriber wants (feed + identifier pattern + time range),
//! with LDM's matching semantics (ldm6-protocol.md §8, ldm-formats.md §1, §5).
//!
//! # Patterns: POSIX ERE in LDM, the `regex` crate here
//!
//! LDM compiles patterns with POSIX `regcomp(REG_EXTENDED)` and only asks "does it match
//! anywhere in the identifier". We compile them with the `regex` crate on bytes, with Unicode
//! off, unanchored, which gives the same answer for the patterns the IDD uses. The differences:
//!
//! - **Leftmost-longest vs leftmost-first** only changes *what* matched, never *whether*, so it
//!   does not matter for classes (pqact's back-references live elsewhere).
//! - **Back-references** (`\1` inside the pattern itself) are a glibc extension to ERE; the `regex`
//!   crate rejects them. Such a pattern is refused with a clear error (LDM would answer
//!   `BADPATTERN` for a pattern it could not compile, we do the same for these).
//! - **A `{` that does not start a valid interval** (`a{`, `{x}`) is taken literally by glibc and is
//!   an error for the `regex` crate; we escape such braces before compiling so both agree.
//! - **Perl classes** (`\d`, `\w`, `\s`) are an extension the `regex` crate accepts and glibc
//!   does not (glibc reads `\d` as `d`). A pattern that uses them is therefore more permissive
//!   here; patterns written for LDM do not use them.
//! - **A group opened by `(?`** (the `regex` crate's flags, `(?i)`, `(?u)`, and non-capturing
//!   groups, `(?:`) is refused, as glibc refuses it (a `?` with nothing to repeat): such a flag
//!   would change what a pattern matches here only, and `(?u)` turns on Unicode classes whose
//!   case folding made a host pattern up to 35 times as costly to compile.
//! - `\<` and `\>` (word start/end, glibc) are supported by both.
//! - Bracket expressions, POSIX classes (`[[:digit:]]`), anchors, alternation and intervals behave
//!   the same.
//!
//! Like LDM, a pattern of exactly `.*` matches everything without running a regex, and a pattern
//! longer than two characters has its leading `.*` pairs stripped before compiling (LDM's fix for
//! "pathological" patterns; it does not change what matches). The original text is kept for
//! printing and for the wire.

use std::fmt;

use regex::bytes::{Regex, RegexBuilder};

use crate::{FeedType, PATTERN_LEN_MAX, ProdInfo, Timestamp};

/// A compiled product-identifier (or host) pattern.
#[derive(Clone)]
pub struct Pattern {
    text: String,
    /// `None` for the match-everything pattern `.*`.
    regex: Option<Regex>,
}

/// Why a pattern cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Longer than LDM allows on the wire.
    #[error("pattern is {0} bytes long; LDM allows at most {PATTERN_LEN_MAX}")]
    TooLong(usize),
    /// Not a regular expression we can compile.
    #[error("pattern {pattern:?} is not a valid extended regular expression: {reason}")]
    Invalid {
        /// The pattern as given.
        pattern: String,
        /// The compiler's explanation.
        reason: String,
    },
}

impl Pattern {
    /// The pattern that matches every identifier.
    pub fn everything() -> Self {
        Self { text: ".*".to_owned(), regex: None }
    }

    /// Compiles a case-sensitive pattern (product classes).
    pub fn new(text: &str) -> Result<Self, PatternError> {
        Self::build(text, false, true)
    }

    /// Compiles a case-insensitive pattern (host names in `ldmd.conf`).
    pub fn new_case_insensitive(text: &str) -> Result<Self, PatternError> {
        Self::build(text, true, true)
    }

    /// Compiles a case-sensitive pattern whose match and groups are used
    /// ([`Pattern::captures`]: pqact's back-references): leading `.*` pairs are kept, since they
    /// are part of the whole match, and the wire's length limit does not apply. Groups follow
    /// the `regex` crate's leftmost-first rule where POSIX takes the leftmost-longest match;
    /// the two differ only for alternatives that are prefixes of each other (`(a|ab)`).
    pub fn new_capturing(text: &str) -> Result<Self, PatternError> {
        Self::build(text, false, false)
    }

    fn build(text: &str, case_insensitive: bool, for_classes: bool) -> Result<Self, PatternError> {
        if for_classes && text.len() > PATTERN_LEN_MAX {
            return Err(PatternError::TooLong(text.len()));
        }
        if text == ".*" {
            return Ok(Self::everything());
        }
        let mut stripped = text;
        if for_classes && stripped.len() > 2 {
            while let Some(rest) = stripped.strip_prefix(".*") {
                stripped = rest;
            }
        }
        let translated = translate_ere(stripped)
            .map_err(|reason| PatternError::Invalid { pattern: text.to_owned(), reason: reason.to_owned() })?;
        let regex = RegexBuilder::new(&translated)
            .unicode(false)
            .case_insensitive(case_insensitive)
            .size_limit(1 << 20)
            .build()
            .map_err(|error| PatternError::Invalid {
                pattern: text.to_owned(),
                reason: last_nonblank_line(&error.to_string()),
            })?;
        Ok(Self { text: text.to_owned(), regex: Some(regex) })
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the pattern matches anywhere in `subject`.
    pub fn is_match(&self, subject: &str) -> bool {
        self.regex.as_ref().is_none_or(|regex| regex.is_match(subject.as_bytes()))
    }

    /// Where the pattern matches `subject`, if it does: the whole match, then each group (`None`
    /// for a group that took no part), as byte ranges of `subject`.
    pub fn captures(&self, subject: &str) -> Option<Vec<Option<std::ops::Range<usize>>>> {
        let Some(regex) = &self.regex else { return Some(vec![Some(0..subject.len())]) };
        let captures = regex.captures(subject.as_bytes())?;
        Some(captures.iter().map(|group| group.map(|found| found.range())).collect())
    }

    /// Whether this is the match-everything pattern `.*`.
    pub fn matches_everything(&self) -> bool {
        self.regex.is_none()
    }
}

fn last_nonblank_line(text: &str) -> String {
    text.lines().rfind(|line| !line.trim().is_empty()).unwrap_or(text).trim().to_owned()
}

/// Rewrites the glibc ERE constructs the `regex` crate reads differently (see the module docs):
/// a `{` that does not open a valid interval becomes `\{`; back-references and `(?` groups are
/// refused.
fn translate_ere(pattern: &str) -> Result<String, &'static str> {
    let bytes = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len() + 4);
    let mut index = 0;
    let mut in_bracket = false;
    while index < bytes.len() {
        let byte = bytes[index];
        if in_bracket {
            // Inside [...] everything is literal except the closing ']' (not first) and [: :].
            if let Some(&opener @ (b':' | b'.' | b'=')) = bytes.get(index + 1).filter(|_| byte == b'[') {
                // `[:name:]`, `[.x.]`, `[=x=]`: up to the opener's character followed by `]`.
                let closing = [opener, b']'];
                let end =
                    bytes[index + 2..].windows(2).position(|pair| pair == closing).map(|offset| index + 2 + offset);
                let end = end.ok_or("unterminated character class")?;
                out.push_str(&pattern[index..end + 2]);
                index = end + 2;
                continue;
            }
            if byte == b']' {
                in_bracket = false;
            } else if byte == b'\\' {
                out.push('\\');
            } else if matches!(byte, b'&' | b'~' | b'-') && bytes.get(index + 1) == Some(&byte) {
                // `&&`, `~~` and `--` are set operators for the regex crate, plain text for ERE.
                out.push('\\');
            }
            let character = pattern[index..].chars().next().unwrap_or(char::REPLACEMENT_CHARACTER);
            out.push(character);
            index += character.len_utf8();
            continue;
        }
        match byte {
            b'[' => {
                in_bracket = true;
                out.push('[');
                index += 1;
                if bytes.get(index) == Some(&b'^') {
                    out.push('^');
                    index += 1;
                }
                if bytes.get(index) == Some(&b']') {
                    out.push_str("\\]");
                    index += 1;
                }
            }
            b'\\' => {
                let Some(next) = pattern[index + 1..].chars().next() else {
                    return Err("pattern ends with a backslash");
                };
                if next.is_ascii_digit() && next != '0' {
                    return Err("back-references (\\1 to \\9) are not supported in product patterns");
                }
                if next.is_ascii_alphanumeric() || next == '<' || next == '>' {
                    out.push('\\');
                    out.push(next);
                } else {
                    // An escaped punctuation (or non-ASCII) character is that character.
                    out.push_str(&regex::escape(&next.to_string()));
                }
                index += 1 + next.len_utf8();
            }
            b'{' => {
                let interval_end = pattern[index..].find('}').map(|offset| index + offset);
                let valid = interval_end.is_some_and(|end| {
                    let inside = &pattern[index + 1..end];
                    let (low, high) = inside.split_once(',').unwrap_or((inside, inside));
                    !low.is_empty()
                        && low.bytes().all(|b| b.is_ascii_digit())
                        && high.bytes().all(|b| b.is_ascii_digit())
                }) && !out.is_empty()
                    && !out.ends_with('(')
                    && !out.ends_with('|');
                match (valid, interval_end) {
                    (true, Some(end)) => {
                        out.push_str(&pattern[index..=end]);
                        index = end + 1;
                    }
                    _ => {
                        out.push_str("\\{");
                        index += 1;
                    }
                }
            }
            b'}' => {
                out.push_str("\\}");
                index += 1;
            }
            b'(' if bytes.get(index + 1) == Some(&b'?') => {
                return Err("'?' after '(' repeats nothing (flag groups such as (?i) are not ERE)");
            }
            _ => {
                let character = pattern[index..].chars().next().unwrap_or(char::REPLACEMENT_CHARACTER);
                if character.is_ascii() {
                    out.push(character);
                } else {
                    out.push_str(&regex::escape(&character.to_string()));
                }
                index += character.len_utf8();
            }
        }
    }
    if in_bracket {
        return Err("unterminated bracket expression '['");
    }
    Ok(out)
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({:?})", self.text)
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Pattern {}

/// One feed + pattern pair of a class (`prod_spec`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProdSpec {
    /// Feeds this spec selects.
    pub feedtype: FeedType,
    /// Pattern on the product identifier.
    pub pattern: Pattern,
}

impl ProdSpec {
    /// A spec from a feedtype and pattern text.
    pub fn new(feedtype: FeedType, pattern: &str) -> Result<Self, PatternError> {
        Ok(Self { feedtype, pattern: Pattern::new(pattern)? })
    }

    /// Whether a product of this feed and ident is selected (feeds overlap and the pattern matches).
    pub fn matches(&self, feedtype: FeedType, ident: &str) -> bool {
        self.feedtype.intersects(feedtype) && self.pattern.is_match(ident)
    }
}

/// A product class (`prod_class`): a time range and the specs, any of which selects a product.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProdClass {
    /// Start of the range of creation times.
    pub from: Timestamp,
    /// End of the range of creation times.
    pub to: Timestamp,
    /// The specs (LDM allows at most [`ProdClass::SPECS_MAX`]).
    pub specs: Vec<ProdSpec>,
}

impl ProdClass {
    /// Most specs a class may carry on the wire (`psa<32>`).
    pub const SPECS_MAX: usize = 32;

    /// Every product of `feedtype` whose identifier matches `pattern`, at any time.
    pub fn new(feedtype: FeedType, pattern: &str) -> Result<Self, PatternError> {
        Ok(Self { from: Timestamp::ZERO, to: Timestamp::END, specs: vec![ProdSpec::new(feedtype, pattern)?] })
    }

    /// The same class restricted to products created in `[from, to]`.
    pub fn between(self, from: Timestamp, to: Timestamp) -> Self {
        Self { from, to, ..self }
    }

    /// Whether `time` is in the class's range; a reversed range (`from > to`) is read reversed,
    /// as LDM's `timeInClass` does.
    pub fn time_matches(&self, time: Timestamp) -> bool {
        let (low, high) = if self.from <= self.to { (self.from, self.to) } else { (self.to, self.from) };
        low <= time && time <= high
    }

    /// Whether any spec selects this feed and identifier (ignoring time).
    pub fn matches_feed_ident(&self, feedtype: FeedType, ident: &str) -> bool {
        self.specs.iter().any(|spec| spec.matches(feedtype, ident))
    }

    /// Whether the product is in the class: its creation time is in range and a spec selects it.
    pub fn matches(&self, info: &ProdInfo) -> bool {
        self.time_matches(info.arrival) && self.matches_feed_ident(info.feedtype, &info.ident)
    }

    /// The union of the specs' feeds.
    pub fn feedtype(&self) -> FeedType {
        self.specs.iter().fold(FeedType::NONE, |all, spec| all | spec.feedtype)
    }
}

/// LDM's printed form: `<from> <to> {{<FEEDTYPE>, "<pattern>"},…}`.
impl fmt::Display for ProdClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {{", self.from, self.to)?;
        for (index, spec) in self.specs.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            write!(f, "{{{}, \"{}\"}}", spec.feedtype, spec.pattern.as_str())?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, ident: &str) -> bool {
        Pattern::new(pattern).unwrap_or_else(|error| panic!("{error}")).is_match(ident)
    }

    /// Found by fuzzing (pqact_conf, ldmd_conf): a `[:`, `[.` or `[=` in a bracket expression
    /// whose closing `:]` is missing or lies past a multi-byte character cut the pattern at a
    /// byte that is not there or not a character boundary (a panic).
    #[test]
    fn an_unterminated_class_in_a_bracket_is_an_error_not_a_panic() {
        for pattern in ["A[(UA2[=)K_B;SBKW9EE]=", "x[[:alpha:", "[[.\u{3e3}", "[[=é", "[[:digit:]ϣ]"] {
            let _ = Pattern::new(pattern);
        }
        assert!(Pattern::new("x[[:alpha:").is_err());
        assert!(matches("^[[:alpha:]_]{2}$", "a_"));
    }

    /// `(?i)`, `(?u)` and `(?:` are the `regex` crate's syntax; glibc's ERE refuses a `?` right
    /// after `(`. The fuzz campaign found `(?u)` host patterns up to 35 times as costly to compile.
    #[test]
    fn a_group_opened_by_a_question_mark_is_refused_as_in_ere() {
        for pattern in ["(?i)kx", "^(?u)[a-z]+$", "a(?:b|c)", "(?-u)x"] {
            let error = Pattern::new(pattern).unwrap_err().to_string();
            assert!(error.contains("repeats nothing"), "{pattern}: {error}");
            assert!(Pattern::new_case_insensitive(pattern).is_err());
        }
        assert!(matches("[(?]", "?"));
        assert!(matches("\\(?x", "x"));
        assert!(matches("(a)?b", "b"));
    }

    #[test]
    fn ere_basics() {
        assert!(matches(".*", "anything"));
        assert!(matches("", "anything"));
        assert!(matches("^YM", "YMCA"));
        assert!(!matches("^YM", "AYM"));
        assert!(matches("KBOU|KFTG", "SDUS53 KFTG 150000"));
        assert!(matches("[[:digit:]]{6}$", "SDUS53 KFTG 150000"));
        assert!(matches("^[A-Z]{4}[0-9]{2} ", "SDUS53 KFTG"));
        assert!(!matches("^[^S]", "SDUS53"));
        assert!(matches("a\\.b", "a.b"));
        assert!(!matches("a\\.b", "axb"));
        assert!(matches("\\<KFTG\\>", "SDUS53 KFTG 150000"));
        assert!(matches("[]x]", "]"));
        assert!(matches("[a&&b]", "&"));
    }

    #[test]
    fn case_sensitivity() {
        assert!(!matches("kftg", "KFTG"));
        assert!(Pattern::new_case_insensitive("^.*\\.unidata\\.ucar\\.edu$").unwrap().is_match("IDD.UNIDATA.UCAR.EDU"));
    }

    #[test]
    fn literal_braces_like_glibc() {
        assert!(matches("a{", "a{"));
        assert!(matches("{x}", "{x}"));
        assert!(matches("a{2}", "aa"));
        assert!(!matches("^a{2}$", "a{2}"));
    }

    #[test]
    fn leading_dot_star_is_stripped_but_kept_for_printing() {
        let pattern = Pattern::new(".*.*KBOU").unwrap();
        assert_eq!(pattern.as_str(), ".*.*KBOU");
        assert!(pattern.is_match("xxKBOU"));
        assert!(Pattern::new(".*").unwrap().matches_everything());
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert!(matches!(Pattern::new("(unclosed"), Err(PatternError::Invalid { .. })));
        assert!(matches!(Pattern::new("[abc"), Err(PatternError::Invalid { .. })));
        assert!(matches!(Pattern::new("(a)\\1"), Err(PatternError::Invalid { .. })));
        assert!(matches!(Pattern::new(&"x".repeat(256)), Err(PatternError::TooLong(256))));
        let error = Pattern::new("(a").unwrap_err().to_string();
        assert!(error.contains("\"(a\""), "{error}");
    }

    #[test]
    fn class_matching_and_printing() {
        let class = ProdClass::new(FeedType::NGRID | FeedType::NEXRAD3, "^Y").unwrap();
        let info = ProdInfo {
            arrival: Timestamp { secs: 1_700_000_000, micros: 0 },
            signature: crate::Signature::md5_of(b"x"),
            origin: "o".into(),
            feedtype: FeedType::NGRID,
            seqno: 0,
            ident: "YMCA".into(),
            size: 1,
        };
        assert!(class.matches(&info));
        assert!(!class.matches(&ProdInfo { feedtype: FeedType::EXP, ..info.clone() }));
        assert!(!class.matches(&ProdInfo { ident: "XY".into(), ..info.clone() }));
        let late = class.clone().between(Timestamp { secs: 1_700_000_001, micros: 0 }, Timestamp::END);
        assert!(!late.matches(&info));
        let reversed = class.clone().between(Timestamp::END, Timestamp { secs: 1_699_999_999, micros: 0 });
        assert!(reversed.matches(&info));
        assert_eq!(
            class.to_string(),
            "TS_ZERO TS_ENDT {{NGRID|NEXRAD3, \"^Y\"}}".replace("NGRID|NEXRAD3", "NEXRAD3|NGRID")
        );
        let mut two = ProdClass::new(FeedType::EXP, ".*").unwrap();
        two.specs.push(ProdSpec::new(FeedType::NONE, "SIG=00").unwrap());
        assert_eq!(two.to_string(), "TS_ZERO TS_ENDT {{EXP, \".*\"},{NONE, \"SIG=00\"}}");
        assert_eq!(two.feedtype(), FeedType::EXP);
    }

    proptest::proptest! {
        /// Escaped literal text always matches itself, whatever characters it holds.
        #[test]
        fn literals_match_themselves(text in "[ -~]{0,40}") {
            let escaped: String = text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, ' ' | '<' | '>') { c.to_string() } else { format!("\\{c}") }).collect();
            let pattern = Pattern::new(&escaped).map_err(|error| proptest::test_runner::TestCaseError::fail(error.to_string()))?;
            proptest::prop_assert!(pattern.is_match(&text));
        }

        /// No input makes the compiler panic.
        #[test]
        fn never_panics(text in "\\PC{0,30}") {
            let _ = Pattern::new(&text);
        }
    }
}
