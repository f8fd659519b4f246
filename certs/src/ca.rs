//! The certificate authority of one session.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, Issuer,
    KeyUsagePurpose, NameConstraints, SanType,
};
use rustls::pki_types::CertificateDer;
use time::OffsetDateTime;
use zeroize::Zeroizing;

use crate::digest::{certificate_pem, sha384_hex};
use crate::error::CertError;
use crate::key::EcKey;
use crate::leaf::{self, Leaf};
use crate::names::{
    check_host_name, exact_name_constraints, nesting_levels, root_name_constraints, APPROVALS_NAME,
};

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

/// The trust material of one session: a root the session trusts, and the
/// intermediates that sign its leaves, permitting exactly the session's
/// names.
///
/// The **root** (what [`cert_der`](SessionCa::cert_der),
/// [`cert_pem`](SessionCa::cert_pem) and [`digest`](SessionCa::digest)
/// give): ECDSA P-256, self-signed; subject CN `TALOS session CA <session
/// id> attempt <n> (<gateway id>)`; BasicConstraints `CA:TRUE, pathlen:1`
/// and KeyUsage `keyCertSign, cRLSign`, both critical; Name Constraints
/// (critical) permitting every one of [`names`](SessionCa::names),
/// excluding the subdomains of each name no other listed name lies under,
/// and excluding every IP address. Its key signs the intermediates inside
/// [`SessionCa::new`] and is dropped (and cleansed by aws-lc) before `new`
/// returns: nothing can sign under the root afterwards.
///
/// One **intermediate** per nesting level (see the crate docs): ECDSA
/// P-256, signed by the root; subject CN `<root CN> level <k>`;
/// BasicConstraints `CA:TRUE, pathlen:0` and KeyUsage `keyCertSign,
/// cRLSign`, both critical; an authority key identifier naming the root;
/// Name Constraints (critical) permitting exactly the names of its level.
/// A leaf is signed by the intermediate of its name's level and sent as
/// `[leaf, intermediate]`.
///
/// All of them are valid from [`NOT_BEFORE_SKEW`] before creation to the
/// lifetime after. The intermediates' private keys live inside aws-lc for
/// as long as this value does and are cleansed when it is dropped. Not
/// `Clone`, and `Debug` shows the digest, never key material.
pub struct SessionCa {
    /// The root certificate's DER. Its key is gone (see `issue_chain`).
    root: CertificateDer<'static>,
    /// `sha384_hex` of `root`.
    digest: String,
    // invariant: `intermediates[k]` is signed by the root's key and its
    // Name Constraints permit exactly the names at level k; its key was
    // made by `EcKey::generate` in `new` (possibly in a predecessor
    // process: `import_handover`) and is encoded only by
    // `export_for_handover`. Never empty.
    intermediates: Vec<Intermediate>,
    /// The root's common name; each intermediate's is it plus ` level <k>`.
    root_name: String,
    // invariant: sorted, deduplicated, each passed `check_host_name`,
    // contains APPROVALS_NAME; exactly the names of the root's permitted
    // subtrees.
    names: Vec<String>,
    // invariant: `levels[i]` is the nesting level of `names[i]`, an index
    // into `intermediates`.
    levels: Vec<usize>,
    session_id: String,
    attempt: u32,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

impl SessionCa {
    /// Makes a fresh root and one intermediate per nesting level of
    /// `params.names`, each with its own fresh key; signs the
    /// intermediates with the root's key, then drops that key.
    ///
    /// Refuses (naming the value) an empty or non-printable id, a lifetime
    /// of zero or over [`MAX_CA_LIFETIME`], and any name that is not a
    /// canonical host name: empty, a wildcard, an IP literal, upper case,
    /// a trailing dot. Names may lie under one another (`example.com` and
    /// `api.example.com`): each is permitted exactly, through the
    /// intermediate of its level.
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
        let names: Vec<String> = names.into_iter().collect();
        let levels = nesting_levels(&names);
        // Levels run from 0 without a gap, and there is at least one name.
        let level_count = levels.iter().max().map_or(1, |highest| highest + 1);

        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| CertError::Clock("it reads before 1970"))?;
        let not_before = to_datetime(now.saturating_sub(NOT_BEFORE_SKEW))?;
        let not_after = to_datetime(now + params.lifetime)?;

        let root_name = format!(
            "TALOS session CA {} attempt {} ({})",
            params.session_id, params.attempt, params.gateway_id
        );
        let root = (
            root_name.clone(),
            ca_params(
                &root_name,
                1,
                root_name_constraints(&names),
                not_before,
                not_after,
            ),
        );
        let intermediates = (0..level_count)
            .map(|level| {
                intermediate_params(&root_name, &names, &levels, level, not_before, not_after)
            })
            .collect();
        let (root, intermediates) = issue_chain(root, intermediates)?;
        let digest = sha384_hex(&root);

        Ok(SessionCa {
            root,
            digest,
            intermediates,
            root_name,
            names,
            levels,
            session_id: params.session_id.clone(),
            attempt: params.attempt,
            not_before,
            not_after,
        })
    }

    /// Everything a successor process needs to go on being this CA — the
    /// root's certificate, each intermediate's certificate and key (PKCS#8
    /// DER, in buffers wiped on drop), the names and validity — for a
    /// handover over a Unix socket between two gateway processes on one
    /// machine (the gateway's `handover`). This is the one place a session
    /// key is ever encoded: the buffers go to the successor's socket and
    /// nowhere else, never to a disk. The root's key is long gone, so the
    /// successor can mint leaves but never another intermediate.
    pub fn export_for_handover(&self) -> Result<CaHandover, CertError> {
        let mut intermediates = Vec::with_capacity(self.intermediates.len());
        for i in &self.intermediates {
            intermediates.push((i.der.to_vec(), i.key().export_pkcs8()?));
        }
        Ok(CaHandover {
            session_id: self.session_id.clone(),
            attempt: self.attempt,
            root_name: self.root_name.clone(),
            names: self.names.clone(),
            not_before: self.not_before.unix_timestamp(),
            not_after: self.not_after.unix_timestamp(),
            root_der: self.root.to_vec(),
            intermediates,
        })
    }

    /// The CA a predecessor process exported: the same root (digest), the
    /// same intermediates and keys. Checks that the names hold together,
    /// that there is one intermediate per nesting level, and that each key
    /// is the one its certificate names.
    pub fn import_handover(h: CaHandover) -> Result<SessionCa, CertError> {
        let mut names = BTreeSet::new();
        for name in &h.names {
            check_host_name(name)?;
            names.insert(name.clone());
        }
        names.insert(APPROVALS_NAME.to_owned());
        let names: Vec<String> = names.into_iter().collect();
        let levels = nesting_levels(&names);
        let level_count = levels.iter().max().map_or(1, |highest| highest + 1);
        let bad = |reason: &'static str| CertError::Handover { reason };
        if h.intermediates.len() != level_count {
            return Err(bad("the intermediates are not one per nesting level"));
        }
        let not_before =
            OffsetDateTime::from_unix_timestamp(h.not_before).map_err(|_| bad("validity"))?;
        let not_after =
            OffsetDateTime::from_unix_timestamp(h.not_after).map_err(|_| bad("validity"))?;
        let mut intermediates = Vec::with_capacity(level_count);
        for (level, (der, key)) in h.intermediates.into_iter().enumerate() {
            let key = EcKey::import_pkcs8(&key)?;
            // The certificate's SubjectPublicKeyInfo holds the key's public
            // point: a key that is not the certificate's never signs.
            if !der
                .windows(key.public_point().len())
                .any(|w| w == key.public_point())
            {
                return Err(bad("an intermediate's key is not its certificate's"));
            }
            let (_, params) =
                intermediate_params(&h.root_name, &names, &levels, level, not_before, not_after);
            intermediates.push(Intermediate {
                issuer: Issuer::new(params, key),
                der: CertificateDer::from(der),
            });
        }
        let root = CertificateDer::from(h.root_der);
        Ok(SessionCa {
            digest: sha384_hex(&root),
            root,
            intermediates,
            root_name: h.root_name,
            names,
            levels,
            session_id: h.session_id,
            attempt: h.attempt,
            not_before,
            not_after,
        })
    }

    /// The root certificate's DER: what the session trusts.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.root
    }

    /// The root certificate as PEM, for the session's trust bundle.
    pub fn cert_pem(&self) -> String {
        certificate_pem(self.cert_der())
    }

    /// SHA-384 of the root certificate's DER, 96 lowercase hex digits: the
    /// name the control plane and the drop report use for this CA.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// How many intermediates (nesting levels) this CA has: 1 when no
    /// listed name lies under another, else the deepest nesting + 1.
    pub fn level_count(&self) -> usize {
        self.intermediates.len()
    }

    /// The DER of the intermediate that signs the leaves of `level`'s
    /// names, if there is such a level. Leaves carry it in their chain.
    pub fn intermediate_der(&self, level: usize) -> Option<&CertificateDer<'static>> {
        self.intermediates.get(level).map(|i| &i.der)
    }

    /// [`intermediate_der`](SessionCa::intermediate_der) as PEM.
    pub fn intermediate_pem(&self, level: usize) -> Option<String> {
        self.intermediate_der(level).map(|der| certificate_pem(der))
    }

    /// The names this CA permits, sorted: the session's allowlist plus
    /// [`APPROVALS_NAME`].
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether this CA permits `name` (exact match; names are canonical).
    pub fn permits(&self, name: &str) -> bool {
        self.position(name).is_some()
    }

    /// The nesting level of `name` (the intermediate that signs its leaf),
    /// if this CA permits it.
    pub fn level_of(&self, name: &str) -> Option<usize> {
        self.position(name).map(|i| self.levels[i])
    }

    /// When the CA's (and its leaves') validity starts.
    pub fn not_before(&self) -> SystemTime {
        to_system_time(self.not_before)
    }

    /// When the CA's (and its leaves') validity ends.
    pub fn not_after(&self) -> SystemTime {
        to_system_time(self.not_after)
    }

    /// Mints a fresh leaf for `name`, signed by the intermediate of its
    /// level, uncached (see [`LeafCache`](crate::LeafCache) for the cached
    /// path).
    ///
    /// Refuses, before any key is made, a name that is not a host name and
    /// a name this CA does not permit.
    pub fn mint_leaf(&self, name: &str) -> Result<Leaf, CertError> {
        check_host_name(name)?;
        let Some(level) = self.level_of(name) else {
            return Err(CertError::NotPermitted {
                name: name.to_owned(),
            });
        };
        self.sign(level, name, dns_san(name)?)
    }

    /// [`sign_any_at_level_for_tests`](SessionCa::sign_any_at_level_for_tests)
    /// with the level-0 intermediate, **for tests only**.
    #[doc(hidden)]
    pub fn sign_any_for_tests(&self, name: &str) -> Result<Leaf, CertError> {
        self.sign_any_at_level_for_tests(0, name)
    }

    /// Signs a leaf for any `name` at all — unlisted names, subdomains,
    /// wildcards (`*.example.com`), IP addresses (as an iPAddress SAN) —
    /// with the intermediate of `level`, **for tests only**.
    ///
    /// The name-constraint tests need certificates this CA's intermediates
    /// signed for names they must not vouch for, to show that every
    /// verifier refuses them. [`mint_leaf`](SessionCa::mint_leaf) will not
    /// make those, so this skips its checks. Gateway code never calls it;
    /// and a leaf it makes for a name outside the allowlist fails
    /// verification anyway, since the refusal is the certificates' name
    /// constraints, not this crate's checks.
    ///
    /// # Panics
    ///
    /// If `level` is not below [`level_count`](SessionCa::level_count).
    #[doc(hidden)]
    pub fn sign_any_at_level_for_tests(&self, level: usize, name: &str) -> Result<Leaf, CertError> {
        assert!(
            level < self.level_count(),
            "level {level} of {}",
            self.level_count()
        );
        let san = match name.parse::<IpAddr>() {
            Ok(address) => SanType::IpAddress(address),
            Err(_) => dns_san(name)?,
        };
        self.sign(level, name, san)
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.names
            .binary_search_by(|listed| listed.as_str().cmp(name))
            .ok()
    }

    fn sign(&self, level: usize, name: &str, san: SanType) -> Result<Leaf, CertError> {
        let intermediate = &self.intermediates[level];
        leaf::sign(
            &intermediate.issuer,
            &intermediate.der,
            name,
            san,
            self.not_before,
            self.not_after,
        )
    }
}

/// Makes the root's key, self-signs the root, signs each intermediate (each
/// with a fresh key of its own) with the root's key, and returns the root's
/// certificate and the intermediates.
///
/// The root's key exists only inside this function: it is owned by `root`,
/// which is dropped before returning, and aws-lc cleanses the key's memory
/// as it frees it. It is never encoded, copied or returned, so once this
/// returns no one can sign anything under the root: no further
/// intermediate, and no leaf directly.
fn issue_chain(
    root: Named,
    intermediates: Vec<Named>,
) -> Result<(CertificateDer<'static>, Vec<Intermediate>), CertError> {
    let (root_name, root_params) = root;
    let root = CertifiedIssuer::self_signed(root_params, EcKey::generate()?).map_err(|source| {
        CertError::Build {
            subject: root_name,
            source,
        }
    })?;
    let intermediates = intermediates
        .into_iter()
        .map(|(subject, params)| {
            let key = EcKey::generate()?;
            let cert = params
                .signed_by(&key, &root)
                .map_err(|source| CertError::Build { subject, source })?;
            Ok(Intermediate {
                der: cert.der().clone(),
                issuer: Issuer::new(params, key),
            })
        })
        .collect::<Result<Vec<_>, CertError>>()?;
    let root_der = root.der().clone();
    // The root's key goes here (an early return above drops it too).
    drop(root);
    Ok((root_der, intermediates))
}

/// A CA certificate's parameters and its common name (for errors).
type Named = (String, CertificateParams);

/// An intermediate: the issuer that signs its level's leaves (its key and
/// subject) and its certificate.
struct Intermediate {
    issuer: Issuer<'static, EcKey>,
    der: CertificateDer<'static>,
}

impl Intermediate {
    fn key(&self) -> &EcKey {
        self.issuer.key()
    }
}

/// What [`SessionCa::export_for_handover`] gives and
/// [`SessionCa::import_handover`] takes. `Debug` shows no key.
pub struct CaHandover {
    pub session_id: String,
    pub attempt: u32,
    pub root_name: String,
    pub names: Vec<String>,
    /// Validity, seconds since the epoch.
    pub not_before: i64,
    pub not_after: i64,
    pub root_der: Vec<u8>,
    /// Each level's certificate DER and key (PKCS#8 DER, wiped on drop).
    pub intermediates: Vec<(Vec<u8>, Zeroizing<Vec<u8>>)>,
}

impl fmt::Debug for CaHandover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaHandover")
            .field("session_id", &self.session_id)
            .field("attempt", &self.attempt)
            .field("names", &self.names.len())
            .field("intermediates", &self.intermediates.len())
            .finish_non_exhaustive()
    }
}

/// A CA certificate's parameters: its subject, path length, name
/// constraints and validity.
fn ca_params(
    common_name: &str,
    path_len: u8,
    constraints: NameConstraints,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> CertificateParams {
    let mut cert_params = CertificateParams::default();
    cert_params.distinguished_name = DistinguishedName::new();
    cert_params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    cert_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(path_len));
    cert_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    cert_params.name_constraints = Some(constraints);
    cert_params.not_before = not_before;
    cert_params.not_after = not_after;
    cert_params
}

/// The parameters of the intermediate of `level`: what `new` signs, and
/// what `import_handover` rebuilds the same issuer from.
fn intermediate_params(
    root_name: &str,
    names: &[String],
    levels: &[usize],
    level: usize,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Named {
    let level_names: Vec<&str> = names
        .iter()
        .zip(levels)
        .filter(|(_, name_level)| **name_level == level)
        .map(|(name, _)| name.as_str())
        .collect();
    let subject = format!("{root_name} level {level}");
    let mut params = ca_params(
        &subject,
        0,
        exact_name_constraints(&level_names),
        not_before,
        not_after,
    );
    // OpenSSL's strict mode (Python 3.13's default) wants an AKI on every
    // certificate that is not self-signed.
    params.use_authority_key_identifier_extension = true;
    (subject, params)
}

impl fmt::Debug for SessionCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionCa")
            .field("session_id", &self.session_id)
            .field("attempt", &self.attempt)
            .field("digest", &self.digest)
            .field("names", &self.names.len())
            .field("levels", &self.intermediates.len())
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
