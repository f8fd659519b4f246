//! The process: listeners, the connection cap, reload, handover, graceful
//! shutdown.
//!
//! `run` goes through these phases:
//!
//! 1. [`Built::new`]: everything that can fail, done (settings, static
//!    sessions, listeners bound — or, for a successor, taken over with
//!    every live authority —, keys loaded, TLS configs, record file,
//!    spool); a failure is a [`StartError`] naming what failed, and nothing
//!    has run.
//! 2. [`Built::spawn`] starts the record writer and the batches (sealer,
//!    shipper); a successor then says `ready` to the process it takes over
//!    from and waits for `go`. [`Running::serve`] starts the rest (admin,
//!    control channel, lease watcher, process socket, signals), prints one
//!    `ready` line on standard output (so scripts and tests learn the bound
//!    addresses, useful with port 0), tells the service manager, and
//!    accepts until SIGTERM or SIGINT — or until a successor takes over.
//! 3. [`Running::drain`], in numbered steps: every open connection is
//!    told to finish (HTTP/1.1 `Connection: close`, HTTP/2 GOAWAY), the
//!    control channel stops, `/readyz` turns 503, the data listener
//!    closes, open connections get the configured grace from the drain's
//!    start and the rest are cut, every record is written
//!    and the last batch sealed, and the shipper gets the grace to deliver
//!    the spool (woken when it empties, not polled) before the process
//!    exits. After a handover the authorities are the successor's: none is
//!    ended here, and the successor ships what this process spooled.
//!
//! SIGHUP (and `gateway reload`) reloads the config ([`crate::reload`]);
//! SIGUSR2 (and `gateway upgrade`) hands over to a successor
//! ([`crate::handover`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::authority::{report_entry, Authority, LeaseWatcher};
use crate::config::Config;
use crate::conn::{self, Current, Shared};
use crate::handover::state::{Handovers, ListenerState};
use crate::handover::{Listeners, Taken, Upgrader};
use crate::records::journal::{self, JournalSetup, WriterConfig, WriterThread};
use crate::records::spool::{ChainPosition, Spool, SpoolLimits};
use crate::reload::{Cap, Reloader, StaticPlan, StaticSet, Tuned};
use crate::session::approvals::Proposer;
use crate::session::lease::{boot_clock, Lease, SharedClock};
use crate::session::sessions::Sessions;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot bind the {which} listener on {addr}: {source}")]
    Bind {
        which: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot bind the process socket {path}: {source}")]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the record file {path}: {source}")]
    Records {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Settings(String),
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
    #[error(transparent)]
    Journal(#[from] crate::records::journal::JournalError),
    #[error("cannot take over: {0}")]
    Takeover(String),
}

/// How the process was started.
#[derive(Debug)]
pub struct Options {
    /// The config file (read again by reloads and successors).
    pub config_path: PathBuf,
    /// Logs as JSON lines (a successor logs the same way).
    pub json_logs: bool,
    /// Take over from the process listening on the config's process socket.
    pub takeover: bool,
    /// Changes the log level at a reload.
    pub log: Option<crate::logging::LogControl>,
}

/// The control channel, ready to serve once the data path's state exists.
#[derive(Debug)]
struct ControlSetup {
    listener: Arc<TcpListener>,
    tls: Arc<rustls::ServerConfig>,
    key: Arc<talos_certs::GatewayKey>,
    batches: Option<BatchSetup>,
}

/// Signed batches: the spool, where its chain stands, the control plane.
#[derive(Debug)]
struct BatchSetup {
    /// Opened at start; a successor opens it once its predecessor, which
    /// holds it, has exited.
    spool: Option<(Arc<Spool>, ChainPosition)>,
    spool_dir: PathBuf,
    limits: SpoolLimits,
    plane: crate::records::shipper::Plane,
    max_records: usize,
    interval: Duration,
    /// The journal directory, and what an earlier process left there.
    journal_dir: PathBuf,
    /// Filled by [`Built::new`] once the instance is known (a cold start).
    recovered: Option<journal::Recovered>,
}

/// Load the control channel's keys and certificates (config validation
/// has checked them once already; they are read again as the gateway
/// starts) and bind its listener (or take the one handed over). A
/// successor leaves the spool for later.
async fn setup_control(
    c: &crate::config::Control,
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
    let batches = match (&c.plane, &c.spool_dir) {
        (Some(plane), Some(dir)) => {
            let limits = SpoolLimits {
                max_batches: c.spool_max_batches,
                max_bytes: c.spool_max_bytes,
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
                    addr: *plane.get_ref(),
                    name: c.plane_name.clone(),
                    tls: crate::tls::plane_client_config(&ca, chain, key)
                        .map_err(StartError::PlaneTls)?,
                },
                max_records: c.batch_max_records,
                interval: Duration::from_millis(c.batch_interval_ms),
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
        batches,
    })
}

/// Run the gateway until a shutdown signal or a handover: build, run,
/// drain.
pub async fn run(config: Config, options: Options) -> Result<(), StartError> {
    // First of all: a signal sent the moment the ready line is read (or
    // while a successor takes over) must find its handler, not the default
    // action, which ends the process without a word and without a drain.
    let signals = Signals::listen();
    let mut link = None;
    let taken = if options.takeover {
        let (taken, stream) = crate::handover::take_over(&config, &options.config_path)
            .await
            .map_err(|e| StartError::Takeover(e.to_string()))?;
        link = Some(stream);
        Some(taken)
    } else {
        None
    };
    let built = match Built::new(config, options, taken).await {
        Ok(b) => b,
        Err(e) => {
            if let Some(s) = link.as_mut() {
                crate::handover::refuse_on(s, &e.to_string()).await;
            }
            return Err(e);
        }
    };
    let running = match built.spawn(&mut link).await {
        Ok(r) => r,
        Err(e) => {
            if let Some(s) = link.as_mut() {
                crate::handover::refuse_on(s, &e.to_string()).await;
            }
            return Err(e);
        }
    };
    let (running, end) = running.serve(signals).await;
    running.drain(end).await;
    Ok(())
}

/// What the relay's proposals arrive on.
type Proposals = mpsc::UnboundedReceiver<crate::session::approvals::Proposed>;

/// Everything that can fail at start, done: settings, static sessions (or
/// the authorities taken over), the resolver, listeners bound (or taken
/// over), keys loaded, TLS configs, the record file and the spool.
/// Nothing runs yet.
#[derive(Debug)]
pub struct Built {
    config: Config,
    options: Options,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    tuned: Tuned,
    clock: SharedClock,
    /// This process's instance id: its records and reports name it.
    instance: Arc<str>,
    /// 0 after a cold start; one more at each handover.
    generation: u64,
    sessions: Arc<Sessions>,
    /// Static sessions as the config defines them, and what they change.
    statics: StaticSet,
    plan: StaticPlan,
    data: Arc<TcpListener>,
    admin: Arc<TcpListener>,
    process: Option<Arc<UnixListener>>,
    control: Option<ControlSetup>,
    proposer: Option<(Proposer, Proposals)>,
    /// Told when a use finds a lease lapsed.
    lapsed: Arc<tokio::sync::Notify>,
    /// Reports of ends the predecessor made.
    ended: Vec<crate::handover::state::EndedState>,
    /// The predecessor's generation (a successor).
    predecessor_generation: Option<u64>,
    /// The handovers the predecessor had counted (a successor).
    predecessor_handovers: Option<Handovers>,
    exe: PathBuf,
}

impl Built {
    /// Build everything from `config`, in this order: the settings (trust
    /// anchors, resolver), the listeners (bound, or taken over), the
    /// control channel (its keys, TLS configs, spool and listener), the
    /// authorities taken over, the static sessions (their trust files
    /// written beside their place), the record file.
    pub async fn new(
        config: Config,
        options: Options,
        taken: Option<Taken>,
    ) -> Result<Built, StartError> {
        for w in config.warnings() {
            tracing::warn!("{}", w.0);
        }
        // The binary to start for an upgrade: its path now, so that a new
        // binary installed at that path is the one started.
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("gateway"));
        let metrics = crate::admin::install_metrics();
        let tuned = Tuned::build(&config).map_err(StartError::Settings)?;
        let clock = boot_clock();
        let successor = taken.is_some();
        let (mut fds, offer, mut secrets) = match taken {
            Some(t) => (t.fds, Some(t.offer), t.secrets.into_iter()),
            None => (HashMap::new(), None, Vec::new().into_iter()),
        };
        let data_fd = fds.remove("data").map(std::net::TcpListener::from);
        let admin_fd = fds.remove("admin").map(std::net::TcpListener::from);
        let control_fd = fds
            .remove("control")
            .map(std::net::TcpListener::from)
            .map(from_std)
            .transpose()?;
        let data = listener(data_fd, "data", config.listen.data).await?;
        let admin = listener(admin_fd, "admin", config.listen.admin).await?;
        let process = match (&config.process.socket, fds.remove("process")) {
            (Some(_), Some(fd)) => {
                let l = std::os::unix::net::UnixListener::from(fd);
                l.set_nonblocking(true)
                    .map_err(|source| StartError::Socket {
                        path: PathBuf::from("(handed over)"),
                        source,
                    })?;
                Some(Arc::new(UnixListener::from_std(l).map_err(|source| {
                    StartError::Socket {
                        path: PathBuf::from("(handed over)"),
                        source,
                    }
                })?))
            }
            (Some(path), None) => Some(Arc::new(crate::handover::bind(path.get_ref()).map_err(
                |source| StartError::Socket {
                    path: path.get_ref().clone(),
                    source,
                },
            )?)),
            (None, _) => None,
        };
        let (instance, generation): (Arc<str>, u64) = match &offer {
            Some(o) => (Arc::from(o.instance.as_str()), o.generation),
            None => (Arc::from(talos_certs::new_instance_id()), 0),
        };
        let gateway_id: Arc<str> = Arc::from(config.gateway_id.get_ref().as_str());
        let mut control = match &config.control {
            Some(c) => Some(setup_control(c, control_fd, successor).await?),
            None => None,
        };
        if let (Some(o), Some(c)) = (&offer, &control) {
            if o.key_id.as_deref() != Some(c.key.key_id().as_str()) {
                let refusal = config.field_error(
                    &options.config_path,
                    "control.signing_key_file",
                    format!(
                        "the key is {} here, {} in the running process: the batch chain has one signer",
                        c.key.key_id(),
                        o.key_id.as_deref().unwrap_or("none")
                    ),
                );
                return Err(StartError::Takeover(refusal.to_string()));
            }
        }
        // A cold start reads what an earlier process left in the journal
        // (records to seal, connections its crash cut); a successor's
        // predecessor is still running, and writes its own.
        if !successor {
            if let Some(b) = control.as_mut().and_then(|c| c.batches.as_mut()) {
                let sealed = b.spool.as_ref().map_or(0, |(_, p)| p.last_seq);
                b.recovered = Some(journal::recover_all(
                    &b.journal_dir,
                    sealed,
                    &gateway_id,
                    &instance,
                )?);
            }
        }
        let proposer = control
            .as_ref()
            .and_then(|c| c.batches.as_ref())
            .map(|_| Proposer::new());
        let lapsed = Arc::new(tokio::sync::Notify::new());
        // The authorities taken over.
        let sessions = Arc::new(Sessions::default());
        let mut statics = StaticSet::new();
        let mut ended = Vec::new();
        let mut predecessor_generation = None;
        let mut predecessor_handovers = None;
        if let Some(o) = offer {
            predecessor_generation = Some(o.from_generation);
            predecessor_handovers = Some(o.handovers);
            statics = o.statics.into_iter().collect();
            ended = o.ended;
            let count = o.sessions.len();
            for state in o.sessions {
                let lease = match state.lease_until {
                    Some(until) => {
                        Lease::ending_at(Arc::clone(&clock), until, Some(Arc::clone(&lapsed)))
                    }
                    None => Lease::none(Arc::clone(&clock)),
                };
                let (session, sources) = state
                    .import(
                        &mut secrets,
                        &tuned.upstream,
                        proposer.as_ref().map(|(p, _)| p),
                        lease,
                    )
                    .map_err(|e| StartError::Takeover(e.to_string()))?;
                sessions.insert(&sources, Arc::new(session));
            }
            if secrets.next().is_some() {
                return Err(StartError::Takeover(
                    "more secrets came than the offer names".into(),
                ));
            }
            tracing::info!(sessions = count, instance = %instance, generation, "authorities taken over");
        }
        let plan =
            crate::reload::plan_static(&config, &statics, &sessions, &tuned.upstream, &clock)
                .map_err(StartError::Settings)?;
        // The record file must be writable before anything runs.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&config.records.path)
            .map_err(|source| StartError::Records {
                path: config.records.path.clone(),
                source,
            })?;
        Ok(Built {
            config,
            options,
            metrics,
            tuned,
            clock,
            instance,
            generation,
            sessions,
            statics,
            plan,
            data: Arc::new(data),
            admin: Arc::new(admin),
            process,
            control,
            proposer,
            lapsed,
            ended,
            predecessor_generation,
            predecessor_handovers,
            exe,
        })
    }

    /// Start the record writer and the batches (the sealer, the shipper,
    /// the proposals to the relay; a cold start's start report). A
    /// successor then says `ready` on `link` and waits for `go`: from then
    /// on it holds every authority. Connections are accepted by
    /// [`Running::serve`].
    pub async fn spawn(self, link: &mut Option<UnixStream>) -> Result<Running, StartError> {
        let config = self.config;
        let mut control = self.control;
        let gateway_id: Arc<str> = Arc::from(config.gateway_id.get_ref().as_str());
        let (full_tx, spool_full) = watch::channel(false);
        let mut batches = None;
        let mut journal_setup = None;
        let mut recovered_summary = None;
        let (proposer, proposals) = match self.proposer {
            Some((p, rx)) => (Some(p), Some(rx)),
            None => (None, None),
        };
        let (predecessor_tx, predecessor_rx) =
            oneshot::channel::<Arc<crate::process::link::Predecessor>>();
        let mut predecessor_tx = Some(predecessor_tx);
        if let Some(c) = control.as_mut() {
            if let Some(mut b) = c.batches.take() {
                let recovered = b.recovered.take().unwrap_or_else(journal::Recovered::fresh);
                if b.spool.is_some() {
                    recovered_summary = Some((
                        recovered.previous_instance.clone(),
                        recovered.cut_by_crash,
                        recovered.entries.len(),
                    ));
                }
                let dir = journal::generation_dir(&b.journal_dir, self.generation);
                let (segments_tx, segments_rx) = mpsc::channel(SEGMENTS_QUEUE);
                journal_setup = Some(JournalSetup {
                    dir,
                    recovered,
                    sealer: segments_tx,
                    max_records: b.max_records,
                    interval: b.interval,
                });
                let stop = CancellationToken::new();
                if let Some(rx) = proposals {
                    tokio::spawn(crate::records::shipper::propose(
                        rx,
                        b.plane.clone(),
                        stop.clone(),
                    ));
                }
                let (spool_tx, spool_rx) = watch::channel(None);
                let gate = match self.predecessor_generation {
                    Some(g) => Gate::Predecessor {
                        link: predecessor_rx,
                        dir: journal::generation_dir(&b.journal_dir, g),
                        own: journal::generation_dir(&b.journal_dir, self.generation),
                    },
                    None => Gate::Open,
                };
                if matches!(gate, Gate::Open) {
                    predecessor_tx = None;
                }
                let task = tokio::spawn(batches_task(BatchesTask {
                    key: Arc::clone(&c.key),
                    gateway_id: Arc::clone(&gateway_id),
                    instance: Arc::clone(&self.instance),
                    setup: b,
                    gate,
                    segments: segments_rx,
                    spool_tx,
                    full_tx,
                    stop: stop.clone(),
                }));
                batches = Some(Batches {
                    spool: spool_rx,
                    task,
                    stop,
                });
            }
        }
        let (records, writer) = journal::start(WriterConfig {
            records_path: config.records.path.clone(),
            journal: journal_setup,
            gateway_id: Arc::clone(&gateway_id),
            instance: Arc::clone(&self.instance),
            first_conn: journal::first_conn(self.generation),
        })?;
        // This process's word that it started afresh: after what recovery
        // sealed again, before anything of its own.
        if let (Some(c), Some((previous, cut, resealed))) = (&control, &recovered_summary) {
            let report = talos_certs::StartReport {
                gateway_id: gateway_id.to_string(),
                instance: self.instance.to_string(),
                started_at: crate::records::record::now(),
                key_id: c.key.key_id(),
                previous_instance: previous.clone().unwrap_or_default(),
                cut_by_crash: *cut,
            }
            .sign(&c.key);
            records.entry(report_entry(&report)).await;
            records.seal().await;
            tracing::info!(
                instance = %self.instance,
                previous_instance = previous.as_deref().unwrap_or("-"),
                cut_by_crash = cut,
                resealed = resealed,
                "start report signed"
            );
        }
        let shutdown = conn::Shutdown::default();
        let tuned = self.tuned;
        let cap = Arc::new(Cap::new(tuned.max_connections));
        let grace_ms = Arc::new(AtomicU64::new(
            u64::try_from(tuned.grace.as_millis()).unwrap_or(u64::MAX),
        ));
        let lease = tuned.lease.unwrap_or(Duration::from_secs(60));
        let log_directives = tuned.log.clone();
        let shared = Shared::new(
            Arc::clone(&gateway_id),
            Arc::clone(&self.sessions),
            records.clone(),
            shutdown.clone(),
            proposer.clone(),
            tuned,
        );
        let current = Arc::new(Current::new(Arc::new(shared)));
        let mut authority = None;
        let mut runner = None;
        let mut watcher = None;
        let mut key_id = None;
        if let Some(c) = control {
            key_id = Some(c.key.key_id());
            let auth = Arc::new(Authority::new(
                Arc::clone(&gateway_id),
                Arc::clone(&c.key),
                records.clone(),
                Arc::clone(&self.sessions),
                Arc::clone(&self.clock),
                lease,
                Arc::clone(&self.lapsed),
            ));
            for e in self.ended {
                auth.adopt_ended(&e.session_id, e.attempt, e.report);
            }
            watcher = Some(Arc::new(LeaseWatcher::new(Arc::clone(&auth))));
            let service =
                crate::control::ControlService::new(Arc::clone(&current), c.key, Arc::clone(&auth));
            runner = Some(Arc::new(crate::control::Runner::new(
                c.listener, c.tls, service,
            )));
            authority = Some(auth);
        }
        drop(records);
        // The static sessions (opened, kept, replaced or closed, as the
        // config and what was taken over say).
        let mut statics = self.statics;
        crate::reload::apply_static(self.plan, &mut statics, &self.sessions, authority.as_ref());
        if let Some(log) = &self.options.log {
            if let Ok(filter) = crate::logging::LogControl::check(&log_directives) {
                log.set(filter);
            }
        }
        let reloader = Arc::new(Reloader::new(crate::reload::ReloaderParts {
            path: self.options.config_path.clone(),
            config_restart_only: config.restart_only(),
            digest: config.digest(),
            statics,
            current: Arc::clone(&current),
            cap: Arc::clone(&cap),
            authority: authority.clone(),
            clock: Arc::clone(&self.clock),
            log: self.options.log.clone(),
            grace_ms: Arc::clone(&grace_ms),
        }));
        let (stop_tx, stop_accepting) = mpsc::channel(1);
        let mut configured = vec![
            ListenerState {
                role: "data".into(),
                configured: config.listen.data.to_string(),
            },
            ListenerState {
                role: "admin".into(),
                configured: config.listen.admin.to_string(),
            },
        ];
        if let Some(c) = &config.control {
            configured.push(ListenerState {
                role: "control".into(),
                configured: c.listen.get_ref().to_string(),
            });
        }
        let socket = config.process.socket.as_ref().map(|s| s.get_ref().clone());
        if let Some(s) = &socket {
            configured.push(ListenerState {
                role: "process".into(),
                configured: s.display().to_string(),
            });
        }
        // A successor counts the handover that makes it (once it has `go`).
        let handovers = self
            .predecessor_handovers
            .map_or_else(Handovers::default, Handovers::taken_over);
        let upgrader = Arc::new(Upgrader::new(crate::handover::Parts {
            exe: self.exe,
            config_path: self.options.config_path.clone(),
            json_logs: self.options.json_logs,
            socket: socket.clone(),
            gateway_id: Arc::clone(&gateway_id),
            instance: Arc::clone(&self.instance),
            generation: self.generation,
            key_id,
            listeners: Listeners {
                data: Arc::clone(&self.data),
                admin: Arc::clone(&self.admin),
                control: runner.as_ref().map(|r| Arc::clone(r.listener())),
                process: self.process.clone(),
            },
            configured,
            sessions: Arc::clone(&self.sessions),
            authority: authority.clone(),
            control: runner.clone(),
            reloader: Arc::clone(&reloader),
            proposer,
            journal_dir: config.control.as_ref().and_then(|c| {
                c.spool_dir
                    .as_ref()
                    .map(|d| d.get_ref().join(journal::JOURNAL_DIR))
            }),
            stop_accepting: stop_tx,
            watcher: watcher.clone(),
            handovers,
        }));
        // A successor: ready, and wait for go.
        if let Some(mut stream) = link.take() {
            crate::handover::ready_and_go(&mut stream)
                .await
                .map_err(|e| StartError::Takeover(e.to_string()))?;
            handovers.publish();
            let p = crate::process::link::Predecessor::start(stream, Arc::clone(&self.sessions));
            if let Some(a) = &authority {
                a.set_predecessor(Arc::clone(&p));
            }
            if let Some(tx) = predecessor_tx.take() {
                let _ = tx.send(p);
            }
        }
        Ok(Running {
            config,
            metrics: self.metrics,
            instance: self.instance,
            cap,
            grace_ms,
            data: self.data,
            admin_listener: self.admin,
            process: self.process,
            socket,
            tracker: TaskTracker::new(),
            current,
            shutdown,
            ready: Arc::new(AtomicBool::new(true)),
            draining: CancellationToken::new(),
            helpers: TaskTracker::new(),
            helpers_stop: CancellationToken::new(),
            admin_stop: CancellationToken::new(),
            control: runner,
            authority,
            watcher,
            writer,
            batches,
            spool_full,
            reloader,
            upgrader,
            stop_accepting,
        })
    }
}

/// Segments waiting for the sealer before the journal's writer waits: a
/// few batch intervals' worth.
const SEGMENTS_QUEUE: usize = 8;

/// Take a listener handed over, or bind one.
async fn listener(
    adopted: Option<std::net::TcpListener>,
    which: &'static str,
    addr: SocketAddr,
) -> Result<TcpListener, StartError> {
    match adopted {
        Some(l) => from_std(l),
        None => bind(which, addr).await,
    }
}

fn from_std(l: std::net::TcpListener) -> Result<TcpListener, StartError> {
    let addr = l
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    l.set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(l))
        .map_err(|source| StartError::Bind {
            which: "handed-over",
            addr,
            source,
        })
}

/// When the batches may be sealed.
enum Gate {
    /// At once (a cold start: the spool is open).
    Open,
    /// Once the predecessor has exited: its journal (`dir`) is read for
    /// what it left, and sealed first, through `own`.
    Predecessor {
        link: oneshot::Receiver<Arc<crate::process::link::Predecessor>>,
        dir: PathBuf,
        own: PathBuf,
    },
}

struct BatchesTask {
    key: Arc<talos_certs::GatewayKey>,
    gateway_id: Arc<str>,
    instance: Arc<str>,
    setup: BatchSetup,
    gate: Gate,
    segments: mpsc::Receiver<journal::Segment>,
    spool_tx: watch::Sender<Option<Arc<Spool>>>,
    full_tx: watch::Sender<bool>,
    stop: CancellationToken,
}

/// The sealer, the spool and the shipper, running.
#[derive(Debug)]
struct Batches {
    /// The spool, once open.
    spool: watch::Receiver<Option<Arc<Spool>>>,
    /// Seals the journal's segments; ends when the journal's writer does,
    /// with the shipper's task.
    task: JoinHandle<Option<JoinHandle<()>>>,
    /// Stops the shipper and the proposals to the relay.
    stop: CancellationToken,
}

/// Seal the journal's segments into the spool and ship it. A successor
/// first waits for its predecessor to exit (holding its segments, which
/// are on disk, meanwhile), opens the spool, and seals what the
/// predecessor left before anything of its own.
async fn batches_task(t: BatchesTask) -> Option<JoinHandle<()>> {
    let BatchesTask {
        key,
        gateway_id,
        instance,
        setup,
        gate,
        mut segments,
        spool_tx,
        full_tx,
        stop,
    } = t;
    let mut held = std::collections::VecDeque::new();
    let mut leftovers = None;
    let (spool, position) = match (setup.spool, gate) {
        (Some(open), _) => open,
        (None, Gate::Open) => return None,
        (None, Gate::Predecessor { link, dir, own }) => {
            let Ok(predecessor) = link.await else {
                return None;
            };
            // Segments wait here (they are on disk) until the predecessor
            // has sealed its last batch and exited.
            loop {
                tokio::select! {
                    () = predecessor.gone() => break,
                    seg = segments.recv() => match seg {
                        Some(s) => held.push_back(s),
                        None => break,
                    },
                }
            }
            let opened = open_spool_when_free(&setup.spool_dir, setup.limits).await;
            let Some((spool, position)) = opened else {
                // Nothing can be sealed: fail closed.
                let _ = full_tx.send(true);
                return None;
            };
            match journal::recover(&dir, position.last_seq, &gateway_id, &instance) {
                Ok(found) => leftovers = Some((found, dir, own)),
                Err(e) => tracing::error!(error = %e, "cannot read the previous process's journal"),
            }
            (Arc::new(spool), position)
        }
    };
    let _ = spool_tx.send(Some(Arc::clone(&spool)));
    tokio::spawn(forward_full(spool.full(), full_tx, stop.clone()));
    tracing::info!(
        plane = %setup.plane.addr,
        spooled = spool.len().0,
        next_seq = position.last_seq + 1,
        "shipping signed batches"
    );
    let shipper = tokio::spawn(crate::records::shipper::ship(
        Arc::clone(&spool),
        setup.plane,
        stop,
    ));
    let mut sealer = crate::records::spool::Sealer::new(
        key,
        &gateway_id,
        position,
        spool,
        setup.max_records,
        setup.interval,
    );
    if let Some((found, dir, own)) = leftovers {
        if !found.is_empty() {
            tracing::warn!(
                entries = found.entries.len(),
                cut_by_crash = found.cut_by_crash,
                "the previous process left records unsealed; sealing them first"
            );
            match journal::write_segment(&own, 0, found.entries.clone()) {
                Ok(segment) => sealer.seal_segment(segment).await,
                Err(e) => tracing::error!(error = %e, "cannot keep the previous process's records"),
            }
        }
        found.discard();
        if dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("gen-"))
        {
            let _ = std::fs::remove_file(dir.join("instance"));
            let _ = std::fs::remove_dir(&dir);
        }
    }
    for segment in held {
        sealer.seal_segment(segment).await;
    }
    while let Some(segment) = segments.recv().await {
        sealer.seal_segment(segment).await;
    }
    Some(shipper)
}

/// Open the spool once no other process holds it (the predecessor lets go
/// as it exits); `None` (logged) if it cannot be opened.
async fn open_spool_when_free(
    dir: &std::path::Path,
    limits: SpoolLimits,
) -> Option<(Spool, ChainPosition)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let dir_owned = dir.to_owned();
        let opened = tokio::task::spawn_blocking(move || Spool::open(&dir_owned, limits)).await;
        match opened {
            Ok(Ok(open)) => return Some(open),
            Ok(Err(crate::records::spool::SpoolError::Busy { .. }))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot open the spool; not accepting until it can be");
                return None;
            }
            Err(_) => return None,
        }
    }
}

/// Copy the spool's fullness to what the accept loop and `/readyz` read.
async fn forward_full(
    mut from: watch::Receiver<bool>,
    to: watch::Sender<bool>,
    stop: CancellationToken,
) {
    loop {
        let full = *from.borrow_and_update();
        let _ = to.send(full);
        tokio::select! {
            () = stop.cancelled() => return,
            changed = from.changed() => if changed.is_err() { return },
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

/// How accepting ended.
#[derive(Debug)]
pub enum End {
    /// A shutdown signal: drain and end every authority.
    Shutdown,
    /// A successor took over: drain what this process accepted.
    HandedOver,
}

/// The gateway at work: the data listener and what serves its
/// connections, and the handles of every task the drain waits for.
#[derive(Debug)]
pub struct Running {
    config: Config,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    instance: Arc<str>,
    /// The connection cap.
    cap: Arc<Cap>,
    /// The drain grace, in milliseconds (a reload changes it).
    grace_ms: Arc<AtomicU64>,
    data: Arc<TcpListener>,
    admin_listener: Arc<TcpListener>,
    process: Option<Arc<UnixListener>>,
    socket: Option<PathBuf>,
    /// Open connections.
    tracker: TaskTracker,
    current: Arc<Current>,
    /// Tells open connections that the drain began, then that its grace
    /// is over.
    shutdown: conn::Shutdown,
    /// What `/readyz` answers.
    ready: Arc<AtomicBool>,
    /// Fires when draining starts.
    draining: CancellationToken,
    /// The process socket's server, signal handlers and their requests.
    helpers: TaskTracker,
    helpers_stop: CancellationToken,
    /// Stops the admin listener.
    admin_stop: CancellationToken,
    control: Option<Arc<crate::control::Runner>>,
    /// Ends authorities; present with a control channel.
    authority: Option<Arc<Authority>>,
    watcher: Option<Arc<LeaseWatcher>>,
    writer: WriterThread,
    batches: Option<Batches>,
    /// `true` while the spool is full (or cannot be opened).
    spool_full: watch::Receiver<bool>,
    reloader: Arc<Reloader>,
    upgrader: Arc<Upgrader>,
    stop_accepting: mpsc::Receiver<oneshot::Sender<()>>,
}

impl Running {
    fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms.load(Ordering::Relaxed))
    }

    /// Start everything else (admin, control channel, lease watcher,
    /// process socket, signals), say so (the ready line, the service
    /// manager), then accept until a shutdown signal or a handover.
    pub async fn serve(mut self, signals: Signals) -> (Running, End) {
        let data_addr = self.data.local_addr().unwrap_or(self.config.listen.data);
        let admin_addr = self
            .admin_listener
            .local_addr()
            .unwrap_or(self.config.listen.admin);
        self.helpers.spawn(crate::admin::serve(
            Arc::clone(&self.admin_listener),
            self.metrics.clone(),
            Arc::clone(&self.ready),
            self.admin_stop.clone(),
        ));
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        tracing::info!(
            gateway_id = %self.config.gateway_id.get_ref(),
            instance = %self.instance,
            data = %data_addr,
            admin = %admin_addr,
            sessions = self.current.get().sessions.all().len(),
            workers,
            "listening"
        );
        let mut ready_line = serde_json::json!({
            "event": "ready",
            "data": data_addr,
            "admin": admin_addr,
            "workers": workers,
            "instance": &*self.instance,
            "pid": std::process::id(),
        });
        if let Some(c) = &self.control {
            let addr = c.listener().local_addr().ok();
            ready_line["control"] = serde_json::json!(addr);
            tracing::info!(control = ?addr, "control channel listening");
            c.start();
        }
        if let Some(w) = &self.watcher {
            w.start();
        }
        if let Some(p) = &self.process {
            ready_line["socket"] = serde_json::json!(self.socket);
            self.helpers.spawn(
                Arc::clone(&self.upgrader).serve_socket(Arc::clone(p), self.helpers_stop.clone()),
            );
        }
        let Signals {
            shutdown,
            reload,
            upgrade,
            logged,
        } = signals;
        self.helpers.spawn(act_on_signals(
            reload,
            upgrade,
            logged,
            Arc::clone(&self.reloader),
            Arc::clone(&self.upgrader),
            self.helpers_stop.clone(),
        ));
        self.helpers.spawn(follow_spool(
            self.spool_full.clone(),
            Arc::clone(&self.ready),
            self.draining.clone(),
        ));
        // Not `println!`: standard output may be closed (a successor
        // inherits its predecessor's, whose reader may be gone), and a
        // failed write must not end the process.
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{ready_line}").and_then(|()| out.flush());
        }
        crate::process::notify::ready();
        let end = self.accept_until(shutdown_signal(shutdown)).await;
        (self, end)
    }

    /// Accept connections until `signal` resolves or a handover stops
    /// accepting, each on its own task, at most the cap at once.
    async fn accept_until(&mut self, signal: impl std::future::Future<Output = ()>) -> End {
        tokio::pin!(signal);
        let mut spool_full = self.spool_full.clone();
        loop {
            // A full spool fails closed: accept nothing until it has room.
            if *spool_full.borrow() {
                tokio::select! {
                    _ = &mut signal => return End::Shutdown,
                    ack = self.stop_accepting.recv() => return stopped(ack),
                    room = spool_has_room(&mut spool_full) => if !room { return End::Shutdown },
                }
            }
            // Wait for room first: past the cap the kernel backlog holds clients.
            let permit = tokio::select! {
                _ = &mut signal => return End::Shutdown,
                ack = self.stop_accepting.recv() => return stopped(ack),
                p = Arc::clone(self.cap.permits()).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return End::Shutdown,
                },
            };
            let (stream, peer) = tokio::select! {
                _ = &mut signal => return End::Shutdown,
                ack = self.stop_accepting.recv() => return stopped(ack),
                // The spool filled while waiting: back to the top, to wait there.
                () = spool_fills(&mut spool_full) => continue,
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
            let shared = self.current.get();
            self.tracker.spawn(async move {
                conn::serve(&shared, stream, peer).await;
                drop(permit);
            });
        }
    }

    /// The drain, once accepting has stopped. Each wait is bounded by the
    /// grace (`shutdown_grace_ms`) on its own; the connections' grace runs
    /// from the drain's start.
    pub async fn drain(self, end: End) {
        let grace = self.grace();
        let handed_over = matches!(end, End::HandedOver);
        // 0. Tell every open connection at once: each finishes what it has
        //    in flight and closes (HTTP/1.1: an idle keep-alive connection
        //    at once, the request in flight answered `Connection: close`;
        //    HTTP/2: GOAWAY, its open streams answered). After a handover
        //    the successor accepts what their clients open next.
        let cut_at = tokio::time::Instant::now() + grace;
        self.shutdown.drain.cancel();
        tracing::info!(open = self.tracker.len(), handed_over, "draining");
        if !handed_over {
            crate::process::notify::stopping();
        }
        // 1. Stop the control channel: no session opens on a gateway that
        //    is going away. Open RPCs get the grace; a client that holds
        //    its connection open past it is cut. (A handover stopped it.)
        self.draining.cancel();
        if let Some(c) = &self.control {
            c.stop(grace).await;
        }
        // 2. `/readyz` answers 503 (after a handover the successor answers
        //    it: this process stops serving the admin listener).
        self.ready.store(false, Ordering::Relaxed);
        if handed_over {
            self.admin_stop.cancel();
        }
        // The process socket and the signals: no reload or upgrade now.
        self.helpers_stop.cancel();
        // 3. Close the data listener: new connections are refused (after a
        //    handover the successor accepts them).
        drop(self.data);
        // 4. Open connections get the grace to finish (from step 0); 5. the
        //    rest are cut (their records say so: a request cut before its
        //    answer, or in its reply's body, is `cut`) and finish.
        self.tracker.close();
        if tokio::time::timeout_at(cut_at, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.tracker.len(),
                "grace over; cutting open connections"
            );
            self.shutdown.cut.cancel();
            self.tracker.wait().await;
        }
        // 6. Stop the admin listener and the helpers.
        self.shutdown.cut.cancel();
        self.admin_stop.cancel();
        self.helpers.close();
        self.helpers.wait().await;
        drop(self.upgrader);
        drop(self.reloader);
        // 7. End every authority the control plane opened (reason
        //    `shutdown`): their reports go on the record after every
        //    record of their connections. After a handover they are the
        //    successor's: this process only lets go of them.
        if let Some(w) = &self.watcher {
            w.stop();
        }
        drop(self.watcher);
        match (self.authority, handed_over) {
            (Some(authority), false) => authority.shutdown().await,
            (authority, _) => {
                for s in self.current.get().sessions.remove_all() {
                    s.end_and_withdraw();
                }
                drop(authority);
            }
        }
        // 8. The record writer: with the last sink dropped it writes what
        //    is queued, hands its last segment to the sealer and ends; the
        //    sealer seals it and ends.
        drop(self.control);
        drop(self.current);
        self.writer.finished().await;
        // 9. Give the shipper the grace to deliver the spool, woken when
        //    it empties; what it cannot deliver stays spooled for the next
        //    start (after a handover: for the successor, at once).
        if let Some(b) = self.batches {
            b.deliver(if handed_over { Duration::ZERO } else { grace })
                .await;
        }
        // 10. Exit. A successor answers on the process socket now: its
        //     file stays.
        if let (Some(path), false) = (&self.socket, handed_over) {
            let _ = std::fs::remove_file(path);
        }
        drop(self.process);
        tracing::info!("stopped");
    }
}

/// Resolves when the spool has room (`false`: it is gone).
async fn spool_has_room(full: &mut watch::Receiver<bool>) -> bool {
    full.wait_for(|full| !*full).await.is_ok()
}

/// Resolves when the spool becomes full.
async fn spool_fills(full: &mut watch::Receiver<bool>) {
    if full.wait_for(|full| *full).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A handover asked the accept loop to stop: say it has.
fn stopped(ack: Option<oneshot::Sender<()>>) -> End {
    match ack {
        Some(ack) => {
            let _ = ack.send(());
            End::HandedOver
        }
        None => End::Shutdown,
    }
}

impl Batches {
    /// Wait for the sealer to seal the last segment, then up to `grace` for
    /// the spool to empty; then stop the shipper and say what is left.
    async fn deliver(self, grace: Duration) {
        // The sealer ends once the writer has handed over its last segment.
        let shipper = self.task.await.ok().flatten();
        let spool = self.spool.borrow().clone();
        let delivered = match &spool {
            Some(spool) => tokio::time::timeout(grace, spool.emptied()).await.is_ok(),
            None => false,
        };
        self.stop.cancel();
        if let Some(task) = shipper {
            let _ = task.await;
        }
        let Some(spool) = spool else {
            return;
        };
        let (batches, bytes) = spool.len();
        if delivered {
            tracing::info!("every batch delivered");
        } else if batches > 0 {
            tracing::warn!(
                batches,
                bytes,
                "batches left in the spool; they are shipped by the next process"
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

/// The signals the gateway acts on or logs, each with its handler
/// installed when [`Signals::listen`] returns.
#[derive(Debug)]
pub struct Signals {
    /// SIGTERM, SIGINT, SIGQUIT: the graceful drain.
    shutdown: Vec<(&'static str, Signal)>,
    /// SIGHUP: reload.
    reload: Option<Signal>,
    /// SIGUSR2: upgrade.
    upgrade: Option<Signal>,
    /// [`LOGGED_SIGNALS`]: logged and ignored.
    logged: Vec<(&'static str, Signal)>,
}

type Signal = tokio::signal::unix::Signal;

/// The signals that start the graceful drain.
const SHUTDOWN_SIGNALS: [(i32, &str); 3] = [(15, "SIGTERM"), (2, "SIGINT"), (3, "SIGQUIT")];

/// Signals whose default action would end the process without a word:
/// each is logged and ignored, so that no signal but SIGKILL ends the
/// gateway silently.
const LOGGED_SIGNALS: [(i32, &str); 7] = [
    (10, "SIGUSR1"),
    (14, "SIGALRM"),
    (26, "SIGVTALRM"),
    (27, "SIGPROF"),
    (29, "SIGIO"),
    (30, "SIGPWR"),
    (16, "SIGSTKFLT"),
];

impl Signals {
    /// Install every handler now (inside the runtime). A signal that
    /// cannot be listened for is logged as an error and keeps its default
    /// action.
    pub fn listen() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        let one = |raw: i32, name: &'static str| match signal(SignalKind::from_raw(raw)) {
            Ok(s) => Some((name, s)),
            Err(e) => {
                tracing::error!(signal = name, error = %e, "cannot listen for a signal");
                None
            }
        };
        let all = |list: &[(i32, &'static str)]| {
            list.iter()
                .filter_map(|&(raw, name)| one(raw, name))
                .collect()
        };
        Signals {
            shutdown: all(&SHUTDOWN_SIGNALS),
            reload: one(1, "SIGHUP").map(|(_, s)| s),
            upgrade: one(12, "SIGUSR2").map(|(_, s)| s),
            logged: all(&LOGGED_SIGNALS),
        }
    }
}

/// Resolves at the first of `signals` (SIGTERM, SIGINT or SIGQUIT,
/// logged): the graceful drain. Never resolves if none could be listened
/// for. Later ones are logged and ignored: the drain is under way.
async fn shutdown_signal(signals: Vec<(&'static str, Signal)>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    for (name, mut s) in signals {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut first = true;
            while s.recv().await.is_some() {
                if first {
                    first = false;
                    let _ = tx.send(name).await;
                } else {
                    tracing::warn!(
                        signal = name,
                        "signal received during the drain and ignored"
                    );
                }
            }
        });
    }
    drop(tx);
    match rx.recv().await {
        Some(name) => tracing::info!(signal = name, "shutting down: draining"),
        None => std::future::pending().await,
    }
}

/// Until `stop`: SIGHUP reloads, SIGUSR2 upgrades; every signal of
/// `logged` is logged, for the process's life (SIGHUP and SIGUSR2 too,
/// once the drain has begun).
async fn act_on_signals(
    mut reload: Option<Signal>,
    mut upgrade: Option<Signal>,
    logged: Vec<(&'static str, Signal)>,
    reloader: Arc<Reloader>,
    upgrader: Arc<Upgrader>,
    stop: CancellationToken,
) {
    let mut set = tokio::task::JoinSet::new();
    for (name, s) in logged {
        set.spawn(log_signal(name, s, "signal received and ignored"));
    }
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Some(()) = recv(&mut reload) => {
                tracing::info!(signal = "SIGHUP", "reloading the config");
                let r = Arc::clone(&reloader);
                set.spawn(async move { let _ = r.reload().await; });
            }
            Some(()) = recv(&mut upgrade) => {
                tracing::info!(signal = "SIGUSR2", "upgrading: starting a successor");
                let u = Arc::clone(&upgrader);
                set.spawn(async move { let _ = u.upgrade().await; });
            }
        }
    }
    drop(reloader);
    drop(upgrader);
    let draining = "signal received during the drain and ignored";
    if let Some(s) = reload {
        set.spawn(log_signal("SIGHUP", s, draining));
    }
    if let Some(s) = upgrade {
        set.spawn(log_signal("SIGUSR2", s, draining));
    }
    set.detach_all();
}

async fn recv(signal: &mut Option<Signal>) -> Option<()> {
    match signal.as_mut() {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

async fn log_signal(name: &'static str, mut s: Signal, what: &'static str) {
    while s.recv().await.is_some() {
        tracing::warn!(signal = name, "{what}");
    }
}
