//! Receiving products as the RPC server of HEREIS, COMINGSOON + BLKDATA and NULLPROC: the
//! downstream after the turn-around, and an upstream that accepted a HIYA push.
//!
//! BLKDATA (ldm6-protocol.md §6.1): bytes are appended in arrival order whatever `pktnum` says,
//! the signature must match the preceding COMINGSOON, a packet larger than what remains is an
//! error, the product is complete when `sz` bytes arrived, and a new COMINGSOON discards an
//! incomplete one.

use ldm7_types::Instant;

use ldm7_types::{ProdInfo, Signature};
use ldm7_xdr::ldm::{LdmCall, LdmErr, ReplyBody};
use ldm7_xdr::rpc::Record;

use crate::SessionError;
use crate::peer::Peer;

/// A product received from the peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedProduct {
    /// Its metadata as sent.
    pub info: ProdInfo,
    /// Its bytes.
    pub data: ReceivedData,
}

/// A received product's bytes where they arrived: in the record, which shares the buffer the
/// socket was read into (a HEREIS's data is never copied by the session).
#[derive(Clone, PartialEq, Eq)]
pub struct ReceivedData(Record);

impl ReceivedData {
    /// Bytes at `range` of `record` (a range outside it is cut to what it holds).
    pub fn in_record(record: &Record, range: std::ops::Range<usize>) -> Self {
        Self(record.slice(range))
    }
}

impl From<Vec<u8>> for ReceivedData {
    fn from(data: Vec<u8>) -> Self {
        Self(Record::from(data))
    }
}

impl std::ops::Deref for ReceivedData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for ReceivedData {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq<Vec<u8>> for ReceivedData {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

impl PartialEq<[u8]> for ReceivedData {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl std::fmt::Debug for ReceivedData {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "ReceivedData({} bytes)", self.len())
    }
}

/// What a received call meant.
#[derive(Debug)]
pub(crate) enum Received {
    /// A whole product.
    Product(ReceivedProduct),
    /// A COMINGSOON the application must answer; it discarded the incomplete product
    /// `abandoned`, if there was one.
    ComingSoon { info: ProdInfo, abandoned: Option<ProdInfo> },
    /// Handled here (NULLPROC answered, nil HEREIS, partial BLKDATA).
    Nothing,
}

#[derive(Debug, Default)]
pub(crate) struct Receive {
    /// The COMINGSOON the application is deciding on, and its xid.
    deciding: Option<(u32, ProdInfo)>,
    /// The product being assembled from BLKDATA.
    assembling: Option<(ProdInfo, Vec<u8>)>,
}

impl Receive {
    /// Handles one call of the data sender.
    pub fn call(&mut self, now: Instant, peer: &mut Peer, xid: u32, call: LdmCall) -> Result<Received, SessionError> {
        match call {
            LdmCall::Nullproc => {
                peer.reply(now, xid, &ReplyBody::Void);
                Ok(Received::Nothing)
            }
            LdmCall::Hereis { info, data } => Ok(Self::hereis(info, data.into())),
            LdmCall::ComingSoon { info, .. } => {
                if self.deciding.is_some() {
                    return Err(SessionError::Protocol("COMINGSOON while the previous one is unanswered".into()));
                }
                let abandoned = self.assembling.take().map(|(info, _)| info);
                self.deciding = Some((xid, info.clone()));
                Ok(Received::ComingSoon { info, abandoned })
            }
            LdmCall::BlkData { signature, data, .. } => self.blkdata(&signature, data),
            other => Err(SessionError::Protocol(format!("unexpected {} from a data sender", other.proc()))),
        }
    }

    /// A HEREIS's product (an all-nil one is a connection flush, ldm6-protocol.md §8).
    pub fn hereis(info: ProdInfo, data: ReceivedData) -> Received {
        if info.size == 0 && info.ident.is_empty() && info.origin.is_empty() {
            return Received::Nothing;
        }
        Received::Product(ReceivedProduct { info, data })
    }

    /// The application's answer to the pending COMINGSOON.
    pub fn answer(&mut self, now: Instant, peer: &mut Peer, accept: bool) -> Result<(), SessionError> {
        let Some((xid, info)) = self.deciding.take() else {
            return Err(SessionError::Usage("no COMINGSOON is waiting for an answer"));
        };
        peer.reply(now, xid, &ReplyBody::ComingSoon(if accept { LdmErr::Ok } else { LdmErr::DontSend }));
        if accept {
            let capacity = info.size as usize;
            self.assembling = Some((info, Vec::with_capacity(capacity)));
        }
        Ok(())
    }

    fn blkdata(&mut self, signature: &Signature, data: Vec<u8>) -> Result<Received, SessionError> {
        let Some((info, bytes)) = self.assembling.as_mut() else {
            return Err(SessionError::Protocol("BLKDATA without an accepted COMINGSOON".into()));
        };
        if info.signature != *signature {
            return Err(SessionError::Protocol(format!("BLKDATA for {signature} while receiving {}", info.signature)));
        }
        let remaining = info.size as usize - bytes.len();
        if data.len() > remaining {
            return Err(SessionError::Protocol(format!(
                "BLKDATA of {} bytes where {remaining} remain of {}",
                data.len(),
                info.ident
            )));
        }
        if bytes.is_empty() && data.len() == info.size as usize {
            // The usual case: the whole product in one packet (no copy).
            let (info, _) = self.assembling.take().expect("checked");
            return Ok(Received::Product(ReceivedProduct { info, data: data.into() }));
        }
        bytes.extend_from_slice(&data);
        if bytes.len() == info.size as usize {
            let (info, data) = self.assembling.take().expect("checked");
            return Ok(Received::Product(ReceivedProduct { info, data: data.into() }));
        }
        Ok(Received::Nothing)
    }
}
