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
/// id in `dir` (created if missing). Refuses, before writing anything, if
/// any of the files exists. Key files are created mode 0600.
pub fn init(dir: &Path, gateway_ids: &[String]) -> Result<Written, Error> {
    let ids = checked_ids(gateway_ids)?;
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
    ];
    for (_, cert, key) in &plan {
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
    Ok(Written {
        dir: dir.to_owned(),
        files,
        note: "move ca.key offline now: no running process needs it; give each gateway its <id>.pem, <id>.key and ca.pem",
    })
}

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

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
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
