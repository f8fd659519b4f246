//! The certificate authority of one session.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::CertificateDer;
use time::OffsetDateTime;

use crate::digest::{certificate_pem, sha384_hex};
use crate::error::CertError;
use crate::key::EcKey;
use crate::leaf::{self, Leaf};
use crate::names::{check_host_name, check_not_nested, exact_name_constraints, APPROVALS_NAME};

/// How long a session CA stays valid when [`CaParams::new`] is used: eight
/// days. A session is paused for at most seven days, and a pause drops the
/// CA, so eight days covers any stretch one CA has to serve with a day to
/// spare; a session running longer gets a new CA as on resume.
pub const DEFAULT_CA_LIFETIME: Duration = Duration::from_secs(8 * 24 * 60 * 60);

/// The longest lifetime [`SessionCa::new`] accepts: 31 days. The CA's key
/// never leaves the process, but certificates it signed are trusted by the
/// session until they expire, so the bound keeps that window short.
pub const MAX_CA_LIFETIME: Duration = Duration::from_secs(31 * 24 * 60 * 60);

/// How far before its creation a certificate's validity starts: one hour,
/// so a session whose clock runs behind the gateway's still accepts it.
pub const NOT_BEFORE_SKEW: Duration = Duration::from_secs(60 * 60);

/// Longest session or gateway id that goes into the CA's common name, in
/// bytes. Ids are short tokens; the bound keeps the subject readable.
const MAX_ID_LEN: usize = 128;

/// What a session CA is made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaParams {
    /// The session's id as the control plane names it (printable, 1 to 128
    /// bytes).
    pub session_id: String,
    /// The session's attempt number.
    pub attempt: u32,
    /// The id of the gateway (pair member) making the CA (printable, 1 to
    /// 128 bytes).
    pub gateway_id: String,
    /// The session's allowlist: canonical host names (lower-case ASCII, no
    /// trailing dot). Duplicates are ignored; [`APPROVALS_NAME`] is always
    /// added.
    pub names: Vec<String>,
    /// How long from now the CA stays valid. Default
    /// [`DEFAULT_CA_LIFETIME`] (8 days); between 1 second and
    /// [`MAX_CA_LIFETIME`] (31 days).
    pub lifetime: Duration,
}

impl CaParams {
    /// Parameters with the default lifetime.
    pub fn new<I, S>(
        session_id: impl Into<String>,
        attempt: u32,
        gateway_id: impl Into<String>,
        names: I,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        CaParams {
            session_id: session_id.into(),
            attempt,
            gateway_id: gateway_id.into(),
            names: names.into_iter().map(Into::into).collect(),
            lifetime: DEFAULT_CA_LIFETIME,
        }
    }
}

/// A certificate authority made for one session, permitting exactly the
/// session's names.
///
/// The certificate: ECDSA P-256, self-signed; subject CN `TALOS session CA
/// <session id> attempt <n> (<gateway id>)`; valid from
/// [`NOT_BEFORE_SKEW`] before creation to its lifetime after;
/// BasicConstraints `CA:TRUE, pathlen:0` and KeyUsage `keyCertSign,
/// cRLSign`, both critical; Name Constraints (critical) permitting exactly
/// [`names`](SessionCa::names), as the crate docs explain.
///
/// The private key lives inside aws-lc for as long as this value does and
/// is cleansed when it is dropped. Not `Clone`, and `Debug` shows the
/// digest, never key material.
pub struct SessionCa {
    // invariant: the issuer's key is the key of `issuer.der()`, made by
    // `EcKey::generate` in `new` and never encoded.
    issuer: CertifiedIssuer<'static, EcKey>,
    /// `sha384_hex` of the certificate DER.
    digest: String,
    // invariant: sorted, deduplicated, each passed `check_host_name`,
    // contains APPROVALS_NAME; exactly the names of the name constraints.
    names: Vec<String>,
    session_id: String,
    attempt: u32,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

impl SessionCa {
    /// Makes a fresh key and a CA certificate for `params`.
    ///
    /// Refuses (naming the value) an empty or non-printable id, a lifetime
    /// of zero or over [`MAX_CA_LIFETIME`], and any name that is not a
    /// canonical host name: empty, a wildcard, an IP literal, upper case,
    /// a trailing dot. Refuses names of which one lies under another
    /// ([`CertError::NestedNames`]; see the crate docs' `# Limits`).
    pub fn new(params: &CaParams) -> Result<SessionCa, CertError> {
        check_id("session_id", &params.session_id)?;
        check_id("gateway_id", &params.gateway_id)?;
        if params.lifetime < Duration::from_secs(1) || params.lifetime > MAX_CA_LIFETIME {
            return Err(CertError::BadLifetime {
                lifetime: params.lifetime,
                max: MAX_CA_LIFETIME,
            });
        }

        let mut names = BTreeSet::new();
        for name in &params.names {
            check_host_name(name)?;
            names.insert(name.clone());
        }
        names.insert(APPROVALS_NAME.to_owned());
        check_not_nested(&names)?;
        let names: Vec<String> = names.into_iter().collect();

        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| CertError::Clock("it reads before 1970"))?;
        let not_before = to_datetime(now.saturating_sub(NOT_BEFORE_SKEW))?;
        let not_after = to_datetime(now + params.lifetime)?;

        let common_name = format!(
            "TALOS session CA {} attempt {} ({})",
            params.session_id, params.attempt, params.gateway_id
        );
        let mut cert_params = CertificateParams::default();
        cert_params.distinguished_name = DistinguishedName::new();
        cert_params
            .distinguished_name
            .push(DnType::CommonName, common_name.as_str());
        cert_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        cert_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        cert_params.name_constraints = Some(exact_name_constraints(&names));
        cert_params.not_before = not_before;
        cert_params.not_after = not_after;

        let issuer =
            CertifiedIssuer::self_signed(cert_params, EcKey::generate()?).map_err(|source| {
                CertError::Build {
                    subject: common_name,
                    source,
                }
            })?;
        let digest = sha384_hex(issuer.der());

        Ok(SessionCa {
            issuer,
            digest,
            names,
            session_id: params.session_id.clone(),
            attempt: params.attempt,
            not_before,
            not_after,
        })
    }

    /// The CA certificate's DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        self.issuer.der()
    }

    /// The CA certificate as PEM, for the session's trust bundle.
    pub fn cert_pem(&self) -> String {
        certificate_pem(self.cert_der())
    }

    /// SHA-384 of the certificate's DER, 96 lowercase hex digits: the name
    /// the control plane and the drop report use for this CA.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The names this CA permits, sorted: the session's allowlist plus
    /// [`APPROVALS_NAME`].
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether this CA permits `name` (exact match; names are canonical).
    pub fn permits(&self, name: &str) -> bool {
        self.names
            .binary_search_by(|listed| listed.as_str().cmp(name))
            .is_ok()
    }

    /// When the CA's (and its leaves') validity starts.
    pub fn not_before(&self) -> SystemTime {
        to_system_time(self.not_before)
    }

    /// When the CA's (and its leaves') validity ends.
    pub fn not_after(&self) -> SystemTime {
        to_system_time(self.not_after)
    }

    /// Mints a fresh leaf for `name`, uncached (see
    /// [`LeafCache`](crate::LeafCache) for the cached path).
    ///
    /// Refuses, before any key is made, a name that is not a host name and
    /// a name this CA does not permit.
    pub fn mint_leaf(&self, name: &str) -> Result<Leaf, CertError> {
        check_host_name(name)?;
        if !self.permits(name) {
            return Err(CertError::NotPermitted {
                name: name.to_owned(),
            });
        }
        self.sign(name, dns_san(name)?)
    }

    /// Signs a leaf for any `name` at all — unlisted names, subdomains,
    /// wildcards (`*.example.com`), IP addresses (as an iPAddress SAN) —
    /// **for tests only**.
    ///
    /// The name-constraint tests need certificates this CA signed for names
    /// it must not vouch for, to show that every verifier refuses them.
    /// [`mint_leaf`](SessionCa::mint_leaf) will not make those, so this
    /// skips its checks. Gateway code never calls it; and a leaf it makes
    /// for a name outside the allowlist fails verification anyway, since
    /// the refusal is the CA certificate's name constraints, not this
    /// crate's checks.
    #[doc(hidden)]
    pub fn sign_any_for_tests(&self, name: &str) -> Result<Leaf, CertError> {
        let san = match name.parse::<IpAddr>() {
            Ok(address) => SanType::IpAddress(address),
            Err(_) => dns_san(name)?,
        };
        self.sign(name, san)
    }

    fn sign(&self, name: &str, san: SanType) -> Result<Leaf, CertError> {
        leaf::sign(
            &self.issuer,
            self.issuer.der(),
            name,
            san,
            self.not_before,
            self.not_after,
        )
    }
}

impl fmt::Debug for SessionCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionCa")
            .field("session_id", &self.session_id)
            .field("attempt", &self.attempt)
            .field("digest", &self.digest)
            .field("names", &self.names.len())
            .finish_non_exhaustive()
    }
}

/// A session or gateway id must be printable text of a sane length: it is
/// shown to people in the CA's subject.
fn check_id(field: &'static str, value: &str) -> Result<(), CertError> {
    let reason = if value.is_empty() {
        "it is empty"
    } else if value.len() > MAX_ID_LEN {
        "it is longer than 128 bytes"
    } else if value.chars().any(char::is_control) {
        "it has a control character"
    } else {
        return Ok(());
    };
    Err(CertError::BadIdentifier {
        field,
        value: value.to_owned(),
        reason,
    })
}

/// `name` as a dNSName SAN (IA5 text; `check_host_name` admits only
/// ASCII, so this fails only for test names).
fn dns_san(name: &str) -> Result<SanType, CertError> {
    let text = Ia5String::try_from(name).map_err(|source| CertError::Build {
        subject: name.to_owned(),
        source,
    })?;
    Ok(SanType::DnsName(text))
}

/// Whole seconds since the epoch as rcgen's date type (certificates carry
/// seconds; anything finer is dropped).
fn to_datetime(since_epoch: Duration) -> Result<OffsetDateTime, CertError> {
    i64::try_from(since_epoch.as_secs())
        .ok()
        .and_then(|secs| OffsetDateTime::from_unix_timestamp(secs).ok())
        .ok_or(CertError::Clock(
            "it reads beyond what a certificate can carry",
        ))
}

fn to_system_time(at: OffsetDateTime) -> SystemTime {
    // Made from a time after the epoch (less an hour's skew), so never
    // negative; saturate rather than panic all the same.
    UNIX_EPOCH + Duration::from_secs(u64::try_from(at.unix_timestamp()).unwrap_or(0))
}
