//! TLS on both sides: TLS 1.3 only, through rustls with the aws-lc-rs
//! provider.
//!
//! - Toward the session, a [`rustls::ServerConfig`] per session whose
//!   certificate resolver mints (once) a leaf for the hello's name under the
//!   session's own CA, and whose TLS 1.3 resumption state is its own
//!   (stateful tickets in its memory, dropped with the authority).
//! - Toward destinations, a [`rustls::ClientConfig`] that checks
//!   certificates against the public roots (webpki-roots) plus only those
//!   extra anchors the config names explicitly. Each session's pool uses
//!   it with a resumption store of its own (`session::upstream`), so not
//!   even TLS resumption state is shared between sessions: a destination
//!   that offers tickets is resumed within the session only.
//! - On the control channel, mutual TLS with the control CA as the only
//!   root, ALPN `h2`: [`control_server_config`] for the control listener
//!   (a client certificate chaining to the CA required), and
//!   [`plane_client_config`] for the shipper's connection to the control
//!   plane (the gateway's control certificate as its identity).
//!
//! Every function here takes certificates and keys as arguments: reading
//! them from files is the config's business.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use talos_certs::LeafCache;

/// ALPN offered to sessions and to destinations, in preference order.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// aws-lc's provider with the TLS 1.3 suites in the gateway's order of
/// preference: AES-128-GCM with SHA-256 first, then AES-256-GCM with
/// SHA-384, then ChaCha20-Poly1305. The key exchanges offered (X25519,
/// P-256) give 128-bit security, which AES-128 matches; AES-256 adds 4
/// rounds a block to every byte, and SHA-384 runs without hardware help
/// on CPUs that have SHA-256's (aws-lc uses its SHA-512 vector code on
/// Intel only: on AMD Zen, HKDF over SHA-384 was 13 % of the gateway's CPU
/// per new connection, `benches/compare/README.md`). Toward sessions the
/// server's order decides ([`server_config`]); toward destinations it is
/// the order offered.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::aws_lc_rs::cipher_suite;
    Arc::new(rustls::crypto::CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::aws_lc_rs::default_provider()
    })
}

/// The member link's provider: TLS 1.3 with AES-128-GCM only. The link
/// carries bytes that are already a session's own TLS (a forwarded
/// connection) between two members that authenticate each other, and it
/// encrypts all of them once more: AES-128 takes 10 rounds a block
/// against AES-256's 14, for the same GCM authentication, and both
/// members run this build, so nothing else need be offered.
fn link_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::CryptoProvider {
        cipher_suites: vec![rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256],
        ..rustls::crypto::aws_lc_rs::default_provider()
    })
}

/// A config builder restricted to TLS 1.3, with `provider`.
fn tls13<S: rustls::ConfigSide>(
    builder: rustls::ConfigBuilder<S, rustls::WantsVersions>,
) -> rustls::ConfigBuilder<S, rustls::WantsVerifier> {
    // TLS 1.3 is supported by the provider; this cannot fail.
    builder
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("the aws-lc-rs provider supports TLS 1.3")
}

/// The server side for one session: TLS 1.3, ALPN h2 and http/1.1, the
/// certificate chosen by SNI through `leaves`.
pub fn server_config(leaves: Arc<dyn ResolvesServerCert>) -> Arc<rustls::ServerConfig> {
    let mut config = tls13(rustls::ServerConfig::builder_with_provider(provider()))
        .with_no_client_auth()
        .with_cert_resolver(leaves);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    // The suite by the gateway's order ([`provider`]), not the client's:
    // OpenSSL's clients (curl, Python, wget, wrk) list AES-256 first.
    config.ignore_client_order = true;
    // No 0-RTT: early data could be replayed, and requests are checked
    // before they go on.
    config.max_early_data_size = 0;
    // TLS 1.3 resumption, bound to the authority: the tickets are
    // stateful (each names an entry of this config's own cache, in memory;
    // no ticket key exists, so none can be stolen or shared), the config
    // is the session authority's alone and is dropped with its CA. A
    // ticket therefore resumes only within the authority that issued it:
    // not in another session, not in the next attempt of the same one,
    // not after a close or a lapse (the source is no session's then).
    // Each ticket resumes once (the entry is taken), as RFC 8446 advises.
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSION_TICKETS);
    config.ticketer = Arc::new(NoTicketKey);
    config.send_tls13_tickets = 2;
    Arc::new(config)
}

/// Resumable connections one session authority remembers (the oldest go
/// first): a few per client process that reconnects.
const SESSION_TICKETS: usize = 256;

/// No stateless tickets: every ticket is an entry of the authority's own
/// cache (see [`server_config`]).
#[derive(Debug)]
struct NoTicketKey;

impl rustls::server::ProducesTickets for NoTicketKey {
    fn enabled(&self) -> bool {
        false
    }
    fn lifetime(&self) -> u32 {
        0
    }
    fn encrypt(&self, _plain: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn decrypt(&self, _cipher: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// The client side for one session: TLS 1.3, public roots plus `extra`.
pub fn client_config(extra: &[CertificateDer<'static>]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for anchor in extra {
        // Anchors were parsed and checked when the config was loaded.
        let _ = roots.add(anchor.clone());
    }
    let mut config = tls13(rustls::ClientConfig::builder_with_provider(provider()))
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Why a control-channel config could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ControlTlsError {
    #[error("control CA: unusable certificate: {0}")]
    UnusableCa(rustls::Error),
    #[error("control CA: {0}")]
    Verifier(rustls::server::VerifierBuilderError),
    #[error("control certificate and key: {0}")]
    CertAndKey(rustls::Error),
}

/// The control CA as the only roots.
fn control_roots(ca: &[CertificateDer<'static>]) -> Result<rustls::RootCertStore, ControlTlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in ca {
        roots.add(c.clone()).map_err(ControlTlsError::UnusableCa)?;
    }
    Ok(roots)
}

/// The control listener: TLS 1.3 only, ALPN `h2`, `chain` and `key` as
/// the gateway's certificate, and a client certificate chaining to one of
/// `ca` required.
pub fn control_server_config(
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, ControlTlsError> {
    mutual_server(provider(), ca, chain, key, &[b"h2"]).map(Arc::new)
}

/// The shipper's connection to the control plane: TLS 1.3, the control CA
/// `ca` as the only root, `chain` and `key` (the gateway's control
/// certificate) as client identity, ALPN `h2`.
pub fn plane_client_config(
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ClientConfig>, ControlTlsError> {
    mutual_client(provider(), ca, chain, key, b"h2")
}

/// A server of the control identities: TLS 1.3 only, `chain` and `key` as
/// its certificate, a client certificate chaining to one of `ca`
/// required, ALPN `alpn`.
fn mutual_server(
    provider: Arc<rustls::crypto::CryptoProvider>,
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[&[u8]],
) -> Result<rustls::ServerConfig, ControlTlsError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(control_roots(ca)?),
        Arc::clone(&provider),
    )
    .build()
    .map_err(ControlTlsError::Verifier)?;
    let mut config = tls13(rustls::ServerConfig::builder_with_provider(provider))
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(ControlTlsError::CertAndKey)?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client of the control identities: TLS 1.3, `ca` as the only root,
/// `chain` and `key` as its identity, ALPN `alpn`.
fn mutual_client(
    provider: Arc<rustls::crypto::CryptoProvider>,
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[u8],
) -> Result<Arc<rustls::ClientConfig>, ControlTlsError> {
    let mut config = tls13(rustls::ClientConfig::builder_with_provider(provider))
        .with_root_certificates(control_roots(ca)?)
        .with_client_auth_cert(chain, key)
        .map_err(ControlTlsError::CertAndKey)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// ALPN of the member link: nothing else is spoken on its listener.
pub const LINK_ALPN: &[u8] = b"talos-link/1";

/// ALPN of a member asking a peer, over the link, which authorities the
/// peer holds (`crate::member_link::link`, "The holder's own word").
pub const HOLDINGS_ALPN: &[u8] = b"talos-holdings/1";

/// The member link's listener: TLS 1.3 only, ALPN [`LINK_ALPN`] and
/// [`HOLDINGS_ALPN`], the gateway's control certificate, and a client
/// certificate chaining to the control CA required (which member it
/// names is checked after the handshake: `crate::member_link::link`). rustls
/// ends a handshake whose client offers only other protocols, but lets
/// one that offers none through: the link refuses that one after the
/// handshake (`no_alpn`).
pub fn link_server_config(
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, ControlTlsError> {
    let mut config = mutual_server(link_provider(), ca, chain, key, &[LINK_ALPN, HOLDINGS_ALPN])?;
    // A link connection is made again after a peer's restart or drain,
    // and each ask for holdings is a connection of its own: resumed ones
    // (stateful, tickets naming sessions kept in this process's memory)
    // skip the certificates' signatures and their verification, most of a
    // handshake's cost. A resumed session keeps the peer's certificate,
    // which the link checks again at every connection.
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(LINK_SESSIONS);
    config.send_tls13_tickets = 2;
    Ok(Arc::new(config))
}

/// The member link's client side: TLS 1.3, the control CA as the only
/// root (a peer's certificate must name the peer's id), the gateway's
/// control certificate as its identity, ALPN `alpn` ([`LINK_ALPN`] or
/// [`HOLDINGS_ALPN`]).
pub fn link_client_config(
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[u8],
) -> Result<Arc<rustls::ClientConfig>, ControlTlsError> {
    let mut config = mutual_client(link_provider(), ca, chain, key, alpn)?;
    Arc::make_mut(&mut config).resumption =
        rustls::client::Resumption::in_memory_sessions(LINK_SESSIONS);
    Ok(config)
}

/// Resumable sessions the member link keeps, on each side.
const LINK_SESSIONS: usize = 4096;

/// A certificate resolver over a session's leaf cache: a leaf of the
/// session's own CA for the hello's name, minted on first use. A name the
/// CA does not permit gets no certificate, and rustls ends the handshake.
#[derive(Debug)]
pub struct LeafResolver {
    leaves: Arc<LeafCache>,
}

impl LeafResolver {
    /// Resolve names through `leaves`.
    pub fn new(leaves: Arc<LeafCache>) -> LeafResolver {
        LeafResolver { leaves }
    }
}

impl ResolvesServerCert for LeafResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // rustls gives the name already lower-cased and without the dot.
        let name = hello.server_name()?;
        match self.leaves.get_or_mint(name) {
            Ok(key) => Some(key),
            Err(e) => {
                tracing::debug!(error = %e, "no leaf for this name");
                None
            }
        }
    }
}

/// How many bytes of unsent TLS a session connection may hold: what one
/// write hands rustls is encrypted and leaves in one `writev` as long as
/// it fits. rustls's default, 64 KiB, is exactly one large HTTP/1.1 reply
/// chunk without its framing (`10000\r\n` before, `\r\n` after), so each
/// such chunk went out as two writes, the second a 9-byte record of its
/// own: twice the system calls, segments and client wake-ups for a
/// download. Still a bound: a client that does not read holds at most
/// this much here before the writer waits.
pub const SESSION_SEND_LIMIT: usize = 128 * 1024;

/// Whether the end-entity certificate `leaf` names `role`.
pub(crate) fn carries_role(leaf: &rustls::pki_types::CertificateDer<'_>, role: &str) -> bool {
    let Ok(name) = rustls::pki_types::ServerName::try_from(role) else {
        return false;
    };
    webpki::EndEntityCert::try_from(leaf)
        .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
}
