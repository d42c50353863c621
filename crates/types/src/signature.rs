//! The 16-byte product signature (an MD5 digest chosen by the producer, ldm-formats.md §4).

use std::fmt;
use std::str::FromStr;

use md5::{Digest, Md5};

/// A product's 16-byte signature. Products with equal signatures are duplicates.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Signature(pub [u8; 16]);

impl Signature {
    /// The MD5 digest of `bytes` (what `pqinsert` uses: the file contents, or the ident with `-i`).
    pub fn md5_of(bytes: &[u8]) -> Self {
        Self(Md5::digest(bytes).into())
    }

    /// The raw 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

/// Lower-case hex, 32 characters, as LDM prints signatures.
impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({self})")
    }
}

/// Why a string is not a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid signature {0:?}: expected 32 hexadecimal digits")]
pub struct ParseSignatureError(pub String);

impl FromStr for Signature {
    type Err = ParseSignatureError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || ParseSignatureError(text.to_owned());
        if text.len() != 32 || !text.is_ascii() {
            return Err(error());
        }
        let mut bytes = [0u8; 16];
        for (index, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * index..2 * index + 2], 16).map_err(|_| error())?;
        }
        Ok(Self(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_known_digest() {
        assert_eq!(Signature::md5_of(b"").to_string(), "d41d8cd98f00b204e9800998ecf8427e");
    }

    #[test]
    fn hex_round_trip() {
        let signature = Signature::md5_of(b"TEST.ident");
        assert_eq!(signature.to_string().parse::<Signature>(), Ok(signature));
        assert!("xyz".parse::<Signature>().is_err());
        assert!("zz".repeat(16).parse::<Signature>().is_err());
    }
}
