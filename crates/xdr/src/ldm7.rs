//! LDM-7 messages (ldm7-multicast.md §2): the types of §2.1 and the eight procedures of
//! program 300029 version 7, on the same RPC layer as LDM-6 ([`crate::rpc`]: record marking,
//! AUTH_NONE headers) and with LDM-6's `product` / `prod_info` encodings (ldm6-protocol.md
//! §3–§4). Byte-exact against the real LDM-7 capture (`tests/integration/ldm7.rs`).
//!
//! Rules kept here:
//!
//! * only SUBSCRIBE (1) has a reply ([`SubscriptionReply`]); the seven others are one-way calls
//!   (§2: zero client timeout, the server never replies);
//! * `unsigned short` fields (`vlanId`, `prefixLen`) are four bytes on the wire and must fit;
//! * `CidrAddr.addr` is the documented byte-order quirk: see [`CidrAddr`];
//! * `string<>` fields have no bound in `ldm.x`; here they are bounded by [`STRING_LEN_MAX`];
//! * a decoded product's data stays inside the record it arrived in ([`RecordBytes`]): a
//!   product of tens of MB is not copied again after record reassembly.
//!
//! The FMTP payload of a multicast product is the bare XDR `product` (§3.4): [`encode_product`]
//! and [`decode_product`].

use core::net::Ipv4Addr;
use std::fmt;
use std::ops::Range;
use std::time::Duration;

use ldm7_types::{FeedType, ProdInfo, Signature};

use crate::XdrError;
use crate::codec::{Decoder, Encoder};
use crate::ldm::{decode_prod_info, encode_prod_info};
pub use crate::rpc::{AcceptStat, AuthStat};
use crate::rpc::{
    CallHeader, Header, LDM_PROGRAM, ReplyHeader, decode_header, encode_call_header, encode_reply_header,
    finish_record, start_record,
};

/// The program version of LDM-7.
pub const VERSION: u32 = 7;

/// Longest `string<>` accepted (switch and port ids, `host:port` addresses): `ldm.x` sets no
/// bound; a host name is at most 255 bytes, so this leaves room for any real value.
pub const STRING_LEN_MAX: usize = 1024;

/// An FMTP product index (`McastProdIndex`, §2.1; FMTP `prodindex`, §3.2).
pub type McastProdIndex = u32;

/// `Ldm7Status` (§2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ldm7Status {
    /// 0: success.
    Ok,
    /// 1: logic error.
    Logic,
    /// 2: interrupted.
    Intr,
    /// 3: timed out.
    TimedOut,
    /// 4: RPC failure.
    Rpc,
    /// 5: invalid argument.
    Inval,
    /// 6: not authorized (no ALLOW entry grants the feed).
    Unauth,
    /// 7: IPv6 not supported.
    Ipv6,
    /// 8: refused.
    Refused,
    /// 9: system failure.
    System,
    /// 10: multicast failure.
    Mcast,
    /// 11: shutting down.
    Shutdown,
    /// 12: no such thing (no MULTICAST entry for the feed).
    NoEnt,
    /// 13: duplicate.
    Dup,
    /// 14: already exists.
    Exists,
    /// 15: product-queue failure.
    Pq,
    /// 16: no FMTP receiver.
    NoRcvr,
}

impl Ldm7Status {
    /// Every status, in code order.
    pub const ALL: [Self; 17] = [
        Self::Ok,
        Self::Logic,
        Self::Intr,
        Self::TimedOut,
        Self::Rpc,
        Self::Inval,
        Self::Unauth,
        Self::Ipv6,
        Self::Refused,
        Self::System,
        Self::Mcast,
        Self::Shutdown,
        Self::NoEnt,
        Self::Dup,
        Self::Exists,
        Self::Pq,
        Self::NoRcvr,
    ];

    /// The wire value.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The status with this wire value.
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.get(code as usize).copied()
    }
}

impl fmt::Display for Ldm7Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ok => "LDM7_OK",
            Self::Logic => "LDM7_LOGIC",
            Self::Intr => "LDM7_INTR",
            Self::TimedOut => "LDM7_TIMEDOUT",
            Self::Rpc => "LDM7_RPC",
            Self::Inval => "LDM7_INVAL",
            Self::Unauth => "LDM7_UNAUTH",
            Self::Ipv6 => "LDM7_IPV6",
            Self::Refused => "LDM7_REFUSED",
            Self::System => "LDM7_SYSTEM",
            Self::Mcast => "LDM7_MCAST",
            Self::Shutdown => "LDM7_SHUTDOWN",
            Self::NoEnt => "LDM7_NOENT",
            Self::Dup => "LDM7_DUP",
            Self::Exists => "LDM7_EXISTS",
            Self::Pq => "LDM7_PQ",
            Self::NoRcvr => "LDM7_NORCVR",
        })
    }
}

/// `VcEndPoint`: the subscriber's end of an AL2S virtual circuit (§2.1, §4.3).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VcEndPoint {
    /// The switch.
    pub switch_id: String,
    /// The port on the switch.
    pub port_id: String,
    /// The VLAN (an `unsigned short` on the wire).
    pub vlan_id: u16,
}

impl VcEndPoint {
    /// What the reference downstream sends when its RECEIVE entry names no circuit: `"dummy"`,
    /// `"dummy"`, VLAN 0 (seen in the capture; the spec's "empty strings" is not what goes out).
    pub fn unused() -> Self {
        Self { switch_id: "dummy".into(), port_id: "dummy".into(), vlan_id: 0 }
    }
}

/// `McastSubReq`: the SUBSCRIBE argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McastSubReq {
    /// The feed wanted.
    pub feed: FeedType,
    /// The subscriber's circuit end.
    pub vc_end: VcEndPoint,
    /// What an ldm7 subscriber offers beyond the reference (an ldm7 extension: words after the
    /// argument, which a reference publisher's RPC layer skips with the rest of the record).
    pub offer: Option<SubscribeOffer>,
}

/// The first word of the ldm7 extension that may follow a SUBSCRIBE argument or an `LDM7_OK`
/// reply body: `"ldm7"` in ASCII.
pub const EXTENSION_MAGIC: u32 = 0x6c64_6d37;
/// The extension's version; a peer reads the fields of the versions it knows and skips the rest.
pub const EXTENSION_VERSION: u32 = 1;
/// Flag of [`SubscribeOffer`]: the subscriber can repair by parity (docs/parity.md).
const OFFER_PARITY: u32 = 1;

/// What an ldm7 subscriber offers in its SUBSCRIBE (after the `McastSubReq`):
/// `EXTENSION_MAGIC`, `EXTENSION_VERSION`, `uint32 flags` (bit 0: parity repair).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubscribeOffer {
    /// It can ask for lost blocks as parity and take parity shards.
    pub parity: bool,
}

/// What an ldm7 publisher answers to an offer (after the `McastSubInfo` of an `LDM7_OK`
/// reply, only when the SUBSCRIBE offered): `EXTENSION_MAGIC`, `EXTENSION_VERSION`, then
/// `uint32 groupBlocks`, `uint32 shards`, `uint32 parityPort` (all 0: no parity), and for a
/// feed multicast over IPv6 `uint32 address[4]` (the IPv6 FMTP client address, network
/// order, most significant word first) and `uint32 prefixLen`: the reference's `CidrAddr`
/// holds an IPv4 address only, so it is then 0.0.0.0/0 and the address travels here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubscribeAnswer {
    /// The parity coding the feed uses, and where its shards are multicast.
    pub parity: Option<ParityAnswer>,
    /// The IPv6 address the subscriber's FMTP receiver must use, with its prefix length (a
    /// feed multicast over IPv6; `None` for IPv4).
    pub address6: Option<(core::net::Ipv6Addr, u8)>,
}

/// A feed's parity coding, as the subscription answer carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParityAnswer {
    /// Data blocks per group.
    pub group_blocks: u32,
    /// Parity shards a group can have.
    pub shards: u32,
    /// The UDP port of the feed's multicast group the shards go to (the group's address).
    pub port: u16,
}

/// `BacklogSpec`: the REQUEST_BACKLOG argument (§2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BacklogSpec {
    /// Signature of the last product of the previous session (meaningful if `after_is_set`).
    pub after: Signature,
    /// Whether `after` is set (`int32` boolean on the wire).
    pub after_is_set: bool,
    /// Signature of the first product of this session (not sent in the backlog).
    pub before: Signature,
    /// Without `after`: start at now − this many seconds (reference default 3600).
    pub time_offset_secs: u32,
}

impl BacklogSpec {
    /// `after`, if set.
    pub fn after(&self) -> Option<Signature> {
        self.after_is_set.then_some(self.after)
    }

    /// The time offset.
    pub fn time_offset(&self) -> Duration {
        Duration::from_secs(u64::from(self.time_offset_secs))
    }
}

/// `McastInfo`: a feed's multicast group and FMTP server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McastInfo {
    /// The feed.
    pub feed: FeedType,
    /// `"<IPv4-or-name>:<port>"` of the multicast group.
    pub group: String,
    /// `"<IPv4-or-name>:<port>"` of the FMTP (retransmission) server; a host part `0.0.0.0`
    /// means "the upstream host" (§2.2 step 3).
    pub server: String,
}

/// `CidrAddr`: the FMTP client address the subscriber must use, with its prefix length.
///
/// **Byte-order quirk** (§2.1): the reference keeps the IPv4 address in *network* order in
/// memory and encodes that memory word with `xdr_u_int`, which writes the word's *host-order*
/// value big-endian. On the little-endian hosts LDM-7 runs on (x86), the four address bytes
/// therefore appear **reversed** on the wire: 10.77.0.2 travels as `02 00 4d 0a`. To talk to
/// them, the address is encoded and decoded as "the `uint32` whose little-endian bytes are the
/// dotted quad". (A big-endian reference host would send the bytes in normal order; nothing on
/// the wire says which, so this is a portability bug of the protocol, kept for compatibility.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CidrAddr {
    /// The address.
    pub addr: Ipv4Addr,
    /// The prefix length, 0..=32 (an `unsigned short` on the wire).
    pub prefix_len: u8,
}

impl fmt::Display for CidrAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// `McastSubInfo`: what a successful SUBSCRIBE returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McastSubInfo {
    /// The group and the FMTP server.
    pub mcast_info: McastInfo,
    /// The address the subscriber's FMTP receiver must connect from.
    pub fmtp_addr: CidrAddr,
    /// An ldm7 publisher's answer to the subscriber's offer (`None` for a reference publisher,
    /// or when nothing was offered).
    pub answer: Option<SubscribeAnswer>,
}

/// `SubscriptionReply`: `LDM7_OK` with the subscription, or another status and nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubscriptionReply {
    /// `LDM7_OK`.
    Ok(McastSubInfo),
    /// Any other status (never [`Ldm7Status::Ok`]: that is not decodable without a body).
    Refused(Ldm7Status),
}

impl SubscriptionReply {
    /// The status on the wire.
    pub fn status(&self) -> Ldm7Status {
        match self {
            Self::Ok(_) => Ldm7Status::Ok,
            Self::Refused(status) => *status,
        }
    }
}

/// Product bytes that stay inside the record they were decoded from (no copy). Compares,
/// hashes and dereferences as the bytes; `Debug` shows only the length.
#[derive(Clone, Default)]
pub struct RecordBytes {
    buffer: Vec<u8>,
    range: Range<usize>,
}

impl RecordBytes {
    /// The bytes as a slice.
    pub fn as_slice(&self) -> &[u8] {
        &self.buffer[self.range.clone()]
    }

    /// The bytes as a vector: free when they fill the buffer, else one move within it.
    pub fn into_vec(mut self) -> Vec<u8> {
        if self.range.start == 0 {
            self.buffer.truncate(self.range.end);
        } else {
            self.buffer.truncate(self.range.end);
            self.buffer.drain(..self.range.start);
        }
        self.buffer
    }

    /// Bytes `range` of `buffer` (invariant: the range lies within the buffer).
    fn window(buffer: Vec<u8>, range: Range<usize>) -> Self {
        debug_assert!(range.start <= range.end && range.end <= buffer.len());
        Self { buffer, range }
    }
}

impl From<Vec<u8>> for RecordBytes {
    fn from(buffer: Vec<u8>) -> Self {
        let range = 0..buffer.len();
        Self { buffer, range }
    }
}

impl std::ops::Deref for RecordBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for RecordBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for RecordBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for RecordBytes {}

impl std::hash::Hash for RecordBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl fmt::Debug for RecordBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RecordBytes({} bytes)", self.range.len())
    }
}

/// An LDM `product`: metadata and exactly `info.size` bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireProduct {
    /// Metadata.
    pub info: ProdInfo,
    /// The bytes.
    pub data: RecordBytes,
}

/// `MissedProduct`: the DELIVER_MISSED_PRODUCT argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissedProduct {
    /// The FMTP index it was requested by.
    pub index: McastProdIndex,
    /// The product.
    pub product: WireProduct,
}

/// LDM-7 procedures (§2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proc {
    /// 1: downstream → upstream, synchronous.
    Subscribe,
    /// 2: downstream → upstream, one-way.
    RequestProduct,
    /// 3: downstream → upstream, one-way.
    RequestBacklog,
    /// 4: either direction (heartbeat), one-way.
    TestConnection,
    /// 5: upstream → downstream, one-way.
    DeliverMissedProduct,
    /// 6: upstream → downstream, one-way.
    NoSuchProduct,
    /// 7: upstream → downstream, one-way.
    DeliverBacklogProduct,
    /// 8: upstream → downstream, one-way (the reference upstream never sends it).
    EndBacklog,
}

impl Proc {
    /// The procedure number.
    pub const fn number(self) -> u32 {
        match self {
            Self::Subscribe => 1,
            Self::RequestProduct => 2,
            Self::RequestBacklog => 3,
            Self::TestConnection => 4,
            Self::DeliverMissedProduct => 5,
            Self::NoSuchProduct => 6,
            Self::DeliverBacklogProduct => 7,
            Self::EndBacklog => 8,
        }
    }

    /// The procedure with this number.
    pub const fn from_number(number: u32) -> Option<Self> {
        Some(match number {
            1 => Self::Subscribe,
            2 => Self::RequestProduct,
            3 => Self::RequestBacklog,
            4 => Self::TestConnection,
            5 => Self::DeliverMissedProduct,
            6 => Self::NoSuchProduct,
            7 => Self::DeliverBacklogProduct,
            8 => Self::EndBacklog,
            _ => return None,
        })
    }

    /// Whether the caller waits for a reply: SUBSCRIBE only.
    pub const fn has_reply(self) -> bool {
        matches!(self, Self::Subscribe)
    }
}

impl fmt::Display for Proc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Subscribe => "SUBSCRIBE",
            Self::RequestProduct => "REQUEST_PRODUCT",
            Self::RequestBacklog => "REQUEST_BACKLOG",
            Self::TestConnection => "TEST_CONNECTION",
            Self::DeliverMissedProduct => "DELIVER_MISSED_PRODUCT",
            Self::NoSuchProduct => "NO_SUCH_PRODUCT",
            Self::DeliverBacklogProduct => "DELIVER_BACKLOG_PRODUCT",
            Self::EndBacklog => "END_BACKLOG",
        })
    }
}

/// A version-7 call's procedure and argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ldm7Call {
    /// SUBSCRIBE(McastSubReq).
    Subscribe(McastSubReq),
    /// REQUEST_PRODUCT(McastProdIndex).
    RequestProduct(McastProdIndex),
    /// REQUEST_BACKLOG(BacklogSpec).
    RequestBacklog(BacklogSpec),
    /// TEST_CONNECTION(void).
    TestConnection,
    /// DELIVER_MISSED_PRODUCT(MissedProduct).
    DeliverMissedProduct(MissedProduct),
    /// NO_SUCH_PRODUCT(McastProdIndex).
    NoSuchProduct(McastProdIndex),
    /// DELIVER_BACKLOG_PRODUCT(product).
    DeliverBacklogProduct(WireProduct),
    /// END_BACKLOG(void).
    EndBacklog,
}

impl Ldm7Call {
    /// Its procedure.
    pub fn proc(&self) -> Proc {
        match self {
            Self::Subscribe(_) => Proc::Subscribe,
            Self::RequestProduct(_) => Proc::RequestProduct,
            Self::RequestBacklog(_) => Proc::RequestBacklog,
            Self::TestConnection => Proc::TestConnection,
            Self::DeliverMissedProduct(_) => Proc::DeliverMissedProduct,
            Self::NoSuchProduct(_) => Proc::NoSuchProduct,
            Self::DeliverBacklogProduct(_) => Proc::DeliverBacklogProduct,
            Self::EndBacklog => Proc::EndBacklog,
        }
    }
}

/// A version-7 call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Transaction id.
    pub xid: u32,
    /// Procedure and argument.
    pub call: Ldm7Call,
}

/// What a version-7 reply says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyBody {
    /// The SUBSCRIBE result.
    Subscribe(SubscriptionReply),
    /// Success without a result (a reply to a one-way procedure: never sent by the reference).
    Void,
    /// Accepted but not executed (SYSTEM_ERR on an upstream failure, PROC_UNAVAIL, …).
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

/// A version-7 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The call's xid.
    pub xid: u32,
    /// What it says.
    pub body: ReplyBody,
}

/// A decoded version-7 record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A call.
    Call(Call),
    /// A reply.
    Reply(Reply),
}

// ---------------------------------------------------------------------------------------------
// Decoding.

/// Decodes one record (taken by value: a product's data stays in it, see [`RecordBytes`]).
/// Calls must be program 300029 version 7 ([`XdrError::WrongProgram`] otherwise, an unknown
/// procedure is [`XdrError::UnknownProcedure`]: both are answerable, see
/// [`XdrError::unserved_call_versions`]). A successful reply's result is typed by the
/// procedure it answers: `reply_proc(xid)` gives it (`None`: [`XdrError::UnexpectedReply`]).
pub fn decode_message(record: Vec<u8>, reply_proc: impl Fn(u32) -> Option<Proc>) -> Result<Message, XdrError> {
    let mut decoder = Decoder::new(&record);
    match decode_header(&mut decoder)? {
        Header::Call(header) => {
            if header.program != LDM_PROGRAM || header.version != VERSION {
                return Err(XdrError::WrongProgram {
                    xid: header.xid,
                    program: header.program,
                    version: header.version,
                });
            }
            let proc = Proc::from_number(header.procedure)
                .ok_or(XdrError::UnknownProcedure { xid: header.xid, procedure: header.procedure })?;
            let args = decode_call(&mut decoder, proc)?;
            decoder.finish("call")?;
            let call = match args {
                Args::Done(call) => call,
                Args::Missed { index, info, data } => Ldm7Call::DeliverMissedProduct(MissedProduct {
                    index,
                    product: WireProduct { info, data: RecordBytes::window(record, data) },
                }),
                Args::Backlog { info, data } => {
                    Ldm7Call::DeliverBacklogProduct(WireProduct { info, data: RecordBytes::window(record, data) })
                }
            };
            Ok(Message::Call(Call { xid: header.xid, call }))
        }
        Header::Reply { xid, header } => {
            let body = match header {
                ReplyHeader::Accepted(AcceptStat::Success) => {
                    let proc = reply_proc(xid).ok_or(XdrError::UnexpectedReply { xid })?;
                    if proc.has_reply() {
                        ReplyBody::Subscribe(decode_subscription_reply(&mut decoder)?)
                    } else {
                        ReplyBody::Void
                    }
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

/// A call's arguments before the record is handed to a product (which keeps it).
enum Args {
    Done(Ldm7Call),
    Missed { index: McastProdIndex, info: ProdInfo, data: Range<usize> },
    Backlog { info: ProdInfo, data: Range<usize> },
}

fn decode_call(decoder: &mut Decoder<'_>, proc: Proc) -> Result<Args, XdrError> {
    Ok(match proc {
        Proc::Subscribe => {
            let feed = FeedType(decoder.u32("feed")?);
            let vc_end = VcEndPoint {
                switch_id: decoder.string(STRING_LEN_MAX, "switchId")?,
                port_id: decoder.string(STRING_LEN_MAX, "portId")?,
                vlan_id: decode_ushort(decoder, "vlanId")?,
            };
            let offer = decode_extension(decoder)?
                .map(|words| SubscribeOffer { parity: words.first().is_some_and(|flags| flags & OFFER_PARITY != 0) });
            Args::Done(Ldm7Call::Subscribe(McastSubReq { feed, vc_end, offer }))
        }
        Proc::RequestProduct => Args::Done(Ldm7Call::RequestProduct(decoder.u32("McastProdIndex")?)),
        Proc::RequestBacklog => {
            let after = decode_signature(decoder, "after")?;
            let after_is_set = decoder.bool("afterIsSet")?;
            let before = decode_signature(decoder, "before")?;
            let time_offset_secs = decoder.u32("timeOffset")?;
            Args::Done(Ldm7Call::RequestBacklog(BacklogSpec { after, after_is_set, before, time_offset_secs }))
        }
        Proc::TestConnection => Args::Done(Ldm7Call::TestConnection),
        Proc::DeliverMissedProduct => {
            let index = decoder.u32("iProd")?;
            let (info, data) = decode_product_range(decoder)?;
            Args::Missed { index, info, data }
        }
        Proc::NoSuchProduct => Args::Done(Ldm7Call::NoSuchProduct(decoder.u32("McastProdIndex")?)),
        Proc::DeliverBacklogProduct => {
            let (info, data) = decode_product_range(decoder)?;
            Args::Backlog { info, data }
        }
        Proc::EndBacklog => Args::Done(Ldm7Call::EndBacklog),
    })
}

fn decode_subscription_reply(decoder: &mut Decoder<'_>) -> Result<SubscriptionReply, XdrError> {
    let code = decoder.u32("Ldm7Status")?;
    let status = Ldm7Status::from_code(code).ok_or(XdrError::Invalid { field: "Ldm7Status", value: code.into() })?;
    if status != Ldm7Status::Ok {
        return Ok(SubscriptionReply::Refused(status));
    }
    let mcast_info = McastInfo {
        feed: FeedType(decoder.u32("feed")?),
        group: decoder.string(STRING_LEN_MAX, "group")?,
        server: decoder.string(STRING_LEN_MAX, "server")?,
    };
    let addr = decoder.u32("CidrAddr.addr")?;
    let prefix_len = decode_ushort(decoder, "prefixLen")?;
    if prefix_len > 32 {
        return Err(XdrError::Invalid { field: "prefixLen", value: prefix_len.into() });
    }
    let fmtp_addr = CidrAddr { addr: quirk_addr(addr), prefix_len: prefix_len as u8 };
    let answer = match decode_extension(decoder)? {
        None => None,
        Some(words) => {
            let parity = match words[..] {
                [group_blocks, shards, port, ..] if group_blocks != 0 && shards != 0 => u16::try_from(port)
                    .ok()
                    .filter(|port| *port != 0)
                    .map(|port| ParityAnswer { group_blocks, shards, port }),
                _ => None,
            };
            let address6 = match words.get(3..8) {
                Some(&[a, b, c, d, prefix_len]) => {
                    if prefix_len > 128 {
                        return Err(XdrError::Invalid { field: "prefixLen (IPv6)", value: prefix_len.into() });
                    }
                    let bits = (u128::from(a) << 96) | (u128::from(b) << 64) | (u128::from(c) << 32) | u128::from(d);
                    Some((core::net::Ipv6Addr::from(bits), prefix_len as u8))
                }
                _ => None,
            };
            Some(SubscribeAnswer { parity, address6 })
        }
    };
    Ok(SubscriptionReply::Ok(McastSubInfo { mcast_info, fmtp_addr, answer }))
}

/// The ldm7 extension's words after its magic and version, if the record goes on with it
/// (`None` at the record's end). Anything else after a reference body is refused, as before.
fn decode_extension(decoder: &mut Decoder<'_>) -> Result<Option<Vec<u32>>, XdrError> {
    if decoder.remaining() == 0 {
        return Ok(None);
    }
    let magic = decoder.u32("extension magic")?;
    if magic != EXTENSION_MAGIC {
        return Err(XdrError::Invalid { field: "extension magic", value: magic.into() });
    }
    let version = decoder.u32("extension version")?;
    if version == 0 {
        return Err(XdrError::Invalid { field: "extension version", value: 0 });
    }
    let mut words = Vec::new();
    while decoder.remaining() >= 4 && words.len() < 64 {
        words.push(decoder.u32("extension word")?);
    }
    Ok(Some(words))
}

/// Appends the extension: magic, version, words.
fn encode_extension(encoder: &mut Encoder<'_>, words: &[u32]) {
    encoder.u32(EXTENSION_MAGIC);
    encoder.u32(EXTENSION_VERSION);
    for word in words {
        encoder.u32(*word);
    }
}

/// The address in a `CidrAddr` word: its little-endian bytes are the dotted quad (see
/// [`CidrAddr`]).
fn quirk_addr(word: u32) -> Ipv4Addr {
    Ipv4Addr::from(word.to_le_bytes())
}

/// The `CidrAddr` word of an address (inverse of [`quirk_addr`]).
fn quirk_word(addr: Ipv4Addr) -> u32 {
    u32::from_le_bytes(addr.octets())
}

fn decode_ushort(decoder: &mut Decoder<'_>, field: &'static str) -> Result<u16, XdrError> {
    let value = decoder.u32(field)?;
    u16::try_from(value).map_err(|_| XdrError::Invalid { field, value: value.into() })
}

fn decode_signature(decoder: &mut Decoder<'_>, field: &'static str) -> Result<Signature, XdrError> {
    let bytes = decoder.fixed(16, field)?;
    let mut signature = [0u8; 16];
    signature.copy_from_slice(bytes);
    Ok(Signature(signature))
}

/// A `product`: its metadata and where its data lies in the decoder's bytes.
fn decode_product_range(decoder: &mut Decoder<'_>) -> Result<(ProdInfo, Range<usize>), XdrError> {
    let info = decode_prod_info(decoder)?;
    let start = decoder.position();
    let data = decoder.fixed(info.size as usize, "product data")?;
    Ok((info, start..start + data.len()))
}

/// Decodes a bare XDR `product` — the FMTP payload of a multicast product (§3.4) — into its
/// metadata and data.
pub fn decode_product(bytes: &[u8]) -> Result<(ProdInfo, &[u8]), XdrError> {
    let mut decoder = Decoder::new(bytes);
    let (info, range) = decode_product_range(&mut decoder)?;
    decoder.finish("product")?;
    Ok((info, &bytes[range]))
}

// ---------------------------------------------------------------------------------------------
// Encoding. The record functions append one whole record (fragment header included).

/// Appends a bare XDR `product` (no record mark, no RPC header): the FMTP payload (§3.4).
pub fn encode_product(out: &mut Vec<u8>, info: &ProdInfo, data: &[u8]) {
    out.reserve(data.len() + 128);
    let mut encoder = Encoder::new(out);
    encode_prod_info(&mut encoder, info);
    encoder.fixed(data);
}

fn call_record(out: &mut Vec<u8>, xid: u32, proc: Proc, args: impl FnOnce(&mut Encoder<'_>)) {
    let at = start_record(out);
    {
        let mut encoder = Encoder::new(out);
        let header = CallHeader { xid, program: LDM_PROGRAM, version: VERSION, procedure: proc.number() };
        encode_call_header(&mut encoder, &header);
        args(&mut encoder);
    }
    finish_record(out, at);
}

/// Appends a call record.
pub fn encode_call(out: &mut Vec<u8>, call: &Call) {
    let xid = call.xid;
    match &call.call {
        Ldm7Call::Subscribe(request) => call_record(out, xid, Proc::Subscribe, |encoder| {
            encoder.u32(request.feed.bits());
            encoder.string(&request.vc_end.switch_id);
            encoder.string(&request.vc_end.port_id);
            encoder.u32(u32::from(request.vc_end.vlan_id));
            if let Some(offer) = request.offer {
                encode_extension(encoder, &[if offer.parity { OFFER_PARITY } else { 0 }]);
            }
        }),
        Ldm7Call::RequestProduct(index) => call_record(out, xid, Proc::RequestProduct, |encoder| encoder.u32(*index)),
        Ldm7Call::RequestBacklog(spec) => call_record(out, xid, Proc::RequestBacklog, |encoder| {
            encoder.fixed(spec.after.as_bytes());
            encoder.bool(spec.after_is_set);
            encoder.fixed(spec.before.as_bytes());
            encoder.u32(spec.time_offset_secs);
        }),
        Ldm7Call::TestConnection => call_record(out, xid, Proc::TestConnection, |_| {}),
        Ldm7Call::DeliverMissedProduct(missed) => {
            encode_deliver_missed_product(out, xid, missed.index, &missed.product.info, &missed.product.data);
        }
        Ldm7Call::NoSuchProduct(index) => call_record(out, xid, Proc::NoSuchProduct, |encoder| encoder.u32(*index)),
        Ldm7Call::DeliverBacklogProduct(product) => {
            encode_deliver_backlog_product(out, xid, &product.info, &product.data);
        }
        Ldm7Call::EndBacklog => call_record(out, xid, Proc::EndBacklog, |_| {}),
    }
}

/// Appends a DELIVER_MISSED_PRODUCT record straight from borrowed product bytes.
pub fn encode_deliver_missed_product(out: &mut Vec<u8>, xid: u32, index: McastProdIndex, info: &ProdInfo, data: &[u8]) {
    out.reserve(data.len() + 160);
    call_record(out, xid, Proc::DeliverMissedProduct, |encoder| {
        encoder.u32(index);
        encode_prod_info(encoder, info);
        encoder.fixed(data);
    });
}

/// Appends a DELIVER_BACKLOG_PRODUCT record straight from borrowed product bytes.
pub fn encode_deliver_backlog_product(out: &mut Vec<u8>, xid: u32, info: &ProdInfo, data: &[u8]) {
    out.reserve(data.len() + 160);
    call_record(out, xid, Proc::DeliverBacklogProduct, |encoder| {
        encode_prod_info(encoder, info);
        encoder.fixed(data);
    });
}

/// Appends a reply record. A [`SubscriptionReply::Refused`] holding [`Ldm7Status::Ok`] is the
/// caller's error; it is sent as `LDM7_OK` without a body, which no peer can decode.
pub fn encode_reply(out: &mut Vec<u8>, xid: u32, body: &ReplyBody) {
    let at = start_record(out);
    {
        let mut encoder = Encoder::new(out);
        let header = match body {
            ReplyBody::Error(stat) => ReplyHeader::Accepted(*stat),
            ReplyBody::Denied(stat) => ReplyHeader::AuthError(*stat),
            ReplyBody::RpcMismatch { low, high } => ReplyHeader::RpcMismatch { low: *low, high: *high },
            ReplyBody::Subscribe(_) | ReplyBody::Void => ReplyHeader::Accepted(AcceptStat::Success),
        };
        encode_reply_header(&mut encoder, xid, &header);
        if let ReplyBody::Subscribe(reply) = body {
            encoder.u32(reply.status().code());
            if let SubscriptionReply::Ok(info) = reply {
                encoder.u32(info.mcast_info.feed.bits());
                encoder.string(&info.mcast_info.group);
                encoder.string(&info.mcast_info.server);
                encoder.u32(quirk_word(info.fmtp_addr.addr));
                encoder.u32(u32::from(info.fmtp_addr.prefix_len));
                if let Some(answer) = info.answer {
                    let mut words: Vec<u32> = answer
                        .parity
                        .map_or([0; 3], |parity| [parity.group_blocks, parity.shards, u32::from(parity.port)])
                        .to_vec();
                    if let Some((address, prefix_len)) = answer.address6 {
                        let bits = u128::from(address);
                        words.extend([(bits >> 96) as u32, (bits >> 64) as u32, (bits >> 32) as u32, bits as u32]);
                        words.push(u32::from(prefix_len));
                    }
                    encode_extension(&mut encoder, &words);
                }
            }
        }
    }
    finish_record(out, at);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_address_travels_with_its_bytes_reversed() {
        let info = McastSubInfo {
            mcast_info: McastInfo { feed: FeedType::ANY, group: "g:1".into(), server: "s:2".into() },
            fmtp_addr: CidrAddr { addr: Ipv4Addr::new(10, 0, 0, 5), prefix_len: 24 },
            answer: None,
        };
        let mut out = Vec::new();
        encode_reply(&mut out, 7, &ReplyBody::Subscribe(SubscriptionReply::Ok(info.clone())));
        let tail = &out[out.len() - 8..];
        assert_eq!(tail, [0x05, 0x00, 0x00, 0x0a, 0, 0, 0, 24]);
        let decoded = decode_message(out[4..].to_vec(), |_| Some(Proc::Subscribe)).unwrap();
        assert_eq!(decoded, Message::Reply(Reply { xid: 7, body: ReplyBody::Subscribe(SubscriptionReply::Ok(info)) }));
    }

    #[test]
    fn product_data_is_a_window_into_the_record() {
        let data = RecordBytes::window(vec![9, 1, 2, 3, 0], 1..4);
        assert_eq!(&*data, [1, 2, 3]);
        assert_eq!(format!("{data:?}"), "RecordBytes(3 bytes)");
        assert_eq!(data.clone().into_vec(), vec![1, 2, 3]);
        assert_eq!(data, RecordBytes::from(vec![1, 2, 3]));
        assert_eq!(RecordBytes::window(vec![1, 2, 3, 0], 0..3).into_vec(), vec![1, 2, 3]);
    }

    #[test]
    fn out_of_range_shorts_and_prefixes_are_invalid() {
        let mut out = Vec::new();
        let vc_end = VcEndPoint { switch_id: String::new(), port_id: String::new(), vlan_id: 0 };
        encode_call(
            &mut out,
            &Call { xid: 1, call: Ldm7Call::Subscribe(McastSubReq { feed: FeedType::EXP, vc_end, offer: None }) },
        );
        let at = out.len() - 4;
        out[at..].copy_from_slice(&0x1_0000u32.to_be_bytes());
        assert!(matches!(
            decode_message(out[4..].to_vec(), |_| None),
            Err(XdrError::Invalid { field: "vlanId", value: 0x1_0000 })
        ));
        let info = McastSubInfo {
            mcast_info: McastInfo { feed: FeedType::ANY, group: String::new(), server: String::new() },
            fmtp_addr: CidrAddr { addr: Ipv4Addr::LOCALHOST, prefix_len: 33 },
            answer: None,
        };
        let mut out = Vec::new();
        encode_reply(&mut out, 1, &ReplyBody::Subscribe(SubscriptionReply::Ok(info)));
        assert!(matches!(
            decode_message(out[4..].to_vec(), |_| Some(Proc::Subscribe)),
            Err(XdrError::Invalid { field: "prefixLen", value: 33 })
        ));
    }

    #[test]
    fn the_ldm7_extension_round_trips_and_leaves_reference_records_unchanged() {
        let vc_end = VcEndPoint::unused();
        let plain = McastSubReq { feed: FeedType::EXP, vc_end: vc_end.clone(), offer: None };
        let offered = McastSubReq { offer: Some(SubscribeOffer { parity: true }), ..plain.clone() };
        let (mut plain_bytes, mut offered_bytes) = (Vec::new(), Vec::new());
        encode_call(&mut plain_bytes, &Call { xid: 3, call: Ldm7Call::Subscribe(plain) });
        encode_call(&mut offered_bytes, &Call { xid: 3, call: Ldm7Call::Subscribe(offered.clone()) });
        // The reference's record, then three words: magic, version, flags.
        assert_eq!(offered_bytes.len(), plain_bytes.len() + 12);
        assert_eq!(offered_bytes[4..plain_bytes.len()], plain_bytes[4..]);
        assert_eq!(offered_bytes[plain_bytes.len()..plain_bytes.len() + 4], *b"ldm7");
        let decoded = decode_message(offered_bytes[4..].to_vec(), |_| None).unwrap();
        assert_eq!(decoded, Message::Call(Call { xid: 3, call: Ldm7Call::Subscribe(offered) }));

        let info = |answer| McastSubInfo {
            mcast_info: McastInfo {
                feed: FeedType::EXP,
                group: "239.0.0.1:38800".into(),
                server: "10.0.0.1:38801".into(),
            },
            fmtp_addr: CidrAddr { addr: Ipv4Addr::new(10, 0, 0, 5), prefix_len: 32 },
            answer,
        };
        for answer in [
            None,
            Some(SubscribeAnswer::default()),
            Some(SubscribeAnswer {
                parity: Some(ParityAnswer { group_blocks: 256, shards: 16, port: 38801 }),
                address6: None,
            }),
            Some(SubscribeAnswer { parity: None, address6: Some(("fd00:77:1::5".parse().unwrap(), 64)) }),
            Some(SubscribeAnswer {
                parity: Some(ParityAnswer { group_blocks: 256, shards: 16, port: 38801 }),
                address6: Some(("2001:db8::1:0:0:2".parse().unwrap(), 112)),
            }),
        ] {
            let mut out = Vec::new();
            encode_reply(&mut out, 3, &ReplyBody::Subscribe(SubscriptionReply::Ok(info(answer))));
            let decoded = decode_message(out[4..].to_vec(), |_| Some(Proc::Subscribe)).unwrap();
            let expected = ReplyBody::Subscribe(SubscriptionReply::Ok(info(answer)));
            assert_eq!(decoded, Message::Reply(Reply { xid: 3, body: expected }), "{answer:?}");
        }

        // A later version's extra words are skipped; what is not the extension is refused.
        let mut later = Vec::new();
        encode_call(
            &mut later,
            &Call { xid: 4, call: Ldm7Call::Subscribe(McastSubReq { feed: FeedType::EXP, vc_end, offer: None }) },
        );
        later.extend_from_slice(&EXTENSION_MAGIC.to_be_bytes());
        later.extend_from_slice(&2u32.to_be_bytes());
        later.extend_from_slice(&1u32.to_be_bytes());
        later.extend_from_slice(&7u32.to_be_bytes());
        let mut junk = later.clone();
        let Message::Call(Call { call: Ldm7Call::Subscribe(request), .. }) =
            decode_message(later[4..].to_vec(), |_| None).unwrap()
        else {
            panic!("not a SUBSCRIBE")
        };
        assert_eq!(request.offer, Some(SubscribeOffer { parity: true }));
        let at = junk.len() - 16;
        junk[at..at + 4].copy_from_slice(&0xdead_beefu32.to_be_bytes());
        assert!(matches!(
            decode_message(junk[4..].to_vec(), |_| None),
            Err(XdrError::Invalid { field: "extension magic", .. })
        ));
    }
}
