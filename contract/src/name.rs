//! Destination names: one canonical form, compared exactly.
//!
//! Every name the gateway compares — a hello's SNI, an allowlist entry, a
//! `Host` header — every name the control plane stores, and every name a
//! session CA is made for (`talos_certs`) goes through [`canonicalize`]
//! first: ASCII lower case and one trailing dot removed. Nothing else is
//! rewritten: no IDNA mapping, no percent-decoding, no wildcard. What is
//! not a name within DNS's limits is refused here, once, for every side: a
//! label of more than 63 octets, a name of more than 253 (255 on the wire),
//! an empty label, a byte outside letters, digits, `-`, `_` and `.`, and a
//! label that starts or ends with `-` (RFC 1123 host names; certificate
//! verifiers refuse such names too). A name that is an IP literal, in any
//! form a resolver might read as one (`10.0.0.1`, `127.1`, `0x7f.1`,
//! `[::1]`), is not a name and never matches.

use std::fmt;

/// The longest DNS name in presentation form (RFC 1035 §2.3.4, without the
/// trailing dot).
pub const MAX_NAME_LEN: usize = 253;
/// The longest DNS label (RFC 1035 §2.3.4).
pub const MAX_LABEL_LEN: usize = 63;

/// A destination name in canonical form.
///
/// invariant: non-empty, at most [`MAX_NAME_LEN`] bytes, lower-case ASCII
/// letters, digits, `-`, `_` and `.` only, no empty label, no trailing dot,
/// and not an IP literal.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(Box<str>);

impl Name {
    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl serde::Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        canonicalize(&text).map_err(serde::de::Error::custom)
    }
}

/// Why a text is not a destination name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("the name is empty")]
    Empty,
    #[error("{got:?} is longer than {MAX_NAME_LEN} bytes")]
    TooLong { got: String },
    #[error("{got:?} has an empty label")]
    EmptyLabel { got: String },
    #[error("{got:?} has a label longer than {MAX_LABEL_LEN} bytes")]
    LabelTooLong { got: String },
    #[error("{got:?} has a byte that is not a letter, digit, '-', '_' or '.'")]
    BadByte { got: String },
    #[error("{got:?} has a label that starts or ends with '-'")]
    EdgeHyphen { got: String },
    #[error("{got:?} is an IP literal, not a name")]
    IpLiteral { got: String },
}

impl NameError {
    /// Why, without the text: for answers that must never echo a value.
    pub fn brief(&self) -> &'static str {
        match self {
            NameError::IpLiteral { .. } => "an IP literal is not a name",
            _ => "not a host name",
        }
    }

    /// The rule broken, without the text.
    pub fn rule(&self) -> &'static str {
        match self {
            NameError::Empty => "it is empty",
            NameError::TooLong { .. } => "it is longer than 253 bytes",
            NameError::EmptyLabel { .. } => "it has an empty label",
            NameError::LabelTooLong { .. } => "it has a label longer than 63 bytes",
            NameError::BadByte { .. } => {
                "it has a byte other than a letter, digit, '-', '_' or '.'"
            }
            NameError::EdgeHyphen { .. } => "it has a label that starts or ends with '-'",
            NameError::IpLiteral { .. } => "an IP literal is not a host name",
        }
    }
}

/// Canonical form of `text`: ASCII lower case, one trailing dot removed.
///
/// Refuses anything that is not a plain DNS host name, including every IP
/// literal form.
pub fn canonicalize(text: &str) -> Result<Name, NameError> {
    let got = || text.chars().take(300).collect::<String>();
    let trimmed = text.strip_suffix('.').unwrap_or(text);
    if trimmed.is_empty() {
        return Err(NameError::Empty);
    }
    if trimmed.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong { got: got() });
    }
    if !trimmed
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        // `[::1]`, `fe80::1%eth0`, spaces, non-ASCII: none is a host name.
        if looks_like_ip(trimmed) {
            return Err(NameError::IpLiteral { got: got() });
        }
        return Err(NameError::BadByte { got: got() });
    }
    for label in trimmed.split('.') {
        if label.is_empty() {
            return Err(NameError::EmptyLabel { got: got() });
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(NameError::LabelTooLong { got: got() });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(NameError::EdgeHyphen { got: got() });
        }
    }
    if looks_like_ip(trimmed) {
        return Err(NameError::IpLiteral { got: got() });
    }
    Ok(Name(trimmed.to_ascii_lowercase().into_boxed_str()))
}

/// True when a resolver could read `text` as an address rather than a name.
///
/// IPv6 literals contain ':'; the inet_aton IPv4 forms (`127.1`, `0x7f.1`,
/// `2130706433`) all end in a label made of digits or a `0x` hex number, and
/// no real top-level domain is numeric (RFC 3696 §2), so a name whose last
/// label is numeric is treated as a literal.
fn looks_like_ip(text: &str) -> bool {
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    if inner.contains(':') || inner.parse::<std::net::IpAddr>().is_ok() {
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

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! names {
        ($($text:expr => $want:expr,)*) => {
            $(
                let got = canonicalize($text).map(|n| n.as_str().to_owned());
                assert_eq!(got.as_deref().map_err(|_| ()), $want, "canonicalize({:?})", $text);
            )*
        };
    }

    #[test]
    fn canonical_forms() {
        names! {
            "api.github.com" => Ok("api.github.com"),
            "API.GitHub.COM" => Ok("api.github.com"),
            "api.github.com." => Ok("api.github.com"),
            "api.github.com.." => Err(()),
            "." => Err(()),
            "" => Err(()),
            "a..b" => Err(()),
            ".a.b" => Err(()),
            "xn--bcher-kva.example" => Ok("xn--bcher-kva.example"),
            "bücher.example" => Err(()),
            "under_score.example" => Ok("under_score.example"),
            "with space.example" => Err(()),
            "10.0.0.1" => Err(()),
            "127.1" => Err(()),
            "2130706433" => Err(()),
            "0x7f.0.0.1" => Err(()),
            "0x7f000001" => Err(()),
            "[::1]" => Err(()),
            "::1" => Err(()),
            "fe80::1%eth0" => Err(()),
            "1.2.3.4.example" => Ok("1.2.3.4.example"),
            "example.123" => Err(()),
            "localhost" => Ok("localhost"),
            "-a.example" => Err(()),
            "a-.example" => Err(()),
            "a.-example" => Err(()),
            "a-b.example" => Ok("a-b.example"),
            "*.example" => Err(()),
        }
    }

    #[test]
    fn length_limits() {
        let label = "a".repeat(MAX_LABEL_LEN);
        assert!(canonicalize(&format!("{label}.example")).is_ok());
        assert!(matches!(
            canonicalize(&format!("a{label}.example")),
            Err(NameError::LabelTooLong { .. })
        ));
        let long = ["abcdefghi"; 26].join(".");
        assert!(long.len() > MAX_NAME_LEN);
        assert!(matches!(
            canonicalize(&long),
            Err(NameError::TooLong { .. })
        ));
        // 253 bytes is a name, with or without the root's dot (255 octets
        // on the wire); 254 is not, nor 255 with a dot.
        let at = |n: usize| {
            let mut name = ["a"; 130].join(".");
            name.truncate(n);
            if name.ends_with('.') {
                name.pop();
                name.push('b');
            }
            name
        };
        assert_eq!(at(253).len(), 253);
        assert!(canonicalize(&at(253)).is_ok());
        assert!(canonicalize(&format!("{}.", at(253))).is_ok());
        assert!(canonicalize(&at(254)).is_err());
        assert!(canonicalize(&at(255)).is_err());
        assert!(canonicalize(&format!("{}.", at(254))).is_err());
    }
}
