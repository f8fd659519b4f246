//! The control channel's identities: `control-stub init` makes them, and
//! both ends of the channel load them from the directory it wrote.
//!
//! One control CA (ECDSA P-256) signs a certificate for the control stub
//! (`stub.pem`, `stub.key`) and one per gateway (`<id>.pem`, `<id>.key`).
//! Every certificate is good for both TLS server and client
//! authentication: each side serves one service and calls the other's. A
//! gateway's certificate names its id as a DNS name, plus `localhost` and
//! 127.0.0.1 for a pair run on one machine.
//!
//! Nothing on the channel trusts anything but the control CA. Once every
//! certificate is made, the CA key (`ca.key`) should be moved offline: no
//! running process needs it.
//!
//! # Operators' certificates
//!
//! Apart from the control CA, `init` makes an **operator CA**
//! (`operator-ca.pem`, `operator-ca.key`) and, for each `--operator NAME`,
//! a client certificate `operator-NAME.pem` and its key
//! `operator-NAME.key` (mode 0600): what an operator's API client presents
//! to the people's web app (`POST /v1/sandboxes/{id}/revoke-all`,
//! [`OperatorTrust`]). An operator's certificate names its
//! operator as the URI `talos:operator:NAME` and is good for TLS client
//! authentication only. A CA of its own, not the control CA: nothing on
//! the control channel trusts the operator CA, so an operator's
//! certificate never passes as a gateway's or the control plane's, and
//! the web app takes an operator only from the operator CA, so a
//! gateway's certificate never passes as an operator's.
//!
//! `init --dir DIR --operator NAME` on a directory `init` wrote before
//! (it holds `ca.pem`) adds operators: it writes only the new operators'
//! files (and the operator CA, if the directory predates it), never
//! overwrites a file, and refuses, before writing anything, an operator
//! whose files exist or any `--gateway` (a new gateway's identity is made
//! by a new `init`). Keep `operator-ca.key` where operators are added;
//! `serve` needs only `operator-ca.pem`, read when it starts.
//!
//! Beside them `init` makes the control plane's other keys: the relay's
//! (`relay.key`, it signs decisions), the plane's (`plane.key`, it signs
//! session certificates) and the application server's VAPID key
//! (`vapid.key`, RFC 8292: it signs what Web Push sends to people's
//! devices, [`crate::people::push`]). Each is made on first use when an
//! older directory lacks it, and never replaced.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Serialize;
use zeroize::Zeroizing;

use crate::error::Error;
use crate::names;

/// The control CA's certificate and key file names in the directory.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
/// The control stub's own certificate and key.
pub const STUB_CERT: &str = "stub.pem";
pub const STUB_KEY: &str = "stub.key";
/// The DNS name in the control stub's certificate.
pub const STUB_NAME: &str = "control-stub";
/// The approval relay's Ed25519 signing key (PKCS#8 DER, mode 0600): it
/// signs decisions, and its public half travels to the gateways with every
/// session open.
pub const RELAY_KEY: &str = "relay.key";

/// The file of the control plane's Ed25519 key that signs certificates.
pub const PLANE_KEY: &str = "plane.key";

/// The application server's VAPID key (RFC 8292): ECDSA P-256, PKCS#8
/// DER, mode 0600. Push services bind every subscription to its public
/// half, so it is kept for as long as the subscriptions: a new key
/// silently ends every subscription made under the old one (and every
/// replica must hold the same file).
pub const VAPID_KEY: &str = "vapid.key";

/// The largest VAPID key file read: a P-256 PKCS#8 document is under 200
/// bytes; the bound keeps a wrong path from being read whole.
const MAX_VAPID_KEY_FILE: usize = 1024;

/// How long the certificates `init` makes are valid: two years. The
/// channel's identities are rotated by running `init` into a new
/// directory; a short life would make a demo pair stop without notice.
pub const VALIDITY: Duration = Duration::from_secs(2 * 365 * 24 * 60 * 60);

/// How far before now a certificate's validity starts, so a peer whose
/// clock is a little behind still accepts it: one hour.
pub const NOT_BEFORE_SKEW: Duration = Duration::from_secs(60 * 60);

/// What `init` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Written {
    pub dir: PathBuf,
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
    pub note: &'static str,
}

/// The gateway ids `init` is given, each a valid, distinct name that
/// names nothing else in the control directory.
fn checked_ids(gateway_ids: &[String]) -> Result<Vec<String>, Error> {
    let mut ids = Vec::new();
    for id in gateway_ids {
        let id = names::gateway_id(id)?;
        if ["ca", "stub", "localhost", STUB_NAME].contains(&id.as_str()) {
            return Err(Error::NameInvalid {
                what: "gateway id",
                got: id,
                reason: "ca, stub, control-stub and localhost name other things in the control directory or every certificate".into(),
            });
        }
        if rustls::pki_types::DnsName::try_from(id.as_str()).is_err() {
            return Err(Error::NameInvalid {
                what: "gateway id",
                got: id,
                reason:
                    "a gateway id goes in its certificate as a DNS name (letters, digits, '-', '.')"
                        .into(),
            });
        }
        if ids.contains(&id) {
            return Err(Error::NameInvalid {
                what: "gateway id",
                got: id,
                reason: "given twice".into(),
            });
        }
        ids.push(id);
    }
    Ok(ids)
}

/// Make the control CA, the control stub's certificate and one per gateway
/// id in `dir` (created if missing), and the operator CA. Refuses, before
/// writing anything, if any of the files exists. Key files are created
/// mode 0600.
pub fn init(dir: &Path, gateway_ids: &[String]) -> Result<Written, Error> {
    init_with_operators(dir, gateway_ids, &[])
}

/// [`init`], and a certificate for each of `operators` under the operator
/// CA (see the module docs).
pub fn init_with_operators(
    dir: &Path,
    gateway_ids: &[String],
    operators: &[String],
) -> Result<Written, Error> {
    let ids = checked_ids(gateway_ids)?;
    let operators = checked_operators(operators)?;
    let mut plan: Vec<(&str, String, String)> = vec![("stub", STUB_CERT.into(), STUB_KEY.into())];
    for id in &ids {
        plan.push((id, format!("{id}.pem"), format!("{id}.key")));
    }
    let mut all = vec![
        dir.join(CA_CERT),
        dir.join(CA_KEY),
        dir.join(RELAY_KEY),
        dir.join(PLANE_KEY),
        dir.join(VAPID_KEY),
        dir.join(OPERATOR_CA_CERT),
        dir.join(OPERATOR_CA_KEY),
    ];
    for (_, cert, key) in &plan {
        all.push(dir.join(cert));
        all.push(dir.join(key));
    }
    for who in &operators {
        let (cert, key) = operator_files(who);
        all.push(dir.join(cert));
        all.push(dir.join(key));
    }
    if let Some(existing) = all.iter().find(|p| p.exists()) {
        return Err(Error::Io {
            what: existing.display().to_string(),
            reason: "already exists; init never overwrites (use a new directory)".into(),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;

    let ca_key = new_key()?;
    let mut ca_params = params(vec![])?;
    ca_params.distinguished_name = name("TALOS control CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(rcgen_error)?;
    let issuer = Issuer::new(ca_params, &ca_key);

    let mut files = Vec::new();
    write_file(
        &dir.join(CA_CERT),
        ca_cert.pem().as_bytes(),
        false,
        &mut files,
    )?;
    write_file(
        &dir.join(CA_KEY),
        Zeroizing::new(ca_key.serialize_pem()).as_bytes(),
        true,
        &mut files,
    )?;
    for (who, cert_file, key_file) in &plan {
        // Each certificate carries its role (talos-contract `role`).
        let (dns, role, cn) = if *who == "stub" {
            (
                STUB_NAME.to_owned(),
                talos_contract::role::CONTROL_PLANE,
                "TALOS control stub".to_owned(),
            )
        } else {
            (
                (*who).to_owned(),
                talos_contract::role::GATEWAY,
                format!("TALOS gateway {who}"),
            )
        };
        let key = new_key()?;
        let mut p = params(vec![dns, "localhost".into(), role.into()])?;
        p.subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        p.distinguished_name = name(&cn);
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &issuer).map_err(rcgen_error)?;
        write_file(
            &dir.join(cert_file),
            cert.pem().as_bytes(),
            false,
            &mut files,
        )?;
        write_file(
            &dir.join(key_file),
            Zeroizing::new(key.serialize_pem()).as_bytes(),
            true,
            &mut files,
        )?;
    }
    relay_key(dir)?;
    files.push(dir.join(RELAY_KEY));
    plane_key(dir)?;
    files.push(dir.join(PLANE_KEY));
    vapid_key(dir)?;
    files.push(dir.join(VAPID_KEY));
    let operator_ca = make_operator_ca(dir, &mut files)?;
    for who in &operators {
        issue_operator(dir, &operator_ca, who, &mut files)?;
    }
    Ok(Written {
        dir: dir.to_owned(),
        files,
        note: if operators.is_empty() {
            "move ca.key offline now: no running process needs it; give each gateway its <id>.pem, <id>.key and ca.pem"
        } else {
            "move ca.key offline now: no running process needs it; give each gateway its <id>.pem, <id>.key and ca.pem, and each operator their operator-NAME.pem and operator-NAME.key (the key only to them)"
        },
    })
}

/// The operator CA's certificate and key file names in the directory.
pub const OPERATOR_CA_CERT: &str = "operator-ca.pem";
pub const OPERATOR_CA_KEY: &str = "operator-ca.key";
/// The operator CA's common name.
const OPERATOR_CA_NAME: &str = "TALOS operator CA";
/// What an operator's certificate names its operator by: this, then the
/// name, as its one URI subject alternative name.
pub const OPERATOR_URI_PREFIX: &str = "talos:operator:";
/// How long an operator's certificate is valid: one year. A person's
/// credential: shorter than the channel's identities.
pub const OPERATOR_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Operator `name`'s certificate and key file names.
pub fn operator_files(name: &str) -> (String, String) {
    (
        format!("operator-{name}.pem"),
        format!("operator-{name}.key"),
    )
}

/// The operator names `init` is given, each a valid person's name (the
/// people's names: 1-64 letters, digits, `.`, `_`, `-`), given once.
fn checked_operators(operators: &[String]) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for name in operators {
        let name = crate::lock::approver(name).map_err(|_| Error::NameInvalid {
            what: "operator",
            got: name.chars().take(100).collect(),
            reason: "an operator is named as a person is: 1 to 64 letters, digits, '.', '_' or '-'"
                .into(),
        })?;
        if out.contains(&name) {
            return Err(Error::NameInvalid {
                what: "operator",
                got: name,
                reason: "given twice".into(),
            });
        }
        out.push(name);
    }
    Ok(out)
}

/// The operator CA's parameters: what it is made with and, from its key
/// alone, what issues under it again (its name and key usages).
fn operator_ca_params() -> Result<CertificateParams, Error> {
    let mut p = params(vec![])?;
    p.distinguished_name = name(OPERATOR_CA_NAME);
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(p)
}

/// Make the operator CA in `dir`: its certificate and key (0600).
fn make_operator_ca(dir: &Path, files: &mut Vec<PathBuf>) -> Result<KeyPair, Error> {
    let key = new_key()?;
    let cert = operator_ca_params()?
        .self_signed(&key)
        .map_err(rcgen_error)?;
    write_file(
        &dir.join(OPERATOR_CA_CERT),
        cert.pem().as_bytes(),
        false,
        files,
    )?;
    write_file(
        &dir.join(OPERATOR_CA_KEY),
        Zeroizing::new(key.serialize_pem()).as_bytes(),
        true,
        files,
    )?;
    Ok(key)
}

/// Issue operator `who`'s certificate and key under the operator CA
/// (`ca_key`) into `dir`: the URI `talos:operator:NAME`, TLS client
/// authentication only, valid [`OPERATOR_VALIDITY`].
fn issue_operator(
    dir: &Path,
    ca_key: &KeyPair,
    who: &str,
    files: &mut Vec<PathBuf>,
) -> Result<(), Error> {
    let issuer = Issuer::new(operator_ca_params()?, ca_key);
    let key = new_key()?;
    let mut p = params(vec![])?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    p.not_after = time::OffsetDateTime::from_unix_timestamp(
        i64::try_from((now + OPERATOR_VALIDITY).as_secs()).unwrap_or(i64::MAX),
    )
    .map_err(|e| Error::Store(format!("certificate validity: {e}")))?;
    let uri = format!("{OPERATOR_URI_PREFIX}{who}");
    p.subject_alt_names = vec![SanType::URI(uri.as_str().try_into().map_err(rcgen_error)?)];
    p.distinguished_name = name(&format!("TALOS operator {who}"));
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = p.signed_by(&key, &issuer).map_err(rcgen_error)?;
    let (cert_file, key_file) = operator_files(who);
    write_file(&dir.join(cert_file), cert.pem().as_bytes(), false, files)?;
    write_file(
        &dir.join(key_file),
        Zeroizing::new(key.serialize_pem()).as_bytes(),
        true,
        files,
    )
}

/// Add operators to the directory `init` wrote (see the module docs):
/// only their files, and the operator CA's if the directory lacks it.
/// Refuses, before writing anything, a directory `init` did not write, an
/// operator whose files exist, and an operator CA half there.
pub fn add_operators(dir: &Path, operators: &[String]) -> Result<Written, Error> {
    let names = checked_operators(operators)?;
    if names.is_empty() {
        return Err(Error::NameInvalid {
            what: "operator",
            got: String::new(),
            reason: "adding to an existing directory needs at least one --operator NAME".into(),
        });
    }
    if !dir.join(CA_CERT).exists() {
        return Err(Error::Io {
            what: dir.join(CA_CERT).display().to_string(),
            reason: "does not exist: operators are added to a directory init wrote".into(),
        });
    }
    let (ca_cert, ca_key) = (dir.join(OPERATOR_CA_CERT), dir.join(OPERATOR_CA_KEY));
    if ca_cert.exists() != ca_key.exists() {
        let missing = if ca_cert.exists() { &ca_key } else { &ca_cert };
        return Err(Error::Io {
            what: missing.display().to_string(),
            reason: "missing beside its other half: an operator is issued only with the operator CA's certificate and key both here".into(),
        });
    }
    for who in &names {
        let (c, k) = operator_files(who);
        if let Some(existing) = [dir.join(c), dir.join(k)].into_iter().find(|p| p.exists()) {
            return Err(Error::Io {
                what: existing.display().to_string(),
                reason: "already exists; init never overwrites (that operator has a certificate)"
                    .into(),
            });
        }
    }
    let mut files = Vec::new();
    let key = if ca_cert.exists() {
        let pem =
            Zeroizing::new(std::fs::read_to_string(&ca_key).map_err(|e| io_error(&ca_key, e))?);
        KeyPair::from_pem(&pem).map_err(|e| Error::Io {
            what: ca_key.display().to_string(),
            reason: format!("not the operator CA's key: {e}"),
        })?
    } else {
        make_operator_ca(dir, &mut files)?
    };
    let trust = OperatorTrust::load(dir)?.ok_or_else(|| Error::Io {
        what: ca_cert.display().to_string(),
        reason: "does not exist".into(),
    })?;
    for who in &names {
        issue_operator(dir, &key, who, &mut files)?;
        // The operator CA's certificate and key go together: the new
        // certificate is checked as the web app will check it.
        let pem = dir.join(operator_files(who).0);
        let chain = read_certs(&pem)?;
        trust
            .operator(&chain, SystemTime::now())
            .map_err(|e| Error::Io {
                what: pem.display().to_string(),
                reason: format!(
                    "issued, but it does not verify under {OPERATOR_CA_CERT} ({}): is {OPERATOR_CA_KEY} that CA's key?",
                    e.reason()
                ),
            })?;
    }
    Ok(Written {
        dir: dir.to_owned(),
        files,
        note: OPERATOR_NOTE,
    })
}

/// What `init` says of operators' certificates.
const OPERATOR_NOTE: &str = "give each operator their operator-NAME.pem and operator-NAME.key (the key only to them); keep operator-ca.key where operators are added (serve needs only operator-ca.pem)";

/// The control plane's signing key in `dir`, made (mode 0600) if the file
/// does not exist; an existing key is never replaced. It signs session
/// certificates (talos-certs kind `certificate`).
pub fn plane_key(dir: &Path) -> Result<talos_certs::GatewayKey, Error> {
    talos_certs::GatewayKey::load_or_create(dir.join(PLANE_KEY)).map_err(|e| Error::Io {
        what: dir.join(PLANE_KEY).display().to_string(),
        reason: e.to_string(),
    })
}

/// The control plane's signing key in `dir`, which must exist: what reads
/// the key to show what it signed never makes one.
pub fn existing_plane_key(dir: &Path) -> Result<talos_certs::GatewayKey, Error> {
    let path = dir.join(PLANE_KEY);
    if !path.exists() {
        return Err(Error::Io {
            what: path.display().to_string(),
            reason: "does not exist: the control plane's key signs certificates (control-stub init makes it)".into(),
        });
    }
    plane_key(dir)
}

/// The relay's signing key in `dir`, made (mode 0600) if the file does not
/// exist; an existing key is never replaced.
pub fn relay_key(dir: &Path) -> Result<talos_certs::GatewayKey, Error> {
    talos_certs::GatewayKey::load_or_create(dir.join(RELAY_KEY)).map_err(|e| {
        Error::RelayKeyInvalid {
            reason: e.to_string(),
        }
    })
}

/// The application server's VAPID key in `dir` ([`VAPID_KEY`]), made
/// (mode 0600) if the file does not exist; an existing key is never
/// replaced. A file that group or others may read, that is not a regular
/// file, or that is not a P-256 PKCS#8 key is refused, naming it.
pub fn vapid_key(dir: &Path) -> Result<VapidKey, Error> {
    let path = dir.join(VAPID_KEY);
    match VapidKey::load(&path)? {
        Some(key) => Ok(key),
        None => VapidKey::create(&path),
    }
}

/// The application server's VAPID key: ES256 (ECDSA P-256 with SHA-256),
/// signatures as JOSE wants them (r || s, 64 bytes, not DER). Its Debug
/// shows the public key only.
pub struct VapidKey {
    pair: aws_lc_rs::signature::EcdsaKeyPair,
}

impl std::fmt::Debug for VapidKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VapidKey(P-256, public {})",
            hex::encode(self.public_key())
        )
    }
}

impl VapidKey {
    /// The public key as an uncompressed point (65 bytes, `0x04 || x ||
    /// y`): what a page gives `pushManager.subscribe` as its
    /// `applicationServerKey`, and the `k` of every VAPID header.
    pub fn public_key(&self) -> &[u8] {
        use aws_lc_rs::signature::KeyPair as _;
        self.pair.public_key().as_ref()
    }

    /// The ES256 signature of `message`: r || s, 64 bytes.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let sig = self.pair.sign(&rng, message).map_err(|_| Error::Io {
            what: VAPID_KEY.into(),
            reason: "aws-lc could not sign with the VAPID key".into(),
        })?;
        Ok(sig.as_ref().to_vec())
    }

    /// A key made in memory, never written (tests).
    #[doc(hidden)]
    pub fn generate() -> Result<VapidKey, Error> {
        let pair =
            aws_lc_rs::signature::EcdsaKeyPair::generate(Self::ALG).map_err(|_| Error::Io {
                what: VAPID_KEY.into(),
                reason: "aws-lc could not generate a P-256 key".into(),
            })?;
        Ok(VapidKey { pair })
    }

    const ALG: &'static aws_lc_rs::signature::EcdsaSigningAlgorithm =
        &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED_SIGNING;

    /// The key at `path`, or `None` when there is no file.
    fn load(path: &Path) -> Result<Option<VapidKey>, Error> {
        use std::io::Read as _;
        use std::os::unix::fs::PermissionsExt as _;
        let mut file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(path, e)),
        };
        // The open file's own metadata: no window for a swap after the check.
        let meta = file.metadata().map_err(|e| io_error(path, e))?;
        let refuse = |reason: String| Error::Io {
            what: path.display().to_string(),
            reason,
        };
        if !meta.is_file() {
            return Err(refuse("not a regular file".into()));
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(refuse(format!(
                "mode {mode:04o}: group and others must have no access (chmod 600)"
            )));
        }
        let mut buf = Zeroizing::new(Vec::new());
        (&mut file)
            .take(MAX_VAPID_KEY_FILE as u64 + 1)
            .read_to_end(&mut buf)
            .map_err(|e| io_error(path, e))?;
        if buf.len() > MAX_VAPID_KEY_FILE {
            return Err(refuse(format!(
                "over {MAX_VAPID_KEY_FILE} bytes: not a P-256 key"
            )));
        }
        let pair = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(Self::ALG, &buf)
            .map_err(|e| refuse(format!("not a P-256 PKCS#8 key: {e}")))?;
        Ok(Some(VapidKey { pair }))
    }

    /// Make a key and link it to `path`: written whole to a temporary file
    /// first, so no reader ever sees half a key, and linked only if no
    /// other process made one meanwhile (then theirs is used).
    fn create(path: &Path) -> Result<VapidKey, Error> {
        let pair = Self::generate()?.pair;
        let pkcs8 = pair.to_pkcs8v1().map_err(|_| Error::Io {
            what: path.display().to_string(),
            reason: "aws-lc could not encode the VAPID key".into(),
        })?;
        // Unique per process and call, so two makers at once never share one.
        static CREATES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut temp = path.as_os_str().to_owned();
        temp.push(format!(
            ".{}.{}.tmp",
            std::process::id(),
            CREATES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let temp = PathBuf::from(temp);
        match std::fs::remove_file(&temp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(&temp, e)),
        }
        let mut scratch = Vec::new();
        write_file(&temp, pkcs8.as_ref(), true, &mut scratch)?;
        let linked = std::fs::hard_link(&temp, path);
        std::fs::remove_file(&temp).map_err(|e| io_error(&temp, e))?;
        match linked {
            Ok(()) => {
                let dir = match path.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => dir,
                    _ => Path::new("."),
                };
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| io_error(dir, e))?;
                Ok(VapidKey { pair })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Self::load(path)?.ok_or_else(|| io_error(path, std::io::ErrorKind::NotFound.into()))
            }
            Err(e) => Err(io_error(path, e)),
        }
    }
}

fn new_key() -> Result<KeyPair, Error> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(rcgen_error)
}

fn params(dns: Vec<String>) -> Result<CertificateParams, Error> {
    let mut p = CertificateParams::new(dns).map_err(rcgen_error)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let at = |d: Duration| {
        let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        time::OffsetDateTime::from_unix_timestamp(secs)
            .map_err(|e| Error::Store(format!("certificate validity: {e}")))
    };
    p.not_before = at(now.saturating_sub(NOT_BEFORE_SKEW))?;
    p.not_after = at(now + VALIDITY)?;
    Ok(p)
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

fn rcgen_error(e: rcgen::Error) -> Error {
    Error::Io {
        what: "certificate".into(),
        reason: e.to_string(),
    }
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        what: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// Write a new file (never an existing one); `private`: mode 0600.
fn write_file(
    path: &Path,
    bytes: &[u8],
    private: bool,
    written: &mut Vec<PathBuf>,
) -> Result<(), Error> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, if private { 0o600 } else { 0o644 });
    let mut file = options.open(path).map_err(|e| io_error(path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error(path, e))?;
    written.push(path.to_owned());
    Ok(())
}

/// What the people's web app trusts a client certificate with: the TLS
/// layer takes one under the operator CA or the control CA (so that a
/// gateway's certificate reaches the route, and is refused there by
/// name, not by a bare handshake failure), and [`OperatorTrust::operator`]
/// takes an operator only from the operator CA (see the module docs).
#[derive(Clone)]
pub struct OperatorTrust {
    /// The operator CA's certificate: the one anchor of an operator.
    operator_ca: CertificateDer<'static>,
    /// What the TLS layer accepts a client certificate under.
    tls_roots: Arc<rustls::RootCertStore>,
}

impl std::fmt::Debug for OperatorTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorTrust")
            .field("operator_ca_sha256", &sha256_hex(&self.operator_ca))
            .finish_non_exhaustive()
    }
}

/// Why a client certificate is not an operator's: a stable reason and
/// what was found. Never the certificate's key (the server never has it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotOperator {
    reason: &'static str,
    detail: String,
}

impl NotOperator {
    /// `not_operator_ca` (it chains to no operator CA: a gateway's, the
    /// control plane's), `expired`, `not_client_auth`, `no_operator_name`
    /// or `malformed`.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    pub fn detail(&self) -> &str {
        &self.detail
    }
}

/// The OID of TLS client authentication (1.3.6.1.5.5.7.3.2), DER content.
const EKU_CLIENT_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes).as_ref())
}

impl OperatorTrust {
    /// The operator CA in `dir` and the control CA beside it; `None` when
    /// `dir` has no operator CA (a directory `init` wrote before operators
    /// had certificates: then only a signed-in operator's passkey is taken).
    pub fn load(dir: &Path) -> Result<Option<OperatorTrust>, Error> {
        let path = dir.join(OPERATOR_CA_CERT);
        if !path.exists() {
            return Ok(None);
        }
        let operator = read_certs(&path)?;
        let control = read_certs(&dir.join(CA_CERT))?;
        Self::new(operator[0].clone(), &control).map(Some)
    }

    /// From the operator CA's certificate and the control CA's.
    pub fn new(
        operator_ca: CertificateDer<'static>,
        control_cas: &[CertificateDer<'static>],
    ) -> Result<OperatorTrust, Error> {
        let mut roots = rustls::RootCertStore::empty();
        for c in std::iter::once(&operator_ca).chain(control_cas) {
            roots.add(c.clone()).map_err(|e| Error::Io {
                what: OPERATOR_CA_CERT.into(),
                reason: format!("not a CA certificate: {e}"),
            })?;
        }
        Ok(OperatorTrust {
            operator_ca,
            tls_roots: Arc::new(roots),
        })
    }

    /// The CAs the TLS layer accepts a client certificate under.
    pub fn tls_roots(&self) -> Arc<rustls::RootCertStore> {
        Arc::clone(&self.tls_roots)
    }

    /// The operator `chain` (leaf first, as the client presented it)
    /// proves, at `now`: it chains to the operator CA, is good for TLS
    /// client authentication and valid now, and names one operator
    /// (`talos:operator:NAME`, a person's name).
    pub fn operator(
        &self,
        chain: &[CertificateDer<'_>],
        now: SystemTime,
    ) -> Result<crate::store::ClientCertificate, NotOperator> {
        use base64::Engine as _;
        let refuse = |reason: &'static str, detail: String| NotOperator { reason, detail };
        let leaf = chain
            .first()
            .ok_or_else(|| refuse("malformed", "no certificate".into()))?;
        let cert = webpki::EndEntityCert::try_from(leaf)
            .map_err(|e| refuse("malformed", format!("does not parse: {e}")))?;
        let anchor = webpki::anchor_from_trusted_cert(&self.operator_ca)
            .map_err(|e| refuse("malformed", format!("the operator CA: {e}")))?;
        let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let algs = rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .all;
        cert.verify_for_usage(
            algs,
            &[anchor],
            chain.get(1..).unwrap_or_default(),
            rustls::pki_types::UnixTime::since_unix_epoch(since),
            // Required, not only checked when present: every operator's
            // certificate says clientAuth.
            webpki::KeyUsage::required(EKU_CLIENT_AUTH),
            None,
            None,
        )
        .map_err(|e| match e {
            webpki::Error::CertExpired { .. } | webpki::Error::CertNotValidYet { .. } => {
                refuse("expired", format!("not valid now: {e}"))
            }
            webpki::Error::RequiredEkuNotFoundContext(_) => {
                refuse("not_client_auth", "not a TLS client certificate".into())
            }
            _ => refuse(
                "not_operator_ca",
                format!("not issued by the operator CA: {e}"),
            ),
        })?;
        let names: Vec<&str> = cert
            .valid_uri_names()
            .filter_map(|u| u.strip_prefix(OPERATOR_URI_PREFIX))
            .collect();
        let operator = match names.as_slice() {
            [one] => crate::lock::approver(one)
                .map_err(|_| refuse("no_operator_name", "its operator name is malformed".into()))?,
            _ => {
                return Err(refuse(
                    "no_operator_name",
                    format!(
                        "it names {} operators ({OPERATOR_URI_PREFIX}NAME), not one",
                        names.len()
                    ),
                ))
            }
        };
        Ok(crate::store::ClientCertificate {
            operator,
            sha256: sha256_hex(leaf),
            serial: hex::encode(cert.serial()),
            issuer_sha256: sha256_hex(&self.operator_ca),
            certificate: base64::engine::general_purpose::STANDARD.encode(leaf.as_ref()),
            verified_at: humantime::format_rfc3339_millis(now).to_string(),
        })
    }
}

/// One side's TLS material, loaded from an `init` directory: the control
/// CA as the only trust anchor, and this side's certificate and key.
#[derive(Debug)]
pub struct Identity {
    pub roots: Arc<rustls::RootCertStore>,
    pub chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Identity {
    /// Load `ca.pem` and the pair `<who>.pem`/`<who>.key` from `dir`.
    pub fn load(dir: &Path, who: &str) -> Result<Identity, Error> {
        let ca_path = dir.join(CA_CERT);
        let mut roots = rustls::RootCertStore::empty();
        for cert in read_certs(&ca_path)? {
            roots.add(cert).map_err(|e| Error::Io {
                what: ca_path.display().to_string(),
                reason: e.to_string(),
            })?;
        }
        let chain = read_certs(&dir.join(format!("{who}.pem")))?;
        let key_path = dir.join(format!("{who}.key"));
        let bytes = Zeroizing::new(std::fs::read(&key_path).map_err(|e| io_error(&key_path, e))?);
        let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| Error::Io {
            what: key_path.display().to_string(),
            reason: format!("no private key: {e}"),
        })?;
        Ok(Identity {
            roots: Arc::new(roots),
            chain,
            key,
        })
    }

    /// The private key: it signs the relay's and the plane's key bindings
    /// in a certificate bundle.
    pub(crate) fn key(&self) -> &PrivateKeyDer<'static> {
        &self.key
    }

    /// A TLS 1.3 client config presenting this identity and trusting only
    /// the control CA; ALPN h2 (gRPC).
    pub fn client_config(&self) -> Result<rustls::ClientConfig, Error> {
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(tls_error)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }

    /// A TLS 1.3 server config presenting this identity and requiring a
    /// client certificate that chains to the control CA; ALPN h2.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, Error> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            provider(),
        )
        .build()
        .map_err(|e| tls_error(rustls::Error::General(e.to_string())))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(tls_error)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn tls_error(e: rustls::Error) -> Error {
    Error::Io {
        what: "TLS configuration".into(),
        reason: e.to_string(),
    }
}

pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Io {
            what: path.display().to_string(),
            reason: format!("certificate PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(Error::Io {
            what: path.display().to_string(),
            reason: "no certificate".into(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn chain(dir: &Path, file: &str) -> Vec<CertificateDer<'static>> {
        read_certs(&dir.join(file)).unwrap()
    }

    /// A certificate under `dir`'s operator CA made with `edit` applied to
    /// an operator's parameters.
    fn under_operator_ca(
        dir: &Path,
        edit: impl FnOnce(&mut CertificateParams),
    ) -> CertificateDer<'static> {
        let pem = std::fs::read_to_string(dir.join(OPERATOR_CA_KEY)).unwrap();
        let ca_key = KeyPair::from_pem(&pem).unwrap();
        let issuer = Issuer::new(operator_ca_params().unwrap(), &ca_key);
        let mut p = params(vec![]).unwrap();
        p.subject_alt_names = vec![SanType::URI("talos:operator:eve".try_into().unwrap())];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        edit(&mut p);
        p.signed_by(&new_key().unwrap(), &issuer)
            .unwrap()
            .der()
            .clone()
    }

    #[test]
    fn an_operators_certificate_names_them_and_nothing_else_passes_as_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("control");
        let ops = ["opal".to_owned(), "olga".to_owned()];
        let written = init_with_operators(&dir, &["gw-a".into()], &ops).unwrap();
        assert!(written.files.contains(&dir.join("operator-opal.pem")));
        for f in [OPERATOR_CA_KEY, "operator-opal.key", "operator-olga.key"] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
        }
        let trust = OperatorTrust::load(&dir).unwrap().expect("an operator CA");
        let now = SystemTime::now();

        let opal = chain(&dir, "operator-opal.pem");
        let cert = trust.operator(&opal, now).unwrap();
        assert_eq!(cert.operator, "opal");
        assert_eq!(cert.sha256, sha256_hex(&opal[0]));
        assert_eq!(
            cert.issuer_sha256,
            sha256_hex(&chain(&dir, OPERATOR_CA_CERT)[0])
        );

        // A gateway's certificate, and the control plane's, are no
        // operator's: they chain to the control CA.
        for who in ["gw-a.pem", STUB_CERT] {
            let e = trust.operator(&chain(&dir, who), now).unwrap_err();
            assert_eq!(e.reason(), "not_operator_ca", "{who}: {e:?}");
        }
        // Nor is another directory's operator.
        let other = tmp.path().join("other");
        init_with_operators(&other, &[], &["opal".into()]).unwrap();
        let e = trust
            .operator(&chain(&other, "operator-opal.pem"), now)
            .unwrap_err();
        assert_eq!(e.reason(), "not_operator_ca");
        // Past its year, refused.
        let later = now + OPERATOR_VALIDITY + Duration::from_secs(86_400);
        assert_eq!(
            trust.operator(&opal, later).unwrap_err().reason(),
            "expired"
        );
        // Under the operator CA but no client certificate, or naming no
        // operator, or two: refused.
        let server_only = under_operator_ca(&dir, |p| {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        });
        assert_eq!(
            trust.operator(&[server_only], now).unwrap_err().reason(),
            "not_client_auth"
        );
        let nameless = under_operator_ca(&dir, |p| {
            p.subject_alt_names = vec![SanType::DnsName("opal".try_into().unwrap())];
        });
        assert_eq!(
            trust.operator(&[nameless], now).unwrap_err().reason(),
            "no_operator_name"
        );
        let two = under_operator_ca(&dir, |p| {
            p.subject_alt_names
                .push(SanType::URI("talos:operator:opal".try_into().unwrap()));
        });
        assert_eq!(
            trust.operator(&[two], now).unwrap_err().reason(),
            "no_operator_name"
        );
        let eve = under_operator_ca(&dir, |_| {});
        assert_eq!(trust.operator(&[eve], now).unwrap().operator, "eve");

        // And the other way: the control channel (its verifier trusts the
        // control CA alone) refuses an operator's certificate, and takes a
        // gateway's.
        let stub = Identity::load(&dir, "stub").unwrap();
        let channel = rustls::server::WebPkiClientVerifier::builder_with_provider(
            stub.roots.clone(),
            provider(),
        )
        .build()
        .unwrap();
        let at = rustls::pki_types::UnixTime::now();
        assert!(channel.verify_client_cert(&opal[0], &[], at).is_err());
        let gw = chain(&dir, "gw-a.pem");
        channel.verify_client_cert(&gw[0], &[], at).unwrap();
    }

    #[test]
    fn operators_are_added_to_an_existing_directory_without_overwriting() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("control");
        let first = init(&dir, &["gw-a".into()]).unwrap();
        let before: Vec<Vec<u8>> = first
            .files
            .iter()
            .map(|f| std::fs::read(f).unwrap())
            .collect();
        let added = add_operators(&dir, &["opal".into()]).unwrap();
        assert_eq!(
            added.files,
            vec![dir.join("operator-opal.pem"), dir.join("operator-opal.key")]
        );
        assert_eq!(mode(&dir.join("operator-opal.key")), 0o600);
        let after: Vec<Vec<u8>> = first
            .files
            .iter()
            .map(|f| std::fs::read(f).unwrap())
            .collect();
        assert_eq!(before, after, "nothing init wrote changed");
        let trust = OperatorTrust::load(&dir).unwrap().unwrap();
        let opal = chain(&dir, "operator-opal.pem");
        assert_eq!(
            trust.operator(&opal, SystemTime::now()).unwrap().operator,
            "opal"
        );

        // Again: refused, before anything is written.
        let e = add_operators(&dir, &["olga".into(), "opal".into()]).unwrap_err();
        assert!(e.to_string().contains("already exists"), "{e}");
        assert!(!dir.join("operator-olga.pem").exists());
        assert_eq!(chain(&dir, "operator-opal.pem"), opal);
        // A directory init never wrote, a bad name, none: refused.
        assert!(add_operators(&tmp.path().join("nothing"), &["opal".into()]).is_err());
        assert_eq!(
            add_operators(&dir, &["no/slash".into()])
                .unwrap_err()
                .code(),
            "name_invalid"
        );
        assert_eq!(add_operators(&dir, &[]).unwrap_err().code(), "name_invalid");

        // A directory from before operator CAs gets one, made once.
        std::fs::remove_file(dir.join(OPERATOR_CA_CERT)).unwrap();
        std::fs::remove_file(dir.join(OPERATOR_CA_KEY)).unwrap();
        let made = add_operators(&dir, &["olga".into()]).unwrap();
        assert!(made.files.contains(&dir.join(OPERATOR_CA_CERT)));
        let trust = OperatorTrust::load(&dir).unwrap().unwrap();
        let olga = chain(&dir, "operator-olga.pem");
        assert_eq!(
            trust.operator(&olga, SystemTime::now()).unwrap().operator,
            "olga"
        );
        // Half an operator CA: refused.
        std::fs::remove_file(dir.join(OPERATOR_CA_KEY)).unwrap();
        assert!(add_operators(&dir, &["omar".into()]).is_err());
        assert!(!dir.join("operator-omar.pem").exists());
    }
}
