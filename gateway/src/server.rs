//! The process: listeners, the connection cap, graceful shutdown.
//!
//! `run` goes through three phases:
//!
//! 1. [`Built::new`]: everything that can fail, done (sessions, resolver,
//!    listeners bound, keys loaded, TLS configs, record file, spool); a
//!    failure is a [`StartError`] naming what failed, and nothing has run.
//! 2. [`Built::spawn`] starts the tasks (record writer, shipper, admin,
//!    control channel) and prints one `ready` line on standard output (so
//!    scripts and tests learn the bound addresses, useful with port 0);
//!    [`Running::accept_until`] accepts until SIGTERM or SIGINT.
//! 3. [`Running::drain`], in numbered steps: the control channel stops,
//!    `/readyz` turns 503, the data listener closes, open connections get
//!    the configured grace and the rest are cut, every record is written
//!    and the last batch sealed, and the shipper gets the grace to deliver
//!    the spool (woken when it empties, not polled) before the process
//!    exits.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::conn::{self, Shared};
use crate::gate::resolve::Resolver;
use crate::records::record::{RecordSink, RecordWriter};
use crate::secrets::secret::SecretBytes;
use crate::session::sessions::{Session, SessionSpec, Sessions, UpstreamSettings};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot bind the {which} listener on {addr}: {source}")]
    Bind {
        which: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open the record file {path}: {source}")]
    Records {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Resolver(String),
    #[error("cannot open session {session}: {source}")]
    SessionCa {
        session: String,
        source: crate::session::sessions::OpenError,
    },
    #[error("cannot write the trust file of session {session} to {path}: {source}")]
    TrustFile {
        session: String,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    TrustAnchor(String),
    #[error("{0}")]
    Secret(crate::secrets::secret::SecretError),
    #[error("{0}")]
    Control(String),
    #[error("{0}")]
    ControlTls(crate::tls::ControlTlsError),
    #[error("{0}")]
    PlaneTls(crate::tls::ControlTlsError),
    #[error(transparent)]
    SigningKey(#[from] talos_certs::KeyError),
    #[error(transparent)]
    Spool(#[from] crate::records::spool::SpoolError),
}

/// The control channel, ready to serve once the data path's state exists.
#[derive(Debug)]
struct ControlSetup {
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    key: Arc<talos_certs::GatewayKey>,
    batches: Option<BatchSetup>,
}

/// Signed batches: the spool, where its chain stands, the control plane.
#[derive(Debug)]
struct BatchSetup {
    spool: Arc<crate::records::spool::Spool>,
    position: crate::records::spool::ChainPosition,
    plane: crate::records::shipper::Plane,
    max_records: usize,
    interval: Duration,
}

/// Load the control channel's keys and certificates (config validation
/// has checked them once already; they are read again as the gateway
/// starts) and bind its listener.
async fn setup_control(c: &crate::config::Control) -> Result<ControlSetup, StartError> {
    let ca = crate::config::read_pem_certs(c.ca_file.get_ref()).map_err(StartError::Control)?;
    let chain =
        crate::config::read_pem_certs(c.cert_file.get_ref()).map_err(StartError::Control)?;
    let key = crate::config::read_private_key(c.key_file.get_ref()).map_err(StartError::Control)?;
    let tls = crate::tls::control_server_config(&ca, chain.clone(), key.clone_key())
        .map_err(StartError::ControlTls)?;
    let signing = talos_certs::GatewayKey::load_or_create(c.signing_key_file.get_ref())?;
    let batches = match (&c.plane, &c.spool_dir) {
        (Some(plane), Some(dir)) => {
            let (spool, position) = crate::records::spool::Spool::open(
                dir.get_ref(),
                crate::records::spool::SpoolLimits {
                    max_batches: c.spool_max_batches,
                    max_bytes: c.spool_max_bytes,
                },
            )?;
            Some(BatchSetup {
                spool: Arc::new(spool),
                position,
                plane: crate::records::shipper::Plane {
                    addr: *plane.get_ref(),
                    name: c.plane_name.clone(),
                    tls: crate::tls::plane_client_config(&ca, chain, key)
                        .map_err(StartError::PlaneTls)?,
                },
                max_records: c.batch_max_records,
                interval: Duration::from_millis(c.batch_interval_ms),
            })
        }
        _ => None,
    };
    let addr = *c.listen.get_ref();
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind {
            which: "control",
            addr,
            source,
        })?;
    Ok(ControlSetup {
        listener,
        tls,
        key: Arc::new(signing),
        batches,
    })
}

/// Read the static sessions' secret values from their sources (config
/// validation guarantees exactly one source each).
fn load_secrets(config: &Config) -> Result<HashMap<String, SecretBytes>, StartError> {
    let mut values = HashMap::new();
    for src in &config.secrets {
        let name = src.name.get_ref();
        let value = match (&src.env, &src.file) {
            (Some(var), _) => crate::secrets::secret::from_env(name, var),
            (None, Some(path)) => crate::secrets::secret::from_file(name, path),
            (None, None) => Err(crate::secrets::secret::SecretError::Empty { name: name.clone() }),
        }
        .map_err(StartError::Secret)?;
        values.insert(name.clone(), value);
    }
    Ok(values)
}

/// Open the config file's sessions: each gets a fresh CA made here, its
/// certificate written where the config says.
fn open_static_sessions(
    config: &Config,
    upstream: &UpstreamSettings,
) -> Result<Sessions, StartError> {
    let values = load_secrets(config)?;
    let sessions = Sessions::default();
    for s in &config.sessions {
        let spec = SessionSpec::from_static(s, &values).map_err(StartError::Secret)?;
        let session =
            Session::open(spec, config.gateway_id.get_ref(), upstream, None).map_err(|source| {
                StartError::SessionCa {
                    session: s.id.get_ref().clone(),
                    source,
                }
            })?;
        if let Some(path) = &s.trust_file {
            std::fs::write(path, session.ca_pem()).map_err(|source| StartError::TrustFile {
                session: s.id.get_ref().clone(),
                path: path.clone(),
                source,
            })?;
        }
        tracing::info!(
            session = %session.id,
            attempt = session.attempt,
            ca_digest = session.ca_digest(),
            trust_file = ?s.trust_file,
            attachments = session.attachments.len(),
            "session CA made"
        );
        let sources: Vec<std::net::IpAddr> =
            s.sources.get_ref().iter().map(|a| *a.get_ref()).collect();
        sessions.insert(&sources, Arc::new(session));
    }
    Ok(sessions)
}

/// Run the gateway until a shutdown signal: build, run, drain.
pub async fn run(config: Config) -> Result<(), StartError> {
    let running = Built::new(config).await?.spawn();
    running.accept_until(shutdown_signal()).await;
    running.drain().await;
    Ok(())
}

/// Everything that can fail at start, done: config-derived state, static
/// sessions, the resolver, listeners bound, keys loaded, TLS configs, the
/// record file and the spool. Nothing runs yet.
#[derive(Debug)]
pub struct Built {
    config: Config,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    upstream: UpstreamSettings,
    sessions: Sessions,
    resolver: Resolver,
    data: TcpListener,
    admin: TcpListener,
    control: Option<ControlSetup>,
    records: RecordSink,
    writer: RecordWriter,
}

impl Built {
    /// Build everything from `config`, in this order: trust anchors and
    /// the upstream settings, the static sessions (their trust files
    /// written), the resolver, the data and admin listeners, the control
    /// channel (its keys, TLS configs, spool and listener), the record file.
    pub async fn new(config: Config) -> Result<Built, StartError> {
        for w in config.warnings() {
            tracing::warn!("{}", w.0);
        }
        let metrics = crate::admin::install_metrics();
        let mut anchors = Vec::new();
        for path in &config.upstream.extra_trust_anchors {
            anchors.extend(
                crate::config::read_pem_certs(path.get_ref()).map_err(StartError::TrustAnchor)?,
            );
        }
        let upstream = UpstreamSettings {
            port: config.upstream.port,
            connect_timeout: config.upstream.connect_timeout(),
            tls: crate::tls::client_config(&anchors),
            share: config.limits.share(),
        };
        let sessions = open_static_sessions(&config, &upstream)?;
        let resolver = Resolver::new(&config.resolver.settings()).map_err(StartError::Resolver)?;
        let data = bind("data", config.listen.data).await?;
        let admin = bind("admin", config.listen.admin).await?;
        let control = match &config.control {
            Some(c) => Some(setup_control(c).await?),
            None => None,
        };
        let (records, writer) =
            RecordSink::open_file(&config.records.path).map_err(|source| StartError::Records {
                path: config.records.path.clone(),
                source,
            })?;
        Ok(Built {
            config,
            metrics,
            upstream,
            sessions,
            resolver,
            data,
            admin,
            control,
            records,
            writer,
        })
    }

    /// Start everything built: the shipper and the proposals to the relay
    /// (with signed batches), the record writer, the admin listener, the
    /// control channel; then print the ready line. Connections are
    /// accepted by [`Running::accept_until`].
    pub fn spawn(self) -> Running {
        let config = self.config;
        let mut control = self.control;
        let mut writer = self.writer;
        // Signed batches: the sealer behind the record writer, the shipper
        // draining the spool, the proposals to the relay.
        let mut shipping = None;
        let mut proposer = None;
        if let Some(c) = control.as_mut() {
            if let Some(b) = c.batches.take() {
                tracing::info!(
                    plane = %b.plane.addr,
                    spooled = b.spool.len().0,
                    next_seq = b.position.last_seq + 1,
                    "shipping signed batches"
                );
                writer = writer.with_sealer(crate::records::spool::Sealer::new(
                    Arc::clone(&c.key),
                    config.gateway_id.get_ref(),
                    b.position,
                    Arc::clone(&b.spool),
                    b.max_records,
                    b.interval,
                ));
                let stop = CancellationToken::new();
                let (p, proposals) = crate::session::approvals::Proposer::new();
                proposer = Some(p);
                tokio::spawn(crate::records::shipper::propose(
                    proposals,
                    b.plane.clone(),
                    stop.clone(),
                ));
                let task = tokio::spawn(crate::records::shipper::ship(
                    Arc::clone(&b.spool),
                    b.plane,
                    stop.clone(),
                ));
                shipping = Some(Shipping {
                    spool: b.spool,
                    task,
                    stop,
                });
            }
        }
        let writer = tokio::spawn(writer.run());
        let data_addr = self.data.local_addr().unwrap_or(config.listen.data);
        let admin_addr = self.admin.local_addr().unwrap_or(config.listen.admin);

        let shutdown = CancellationToken::new();
        let ready = Arc::new(AtomicBool::new(true));
        let admin = tokio::spawn(crate::admin::serve(
            self.admin,
            self.metrics,
            Arc::clone(&ready),
            shutdown.clone(),
        ));

        let shared = Arc::new(Shared {
            gateway_id: Arc::from(config.gateway_id.get_ref().as_str()),
            sessions: self.sessions,
            resolver: self.resolver,
            records: self.records,
            hello_max_bytes: config.limits.hello_max_bytes,
            hello_timeout: config.limits.hello_timeout(),
            handshake_timeout: config.limits.handshake_timeout(),
            h2_idle_timeout: config.limits.h2_idle_timeout(),
            tcp_keepalive: config.limits.tcp_keepalive(),
            shutdown: shutdown.clone(),
            proposer,
        });
        // What the runtime runs on, as built (not the config read again).
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        tracing::info!(
            gateway_id = %shared.gateway_id,
            data = %data_addr,
            admin = %admin_addr,
            sessions = config.sessions.len(),
            workers,
            "listening"
        );
        // Fires when draining starts: stops the control listener (no
        // session opens on a gateway that is going away) and the readiness
        // follower below.
        let draining = CancellationToken::new();
        let mut ready_line = serde_json::json!(
            {"event": "ready", "data": data_addr, "admin": admin_addr, "workers": workers}
        );
        let control = control.map(|c| {
            let addr = c.listener.local_addr().ok();
            ready_line["control"] = serde_json::json!(addr);
            tracing::info!(control = ?addr, key_id = %c.key.key_id(), "control channel listening");
            let service =
                crate::control::ControlService::new(Arc::clone(&shared), c.key, self.upstream);
            tokio::spawn(crate::control::serve(
                c.listener,
                c.tls,
                service,
                draining.clone(),
            ))
        });
        println!("{ready_line}");
        if let Some(s) = &shipping {
            tokio::spawn(follow_spool(
                s.spool.full(),
                Arc::clone(&ready),
                draining.clone(),
            ));
        }
        Running {
            grace: config.limits.shutdown_grace(),
            cap: Arc::new(Semaphore::new(config.limits.max_connections)),
            data: self.data,
            tracker: TaskTracker::new(),
            shared,
            shutdown,
            ready,
            draining,
            admin,
            control,
            writer,
            shipping,
        }
    }
}

/// `/readyz` follows the spool: not ready while it is full, until
/// `draining` fires.
async fn follow_spool(
    mut full: watch::Receiver<bool>,
    ready: Arc<AtomicBool>,
    draining: CancellationToken,
) {
    loop {
        let room = !*full.borrow_and_update();
        if draining.is_cancelled() {
            return;
        }
        ready.store(room, Ordering::Relaxed);
        tokio::select! {
            _ = draining.cancelled() => return,
            changed = full.changed() => if changed.is_err() { return },
        }
    }
}

/// The spool and the shipper delivering it.
#[derive(Debug)]
struct Shipping {
    spool: Arc<crate::records::spool::Spool>,
    task: JoinHandle<()>,
    /// Stops the shipper and the proposals to the relay.
    stop: CancellationToken,
}

/// The gateway at work: the data listener and what serves its
/// connections, and the handles of every task the drain waits for.
#[derive(Debug)]
pub struct Running {
    grace: Duration,
    /// The connection cap.
    cap: Arc<Semaphore>,
    data: TcpListener,
    /// Open connections.
    tracker: TaskTracker,
    shared: Arc<Shared>,
    /// Fires when open connections must be cut; stops the admin listener.
    shutdown: CancellationToken,
    /// What `/readyz` answers.
    ready: Arc<AtomicBool>,
    /// Fires when draining starts.
    draining: CancellationToken,
    admin: JoinHandle<()>,
    control: Option<JoinHandle<()>>,
    writer: JoinHandle<()>,
    shipping: Option<Shipping>,
}

impl Running {
    /// Accept connections until `signal` resolves, each on its own task,
    /// at most the cap at once.
    pub async fn accept_until(&self, signal: impl std::future::Future<Output = ()>) {
        let mut spool_full = self.shipping.as_ref().map(|s| s.spool.full());
        tokio::pin!(signal);
        loop {
            // A full spool fails closed: accept nothing until it has room.
            if let Some(full) = spool_full.as_mut() {
                if *full.borrow() {
                    let room = full.wait_for(|f| !*f);
                    tokio::select! {
                        _ = &mut signal => break,
                        r = room => if r.is_err() { break },
                    }
                }
            }
            // Wait for room first: past the cap the kernel backlog holds clients.
            let permit = tokio::select! {
                _ = &mut signal => break,
                p = Arc::clone(&self.cap).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let (stream, peer) = tokio::select! {
                _ = &mut signal => break,
                // The spool filled while waiting: back to the top, to wait there.
                () = spool_fills(spool_full.as_mut()) => continue,
                accepted = self.data.accept() => match accepted {
                    Ok(a) => {
                        // Small TLS records (handshake, HTTP/2 frames, the
                        // last bytes of a reply) go out at once instead of
                        // waiting out the peer's delayed ACK.
                        let _ = a.0.set_nodelay(true);
                        a
                    }
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let shared = Arc::clone(&self.shared);
            self.tracker.spawn(async move {
                conn::serve(&shared, stream, peer).await;
                drop(permit);
            });
        }
    }

    /// The drain, once accepting has stopped. Each wait is bounded by the
    /// grace (`shutdown_grace_ms`) on its own.
    pub async fn drain(self) {
        let grace = self.grace;
        tracing::info!(open = self.tracker.len(), "draining");
        // 1. Stop the control channel: no session opens on a gateway that
        //    is going away. Open RPCs get the grace; a client that holds
        //    its connection open past it is cut.
        self.draining.cancel();
        if let Some(mut task) = self.control {
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                task.abort();
            }
        }
        // 2. `/readyz` answers 503.
        self.ready.store(false, Ordering::Relaxed);
        // 3. Close the data listener: new connections are refused.
        drop(self.data);
        // 4. Open connections get the grace to finish; 5. the rest are cut
        //    (their records say so) and finish.
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.tracker.len(),
                "grace over; cutting open connections"
            );
            self.shutdown.cancel();
            self.tracker.wait().await;
        }
        // 6. Stop the admin listener.
        self.shutdown.cancel();
        let _ = self.admin.await;
        // 7. Flush the record writer: with the last sink dropped it writes
        //    what is queued, seals the last batch and ends.
        drop(self.shared);
        let _ = self.writer.await;
        // 8. Give the shipper the grace to deliver the spool, woken when
        //    it empties; what it cannot deliver stays spooled for the next
        //    start.
        if let Some(s) = self.shipping {
            s.deliver(grace).await;
        }
        // 9. Exit.
        tracing::info!("stopped");
    }
}

impl Shipping {
    /// Wait up to `grace` for the spool to empty, then stop the shipper and
    /// say what is left.
    async fn deliver(self, grace: Duration) {
        let delivered = tokio::time::timeout(grace, self.spool.emptied())
            .await
            .is_ok();
        self.stop.cancel();
        let _ = self.task.await;
        let (batches, bytes) = self.spool.len();
        if delivered {
            tracing::info!("every batch delivered");
        } else {
            tracing::warn!(
                batches,
                bytes,
                "batches left in the spool; they are shipped after the next start"
            );
        }
    }
}

async fn bind(which: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind {
            which,
            addr,
            source,
        })
}

/// Resolves when the spool becomes full; never without a spool.
async fn spool_fills(full: Option<&mut tokio::sync::watch::Receiver<bool>>) {
    match full {
        Some(f) => {
            if f.wait_for(|full| *full).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
