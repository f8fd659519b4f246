//! Sessions, named by the source address of their connections.
//!
//! The session's subnet routes all of its traffic to the gateway, so the
//! source address of a connection says which session it belongs to. An
//! address that is no session's is refused `unknown_source`.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use talos_certs::{CaParams, LeafCache, SessionCa};

use crate::config::{canonical_ip, StaticSession};
use crate::mask::MaskSet;
use crate::name::Name;
use crate::secret::{AttachSpec, Attachment, SecretBytes, SecretError};
use crate::tls;
use crate::upstream::Pool;

/// What the gateway knows of one session's current authority: its names,
/// its CA and leaves, its TLS configs and its upstream connections. All of
/// it is dropped together when the session's authority ends.
#[derive(Debug)]
pub struct Session {
    /// The session id, as the control plane names it.
    pub id: Arc<str>,
    /// The tenant the session serves.
    pub tenant: Arc<str>,
    /// The attempt number: 1 at start, one more at each resume or recovery.
    pub attempt: u32,
    /// Canonical destination names the session may reach, exactly.
    pub allowlist: HashSet<Name>,
    /// The session CA (certificate, digest) and the leaves it signed.
    pub leaves: Arc<LeafCache>,
    /// TLS toward the session: leaves of this session's CA only.
    pub tls: Arc<rustls::ServerConfig>,
    /// Connections to destinations, this session's alone.
    pub pool: Pool,
    /// Credentials attached by name, values included.
    pub attachments: Vec<Attachment>,
    /// Every attached value and its encodings, for masking replies; none
    /// when the session has no attachments.
    pub mask: Option<Arc<MaskSet>>,
}

/// Why a session's authority could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Ca(#[from] talos_certs::CertError),
    #[error(transparent)]
    Mask(#[from] crate::mask::MaskSetError),
}

/// What every session's TLS toward destinations uses.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    pub port: u16,
    pub connect_timeout: std::time::Duration,
    /// Public roots plus the configured extra anchors.
    pub tls: Arc<rustls::ClientConfig>,
}

/// The identity of a session's authority.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    pub id: String,
    pub tenant: String,
    pub attempt: u32,
    pub allowlist: Vec<Name>,
    /// Attachments, values read from the secret store when the authority
    /// was opened.
    pub attachments: Vec<Attachment>,
}

impl Session {
    /// Whether `name` (canonical) is exactly on the allowlist.
    pub fn allows(&self, name: &Name) -> bool {
        self.allowlist.contains(name)
    }
}

impl Session {
    /// Open a session's authority: a fresh CA made in this process for
    /// exactly the session's names, its server TLS config and an empty
    /// upstream pool.
    pub fn open(
        spec: SessionSpec,
        gateway_id: &str,
        upstream: &UpstreamSettings,
    ) -> Result<Session, OpenError> {
        let names: Vec<String> = spec
            .allowlist
            .iter()
            .map(|n| n.as_str().to_owned())
            .collect();
        let ca = SessionCa::new(&CaParams::new(&spec.id, spec.attempt, gateway_id, names))?;
        let leaves = Arc::new(LeafCache::new(ca));
        let resolver = tls::LeafResolver::new(Arc::clone(&leaves));
        let mask = if spec.attachments.is_empty() {
            None
        } else {
            let values: Vec<(&str, &[u8])> = spec
                .attachments
                .iter()
                .map(|a| (a.secret.as_str(), a.value.expose()))
                .collect();
            Some(Arc::new(MaskSet::new(&values)?))
        };
        Ok(Session {
            id: Arc::from(spec.id.as_str()),
            tenant: Arc::from(spec.tenant.as_str()),
            attempt: spec.attempt,
            allowlist: spec.allowlist.into_iter().collect(),
            tls: tls::server_config(Arc::new(resolver)),
            pool: Pool::new(
                Arc::clone(&upstream.tls),
                upstream.port,
                upstream.connect_timeout,
            ),
            attachments: spec.attachments,
            mask,
            leaves,
        })
    }

    /// The attachments for requests to `destination`.
    pub fn attachments_for<'a>(
        &'a self,
        destination: &'a Name,
    ) -> impl Iterator<Item = &'a Attachment> + 'a {
        self.attachments
            .iter()
            .filter(move |a| &a.destination == destination)
    }

    /// Whether requests to `destination` carry an attachment.
    pub fn has_attachments(&self, destination: &Name) -> bool {
        self.attachments_for(destination).next().is_some()
    }

    /// The session CA's SHA-384 digest (lowercase hex).
    pub fn ca_digest(&self) -> &str {
        self.leaves.ca().digest()
    }

    /// The session CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.leaves.ca().cert_pem()
    }
}

impl SessionSpec {
    /// The spec of a session from the config file, with secret values
    /// looked up by name in `values`.
    pub fn from_static(
        s: &StaticSession,
        values: &HashMap<String, SecretBytes>,
    ) -> Result<SessionSpec, SecretError> {
        let mut attachments = Vec::new();
        for spec in &s.attach {
            let spec = AttachSpec::parse(spec.get_ref())?;
            let value =
                values
                    .get(&spec.secret)
                    .cloned()
                    .ok_or_else(|| SecretError::BadAttachment {
                        spec: spec.secret.clone(),
                        reason: "no such secret".into(),
                    })?;
            attachments.push(Attachment::new(&spec, value)?);
        }
        Ok(SessionSpec {
            id: s.id.get_ref().clone(),
            tenant: s.tenant.clone(),
            attempt: s.attempt,
            allowlist: s.allowlist.iter().map(|n| n.get_ref().clone()).collect(),
            attachments,
        })
    }
}

/// Every open session, by source address.
///
/// Reads (one per connection) far outnumber writes (one per session event),
/// so a read-write lock over a map is enough; the lock is never held across
/// an await.
#[derive(Debug, Default)]
pub struct Sessions {
    // invariant: keys are canonical (IPv4-mapped IPv6 stored as IPv4).
    by_source: RwLock<HashMap<IpAddr, Arc<Session>>>,
}

impl Sessions {
    /// Map each of `sources` to `session`, replacing whatever was there.
    pub fn insert(&self, sources: &[IpAddr], session: Arc<Session>) {
        let mut map = self.by_source.write().unwrap_or_else(|p| p.into_inner());
        for ip in sources {
            map.insert(canonical_ip(*ip), Arc::clone(&session));
        }
    }

    /// The session whose source address is `ip`.
    pub fn by_source(&self, ip: IpAddr) -> Option<Arc<Session>> {
        let map = self.by_source.read().unwrap_or_else(|p| p.into_inner());
        map.get(&canonical_ip(ip)).cloned()
    }

    /// How many source addresses are mapped.
    pub fn len(&self) -> usize {
        self.by_source
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
