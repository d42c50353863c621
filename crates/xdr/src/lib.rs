//! XDR (RFC 4506) and ONC RPC record marking (RFC 5531), and the LDM messages of program
//! 300029: version 6 ([`ldm`], ldm6-protocol.md) and version 7, the multicast control plane
//! ([`ldm7`], ldm7-multicast.md §2). Parse and emit, byte-exact against real LDM 6.15 traffic
//! (`tests/integration/captures.rs`, `tests/integration/ldm7.rs`). Bounded lengths; no input makes the decoders panic
//! (`fuzz/`).

pub mod codec;
pub mod ldm;
pub mod ldm7;
pub mod rpc;

/// Why bytes are not a valid LDM message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XdrError {
    /// The record ends inside a field.
    #[error("record ends inside {field}: {needed} bytes needed, {remaining} left")]
    Truncated {
        /// The field.
        field: &'static str,
        /// Bytes it needs.
        needed: usize,
        /// Bytes left.
        remaining: usize,
    },
    /// A field has a value the protocol does not allow.
    #[error("invalid {field}: {value}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// A variable-length field is longer than its bound.
    #[error("{field} of {len} exceeds the limit of {max}")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A string is not text.
    #[error("{field} is not valid text")]
    NotText {
        /// The field.
        field: &'static str,
    },
    /// Padding bytes are not zero.
    #[error("non-zero padding after {field}")]
    NonZeroPadding {
        /// The field.
        field: &'static str,
    },
    /// Bytes follow the message.
    #[error("{extra} unexpected bytes after the {what}")]
    Trailing {
        /// What was decoded.
        what: &'static str,
        /// How many bytes follow.
        extra: usize,
    },
    /// A record exceeds the reader's bound.
    #[error("RPC record of {len} bytes exceeds the limit of {max}")]
    RecordTooLong {
        /// Its length so far.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A successful reply to no call this end made.
    #[error("reply with xid {xid:#010x} to no outstanding call")]
    UnexpectedReply {
        /// Its xid.
        xid: u32,
    },
    /// A call for another program or version.
    #[error("call for program {program} version {version}, which this end does not serve")]
    WrongProgram {
        /// The call's xid.
        xid: u32,
        /// The program.
        program: u32,
        /// The version.
        version: u32,
    },
    /// A procedure the program version does not have.
    #[error("unknown LDM procedure {procedure}")]
    UnknownProcedure {
        /// The call's xid.
        xid: u32,
        /// The number.
        procedure: u32,
    },
}

impl XdrError {
    /// A well-formed call this end does not serve, with the standard RPC answer to it: another
    /// program → PROG_UNAVAIL, another LDM version → PROG_MISMATCH (6..6), an unknown procedure
    /// → PROC_UNAVAIL. The connection can go on, as with Sun RPC.
    pub fn unserved_call(&self) -> Option<(u32, rpc::AcceptStat)> {
        self.unserved_call_versions(6, 6)
    }

    /// [`XdrError::unserved_call`] for an end that serves LDM versions `low..=high` (the
    /// PROG_MISMATCH answer names them).
    pub fn unserved_call_versions(&self, low: u32, high: u32) -> Option<(u32, rpc::AcceptStat)> {
        match *self {
            XdrError::WrongProgram { xid, program, .. } if program != rpc::LDM_PROGRAM => {
                Some((xid, rpc::AcceptStat::ProgUnavail))
            }
            XdrError::WrongProgram { xid, .. } => Some((xid, rpc::AcceptStat::ProgMismatch { low, high })),
            XdrError::UnknownProcedure { xid, .. } => Some((xid, rpc::AcceptStat::ProcUnavail)),
            _ => None,
        }
    }
}
