//! Attachments: which secret the gateway adds to which destination's
//! requests, in which header — `SECRET=destination:header[:scheme]` as the
//! CLI's `--attach` and a static session write it, or the same four parts
//! as the control channel sends them. Never a value.

use std::fmt;

use crate::name::{self, Name, NameError};
use crate::secret::is_secret_name;

/// The longest header name an attachment may set, in bytes.
pub const MAX_HEADER_LEN: usize = 128;

/// Headers an attachment may not set: framing, routing and hop-by-hop
/// headers, whose meaning the gateway itself decides.
pub const FORBIDDEN_HEADERS: [&str; 12] = [
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

/// Which part of an attachment is at fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The attachment as a whole (its shape, or a header it may not set).
    Whole,
    Secret,
    Destination,
    Header,
    Scheme,
}

impl Part {
    /// The part's field name on the control channel, if it has one.
    pub fn field(self) -> Option<&'static str> {
        match self {
            Part::Whole => None,
            Part::Secret => Some("secret"),
            Part::Destination => Some("destination"),
            Part::Header => Some("header"),
            Part::Scheme => Some("scheme"),
        }
    }
}

/// Why an attachment is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("expected SECRET=destination:header[:scheme]")]
    Shape,
    #[error("no header after the destination")]
    NoHeader,
    #[error("the secret name must be letters, digits, '_', '-' or '.'")]
    SecretName,
    #[error("destination: {0}")]
    Destination(NameError),
    #[error("the header is not a valid header name")]
    Header,
    #[error("the gateway does not let an attachment set {0}")]
    ForbiddenHeader(String),
    #[error("the scheme must be visible ASCII, without spaces")]
    Scheme,
}

impl AttachError {
    /// The part at fault.
    pub fn part(&self) -> Part {
        match self {
            AttachError::Shape | AttachError::NoHeader | AttachError::ForbiddenHeader(_) => {
                Part::Whole
            }
            AttachError::SecretName => Part::Secret,
            AttachError::Destination(_) => Part::Destination,
            AttachError::Header => Part::Header,
            AttachError::Scheme => Part::Scheme,
        }
    }

    /// Why, without any text of the request (the destination's own text
    /// left out).
    pub fn brief(&self) -> String {
        match self {
            AttachError::Destination(e) => e.brief().to_owned(),
            other => other.to_string(),
        }
    }
}

/// A checked attachment.
///
/// invariant: the secret is a secret name, the destination canonical, the
/// header a lower-case header name of at most [`MAX_HEADER_LEN`] bytes and
/// not one of [`FORBIDDEN_HEADERS`], the scheme (if any) visible ASCII.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttachSpec {
    secret: String,
    destination: Name,
    header: String,
    scheme: Option<String>,
}

impl AttachSpec {
    /// Parse `SECRET=destination:header[:scheme]`.
    pub fn parse(text: &str) -> Result<AttachSpec, AttachError> {
        let (secret, rest) = text.split_once('=').ok_or(AttachError::Shape)?;
        if !is_secret_name(secret) {
            return Err(AttachError::SecretName);
        }
        let mut parts = rest.splitn(3, ':');
        let destination = parts.next().unwrap_or_default();
        let header = parts.next().ok_or(AttachError::NoHeader)?;
        AttachSpec::from_parts(secret, destination, header, parts.next())
    }

    /// Check the four parts.
    pub fn from_parts(
        secret: &str,
        destination: &str,
        header: &str,
        scheme: Option<&str>,
    ) -> Result<AttachSpec, AttachError> {
        if !is_secret_name(secret) {
            return Err(AttachError::SecretName);
        }
        let destination = name::canonicalize(destination).map_err(AttachError::Destination)?;
        if header.is_empty() || header.len() > MAX_HEADER_LEN || !header.bytes().all(is_tchar) {
            return Err(AttachError::Header);
        }
        let header = header.to_ascii_lowercase();
        if FORBIDDEN_HEADERS.contains(&header.as_str()) {
            return Err(AttachError::ForbiddenHeader(header));
        }
        let scheme = match scheme {
            None => None,
            Some(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic()) => {
                Some(s.to_owned())
            }
            Some(_) => return Err(AttachError::Scheme),
        };
        Ok(AttachSpec {
            secret: secret.to_owned(),
            destination,
            header,
            scheme,
        })
    }

    /// The secret's name.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The destination whose requests carry it.
    pub fn destination(&self) -> &Name {
        &self.destination
    }

    /// The header (lower case) the gateway sets.
    pub fn header(&self) -> &str {
        &self.header
    }

    /// Written before the value with one space (`Bearer`), if any.
    pub fn scheme(&self) -> Option<&str> {
        self.scheme.as_deref()
    }
}

/// The text form, `SECRET=destination:header[:scheme]`.
impl fmt::Display for AttachSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}:{}", self.secret, self.destination, self.header)?;
        match &self.scheme {
            Some(s) => write!(f, ":{s}"),
            None => Ok(()),
        }
    }
}

/// A `tchar` of RFC 9110 §5.6.2: what a header name (and a method) is
/// made of.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_as_the_cli_writes_them() {
        let s = AttachSpec::parse("GH=API.github.com:Authorization:Bearer").unwrap();
        assert_eq!(s.secret(), "GH");
        assert_eq!(s.destination().as_str(), "api.github.com");
        assert_eq!(s.header(), "authorization");
        assert_eq!(s.scheme(), Some("Bearer"));
        assert_eq!(s.to_string(), "GH=api.github.com:authorization:Bearer");
        let s = AttachSpec::parse("K=x.example:x-api-key").unwrap();
        assert_eq!(s.scheme(), None);
        for (bad, part) in [
            ("nohost", Part::Whole),
            ("=x.example:h", Part::Secret),
            ("K=x.example", Part::Whole),
            ("K=10.0.0.1:h", Part::Destination),
            ("K=x.example:", Part::Header),
            ("K=x.example:bad header", Part::Header),
            ("K=x.example:host", Part::Whole),
            ("K=x.example:Content-Length", Part::Whole),
            ("K=x.example:h:two words", Part::Scheme),
            ("K=x.example:h:", Part::Scheme),
        ] {
            assert_eq!(AttachSpec::parse(bad).unwrap_err().part(), part, "{bad}");
        }
    }

    #[test]
    fn parts_are_checked_alone() {
        assert_eq!(
            AttachSpec::from_parts("K", "x.example", "x:y", None),
            Err(AttachError::Header)
        );
        let e = AttachSpec::from_parts("K", "10.0.0.1", "h", None).unwrap_err();
        assert_eq!(e.brief(), "an IP literal is not a name");
        assert!(AttachSpec::from_parts("K", "a.example", &"h".repeat(129), None).is_err());
    }
}
