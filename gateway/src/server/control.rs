//! The control side: the control channel's keys, TLS and listener, the
//! authority that ends sessions (close, lapse, replacement, shutdown), the
//! lease watcher, and the channel's server. Prepared before anything runs;
//! started once the data path serves; at the drain its channel stops
//! first and its authorities end last, after their connections.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::error::StartError;
use super::listeners::bind;
use super::records::BatchSetup;
use crate::authority::{Authority, LeaseWatcher};
use crate::records::journal::{self, RecordSink};
use crate::records::spool::{Spool, SpoolLimits};
use crate::serving::InForce;
use crate::session::lease::SharedClock;
use crate::session::sessions::Sessions;

/// The control channel, ready to serve once the data path's state exists.
#[derive(Debug)]
pub(super) struct ControlSetup {
    pub(super) listener: Arc<TcpListener>,
    pub(super) tls: Arc<rustls::ServerConfig>,
    pub(super) key: Arc<talos_certs::GatewayKey>,
    /// The signing key bound to this gateway's role and id by its
    /// control-channel key (talos-certs `KeyBinding`, JSON; empty when the
    /// control-channel key is not one a binding can be signed with):
    /// `Describe` gives it with the key.
    pub(super) key_binding: Vec<u8>,
    pub(super) batches: Option<BatchSetup>,
}

impl ControlSetup {
    /// The signed batches' setup and the key that signs them, taken for
    /// the records (none without `[control] spool_dir`).
    pub(super) fn take_batches(&mut self) -> Option<(BatchSetup, Arc<talos_certs::GatewayKey>)> {
        let key = Arc::clone(&self.key);
        self.batches.take().map(|b| (b, key))
    }
}

/// Load the control channel's keys and certificates (config validation
/// has checked them once already; they are read again as the gateway
/// starts) and bind its listener (or take the one handed over). A
/// successor leaves the spool for later.
pub(super) async fn setup_control(
    c: &crate::config::Control,
    gateway_id: &str,
    adopted: Option<TcpListener>,
    successor: bool,
) -> Result<ControlSetup, StartError> {
    let ca = crate::config::read_pem_certs(c.ca_file.get_ref()).map_err(StartError::Control)?;
    let chain =
        crate::config::read_pem_certs(c.cert_file.get_ref()).map_err(StartError::Control)?;
    let key = crate::config::read_private_key(c.key_file.get_ref()).map_err(StartError::Control)?;
    let tls = crate::tls::control_server_config(&ca, chain.clone(), key.clone_key())
        .map_err(StartError::ControlTls)?;
    let signing = talos_certs::GatewayKey::load_or_create(c.signing_key_file.get_ref())?;
    let key_binding = key_binding(&key, &chain, gateway_id, &signing);
    let batches = match (&c.plane, &c.spool_dir) {
        (Some(plane), Some(dir)) => {
            let limits = SpoolLimits {
                max_batches: *c.spool_max_batches.get_ref(),
                max_bytes: *c.spool_max_bytes.get_ref(),
            };
            let spool = if successor {
                None
            } else {
                let (spool, position) = Spool::open(dir.get_ref(), limits)?;
                Some((Arc::new(spool), position))
            };
            Some(BatchSetup {
                spool,
                spool_dir: dir.get_ref().clone(),
                limits,
                plane: crate::records::shipper::Plane {
                    addrs: plane.get_ref().addrs().to_vec(),
                    name: c.plane_name.get_ref().clone(),
                    tls: crate::tls::plane_client_config(&ca, chain, key)
                        .map_err(StartError::PlaneTls)?,
                },
                max_records: *c.batch_max_records.get_ref(),
                interval: Duration::from_millis(*c.batch_interval_ms.get_ref()),
                journal_dir: dir.get_ref().join(journal::JOURNAL_DIR),
                recovered: None,
            })
        }
        _ => None,
    };
    let listener = match adopted {
        Some(l) => l,
        None => bind("control", *c.listen.get_ref()).await?,
    };
    Ok(ControlSetup {
        listener: Arc::new(listener),
        tls,
        key: Arc::new(signing),
        key_binding,
        batches,
    })
}

/// The signing key bound to the gateway role and `gateway_id` by the
/// control-channel key `key`, whose certificate is the first of `chain`
/// (talos-certs `KeyBinding`, JSON). Empty, with a warning, when the key is
/// not ECDSA P-256 (a binding is made for the certificates `control-stub
/// init` issues; a reviewer's check of this member's signatures then rests
/// on the control plane's registration alone).
fn key_binding(
    key: &rustls::pki_types::PrivateKeyDer<'_>,
    chain: &[rustls::pki_types::CertificateDer<'static>],
    gateway_id: &str,
    signing: &talos_certs::GatewayKey,
) -> Vec<u8> {
    let Some(cert) = chain.first() else {
        return Vec::new();
    };
    match talos_certs::KeyBinding::sign(
        key.secret_der(),
        cert.to_vec(),
        talos_certs::ROLE_GATEWAY,
        gateway_id,
        &signing.public_key(),
    ) {
        Ok(binding) => binding.to_json().into_bytes(),
        Err(e) => {
            tracing::warn!(error = %e, "no key binding: the signing key is not bound under the control CA");
            Vec::new()
        }
    }
}

/// The control side, built: the channel's server, the authority, the
/// lease watcher.
#[derive(Debug)]
pub(super) struct ControlSide {
    pub(super) runner: Arc<crate::control::Runner>,
    pub(super) authority: Arc<Authority>,
    pub(super) watcher: Arc<LeaseWatcher>,
    pub(super) key_id: String,
}

/// What the control side needs of the rest of the process.
pub(super) struct ControlParts {
    pub(super) gateway_id: Arc<str>,
    pub(super) current: Arc<InForce>,
    pub(super) records: RecordSink,
    pub(super) sessions: Arc<Sessions>,
    pub(super) clock: SharedClock,
    pub(super) lease: Duration,
    /// Told when a use finds a lease lapsed.
    pub(super) lapsed: Arc<tokio::sync::Notify>,
    /// Reports of ends the predecessor made (a successor).
    pub(super) ended: Vec<crate::handover::state::EndedState>,
}

impl ControlSide {
    /// The authority (with the ends a predecessor remembered), its lease
    /// watcher and the channel's server over `setup`'s listener; nothing
    /// runs yet.
    pub(super) fn build(setup: ControlSetup, p: ControlParts) -> ControlSide {
        let authority = Arc::new(Authority::new(
            p.gateway_id,
            Arc::clone(&setup.key),
            p.records,
            p.sessions,
            p.clock,
            p.lease,
            p.lapsed,
        ));
        for e in p.ended {
            authority.adopt_ended(&e.session_id, e.attempt, e.report);
        }
        let watcher = Arc::new(LeaseWatcher::new(Arc::clone(&authority)));
        let key_id = setup.key.key_id();
        let service = crate::control::ControlService::new(
            p.current,
            setup.key,
            setup.key_binding,
            Arc::clone(&authority),
        );
        let runner = Arc::new(crate::control::Runner::new(
            setup.listener,
            setup.tls,
            service,
        ));
        ControlSide {
            runner,
            authority,
            watcher,
            key_id,
        }
    }

    /// Serve the channel and watch the leases; returns the channel's
    /// address for the ready line.
    pub(super) fn start(&self) -> Option<std::net::SocketAddr> {
        let addr = self.runner.listener().local_addr().ok();
        tracing::info!(control = ?addr, "control channel listening");
        self.runner.start();
        self.watcher.start();
        addr
    }

    /// The drain's first step: no session opens on a gateway that is
    /// going away. Open calls get `grace`.
    pub(super) async fn stop_channel(&self, grace: Duration) {
        self.runner.stop(grace).await;
    }

    /// The drain's end for authorities, once their connections are
    /// recorded: each ends (reason `shutdown`), its report on the record
    /// after its connections'; after a handover they are the successor's,
    /// and this process only lets go of them.
    pub(super) async fn end(self, handed_over: bool, sessions: &Sessions) {
        self.watcher.stop();
        if handed_over {
            let_go(sessions);
        } else {
            self.authority.shutdown().await;
        }
    }
}

/// Let go of every session without ending its authority here (no
/// control plane to report to, or a successor holds it now).
pub(super) fn let_go(sessions: &Sessions) {
    for s in sessions.remove_all() {
        s.end_and_withdraw();
    }
}
