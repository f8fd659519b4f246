//! The gateway's own signing key, and the signed envelope every batch, drop
//! report and (later) approval decision travels in.
//!
//! # The key
//!
//! A [`GatewayKey`] is one Ed25519 key per gateway process (each member of
//! a gateway pair has its own), made by aws-lc and kept in a PKCS#8 file so
//! that the control plane, which registers its public half once, can check
//! everything the gateway signs across restarts. Unlike a session CA's key
//! it outlives the process, so it is the one key of this crate that is
//! written down; [`GatewayKey::load_or_create`] says how the file is
//! guarded.
//!
//! The key is named by its [`key_id`](GatewayKey::key_id): the first 16 hex
//! digits (8 bytes) of the SHA-256 of the 32-byte raw public key. The id is
//! a label for logs, key files and the control plane's registry, not a
//! security boundary: verification always uses the full public key
//! registered for the gateway, and merely checks that the envelope names
//! that key.
//!
//! # The envelope
//!
//! A [`Signed`] holds a [`Kind`], the signer's key id, the payload bytes
//! and an Ed25519 signature over
//!
//! ```text
//! b"talos-v1\0" || kind tag (1 byte) || payload
//! ```
//!
//! with the tags `0x01` batch, `0x02` drop report, `0x03` decision,
//! `0x04` start report, `0x05` session certificate (`0x06` is a key
//! binding's, signed with ECDSA by a control-channel key: `crate::binding`).
//! The
//! prefix names this protocol and its version, so a TALOS signature is
//! never valid for any other protocol's message; the tag binds the kind,
//! so a signature over a drop report can never verify as a batch (or the
//! reverse), even when the same payload bytes would parse as both. The key
//! id is not signed: it is derived from the key the verifier already holds,
//! and an envelope whose id differs from that key's is refused like a bad
//! signature.
//!
//! On the wire and at rest an envelope is a JSON object:
//!
//! ```text
//! {"kind":"batch","key_id":"<16 hex>","payload":"<base64>","signature":"<base64>"}
//! ```
//!
//! with `kind` one of `batch`, `drop_report`, `decision`, `start_report`,
//! `certificate`, and the bytes in
//! standard base64 with padding (RFC 4648 section 4), decoded strictly.
//!
//! [`digest`] names a signed payload by the SHA-384 of its bytes: the
//! payload, not the envelope, because the payload is the exact byte string
//! the signature covers, while the envelope's JSON form is not canonical.
//! The batch hash chain links these digests.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use aws_lc_rs::digest::{digest as hash, SHA256};
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair as _, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::digest::{lower_hex, sha384_hex};

/// Prefixed to every signed message: the protocol and its version, and a
/// NUL so no printable prefix of another protocol can coincide with it.
const DOMAIN: &[u8] = b"talos-v1\0";

/// Length of a [`GatewayKey::key_id`]: 8 bytes of SHA-256, two hex digits
/// each. 64 bits tell a handful of gateway keys apart with room to spare;
/// the id never stands in for the key itself.
pub const KEY_ID_LEN: usize = 16;

/// The largest key file [`GatewayKey::load_or_create`] reads. An Ed25519
/// PKCS#8 document is 48 bytes (v1) or about 85 (v2, with the public key);
/// 1 KiB is far above both, and small enough to read into one fixed buffer
/// that is wiped afterwards (a growing buffer would leave unwiped copies
/// behind each time it moved).
pub const MAX_KEY_FILE_LEN: usize = 1024;

/// What a signed payload is. Each kind has its own tag in the signed
/// message (see the module docs), so a signature made for one kind never
/// verifies as another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A batch of connection records (`crate::batch`).
    Batch,
    /// A drop report: what the gateway dropped at a pause, interruption,
    /// end or Revoke All (`crate::report`).
    DropReport,
    /// An approval decision, signed by the approval relay (`crate::approval`).
    Decision,
    /// A gateway process's start (`crate::report`).
    StartReport,
    /// A session certificate, signed by the control plane.
    Certificate,
}

impl Kind {
    /// The stable snake_case name, as in the envelope's `kind` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Batch => "batch",
            Kind::DropReport => "drop_report",
            Kind::Decision => "decision",
            Kind::StartReport => "start_report",
            Kind::Certificate => "certificate",
        }
    }

    /// Every kind, in tag order.
    pub const ALL: [Kind; 5] = [
        Kind::Batch,
        Kind::DropReport,
        Kind::Decision,
        Kind::StartReport,
        Kind::Certificate,
    ];

    /// The kind named `name` (as in the envelope's `kind` field), if any.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The byte that binds the kind into the signed message.
    fn tag(self) -> u8 {
        match self {
            Kind::Batch => 0x01,
            Kind::DropReport => 0x02,
            Kind::Decision => 0x03,
            Kind::StartReport => 0x04,
            Kind::Certificate => 0x05,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A payload and the gateway's signature over it (see the module docs for
/// the signed message and the JSON form).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    /// What the payload is; bound into the signature.
    pub kind: Kind,
    /// [`GatewayKey::key_id`] of the signer (not signed; checked against
    /// the verifier's key).
    pub key_id: String,
    /// The signed bytes: a batch's or a report's canonical JSON.
    #[serde(with = "base64_bytes")]
    pub payload: Vec<u8>,
    /// The 64-byte Ed25519 signature.
    #[serde(with = "base64_bytes")]
    pub signature: Vec<u8>,
}

impl fmt::Debug for Signed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A batch payload is hundreds of kilobytes: name it by size.
        f.debug_struct("Signed")
            .field("kind", &self.kind)
            .field("key_id", &self.key_id)
            .field("payload_len", &self.payload.len())
            .field("signature_len", &self.signature.len())
            .finish()
    }
}

/// The message the signature covers: domain, kind tag, payload.
fn message(kind: Kind, payload: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(DOMAIN.len() + 1 + payload.len());
    message.extend_from_slice(DOMAIN);
    message.push(kind.tag());
    message.extend_from_slice(payload);
    message
}

/// The id of a raw Ed25519 public key: the first [`KEY_ID_LEN`] hex digits
/// of its SHA-256.
pub fn key_id_for(public_key: &[u8; 32]) -> String {
    let sha = hash(&SHA256, public_key);
    lower_hex(&sha.as_ref()[..KEY_ID_LEN / 2])
}

/// The name of a signed payload: SHA-384 of the payload bytes, 96
/// lowercase hex digits. Batches link to their predecessor by this digest.
pub fn digest(signed: &Signed) -> String {
    sha384_hex(&signed.payload)
}

/// Checks that `signed` was signed, as its own kind, by `public_key`.
///
/// Only the signature is checked, not what the payload says: a batch's
/// sequence and chain are [`ChainVerifier`](crate::ChainVerifier)'s, a
/// report's contents [`verify_drop_report`](crate::verify_drop_report)'s.
pub fn verify(public_key: &[u8; 32], signed: &Signed) -> Result<(), VerifyError> {
    if signed.key_id != key_id_for(public_key) {
        return Err(VerifyError::BadSignature {
            key_id: signed.key_id.clone(),
        });
    }
    UnparsedPublicKey::new(&ED25519, public_key)
        .verify(&message(signed.kind, &signed.payload), &signed.signature)
        .map_err(|_| VerifyError::BadSignature {
            key_id: signed.key_id.clone(),
        })
}

/// Why a signed payload was refused.
///
/// The text is for people; match on the variant or use
/// [`as_str`](VerifyError::as_str).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The envelope says it holds another kind than the one asked for.
    #[error("expected a signed {expected}, got a signed {got}")]
    WrongKind {
        /// The kind the caller verifies.
        expected: Kind,
        /// The envelope's kind.
        got: Kind,
    },
    /// The signature does not verify under the expected key (altered
    /// payload or signature, another signer, or another kind than signed).
    #[error("signature does not verify under the expected key (envelope names key {key_id:?})")]
    BadSignature {
        /// The key id the envelope names.
        key_id: String,
    },
    /// The signature verifies, but the payload is not in this kind's
    /// canonical encoding (a signer fault, never a forgery).
    #[error("signed payload is malformed: {reason}")]
    Malformed {
        /// What is wrong, without the payload's contents.
        reason: String,
    },
}

impl VerifyError {
    /// The stable snake_case name of the refusal.
    pub fn as_str(&self) -> &'static str {
        match self {
            VerifyError::WrongKind { .. } => "wrong_kind",
            VerifyError::BadSignature { .. } => "bad_signature",
            VerifyError::Malformed { .. } => "malformed",
        }
    }
}

/// The gateway's Ed25519 signing key.
///
/// Not `Clone` (share it by `Arc`); its `Debug` shows the key id only. The
/// private key lives in aws-lc's memory, which aws-lc cleanses when it
/// frees it; its PKCS#8 form exists in Rust memory only while
/// [`load_or_create`](GatewayKey::load_or_create) reads or writes the file,
/// in buffers wiped on drop.
pub struct GatewayKey {
    // invariant: never encoded except by `create` to write the key file.
    pair: Ed25519KeyPair,
}

impl GatewayKey {
    /// A fresh key that lives only in memory (tests, benchmarks, a gateway
    /// that registers a new key at every start).
    pub fn generate() -> Result<Self, KeyError> {
        let pair = Ed25519KeyPair::generate().map_err(|_| KeyError::Generation)?;
        Ok(GatewayKey { pair })
    }

    /// Loads the key from `path`, or makes one and writes it there if no
    /// file exists.
    ///
    /// The file holds the key as DER PKCS#8 (v2, with the public key, when
    /// written here; v1 is read too, e.g. from `openssl genpkey -algorithm
    /// ed25519 -outform DER`).
    ///
    /// - **Loading** refuses a file that group or others may access in any
    ///   way (any of mode bits `0o077`): readable, it may have leaked;
    ///   writable, it may have been replaced. It also refuses anything but
    ///   a regular file, and files over [`MAX_KEY_FILE_LEN`] bytes. The
    ///   error names the path (and the mode).
    /// - **Creating** writes a new key to a temporary file beside `path`,
    ///   made with `create_new` and mode `0600` (so it is never readable by
    ///   others, whatever the umask), syncs it, and links it to `path`,
    ///   which fails if `path` appeared meanwhile; then the key that won is
    ///   loaded. So `path` is either absent or holds a whole key, never a
    ///   partial one, and two processes starting at once end up with the
    ///   same key.
    ///
    /// # Limits
    ///
    /// The file's owner is not checked: the process should run as the
    /// owner, and the directory should not be writable by others.
    pub fn load_or_create(path: impl AsRef<Path>) -> Result<Self, KeyError> {
        let path = path.as_ref();
        match load(path)? {
            Some(key) => Ok(key),
            None => create(path),
        }
    }

    /// The raw 32-byte Ed25519 public key, which the control plane
    /// registers for this gateway.
    pub fn public_key(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.pair.public_key().as_ref());
        out
    }

    /// The key's id: see [`key_id_for`].
    pub fn key_id(&self) -> String {
        key_id_for(&self.public_key())
    }

    /// Signs `payload` as `kind` (see the module docs for the signed
    /// message).
    ///
    /// # Panics
    ///
    /// If aws-lc cannot sign, which for Ed25519 happens only when it
    /// cannot allocate.
    pub fn sign(&self, kind: Kind, payload: Vec<u8>) -> Signed {
        let signature = self.pair.sign(&message(kind, &payload));
        Signed {
            kind,
            key_id: self.key_id(),
            payload,
            signature: signature.as_ref().to_vec(),
        }
    }
}

impl fmt::Debug for GatewayKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GatewayKey(Ed25519, key_id {})", self.key_id())
    }
}

/// Why the gateway's key could not be loaded or made.
///
/// Every variant that concerns the key file names it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The file could not be opened, read, written or linked.
    #[error("gateway key file {}: {source}", path.display())]
    Io {
        /// The file (or its directory) that failed.
        path: PathBuf,
        /// What the system reported.
        #[source]
        source: io::Error,
    },
    /// Group or others may access the file.
    #[error(
        "gateway key file {} has mode {mode:04o}: group and others must have no access (chmod 600)",
        path.display()
    )]
    Permissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The path names something other than a regular file.
    #[error("gateway key file {} is not a regular file", path.display())]
    NotAFile {
        /// The path given.
        path: PathBuf,
    },
    /// The file is larger than any Ed25519 PKCS#8 key.
    #[error("gateway key file {} is over {MAX_KEY_FILE_LEN} bytes: not an Ed25519 key", path.display())]
    TooLarge {
        /// The key file.
        path: PathBuf,
    },
    /// aws-lc did not accept the file as an Ed25519 PKCS#8 key.
    #[error("gateway key file {} is not an Ed25519 PKCS#8 key: {reason}", path.display())]
    Rejected {
        /// The key file.
        path: PathBuf,
        /// aws-lc's reason.
        reason: &'static str,
    },
    /// aws-lc could not generate or encode a key (gateway fault).
    #[error("aws-lc could not generate an Ed25519 key")]
    Generation,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The key at `path`, or `None` when there is no file.
fn load(path: &Path) -> Result<Option<GatewayKey>, KeyError> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(path)(e)),
    };
    // The open file's own metadata: no window for a swap after the check.
    let meta = file.metadata().map_err(io_error(path))?;
    if !meta.is_file() {
        return Err(KeyError::NotAFile {
            path: path.to_owned(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }

    // One byte over the limit tells "too large" from "exactly the limit".
    let mut buf = Zeroizing::new(vec![0u8; MAX_KEY_FILE_LEN + 1]);
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(path)(e)),
        }
    }
    if len > MAX_KEY_FILE_LEN {
        return Err(KeyError::TooLarge {
            path: path.to_owned(),
        });
    }
    let pair = Ed25519KeyPair::from_pkcs8(&buf[..len]).map_err(|e| KeyError::Rejected {
        path: path.to_owned(),
        reason: e.description_(),
    })?;
    Ok(Some(GatewayKey { pair }))
}

/// Makes a key and links it to `path` (see `load_or_create`).
fn create(path: &Path) -> Result<GatewayKey, KeyError> {
    let name = path.file_name().ok_or_else(|| KeyError::NotAFile {
        path: path.to_owned(),
    })?;
    // Unique per process and call, so two starts at once never share one.
    static CREATES: AtomicU64 = AtomicU64::new(0);
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        CREATES.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = path.with_file_name(temp_name);

    let pair = Ed25519KeyPair::generate().map_err(|_| KeyError::Generation)?;
    {
        // aws-lc's PKCS#8 document wipes its bytes when dropped, at the end
        // of this block.
        let pkcs8 = pair.to_pkcs8().map_err(|_| KeyError::Generation)?;
        // A leftover from a crashed start of a process with the same id
        // holds a key nobody registered yet: replace it.
        match fs::remove_file(&temp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(&temp)(e)),
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(io_error(&temp))?;
        if let Err(e) = file
            .write_all(pkcs8.as_ref())
            .and_then(|()| file.sync_all())
        {
            drop(file);
            let _ = fs::remove_file(&temp);
            return Err(io_error(&temp)(e));
        }
    }

    let linked = fs::hard_link(&temp, path);
    fs::remove_file(&temp).map_err(io_error(&temp))?;
    match linked {
        Ok(()) => {
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            File::open(dir)
                .and_then(|dir| dir.sync_all())
                .map_err(io_error(dir))?;
            Ok(GatewayKey { pair })
        }
        // Another process made the key first: use theirs.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            load(path)?.ok_or_else(|| io_error(path)(io::ErrorKind::NotFound.into()))
        }
        Err(e) => Err(io_error(path)(e)),
    }
}

/// Byte strings as standard base64 with padding, decoded strictly.
mod base64_bytes {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_separated() {
        let key = GatewayKey::generate().unwrap();
        let public = key.public_key();
        let signed = key.sign(Kind::DropReport, b"{}".to_vec());
        verify(&public, &signed).unwrap();
        for kind in [
            Kind::Batch,
            Kind::Decision,
            Kind::StartReport,
            Kind::Certificate,
        ] {
            let relabelled = Signed {
                kind,
                ..signed.clone()
            };
            assert_eq!(
                verify(&public, &relabelled).unwrap_err().as_str(),
                "bad_signature"
            );
        }
    }

    #[test]
    fn key_id_is_a_prefix_of_sha256() {
        // SHA-256 of 32 zero bytes: 66687aad…
        assert_eq!(key_id_for(&[0; 32]), "66687aadf862bd77");
        let key = GatewayKey::generate().unwrap();
        assert_eq!(key.key_id().len(), KEY_ID_LEN);
        assert_eq!(
            format!("{key:?}"),
            format!("GatewayKey(Ed25519, key_id {})", key.key_id())
        );
    }

    #[test]
    fn envelope_json_form() {
        let key = GatewayKey::generate().unwrap();
        let signed = key.sign(Kind::DropReport, b"ab".to_vec());
        let json = serde_json::to_string(&signed).unwrap();
        let expected_prefix = format!(
            r#"{{"kind":"drop_report","key_id":"{}","payload":"YWI=","signature":""#,
            key.key_id()
        );
        assert!(json.starts_with(&expected_prefix), "{json}");
        let back: Signed = serde_json::from_str(&json).unwrap();
        assert_eq!(back, signed);

        // Base64 is decoded strictly: no missing padding, no stray bits.
        for bad in ["YWI", "YWJ=", "YW I="] {
            let altered = json.replace("YWI=", bad);
            assert!(serde_json::from_str::<Signed>(&altered).is_err(), "{bad}");
        }
    }
}
