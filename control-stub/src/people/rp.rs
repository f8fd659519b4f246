//! The relying party: the web app's origin and rp id, which every passkey
//! ceremony is checked against, and the small pieces every ceremony uses
//! (random tokens, their hashes, base64url, times).

use std::time::SystemTime;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use zeroize::Zeroizing;

use crate::error::Error;

/// The web app's origin and rp id (`serve --web-origin`, `--web-rp-id`).
///
/// The origin is `https://NAME[:PORT]`, exactly as browsers write it into
/// `clientDataJSON` (compared byte for byte: lower case, no default port,
/// no path); the rp id is NAME or a domain NAME is under (WebAuthn lets a
/// page use a registrable suffix of its own host; whether it is a public
/// suffix is the operator's to know — browsers refuse one anyway).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelyingParty {
    origin: String,
    rp_id: String,
    host: String,
}

impl RelyingParty {
    /// Check `origin` and `rp_id` (see the type's docs).
    pub fn new(origin: &str, rp_id: &str) -> Result<RelyingParty, Error> {
        let host = origin_host(origin)?;
        let bad_rp = |why: &str| {
            web_invalid(format!(
                "--web-rp-id {:?}: {why}",
                rp_id.chars().take(100).collect::<String>()
            ))
        };
        if !is_dns_name(rp_id) {
            return Err(bad_rp("not a lower-case DNS name"));
        }
        if host != rp_id && !host.ends_with(&format!(".{rp_id}")) {
            return Err(bad_rp(&format!(
                "the origin's host {host} is neither it nor a name under it"
            )));
        }
        Ok(RelyingParty {
            origin: origin.to_owned(),
            rp_id: rp_id.to_owned(),
            host,
        })
    }

    /// The origin, as `clientDataJSON` must carry it.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The rp id.
    pub fn rp_id(&self) -> &str {
        &self.rp_id
    }

    /// The origin's host name (what the web certificate must name).
    pub fn host(&self) -> &str {
        &self.host
    }
}

/// Check a web origin, `https://NAME[:PORT]`; its host.
pub fn origin_host(origin: &str) -> Result<String, Error> {
    let bad = |why: &str| {
        web_invalid(format!(
            "web origin {:?}: {why} (https://NAME or https://NAME:PORT)",
            origin.chars().take(100).collect::<String>()
        ))
    };
    let rest = origin
        .strip_prefix("https://")
        .ok_or_else(|| bad("not https"))?;
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (rest, None),
    };
    if !is_dns_name(host) {
        return Err(bad("the host is not a lower-case DNS name"));
    }
    if let Some(p) = port {
        let ok = !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && !p.starts_with('0')
            && p.parse::<u16>().is_ok_and(|n| n != 443);
        if !ok {
            return Err(bad(
                "the port is not 1-65535 written plainly (443 is left out, as browsers do)",
            ));
        }
    }
    Ok(host.to_owned())
}

/// A lower-case DNS name of two labels or more, each 1-63 letters, digits
/// and inner hyphens; not an IP address (WebAuthn needs a domain).
fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.contains('.')
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        && !name
            .rsplit('.')
            .next()
            .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
}

/// A web app setting refused (`web_config_invalid`).
pub(crate) fn web_invalid(reason: impl Into<String>) -> Error {
    Error::WebConfigInvalid {
        reason: reason.into(),
    }
}

/// `n` random bytes from the operating system's generator.
pub fn random(n: usize) -> Result<Zeroizing<Vec<u8>>, Error> {
    let mut bytes = Zeroizing::new(vec![0u8; n]);
    aws_lc_rs::rand::fill(bytes.as_mut_slice()).map_err(|_| Error::Io {
        what: "random".into(),
        reason: "the system random generator failed".into(),
    })?;
    Ok(bytes)
}

/// A fresh bearer token (an enrolment link's, a session cookie's): 32
/// random bytes, base64url (43 characters). Only its [`token_hash`] is
/// stored.
pub fn new_token() -> Result<Zeroizing<String>, Error> {
    Ok(Zeroizing::new(b64(&random(32)?)))
}

/// SHA-256 (hex) of a token, as stored and looked up.
pub fn token_hash(token: &str) -> String {
    hex::encode(aws_lc_rs::digest::digest(
        &aws_lc_rs::digest::SHA256,
        token.as_bytes(),
    ))
}

/// base64url without padding, WebAuthn's encoding of binary fields.
pub fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// base64url text (padding tolerated) to bytes, or why not, naming
/// `what` and never the value.
pub fn unb64(what: &str, text: &str, max: usize) -> Result<Vec<u8>, Error> {
    if text.len() > max.div_ceil(3) * 4 + 4 {
        return Err(Error::PasskeyRefused {
            reason: "malformed",
            detail: format!("{what} is longer than {max} bytes"),
        });
    }
    URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|_| Error::PasskeyRefused {
            reason: "malformed",
            detail: format!("{what} is not base64url"),
        })
}

/// RFC 3339 UTC with milliseconds: the store's form of a time.
pub fn at(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A stored time read back (one that does not parse counts as long past).
pub fn parse_at(text: &str) -> SystemTime {
    humantime::parse_rfc3339_weak(text).unwrap_or(SystemTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_and_rp_ids_are_checked() {
        let rp = RelyingParty::new("https://people.talos.test:8443", "people.talos.test").unwrap();
        assert_eq!(rp.host(), "people.talos.test");
        RelyingParty::new("https://people.talos.test", "talos.test").unwrap();
        for (origin, rp_id) in [
            ("http://people.talos.test", "people.talos.test"),
            ("https://people.talos.test/", "people.talos.test"),
            ("https://People.talos.test", "people.talos.test"),
            ("https://people.talos.test:443", "people.talos.test"),
            ("https://people.talos.test:08443", "people.talos.test"),
            ("https://people.talos.test:70000", "people.talos.test"),
            ("https://127.0.0.1", "127.0.0.1"),
            ("https://localhost", "localhost"),
            ("https://people.talos.test", "other.test"),
            ("https://people.talos.test", "eople.talos.test"),
            ("https://people.talos.test", "alos.test"),
        ] {
            assert!(
                RelyingParty::new(origin, rp_id).is_err(),
                "{origin} {rp_id}"
            );
        }
    }

    #[test]
    fn tokens_are_random_and_only_their_hash_is_kept() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_ne!(*a, *b);
        assert_eq!(a.len(), 43);
        assert_eq!(token_hash(&a).len(), 64);
        assert_ne!(token_hash(&a), token_hash(&b));
    }
}
