//! LDM-6 messages (ldm6-protocol.md §3–§5): every type and procedure of program 300029
//! version 6, with LDM's quirks:
//!
//! * pointer fields (`feedpar.prod_class`, `comingsoon_args.infop`, `datapkt.signaturep`, the
//!   reply arms) carry **no** presence word: `ldm.x` maps `xdr_pointer` to `xdr_reference`;
//! * `timestampt` is two signed 32-bit words (seconds, microseconds);
//! * `signaturet` is 16 bytes without a length;
//! * `product` is `prod_info` followed by exactly `sz` data bytes **without** a length word,
//!   padded to four bytes;
//! * strings are bounded: origin 64, ident 255, pattern 255; a class has at most 32 specs.
//!
//! Patterns stay strings here ([`WireSpec`]): whether they compile is the session's business
//! (a FEEDME with a bad one is answered BADPATTERN, not dropped as malformed).

use std::fmt;

use ldm7_types::{FeedType, IDENT_LEN_MAX, ORIGIN_LEN_MAX, PATTERN_LEN_MAX, ProdClass, ProdInfo, Signature, Timestamp};

use crate::XdrError;
use crate::codec::{Decoder, Encoder};
pub use crate::rpc::{AcceptStat, AuthStat};
use crate::rpc::{
    CallHeader, Header, LDM_PROGRAM, ReplyHeader, decode_header, encode_call_header, encode_reply_header,
    finish_record, start_record,
};

/// Most specs in a product class (`PSA_MAX`).
pub const SPECS_MAX: usize = ProdClass::SPECS_MAX;
/// Largest BLKDATA packet accepted.
pub const DBUF_MAX: usize = 256 << 20;

/// A product spec as sent: feedtype and the pattern text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireSpec {
    /// Feedtype mask.
    pub feedtype: FeedType,
    /// The ERE, uncompiled.
    pub pattern: String,
}

/// A product class as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireClass {
    /// Start of the creation-time range.
    pub from: Timestamp,
    /// End of the range.
    pub to: Timestamp,
    /// The specs.
    pub specs: Vec<WireSpec>,
}

/// LDM-6 procedures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proc {
    /// 0: keep-alive and flush (synchronous).
    Nullproc,
    /// 1: a product (one-way).
    Hereis,
    /// 4: request a feed (synchronous).
    Feedme,
    /// 5: offer a push (synchronous).
    Hiya,
    /// 8: a product's metadata (one-way).
    Notification,
    /// 9: request notifications (synchronous).
    Notifyme,
    /// 12: announce a product (synchronous).
    ComingSoon,
    /// 13: a product's data (one-way).
    BlkData,
    /// 14: ask whether an upstream process lives (synchronous).
    IsAlive,
}

impl Proc {
    /// The procedure number.
    pub const fn number(self) -> u32 {
        match self {
            Self::Nullproc => 0,
            Self::Hereis => 1,
            Self::Feedme => 4,
            Self::Hiya => 5,
            Self::Notification => 8,
            Self::Notifyme => 9,
            Self::ComingSoon => 12,
            Self::BlkData => 13,
            Self::IsAlive => 14,
        }
    }

    /// The procedure with this number.
    pub const fn from_number(number: u32) -> Option<Self> {
        Some(match number {
            0 => Self::Nullproc,
            1 => Self::Hereis,
            4 => Self::Feedme,
            5 => Self::Hiya,
            8 => Self::Notification,
            9 => Self::Notifyme,
            12 => Self::ComingSoon,
            13 => Self::BlkData,
            14 => Self::IsAlive,
            _ => return None,
        })
    }

    /// Whether the caller waits for a reply (HEREIS, NOTIFICATION and BLKDATA get none).
    pub const fn has_reply(self) -> bool {
        !matches!(self, Self::Hereis | Self::Notification | Self::BlkData)
    }
}

impl fmt::Display for Proc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nullproc => "NULLPROC",
            Self::Hereis => "HEREIS",
            Self::Feedme => "FEEDME",
            Self::Hiya => "HIYA",
            Self::Notification => "NOTIFICATION",
            Self::Notifyme => "NOTIFYME",
            Self::ComingSoon => "COMINGSOON",
            Self::BlkData => "BLKDATA",
            Self::IsAlive => "IS_ALIVE",
        })
    }
}

/// A call's procedure and arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LdmCall {
    /// NULLPROC.
    Nullproc,
    /// HEREIS(product).
    Hereis {
        /// Metadata.
        info: ProdInfo,
        /// Exactly `info.size` bytes.
        data: Vec<u8>,
    },
    /// FEEDME(feedpar).
    Feedme {
        /// The requested class.
        class: WireClass,
        /// `0xFFFFFFFF`: primary (HEREIS); 0: alternate (COMINGSOON + BLKDATA).
        max_hereis: u32,
    },
    /// HIYA(prod_class).
    Hiya(WireClass),
    /// NOTIFICATION(prod_info).
    Notification(ProdInfo),
    /// NOTIFYME(prod_class).
    Notifyme(WireClass),
    /// COMINGSOON(comingsoon_args).
    ComingSoon {
        /// Metadata.
        info: ProdInfo,
        /// Packet size (the reference: the whole product).
        pktsz: u32,
    },
    /// BLKDATA(datapkt).
    BlkData {
        /// The product's signature.
        signature: Signature,
        /// Packet number (the reference sends 0 and ignores it).
        pktnum: u32,
        /// The bytes.
        data: Vec<u8>,
    },
    /// IS_ALIVE(id).
    IsAlive(u32),
}

impl LdmCall {
    /// Its procedure.
    pub fn proc(&self) -> Proc {
        match self {
            Self::Nullproc => Proc::Nullproc,
            Self::Hereis { .. } => Proc::Hereis,
            Self::Feedme { .. } => Proc::Feedme,
            Self::Hiya(_) => Proc::Hiya,
            Self::Notification(_) => Proc::Notification,
            Self::Notifyme(_) => Proc::Notifyme,
            Self::ComingSoon { .. } => Proc::ComingSoon,
            Self::BlkData { .. } => Proc::BlkData,
            Self::IsAlive(_) => Proc::IsAlive,
        }
    }
}

/// A call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Transaction id.
    pub xid: u32,
    /// Program version (6).
    pub version: u32,
    /// Procedure and arguments.
    pub call: LdmCall,
}

/// `ldm_errt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LdmErr {
    /// 0.
    Ok,
    /// 1.
    ShuttingDown,
    /// 2.
    BadPattern,
    /// 3.
    DontSend,
    /// 4 (LDM-5).
    Resend,
    /// 5 (LDM-5).
    Restart,
    /// 6 (LDM-5).
    Redirect,
    /// 7.
    Reclass,
}

impl LdmErr {
    fn decode(value: u32) -> Result<Self, XdrError> {
        Ok(match value {
            0 => Self::Ok,
            1 => Self::ShuttingDown,
            2 => Self::BadPattern,
            3 => Self::DontSend,
            4 => Self::Resend,
            5 => Self::Restart,
            6 => Self::Redirect,
            7 => Self::Reclass,
            other => return Err(XdrError::Invalid { field: "ldm_errt", value: other.into() }),
        })
    }

    const fn code(self) -> u32 {
        self as u32
    }
}

/// `fornme_reply_t`: the result of FEEDME and NOTIFYME.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FornmeReply {
    /// OK with the upstream's id (its process id).
    Ok(u32),
    /// A pattern did not compile.
    BadPattern,
    /// Only this class is allowed.
    Reclass(WireClass),
}

/// `hiya_reply_t`: the result of HIYA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HiyaReply {
    /// Send; products up to `max_hereis` bytes by HEREIS.
    Ok(u32),
    /// Send nothing.
    DontSend,
    /// Send only this class.
    Reclass {
        /// The accepted class.
        class: WireClass,
        /// Products up to this size by HEREIS.
        max_hereis: u32,
    },
}

/// What a reply says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyBody {
    /// Success, no result (NULLPROC).
    Void,
    /// FEEDME / NOTIFYME result.
    Fornme(FornmeReply),
    /// HIYA result.
    Hiya(HiyaReply),
    /// COMINGSOON result (OK or DONT_SEND).
    ComingSoon(LdmErr),
    /// IS_ALIVE result.
    IsAlive(bool),
    /// Accepted but not executed (PROC_UNAVAIL, SYSTEM_ERR, …).
    Error(AcceptStat),
    /// MSG_DENIED, AUTH_ERROR.
    Denied(AuthStat),
    /// MSG_DENIED, RPC_MISMATCH.
    RpcMismatch {
        /// Lowest supported.
        low: u32,
        /// Highest supported.
        high: u32,
    },
}

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The call's xid.
    pub xid: u32,
    /// What it says.
    pub body: ReplyBody,
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A call.
    Call(Call),
    /// A reply.
    Reply(Reply),
}

// ---------------------------------------------------------------------------------------------
// Decoding.

/// Decodes one record. A successful reply's result can only be typed by the procedure it
/// answers: `reply_proc(xid)` gives it (`None`: [`XdrError::UnexpectedReply`]).
pub fn decode_message(record: &[u8], reply_proc: impl Fn(u32) -> Option<Proc>) -> Result<Message, XdrError> {
    let mut decoder = Decoder::new(record);
    match decode_header(&mut decoder)? {
        Header::Call(header) => {
            if header.program != LDM_PROGRAM || header.version != 6 {
                return Err(XdrError::WrongProgram {
                    xid: header.xid,
                    program: header.program,
                    version: header.version,
                });
            }
            let proc = Proc::from_number(header.procedure)
                .ok_or(XdrError::UnknownProcedure { xid: header.xid, procedure: header.procedure })?;
            let call = decode_call(&mut decoder, proc)?;
            decoder.finish("call")?;
            Ok(Message::Call(Call { xid: header.xid, version: header.version, call }))
        }
        Header::Reply { xid, header } => {
            let body = match header {
                ReplyHeader::Accepted(AcceptStat::Success) => {
                    let proc = reply_proc(xid).ok_or(XdrError::UnexpectedReply { xid })?;
                    decode_result(&mut decoder, proc)?
                }
                ReplyHeader::Accepted(stat) => ReplyBody::Error(stat),
                ReplyHeader::AuthError(stat) => ReplyBody::Denied(stat),
                ReplyHeader::RpcMismatch { low, high } => ReplyBody::RpcMismatch { low, high },
            };
            decoder.finish("reply")?;
            Ok(Message::Reply(Reply { xid, body }))
        }
    }
}

fn decode_call(decoder: &mut Decoder<'_>, proc: Proc) -> Result<LdmCall, XdrError> {
    Ok(match proc {
        Proc::Nullproc => LdmCall::Nullproc,
        Proc::Hereis => {
            let info = decode_prod_info(decoder)?;
            let data = decoder.fixed(info.size as usize, "product data")?.to_vec();
            LdmCall::Hereis { info, data }
        }
        Proc::Feedme => {
            let class = decode_class(decoder)?;
            LdmCall::Feedme { class, max_hereis: decoder.u32("max_hereis")? }
        }
        Proc::Hiya => LdmCall::Hiya(decode_class(decoder)?),
        Proc::Notification => LdmCall::Notification(decode_prod_info(decoder)?),
        Proc::Notifyme => LdmCall::Notifyme(decode_class(decoder)?),
        Proc::ComingSoon => {
            let info = decode_prod_info(decoder)?;
            LdmCall::ComingSoon { info, pktsz: decoder.u32("pktsz")? }
        }
        Proc::BlkData => {
            let signature = decode_signature(decoder)?;
            let pktnum = decoder.u32("pktnum")?;
            let data = decoder.opaque(DBUF_MAX, "dbuf")?.to_vec();
            LdmCall::BlkData { signature, pktnum, data }
        }
        Proc::IsAlive => LdmCall::IsAlive(decoder.u32("id")?),
    })
}

fn decode_result(decoder: &mut Decoder<'_>, proc: Proc) -> Result<ReplyBody, XdrError> {
    Ok(match proc {
        Proc::Nullproc | Proc::Hereis | Proc::Notification | Proc::BlkData => ReplyBody::Void,
        Proc::Feedme | Proc::Notifyme => ReplyBody::Fornme(match LdmErr::decode(decoder.u32("fornme_reply_t")?)? {
            LdmErr::Ok => FornmeReply::Ok(decoder.u32("id")?),
            LdmErr::BadPattern => FornmeReply::BadPattern,
            LdmErr::Reclass => FornmeReply::Reclass(decode_class(decoder)?),
            other => return Err(XdrError::Invalid { field: "fornme_reply_t", value: other.code().into() }),
        }),
        Proc::Hiya => ReplyBody::Hiya(match LdmErr::decode(decoder.u32("hiya_reply_t")?)? {
            LdmErr::Ok => HiyaReply::Ok(decoder.u32("max_hereis")?),
            LdmErr::DontSend => HiyaReply::DontSend,
            LdmErr::Reclass => {
                let class = decode_class(decoder)?;
                HiyaReply::Reclass { class, max_hereis: decoder.u32("max_hereis")? }
            }
            other => return Err(XdrError::Invalid { field: "hiya_reply_t", value: other.code().into() }),
        }),
        Proc::ComingSoon => ReplyBody::ComingSoon(LdmErr::decode(decoder.u32("comingsoon_reply_t")?)?),
        Proc::IsAlive => ReplyBody::IsAlive(decoder.bool("is_alive")?),
    })
}

fn decode_timestamp(decoder: &mut Decoder<'_>, field: &'static str) -> Result<Timestamp, XdrError> {
    let secs = decoder.i32(field)?;
    let micros = decoder.i32(field)?;
    Ok(Timestamp { secs: i64::from(secs), micros })
}

fn decode_signature(decoder: &mut Decoder<'_>) -> Result<Signature, XdrError> {
    let bytes = decoder.fixed(16, "signature")?;
    let mut signature = [0u8; 16];
    signature.copy_from_slice(bytes);
    Ok(Signature(signature))
}

/// Decodes a `prod_info`.
pub fn decode_prod_info(decoder: &mut Decoder<'_>) -> Result<ProdInfo, XdrError> {
    Ok(ProdInfo {
        arrival: decode_timestamp(decoder, "arrival")?,
        signature: decode_signature(decoder)?,
        origin: decoder.string(ORIGIN_LEN_MAX, "origin")?,
        feedtype: FeedType(decoder.u32("feedtype")?),
        seqno: decoder.u32("seqno")?,
        ident: decoder.string(IDENT_LEN_MAX, "ident")?,
        size: decoder.u32("sz")?,
    })
}

/// Decodes a `prod_class`.
pub fn decode_class(decoder: &mut Decoder<'_>) -> Result<WireClass, XdrError> {
    let from = decode_timestamp(decoder, "from")?;
    let to = decode_timestamp(decoder, "to")?;
    let count = decoder.u32("psa")? as usize;
    if count > SPECS_MAX {
        return Err(XdrError::TooLong { field: "psa", len: count, max: SPECS_MAX });
    }
    let mut specs = Vec::with_capacity(count);
    for _ in 0..count {
        let feedtype = FeedType(decoder.u32("feedtype")?);
        let pattern = decoder.string(PATTERN_LEN_MAX, "pattern")?;
        specs.push(WireSpec { feedtype, pattern });
    }
    Ok(WireClass { from, to, specs })
}

// ---------------------------------------------------------------------------------------------
// Encoding. Every function appends one whole record (fragment header included).

fn encode_timestamp(encoder: &mut Encoder<'_>, time: Timestamp) {
    encoder.i32(time.secs.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32);
    encoder.i32(time.micros);
}

/// Encodes a `prod_info`.
pub fn encode_prod_info(encoder: &mut Encoder<'_>, info: &ProdInfo) {
    encode_timestamp(encoder, info.arrival);
    encoder.fixed(info.signature.as_bytes());
    encoder.string(&info.origin);
    encoder.u32(info.feedtype.bits());
    encoder.u32(info.seqno);
    encoder.string(&info.ident);
    encoder.u32(info.size);
}

/// Encodes a `prod_class`.
pub fn encode_class(encoder: &mut Encoder<'_>, class: &WireClass) {
    encode_timestamp(encoder, class.from);
    encode_timestamp(encoder, class.to);
    encoder.u32(class.specs.len() as u32);
    for spec in &class.specs {
        encoder.u32(spec.feedtype.bits());
        encoder.string(&spec.pattern);
    }
}

fn call_record(out: &mut Vec<u8>, xid: u32, version: u32, proc: Proc, args: impl FnOnce(&mut Encoder<'_>)) {
    let at = start_record(out);
    {
        let mut encoder = Encoder::new(out);
        encode_call_header(&mut encoder, &CallHeader { xid, program: LDM_PROGRAM, version, procedure: proc.number() });
        args(&mut encoder);
    }
    finish_record(out, at);
}

/// Appends a call record.
pub fn encode_call(out: &mut Vec<u8>, call: &Call) {
    call_record(out, call.xid, call.version, call.call.proc(), |encoder| match &call.call {
        LdmCall::Nullproc => {}
        LdmCall::Hereis { info, data } => {
            encode_prod_info(encoder, info);
            encoder.fixed(data);
        }
        LdmCall::Feedme { class, max_hereis } => {
            encode_class(encoder, class);
            encoder.u32(*max_hereis);
        }
        LdmCall::Hiya(class) | LdmCall::Notifyme(class) => encode_class(encoder, class),
        LdmCall::Notification(info) => encode_prod_info(encoder, info),
        LdmCall::ComingSoon { info, pktsz } => {
            encode_prod_info(encoder, info);
            encoder.u32(*pktsz);
        }
        LdmCall::BlkData { signature, pktnum, data } => {
            encoder.fixed(signature.as_bytes());
            encoder.u32(*pktnum);
            encoder.opaque(data);
        }
        LdmCall::IsAlive(id) => encoder.u32(*id),
    });
}

/// Appends a HEREIS record without copying the data into an [`LdmCall`] first.
pub fn encode_hereis(out: &mut Vec<u8>, xid: u32, info: &ProdInfo, data: &[u8]) {
    out.reserve(data.len() + 128);
    call_record(out, xid, 6, Proc::Hereis, |encoder| {
        encode_prod_info(encoder, info);
        encoder.fixed(data);
    });
}

/// A HEREIS decoded in place: its xid, product information, and the data's range in the record.
pub type HereisInPlace = (u32, ProdInfo, std::ops::Range<usize>);

/// If `record` is an LDM-6 HEREIS call, decodes it without copying the data: its xid, the
/// product information, and where the data lies in `record` (checked as [`decode_message`]
/// checks it: length, zero padding, nothing after). `None` for any other record.
pub fn decode_hereis_in_place(record: &[u8]) -> Option<Result<HereisInPlace, XdrError>> {
    let mut decoder = Decoder::new(record);
    let header = match decode_header(&mut decoder) {
        Ok(Header::Call(header))
            if header.program == LDM_PROGRAM && header.version == 6 && header.procedure == Proc::Hereis.number() =>
        {
            header
        }
        _ => return None,
    };
    Some((|| {
        let info = decode_prod_info(&mut decoder)?;
        let start = record.len() - decoder.remaining();
        decoder.fixed(info.size as usize, "product data")?;
        decoder.finish("call")?;
        let end = start + info.size as usize;
        Ok((header.xid, info, start..end))
    })())
}

/// Appends everything of a HEREIS record but its data: the record mark (counting the data and
/// its padding), the call header and the product information. The caller sends `info.size`
/// bytes of data and then the returned number of zero bytes (XDR padding) right after it, so
/// that the data need not be copied into `out` (vectored writes). The bytes on the wire are
/// those of [`encode_hereis`].
pub fn encode_hereis_head(out: &mut Vec<u8>, xid: u32, info: &ProdInfo) -> usize {
    let data_len = info.size as usize;
    let pad = (4 - data_len % 4) % 4;
    let at = start_record(out);
    {
        let mut encoder = Encoder::new(out);
        encode_call_header(
            &mut encoder,
            &CallHeader { xid, program: LDM_PROGRAM, version: 6, procedure: Proc::Hereis.number() },
        );
        encode_prod_info(&mut encoder, info);
    }
    let head_len = out.len() - at - 4;
    let record_len = (head_len + data_len + pad) as u32;
    out[at..at + 4].copy_from_slice(&(crate::rpc::LAST_FRAGMENT | record_len).to_be_bytes());
    pad
}

/// Appends a BLKDATA record without copying the data into an [`LdmCall`] first.
pub fn encode_blkdata(out: &mut Vec<u8>, xid: u32, signature: &Signature, pktnum: u32, data: &[u8]) {
    call_record(out, xid, 6, Proc::BlkData, |encoder| {
        encoder.fixed(signature.as_bytes());
        encoder.u32(pktnum);
        encoder.opaque(data);
    });
}

/// Appends a reply record.
pub fn encode_reply(out: &mut Vec<u8>, xid: u32, body: &ReplyBody) {
    let at = start_record(out);
    {
        let mut encoder = Encoder::new(out);
        let header = match body {
            ReplyBody::Error(stat) => ReplyHeader::Accepted(*stat),
            ReplyBody::Denied(stat) => ReplyHeader::AuthError(*stat),
            ReplyBody::RpcMismatch { low, high } => ReplyHeader::RpcMismatch { low: *low, high: *high },
            _ => ReplyHeader::Accepted(AcceptStat::Success),
        };
        encode_reply_header(&mut encoder, xid, &header);
        match body {
            ReplyBody::Fornme(FornmeReply::Ok(id)) => {
                encoder.u32(LdmErr::Ok.code());
                encoder.u32(*id);
            }
            ReplyBody::Fornme(FornmeReply::BadPattern) => encoder.u32(LdmErr::BadPattern.code()),
            ReplyBody::Fornme(FornmeReply::Reclass(class)) => {
                encoder.u32(LdmErr::Reclass.code());
                encode_class(&mut encoder, class);
            }
            ReplyBody::Hiya(HiyaReply::Ok(max_hereis)) => {
                encoder.u32(LdmErr::Ok.code());
                encoder.u32(*max_hereis);
            }
            ReplyBody::Hiya(HiyaReply::DontSend) => encoder.u32(LdmErr::DontSend.code()),
            ReplyBody::Hiya(HiyaReply::Reclass { class, max_hereis }) => {
                encoder.u32(LdmErr::Reclass.code());
                encode_class(&mut encoder, class);
                encoder.u32(*max_hereis);
            }
            ReplyBody::ComingSoon(code) => encoder.u32(code.code()),
            ReplyBody::IsAlive(alive) => encoder.bool(*alive),
            ReplyBody::Void | ReplyBody::Error(_) | ReplyBody::Denied(_) | ReplyBody::RpcMismatch { .. } => {}
        }
    }
    finish_record(out, at);
}
