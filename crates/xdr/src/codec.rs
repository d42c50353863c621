//! XDR primitives (RFC 4506): big-endian 4-byte units, zero padding to a multiple of four,
//! lengths bounded before anything is allocated.

use crate::XdrError;

/// Reads XDR items from a byte slice.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// The offset of the next byte.
    pub fn position(&self) -> usize {
        self.at
    }

    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], XdrError> {
        if self.remaining() < len {
            return Err(XdrError::Truncated { field, needed: len, remaining: self.remaining() });
        }
        let slice = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(slice)
    }

    /// An unsigned 32-bit integer.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, XdrError> {
        let bytes = self.take(4, field)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// A signed 32-bit integer.
    pub fn i32(&mut self, field: &'static str) -> Result<i32, XdrError> {
        self.u32(field).map(|value| value as i32)
    }

    /// A boolean (0 or 1).
    pub fn bool(&mut self, field: &'static str) -> Result<bool, XdrError> {
        match self.u32(field)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(XdrError::Invalid { field, value: value.into() }),
        }
    }

    /// Fixed-length opaque data of `len` bytes (padded).
    pub fn fixed(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], XdrError> {
        let data = self.take(len, field)?;
        self.padding(len, field)?;
        Ok(data)
    }

    /// Variable-length opaque data of at most `max` bytes (length word, bytes, padding).
    pub fn opaque(&mut self, max: usize, field: &'static str) -> Result<&'a [u8], XdrError> {
        let len = self.u32(field)? as usize;
        if len > max {
            return Err(XdrError::TooLong { field, len, max });
        }
        self.fixed(len, field)
    }

    /// A string of at most `max` bytes; it must be UTF-8 (LDM strings are ASCII).
    pub fn string(&mut self, max: usize, field: &'static str) -> Result<String, XdrError> {
        let bytes = self.opaque(max, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| XdrError::NotText { field })
    }

    fn padding(&mut self, len: usize, field: &'static str) -> Result<(), XdrError> {
        let pad = (4 - len % 4) % 4;
        let bytes = self.take(pad, field)?;
        if bytes.iter().any(|byte| *byte != 0) {
            return Err(XdrError::NonZeroPadding { field });
        }
        Ok(())
    }

    /// Fails unless everything was read.
    pub fn finish(&self, what: &'static str) -> Result<(), XdrError> {
        if self.remaining() == 0 { Ok(()) } else { Err(XdrError::Trailing { what, extra: self.remaining() }) }
    }
}

/// Appends XDR items to a byte vector.
#[derive(Debug)]
pub struct Encoder<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Encoder<'a> {
    /// An encoder appending to `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Self { out }
    }

    /// An unsigned 32-bit integer.
    pub fn u32(&mut self, value: u32) {
        self.out.extend_from_slice(&value.to_be_bytes());
    }

    /// A signed 32-bit integer.
    pub fn i32(&mut self, value: i32) {
        self.out.extend_from_slice(&value.to_be_bytes());
    }

    /// A boolean.
    pub fn bool(&mut self, value: bool) {
        self.u32(u32::from(value));
    }

    /// Fixed-length opaque data (padded).
    pub fn fixed(&mut self, data: &[u8]) {
        self.out.extend_from_slice(data);
        self.out.resize(self.out.len() + (4 - data.len() % 4) % 4, 0);
    }

    /// Variable-length opaque data (length word, bytes, padding).
    pub fn opaque(&mut self, data: &[u8]) {
        self.u32(data.len() as u32);
        self.fixed(data);
    }

    /// A string.
    pub fn string(&mut self, text: &str) {
        self.opaque(text.as_bytes());
    }
}
