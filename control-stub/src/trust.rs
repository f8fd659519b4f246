//! The trust bundle a session's instance is given (`sandbox trust`): the
//! certificates of the CAs its members made for the current attempt and,
//! when that attempt opened a passthrough name, the public roots after
//! them.
//!
//! A passthrough destination (the model route) is not terminated: the
//! session's client meets the destination's own certificate, issued under
//! the public roots, which the session CA alone cannot verify. So a
//! session whose allowlist holds a passthrough name trusts the public
//! roots beside its session CA. That is safe only because every port-443
//! connection from the session reaches the gateway, which terminates
//! every other listed name with the session CA (whose name constraints
//! leave the passthrough names out) and refuses every name off the list:
//! a certificate under the public roots can only ever be met for a
//! passthrough name, from the destination itself. A session without one
//! trusts its session CA alone, as before (`docs/clients.md`,
//! "Passthrough destinations").
//!
//! The public roots come from a PEM file: by default the system's bundle
//! (the first of [`SYSTEM_BUNDLES`] that exists), or the file `sandbox
//! trust --public-roots` names (an operator whose system bundle holds
//! private CAs of its own gives a file of public roots alone; tests give a
//! test CA standing in for them). A file, not roots compiled in: the
//! clients need the roots' certificates, where webpki-roots carries only
//! the anchors' names and keys, and the system's bundle is kept current by
//! the distribution's security updates without a new release of this
//! program. The file is checked: certificates only (a private key in it is
//! refused, never passed on to a session), each one parsing as a trust
//! anchor, at least one; each is written again as PEM, so nothing else the
//! file holds (comments, other blocks) reaches the bundle.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use rustls::pki_types::CertificateDer;

use crate::error::Error;

/// Where distributions keep the system's bundle of public roots, in the
/// order they are tried: Debian and Ubuntu, Fedora and RHEL (two
/// places), Alpine, openSUSE: the same list as the session image's
/// `ops/session-image/trust-session-ca.sh`.
pub const SYSTEM_BUNDLES: [&str; 5] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// What a running session trusts, from the store: the PEM certificates of
/// its current attempt's live CAs, and the names that attempt opened as
/// passthrough.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionTrust {
    /// One PEM certificate each, in the members' order.
    pub cas: Vec<String>,
    /// The attempt's passthrough names (none: the session CA alone).
    pub passthrough: Vec<String>,
}

impl SessionTrust {
    /// The bundle, as `sandbox trust` prints it: the CAs, then, if the
    /// attempt opened a passthrough name, the public roots from `roots`
    /// (none: the first of [`SYSTEM_BUNDLES`] that exists). Without a live
    /// CA there is nothing to trust, and the bundle is empty.
    pub fn bundle(&self, roots: Option<&Path>) -> Result<String, Error> {
        let system: Vec<&Path> = SYSTEM_BUNDLES.iter().map(Path::new).collect();
        self.bundle_from(roots, &system)
    }

    /// [`SessionTrust::bundle`], the system's bundle looked for in
    /// `system` (tests give their own places).
    pub fn bundle_from(&self, roots: Option<&Path>, system: &[&Path]) -> Result<String, Error> {
        let mut bundle = String::new();
        for ca in &self.cas {
            bundle.push_str(ca.trim_end());
            bundle.push('\n');
        }
        if !self.cas.is_empty() && !self.passthrough.is_empty() {
            let path = match roots {
                Some(p) => p.to_owned(),
                None => system_bundle(system)?,
            };
            for root in public_roots(&path)? {
                bundle.push_str(&pem(&root));
            }
        }
        Ok(bundle.trim_end().to_owned())
    }
}

/// The first of `places` that exists.
fn system_bundle(places: &[&Path]) -> Result<PathBuf, Error> {
    places
        .iter()
        .find(|p| p.exists())
        .map(|p| p.to_path_buf())
        .ok_or_else(|| Error::Io {
            what: "public roots".into(),
            reason: format!(
                "the session lists a passthrough name, so its bundle needs the public roots, and no system bundle is here ({}): give a PEM file of them with --public-roots",
                places
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
}

/// The certificates of the public roots file at `path`, checked (see the
/// module docs).
fn public_roots(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let invalid = |reason: String| Error::PublicRootsInvalid {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read(path).map_err(|e| Error::Io {
        what: format!("public roots file {}", path.display()),
        reason: e.to_string(),
    })?;
    let mut roots = Vec::new();
    for item in rustls_pemfile::read_all(&mut text.as_slice()) {
        match item.map_err(|e| invalid(format!("not PEM: {e}")))? {
            rustls_pemfile::Item::X509Certificate(der) => {
                webpki::anchor_from_trusted_cert(&der).map_err(|e| {
                    invalid(format!(
                        "certificate {} does not parse as a trust anchor: {e}",
                        roots.len() + 1
                    ))
                })?;
                roots.push(der);
            }
            rustls_pemfile::Item::Pkcs1Key(_)
            | rustls_pemfile::Item::Pkcs8Key(_)
            | rustls_pemfile::Item::Sec1Key(_) => {
                return Err(invalid(
                    "it holds a private key: a session is never given one".into(),
                ))
            }
            other => {
                return Err(invalid(format!(
                    "it holds a PEM block other than a certificate ({}): a roots file holds certificates only",
                    item_kind(&other)
                )))
            }
        }
    }
    if roots.is_empty() {
        return Err(invalid("it holds no PEM certificate".into()));
    }
    Ok(roots)
}

/// What a PEM block that is no certificate holds, for the error.
fn item_kind(item: &rustls_pemfile::Item) -> &'static str {
    match item {
        rustls_pemfile::Item::Crl(_) => "a CRL",
        rustls_pemfile::Item::Csr(_) => "a certificate request",
        rustls_pemfile::Item::SubjectPublicKeyInfo(_) => "a public key",
        _ => "another kind",
    }
}

/// A certificate as PEM: base64 in lines of 64 characters (RFC 7468).
fn pem(der: &[u8]) -> String {
    const LINE: usize = 64;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(text.len() + text.len() / LINE + 64);
    out.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(LINE) {
        // base64's alphabet is ASCII.
        out.extend(line.iter().map(|&b| char::from(b)));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}
