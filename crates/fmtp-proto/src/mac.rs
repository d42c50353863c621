//! FMTP message authentication and its key exchange (ldm7-multicast.md §3.6–§3.7), sans-IO.
//!
//! The reference's mechanism, byte-compatible:
//! * MAC levels, chosen on both ends (the reference reads `FMTP_MAC_LEVEL`; not negotiated):
//!   0 none, 1 HMAC-SHA-256 (32-byte MAC, 64-byte random key), 2 Ed25519 (64-byte signature;
//!   the key handed out is the PEM SubjectPublicKeyInfo of the sender's Ed25519 key). The MAC
//!   covers header and payload and trails the multicast datagram; TCP messages carry none.
//! * Right after the repair connection opens, even at level 0: the receiver sends a fresh
//!   RSA-2048 public key (PEM, PKCS#1, `-----BEGIN RSA PUBLIC KEY-----`), the sender answers
//!   with the RSA-OAEP (SHA-1, MGF1-SHA-1, no label: OpenSSL's `RSA_PKCS1_OAEP_PADDING`)
//!   encryption of the key material — empty at level 0, still a 256-byte ciphertext.
//!
//! Beyond the reference (an ldm7 extension, off unless both ends are configured for it): that
//! exchange is unauthenticated, so a man in the middle of the repair connection can hand out a
//! key of its own. A publisher with a long-term Ed25519 identity key appends to its answer a
//! signature of [`PINNED_CONTEXT`] ‖ the receiver's offer ‖ the ciphertext; a receiver that pins
//! the publisher's public key accepts only an answer whose signature verifies (the offer is
//! fresh per connection, so an old answer cannot be replayed). A receiver that pins nothing
//! ignores the signature, and a reference receiver cannot read such an answer: turn identities on
//! only where every receiver is ldm7.
//!
//! Key rotation (the same extension's second part, on only where every receiver is ldm7): the
//! sender makes a new key, seals it to each connected receiver's offer of this connection
//! ([`OfferKey::seal_update`], signed with the identity like the answer, over the epoch too) in a
//! KEY_UPDATE message on the repair connection, and signs with it once every receiver
//! acknowledged it (KEY_ACK) or a deadline passed. A receiver's [`KeyRing`] checks datagrams with
//! its current key, then the announced next one (the first datagram that verifies with it makes
//! it current, and so does the announcement of the key after it: a sender rotates again only
//! after its switch), then, for a grace period, the previous one (datagrams still in flight).
//!
//! Key material is zeroized after use ([`Zeroizing`]; the Ed25519 and RSA keys zeroize on drop).
//! Well-kept RustCrypto crates do the cryptography (`rsa`, `hmac`, `sha2`, `ed25519-dalek`).

use ed25519_dalek::hazmat::ExpandedSecretKey;
use ed25519_dalek::pkcs8::{DecodePublicKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier as _, VerifyingKey};
use hmac::{Hmac, Mac};
use rand_core::{CryptoRngCore, RngCore};
use rsa::pkcs1::{DecodeRsaPublicKey, EncodeRsaPublicKey, LineEnding};
use rsa::{Oaep, RsaPrivateKey, RsaPublicKey};
use sha2::{Sha256, Sha512};
use zeroize::Zeroizing;

use crate::Instant;
use std::time::Duration;

/// The shortest interval between MAC key rotations (the ldm7 extension).
pub const MAC_ROTATION_MIN: Duration = Duration::from_secs(1);

/// Bytes of a level-1 key.
pub const HMAC_KEY_LEN: usize = 64;
/// Bytes of a level-1 MAC.
pub const HMAC_LEN: usize = 32;
/// Bytes of a level-2 MAC (an Ed25519 signature).
pub const SIGNATURE_LEN: usize = 64;
/// Bits of the receiver's RSA key.
pub const RSA_BITS: usize = 2048;
/// Bytes of the sender's answer: an RSA-2048 ciphertext.
pub const CIPHERTEXT_LEN: usize = RSA_BITS / 8;
/// What a publisher's identity signs before the offer and the ciphertext (the extension).
pub const PINNED_CONTEXT: &[u8] = b"ldm7 FMTP key answer v1\0";
/// What a publisher's identity signs before the offer, the epoch and the ciphertext of a key
/// update (the rotation extension).
pub const UPDATE_CONTEXT: &[u8] = b"ldm7 FMTP key update v1\0";

/// A MAC level (§3.7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MacLevel {
    /// No MAC (the reference's default).
    #[default]
    None,
    /// HMAC-SHA-256 with a 64-byte random key.
    Hmac,
    /// Ed25519 signatures; receivers get the public key.
    Ed25519,
}

impl MacLevel {
    /// The level of its number (0, 1, 2).
    pub const fn from_number(number: u8) -> Option<Self> {
        match number {
            0 => Some(Self::None),
            1 => Some(Self::Hmac),
            2 => Some(Self::Ed25519),
            _ => None,
        }
    }

    /// Its number, as `FMTP_MAC_LEVEL` writes it.
    pub const fn number(self) -> u8 {
        match self {
            Self::None => 0,
            Self::Hmac => 1,
            Self::Ed25519 => 2,
        }
    }

    /// Bytes of the MAC trailing each multicast datagram.
    pub const fn mac_len(self) -> usize {
        match self {
            Self::None => 0,
            Self::Hmac => HMAC_LEN,
            Self::Ed25519 => SIGNATURE_LEN,
        }
    }
}

impl std::str::FromStr for MacLevel {
    type Err = MacError;

    fn from_str(text: &str) -> Result<Self, MacError> {
        text.trim().parse::<u8>().ok().and_then(Self::from_number).ok_or_else(|| MacError::BadLevel(text.to_owned()))
    }
}

impl std::fmt::Display for MacLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Self::None => "0 (no MAC)",
            Self::Hmac => "1 (HMAC-SHA-256)",
            Self::Ed25519 => "2 (Ed25519)",
        };
        f.write_str(name)
    }
}

/// Why authentication or the key exchange failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    /// Not a level.
    #[error("FMTP MAC level must be 0 (none), 1 (HMAC-SHA-256) or 2 (Ed25519), not {0:?}")]
    BadLevel(String),
    /// A datagram too short to carry its MAC.
    #[error("FMTP datagram of {len} bytes is too short for a {mac_len}-byte MAC")]
    Short {
        /// The datagram's length.
        len: usize,
        /// The MAC's.
        mac_len: usize,
    },
    /// The MAC does not verify: forged, damaged, or made with another key.
    #[error("FMTP datagram MAC does not verify")]
    Mismatch,
    /// The receiver's offer is not a PEM RSA public key of the right size.
    #[error("the FMTP key offer is not a PEM PKCS#1 RSA-{RSA_BITS} public key: {0}")]
    BadOffer(String),
    /// The sender's answer cannot be opened with this connection's key.
    #[error("the FMTP key answer cannot be decrypted with this connection's RSA key: {0}")]
    BadAnswer(String),
    /// The key material is of another level than this end's.
    #[error(
        "the FMTP sender uses MAC level {sender} and this receiver MAC level {receiver}: set the same \
         level on both ends (ldm7: mac_level in [multicast] and [receive] of the settings file, or \
         --mac-level of `ldm7 fmtp`; the reference LDM-7: FMTP_MAC_LEVEL)"
    )]
    LevelMismatch {
        /// The level the material is of.
        sender: MacLevel,
        /// This receiver's.
        receiver: MacLevel,
    },
    /// Pinning is on and the answer is not signed by the pinned publisher key.
    #[error(
        "the FMTP key answer is not signed by the pinned publisher key{0}: a man in the middle, or \
         the wrong key pinned"
    )]
    NotPinned(&'static str),
    /// The RSA operation failed.
    #[error("RSA: {0}")]
    Rsa(String),
    /// A key update whose epoch is not after the newest one known (a replay).
    #[error("FMTP key update of epoch {epoch} after epoch {newest}: refused (a replay)")]
    StaleEpoch {
        /// The update's.
        epoch: u32,
        /// The newest known.
        newest: u32,
    },
}

/// The sender's key for one session: signs every multicast datagram.
pub struct SenderKey {
    level: MacLevel,
    hmac: Option<Zeroizing<[u8; HMAC_KEY_LEN]>>,
    signing: Option<Ed25519Key>,
}

/// A level-2 key ready to sign: the secret key expanded once (SHA-512 of the seed, clamped; what
/// `SigningKey::sign` derives again for every message) and the public key.
struct Ed25519Key {
    expanded: ExpandedSecretKey,
    verifying: VerifyingKey,
}

impl Ed25519Key {
    fn new(signing: &SigningKey) -> Self {
        Self { expanded: ExpandedSecretKey::from(signing.as_bytes()), verifying: signing.verifying_key() }
    }

    /// The Ed25519 signature of `message` (RFC 8032; the same bytes `SigningKey::sign` makes).
    fn sign(&self, message: &[u8]) -> [u8; SIGNATURE_LEN] {
        ed25519_dalek::hazmat::raw_sign::<Sha512>(&self.expanded, message, &self.verifying).to_bytes()
    }
}

impl std::fmt::Debug for SenderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderKey").field("level", &self.level).finish_non_exhaustive()
    }
}

impl SenderKey {
    /// A fresh key of `level`.
    pub fn generate(level: MacLevel, rng: &mut impl CryptoRngCore) -> Self {
        match level {
            MacLevel::None => Self { level, hmac: None, signing: None },
            MacLevel::Hmac => {
                let mut key = Zeroizing::new([0u8; HMAC_KEY_LEN]);
                rng.fill_bytes(key.as_mut());
                Self { level, hmac: Some(key), signing: None }
            }
            MacLevel::Ed25519 => {
                let signing = SigningKey::generate(rng);
                Self { level, hmac: None, signing: Some(Ed25519Key::new(&signing)) }
            }
        }
    }

    /// The level.
    pub fn level(&self) -> MacLevel {
        self.level
    }

    /// What receivers are given (§3.7): nothing, the 64 key bytes, or the PEM
    /// SubjectPublicKeyInfo of the Ed25519 public key.
    pub fn material(&self) -> Zeroizing<Vec<u8>> {
        match (&self.hmac, &self.signing) {
            (Some(key), _) => Zeroizing::new(key.to_vec()),
            (None, Some(signing)) => Zeroizing::new(
                signing
                    .verifying
                    .to_public_key_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
                    .expect("an Ed25519 public key encodes")
                    .into_bytes(),
            ),
            (None, None) => Zeroizing::new(Vec::new()),
        }
    }

    /// Appends the MAC of the message `datagram` holds (header and payload) to it.
    pub fn sign_in_place(&self, datagram: &mut Vec<u8>) {
        match (&self.hmac, &self.signing) {
            (None, None) => {}
            (Some(key), _) => {
                let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_ref()).expect("HMAC takes any key length");
                mac.update(datagram);
                datagram.extend_from_slice(&mac.finalize().into_bytes());
            }
            (None, Some(signing)) => {
                let signature = signing.sign(datagram);
                datagram.extend_from_slice(&signature);
            }
        }
    }

    /// Appends the MAC of `message` (header and payload, as sent) to `out`.
    pub fn append_mac(&self, message: &[u8], out: &mut Vec<u8>) {
        match (&self.hmac, &self.signing) {
            (Some(key), _) => {
                let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_ref()).expect("HMAC takes any key length");
                mac.update(message);
                out.extend_from_slice(&mac.finalize().into_bytes());
            }
            (None, Some(signing)) => out.extend_from_slice(&signing.sign(message)),
            (None, None) => {}
        }
    }
}

/// A receiver's check of multicast datagrams, from the key material the sender handed out.
pub struct Verifier {
    level: MacLevel,
    hmac: Option<Zeroizing<Vec<u8>>>,
    verifying: Option<VerifyingKey>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("level", &self.level).finish_non_exhaustive()
    }
}

impl Verifier {
    /// The check for `level` from the sender's key material; material of another level (the
    /// two ends disagree) is refused, saying which level the sender uses.
    pub fn from_material(level: MacLevel, material: &[u8]) -> Result<Self, MacError> {
        let sender = material_level(material);
        if sender != level {
            return Err(MacError::LevelMismatch { sender, receiver: level });
        }
        Ok(match level {
            MacLevel::None => Self { level, hmac: None, verifying: None },
            MacLevel::Hmac => Self { level, hmac: Some(Zeroizing::new(material.to_vec())), verifying: None },
            MacLevel::Ed25519 => {
                let pem = std::str::from_utf8(material).map_err(|error| MacError::BadAnswer(error.to_string()))?;
                let key =
                    VerifyingKey::from_public_key_pem(pem).map_err(|error| MacError::BadAnswer(error.to_string()))?;
                Self { level, hmac: None, verifying: Some(key) }
            }
        })
    }

    /// The level.
    pub fn level(&self) -> MacLevel {
        self.level
    }

    /// Splits a datagram into the message (header and payload) and its trailing MAC.
    fn split<'a>(&self, datagram: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), MacError> {
        let mac_len = self.level.mac_len();
        if datagram.len() < mac_len {
            return Err(MacError::Short { len: datagram.len(), mac_len });
        }
        Ok(datagram.split_at(datagram.len() - mac_len))
    }

    /// Checks a datagram's trailing MAC; returns the message it covers (header and payload).
    pub fn verify<'a>(&self, datagram: &'a [u8]) -> Result<&'a [u8], MacError> {
        let (message, mac) = self.split(datagram)?;
        match (&self.hmac, &self.verifying) {
            (Some(key), _) => {
                let mut check = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
                check.update(message);
                check.verify_slice(mac).map_err(|_| MacError::Mismatch)?;
            }
            (None, Some(key)) => {
                let signature = Signature::from_slice(mac).map_err(|_| MacError::Mismatch)?;
                key.verify(message, &signature).map_err(|_| MacError::Mismatch)?;
            }
            (None, None) => {}
        }
        Ok(message)
    }
}

impl Verifier {
    /// Whether every one of `datagrams` carries a level-2 signature of this key, checked as one
    /// Ed25519 batch (ed25519-dalek's `verify_batch`: one multiscalar multiplication for all,
    /// about half the work of checking each; see [`KeyRing::verify_batch`]). `false` says only
    /// that at least one does not (or that this is not a level-2 key): which ones, a check of
    /// each says.
    fn verify_all(&self, datagrams: &[&[u8]]) -> bool {
        let Some(key) = &self.verifying else { return false };
        let mut messages = Vec::with_capacity(datagrams.len());
        let mut signatures = Vec::with_capacity(datagrams.len());
        for datagram in datagrams {
            let Ok((message, mac)) = self.split(datagram) else { return false };
            let Ok(signature) = Signature::from_slice(mac) else { return false };
            messages.push(message);
            signatures.push(signature);
        }
        let keys = vec![*key; datagrams.len()];
        ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok()
    }
}

/// The level key material is of (see [`SenderKey::material`]).
fn material_level(material: &[u8]) -> MacLevel {
    if material.is_empty() {
        MacLevel::None
    } else if material.starts_with(b"-----BEGIN PUBLIC KEY-----") {
        MacLevel::Ed25519
    } else {
        MacLevel::Hmac
    }
}

/// A receiver's side of the exchange: a fresh RSA-2048 key for one connection.
pub struct KeyOffer {
    private: RsaPrivateKey,
    pem: Vec<u8>,
}

impl std::fmt::Debug for KeyOffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyOffer").field("pem_len", &self.pem.len()).finish_non_exhaustive()
    }
}

impl KeyOffer {
    /// A fresh key (tens of milliseconds: do it off a latency-sensitive thread).
    pub fn generate(rng: &mut impl CryptoRngCore) -> Result<Self, MacError> {
        let private = RsaPrivateKey::new(rng, RSA_BITS).map_err(|error| MacError::Rsa(error.to_string()))?;
        let pem = RsaPublicKey::from(&private)
            .to_pkcs1_pem(LineEnding::LF)
            .map_err(|error| MacError::Rsa(error.to_string()))?
            .into_bytes();
        Ok(Self { private, pem })
    }

    /// The blob to send: the public key as PEM (PKCS#1).
    pub fn pem(&self) -> &[u8] {
        &self.pem
    }

    /// Opens the sender's answer: the key material. With `pin`, the answer must carry a
    /// signature by that publisher key (the extension); without, a signature is ignored.
    pub fn open(&self, answer: &[u8], pin: Option<&VerifyingKey>) -> Result<Zeroizing<Vec<u8>>, MacError> {
        self.open_signed(answer, pin, |ciphertext| signed_answer(&self.pem, ciphertext))
    }

    /// Opens a KEY_UPDATE's sealed key of `epoch` (see [`OfferKey::seal_update`]), with the
    /// same rule for the publisher's signature as [`KeyOffer::open`].
    pub fn open_update(
        &self,
        epoch: u32,
        sealed: &[u8],
        pin: Option<&VerifyingKey>,
    ) -> Result<Zeroizing<Vec<u8>>, MacError> {
        self.open_signed(sealed, pin, |ciphertext| signed_update(&self.pem, epoch, ciphertext))
    }

    fn open_signed(
        &self,
        answer: &[u8],
        pin: Option<&VerifyingKey>,
        signed: impl Fn(&[u8]) -> Vec<u8>,
    ) -> Result<Zeroizing<Vec<u8>>, MacError> {
        let ciphertext = match (answer.len(), pin) {
            (CIPHERTEXT_LEN, None) => answer,
            (CIPHERTEXT_LEN, Some(_)) => return Err(MacError::NotPinned(" (the answer is not signed at all)")),
            (len, pin) if len == CIPHERTEXT_LEN + SIGNATURE_LEN => {
                let (ciphertext, signature) = answer.split_at(CIPHERTEXT_LEN);
                if let Some(pin) = pin {
                    let signature = Signature::from_slice(signature).map_err(|_| MacError::NotPinned(""))?;
                    pin.verify(&signed(ciphertext), &signature).map_err(|_| MacError::NotPinned(""))?;
                }
                ciphertext
            }
            (len, _) => {
                return Err(MacError::BadAnswer(format!("{len} bytes, not {CIPHERTEXT_LEN}")));
            }
        };
        self.private
            .decrypt(Oaep::new::<sha1::Sha1>(), ciphertext)
            .map(Zeroizing::new)
            .map_err(|error| MacError::BadAnswer(error.to_string()))
    }
}

/// The sender's side of the exchange: the answer to a receiver's offer (the encrypted key
/// material; with an identity, followed by its signature — the extension).
pub fn answer_offer(
    offer: &[u8],
    material: &[u8],
    identity: Option<&SigningKey>,
    rng: &mut impl CryptoRngCore,
) -> Result<Vec<u8>, MacError> {
    OfferKey::parse(offer)?.answer(material, identity, rng)
}

/// A receiver's offer as the sender keeps it for the connection: it answers with the key at the
/// connection's start and seals each later key to it.
pub struct OfferKey {
    public: RsaPublicKey,
    offer: Vec<u8>,
}

impl std::fmt::Debug for OfferKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfferKey").field("offer_len", &self.offer.len()).finish_non_exhaustive()
    }
}

impl OfferKey {
    /// Reads a receiver's offer: a PEM PKCS#1 RSA-2048 public key.
    pub fn parse(offer: &[u8]) -> Result<Self, MacError> {
        let pem = std::str::from_utf8(offer).map_err(|error| MacError::BadOffer(error.to_string()))?;
        let public = RsaPublicKey::from_pkcs1_pem(pem).map_err(|error| MacError::BadOffer(error.to_string()))?;
        if rsa::traits::PublicKeyParts::size(&public) != CIPHERTEXT_LEN {
            return Err(MacError::BadOffer(format!("a {}-bit key", rsa::traits::PublicKeyParts::size(&public) * 8)));
        }
        Ok(Self { public, offer: offer.to_vec() })
    }

    /// The answer that opens the connection (§3.7), signed by `identity` when given.
    pub fn answer(
        &self,
        material: &[u8],
        identity: Option<&SigningKey>,
        rng: &mut impl CryptoRngCore,
    ) -> Result<Vec<u8>, MacError> {
        self.seal(material, identity, rng, |ciphertext| signed_answer(&self.offer, ciphertext))
    }

    /// A KEY_UPDATE's payload: the key material of `epoch`, encrypted to this offer, signed by
    /// `identity` (over [`UPDATE_CONTEXT`], the offer, the epoch and the ciphertext) when given.
    pub fn seal_update(
        &self,
        epoch: u32,
        material: &[u8],
        identity: Option<&SigningKey>,
        rng: &mut impl CryptoRngCore,
    ) -> Result<Vec<u8>, MacError> {
        self.seal(material, identity, rng, |ciphertext| signed_update(&self.offer, epoch, ciphertext))
    }

    fn seal(
        &self,
        material: &[u8],
        identity: Option<&SigningKey>,
        rng: &mut impl CryptoRngCore,
        signed: impl Fn(&[u8]) -> Vec<u8>,
    ) -> Result<Vec<u8>, MacError> {
        let mut sealed = self
            .public
            .encrypt(rng, Oaep::new::<sha1::Sha1>(), material)
            .map_err(|error| MacError::Rsa(error.to_string()))?;
        if let Some(identity) = identity {
            let signature = identity.sign(&signed(&sealed));
            sealed.extend_from_slice(&signature.to_bytes());
        }
        Ok(sealed)
    }
}

fn signed_answer(offer: &[u8], ciphertext: &[u8]) -> Vec<u8> {
    [PINNED_CONTEXT, offer, ciphertext].concat()
}

fn signed_update(offer: &[u8], epoch: u32, ciphertext: &[u8]) -> Vec<u8> {
    [UPDATE_CONTEXT, offer, &epoch.to_be_bytes(), ciphertext].concat()
}

/// A receiver's keys across rotations: the current one, the next one its sender announced, and
/// the previous one for a grace period after the switch.
#[derive(Debug)]
pub struct KeyRing {
    current: Verifier,
    /// The epoch of the current key (`None`: the key of the connection's start, whose epoch the
    /// exchange does not say).
    epoch: Option<u32>,
    next: Option<(u32, Verifier)>,
    previous: Option<(Verifier, Instant)>,
    grace: Duration,
    /// The last batch [`KeyRing::verify_batch`] checked held a refused datagram: the next one
    /// is checked datagram by datagram.
    batch_refused: bool,
    /// Level 2's signed digest lists ([`crate::lists`]).
    pub(crate) lists: crate::lists::ListedDatagrams,
}

impl KeyRing {
    /// Datagrams signed with the previous key still verify this long after the switch.
    pub const GRACE: Duration = Duration::from_secs(10);

    /// Datagrams [`KeyRing::verify_batch`] checks as one Ed25519 batch at most: a longer batch
    /// saves little more per signature, and the check of each after a failed batch (a forged or
    /// damaged datagram, a key switch) costs the more the longer it is.
    pub const BATCH_MAX: usize = 32;

    /// The ring of a connection's first key.
    pub fn new(current: Verifier) -> Self {
        Self {
            current,
            epoch: None,
            next: None,
            previous: None,
            grace: Self::GRACE,
            batch_refused: false,
            lists: crate::lists::ListedDatagrams::default(),
        }
    }

    /// The current key's epoch (`None` before the first rotation).
    pub fn epoch(&self) -> Option<u32> {
        self.epoch
    }

    /// The level.
    pub fn level(&self) -> MacLevel {
        self.current.level
    }

    /// Takes the announced key of `epoch` at `now`; an epoch not after the newest one known (a
    /// replay) is refused.
    ///
    /// A sender announces a key only once it signs with the one announced before (it rotates
    /// again only after the switch). So a key still announced here, that no datagram has
    /// verified with yet (none came since the switch, or all were lost), becomes current now,
    /// the current one previous: without this, datagrams signed with it before the sender's
    /// next switch would fail their check.
    pub fn announce(&mut self, now: Instant, epoch: u32, next: Verifier) -> Result<(), MacError> {
        let newest = self.next.as_ref().map(|(epoch, _)| *epoch).or(self.epoch);
        if newest.is_some_and(|newest| epoch <= newest) {
            return Err(MacError::StaleEpoch { epoch, newest: newest.unwrap_or_default() });
        }
        if next.level != self.current.level {
            return Err(MacError::LevelMismatch { sender: next.level, receiver: self.current.level });
        }
        if let Some((announced, key)) = self.next.replace((epoch, next)) {
            self.switch_to(now, announced, key);
        }
        Ok(())
    }

    /// The announced key of `epoch` becomes current; the current one verifies for the grace
    /// period.
    fn switch_to(&mut self, now: Instant, epoch: u32, key: Verifier) {
        let previous = std::mem::replace(&mut self.current, key);
        self.previous = Some((previous, now + self.grace));
        self.epoch = Some(epoch);
    }

    /// Checks a datagram with the current key, then the next (which becomes current when it
    /// verifies), then the previous within its grace period.
    pub fn verify<'a>(&mut self, now: Instant, datagram: &'a [u8]) -> Result<&'a [u8], MacError> {
        let error = match self.current.verify(datagram) {
            Ok(message) => return Ok(message),
            Err(error) => error,
        };
        if let Some(message) = self.next.as_ref().and_then(|(_, next)| next.verify(datagram).ok()) {
            let (epoch, next) = self.next.take().expect("checked above");
            self.switch_to(now, epoch, next);
            return Ok(message);
        }
        match &self.previous {
            Some((previous, until)) if now < *until => previous.verify(datagram),
            _ => Err(error),
        }
    }

    /// Checks datagrams, in order, with the results and key switches [`KeyRing::verify`] makes
    /// checking each in turn: the message each covers, or why it was refused.
    ///
    /// At level 2, up to [`KeyRing::BATCH_MAX`] datagrams at a time are first checked together
    /// with the current key (an Ed25519 batch verification: about half the work of checking each
    /// alone). When the batch does not verify (a datagram forged, damaged, signed with the next
    /// or the previous key, or too short), each of its datagrams is checked alone, as
    /// [`KeyRing::verify`] does, so that exactly the bad ones are refused; and so are the
    /// datagrams of the batches after one that held a refused datagram, until a batch has none:
    /// a stream of forged datagrams, one in every batch, then costs what checking each alone
    /// costs, not that and a failed batch check too. Levels 0 and 1 check each datagram alone.
    ///
    /// The batch equation is ed25519-dalek's (random coefficients drawn from a transcript of the
    /// batch; no cofactor): a batch verifies only if each signature does, except with negligible
    /// probability, for anyone without the secret key. Only the key's holder — the sender
    /// itself — could make a signature that a batch accepts and a check alone refuses (a
    /// non-canonical or small-order R), which says nothing false about who sent the datagram.
    pub fn verify_batch<'a>(&mut self, now: Instant, datagrams: &[&'a [u8]]) -> Vec<Result<&'a [u8], MacError>> {
        let mut results = Vec::with_capacity(datagrams.len());
        for batch in datagrams.chunks(Self::BATCH_MAX) {
            let together = self.current.level == MacLevel::Ed25519 && batch.len() > 1 && !self.batch_refused;
            if together && self.current.verify_all(batch) {
                let mac_len = self.current.level.mac_len();
                results.extend(batch.iter().map(|datagram| Ok(&datagram[..datagram.len() - mac_len])));
                continue;
            }
            let first = results.len();
            results.extend(batch.iter().map(|datagram| self.verify(now, datagram)));
            self.batch_refused = results[first..].iter().any(Result::is_err);
        }
        results
    }
}

/// Fills `bytes` from the operating system's random source.
pub fn os_random(bytes: &mut [u8]) {
    rand_core::OsRng.fill_bytes(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::OsRng;

    #[test]
    fn levels_parse_and_refuse_others() {
        assert_eq!("2".parse::<MacLevel>(), Ok(MacLevel::Ed25519));
        assert_eq!(" 0 ".parse::<MacLevel>(), Ok(MacLevel::None));
        assert!(matches!("3".parse::<MacLevel>(), Err(MacError::BadLevel(_))));
        assert_eq!(MacLevel::Hmac.mac_len(), 32);
    }

    #[test]
    fn each_level_signs_and_verifies_and_any_change_fails() {
        let message = b"\0\0\0\x07\0\0\0\0\0\x03\0\x04abc";
        for level in [MacLevel::None, MacLevel::Hmac, MacLevel::Ed25519] {
            let key = SenderKey::generate(level, &mut OsRng);
            let verifier = Verifier::from_material(level, &key.material()).expect("material of its level");
            let mut datagram = message.to_vec();
            key.append_mac(message, &mut datagram);
            assert_eq!(datagram.len(), message.len() + level.mac_len());
            assert_eq!(verifier.verify(&datagram), Ok(&message[..]));
            if level != MacLevel::None {
                for at in [0, 5, message.len(), datagram.len() - 1] {
                    let mut forged = datagram.clone();
                    forged[at] ^= 1;
                    assert_eq!(verifier.verify(&forged), Err(MacError::Mismatch), "level {level}, byte {at}");
                }
                let other = SenderKey::generate(level, &mut OsRng);
                let mut foreign = message.to_vec();
                other.append_mac(message, &mut foreign);
                assert_eq!(verifier.verify(&foreign), Err(MacError::Mismatch));
            }
        }
    }

    #[test]
    fn the_exchange_hands_the_material_over_and_says_when_levels_differ() {
        let offer = KeyOffer::generate(&mut OsRng).expect("key");
        let pem = std::str::from_utf8(offer.pem()).expect("text");
        assert!(pem.starts_with("-----BEGIN RSA PUBLIC KEY-----\n") && pem.ends_with("-----END RSA PUBLIC KEY-----\n"));
        assert_eq!(offer.pem().len(), 426, "the reference's offer is 426 bytes (capture fmtp-ldm7)");
        for level in [MacLevel::None, MacLevel::Hmac, MacLevel::Ed25519] {
            let key = SenderKey::generate(level, &mut OsRng);
            let answer = answer_offer(offer.pem(), &key.material(), None, &mut OsRng).expect("answer");
            assert_eq!(answer.len(), CIPHERTEXT_LEN, "level {level}");
            let material = offer.open(&answer, None).expect("open");
            assert_eq!(*material, *key.material());
            assert!(Verifier::from_material(level, &material).is_ok());
            let other = if level == MacLevel::Hmac { MacLevel::None } else { MacLevel::Hmac };
            assert_eq!(
                Verifier::from_material(other, &material).err(),
                Some(MacError::LevelMismatch { sender: level, receiver: other })
            );
        }
    }

    #[test]
    fn a_pinned_identity_detects_a_swapped_answer() {
        let identity = SigningKey::generate(&mut OsRng);
        let offer = KeyOffer::generate(&mut OsRng).expect("key");
        let key = SenderKey::generate(MacLevel::Hmac, &mut OsRng);
        let answer = answer_offer(offer.pem(), &key.material(), Some(&identity), &mut OsRng).expect("answer");
        assert_eq!(answer.len(), CIPHERTEXT_LEN + SIGNATURE_LEN);
        let pin = identity.verifying_key();
        assert_eq!(*offer.open(&answer, Some(&pin)).expect("pinned"), *key.material());
        // A man in the middle answers with a key of its own (it cannot sign as the publisher).
        let mallory = SenderKey::generate(MacLevel::Hmac, &mut OsRng);
        let swapped = answer_offer(offer.pem(), &mallory.material(), None, &mut OsRng).expect("answer");
        assert!(matches!(offer.open(&swapped, Some(&pin)), Err(MacError::NotPinned(_))));
        let impostor = SigningKey::generate(&mut OsRng);
        let signed = answer_offer(offer.pem(), &mallory.material(), Some(&impostor), &mut OsRng).expect("answer");
        assert!(matches!(offer.open(&signed, Some(&pin)), Err(MacError::NotPinned(_))));
        // Without a pin the swap goes unnoticed (the reference's exchange).
        assert_eq!(*offer.open(&swapped, None).expect("unpinned"), *mallory.material());
        // An answer made for another offer does not verify either.
        let other_offer = KeyOffer::generate(&mut OsRng).expect("key");
        let replayed = answer_offer(other_offer.pem(), &key.material(), Some(&identity), &mut OsRng).expect("answer");
        assert!(offer.open(&replayed, Some(&pin)).is_err());
    }

    #[test]
    fn a_rotated_key_takes_over_with_its_first_datagram_and_the_old_one_lasts_its_grace() {
        let identity = SigningKey::generate(&mut OsRng);
        let pin = identity.verifying_key();
        let offer = KeyOffer::generate(&mut OsRng).expect("key");
        let sealed_to = OfferKey::parse(offer.pem()).expect("offer");
        for level in [MacLevel::Hmac, MacLevel::Ed25519] {
            let first = SenderKey::generate(level, &mut OsRng);
            let answer = sealed_to.answer(&first.material(), Some(&identity), &mut OsRng).expect("answer");
            let verifier = Verifier::from_material(level, &offer.open(&answer, Some(&pin)).expect("open")).expect("v");
            let mut ring = KeyRing::new(verifier);
            let signed = |key: &SenderKey| {
                let mut datagram = b"\0\0\0\x01\0\0\0\0\0\0\0\x02".to_vec();
                key.sign_in_place(&mut datagram);
                datagram
            };
            let t0 = Instant::ZERO;
            assert!(ring.verify(t0, &signed(&first)).is_ok());
            // The next key is announced; datagrams of the first still verify, then the first of
            // the next makes it current.
            let second = SenderKey::generate(level, &mut OsRng);
            let update = sealed_to.seal_update(1, &second.material(), Some(&identity), &mut OsRng).expect("seal");
            assert!(
                matches!(offer.open_update(2, &update, Some(&pin)), Err(MacError::NotPinned(_))),
                "epoch is signed"
            );
            let material = offer.open_update(1, &update, Some(&pin)).expect("open update");
            ring.announce(t0, 1, Verifier::from_material(level, &material).expect("v")).expect("announce");
            assert!(ring.verify(t0, &signed(&first)).is_ok());
            assert_eq!(ring.epoch(), None);
            assert!(ring.verify(t0, &signed(&second)).is_ok());
            assert_eq!(ring.epoch(), Some(1));
            // The first key, within the grace period and after it; a foreign key never.
            assert!(ring.verify(t0 + KeyRing::GRACE / 2, &signed(&first)).is_ok());
            assert_eq!(ring.verify(t0 + KeyRing::GRACE, &signed(&first)), Err(MacError::Mismatch));
            let foreign = SenderKey::generate(level, &mut OsRng);
            assert_eq!(ring.verify(t0, &signed(&foreign)), Err(MacError::Mismatch));
            // A replayed (old) epoch is refused; so is an update of another level.
            let again = Verifier::from_material(level, &second.material()).expect("v");
            assert!(matches!(ring.announce(t0, 1, again), Err(MacError::StaleEpoch { epoch: 1, newest: 1 })));
            let other = SenderKey::generate(MacLevel::None, &mut OsRng);
            let other = Verifier::from_material(MacLevel::None, &other.material()).expect("v");
            assert!(matches!(ring.announce(t0, 2, other), Err(MacError::LevelMismatch { .. })));
            // An update signed by someone else is refused with a pin.
            let impostor = SigningKey::generate(&mut OsRng);
            let forged = sealed_to.seal_update(5, &foreign.material(), Some(&impostor), &mut OsRng).expect("seal");
            assert!(matches!(offer.open_update(5, &forged, Some(&pin)), Err(MacError::NotPinned(_))));
        }
    }

    /// The sender announces a key only once it signs with the one before: a key announced and
    /// never seen in a datagram (an idle or lossy spell after the switch) is the sender's when
    /// the next is announced, and its datagrams still verify.
    #[test]
    fn a_key_announced_and_not_yet_seen_is_current_when_the_next_is_announced() {
        for level in [MacLevel::Hmac, MacLevel::Ed25519] {
            let keys: Vec<SenderKey> = (0..3).map(|_| SenderKey::generate(level, &mut OsRng)).collect();
            let verifier = |key: &SenderKey| Verifier::from_material(level, &key.material()).expect("material");
            let signed = |key: &SenderKey| {
                let mut datagram = b"\0\0\0\x01\0\0\0\0\0\0\0\x02".to_vec();
                key.sign_in_place(&mut datagram);
                datagram
            };
            let t0 = Instant::ZERO;
            let mut ring = KeyRing::new(verifier(&keys[0]));
            ring.announce(t0, 1, verifier(&keys[1])).expect("epoch 1");
            // No datagram of epoch 1 arrives before epoch 2 is announced.
            ring.announce(t0, 2, verifier(&keys[2])).expect("epoch 2");
            assert_eq!(ring.epoch(), Some(1));
            assert!(ring.verify(t0, &signed(&keys[1])).is_ok(), "level {level}: the sender's key now");
            assert!(ring.verify(t0, &signed(&keys[0])).is_ok(), "level {level}: in flight, within the grace");
            assert!(ring.verify(t0, &signed(&keys[2])).is_ok(), "level {level}: the next key");
            assert_eq!(ring.epoch(), Some(2));
            assert!(ring.verify(t0, &signed(&keys[1])).is_ok(), "level {level}: previous, within the grace");
            assert_eq!(ring.verify(t0 + KeyRing::GRACE, &signed(&keys[1])), Err(MacError::Mismatch));
            assert_eq!(ring.verify(t0, &signed(&keys[0])), Err(MacError::Mismatch), "level {level}: two keys back");
            assert!(matches!(ring.announce(t0, 2, verifier(&keys[2])), Err(MacError::StaleEpoch { .. })));
        }
    }

    /// A datagram of `seed` signed with `key`.
    fn signed_datagram(key: &SenderKey, seed: usize) -> Vec<u8> {
        let mut datagram = b"\0\0\0\x01\0\0\0\0\0\0\0\x10payload.".to_vec();
        datagram[4..8].copy_from_slice(&(seed as u32).to_be_bytes());
        key.sign_in_place(&mut datagram);
        datagram
    }

    fn ring_of(key: &SenderKey) -> KeyRing {
        KeyRing::new(Verifier::from_material(key.level(), &key.material()).expect("material of its level"))
    }

    #[test]
    fn the_expanded_sender_key_signs_as_ed25519_does() {
        // The same bytes as the RFC 8032 signature of the key's seed (SigningKey::sign): what
        // a reference receiver checks.
        let signing = SigningKey::generate(&mut OsRng);
        let key = SenderKey { level: MacLevel::Ed25519, hmac: None, signing: Some(Ed25519Key::new(&signing)) };
        let message = b"\0\0\0\x07\0\0\0\0\0\x03\0\x04abc";
        let mut datagram = message.to_vec();
        key.sign_in_place(&mut datagram);
        assert_eq!(datagram[message.len()..], signing.sign(message).to_bytes());
        let mut appended = message.to_vec();
        key.append_mac(message, &mut appended);
        assert_eq!(appended, datagram);
    }

    #[test]
    fn a_batch_of_good_datagrams_verifies() {
        for level in [MacLevel::None, MacLevel::Hmac, MacLevel::Ed25519] {
            let key = SenderKey::generate(level, &mut OsRng);
            let mut ring = ring_of(&key);
            // Over two batches and a lone one.
            let datagrams: Vec<Vec<u8>> =
                (0..2 * KeyRing::BATCH_MAX + 1).map(|seed| signed_datagram(&key, seed)).collect();
            let slices: Vec<&[u8]> = datagrams.iter().map(Vec::as_slice).collect();
            let results = ring.verify_batch(Instant::ZERO, &slices);
            assert_eq!(results.len(), datagrams.len());
            for (datagram, result) in datagrams.iter().zip(&results) {
                assert_eq!(*result, Ok(&datagram[..datagram.len() - level.mac_len()]), "level {level}");
            }
            assert!(ring.verify_batch(Instant::ZERO, &[]).is_empty());
        }
    }

    #[test]
    fn a_forged_datagram_in_a_batch_is_refused_and_only_it() {
        for level in [MacLevel::Hmac, MacLevel::Ed25519] {
            let key = SenderKey::generate(level, &mut OsRng);
            let foreign = SenderKey::generate(level, &mut OsRng);
            for bad in [0, 17, KeyRing::BATCH_MAX - 1] {
                let mut datagrams: Vec<Vec<u8>> =
                    (0..KeyRing::BATCH_MAX).map(|seed| signed_datagram(&key, seed)).collect();
                for (kind, datagram) in [
                    ("a byte of the message", {
                        let mut forged = datagrams[bad].clone();
                        forged[5] ^= 0x40;
                        forged
                    }),
                    ("a byte of the MAC", {
                        let mut forged = datagrams[bad].clone();
                        *forged.last_mut().expect("not empty") ^= 1;
                        forged
                    }),
                    ("another key", signed_datagram(&foreign, bad)),
                    ("the signature only", datagrams[bad][datagrams[bad].len() - level.mac_len()..].to_vec()),
                ] {
                    let good = std::mem::replace(&mut datagrams[bad], datagram);
                    let slices: Vec<&[u8]> = datagrams.iter().map(Vec::as_slice).collect();
                    let results = ring_of(&key).verify_batch(Instant::ZERO, &slices);
                    for (at, result) in results.iter().enumerate() {
                        if at == bad {
                            assert!(result.is_err(), "level {level}, {kind} at {at}: refused");
                            let alone = ring_of(&key).verify(Instant::ZERO, slices[at]);
                            assert_eq!(*result, alone, "level {level}, {kind}: the error of a check alone");
                        } else {
                            assert!(result.is_ok(), "level {level}, {kind} at {bad}: {at} verifies");
                        }
                    }
                    datagrams[bad] = good;
                }
            }
            // Too short to carry a MAC.
            let short = [0u8; 10];
            let good = signed_datagram(&key, 1);
            let results = ring_of(&key).verify_batch(Instant::ZERO, &[&good, &short, &good]);
            assert_eq!(results[1], Err(MacError::Short { len: 10, mac_len: level.mac_len() }));
            assert!(results[0].is_ok() && results[2].is_ok());
        }
    }

    /// Batches after one with a forged datagram are checked one by one until one has none; the
    /// results are those of checks one by one throughout.
    #[test]
    fn batches_after_a_forged_one_give_the_same_results() {
        let key = SenderKey::generate(MacLevel::Ed25519, &mut OsRng);
        let mut ring = ring_of(&key);
        let mut seed = 0;
        // Forged datagrams at these positions of each call's datagrams (one call per line).
        let calls: [&[usize]; 7] = [&[], &[3], &[40], &[], &[], &[0, 31, 32, 63], &[]];
        for (call, forged) in calls.iter().enumerate() {
            let datagrams: Vec<Vec<u8>> = (0..2 * KeyRing::BATCH_MAX)
                .map(|at| {
                    seed += 1;
                    let mut datagram = signed_datagram(&key, seed);
                    if forged.contains(&at) {
                        datagram[13] ^= 0x80;
                    }
                    datagram
                })
                .collect();
            let slices: Vec<&[u8]> = datagrams.iter().map(Vec::as_slice).collect();
            let results = ring.verify_batch(Instant::ZERO, &slices);
            for (at, result) in results.iter().enumerate() {
                let expected = if forged.contains(&at) {
                    Err(MacError::Mismatch)
                } else {
                    Ok(&slices[at][..slices[at].len() - 64])
                };
                assert_eq!(*result, expected, "call {call}, datagram {at}");
            }
        }
    }

    /// Key rotation through batches: the same results and the same switches as checking each
    /// datagram in turn.
    #[test]
    fn a_batch_rotates_keys_as_checks_one_by_one_do() {
        for level in [MacLevel::Hmac, MacLevel::Ed25519] {
            let keys: Vec<SenderKey> = (0..4).map(|_| SenderKey::generate(level, &mut OsRng)).collect();
            let verifier = |key: usize| Verifier::from_material(level, &keys[key].material()).expect("material");
            // Datagrams by key (3: never handed out); `None`: a forged one of key 0.
            let datagrams = |plan: &[Option<usize>]| -> Vec<Vec<u8>> {
                plan.iter()
                    .enumerate()
                    .map(|(seed, key)| match key {
                        Some(key) => signed_datagram(&keys[*key], seed),
                        None => {
                            let mut forged = signed_datagram(&keys[0], seed);
                            forged[9] ^= 1;
                            forged
                        }
                    })
                    .collect()
            };
            let t0 = Instant::ZERO;
            let steps: Vec<(Instant, Option<u32>, Vec<Option<usize>>)> = vec![
                (t0, None, vec![Some(0); 5]),
                // Key 1 announced; the sender switches in the middle of a batch, with a datagram
                // of key 0 still in flight after it and a forged one.
                (t0, Some(1), vec![Some(0), Some(0), Some(1), Some(0), None, Some(1), Some(3), Some(1)]),
                // All of key 1 (one batch), then key 0 within its grace, then after it.
                (t0, None, vec![Some(1); KeyRing::BATCH_MAX]),
                (t0 + KeyRing::GRACE / 2, None, vec![Some(1), Some(0), Some(1)]),
                (t0 + KeyRing::GRACE, None, vec![Some(0), Some(1), Some(0)]),
                // Key 2 announced and key 3 never: its first datagram opens a batch.
                (t0 + KeyRing::GRACE, Some(2), vec![Some(2), Some(1), Some(2), Some(3), Some(0)]),
            ];
            let mut one_by_one = KeyRing::new(verifier(0));
            let mut batched = KeyRing::new(verifier(0));
            for (step, (now, announced, plan)) in steps.iter().enumerate() {
                if let Some(epoch) = announced {
                    one_by_one.announce(*now, *epoch, verifier(*epoch as usize)).expect("announce");
                    batched.announce(*now, *epoch, verifier(*epoch as usize)).expect("announce");
                }
                let datagrams = datagrams(plan);
                let slices: Vec<&[u8]> = datagrams.iter().map(Vec::as_slice).collect();
                let expected: Vec<_> = slices.iter().map(|datagram| one_by_one.verify(*now, datagram)).collect();
                assert_eq!(batched.verify_batch(*now, &slices), expected, "level {level}, step {step}");
                assert_eq!(batched.epoch(), one_by_one.epoch(), "level {level}, step {step}");
            }
            assert_eq!(batched.epoch(), Some(2));
        }
    }

    #[test]
    fn bad_offers_and_answers_are_refused() {
        assert!(matches!(
            answer_offer(
                b"-----BEGIN RSA PUBLIC KEY-----\nldm7\n-----END RSA PUBLIC KEY-----\n",
                b"",
                None,
                &mut OsRng
            ),
            Err(MacError::BadOffer(_))
        ));
        assert!(matches!(answer_offer(&[0xff; 10], b"", None, &mut OsRng), Err(MacError::BadOffer(_))));
        let offer = KeyOffer::generate(&mut OsRng).expect("key");
        assert!(matches!(offer.open(&[0; 10], None), Err(MacError::BadAnswer(_))));
        assert!(matches!(offer.open(&[0; CIPHERTEXT_LEN], None), Err(MacError::BadAnswer(_))));
        let verifier =
            Verifier::from_material(MacLevel::Ed25519, &SenderKey::generate(MacLevel::Ed25519, &mut OsRng).material())
                .expect("verifier");
        assert_eq!(verifier.verify(&[0; 10]), Err(MacError::Short { len: 10, mac_len: 64 }));
    }
}
