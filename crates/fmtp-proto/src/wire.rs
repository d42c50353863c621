//! FMTP v3 wire format (ldm7-multicast.md §3.2–§3.7), smoltcp style: [`Packet`] is a checked
//! view over a byte buffer; [`Message`] is the typed, borrowed representation with
//! [`Message::parse`] and [`Message::emit`]/[`Message::emit_to_vec`] into a caller buffer.
//!
//! Invariants:
//! * All integers are big-endian; the header is 12 bytes: `prodindex` u32, `seqnum` u32 (the
//!   byte offset in the product), `payloadlen` u16, `flags` u16 (exactly one message type).
//! * A message occupies `12 + wire payload` bytes, where the wire payload is `payloadlen` for
//!   every type except RETX_REQ, whose `payloadlen` is the number of bytes *wanted* and which
//!   carries no payload (capture `fmtp-ldm7.txt`: a RETX_REQ with payloadlen 1448 is 12 bytes).
//! * Payloads are at most [`PAYLOAD_LEN_MAX`] = 1448 bytes (§3.5, no MAC); BOP metadata at most
//!   [`METADATA_LEN_MAX`] = 1430. The `FMTP_CANON_PDU_SIZE` override of the reference is not
//!   supported.
//! * A datagram is `12 + payloadlen` bytes and its MAC (§3.6); [`Message::parse`] takes the
//!   message without the MAC, which [`crate::mac::Verifier::verify`] checks and strips first (at
//!   level 0 there is none: the datagram must be exactly `12 + payloadlen` bytes). TCP messages
//!   never carry a MAC; [`split_frame`] cuts them out of a byte stream.
//! * Parsing never panics, whatever the input; lengths are bounded before anything is sliced.
//!   Parsing is liberal where the reference is: unused `seqnum` fields of control messages and
//!   bytes after the BOP metadata are ignored; emitting writes them as 0 / nothing, so
//!   re-emission is byte-identical for every message the reference sends.
//!
//! After the receiver's TCP connect, each side first sends one length-prefixed blob (the RSA key
//! exchange of §3.7, performed even at MAC level 0). Running that exchange is the driver's job;
//! [`handshake`] frames the blobs.

use crate::index::ProductIndex;
use crate::time::WallTime;

/// Length of the FMTP header.
pub const HEADER_LEN: usize = 12;
/// Largest payload of a message (1460-byte canonical PDU − 12-byte header, no MAC; §3.5). Every
/// multicast data block but a product's last carries exactly this many bytes.
pub const PAYLOAD_LEN_MAX: usize = 1448;
/// Data block length: block `k` of a product starts at byte offset `k × BLOCK_LEN`.
pub const BLOCK_LEN: usize = PAYLOAD_LEN_MAX;
/// Largest FMTP message (header + largest payload).
pub const MESSAGE_LEN_MAX: usize = HEADER_LEN + PAYLOAD_LEN_MAX;
/// Fixed part of the BOP body: start time (3 × u32), `prodsize` (u32), `metasize` (u16).
pub const BOP_FIXED_LEN: usize = 18;
/// Largest BOP metadata (§3.5).
pub const METADATA_LEN_MAX: usize = PAYLOAD_LEN_MAX - BOP_FIXED_LEN;
/// Largest RETX_REQ length that is a whole number of blocks (45 × 1448 = 65160 ≤ 65535).
pub const REQUEST_LEN_MAX: u16 = (u16::MAX as usize / BLOCK_LEN * BLOCK_LEN) as u16;

/// An FMTP message type: the `flags` field (§3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum MessageType {
    /// Begin of product (multicast).
    Bop = 0x0001,
    /// End of product (multicast).
    Eop = 0x0002,
    /// A data block (multicast).
    MemData = 0x0004,
    /// Retransmission request (receiver → sender).
    RetxReq = 0x0008,
    /// Retransmission rejected: product no longer available (sender → receiver).
    RetxRej = 0x0010,
    /// Product fully received (receiver → sender).
    RetxEnd = 0x0020,
    /// A retransmitted data block (sender → receiver).
    RetxData = 0x0040,
    /// BOP request (receiver → sender).
    BopReq = 0x0080,
    /// Retransmitted BOP (sender → receiver).
    RetxBop = 0x0100,
    /// EOP request (receiver → sender).
    EopReq = 0x0200,
    /// Retransmitted EOP, also sent unsolicited at the sender's deadline (sender → receiver).
    RetxEop = 0x0400,
    // 0x0800 is the ldm7 extension DIGESTS (multicast, MAC level 2): a signed list of datagram
    // digests, taken by the MAC layer before the protocol (`crate::lists::DIGESTS_FLAGS`).
    /// ldm7 extension: the next MAC key, sealed to the receiver's offer (sender → receiver;
    /// `prodindex` carries the key's epoch). Sent only when key rotation is on.
    KeyUpdate = 0x4000,
    /// ldm7 extension: a parity shard of a group of data blocks (multicast; `crate::parity`).
    Parity = 0x1000,
    /// ldm7 extension: a receiver's request for parity shards of a group (TCP; `crate::parity`).
    ParityReq = 0x2000,
    /// ldm7 extension: the receiver holds the key of the epoch in `prodindex` (receiver →
    /// sender).
    KeyAck = 0x8000,
}

impl MessageType {
    /// The type of a `flags` value, if it is exactly one known type.
    pub const fn from_flags(flags: u16) -> Option<Self> {
        Some(match flags {
            0x0001 => Self::Bop,
            0x0002 => Self::Eop,
            0x0004 => Self::MemData,
            0x0008 => Self::RetxReq,
            0x0010 => Self::RetxRej,
            0x0020 => Self::RetxEnd,
            0x0040 => Self::RetxData,
            0x0080 => Self::BopReq,
            0x0100 => Self::RetxBop,
            0x0200 => Self::EopReq,
            0x0400 => Self::RetxEop,
            0x4000 => Self::KeyUpdate,
            0x1000 => Self::Parity,
            0x2000 => Self::ParityReq,
            0x8000 => Self::KeyAck,
            _ => return None,
        })
    }

    /// The `flags` value.
    pub const fn flags(self) -> u16 {
        self as u16
    }

    /// Whether this type carries a payload (BOP body or product bytes).
    pub const fn has_payload(self) -> bool {
        matches!(self, Self::Bop | Self::MemData | Self::RetxData | Self::RetxBop | Self::KeyUpdate | Self::Parity)
    }

    /// Whether the type travels by multicast (BOP, EOP, MEM_DATA, PARITY).
    pub const fn is_multicast(self) -> bool {
        matches!(self, Self::Bop | Self::Eop | Self::MemData | Self::Parity)
    }

    /// Whether `payloadlen` is a parameter and nothing follows the header (RETX_REQ,
    /// PARITY_REQ).
    pub const fn payload_len_is_parameter(self) -> bool {
        matches!(self, Self::RetxReq | Self::ParityReq)
    }
}

/// Why bytes are not a valid FMTP message (or a message cannot be emitted).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Fewer bytes than the header (or the header's payload length) needs.
    #[error("FMTP message truncated: {needed} bytes needed, {available} available")]
    Truncated {
        /// Bytes the message needs.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// More bytes than the header announces (a MAC trailer of a level this end does not use,
    /// or garbage).
    #[error(
        "FMTP datagram is {actual} bytes but its header announces {expected}: a MAC trailer \
         (the sender's FMTP_MAC_LEVEL differs from this end's) or garbage"
    )]
    TrailingBytes {
        /// Bytes the header announces.
        expected: usize,
        /// Bytes present.
        actual: usize,
    },
    /// `flags` is not exactly one known message type.
    #[error("unknown FMTP message type flags {flags:#06x}")]
    UnknownType {
        /// The flags field.
        flags: u16,
    },
    /// A message type that carries no payload announced one.
    #[error("FMTP {message_type:?} must have no payload but announces {payload_len} bytes")]
    UnexpectedPayload {
        /// The type.
        message_type: MessageType,
        /// The announced payload length.
        payload_len: u16,
    },
    /// A payload longer than 1448 bytes.
    #[error("FMTP payload of {payload_len} bytes exceeds the maximum of {PAYLOAD_LEN_MAX}")]
    PayloadTooLong {
        /// The payload length.
        payload_len: usize,
    },
    /// A BOP body shorter than its 18-byte fixed part.
    #[error("FMTP BOP body of {payload_len} bytes is shorter than {BOP_FIXED_LEN}")]
    BopTooShort {
        /// The payload length.
        payload_len: usize,
    },
    /// BOP metadata running past the payload.
    #[error("FMTP BOP metadata of {metadata_len} bytes exceeds the {available} bytes left in the payload")]
    MetadataTruncated {
        /// `metasize`.
        metadata_len: usize,
        /// Payload bytes after the fixed part.
        available: usize,
    },
    /// BOP metadata longer than 1430 bytes (emit).
    #[error("FMTP BOP metadata of {metadata_len} bytes exceeds the maximum of {METADATA_LEN_MAX}")]
    MetadataTooLong {
        /// The metadata length.
        metadata_len: usize,
    },
    /// A data block whose end lies beyond the 32-bit offset space.
    #[error("FMTP data block at offset {offset} with {payload_len} bytes ends beyond 4 GiB")]
    OffsetOverflow {
        /// `seqnum`.
        offset: u32,
        /// Payload length.
        payload_len: usize,
    },
    /// The caller's buffer cannot hold the message (emit).
    #[error("buffer of {available} bytes cannot hold the {needed}-byte FMTP message")]
    BufferTooSmall {
        /// Bytes the message needs.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// A handshake blob longer than the reference accepts (§3.7).
    #[error("FMTP handshake blob of {len} bytes exceeds the maximum of {}", handshake::BLOB_LEN_MAX)]
    BlobTooLong {
        /// The announced length.
        len: usize,
    },
}

/// A view of an FMTP message in a buffer (header fields, payload). Built with
/// [`Packet::new_checked`], every accessor is safe; with [`Packet::new_unchecked`] on a buffer
/// shorter than the header, accessors panic (smoltcp convention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<T> {
    buffer: T,
}

mod field {
    use std::ops::Range;
    pub const INDEX: Range<usize> = 0..4;
    pub const SEQNUM: Range<usize> = 4..8;
    pub const PAYLOAD_LEN: Range<usize> = 8..10;
    pub const FLAGS: Range<usize> = 10..12;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer that holds at least the header and the wire payload it announces (extra
    /// bytes after the message are allowed: see [`Packet::frame_len`]).
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds the header and the announced wire payload.
    pub fn check_len(&self) -> Result<(), Error> {
        let available = self.buffer.as_ref().len();
        if available < HEADER_LEN {
            return Err(Error::Truncated { needed: HEADER_LEN, available });
        }
        let needed = self.frame_len();
        if available < needed {
            return Err(Error::Truncated { needed, available });
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// `prodindex`.
    pub fn index(&self) -> ProductIndex {
        ProductIndex(self.read_u32(field::INDEX))
    }

    /// `seqnum`: the byte offset of the payload in the product (0 when unused).
    pub fn seqnum(&self) -> u32 {
        self.read_u32(field::SEQNUM)
    }

    /// `payloadlen`: payload bytes, or bytes wanted for RETX_REQ.
    pub fn payload_len(&self) -> u16 {
        let bytes = &self.buffer.as_ref()[field::PAYLOAD_LEN];
        u16::from_be_bytes([bytes[0], bytes[1]])
    }

    /// `flags`.
    pub fn flags(&self) -> u16 {
        let bytes = &self.buffer.as_ref()[field::FLAGS];
        u16::from_be_bytes([bytes[0], bytes[1]])
    }

    /// The message type, if `flags` names exactly one.
    pub fn message_type(&self) -> Option<MessageType> {
        MessageType::from_flags(self.flags())
    }

    /// Payload bytes that follow the header on the wire: `payloadlen`, except 0 for RETX_REQ.
    pub fn wire_payload_len(&self) -> usize {
        if self.message_type().is_some_and(MessageType::payload_len_is_parameter) {
            0
        } else {
            usize::from(self.payload_len())
        }
    }

    /// Bytes the whole message occupies: header + wire payload.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.wire_payload_len()
    }

    /// The payload (empty for RETX_REQ).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.frame_len()]
    }

    fn read_u32(&self, range: std::ops::Range<usize>) -> u32 {
        let bytes = &self.buffer.as_ref()[range];
        u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets `prodindex`.
    pub fn set_index(&mut self, index: ProductIndex) {
        self.buffer.as_mut()[field::INDEX].copy_from_slice(&index.0.to_be_bytes());
    }

    /// Sets `seqnum`.
    pub fn set_seqnum(&mut self, seqnum: u32) {
        self.buffer.as_mut()[field::SEQNUM].copy_from_slice(&seqnum.to_be_bytes());
    }

    /// Sets `payloadlen`.
    pub fn set_payload_len(&mut self, payload_len: u16) {
        self.buffer.as_mut()[field::PAYLOAD_LEN].copy_from_slice(&payload_len.to_be_bytes());
    }

    /// Sets `flags`.
    pub fn set_flags(&mut self, flags: u16) {
        self.buffer.as_mut()[field::FLAGS].copy_from_slice(&flags.to_be_bytes());
    }

    /// The payload, mutable (sized by the current header).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.frame_len();
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// The BOP body (§3.4), shared by BOP and RETX_BOP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bop<'a> {
    /// When the sender was handed the product (its real-time clock).
    pub start_time: WallTime,
    /// Product length in bytes.
    pub product_size: u32,
    /// Application metadata (LDM: the 16-byte MD5 signature), at most 1430 bytes.
    pub metadata: &'a [u8],
}

impl<'a> Bop<'a> {
    /// Parses a BOP body; bytes after the metadata are ignored, as the reference does.
    pub fn parse(payload: &'a [u8]) -> Result<Self, Error> {
        if payload.len() < BOP_FIXED_LEN {
            return Err(Error::BopTooShort { payload_len: payload.len() });
        }
        let word = |at: usize| u32::from_be_bytes([payload[at], payload[at + 1], payload[at + 2], payload[at + 3]]);
        let secs = (u64::from(word(0)) << 32) | u64::from(word(4));
        let start_time = WallTime { secs, nanos: word(8) };
        let product_size = word(12);
        let metadata_len = usize::from(u16::from_be_bytes([payload[16], payload[17]]));
        let available = payload.len() - BOP_FIXED_LEN;
        if metadata_len > available {
            return Err(Error::MetadataTruncated { metadata_len, available });
        }
        let metadata = &payload[BOP_FIXED_LEN..BOP_FIXED_LEN + metadata_len];
        Ok(Self { start_time, product_size, metadata })
    }

    /// Length of the emitted body.
    pub const fn buffer_len(&self) -> usize {
        BOP_FIXED_LEN + self.metadata.len()
    }

    /// Writes the body into `out`, which must be exactly [`Bop::buffer_len`] bytes.
    fn emit(&self, out: &mut [u8]) {
        // High and low halves of the 64-bit seconds: truncation is the wire format.
        out[0..4].copy_from_slice(&((self.start_time.secs >> 32) as u32).to_be_bytes());
        out[4..8].copy_from_slice(&(self.start_time.secs as u32).to_be_bytes());
        out[8..12].copy_from_slice(&self.start_time.nanos.to_be_bytes());
        out[12..16].copy_from_slice(&self.product_size.to_be_bytes());
        // metadata ≤ METADATA_LEN_MAX < u16::MAX, checked by Message::check_emit.
        out[16..18].copy_from_slice(&(self.metadata.len() as u16).to_be_bytes());
        out[BOP_FIXED_LEN..].copy_from_slice(self.metadata);
    }
}

/// What a message says, by type (§3.3). Fields that are unused for a type are not represented.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Body<'a> {
    /// BOP (multicast).
    Bop(Bop<'a>),
    /// EOP (multicast).
    Eop,
    /// A multicast data block: product bytes `[offset, offset + data.len())`.
    MemData {
        /// Byte offset in the product.
        offset: u32,
        /// The bytes.
        data: &'a [u8],
    },
    /// Request for product bytes `[offset, offset + len)`; the reference sender serves
    /// `[offset rounded down to 1448, min(size, offset + len))` (§3.8).
    RetxReq {
        /// Start offset.
        offset: u32,
        /// Bytes wanted (the header's `payloadlen`; nothing follows on the wire).
        len: u16,
    },
    /// Retransmission rejected (product no longer available).
    RetxRej,
    /// The receiver is done with the product.
    RetxEnd,
    /// A retransmitted data block.
    RetxData {
        /// Byte offset in the product.
        offset: u32,
        /// The bytes.
        data: &'a [u8],
    },
    /// BOP request.
    BopReq,
    /// Retransmitted BOP.
    RetxBop(Bop<'a>),
    /// EOP request.
    EopReq,
    /// Retransmitted (or deadline) EOP.
    RetxEop,
    /// ldm7 extension: the next MAC key sealed to the receiver (`crate::mac::OfferKey::seal_update`);
    /// the message's index is the key's epoch.
    KeyUpdate {
        /// The sealed key.
        sealed: &'a [u8],
    },
    /// ldm7 extension: the receiver holds the key of the epoch in the message's index.
    KeyAck,
    /// ldm7 extension: parity shard `shard` of data block group `group`, coded with groups of
    /// up to 2^`group_blocks_log2` blocks and 2^`shards_log2` shards (`crate::parity`).
    Parity {
        /// The group.
        group: u16,
        /// ⌈log₂⌉ of the group size the sender codes with.
        group_blocks_log2: u8,
        /// log₂ of the shard count the sender codes with.
        shards_log2: u8,
        /// The shard's index.
        shard: u8,
        /// The shard.
        data: &'a [u8],
    },
    /// ldm7 extension: `need` more parity shards of group `group`, of index `from` or above
    /// (`crate::parity`).
    ParityReq {
        /// The group.
        group: u16,
        /// Shards still needed.
        need: u16,
        /// The lowest shard index the receiver may still use.
        from: u16,
    },
}

/// A typed FMTP message, borrowing payload bytes from the buffer it was parsed from (or from
/// the product it describes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Message<'a> {
    /// The product the message is about.
    pub index: ProductIndex,
    /// The type-specific content.
    pub body: Body<'a>,
}

impl<'a> Message<'a> {
    /// Parses one whole message: `bytes` must be exactly header + wire payload (the datagram
    /// rule of §3.6 with no MAC, and what [`split_frame`] yields from a TCP stream).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        let packet = Packet::new_checked(bytes)?;
        if bytes.len() != packet.frame_len() {
            return Err(Error::TrailingBytes { expected: packet.frame_len(), actual: bytes.len() });
        }
        Self::parse_packet(&packet)
    }

    /// Parses the message at the start of a checked packet (bytes after it are not looked at).
    pub fn parse_packet(packet: &Packet<&'a [u8]>) -> Result<Self, Error> {
        let flags = packet.flags();
        let message_type = MessageType::from_flags(flags).ok_or(Error::UnknownType { flags })?;
        let buffer: &'a [u8] = packet.buffer;
        let payload = &buffer[HEADER_LEN..packet.frame_len()];
        let index = packet.index();
        let offset = packet.seqnum();
        if !message_type.has_payload() && !payload.is_empty() {
            return Err(Error::UnexpectedPayload { message_type, payload_len: packet.payload_len() });
        }
        if payload.len() > PAYLOAD_LEN_MAX {
            return Err(Error::PayloadTooLong { payload_len: payload.len() });
        }
        let data_end_fits = || {
            if u64::from(offset) + payload.len() as u64 > u64::from(u32::MAX) {
                Err(Error::OffsetOverflow { offset, payload_len: payload.len() })
            } else {
                Ok(())
            }
        };
        let body = match message_type {
            MessageType::Bop => Body::Bop(Bop::parse(payload)?),
            MessageType::Eop => Body::Eop,
            MessageType::MemData => {
                data_end_fits()?;
                Body::MemData { offset, data: payload }
            }
            MessageType::RetxReq => Body::RetxReq { offset, len: packet.payload_len() },
            MessageType::RetxRej => Body::RetxRej,
            MessageType::RetxEnd => Body::RetxEnd,
            MessageType::RetxData => {
                data_end_fits()?;
                Body::RetxData { offset, data: payload }
            }
            MessageType::BopReq => Body::BopReq,
            MessageType::RetxBop => Body::RetxBop(Bop::parse(payload)?),
            MessageType::EopReq => Body::EopReq,
            MessageType::RetxEop => Body::RetxEop,
            MessageType::KeyUpdate => Body::KeyUpdate { sealed: payload },
            MessageType::KeyAck => Body::KeyAck,
            MessageType::Parity => Body::Parity {
                // The seqnum's fields (crate::parity): truncations are the layout.
                group: (offset >> 16) as u16,
                group_blocks_log2: ((offset >> 12) & 0xf) as u8,
                shards_log2: ((offset >> 8) & 0xf) as u8,
                shard: offset as u8,
                data: payload,
            },
            MessageType::ParityReq => {
                Body::ParityReq { group: (offset >> 16) as u16, need: offset as u16, from: packet.payload_len() }
            }
        };
        Ok(Self { index, body })
    }

    /// The message type.
    pub const fn message_type(&self) -> MessageType {
        match self.body {
            Body::Bop(_) => MessageType::Bop,
            Body::Eop => MessageType::Eop,
            Body::MemData { .. } => MessageType::MemData,
            Body::RetxReq { .. } => MessageType::RetxReq,
            Body::RetxRej => MessageType::RetxRej,
            Body::RetxEnd => MessageType::RetxEnd,
            Body::RetxData { .. } => MessageType::RetxData,
            Body::BopReq => MessageType::BopReq,
            Body::RetxBop(_) => MessageType::RetxBop,
            Body::EopReq => MessageType::EopReq,
            Body::RetxEop => MessageType::RetxEop,
            Body::KeyUpdate { .. } => MessageType::KeyUpdate,
            Body::KeyAck => MessageType::KeyAck,
            Body::Parity { .. } => MessageType::Parity,
            Body::ParityReq { .. } => MessageType::ParityReq,
        }
    }

    /// Bytes the emitted message occupies.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.wire_payload_len()
    }

    /// Writes the message at the start of `out`; returns its length.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, Error> {
        self.check_emit()?;
        let needed = self.buffer_len();
        let available = out.len();
        let Some(out) = out.get_mut(..needed) else {
            return Err(Error::BufferTooSmall { needed, available });
        };
        let (seqnum, payload_len) = match self.body {
            Body::MemData { offset, data } | Body::RetxData { offset, data } => (offset, data.len()),
            Body::RetxReq { offset, len } => (offset, usize::from(len)),
            Body::Bop(bop) | Body::RetxBop(bop) => (0, bop.buffer_len()),
            Body::KeyUpdate { sealed } => (0, sealed.len()),
            Body::Parity { group, group_blocks_log2, shards_log2, shard, data } => (
                (u32::from(group) << 16)
                    | (u32::from(group_blocks_log2 & 0xf) << 12)
                    | (u32::from(shards_log2 & 0xf) << 8)
                    | u32::from(shard),
                data.len(),
            ),
            Body::ParityReq { group, need, from } => ((u32::from(group) << 16) | u32::from(need), usize::from(from)),
            _ => (0, 0),
        };
        let mut packet = Packet::new_unchecked(&mut *out);
        packet.set_index(self.index);
        packet.set_seqnum(seqnum);
        // payload_len ≤ 65535 by the type of RetxReq::len and check_emit for payloads.
        packet.set_payload_len(payload_len as u16);
        packet.set_flags(self.message_type().flags());
        match self.body {
            Body::MemData { data, .. }
            | Body::RetxData { data, .. }
            | Body::KeyUpdate { sealed: data }
            | Body::Parity { data, .. } => {
                out[HEADER_LEN..].copy_from_slice(data);
            }
            Body::Bop(bop) | Body::RetxBop(bop) => bop.emit(&mut out[HEADER_LEN..]),
            _ => {}
        }
        Ok(needed)
    }

    /// Appends the message to `out`; returns its length.
    pub fn emit_to_vec(&self, out: &mut Vec<u8>) -> Result<usize, Error> {
        self.check_emit()?;
        let start = out.len();
        out.resize(start + self.buffer_len(), 0);
        self.emit(&mut out[start..])
    }

    /// The message as a new vector (convenience for tests and tools).
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(self.buffer_len());
        self.emit_to_vec(&mut out)?;
        Ok(out)
    }

    const fn wire_payload_len(&self) -> usize {
        match self.body {
            Body::MemData { data, .. }
            | Body::RetxData { data, .. }
            | Body::KeyUpdate { sealed: data }
            | Body::Parity { data, .. } => data.len(),
            Body::Bop(bop) | Body::RetxBop(bop) => bop.buffer_len(),
            _ => 0,
        }
    }

    fn check_emit(&self) -> Result<(), Error> {
        match self.body {
            Body::Bop(bop) | Body::RetxBop(bop) if bop.metadata.len() > METADATA_LEN_MAX => {
                Err(Error::MetadataTooLong { metadata_len: bop.metadata.len() })
            }
            Body::MemData { offset, data } | Body::RetxData { offset, data } => {
                if data.len() > PAYLOAD_LEN_MAX {
                    Err(Error::PayloadTooLong { payload_len: data.len() })
                } else if u64::from(offset) + data.len() as u64 > u64::from(u32::MAX) {
                    Err(Error::OffsetOverflow { offset, payload_len: data.len() })
                } else {
                    Ok(())
                }
            }
            Body::KeyUpdate { sealed: data } | Body::Parity { data, .. } if data.len() > PAYLOAD_LEN_MAX => {
                Err(Error::PayloadTooLong { payload_len: data.len() })
            }
            _ => Ok(()),
        }
    }
}

/// The result of looking for one message at the start of a TCP byte stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split<'a> {
    /// A whole message (pass it to [`Message::parse`]) and the bytes after it.
    Frame {
        /// The message bytes.
        frame: &'a [u8],
        /// The rest of the stream buffer.
        rest: &'a [u8],
    },
    /// The buffer holds only part of a message: read at least `needed` more bytes.
    Incomplete {
        /// Bytes still missing for the next message (a lower bound while the header is
        /// incomplete, exact once it is complete).
        needed: usize,
    },
}

/// Cuts the next message out of a TCP byte stream: header + wire payload (see the module
/// invariants for RETX_REQ). Unknown types are framed by `payloadlen` too; [`Message::parse`]
/// then reports them. A wire payload above 1448 bytes is an error: the stream cannot be FMTP v3
/// without MAC, and the driver should close the connection.
pub fn split_frame(stream: &[u8]) -> Result<Split<'_>, Error> {
    if stream.len() < HEADER_LEN {
        return Ok(Split::Incomplete { needed: HEADER_LEN - stream.len() });
    }
    let packet = Packet::new_unchecked(stream);
    let payload_len = packet.wire_payload_len();
    if payload_len > PAYLOAD_LEN_MAX {
        return Err(Error::PayloadTooLong { payload_len });
    }
    let len = packet.frame_len();
    if stream.len() < len {
        return Ok(Split::Incomplete { needed: len - stream.len() });
    }
    let (frame, rest) = stream.split_at(len);
    Ok(Split::Frame { frame, rest })
}

/// Framing of the key-exchange blobs that open each FMTP TCP connection (§3.7): a big-endian
/// u32 length, then that many bytes (receiver: PEM RSA public key; sender: RSA-OAEP ciphertext
/// of the MAC key, 256 bytes even at MAC level 0). Producing and checking the blobs (RSA) is the
/// driver's concern.
pub mod handshake {
    use super::{Error, Split};

    /// Length of the length prefix.
    pub const PREFIX_LEN: usize = 4;
    /// Largest blob the reference accepts.
    pub const BLOB_LEN_MAX: usize = 65504;

    /// Cuts the next length-prefixed blob out of a stream. On success the frame is the blob
    /// *without* its prefix.
    pub fn split_blob(stream: &[u8]) -> Result<Split<'_>, Error> {
        let Some(prefix) = stream.get(..PREFIX_LEN) else {
            return Ok(Split::Incomplete { needed: PREFIX_LEN - stream.len() });
        };
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len > BLOB_LEN_MAX {
            return Err(Error::BlobTooLong { len });
        }
        let body = &stream[PREFIX_LEN..];
        if body.len() < len {
            return Ok(Split::Incomplete { needed: len - body.len() });
        }
        let (frame, rest) = body.split_at(len);
        Ok(Split::Frame { frame, rest })
    }

    /// Appends a length-prefixed blob to `out`.
    pub fn emit_blob(blob: &[u8], out: &mut Vec<u8>) -> Result<usize, Error> {
        if blob.len() > BLOB_LEN_MAX {
            return Err(Error::BlobTooLong { len: blob.len() });
        }
        // blob.len() ≤ BLOB_LEN_MAX < u32::MAX.
        out.extend_from_slice(&(blob.len() as u32).to_be_bytes());
        out.extend_from_slice(blob);
        Ok(PREFIX_LEN + blob.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_len_max_is_whole_blocks() {
        assert_eq!(REQUEST_LEN_MAX, 65160);
        assert_eq!(usize::from(REQUEST_LEN_MAX) % BLOCK_LEN, 0);
        assert_eq!(METADATA_LEN_MAX, 1430);
    }

    #[test]
    fn retx_req_has_no_wire_payload() {
        let message = Message { index: ProductIndex(7), body: Body::RetxReq { offset: 2896, len: 1448 } };
        let bytes = message.to_vec().unwrap();
        assert_eq!(bytes, [0, 0, 0, 7, 0, 0, 0x0b, 0x50, 0x05, 0xa8, 0, 8]);
        assert_eq!(Message::parse(&bytes).unwrap(), message);
    }

    #[test]
    fn rejects_bad_input_with_specific_errors() {
        assert_eq!(Message::parse(&[0; 5]), Err(Error::Truncated { needed: 12, available: 5 }));
        let eop_with_payload = [0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 2, 9];
        assert!(matches!(Message::parse(&eop_with_payload), Err(Error::UnexpectedPayload { .. })));
        let two_flags = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3];
        assert_eq!(Message::parse(&two_flags), Err(Error::UnknownType { flags: 3 }));
        let eop_trailing = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0];
        assert_eq!(Message::parse(&eop_trailing), Err(Error::TrailingBytes { expected: 12, actual: 13 }));
        let short_bop = [0, 0, 0, 1, 0, 0, 0, 0, 0, 2, 0, 1, 0, 0];
        assert_eq!(Message::parse(&short_bop), Err(Error::BopTooShort { payload_len: 2 }));
        let mut bop = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 18, 0, 1];
        bop.extend_from_slice(&[0; 16]);
        bop.extend_from_slice(&[0, 1]);
        assert_eq!(Message::parse(&bop), Err(Error::MetadataTruncated { metadata_len: 1, available: 0 }));
        let mut data = vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 2, 0, 4];
        data.extend_from_slice(&[1, 2]);
        assert!(matches!(Message::parse(&data), Err(Error::OffsetOverflow { .. })));
        let mut long = vec![0, 0, 0, 1, 0, 0, 0, 0, 0x05, 0xa9, 0, 4];
        long.resize(12 + 1449, 0);
        assert_eq!(Message::parse(&long), Err(Error::PayloadTooLong { payload_len: 1449 }));
    }

    #[test]
    fn emit_checks_bounds() {
        let metadata = [0u8; METADATA_LEN_MAX + 1];
        let bop = Bop { start_time: WallTime::UNIX_EPOCH, product_size: 0, metadata: &metadata };
        let message = Message { index: ProductIndex(0), body: Body::Bop(bop) };
        assert_eq!(message.to_vec(), Err(Error::MetadataTooLong { metadata_len: 1431 }));
        let eop = Message { index: ProductIndex(0), body: Body::Eop };
        assert_eq!(eop.emit(&mut [0; 11]), Err(Error::BufferTooSmall { needed: 12, available: 11 }));
    }

    #[test]
    fn split_frame_reports_missing_bytes() {
        let data = Message { index: ProductIndex(1), body: Body::RetxData { offset: 0, data: &[7; 10] } };
        let mut stream = data.to_vec().unwrap();
        stream.extend_from_slice(&[0, 0]);
        assert_eq!(split_frame(&stream[..5]), Ok(Split::Incomplete { needed: 7 }));
        assert_eq!(split_frame(&stream[..15]), Ok(Split::Incomplete { needed: 7 }));
        assert_eq!(split_frame(&stream), Ok(Split::Frame { frame: &stream[..22], rest: &[0, 0] }));
        let oversized = [0, 0, 0, 1, 0, 0, 0, 0, 0xff, 0xff, 0, 0x40];
        assert_eq!(split_frame(&oversized), Err(Error::PayloadTooLong { payload_len: 65535 }));
    }

    #[test]
    fn handshake_blobs_frame() {
        let mut out = Vec::new();
        handshake::emit_blob(b"key", &mut out).unwrap();
        assert_eq!(out, [0, 0, 0, 3, b'k', b'e', b'y']);
        assert_eq!(handshake::split_blob(&out[..2]), Ok(Split::Incomplete { needed: 2 }));
        assert_eq!(handshake::split_blob(&out[..5]), Ok(Split::Incomplete { needed: 2 }));
        assert_eq!(handshake::split_blob(&out), Ok(Split::Frame { frame: b"key", rest: &[] }));
        assert_eq!(handshake::split_blob(&[0, 1, 0, 0]), Err(Error::BlobTooLong { len: 65536 }));
    }

    fn arb_bop() -> impl Strategy<Value = (u64, u32, u32, Vec<u8>)> {
        (any::<u64>(), any::<u32>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..=METADATA_LEN_MAX))
    }

    proptest! {
        #[test]
        fn every_type_round_trips(
            index: u32, offset in 0u32..u32::MAX - 2000, len: u16, kind in 0usize..11,
            data in proptest::collection::vec(any::<u8>(), 0..=PAYLOAD_LEN_MAX), bop in arb_bop(),
        ) {
            let (secs, nanos, product_size, metadata) = bop;
            let bop = Bop { start_time: WallTime { secs, nanos }, product_size, metadata: &metadata };
            let body = match kind {
                0 => Body::Bop(bop),
                1 => Body::Eop,
                2 => Body::MemData { offset, data: &data },
                3 => Body::RetxReq { offset, len },
                4 => Body::RetxRej,
                5 => Body::RetxEnd,
                6 => Body::RetxData { offset, data: &data },
                7 => Body::BopReq,
                8 => Body::RetxBop(bop),
                9 => Body::EopReq,
                _ => Body::RetxEop,
            };
            let message = Message { index: ProductIndex(index), body };
            let bytes = message.to_vec().unwrap();
            prop_assert_eq!(bytes.len(), message.buffer_len());
            prop_assert_eq!(Message::parse(&bytes).unwrap(), message);
            let split = split_frame(&bytes).unwrap();
            prop_assert_eq!(split, Split::Frame { frame: &bytes[..], rest: &[] });
        }

        #[test]
        fn parse_never_panics_and_reparses(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
            if let Ok(message) = Message::parse(&bytes) {
                let again = message.to_vec().unwrap();
                prop_assert_eq!(Message::parse(&again).unwrap(), message);
            }
            let _ = split_frame(&bytes);
            let _ = handshake::split_blob(&bytes);
        }

        #[test]
        fn parse_never_panics_on_plausible_headers(
            index: u32, seqnum: u32, payload_len in 0u16..1500, flag_bit in 0u32..16, tail in proptest::collection::vec(any::<u8>(), 0..1500),
        ) {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&index.to_be_bytes());
            bytes.extend_from_slice(&seqnum.to_be_bytes());
            bytes.extend_from_slice(&payload_len.to_be_bytes());
            bytes.extend_from_slice(&(1u16 << flag_bit).to_be_bytes());
            bytes.extend_from_slice(&tail);
            if let Ok(message) = Message::parse(&bytes) {
                prop_assert_eq!(message.index, ProductIndex(index));
                let again = message.to_vec().unwrap();
                prop_assert_eq!(Message::parse(&again).unwrap(), message);
            }
        }
    }
}
