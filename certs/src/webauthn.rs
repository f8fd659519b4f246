//! People's passkeys (WebAuthn Level 2/3): the challenges a person's device
//! signs, the check of a new credential ([`verify_registration`]) and the
//! check of a signature made with one ([`verify_assertion`]).
//!
//! Sans-IO: bytes in, a verdict out. The control plane calls
//! [`verify_registration`] when a person enrols a passkey and
//! [`verify_assertion`] when they sign in; the gateway calls
//! [`verify_assertion`] itself on every decision a person signs, with the
//! public keys the session's open carried, so neither the relay nor the
//! store can release a held request in a person's name. One implementation
//! for both, with aws-lc's signature checks and a small CBOR reader of its
//! own (`cbor`: definite lengths only, bounded in depth and size, no
//! panics: fuzzed by `fuzz/fuzz_targets/webauthn.rs`).
//!
//! # Challenges
//!
//! A challenge is 32 raw bytes; `clientDataJSON` carries it in base64url
//! without padding (RFC 4648 §5), and the check compares that text with the
//! expected challenge's encoding byte for byte.
//!
//! - **Sign-in and enrolment**: 32 random bytes the server issues, single
//!   use, two minutes' life (the server's business, not this module's).
//! - **A decision** on a card ([`decision_challenge`]):
//!
//!   ```text
//!   SHA-256("talos-webauthn-v1" 0x00 "decision" 0x00 card_digest_hex 0x00 verdict)
//!   ```
//!
//!   where `card_digest_hex` is the card's [`proposal_digest`](crate::proposal_digest)
//!   as its 96 lowercase hex digits (ASCII) and `verdict` is
//!   [`Verdict::as_str`] (`approved` or `declined`). The digest already
//!   covers the proposal id, gateway, session, attempt and times, so the
//!   challenge is unique per card and per verdict: a signature over
//!   "approved" is not one over "declined", nor over another card.
//! - **A command** a person starts (Revoke All, …) ([`command_challenge`]):
//!
//!   ```text
//!   SHA-256("talos-webauthn-v1" 0x00 "command" 0x00 command 0x00 session_id 0x00 nonce_hex)
//!   ```
//!
//!   with `command` a fixed word such as `revoke_all`, the session id, and
//!   a single-use nonce of 16 random bytes the server issued, as 32
//!   lowercase hex digits.
//!
//! Every field is UTF-8 text with no NUL byte (hex digits, a fixed word, a
//! session id of letters, digits, `-`, `_` and `.`), so the NUL separators
//! make the encoding injective: no two field lists give the same bytes.
//! An auditor recomputes either challenge, and its `clientDataJSON` form,
//! with Python's standard library alone (a test runs exactly these lines):
//!
//! ```python
//! import base64, hashlib
//!
//! def decision_challenge(card_digest_hex: str, verdict: str) -> bytes:
//!     return hashlib.sha256(b"talos-webauthn-v1\0decision\0" + card_digest_hex.encode()
//!                           + b"\0" + verdict.encode()).digest()
//!
//! def command_challenge(command: str, session_id: str, nonce_hex: str) -> bytes:
//!     return hashlib.sha256(b"talos-webauthn-v1\0command\0" + command.encode() + b"\0"
//!                           + session_id.encode() + b"\0" + nonce_hex.encode()).digest()
//!
//! def client_data_challenge(challenge: bytes) -> str:
//!     return base64.urlsafe_b64encode(challenge).rstrip(b"=").decode()
//! ```
//!
//! # Registration
//!
//! [`verify_registration`] takes what `navigator.credentials.create`
//! returned (`attestationObject`, `clientDataJSON`) and the [`Expected`]
//! challenge, rp id and origin, and checks, in this order (the first
//! failure is the refusal):
//!
//! 1. `clientDataJSON`: at most [`MAX_CLIENT_DATA_LEN`] bytes of one JSON
//!    object with string `type`, `challenge` and `origin` (each once; other
//!    members are allowed, as the spec requires, and `tokenBinding` and
//!    `topOrigin` are not read); `type` is `webauthn.create`; `challenge`
//!    is the expected one; `origin` is the configured origin, byte for
//!    byte; `crossOrigin` is absent or `false` (the web app is never framed).
//! 2. `attestationObject`: at most [`MAX_ATTESTATION_OBJECT_LEN`] bytes of
//!    one CBOR map with a text `fmt`, a map `attStmt` and a byte string
//!    `authData` (each once; other keys are read past).
//! 3. The authenticator data ([`MAX_AUTHENTICATOR_DATA_LEN`]): the rp id
//!    hash, flags and sign count, then, with the AT flag (required), the
//!    AAGUID, a credential id of 1 to [`MAX_CREDENTIAL_ID_LEN`] bytes and a
//!    COSE key of an accepted algorithm (ES256, EdDSA, RS256: see
//!    [`CoseAlgorithm`]); then, with the ED flag, one CBOR map of
//!    extensions; nothing after. BS without BE is refused.
//! 4. The rp id hash is SHA-256 of the rp id; UP and UV are both set.
//! 5. The attestation statement: `none` with an empty statement, or
//!    `packed` self-attestation (no `x5c`; `alg` the credential's own; the
//!    signature over `authData || SHA-256(clientDataJSON)` verifies under
//!    the new credential's key). Every other format (and `packed` with a
//!    certificate chain) is refused as unsupported: the web app asks for
//!    attestation `none`, and nothing here judges an authenticator's maker.
//!
//! With `none`, nothing signs the registration: the credential is trusted
//! because it arrived over the enrolment link's TLS connection, within the
//! challenge's life. That is what "attestation none" means.
//!
//! # Assertion
//!
//! [`verify_assertion`] takes what `navigator.credentials.get` returned
//! ([`Assertion`]), the [`Expected`] values and the stored credential the
//! assertion names ([`find_credential`] picks it from several), and checks:
//!
//! 1. the credential id is the stored credential's (`unknown_credential`);
//! 2. `clientDataJSON` as for registration (`malformed`), `type` is
//!    `webauthn.get` (`wrong_type`), the challenge (`challenge_mismatch`:
//!    covers another card and the other verdict), the origin and no
//!    `crossOrigin: true` (`origin_mismatch`);
//! 3. the authenticator data: 37 bytes, or more with the ED flag and one
//!    CBOR map of extensions; no AT flag; not BS without BE (`malformed`);
//!    the rp id hash (`rp_id_mismatch`); UP (`user_not_present`); UV
//!    (`user_not_verified`);
//! 4. the signature over `authenticatorData || SHA-256(clientDataJSON)`
//!    under the stored COSE key (`bad_signature`);
//! 5. the sign count: if the stored and the new count are both 0 the
//!    authenticator keeps no count and nothing is checked; otherwise the
//!    new count must exceed the stored one, which the caller keeps as the
//!    highest seen (`sign_count_replayed`).
//!
//! The user handle is not checked: the credential id names the key, and
//! the caller's list says whose key it is. The BE flag is not compared with
//! registration's (nothing stores it for the gateway).
//!
//! # A person's decision
//!
//! [`verify_person`] is the gateway's whole check of a decision a person
//! signed: the decision's assertion decoded from its base64url fields, the
//! card it carries being the card the gateway holds, the credential one of
//! the keys the session's open listed, of an approver the card's rule names
//! and the decision's `approver`, then [`verify_assertion`] over
//! [`decision_challenge`]`(card digest, verdict)`. Its refusals are the
//! same names (`no_assertion` for a decision without one).
//!
//! # Limits
//!
//! Every input is bounded before it is parsed: [`MAX_CLIENT_DATA_LEN`],
//! [`MAX_ATTESTATION_OBJECT_LEN`], [`MAX_AUTHENTICATOR_DATA_LEN`],
//! [`MAX_CREDENTIAL_ID_LEN`], [`MAX_SIGNATURE_LEN`],
//! [`MAX_USER_HANDLE_LEN`], [`MAX_PUBLIC_KEY_LEN`]. CBOR nests at most 16
//! deep. Memory is the inputs (borrowed) plus a few short strings from
//! `clientDataJSON`; CPU is one SHA-256 of each input and one signature
//! check (see `benches/benches/webauthn.rs`).

mod cbor;
mod cose;
mod person;
#[cfg(any(test, feature = "test-util"))]
pub mod soft;

use std::borrow::Cow;
use std::fmt;

use aws_lc_rs::digest::{digest, SHA256};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Deserialize;

use self::cbor::{CborError, Key, Keys, Reader};
use self::cose::PublicKey;
use crate::approval::Verdict;
use crate::digest::lower_hex;

pub use self::cose::{CoseAlgorithm, KeyError};
pub use self::person::{verify_person, ApproverKey, PersonVerified, RelyingParty};

/// The largest `clientDataJSON` parsed: 4 KiB. Browsers send 100–300 bytes
/// (type, challenge, origin, crossOrigin, perhaps topOrigin and a member
/// of their own); sixteen times that is room for any client, and small
/// enough that a forged one costs nothing to refuse.
pub const MAX_CLIENT_DATA_LEN: usize = 4 * 1024;

/// The largest authenticator data parsed: 4 KiB. An assertion's is 37
/// bytes plus extensions; a registration's adds an AAGUID, a credential id
/// (at most 1,023 bytes) and a COSE key (an 8192-bit RSA key is about
/// 1,040 bytes), which is still under 2.2 KiB.
pub const MAX_AUTHENTICATOR_DATA_LEN: usize = 4 * 1024;

/// The largest `attestationObject` parsed: 16 KiB. With attestation `none`
/// it is the authenticator data and a few bytes; a `packed` statement adds
/// a signature, and one with a certificate chain (refused, but read)
/// several kilobytes.
pub const MAX_ATTESTATION_OBJECT_LEN: usize = 16 * 1024;

/// The longest credential id: 1,023 bytes (WebAuthn Level 3, §6.5.1).
pub const MAX_CREDENTIAL_ID_LEN: usize = 1023;

/// The longest signature: 1,024 bytes, an 8192-bit RSA signature (ES256's
/// DER is at most 72 bytes, Ed25519's 64).
pub const MAX_SIGNATURE_LEN: usize = 1024;

/// The longest user handle: 64 bytes (WebAuthn §5.4.3).
pub const MAX_USER_HANDLE_LEN: usize = 64;

/// The longest stored COSE public key: 2 KiB, room for an 8192-bit RSA key.
pub const MAX_PUBLIC_KEY_LEN: usize = 2 * 1024;

/// The length of the authenticator data before its optional parts: the rp
/// id hash (32), the flags (1) and the sign count (4).
const AUTH_DATA_FIXED_LEN: usize = 37;

const TYPE_CREATE: &str = "webauthn.create";
const TYPE_GET: &str = "webauthn.get";

/// The challenge a person's device signs to decide a card: see the
/// module's "Challenges".
///
/// `card_digest_hex` is the card's [`proposal_digest`](crate::proposal_digest)
/// (96 lowercase hex digits); it must hold no NUL byte, which a hex digest
/// cannot.
pub fn decision_challenge(card_digest_hex: &str, verdict: Verdict) -> [u8; 32] {
    challenge(&[
        b"decision",
        card_digest_hex.as_bytes(),
        verdict.as_str().as_bytes(),
    ])
}

/// The challenge a person's device signs to start a command on a session
/// (`revoke_all`, …): see the module's "Challenges".
///
/// No argument may hold a NUL byte: a command is a fixed word, a session id
/// is letters, digits, `-`, `_` and `.`, and the nonce is hex.
pub fn command_challenge(command: &str, session_id: &str, nonce_hex: &str) -> [u8; 32] {
    challenge(&[
        b"command",
        command.as_bytes(),
        session_id.as_bytes(),
        nonce_hex.as_bytes(),
    ])
}

/// SHA-256 of the domain and the fields, each after a NUL.
fn challenge(fields: &[&[u8]]) -> [u8; 32] {
    let mut message = b"talos-webauthn-v1".to_vec();
    for field in fields {
        message.push(0);
        message.extend_from_slice(field);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, &message).as_ref());
    out
}

/// What the relying party expects of a ceremony: the challenge it issued
/// (or computed), its rp id and its origin.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Expected<'a> {
    /// The raw challenge (32 bytes here; at least 16 by the spec).
    pub challenge: &'a [u8],
    /// The rp id: a DNS name, e.g. `people.talos.test`.
    pub rp_id: &'a str,
    /// The origin exactly as `clientDataJSON` must carry it, e.g.
    /// `https://people.talos.test:8443`.
    pub origin: &'a str,
}

impl fmt::Debug for Expected<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Expected")
            .field("challenge", &lower_hex(self.challenge))
            .field("rp_id", &self.rp_id)
            .field("origin", &self.origin)
            .finish()
    }
}

/// The flags byte of authenticator data (WebAuthn §6.1).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flags(u8);

impl Flags {
    /// User present.
    pub const UP: u8 = 0x01;
    /// User verified (PIN, biometrics).
    pub const UV: u8 = 0x04;
    /// Backup eligible: the credential may be synced.
    pub const BE: u8 = 0x08;
    /// Backed up: the credential is synced now.
    pub const BS: u8 = 0x10;
    /// Attested credential data follows.
    pub const AT: u8 = 0x40;
    /// Extensions follow.
    pub const ED: u8 = 0x80;

    /// The flags of a byte.
    pub const fn from_bits(bits: u8) -> Flags {
        Flags(bits)
    }

    /// The byte.
    pub const fn bits(self) -> u8 {
        self.0
    }

    const fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    /// UP.
    pub const fn user_present(self) -> bool {
        self.has(Flags::UP)
    }

    /// UV.
    pub const fn user_verified(self) -> bool {
        self.has(Flags::UV)
    }

    /// BE.
    pub const fn backup_eligible(self) -> bool {
        self.has(Flags::BE)
    }

    /// BS.
    pub const fn backed_up(self) -> bool {
        self.has(Flags::BS)
    }
}

impl fmt::Debug for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Flags({:#04x}", self.0)?;
        for (bit, name) in [
            (Flags::UP, "UP"),
            (Flags::UV, "UV"),
            (Flags::BE, "BE"),
            (Flags::BS, "BS"),
            (Flags::AT, "AT"),
            (Flags::ED, "ED"),
        ] {
            if self.has(bit) {
                write!(f, " {name}")?;
            }
        }
        f.write_str(")")
    }
}

/// How a registration was attested.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Attestation {
    /// `none`: nothing signs the registration.
    None,
    /// `packed` self-attestation: the new credential's own key signed it.
    PackedSelf,
}

impl Attestation {
    /// `none` or `packed_self`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Attestation::None => "none",
            Attestation::PackedSelf => "packed_self",
        }
    }
}

/// A newly registered credential: what the store keeps. Nothing here is
/// secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The credential id (1 to [`MAX_CREDENTIAL_ID_LEN`] bytes).
    pub id: Vec<u8>,
    /// The COSE public key, exactly as the authenticator data carried it:
    /// what [`StoredCredential::public_key_cose`] takes back.
    pub public_key_cose: Vec<u8>,
    /// The key's algorithm.
    pub alg: CoseAlgorithm,
    /// The sign count at registration.
    pub sign_count: u32,
    /// BE: the credential may be synced to other devices.
    pub backup_eligible: bool,
    /// BS: the credential is synced now.
    pub backed_up: bool,
    /// The authenticator's model (all zeros when the browser hides it, as
    /// it does with attestation `none`).
    pub aaguid: [u8; 16],
    /// How the registration was attested.
    pub attestation: Attestation,
}

impl Credential {
    /// The credential as [`verify_assertion`] takes it.
    pub fn stored(&self) -> StoredCredential<'_> {
        StoredCredential {
            id: &self.id,
            public_key_cose: &self.public_key_cose,
            sign_count: self.sign_count,
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("id", &lower_hex(&self.id))
            .field("public_key_cose", &ByteCount(self.public_key_cose.len()))
            .field("alg", &self.alg.as_str())
            .field("sign_count", &self.sign_count)
            .field("backup_eligible", &self.backup_eligible)
            .field("backed_up", &self.backed_up)
            .field("aaguid", &lower_hex(&self.aaguid))
            .field("attestation", &self.attestation.as_str())
            .finish()
    }
}

/// A credential as the verifier of an assertion holds it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StoredCredential<'a> {
    /// The credential id.
    pub id: &'a [u8],
    /// The COSE public key ([`Credential::public_key_cose`]).
    pub public_key_cose: &'a [u8],
    /// The highest sign count seen so far (0 at first).
    pub sign_count: u32,
}

impl fmt::Debug for StoredCredential<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredCredential")
            .field("id", &lower_hex(self.id))
            .field("public_key_cose", &ByteCount(self.public_key_cose.len()))
            .field("sign_count", &self.sign_count)
            .finish()
    }
}

/// What `navigator.credentials.get` returned, as the relay forwards it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Assertion<'a> {
    /// The credential's id (`rawId`).
    pub credential_id: &'a [u8],
    /// `response.authenticatorData`.
    pub authenticator_data: &'a [u8],
    /// `response.clientDataJSON`.
    pub client_data_json: &'a [u8],
    /// `response.signature`.
    pub signature: &'a [u8],
    /// `response.userHandle`, if the authenticator gave one (not checked;
    /// bounded by [`MAX_USER_HANDLE_LEN`]).
    pub user_handle: Option<&'a [u8]>,
}

impl fmt::Debug for Assertion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Assertion")
            .field("credential_id", &lower_hex(self.credential_id))
            .field(
                "authenticator_data",
                &ByteCount(self.authenticator_data.len()),
            )
            .field("client_data_json", &ByteCount(self.client_data_json.len()))
            .field("signature", &ByteCount(self.signature.len()))
            .field("user_handle", &self.user_handle.map(|h| ByteCount(h.len())))
            .finish()
    }
}

/// Debug for a blob: its length only.
struct ByteCount(usize);

impl fmt::Debug for ByteCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0)
    }
}

/// A verified assertion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The authenticator's new sign count: the caller stores it as the
    /// highest seen.
    pub sign_count: u32,
    /// The authenticator data's flags (UP and UV are set).
    pub flags: Flags,
}

/// Why an assertion was refused. Each variant is one stable snake_case
/// name ([`as_str`](AssertionError::as_str)), the same in the gateway's
/// logs, metrics and records; the text is for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssertionError {
    /// The decision carried no assertion. Never returned by this module:
    /// the name of the callers' own refusal, kept with the others.
    #[error("no assertion")]
    NoAssertion,
    /// The credential id is not one of the listed keys (or names several),
    /// or the listed key is unusable.
    #[error("unknown credential: {0}")]
    UnknownCredential(&'static str),
    /// The authenticator data is for another rp id.
    #[error("the authenticator data's rp id hash is not the rp id's")]
    RpIdMismatch,
    /// `clientDataJSON` names another origin, or a cross-origin frame.
    #[error("origin mismatch: {0}")]
    OriginMismatch(&'static str),
    /// `clientDataJSON`'s `type` is not `webauthn.get`.
    #[error("clientDataJSON type is not webauthn.get")]
    WrongType,
    /// `clientDataJSON`'s challenge is not the expected one (another card,
    /// the other verdict, another command or sign-in).
    #[error("the challenge is not the expected one")]
    ChallengeMismatch,
    /// The UP flag is clear.
    #[error("the user was not present (UP clear)")]
    UserNotPresent,
    /// The UV flag is clear.
    #[error("the user was not verified (UV clear)")]
    UserNotVerified,
    /// The signature does not verify under the credential's key.
    #[error("the signature does not verify")]
    BadSignature,
    /// The sign count did not go up.
    #[error("sign count {got} does not exceed the highest seen, {highest}")]
    SignCountReplayed {
        /// The stored count.
        highest: u32,
        /// The assertion's count.
        got: u32,
    },
    /// An input is too long or not of its format.
    #[error("malformed assertion: {0}")]
    Malformed(&'static str),
}

impl AssertionError {
    /// Every name, in the order issue 42 lists them.
    pub const NAMES: [&'static str; 11] = [
        "no_assertion",
        "unknown_credential",
        "rp_id_mismatch",
        "origin_mismatch",
        "wrong_type",
        "challenge_mismatch",
        "user_not_present",
        "user_not_verified",
        "bad_signature",
        "sign_count_replayed",
        "malformed",
    ];

    /// The stable name: never change one, only add.
    pub const fn as_str(&self) -> &'static str {
        match self {
            AssertionError::NoAssertion => "no_assertion",
            AssertionError::UnknownCredential(_) => "unknown_credential",
            AssertionError::RpIdMismatch => "rp_id_mismatch",
            AssertionError::OriginMismatch(_) => "origin_mismatch",
            AssertionError::WrongType => "wrong_type",
            AssertionError::ChallengeMismatch => "challenge_mismatch",
            AssertionError::UserNotPresent => "user_not_present",
            AssertionError::UserNotVerified => "user_not_verified",
            AssertionError::BadSignature => "bad_signature",
            AssertionError::SignCountReplayed { .. } => "sign_count_replayed",
            AssertionError::Malformed(_) => "malformed",
        }
    }
}

/// Why a registration was refused. Each variant has a stable snake_case
/// name ([`as_str`](RegistrationError::as_str)); the text is for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// An input is too long or not of its format.
    #[error("malformed registration: {0}")]
    Malformed(&'static str),
    /// `clientDataJSON`'s `type` is not `webauthn.create`.
    #[error("clientDataJSON type is not webauthn.create")]
    WrongType,
    /// `clientDataJSON`'s challenge is not the one issued.
    #[error("the challenge is not the expected one")]
    ChallengeMismatch,
    /// `clientDataJSON` names another origin, or a cross-origin frame.
    #[error("origin mismatch: {0}")]
    OriginMismatch(&'static str),
    /// The authenticator data is for another rp id.
    #[error("the authenticator data's rp id hash is not the rp id's")]
    RpIdMismatch,
    /// The UP flag is clear.
    #[error("the user was not present (UP clear)")]
    UserNotPresent,
    /// The UV flag is clear.
    #[error("the user was not verified (UV clear)")]
    UserNotVerified,
    /// The credential's public key is malformed, of another algorithm, or
    /// unusable.
    #[error("{0}")]
    Key(KeyError),
    /// An attestation format other than `none` and `packed`
    /// self-attestation.
    #[error("attestation format {format} is not supported (ask for attestation none)")]
    UnsupportedAttestation {
        /// The format's registered name (`packed` with a certificate chain
        /// is `packed (x5c)`), or `unknown`.
        format: &'static str,
    },
    /// The attestation statement is wrong for its format.
    #[error("bad attestation statement: {0}")]
    BadAttestation(&'static str),
}

impl RegistrationError {
    /// Every name, in the order of the checks.
    pub const NAMES: [&'static str; 11] = [
        "malformed",
        "wrong_type",
        "challenge_mismatch",
        "origin_mismatch",
        "rp_id_mismatch",
        "user_not_present",
        "user_not_verified",
        "unsupported_algorithm",
        "bad_key",
        "unsupported_attestation",
        "bad_attestation",
    ];

    /// The stable name: never change one, only add. A key's error is the
    /// key's own name (`malformed`, `unsupported_algorithm`, `bad_key`).
    pub const fn as_str(&self) -> &'static str {
        match self {
            RegistrationError::Malformed(_) => "malformed",
            RegistrationError::WrongType => "wrong_type",
            RegistrationError::ChallengeMismatch => "challenge_mismatch",
            RegistrationError::OriginMismatch(_) => "origin_mismatch",
            RegistrationError::RpIdMismatch => "rp_id_mismatch",
            RegistrationError::UserNotPresent => "user_not_present",
            RegistrationError::UserNotVerified => "user_not_verified",
            RegistrationError::Key(e) => e.as_str(),
            RegistrationError::UnsupportedAttestation { .. } => "unsupported_attestation",
            RegistrationError::BadAttestation(_) => "bad_attestation",
        }
    }
}

/// What the checks shared by both ceremonies found wrong, before it is
/// said in each ceremony's own error type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Malformed(&'static str),
    Key(KeyError),
    WrongType,
    ChallengeMismatch,
    OriginMismatch(&'static str),
    RpIdMismatch,
    UserNotPresent,
    UserNotVerified,
}

impl From<Fault> for RegistrationError {
    fn from(f: Fault) -> RegistrationError {
        match f {
            Fault::Malformed(what) => RegistrationError::Malformed(what),
            Fault::Key(e) => RegistrationError::Key(e),
            Fault::WrongType => RegistrationError::WrongType,
            Fault::ChallengeMismatch => RegistrationError::ChallengeMismatch,
            Fault::OriginMismatch(what) => RegistrationError::OriginMismatch(what),
            Fault::RpIdMismatch => RegistrationError::RpIdMismatch,
            Fault::UserNotPresent => RegistrationError::UserNotPresent,
            Fault::UserNotVerified => RegistrationError::UserNotVerified,
        }
    }
}

impl From<Fault> for AssertionError {
    fn from(f: Fault) -> AssertionError {
        match f {
            Fault::Malformed(what) => AssertionError::Malformed(what),
            // Only attested credential data holds a key, which an
            // assertion must not carry.
            Fault::Key(_) => AssertionError::Malformed(
                "an assertion's authenticator data holds a credential (AT set)",
            ),
            Fault::WrongType => AssertionError::WrongType,
            Fault::ChallengeMismatch => AssertionError::ChallengeMismatch,
            Fault::OriginMismatch(what) => AssertionError::OriginMismatch(what),
            Fault::RpIdMismatch => AssertionError::RpIdMismatch,
            Fault::UserNotPresent => AssertionError::UserNotPresent,
            Fault::UserNotVerified => AssertionError::UserNotVerified,
        }
    }
}

impl From<CborError> for Fault {
    fn from(e: CborError) -> Fault {
        Fault::Malformed(e.describe())
    }
}

/// The members of `clientDataJSON` this module reads. Other members are
/// ignored, as WebAuthn asks (§5.8.1: the dictionary may be extended);
/// a member named twice is refused by serde.
#[derive(Deserialize)]
struct ClientData<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    challenge: Cow<'a, str>,
    #[serde(borrow)]
    origin: Cow<'a, str>,
    #[serde(rename = "crossOrigin", default)]
    cross_origin: Option<bool>,
}

/// Steps 1 of both ceremonies: `clientDataJSON`'s type, challenge and
/// origin.
fn check_client_data(bytes: &[u8], kind: &str, expected: &Expected<'_>) -> Result<(), Fault> {
    if bytes.len() > MAX_CLIENT_DATA_LEN {
        return Err(Fault::Malformed("clientDataJSON is longer than 4 KiB"));
    }
    // serde reads a struct from a JSON array too, member by position: the
    // client data is an object, nothing else.
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(Fault::Malformed("clientDataJSON is not a JSON object"));
    }
    let client: ClientData<'_> = serde_json::from_slice(bytes).map_err(|_| {
        Fault::Malformed(
            "clientDataJSON is not a JSON object with string type, challenge and origin",
        )
    })?;
    if client.kind != kind {
        return Err(Fault::WrongType);
    }
    if client.challenge != URL_SAFE_NO_PAD.encode(expected.challenge) {
        return Err(Fault::ChallengeMismatch);
    }
    if client.origin != expected.origin {
        return Err(Fault::OriginMismatch(
            "clientDataJSON's origin is not the configured origin",
        ));
    }
    if client.cross_origin == Some(true) {
        return Err(Fault::OriginMismatch(
            "clientDataJSON says crossOrigin: the ceremony ran in a frame of another origin",
        ));
    }
    Ok(())
}

/// The attested credential data of a registration's authenticator data.
struct AttestedCredential<'a> {
    aaguid: [u8; 16],
    id: &'a [u8],
    key: PublicKey,
    key_bytes: &'a [u8],
}

/// Authenticator data, parsed whole.
struct AuthenticatorData<'a> {
    rp_id_hash: &'a [u8],
    flags: Flags,
    sign_count: u32,
    attested: Option<AttestedCredential<'a>>,
}

impl<'a> AuthenticatorData<'a> {
    /// Parse `bytes` whole: the fixed part, the attested credential data if
    /// AT is set, the extensions if ED is set, and nothing more.
    fn parse(bytes: &'a [u8]) -> Result<AuthenticatorData<'a>, Fault> {
        if bytes.len() > MAX_AUTHENTICATOR_DATA_LEN {
            return Err(Fault::Malformed("authenticator data is longer than 4 KiB"));
        }
        if bytes.len() < AUTH_DATA_FIXED_LEN {
            return Err(Fault::Malformed(
                "authenticator data is shorter than 37 bytes",
            ));
        }
        let flags = Flags(bytes[32]);
        if flags.backed_up() && !flags.backup_eligible() {
            return Err(Fault::Malformed("the BS flag is set without the BE flag"));
        }
        let sign_count = u32::from_be_bytes([bytes[33], bytes[34], bytes[35], bytes[36]]);
        let mut rest = &bytes[AUTH_DATA_FIXED_LEN..];
        let attested = if flags.has(Flags::AT) {
            if rest.len() < 18 {
                return Err(Fault::Malformed(
                    "attested credential data is shorter than 18 bytes",
                ));
            }
            let mut aaguid = [0u8; 16];
            aaguid.copy_from_slice(&rest[..16]);
            let id_len = usize::from(u16::from_be_bytes([rest[16], rest[17]]));
            if id_len == 0 || id_len > MAX_CREDENTIAL_ID_LEN {
                return Err(Fault::Malformed(
                    "the credential id is not 1 to 1,023 bytes",
                ));
            }
            rest = &rest[18..];
            if rest.len() < id_len {
                return Err(Fault::Malformed(
                    "authenticator data ends inside the credential id",
                ));
            }
            let (id, after) = rest.split_at(id_len);
            let mut reader = Reader::new(after);
            let key = PublicKey::read(&mut reader).map_err(|e| match e {
                KeyError::Malformed(what) => Fault::Malformed(what),
                other => Fault::Key(other),
            })?;
            let (key_bytes, after) = after.split_at(reader.position());
            rest = after;
            Some(AttestedCredential {
                aaguid,
                id,
                key,
                key_bytes,
            })
        } else {
            None
        };
        if flags.has(Flags::ED) {
            let mut reader = Reader::new(rest);
            reader.map()?;
            let mut reader = Reader::new(rest);
            reader.skip()?;
            rest = &rest[reader.position()..];
        }
        if !rest.is_empty() {
            return Err(Fault::Malformed("bytes after the authenticator data"));
        }
        Ok(AuthenticatorData {
            rp_id_hash: &bytes[..32],
            flags,
            sign_count,
            attested,
        })
    }

    /// The checks both ceremonies make: rp id hash, UP, UV.
    fn check(&self, rp_id: &str) -> Result<(), Fault> {
        if self.rp_id_hash != digest(&SHA256, rp_id.as_bytes()).as_ref() {
            return Err(Fault::RpIdMismatch);
        }
        if !self.flags.user_present() {
            return Err(Fault::UserNotPresent);
        }
        if !self.flags.user_verified() {
            return Err(Fault::UserNotVerified);
        }
        Ok(())
    }
}

/// `authenticatorData || SHA-256(clientDataJSON)`: what both an assertion's
/// signature and a packed attestation's sign.
fn signed_message(authenticator_data: &[u8], client_data_json: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(authenticator_data.len() + 32);
    message.extend_from_slice(authenticator_data);
    message.extend_from_slice(digest(&SHA256, client_data_json).as_ref());
    message
}

/// The parts of an attestation object.
struct AttestationObject<'a> {
    fmt: &'a str,
    statement: &'a [u8],
    auth_data: &'a [u8],
}

impl<'a> AttestationObject<'a> {
    fn parse(bytes: &'a [u8]) -> Result<AttestationObject<'a>, Fault> {
        if bytes.len() > MAX_ATTESTATION_OBJECT_LEN {
            return Err(Fault::Malformed("attestationObject is longer than 16 KiB"));
        }
        let mut reader = Reader::new(bytes);
        let entries = reader.map()?;
        let mut keys = Keys::default();
        let (mut fmt, mut statement, mut auth_data) = (None, None, None);
        for _ in 0..entries {
            let key = reader.key()?;
            keys.insert(key)?;
            match key {
                Key::Text("fmt") => fmt = Some(reader.text()?),
                Key::Text("attStmt") => {
                    if reader.peek_major()? != 5 {
                        return Err(Fault::Malformed("attStmt is not a CBOR map"));
                    }
                    statement = Some(reader.raw_value()?);
                }
                Key::Text("authData") => auth_data = Some(reader.bytes()?),
                _ => reader.skip()?,
            }
        }
        if !reader.is_empty() {
            return Err(Fault::Malformed("bytes after the attestationObject"));
        }
        match (fmt, statement, auth_data) {
            (Some(fmt), Some(statement), Some(auth_data)) => Ok(AttestationObject {
                fmt,
                statement,
                auth_data,
            }),
            _ => Err(Fault::Malformed(
                "attestationObject lacks fmt, attStmt or authData",
            )),
        }
    }
}

/// The registered attestation formats (WebAuthn §8 and the IANA registry)
/// refused by name; anything else is `unknown`.
fn format_name(fmt: &str) -> &'static str {
    match fmt {
        "tpm" => "tpm",
        "android-key" => "android-key",
        "android-safetynet" => "android-safetynet",
        "fido-u2f" => "fido-u2f",
        "apple" => "apple",
        "compound" => "compound",
        _ => "unknown",
    }
}

/// Step 5 of registration: the attestation statement.
fn check_statement(
    object: &AttestationObject<'_>,
    key: &PublicKey,
    client_data_json: &[u8],
) -> Result<Attestation, RegistrationError> {
    let malformed = |e: CborError| RegistrationError::Malformed(e.describe());
    let mut reader = Reader::new(object.statement);
    let entries = reader.map().map_err(malformed)?;
    match object.fmt {
        "none" if entries == 0 => Ok(Attestation::None),
        "none" => Err(RegistrationError::BadAttestation(
            "the statement of attestation none is not empty",
        )),
        "packed" => {
            let mut keys = Keys::default();
            let (mut alg, mut sig, mut x5c) = (None, None, false);
            for _ in 0..entries {
                let k = reader.key().map_err(malformed)?;
                keys.insert(k).map_err(malformed)?;
                match k {
                    Key::Text("alg") => alg = Some(reader.int().map_err(malformed)?),
                    Key::Text("sig") => sig = Some(reader.bytes().map_err(malformed)?),
                    Key::Text("x5c") => {
                        x5c = true;
                        reader.skip().map_err(malformed)?;
                    }
                    _ => {
                        return Err(RegistrationError::Malformed(
                            "a packed statement has a key other than alg, sig and x5c",
                        ))
                    }
                }
            }
            if x5c {
                return Err(RegistrationError::UnsupportedAttestation {
                    format: "packed (x5c)",
                });
            }
            let (Some(alg), Some(sig)) = (alg, sig) else {
                return Err(RegistrationError::Malformed(
                    "a packed statement lacks alg or sig",
                ));
            };
            if alg != key.alg().id() {
                return Err(RegistrationError::BadAttestation(
                    "the packed statement's alg is not the credential's",
                ));
            }
            if sig.len() > MAX_SIGNATURE_LEN
                || !key.verify(&signed_message(object.auth_data, client_data_json), sig)
            {
                return Err(RegistrationError::BadAttestation(
                    "the self-attestation signature does not verify under the credential's key",
                ));
            }
            Ok(Attestation::PackedSelf)
        }
        other => Err(RegistrationError::UnsupportedAttestation {
            format: format_name(other),
        }),
    }
}

/// Check a new credential (`navigator.credentials.create`): see the
/// module's "Registration" for every check, in order.
///
/// # Limits
///
/// `attestation_object` at most [`MAX_ATTESTATION_OBJECT_LEN`] bytes (its
/// authenticator data at most [`MAX_AUTHENTICATOR_DATA_LEN`]),
/// `client_data_json` at most [`MAX_CLIENT_DATA_LEN`]; longer is
/// `malformed` before anything is parsed.
pub fn verify_registration(
    expected: &Expected<'_>,
    attestation_object: &[u8],
    client_data_json: &[u8],
) -> Result<Credential, RegistrationError> {
    if attestation_object.len() > MAX_ATTESTATION_OBJECT_LEN {
        return Err(RegistrationError::Malformed(
            "attestationObject is longer than 16 KiB",
        ));
    }
    check_client_data(client_data_json, TYPE_CREATE, expected)?;
    let object = AttestationObject::parse(attestation_object)?;
    let auth = AuthenticatorData::parse(object.auth_data)?;
    let Some(attested) = &auth.attested else {
        return Err(RegistrationError::Malformed(
            "the authenticator data holds no credential (AT clear)",
        ));
    };
    auth.check(expected.rp_id)?;
    let attestation = check_statement(&object, &attested.key, client_data_json)?;
    Ok(Credential {
        id: attested.id.to_vec(),
        public_key_cose: attested.key_bytes.to_vec(),
        alg: attested.key.alg(),
        sign_count: auth.sign_count,
        backup_eligible: auth.flags.backup_eligible(),
        backed_up: auth.flags.backed_up(),
        aaguid: attested.aaguid,
        attestation,
    })
}

/// Check an assertion (`navigator.credentials.get`) made with `credential`:
/// see the module's "Assertion" for every check, in order.
///
/// # Limits
///
/// The credential id at most [`MAX_CREDENTIAL_ID_LEN`] bytes, the
/// authenticator data [`MAX_AUTHENTICATOR_DATA_LEN`], `clientDataJSON`
/// [`MAX_CLIENT_DATA_LEN`], the signature [`MAX_SIGNATURE_LEN`], the user
/// handle [`MAX_USER_HANDLE_LEN`], the stored key [`MAX_PUBLIC_KEY_LEN`];
/// longer is `malformed` (the stored key: `unknown_credential`).
pub fn verify_assertion(
    expected: &Expected<'_>,
    credential: &StoredCredential<'_>,
    assertion: &Assertion<'_>,
) -> Result<Verified, AssertionError> {
    if assertion.credential_id.len() > MAX_CREDENTIAL_ID_LEN {
        return Err(AssertionError::Malformed(
            "the credential id is longer than 1,023 bytes",
        ));
    }
    if assertion.signature.len() > MAX_SIGNATURE_LEN {
        return Err(AssertionError::Malformed(
            "the signature is longer than 1,024 bytes",
        ));
    }
    if assertion
        .user_handle
        .is_some_and(|h| h.len() > MAX_USER_HANDLE_LEN)
    {
        return Err(AssertionError::Malformed(
            "the user handle is longer than 64 bytes",
        ));
    }
    if assertion.credential_id != credential.id {
        return Err(AssertionError::UnknownCredential(
            "the assertion names another credential",
        ));
    }
    check_client_data(assertion.client_data_json, TYPE_GET, expected)?;
    let auth = AuthenticatorData::parse(assertion.authenticator_data)?;
    if auth.attested.is_some() {
        return Err(AssertionError::Malformed(
            "an assertion's authenticator data holds a credential (AT set)",
        ));
    }
    auth.check(expected.rp_id)?;
    let key = stored_key(credential.public_key_cose).map_err(|_| {
        AssertionError::UnknownCredential("the stored public key is not a usable COSE key")
    })?;
    let message = signed_message(assertion.authenticator_data, assertion.client_data_json);
    if !key.verify(&message, assertion.signature) {
        return Err(AssertionError::BadSignature);
    }
    let (highest, got) = (credential.sign_count, auth.sign_count);
    let counts = (highest == 0 && got == 0) || got > highest;
    if !counts {
        return Err(AssertionError::SignCountReplayed { highest, got });
    }
    Ok(Verified {
        sign_count: got,
        flags: auth.flags,
    })
}

fn stored_key(bytes: &[u8]) -> Result<PublicKey, KeyError> {
    if bytes.len() > MAX_PUBLIC_KEY_LEN {
        return Err(KeyError::Malformed("the COSE key is longer than 2 KiB"));
    }
    PublicKey::parse(bytes)
}

/// Check stored COSE key bytes before they are trusted (the gateway, when a
/// session's open hands it the approvers' keys): the key's algorithm, or
/// why it is unusable.
///
/// # Limits
///
/// At most [`MAX_PUBLIC_KEY_LEN`] bytes.
pub fn check_public_key(public_key_cose: &[u8]) -> Result<CoseAlgorithm, KeyError> {
    stored_key(public_key_cose).map(|key| key.alg())
}

/// Stored COSE key bytes as an X.509 `SubjectPublicKeyInfo` (DER): the
/// form `openssl pkey -pubin -inform DER` and Python's `cryptography`
/// (`load_der_public_key`) read, so that an auditor can check a person's
/// assertion with tools of their own (the certificate bundle carries it
/// beside the COSE bytes).
///
/// # Limits
///
/// At most [`MAX_PUBLIC_KEY_LEN`] bytes.
pub fn public_key_spki_der(public_key_cose: &[u8]) -> Result<Vec<u8>, KeyError> {
    stored_key(public_key_cose).map(|key| key.spki_der().to_vec())
}

/// The one of `candidates` whose credential id (`id_of`) is the
/// assertion's `credential_id`: a person's several passkeys, or every key
/// of the approvers a rule names.
///
/// `unknown_credential` when none has that id, and also when several do:
/// two listed keys under one id would leave it open whose signature it is.
///
/// # Limits
///
/// One comparison per candidate.
pub fn find_credential<'c, T>(
    candidates: &'c [T],
    credential_id: &[u8],
    id_of: impl Fn(&T) -> &[u8],
) -> Result<&'c T, AssertionError> {
    let mut found = None;
    for candidate in candidates {
        if id_of(candidate) == credential_id {
            if found.is_some() {
                return Err(AssertionError::UnknownCredential(
                    "several listed keys have the assertion's credential id",
                ));
            }
            found = Some(candidate);
        }
    }
    found.ok_or(AssertionError::UnknownCredential(
        "no listed key has the assertion's credential id",
    ))
}

#[cfg(test)]
mod tests;
