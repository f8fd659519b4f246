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

/// The longest secret value accepted, in bytes. Credentials are tokens and
/// keys, not documents; the bound also bounds the masker's per-stream
/// memory (it holds back less than the longest pattern).
pub const MAX_SECRET_LEN: usize = 8 * 1024;

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

/// Check a value can go into a header and the masker.
pub fn check_value(name: &str, value: &[u8]) -> Result<(), SecretError> {
    if value.is_empty() {
        return Err(SecretError::Empty { name: name.into() });
    }
    if value.len() > MAX_SECRET_LEN {
        return Err(SecretError::TooLong {
            name: name.into(),
            len: value.len(),
        });
    }
    // Visible ASCII, space, tab and obs-text (RFC 9110 field-value).
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(SecretError::NotHeaderSafe { name: name.into() });
    }
    Ok(())
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
    if value.ends_with(b"\n") {
        value.pop();
        if value.ends_with(b"\r") {
            value.pop();
        }
    }
    check_value(name, &value)?;
    Ok(SecretBytes::new(std::mem::take(&mut *value)))
}

/// `SECRET=destination:header[:scheme]`, as the spec's `--attach` writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachSpec {
    pub secret: String,
    pub destination: Name,
    pub header: HeaderName,
    pub scheme: Option<String>,
}

/// Headers an attachment may not set: framing, routing and hop-by-hop
/// headers, whose meaning the gateway itself decides.
const FORBIDDEN_HEADERS: [&str; 12] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "http2-settings",
    "content-encoding",
    "hangar-refusal",
];

impl AttachSpec {
    /// Parse `SECRET=destination:header[:scheme]`.
    pub fn parse(spec: &str) -> Result<AttachSpec, SecretError> {
        let bad = |reason: &str| SecretError::BadAttachment {
            spec: spec.chars().take(200).collect(),
            reason: reason.into(),
        };
        let (secret, rest) = spec
            .split_once('=')
            .ok_or_else(|| bad("expected SECRET=destination:header[:scheme]"))?;
        if secret.is_empty()
            || !secret
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(bad(
                "the secret name must be letters, digits, '_', '-' or '.'",
            ));
        }
        let mut parts = rest.splitn(3, ':');
        let destination = parts.next().unwrap_or_default();
        let header = parts
            .next()
            .ok_or_else(|| bad("no header after the destination"))?;
        let scheme = parts.next();
        let destination = crate::gate::name::canonicalize(destination)
            .map_err(|e| bad(&format!("destination: {e}")))?;
        let header = HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| bad("the header is not a valid header name"))?;
        if FORBIDDEN_HEADERS.contains(&header.as_str()) {
            return Err(bad(&format!(
                "the gateway does not let an attachment set {}",
                header.as_str()
            )));
        }
        let scheme = match scheme {
            None => None,
            Some(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic()) => {
                Some(s.to_owned())
            }
            Some(_) => return Err(bad("the scheme must be visible ASCII, without spaces")),
        };
        Ok(AttachSpec {
            secret: secret.to_owned(),
            destination,
            header,
            scheme,
        })
    }
}

/// A secret attached to a destination's requests, value included.
#[derive(Clone, Debug)]
pub struct Attachment {
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
        check_value(&spec.secret, value.expose())?;
        let mut full = Vec::with_capacity(value.len() + 16);
        if let Some(scheme) = &spec.scheme {
            full.extend_from_slice(scheme.as_bytes());
            full.push(b' ');
        }
        full.extend_from_slice(value.expose());
        let shared = SecretBytes::new(full);
        let mut header_value =
            HeaderValue::from_maybe_shared(shared.0).map_err(|_| SecretError::NotHeaderSafe {
                name: spec.secret.clone(),
            })?;
        header_value.set_sensitive(true);
        Ok(Attachment {
            secret: spec.secret.clone(),
            destination: spec.destination.clone(),
            header: spec.header.clone(),
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
    fn specs_parse_as_the_cli_writes_them() {
        let s = AttachSpec::parse("GH=API.github.com:Authorization:Bearer").unwrap();
        assert_eq!(s.secret, "GH");
        assert_eq!(s.destination.as_str(), "api.github.com");
        assert_eq!(s.header.as_str(), "authorization");
        assert_eq!(s.scheme.as_deref(), Some("Bearer"));
        let s = AttachSpec::parse("K=x.example:x-api-key").unwrap();
        assert_eq!(s.scheme, None);
        for bad in [
            "nohost",
            "=x.example:h",
            "K=x.example",
            "K=10.0.0.1:h",
            "K=x.example:bad header",
            "K=x.example:host",
            "K=x.example:Content-Length",
            "K=x.example:h:two words",
            "K=x.example:h:",
        ] {
            assert!(AttachSpec::parse(bad).is_err(), "{bad}");
        }
    }

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
