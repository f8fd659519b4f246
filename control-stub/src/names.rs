//! What a well-formed name, source, attachment and secret value is.
//!
//! The rules for destination names, attachments and secret values are the
//! gateway's own (`gateway/src/name.rs`, `gateway/src/secret.rs`), restated
//! here so that the control stub refuses at the start of a session what the
//! gateway would refuse when the session opens — not halfway through.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The longest DNS name in presentation form (RFC 1035 §2.3.4, without the
/// trailing dot).
pub const MAX_NAME_LEN: usize = 253;
/// The longest DNS label (RFC 1035 §2.3.4).
pub const MAX_LABEL_LEN: usize = 63;
/// The longest secret value, in bytes: the gateway's own bound (credentials
/// are tokens and keys, not documents; the bound also bounds the masker).
pub const MAX_SECRET_LEN: usize = 8 * 1024;
/// The longest secret name, in bytes. Names appear in records and on the
/// certificate; a long name is a mistake, not a need.
pub const MAX_SECRET_NAME_LEN: usize = 128;
/// The longest header name an attachment may set, in bytes.
pub const MAX_HEADER_LEN: usize = 128;
/// The longest gateway id, in bytes.
pub const MAX_GATEWAY_ID_LEN: usize = 128;

/// Headers an attachment may not set: framing, routing and hop-by-hop
/// headers, whose meaning the gateway itself decides (the gateway's list).
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

fn name_invalid(what: &'static str, got: &str, reason: impl Into<String>) -> Error {
    Error::NameInvalid {
        what,
        got: got.chars().take(300).collect(),
        reason: reason.into(),
    }
}

/// A tenant name as the spec defines it: a lower-case letter or digit, then
/// up to 62 lower-case letters, digits, dots, hyphens or underscores.
pub fn tenant(text: &str) -> Result<String, Error> {
    let bytes = text.as_bytes();
    let first_ok = bytes
        .first()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let rest_ok = bytes
        .iter()
        .skip(1)
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_'));
    if !first_ok || !rest_ok || bytes.len() > 63 {
        return Err(name_invalid(
            "tenant",
            text,
            "a tenant is a lower-case letter or digit, then up to 62 lower-case letters, digits, '.', '-' or '_'",
        ));
    }
    Ok(text.to_owned())
}

/// A secret's name: letters, digits, `_`, `-` or `.` (the gateway's rule
/// for the name in `--attach`), at most [`MAX_SECRET_NAME_LEN`] bytes.
pub fn secret_name(text: &str) -> Result<String, Error> {
    if text.is_empty()
        || text.len() > MAX_SECRET_NAME_LEN
        || !text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(name_invalid(
            "secret",
            text,
            format!("a secret name is 1 to {MAX_SECRET_NAME_LEN} letters, digits, '_', '-' or '.'"),
        ));
    }
    Ok(text.to_owned())
}

/// A gateway's id: visible ASCII, at most [`MAX_GATEWAY_ID_LEN`] bytes.
pub fn gateway_id(text: &str) -> Result<String, Error> {
    if text.is_empty()
        || text.len() > MAX_GATEWAY_ID_LEN
        || !text.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(name_invalid(
            "gateway",
            text,
            format!("a gateway id is 1 to {MAX_GATEWAY_ID_LEN} visible ASCII characters"),
        ));
    }
    Ok(text.to_owned())
}

/// A destination name in canonical form: ASCII lower case, one trailing dot
/// removed; anything that is not a plain DNS host name is refused, every IP
/// literal form included (the gateway's `name::canonicalize`).
pub fn destination(text: &str) -> Result<String, Error> {
    let bad = |reason: &str| name_invalid("destination", text, reason);
    let trimmed = text.strip_suffix('.').unwrap_or(text);
    if trimmed.is_empty() {
        return Err(bad("the name is empty"));
    }
    if trimmed.len() > MAX_NAME_LEN {
        return Err(bad("the name is longer than 253 bytes"));
    }
    if !trimmed
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        if looks_like_ip(trimmed) {
            return Err(bad("an IP literal is not a name"));
        }
        return Err(bad("a name is letters, digits, '-', '_' and '.' only"));
    }
    for label in trimmed.split('.') {
        if label.is_empty() {
            return Err(bad("the name has an empty label"));
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(bad("the name has a label longer than 63 bytes"));
        }
    }
    if looks_like_ip(trimmed) {
        return Err(bad("an IP literal is not a name"));
    }
    Ok(trimmed.to_ascii_lowercase())
}

/// True when a resolver could read `text` as an address rather than a name:
/// IPv6 literals contain ':'; the inet_aton IPv4 forms (`127.1`, `0x7f.1`,
/// `2130706433`) end in a numeric or `0x` hex label, and no real top-level
/// domain is numeric (RFC 3696 §2).
fn looks_like_ip(text: &str) -> bool {
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    if inner.contains(':') || inner.parse::<IpAddr>().is_ok() {
        return true;
    }
    let last = inner.rsplit('.').next().unwrap_or(inner);
    let lower = last.to_ascii_lowercase();
    let numeric = !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit());
    let hex = lower
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    numeric || hex
}

/// A session's source address: the address its connections come from, by
/// which the gateway names the session.
pub fn source(text: &str) -> Result<IpAddr, Error> {
    text.parse::<IpAddr>().map_err(|_| {
        Error::invalid(format!(
            "source {:?} is not an IP address",
            text.chars().take(100).collect::<String>()
        ))
    })
}

/// Check a secret value can go into a header and the gateway's masker:
/// not empty, at most [`MAX_SECRET_LEN`] bytes, no control character but
/// tab (RFC 9110 field-value). The error names the secret, never the value.
pub fn secret_value(name: &str, value: &[u8]) -> Result<(), Error> {
    let bad = |reason: String| Error::SecretValueInvalid {
        name: name.to_owned(),
        reason,
    };
    if value.is_empty() {
        return Err(bad("the value is empty".into()));
    }
    if value.len() > MAX_SECRET_LEN {
        return Err(bad(format!(
            "the value is {} bytes, more than {MAX_SECRET_LEN}",
            value.len()
        )));
    }
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(bad(
            "the value holds a byte that cannot be sent in a header (control character)".into(),
        ));
    }
    Ok(())
}

/// Remove one trailing line ending (`\n` or `\r\n`): `echo value | …` and a
/// file an editor saved both end in one, and a header value cannot hold it.
pub fn trim_line_ending(value: &mut Vec<u8>) {
    if value.ends_with(b"\n") {
        value.pop();
        if value.ends_with(b"\r") {
            value.pop();
        }
    }
}

/// `SECRET=destination:header[:scheme]`: which secret the gateway adds to
/// which destination's requests, in which header. Never holds a value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttachSpec {
    /// The secret's name in the tenant's secret store.
    pub secret: String,
    /// The destination (canonical name) whose requests carry it.
    pub destination: String,
    /// The header (lower case) the gateway sets.
    pub header: String,
    /// Written before the value with one space (`Bearer`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
}

impl AttachSpec {
    /// Parse `SECRET=destination:header[:scheme]` as the gateway does.
    pub fn parse(spec: &str) -> Result<AttachSpec, Error> {
        let shown: String = spec.chars().take(200).collect();
        let bad = |reason: &str| Error::invalid(format!("attachment {shown:?}: {reason}"));
        let (secret, rest) = spec
            .split_once('=')
            .ok_or_else(|| bad("expected SECRET=destination:header[:scheme]"))?;
        let secret = secret_name(secret)
            .map_err(|_| bad("the secret name must be letters, digits, '_', '-' or '.'"))?;
        let mut parts = rest.splitn(3, ':');
        let dest = parts.next().unwrap_or_default();
        let header = parts
            .next()
            .ok_or_else(|| bad("no header after the destination"))?;
        let scheme = parts.next();
        let destination = destination(dest).map_err(|e| bad(&e.to_string()))?;
        if header.is_empty() || header.len() > MAX_HEADER_LEN || !header.bytes().all(is_tchar) {
            return Err(bad("the header is not a valid header name"));
        }
        let header = header.to_ascii_lowercase();
        if FORBIDDEN_HEADERS.contains(&header.as_str()) {
            return Err(bad(&format!(
                "the gateway does not let an attachment set {header}"
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
            secret,
            destination,
            header,
            scheme,
        })
    }
}

/// A `tchar` of RFC 9110 §5.6.2: what a header name is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants() {
        for ok in ["a", "acme", "0", "acme.prod-1_x", &"a".repeat(63)] {
            assert!(tenant(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Acme", "-a", ".a", "a b", "a/b", &"a".repeat(64)] {
            assert_eq!(tenant(bad).unwrap_err().code(), "name_invalid", "{bad}");
        }
    }

    #[test]
    fn destinations() {
        assert_eq!(destination("API.GitHub.com.").unwrap(), "api.github.com");
        for bad in [
            "",
            ".",
            "a..b",
            "10.0.0.1",
            "127.1",
            "0x7f.1",
            "[::1]",
            "::1",
            "*.example.com",
            "exa mple.com",
        ] {
            assert!(destination(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn attachments() {
        let a = AttachSpec::parse("GITHUB_TOKEN=API.github.com:Authorization:Bearer").unwrap();
        assert_eq!(
            a,
            AttachSpec {
                secret: "GITHUB_TOKEN".into(),
                destination: "api.github.com".into(),
                header: "authorization".into(),
                scheme: Some("Bearer".into()),
            }
        );
        assert_eq!(
            AttachSpec::parse("K=api.example.com:x-api-key")
                .unwrap()
                .scheme,
            None
        );
        for bad in [
            "K",
            "=a.com:h",
            "K=a.com",
            "K=10.0.0.1:h",
            "K=a.com:",
            "K=a.com:bad header",
            "K=a.com:host",
            "K=a.com:h:",
            "K=a.com:h:two words",
        ] {
            assert_eq!(
                AttachSpec::parse(bad).unwrap_err().code(),
                "sandbox_request_invalid",
                "{bad}"
            );
        }
    }

    #[test]
    fn secret_values() {
        assert!(secret_value("K", b"tok\tx").is_ok());
        for bad in [&b""[..], b"a\nb", b"a\rb", b"\0", b"\x7f"] {
            assert_eq!(
                secret_value("K", bad).unwrap_err().code(),
                "secret_value_invalid"
            );
        }
        assert!(secret_value("K", &vec![b'a'; MAX_SECRET_LEN + 1]).is_err());
        let mut v = b"tok\r\n".to_vec();
        trim_line_ending(&mut v);
        assert_eq!(v, b"tok");
        let mut v = b"tok\n\n".to_vec();
        trim_line_ending(&mut v);
        assert_eq!(v, b"tok\n");
    }
}
