//! Product metadata (`prod_info`, ldm6-protocol.md §4) and its printed form (ldm-formats.md §5).

use std::fmt;

use crate::{FeedType, IDENT_LEN_MAX, ORIGIN_LEN_MAX, Signature, Timestamp};

/// What LDM knows about a product besides its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProdInfo {
    /// Creation ("arrival") time of the product at its origin, with microseconds.
    pub arrival: Timestamp,
    /// The 16-byte signature (MD5) that identifies the product; duplicates share it.
    pub signature: Signature,
    /// Host that created or injected the product (at most [`crate::ORIGIN_LEN_MAX`] bytes).
    pub origin: String,
    /// The product's feedtype (normally one bit).
    pub feedtype: FeedType,
    /// Sequence number chosen by the producer.
    pub seqno: u32,
    /// Product identifier, what patterns match (at most [`crate::IDENT_LEN_MAX`] bytes).
    pub ident: String,
    /// Size of the product's data in bytes.
    pub size: u32,
}

/// Why product metadata is not acceptable to LDM.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidProdInfo {
    /// The origin host name is longer than LDM allows.
    #[error("origin {0:?} is longer than {ORIGIN_LEN_MAX} bytes")]
    OriginTooLong(String),
    /// The ident is longer than LDM allows.
    #[error("product identifier is longer than {IDENT_LEN_MAX} bytes ({0} bytes): shorten it")]
    IdentTooLong(usize),
    /// The ident is empty: LDM requires one.
    #[error("product identifier is empty: give one")]
    IdentEmpty,
}

impl ProdInfo {
    /// Checks the limits LDM enforces on the wire and in the queue.
    pub fn validate(&self) -> Result<(), InvalidProdInfo> {
        if self.origin.len() > ORIGIN_LEN_MAX {
            return Err(InvalidProdInfo::OriginTooLong(self.origin.clone()));
        }
        if self.ident.len() > IDENT_LEN_MAX {
            return Err(InvalidProdInfo::IdentTooLong(self.ident.len()));
        }
        if self.ident.is_empty() {
            return Err(InvalidProdInfo::IdentEmpty);
        }
        Ok(())
    }

    /// The printed line, with the signature in front when `with_signature` (LDM's debug and
    /// `-x` form): `[<sig> ]<size %10u> <time> <FEEDTYPE> <seqno %03u>  <ident>`.
    pub fn line(&self, with_signature: bool) -> String {
        if with_signature { format!("{} {self}", self.signature) } else { self.to_string() }
    }
}

/// LDM's `s_prod_info` line without the signature:
/// `<size %10u> <YYYYMMDDhhmmss.uuuuuu> <FEEDTYPE> <seqno %03u>  <ident>`.
impl fmt::Display for ProdInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:10} {} {} {:03}  {}", self.size, self.arrival, self.feedtype, self.seqno, self.ident)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ProdInfo {
        ProdInfo {
            arrival: Timestamp { secs: 1_700_000_000, micros: 123_456 },
            signature: Signature::md5_of(b"TEST.ident"),
            origin: "host.example.edu".into(),
            feedtype: FeedType::DDS,
            seqno: 42,
            ident: "TEST.ident".into(),
            size: 12,
        }
    }

    #[test]
    fn prints_the_spec_example() {
        assert_eq!(sample().to_string(), "        12 20231114221320.123456 DDS 042  TEST.ident");
        let line = sample().line(true);
        assert_eq!(line, format!("{} {}", Signature::md5_of(b"TEST.ident"), sample()));
        assert_eq!(line.len(), 33 + 52);
    }

    #[test]
    fn wide_fields_are_not_truncated() {
        let info = ProdInfo { size: 4_000_000_000, seqno: 123_456, ..sample() };
        assert_eq!(info.to_string(), "4000000000 20231114221320.123456 DDS 123456  TEST.ident");
    }

    #[test]
    fn validation() {
        assert_eq!(sample().validate(), Ok(()));
        assert_eq!(ProdInfo { ident: String::new(), ..sample() }.validate(), Err(InvalidProdInfo::IdentEmpty));
        assert_eq!(ProdInfo { ident: "x".repeat(256), ..sample() }.validate(), Err(InvalidProdInfo::IdentTooLong(256)));
        assert!(ProdInfo { ident: "x".repeat(255), ..sample() }.validate().is_ok());
        assert!(matches!(
            ProdInfo { origin: "o".repeat(65), ..sample() }.validate(),
            Err(InvalidProdInfo::OriginTooLong(_))
        ));
    }
}
