//! Signed digest lists: MAC level 2 at a thirty-second of the signatures (an ldm7 extension).
//!
//! At level 2 the reference signs every multicast datagram with Ed25519 (ldm7-multicast.md
//! §3.7). Signing costs the sender about 15 µs and checking a receiver about 14–29 µs per
//! datagram, which caps a level-2 feed near 580 Mbit/s on two vCPUs (docs/benchmarks.md). In
//! **list signing** the sender multicasts its datagrams without a signature and, after every
//! [`LIST_LEN_MAX`] of them (or [`LIST_WAIT`] after the first one not yet listed), one
//! **DIGESTS** datagram: the SHA-256 of each datagram as sent (header and payload), signed
//! like any level-2 datagram. A receiver holds an unsigned datagram until a list it verified
//! names its digest, then hands it on; a datagram its list names before it arrives (the parity
//! shards come on their own socket) is handed on at once. Per datagram this costs one SHA-256
//! on each side (about 1 µs for 1.4 kB) and a thirty-second of a signature and of a check.
//!
//! The same source authentication as signing each datagram: a list verifies only with the
//! sender's key, and a datagram is handed on only when its SHA-256 (second pre-image resistant,
//! 256 bits) is in a verified list. A datagram no verified list names within [`HOLD`] is
//! dropped (counted; the protocol repairs it as a lost one): a lost list costs the blocks it
//! covered, which the receiver then asks for, as for any loss.
//!
//! On the wire: DIGESTS is the message type `0x0800`, `prodindex` the list's number (counting
//! from 0 per sender, for diagnostics), `seqnum` 0, `payloadlen` 32 × the digests, the payload
//! the digests in the order the datagrams were sent, then the 64-byte signature of header and
//! payload. It goes to the group's port, unsigned datagrams carry no trailer at all (a datagram
//! is `12 + payloadlen` bytes, as at level 0). A receiver tells the two kinds apart by length,
//! so a sender may switch between signing each datagram and lists at any time (an ldm7
//! publisher signs each datagram while a reference LDM-7 subscriber is on the feed), and a
//! reference receiver, which requires a signature on every datagram, must never get lists.

use std::collections::VecDeque;
use std::time::Duration;

use foldhash::fast::FixedState;
use sha2::{Digest as _, Sha256};

use crate::Instant;
use crate::mac::{KeyRing, MacError, MacLevel, SenderKey};
use crate::wire::HEADER_LEN;

/// The `flags` of a DIGESTS message (not a [`crate::wire::MessageType`]: the protocol never
/// sees one; the MAC layer takes them).
pub const DIGESTS_FLAGS: u16 = 0x0800;
/// Bytes of one digest (SHA-256).
pub const DIGEST_LEN: usize = 32;
/// Datagrams one list covers at most: 32 × 32 bytes, a 12-byte header and the signature make a
/// 1,100-byte datagram; longer lists would hold datagrams longer for little less signing.
pub const LIST_LEN_MAX: usize = 32;
/// Longest a sent datagram waits to be listed (a product's last blocks, a slow feed).
pub const LIST_WAIT: Duration = Duration::from_millis(1);
/// Longest a receiver holds an unsigned datagram for the list that names it.
pub const HOLD: Duration = Duration::from_millis(200);
/// Unsigned datagrams a receiver holds at most (the oldest is dropped first): a flood of forged
/// ones costs this much memory and the genuine ones it pushes out, which are then repaired.
pub const HELD_MAX: usize = 4096;
/// Longest a listed digest waits for its datagram (one that comes after its list).
pub const LISTED_KEEP: Duration = Duration::from_secs(1);
/// Listed digests waiting for their datagram at most.
pub const LISTED_MAX: usize = 65_536;

/// A SHA-256 digest of a datagram as sent.
pub type DatagramDigest = [u8; DIGEST_LEN];

/// How a level-2 sender authenticates its multicast datagrams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MacSigning {
    /// An Ed25519 signature on every datagram: what the reference sends and requires.
    Datagram,
    /// Signed digest lists (this module): ldm7 receivers only.
    #[default]
    Lists,
}

impl std::str::FromStr for MacSigning {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "datagram" => Ok(Self::Datagram),
            "lists" => Ok(Self::Lists),
            other => Err(format!(
                "level-2 signing must be \"lists\" (signed digest lists, ldm7 receivers only) or \"datagram\" \
                 (a signature on each datagram, as the reference), not {other:?}"
            )),
        }
    }
}

impl std::fmt::Display for MacSigning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Datagram => "datagram",
            Self::Lists => "lists",
        })
    }
}

/// Whether a datagram carries no MAC trailer: exactly its header and `payloadlen` bytes.
pub fn is_unsigned(datagram: &[u8]) -> bool {
    datagram.len() >= HEADER_LEN
        && datagram.len() == HEADER_LEN + usize::from(u16::from_be_bytes([datagram[8], datagram[9]]))
}

/// Whether a message (header and payload) is a DIGESTS list.
fn is_list(message: &[u8]) -> bool {
    message.len() >= HEADER_LEN && u16::from_be_bytes([message[10], message[11]]) == DIGESTS_FLAGS
}

/// The digests a (verified) DIGESTS message lists, or `None` if its payload is not a whole
/// number of digests.
fn listed_digests(message: &[u8]) -> Option<impl Iterator<Item = &DatagramDigest>> {
    let payload = &message[HEADER_LEN..];
    payload
        .len()
        .is_multiple_of(DIGEST_LEN)
        .then(|| payload.chunks_exact(DIGEST_LEN).filter_map(|digest| <&DatagramDigest>::try_from(digest).ok()))
}

/// The sender's side: the digests of datagrams sent and not yet listed.
#[derive(Debug, Default)]
pub struct DigestLister {
    digests: Vec<DatagramDigest>,
    /// When the oldest of them was sent.
    first: Option<Instant>,
    /// The next list's number.
    sequence: u32,
}

impl DigestLister {
    /// Nothing listed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the digest of `message` (header and payload, as multicast); `true` when the list
    /// is full and is to be sent now ([`DigestLister::emit`]).
    pub fn push(&mut self, now: Instant, message: &[u8]) -> bool {
        self.digests.push(Sha256::digest(message).into());
        self.first.get_or_insert(now);
        self.digests.len() >= LIST_LEN_MAX
    }

    /// Whether no digest waits.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// When the waiting digests are to be sent though the list is not full.
    pub fn due(&self) -> Option<Instant> {
        self.first.map(|first| first + LIST_WAIT)
    }

    /// Lists sent so far.
    pub fn lists_sent(&self) -> u32 {
        self.sequence
    }

    /// Writes the DIGESTS datagram of the waiting digests, signed with `key`, into `out` (which
    /// it clears), and starts a new list. Nothing is written when no digest waits.
    pub fn emit(&mut self, key: &SenderKey, out: &mut Vec<u8>) {
        out.clear();
        if self.digests.is_empty() {
            return;
        }
        let payload_len = u16::try_from(self.digests.len() * DIGEST_LEN).expect("a list fits a datagram");
        out.extend_from_slice(&self.sequence.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&payload_len.to_be_bytes());
        out.extend_from_slice(&DIGESTS_FLAGS.to_be_bytes());
        for digest in self.digests.drain(..) {
            out.extend_from_slice(&digest);
        }
        key.sign_in_place(out);
        self.first = None;
        self.sequence = self.sequence.wrapping_add(1);
    }
}

/// What a receiver counts of list signing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListCounters {
    /// Lists that verified.
    pub lists: u64,
    /// Unsigned datagrams dropped because no verified list named them in time (their list was
    /// lost, or they were forged).
    pub unlisted: u64,
}

/// A receiver's side: unsigned datagrams waiting for their list, and listed digests waiting for
/// their datagram.
#[derive(Debug, Default)]
pub struct ListedDatagrams {
    held: std::collections::HashMap<DatagramDigest, Vec<u8>, FixedState>,
    held_order: VecDeque<(Instant, DatagramDigest)>,
    listed: std::collections::HashMap<DatagramDigest, Instant, FixedState>,
    listed_order: VecDeque<(Instant, DatagramDigest)>,
    counters: ListCounters,
}

impl ListedDatagrams {
    /// Its counters.
    pub fn counters(&self) -> ListCounters {
        self.counters
    }

    /// Unsigned datagrams held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Drops what waited too long.
    fn expire(&mut self, now: Instant) {
        while let Some((at, digest)) = self.held_order.front().copied() {
            if now.saturating_duration_since(at) < HOLD && self.held_order.len() <= HELD_MAX {
                break;
            }
            self.held_order.pop_front();
            // Handed on already when its list came (the order keeps every one it held).
            if self.held.remove(&digest).is_some() {
                self.counters.unlisted += 1;
            }
        }
        while let Some((at, digest)) = self.listed_order.front().copied() {
            if now.saturating_duration_since(at) < LISTED_KEEP && self.listed_order.len() <= LISTED_MAX {
                break;
            }
            self.listed_order.pop_front();
            if self.listed.get(&digest).is_some_and(|listed| *listed == at) {
                self.listed.remove(&digest);
            }
        }
    }

    /// An unsigned datagram: handed on if listed already, else held.
    fn unsigned(&mut self, now: Instant, datagram: &[u8], deliver: &mut impl FnMut(&[u8])) {
        let digest: DatagramDigest = Sha256::digest(datagram).into();
        if self.listed.remove(&digest).is_some() {
            deliver(datagram);
            return;
        }
        if self.held.insert(digest, datagram.to_vec()).is_none() {
            self.held_order.push_back((now, digest));
            if self.held_order.len() > HELD_MAX {
                self.expire(now);
            }
        }
    }

    /// A verified list: hands on, in its order, the datagrams it names that are held; keeps the
    /// other digests for their datagrams.
    fn list<'a>(
        &mut self,
        now: Instant,
        digests: impl Iterator<Item = &'a DatagramDigest>,
        deliver: &mut impl FnMut(&[u8]),
    ) {
        self.counters.lists += 1;
        for digest in digests {
            if let Some(datagram) = self.held.remove(digest) {
                deliver(&datagram);
            } else if self.listed.insert(*digest, now).is_none() {
                self.listed_order.push_back((now, *digest));
            }
        }
        if self.listed_order.len() > LISTED_MAX {
            self.expire(now);
        }
    }
}

/// What [`KeyRing::check_batch`] refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refused {
    /// Datagrams whose MAC did not verify.
    pub bad_mac: u64,
    /// Unsigned datagrams dropped since the last batch: no verified list named them in time.
    pub unlisted: u64,
}

impl KeyRing {
    /// Checks the datagrams of one read and hands each authentic message (header and payload)
    /// to `deliver`, in the order they came (a datagram held for its list, when the list
    /// comes). Signed datagrams are checked as [`KeyRing::verify_batch`] does; at level 2,
    /// unsigned datagrams wait for a verified DIGESTS list that names them (module docs).
    pub fn check_batch(&mut self, now: Instant, datagrams: &[&[u8]], mut deliver: impl FnMut(&[u8])) -> Refused {
        let unlisted_before = self.lists.counters.unlisted;
        self.lists.expire(now);
        let mut refused = Refused::default();
        let lists = self.level() == MacLevel::Ed25519;
        let signed: Vec<&[u8]> =
            datagrams.iter().copied().filter(|datagram| !(lists && is_unsigned(datagram))).collect();
        let mut results = self.verify_batch(now, &signed).into_iter();
        for datagram in datagrams {
            if lists && is_unsigned(datagram) {
                self.lists.unsigned(now, datagram, &mut deliver);
                continue;
            }
            match results.next().unwrap_or(Err(MacError::Mismatch)) {
                Err(_) => refused.bad_mac += 1,
                Ok(message) if !is_list(message) => deliver(message),
                Ok(message) => match listed_digests(message) {
                    Some(digests) if lists => self.lists.list(now, digests, &mut deliver),
                    // A list below level 2, or a malformed one, is no product message.
                    _ => refused.bad_mac += 1,
                },
            }
        }
        refused.unlisted = self.lists.counters.unlisted - unlisted_before;
        refused
    }

    /// What list signing counted.
    pub fn list_counters(&self) -> ListCounters {
        self.lists.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mac::Verifier;
    use rand_core::OsRng;

    fn message(index: u32, seqnum: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&index.to_be_bytes());
        out.extend_from_slice(&seqnum.to_be_bytes());
        out.extend_from_slice(&u16::try_from(payload.len()).expect("short").to_be_bytes());
        out.extend_from_slice(&0x0004u16.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn ring(key: &SenderKey) -> KeyRing {
        KeyRing::new(Verifier::from_material(key.level(), &key.material()).expect("material"))
    }

    fn run(ring: &mut KeyRing, now: Instant, datagrams: &[Vec<u8>]) -> (Vec<Vec<u8>>, Refused) {
        let mut out = Vec::new();
        let batch: Vec<&[u8]> = datagrams.iter().map(Vec::as_slice).collect();
        let refused = ring.check_batch(now, &batch, |message| out.push(message.to_vec()));
        (out, refused)
    }

    #[test]
    fn a_list_releases_the_datagrams_it_names_in_order_and_the_ones_after_it_at_once() {
        let key = SenderKey::generate(MacLevel::Ed25519, &mut OsRng);
        let mut lister = DigestLister::new();
        let t0 = Instant::ZERO;
        let messages: Vec<Vec<u8>> = (0..40u32).map(|k| message(7, k * 1384, &[k as u8; 100])).collect();
        let mut wire = Vec::new();
        let mut list = Vec::new();
        for message in &messages {
            wire.push(message.clone());
            if lister.push(t0, message) {
                lister.emit(&key, &mut list);
                wire.push(list.clone());
            }
        }
        assert_eq!(lister.due(), Some(t0 + LIST_WAIT));
        lister.emit(&key, &mut list);
        assert!(lister.is_empty() && lister.due().is_none() && lister.lists_sent() == 2);
        assert_eq!(list.len(), HEADER_LEN + 8 * DIGEST_LEN + 64);
        let mut ring = ring(&key);
        // Up to the first list: 32 held, then all handed on in order.
        let (out, refused) = run(&mut ring, t0, &wire[..32]);
        assert!(out.is_empty() && refused == Refused::default());
        let (out, _) = run(&mut ring, t0, &wire[32..33]);
        assert_eq!(out, messages[..32]);
        // The second list before its datagrams (as the parity socket may bring them).
        let (out, _) = run(&mut ring, t0, std::slice::from_ref(&list));
        assert!(out.is_empty());
        let (out, _) = run(&mut ring, t0, &wire[33..]);
        assert_eq!(out, messages[32..]);
        assert_eq!(ring.list_counters(), ListCounters { lists: 2, unlisted: 0 });
    }

    #[test]
    fn forged_datagrams_and_lists_are_refused_and_unlisted_ones_expire() {
        let key = SenderKey::generate(MacLevel::Ed25519, &mut OsRng);
        let mallory = SenderKey::generate(MacLevel::Ed25519, &mut OsRng);
        let t0 = Instant::ZERO;
        let genuine = message(1, 0, b"genuine");
        let forged = message(1, 0, b"forged!");
        // Mallory lists her datagram with her own key: the list fails its check.
        let mut forged_list = Vec::new();
        let mut lister = DigestLister::new();
        lister.push(t0, &forged);
        lister.emit(&mallory, &mut forged_list);
        let mut list = Vec::new();
        lister.push(t0, &genuine);
        lister.emit(&key, &mut list);
        let mut ring = ring(&key);
        let (out, refused) = run(&mut ring, t0, &[forged.clone(), forged_list, genuine.clone(), list]);
        assert_eq!(out, vec![genuine.clone()]);
        assert_eq!(refused.bad_mac, 1);
        // The forged datagram was held; it expires unlisted.
        let (out, refused) = run(&mut ring, t0 + HOLD, &[]);
        assert!(out.is_empty());
        assert_eq!(refused.unlisted, 1);
        // A list whose datagram was changed on the way does not release it.
        let mut changed = genuine.clone();
        changed[HEADER_LEN] ^= 1;
        let mut again = Vec::new();
        lister.push(t0, &genuine);
        lister.emit(&key, &mut again);
        let (out, _) = run(&mut ring, t0 + HOLD, &[changed, again]);
        assert!(out.is_empty());
    }

    #[test]
    fn signed_datagrams_still_verify_alone_so_a_sender_may_switch() {
        let key = SenderKey::generate(MacLevel::Ed25519, &mut OsRng);
        let t0 = Instant::ZERO;
        let first = message(2, 0, b"signed each");
        let mut signed = first.clone();
        key.sign_in_place(&mut signed);
        let listed = message(2, 1384, b"listed");
        let mut list = Vec::new();
        let mut lister = DigestLister::new();
        lister.push(t0, &listed);
        lister.emit(&key, &mut list);
        let mut ring = ring(&key);
        let (out, refused) = run(&mut ring, t0, &[signed, listed.clone(), list]);
        assert_eq!(out, vec![first, listed]);
        assert_eq!(refused, Refused::default());
    }

    #[test]
    fn below_level_2_an_unsigned_datagram_is_refused_as_before() {
        let key = SenderKey::generate(MacLevel::Hmac, &mut OsRng);
        let mut ring = ring(&key);
        let (out, refused) = run(&mut ring, Instant::ZERO, &[message(3, 0, b"no mac")]);
        assert!(out.is_empty());
        assert_eq!(refused.bad_mac, 1);
    }

    #[test]
    fn a_flood_of_unlisted_datagrams_is_bounded() {
        let key = SenderKey::generate(MacLevel::Ed25519, &mut OsRng);
        let mut ring = ring(&key);
        let flood: Vec<Vec<u8>> = (0..(HELD_MAX as u32 + 100)).map(|k| message(9, k, b"junk")).collect();
        let (out, refused) = run(&mut ring, Instant::ZERO, &flood);
        assert!(out.is_empty());
        assert_eq!(refused.unlisted, 100);
        assert!(ring.lists.held() <= HELD_MAX);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_datagrams_never_panic_and_never_pass_without_the_key(
            datagrams in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..1600), 0..40),
            flags in proptest::collection::vec(proptest::num::u16::ANY, 40),
        ) {
            let key = SenderKey::generate(MacLevel::Ed25519, &mut OsRng);
            let mut ring = ring(&key);
            // Some of them made to look like lists and like unsigned datagrams.
            let datagrams: Vec<Vec<u8>> = datagrams
                .into_iter()
                .zip(flags)
                .map(|(mut datagram, flags)| {
                    if datagram.len() >= HEADER_LEN {
                        let payload_len = u16::try_from(datagram.len() - HEADER_LEN).unwrap_or(0);
                        if flags % 3 == 0 {
                            datagram[8..10].copy_from_slice(&payload_len.to_be_bytes());
                        }
                        if flags % 5 == 0 {
                            datagram[10..12].copy_from_slice(&DIGESTS_FLAGS.to_be_bytes());
                        }
                    }
                    datagram
                })
                .collect();
            let (out, _) = run(&mut ring, Instant::ZERO, &datagrams);
            proptest::prop_assert!(out.is_empty());
        }
    }

    #[test]
    fn signing_parses_and_says_what_it_takes() {
        assert_eq!("lists".parse::<MacSigning>(), Ok(MacSigning::Lists));
        assert_eq!("datagram".parse::<MacSigning>(), Ok(MacSigning::Datagram));
        assert!("both".parse::<MacSigning>().unwrap_err().contains("\"lists\""));
    }
}
