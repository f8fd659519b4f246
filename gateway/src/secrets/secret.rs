//! Secret values and the attachments that carry them.
//!
//! A secret value enters the gateway from the control plane (or, for static
//! sessions, from an environment variable or a file named by the config —
//! never inline), lives in one zeroizing allocation, and leaves only inside
//! the one request header its attachment names. Nothing here can print a
//! value: `Debug` shows the length, errors name the secret by name.
//!
//! # What is wiped, and what cannot be
//!
//! The gateway's own copy of each value (and of each `[scheme ]value`
//! header built from it) is one allocation shared by reference counting
//! ([`bytes::Bytes::from_owner`]); when the last reference goes — when the
//! session's authority ends and its in-flight requests finish — the bytes
//! are zeroed before they are freed. Transient copies that hyper and rustls
//! make while encoding and encrypting a request live in their reused write
//! buffers and are overwritten by later traffic; they are not zeroed on
//! their own.

use std::fmt;
use std::path::Path;

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use zeroize::Zeroizing;

use crate::gate::name::Name;
use talos_contract::secret::ValueError;

pub use talos_contract::attach::AttachSpec;
/// The longest secret value accepted, in bytes (the contract's bound).
pub use talos_contract::secret::MAX_SECRET_LEN;

/// Owner of secret bytes: zeroed on drop.
struct Wiped(Zeroizing<Vec<u8>>);

impl AsRef<[u8]> for Wiped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A secret value. Cheap to clone (shared, reference counted); the bytes
/// are zeroed when the last clone is dropped.
#[derive(Clone)]
pub struct SecretBytes(Bytes);

impl SecretBytes {
    /// Take ownership of `value` (which is wiped when no longer used).
    pub fn new(value: Vec<u8>) -> SecretBytes {
        SecretBytes(Bytes::from_owner(Wiped(Zeroizing::new(value))))
    }

    /// The value's bytes, for injection and for building the masker.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes(<redacted, {} bytes>)", self.0.len())
    }
}

/// Why a secret could not be loaded or attached; names the secret, never
/// the value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("secret {name}: environment variable {var} is not set")]
    EnvMissing { name: String, var: String },
    #[error("secret {name}: cannot read {path}: {reason}")]
    File {
        name: String,
        path: String,
        reason: String,
    },
    #[error("secret {name}: the value is empty")]
    Empty { name: String },
    #[error("secret {name}: the value is {len} bytes, more than {MAX_SECRET_LEN}")]
    TooLong { name: String, len: usize },
    #[error(
        "secret {name}: the value holds a byte that cannot be sent in a header (control character)"
    )]
    NotHeaderSafe { name: String },
    #[error("attachment {spec:?}: {reason}")]
    BadAttachment { spec: String, reason: String },
}

/// Check a value can go into a header and the masker (the contract's
/// bounds, [`talos_contract::secret::check_value`]).
pub fn check_value(name: &str, value: &[u8]) -> Result<(), SecretError> {
    talos_contract::secret::check_value(value).map_err(|e| {
        let name = name.into();
        match e {
            ValueError::Empty => SecretError::Empty { name },
            ValueError::TooLong(len) => SecretError::TooLong { name, len },
            ValueError::NotHeaderSafe => SecretError::NotHeaderSafe { name },
        }
    })
}

/// Read a secret from an environment variable.
pub fn from_env(name: &str, var: &str) -> Result<SecretBytes, SecretError> {
    let value = std::env::var_os(var).ok_or_else(|| SecretError::EnvMissing {
        name: name.into(),
        var: var.into(),
    })?;
    let mut value = Zeroizing::new(std::os::unix::ffi::OsStringExt::into_vec(value));
    check_value(name, &value)?;
    Ok(SecretBytes::new(std::mem::take(&mut *value)))
}

/// Read a secret from a file; one trailing newline (`\n` or `\r\n`) is not
/// part of the value.
pub fn from_file(name: &str, path: &Path) -> Result<SecretBytes, SecretError> {
    let mut value = Zeroizing::new(std::fs::read(path).map_err(|e| SecretError::File {
        name: name.into(),
        path: path.display().to_string(),
        reason: e.kind().to_string(),
    })?);
    talos_contract::secret::trim_line_ending(&mut value);
    check_value(name, &value)?;
    Ok(SecretBytes::new(std::mem::take(&mut *value)))
}

/// A secret attached to a destination's requests, value included.
#[derive(Clone, Debug)]
pub struct Attachment {
    /// What attached it (secret, destination, header, scheme).
    pub spec: AttachSpec,
    pub secret: String,
    pub destination: Name,
    pub header: HeaderName,
    /// The raw value (what the masker looks for).
    pub value: SecretBytes,
    /// `[scheme ]value`, marked sensitive (HPACK never-indexed).
    header_value: HeaderValue,
}

impl Attachment {
    /// Attach `value` as `spec` says.
    pub fn new(spec: &AttachSpec, value: SecretBytes) -> Result<Attachment, SecretError> {
        check_value(spec.secret(), value.expose())?;
        // Checked by the contract: a lower-case RFC 9110 token.
        let header = HeaderName::from_bytes(spec.header().as_bytes()).map_err(|_| {
            SecretError::BadAttachment {
                spec: spec.to_string(),
                reason: "the header is not a valid header name".into(),
            }
        })?;
        let mut full = Vec::with_capacity(value.len() + 16);
        if let Some(scheme) = spec.scheme() {
            full.extend_from_slice(scheme.as_bytes());
            full.push(b' ');
        }
        full.extend_from_slice(value.expose());
        let shared = SecretBytes::new(full);
        let mut header_value =
            HeaderValue::from_maybe_shared(shared.0).map_err(|_| SecretError::NotHeaderSafe {
                name: spec.secret().to_owned(),
            })?;
        header_value.set_sensitive(true);
        Ok(Attachment {
            spec: spec.clone(),
            secret: spec.secret().to_owned(),
            destination: spec.destination().clone(),
            header,
            value,
            header_value,
        })
    }

    /// The header value to send.
    pub fn header_value(&self) -> &HeaderValue {
        &self.header_value
    }
}

/// Set each attachment's header in `headers`, after removing every header
/// of that name the session sent (names are case-insensitive in both HTTP
/// versions; repeated headers all go). Returns the names of the secrets
/// injected. Every other header is left as it was.
pub fn inject<'a>(
    attachments: impl IntoIterator<Item = &'a Attachment>,
    headers: &mut hyper::HeaderMap,
) -> Vec<&'a str> {
    let mut used = Vec::new();
    for a in attachments {
        headers.remove(&a.header);
        headers.insert(a.header.clone(), a.header_value.clone());
        used.push(a.secret.as_str());
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_never_print() {
        let v = SecretBytes::new(b"hunter2-very-secret".to_vec());
        assert_eq!(format!("{v:?}"), "SecretBytes(<redacted, 19 bytes>)");
        let spec = AttachSpec::parse("PW=x.example:authorization:Basic").unwrap();
        let a = Attachment::new(&spec, v).unwrap();
        let shown = format!("{a:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(a.header_value().as_bytes(), b"Basic hunter2-very-secret");
        assert!(a.header_value().is_sensitive());
    }

    #[test]
    fn injection_replaces_every_copy_and_nothing_else() {
        let spec = AttachSpec::parse("T=x.example:authorization:Bearer").unwrap();
        let a = Attachment::new(&spec, SecretBytes::new(b"v4lue".to_vec())).unwrap();
        let mut h = hyper::HeaderMap::new();
        h.append("Authorization", HeaderValue::from_static("Bearer mine"));
        h.append("authorization", HeaderValue::from_static("Basic other"));
        h.append("x-other", HeaderValue::from_static("kept"));
        assert_eq!(inject([&a], &mut h), ["T"]);
        let auth: Vec<_> = h.get_all("authorization").iter().collect();
        assert_eq!(auth, [&HeaderValue::from_static("Bearer v4lue")]);
        assert_eq!(h["x-other"], "kept");
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn bad_values_are_named_not_shown() {
        let e = check_value("TOKEN", b"abc\r\nInjected: yes").unwrap_err();
        assert_eq!(e.to_string(), "secret TOKEN: the value holds a byte that cannot be sent in a header (control character)");
        assert!(check_value("TOKEN", b"").is_err());
        assert!(check_value("TOKEN", &vec![b'a'; MAX_SECRET_LEN + 1]).is_err());
    }
}
