//! The process: a few components, each built, started and stopped by
//! [`run`] in a fixed order.
//!
//! | component | what it holds |
//! |---|---|
//! | records ([`records`]) | the journal's writer, the sealer, the spool, the shipper, the proposals to the relay |
//! | control side ([`control`]) | the control channel's server, the authority, the lease watcher |
//! | data plane ([`data`]) | the data listener, the connection cap, the settings new connections get, the open connections |
//! | operator side ([`operator`]) | the reloader, the upgrader, the process socket's server, the signals |
//! | admin ([`admin`]) | the admin listener: `/metrics`, `/healthz`, `/readyz` |
//!
//! Beside them, [`listeners`]: every listener bound as the config says or
//! taken over from the process this one succeeds, and the sessions' DNS
//! pair on one port; [`error`]: why a start fails ([`StartError`]).
//!
//! `run` goes through these phases:
//!
//! 1. [`Prepared::new`]: everything that can fail, done (settings, static
//!    sessions, listeners bound — or, for a successor, taken over with
//!    every live authority —, keys loaded, TLS configs, record file,
//!    spool, a cold start's recovery); a failure is a [`StartError`]
//!    naming what failed, and nothing has run.
//! 2. [`Prepared::spawn`] starts the records and builds the other
//!    components; a successor then says `ready` to the process it takes
//!    over from and waits for `go`. [`Running::serve`] first has the
//!    forwarding table in place (a successor took it over; any other start
//!    asks its peers once: nothing is served before what judges it), then
//!    starts admin, the control side, the sessions' DNS and the operator
//!    side, prints one `ready` line on standard output (so scripts and
//!    tests learn the bound addresses, useful with port 0), tells the
//!    service manager, and accepts until SIGTERM or SIGINT — or until a
//!    successor takes over.
//! 3. [`Running::drain`] stops them in reverse, in numbered steps, each an
//!    explicit call (nothing waits on a value's drop): every open
//!    connection is told to finish (HTTP/1.1 `Connection: close`, HTTP/2
//!    GOAWAY), the control channel stops, `/readyz` turns 503, no reload or upgrade, the data listener
//!    closes, open connections get the configured grace from the drain's
//!    start and the rest are cut, the authorities end, the record writer is stopped and the last
//!    batch sealed, and the shipper gets the grace to deliver the spool
//!    (woken when it empties, not polled) before the process exits. After
//!    a handover the authorities are the successor's: none is ended here,
//!    and the successor ships what this process spooled.
//!
//! A reload ([`crate::reload`]) builds one [`Tuned`] and hands it to the
//! parts it changes; an upgrade ([`crate::handover`]) hands everything to
//! a successor.

mod admin;
mod control;
mod data;
mod error;
mod listeners;
mod operator;
mod pair;
mod records;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::handover::state::Handovers;
use crate::handover::{Listeners, Taken, Upgrader};
use crate::records::journal;
use crate::reload::{Cap, ConfigInForce, Grace, Reloader, StaticPlan, StaticSet, Tunable, Tuned};
use crate::serving::{Context, InForce};
use crate::session::approvals::Proposer;
use crate::session::lease::{boot_clock, Lease, SharedClock};
use crate::session::sessions::Sessions;

use admin::Admin;
use control::{let_go, setup_control, ControlParts, ControlSetup, ControlSide};
use data::DataPlane;
pub use data::End;
pub use error::StartError;
use listeners::{configured_listeners, dns_sockets, from_std, take_or_bind, DnsSockets};
use operator::Operator;
pub use operator::Signals;
use records::{Proposals, Records, RecordsStart};

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
    let built = match Prepared::new(config, options, taken).await {
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

/// Everything that can fail at start, done: settings, static sessions (or
/// the authorities taken over), the resolver, listeners bound (or taken
/// over), keys loaded, TLS configs, the record file and the spool.
/// Nothing runs yet.
#[derive(Debug)]
pub struct Prepared {
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
    /// The member link (`[pair]`).
    pair: Option<pair::PairSetup>,
    /// The sessions' DNS sockets (`[dns]`), bound or taken over.
    dns: Option<DnsSockets>,
    proposer: Option<(Proposer, Proposals)>,
    /// Told when a use finds a lease lapsed.
    lapsed: Arc<tokio::sync::Notify>,
    /// Reports of ends the predecessor made.
    ended: Vec<crate::handover::state::EndedState>,
    /// The predecessor's generation (a successor).
    predecessor_generation: Option<u64>,
    /// The handovers the predecessor had counted (a successor).
    predecessor_handovers: Option<Handovers>,
    /// The forwarding table came with the authorities (a successor of a
    /// process that hands it over): the peers need not be asked first.
    forwarding_taken: bool,
    exe: PathBuf,
}

impl Prepared {
    /// Build everything from `config`, in this order: the settings (trust
    /// anchors, resolver), the listeners (bound, or taken over), the
    /// control channel (its keys, TLS configs, spool and listener), the
    /// authorities taken over, the static sessions (their trust files
    /// written beside their place), the record file.
    pub async fn new(
        config: Config,
        options: Options,
        taken: Option<Taken>,
    ) -> Result<Prepared, StartError> {
        for w in config.warnings() {
            tracing::warn!("{}", w.0);
        }
        // The binary to start for an upgrade: its path now, so that a new
        // binary installed at that path is the one started.
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("gateway"));
        let metrics = crate::admin::install_metrics();
        let tuned = Tuned::build(&config).map_err(StartError::Settings)?;
        let clock = boot_clock();
        crate::session::lease::start_ticker(Arc::clone(&clock));
        let successor = taken.is_some();
        let (mut fds, offer, mut secrets) = match taken {
            Some(t) => (t.fds, Some(t.offer), t.secrets.into_iter()),
            None => (HashMap::new(), None, Vec::new().into_iter()),
        };
        let (data, admin, process, control_fd) = take_or_bind(&config, &mut fds).await?;
        let pair_fd = fds
            .remove("pair")
            .map(std::net::TcpListener::from)
            .map(from_std)
            .transpose()?;
        let pair = pair::setup_pair(&config, pair_fd).await?;
        // What judges a query or a connection of a session only a peer
        // holds, in place before anything is served: the predecessor's
        // forwarding table, as it stood.
        let forwarding_taken = take_forwarding(pair.as_ref(), offer.as_ref(), &clock);
        let dns = dns_sockets(&config, &mut fds).await?;
        let (instance, generation): (Arc<str>, u64) = match &offer {
            Some(o) => (Arc::from(o.instance.as_str()), o.generation),
            None => (Arc::from(talos_certs::new_instance_id()), 0),
        };
        let gateway_id: Arc<str> = Arc::from(config.gateway_id.get_ref().as_str());
        let mut control = match &config.control {
            Some(c) => Some(setup_control(c, &gateway_id, control_fd, successor).await?),
            None => None,
        };
        if let (Some(o), Some(c)) = (&offer, &control) {
            same_signing_key(&config, &options, o, c)?;
        }
        // A cold start reads what an earlier process left in the journal
        // (records to seal, connections its crash cut); a successor's
        // predecessor is still running, and writes its own.
        if !successor {
            recover_journal(control.as_mut(), &gateway_id, &instance)?;
        }
        let proposer = control
            .as_ref()
            .and_then(|c| c.batches.as_ref())
            .map(|_| Proposer::new());
        let lapsed = Arc::new(tokio::sync::Notify::new());
        // The authorities taken over.
        let sessions = Arc::new(Sessions::default());
        let taken = match offer {
            Some(o) => {
                let lease = |until| match until {
                    Some(until) => {
                        Lease::ending_at(Arc::clone(&clock), until, Some(Arc::clone(&lapsed)))
                    }
                    None => Lease::none(Arc::clone(&clock)),
                };
                let count = o.sessions.len();
                let proposer = proposer.as_ref().map(|(p, _)| p);
                let t = import_offer(o, &mut secrets, &sessions, &tuned, proposer, lease)?;
                tracing::info!(sessions = count, instance = %instance, generation, "authorities taken over");
                Some(t)
            }
            None => None,
        };
        let (statics, ended, predecessor_generation, predecessor_handovers) = match taken {
            Some(t) => (
                t.statics,
                t.ended,
                Some(t.from_generation),
                Some(t.handovers),
            ),
            None => (StaticSet::new(), Vec::new(), None, None),
        };
        let plan =
            crate::reload::plan_static(&config, &statics, &sessions, &tuned.upstream, &clock)
                .map_err(StartError::Settings)?;
        // The record file must be writable before anything runs.
        record_file_writable(&config)?;
        Ok(Prepared {
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
            pair,
            dns,
            proposer,
            lapsed,
            ended,
            predecessor_generation,
            predecessor_handovers,
            forwarding_taken,
            exe,
        })
    }

    /// Start the records (the writer, the sealer, the shipper, the
    /// proposals to the relay; a cold start's start report) and build the
    /// data plane, the control side and the operator side. A successor
    /// then says `ready` on `link` and waits for `go`: from then on it
    /// holds every authority. Connections are accepted by
    /// [`Running::serve`].
    pub async fn spawn(self, link: &mut Option<UnixStream>) -> Result<Running, StartError> {
        let config = self.config;
        let gateway_id: Arc<str> = Arc::from(config.gateway_id.get_ref().as_str());
        let (proposer, proposals) = self.proposer.unzip();
        let mut control = self.control;
        let mut records = Records::start(RecordsStart {
            records_path: config.records.path.clone(),
            batches: control.as_mut().and_then(ControlSetup::take_batches),
            proposals,
            gateway_id: Arc::clone(&gateway_id),
            instance: Arc::clone(&self.instance),
            generation: self.generation,
            predecessor_generation: self.predecessor_generation,
        })
        .await?;
        let tuned = self.tuned;
        let cap = Arc::new(Cap::new(tuned.max_connections));
        let grace_ms = Arc::new(AtomicU64::new(
            u64::try_from(tuned.grace.as_millis()).unwrap_or(u64::MAX),
        ));
        let lease = tuned.lease.unwrap_or(Duration::from_secs(60));
        let log_directives = tuned.log.clone();
        let shutdown = crate::serving::Shutdown::default();
        let current = Arc::new(InForce::new(Arc::new(Context::new(
            Arc::clone(&gateway_id),
            Arc::clone(&self.sessions),
            records.sink.clone(),
            shutdown.clone(),
            proposer.clone(),
            self.pair.as_ref().map(|p| Arc::clone(&p.link)),
            tuned,
        ))));
        let control = control.map(|c| {
            ControlSide::build(
                c,
                ControlParts {
                    gateway_id: Arc::clone(&gateway_id),
                    current: Arc::clone(&current),
                    records: records.sink.clone(),
                    sessions: Arc::clone(&self.sessions),
                    clock: Arc::clone(&self.clock),
                    lease,
                    lapsed: Arc::clone(&self.lapsed),
                    ended: self.ended,
                },
            )
        });
        let authority = control.as_ref().map(|c| Arc::clone(&c.authority));
        // The static sessions (opened, kept, replaced or closed, as the
        // config and what was taken over say).
        let mut statics = self.statics;
        crate::reload::apply_static(self.plan, &mut statics, &self.sessions, authority.as_ref());
        set_log_filter(self.options.log.as_ref(), &log_directives);
        let handovers = self
            .predecessor_handovers
            .map_or_else(Handovers::default, Handovers::taken_over);
        let socket = config.process.socket.as_ref().map(|s| s.get_ref().clone());
        let (reloader, in_force, upgrader, stop_accepting) = operator_side(OperatorSetup {
            config: &config,
            options: &self.options,
            exe: self.exe,
            statics,
            current: &current,
            cap: &cap,
            grace_ms: &grace_ms,
            sessions: &self.sessions,
            control: control.as_ref(),
            clock: &self.clock,
            gateway_id: &gateway_id,
            instance: &self.instance,
            generation: self.generation,
            listeners: Listeners {
                data: Arc::clone(&self.data),
                admin: Arc::clone(&self.admin),
                control: control.as_ref().map(|c| Arc::clone(c.runner.listener())),
                pair: self.pair.as_ref().map(|p| Arc::clone(&p.listener)),
                dns: self.dns.as_ref().map(DnsSockets::both),
                process: self.process.clone(),
            },
            proposer,
            handovers,
            forwarding: self.pair.as_ref().map(|p| Arc::clone(&p.link.forwarding)),
        });
        // A successor: ready, and wait for go.
        if let Some(stream) = link.take() {
            take_the_go(
                stream,
                handovers,
                &self.sessions,
                control.as_ref(),
                &mut records,
            )
            .await?;
        }
        let dns = self
            .dns
            .map(|sockets| dns_answerer(&config, &current, sockets));
        let data = DataPlane::new(
            self.data,
            cap,
            grace_ms,
            current,
            shutdown,
            records.spool_full.clone(),
            stop_accepting,
        )
        .with_link(self.pair.map(|p| p.listener))
        .with_dns(dns.as_ref().map(|(a, _)| Arc::clone(a)));
        Ok(Running {
            dns,
            admin: Admin::new(self.admin, self.metrics),
            operator: Operator::new(reloader, upgrader, in_force, self.process, socket),
            config,
            instance: self.instance,
            data,
            control,
            records,
            forwarding_taken: self.forwarding_taken,
        })
    }
}

/// Put the predecessor's forwarding table, as it stood, in place (a
/// successor with `[pair]`): what judges a query or a connection of a
/// session only a peer holds, before anything is served. Whether it came.
fn take_forwarding(
    pair: Option<&pair::PairSetup>,
    offer: Option<&crate::handover::state::Offer>,
    clock: &SharedClock,
) -> bool {
    match (pair, offer.and_then(|o| o.forwarding.as_ref())) {
        (Some(p), Some(entries)) => {
            let taken = crate::handover::state::ForwardingState::import(
                entries,
                &p.link.forwarding,
                &**clock,
            );
            tracing::info!(entries = taken, "forwarding table taken over");
            true
        }
        _ => false,
    }
}

/// A cold start reads what an earlier process left in the journal: records
/// to seal, connections its crash cut.
fn recover_journal(
    control: Option<&mut ControlSetup>,
    gateway_id: &Arc<str>,
    instance: &Arc<str>,
) -> Result<(), StartError> {
    if let Some(b) = control.and_then(|c| c.batches.as_mut()) {
        let sealed = b.spool.as_ref().map_or(0, |(_, p)| p.last_seq);
        b.recovered = Some(journal::recover_all(
            &b.journal_dir,
            sealed,
            gateway_id,
            instance,
        )?);
    }
    Ok(())
}

/// The record file opened for appending (made if missing), so that a start
/// fails before anything runs when it cannot be written.
fn record_file_writable(config: &Config) -> Result<(), StartError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&config.records.path)
        .map(drop)
        .map_err(|source| StartError::Records {
            path: config.records.path.clone(),
            source,
        })
}

/// The log filter the config sets, applied (one that does not parse was
/// refused with the config).
fn set_log_filter(log: Option<&crate::logging::LogControl>, directives: &str) {
    if let Some(log) = log {
        if let Ok(filter) = crate::logging::LogControl::check(directives) {
            log.set(filter);
        }
    }
}

/// The sessions' DNS answerer over its sockets (`[dns]`), reading the
/// serving context in force.
fn dns_answerer(
    config: &Config,
    current: &Arc<InForce>,
    sockets: DnsSockets,
) -> (Arc<crate::dns_answerer::Answerer>, DnsSockets) {
    let settings = crate::dns_answerer::Settings::from_config(
        config.dns.as_ref().expect("[dns] with its sockets"),
    );
    (
        crate::dns_answerer::Answerer::new(settings, Arc::clone(current)),
        sockets,
    )
}

/// What the operator side is built from.
struct OperatorSetup<'a> {
    config: &'a Config,
    options: &'a Options,
    exe: PathBuf,
    statics: StaticSet,
    current: &'a Arc<InForce>,
    cap: &'a Arc<Cap>,
    grace_ms: &'a Arc<AtomicU64>,
    sessions: &'a Arc<Sessions>,
    control: Option<&'a ControlSide>,
    clock: &'a SharedClock,
    gateway_id: &'a Arc<str>,
    instance: &'a Arc<str>,
    generation: u64,
    listeners: Listeners,
    proposer: Option<Proposer>,
    handovers: Handovers,
    forwarding: Option<Arc<crate::pair::forwarding::Forwarding>>,
}

/// The reloader (with everything a reload changes), the config in force,
/// and the upgrader (with everything a handover hands over); and where the
/// upgrader asks the data plane to stop accepting.
fn operator_side(
    o: OperatorSetup<'_>,
) -> (
    Arc<Reloader>,
    Arc<ConfigInForce>,
    Arc<Upgrader>,
    mpsc::Receiver<tokio::sync::oneshot::Sender<()>>,
) {
    let authority = o.control.map(|c| Arc::clone(&c.authority));
    let in_force = Arc::new(ConfigInForce::new(o.config.digest()));
    let reloader = Arc::new(Reloader::new(crate::reload::Reloadable {
        path: o.options.config_path.clone(),
        config_restart_only: o.config.restart_only(),
        digest: o.config.digest(),
        statics: o.statics,
        current: Arc::clone(o.current),
        tunables: tunables(
            &o.listeners.data,
            o.cap,
            o.grace_ms,
            o.sessions,
            authority.as_ref(),
            o.options.log.as_ref(),
        ),
        authority: authority.clone(),
        clock: Arc::clone(o.clock),
        in_force: Arc::clone(&in_force),
    }));
    let (stop_tx, stop_accepting) = mpsc::channel(1);
    let upgrader = Arc::new(Upgrader::new(crate::handover::Holdings {
        exe: o.exe,
        config_path: o.options.config_path.clone(),
        json_logs: o.options.json_logs,
        socket: o
            .config
            .process
            .socket
            .as_ref()
            .map(|s| s.get_ref().clone()),
        gateway_id: Arc::clone(o.gateway_id),
        instance: Arc::clone(o.instance),
        generation: o.generation,
        key_id: o.control.map(|c| c.key_id.clone()),
        listeners: o.listeners,
        configured: configured_listeners(o.config),
        sessions: Arc::clone(o.sessions),
        authority,
        control: o.control.map(|c| Arc::clone(&c.runner)),
        reloader: Arc::clone(&reloader),
        proposer: o.proposer,
        journal_dir: o.config.control.as_ref().and_then(|c| {
            c.spool_dir
                .as_ref()
                .map(|d| d.get_ref().join(journal::JOURNAL_DIR))
        }),
        stop_accepting: stop_tx,
        watcher: o.control.map(|c| Arc::clone(&c.watcher)),
        handovers: o.handovers,
        forwarding: o.forwarding,
        clock: Arc::clone(o.clock),
    }));
    (reloader, in_force, upgrader, stop_accepting)
}

/// A successor says `ready` and waits for `go`; from then on it holds
/// every authority, counts the handover, and learns of its predecessor's
/// exit over the link (its sealer waits for it).
async fn take_the_go(
    mut stream: UnixStream,
    handovers: Handovers,
    sessions: &Arc<Sessions>,
    control: Option<&ControlSide>,
    records: &mut Records,
) -> Result<(), StartError> {
    crate::handover::ready_and_go(&mut stream)
        .await
        .map_err(|e| StartError::Takeover(e.to_string()))?;
    handovers.publish();
    let p = crate::process::link::Predecessor::start(stream, Arc::clone(sessions));
    if let Some(c) = control {
        c.authority.set_predecessor(Arc::clone(&p));
    }
    records.predecessor_link(p);
    Ok(())
}

/// What a reload changes besides the settings new connections get, in the
/// order it changes them.
fn tunables(
    data: &Arc<TcpListener>,
    cap: &Arc<Cap>,
    grace_ms: &Arc<AtomicU64>,
    sessions: &Arc<Sessions>,
    authority: Option<&Arc<crate::authority::Authority>>,
    log: Option<&crate::logging::LogControl>,
) -> Vec<Arc<dyn Tunable>> {
    let mut all: Vec<Arc<dyn Tunable>> = vec![
        Arc::new(data::DataListener(Arc::clone(data))),
        Arc::clone(cap) as Arc<dyn Tunable>,
        Arc::new(Grace(Arc::clone(grace_ms))),
        Arc::clone(sessions) as Arc<dyn Tunable>,
    ];
    if let Some(a) = authority {
        all.push(Arc::clone(a) as Arc<dyn Tunable>);
    }
    if let Some(log) = log {
        all.push(Arc::new(log.clone()));
    }
    all
}

/// The gateway at work: every component, started.
#[derive(Debug)]
pub struct Running {
    config: Config,
    instance: Arc<str>,
    /// The sessions' DNS answerer and its sockets (`[dns]`).
    dns: Option<(Arc<crate::dns_answerer::Answerer>, DnsSockets)>,
    admin: Admin,
    data: DataPlane,
    /// Present with a `[control]` table.
    control: Option<ControlSide>,
    records: Records,
    operator: Operator,
    /// The forwarding table came with the authorities (a successor).
    forwarding_taken: bool,
}

impl Running {
    /// Learn who holds what this member forwards; start admin, the
    /// control side, the sessions' DNS and the operator side, say so (the
    /// ready line, the service manager), then accept until a shutdown
    /// signal or a handover.
    pub async fn serve(mut self, signals: Signals) -> (Running, End) {
        // Nothing is served on a socket before what judges it is in place:
        // the sessions are (a successor's were taken over), and so, from
        // here, is the forwarding table that judges a session only a peer
        // holds. Until then queries and connections wait in the sockets.
        self.data.learn_holders(self.forwarding_taken).await;
        let data_addr = self
            .data
            .listener
            .local_addr()
            .unwrap_or(self.config.listen.data);
        let admin_addr = self
            .admin
            .listener
            .local_addr()
            .unwrap_or(self.config.listen.admin);
        self.admin.start(
            Arc::clone(&self.operator.in_force),
            self.records.spool_full.clone(),
        );
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        tracing::info!(
            gateway_id = %self.config.gateway_id.get_ref(),
            instance = %self.instance,
            data = %data_addr,
            admin = %admin_addr,
            sessions = self.data.current.get().sessions.all().len(),
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
            ready_line["control"] = serde_json::json!(c.start());
        }
        if let Some((answerer, sockets)) = &self.dns {
            answerer.start(Arc::clone(&sockets.udp), Arc::clone(&sockets.tcp));
            if let Ok(addr) = sockets.udp.local_addr() {
                tracing::info!(dns = %addr, "answering the sessions' DNS");
                ready_line["dns"] = serde_json::json!(addr);
            }
        }
        let shutdown = self.operator.start(signals);
        if let Some(socket) = self.operator.socket() {
            ready_line["socket"] = serde_json::json!(socket);
        }
        // Not `println!`: standard output may be closed (a successor
        // inherits its predecessor's, whose reader may be gone), and a
        // failed write must not end the process.
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{ready_line}").and_then(|()| out.flush());
        }
        crate::process::notify::ready();
        let end = self.data.accept_until(shutdown).await;
        (self, end)
    }

    /// The drain, once accepting has stopped: every component stopped in
    /// reverse, by an explicit call. Each wait is bounded by the grace
    /// (`shutdown_grace_ms`) on its own.
    pub async fn drain(self, end: End) {
        let grace = self.data.grace();
        let handed_over = matches!(end, End::HandedOver);
        // 0. Tell every open connection at once (the data plane's
        //    `begin_drain`); their grace runs from here.
        let cut_at = tokio::time::Instant::now() + grace;
        self.data.begin_drain();
        // The sessions' DNS stops answering (its sockets stay open until
        // the process ends: after a handover the successor answers what
        // waits in them); the queries in flight get the grace, and every
        // session's counts go on the record.
        if let Some((answerer, _)) = &self.dns {
            answerer.stop(cut_at).await;
        }
        // A member going down ends its authorities: a request held for
        // approval is answered `approval_withdrawn` now, not cut unanswered
        // at the grace (after a handover the successor holds the sessions,
        // and passes their decisions on to this process).
        if !handed_over {
            let withdrawn: u32 = self
                .data
                .current
                .get()
                .sessions
                .all()
                .iter()
                .map(|s| s.approvals.close())
                .sum();
            if withdrawn > 0 {
                tracing::info!(
                    withdrawn,
                    "held requests withdrawn: the member is going down"
                );
            }
        }
        tracing::info!(open = self.data.open(), handed_over, "draining");
        if !handed_over {
            crate::process::notify::stopping();
        }
        // 1. Stop the control channel: no session opens on a gateway that
        //    is going away. Open RPCs get the grace; a client that holds
        //    its connection open past it is cut. (A handover stopped it.)
        if let Some(c) = &self.control {
            c.stop_channel(grace).await;
        }
        // 2. `/readyz` answers 503 (after a handover the successor answers
        //    it); the process socket and the signals: no reload or upgrade
        //    now.
        self.admin.not_ready(handed_over);
        self.operator.stop_requests();
        // 3. Close the data listener; 4. open connections get the grace to
        //    finish (from step 0); 5. the rest are cut (their records say
        //    so) and finish.
        let current = self.data.stop(cut_at).await;
        // 6. Stop the admin listener and the operator side.
        self.admin.stop().await;
        self.operator.stop(handed_over).await;
        // 7. End every authority the control plane opened (reason
        //    `shutdown`): their reports go on the record after every
        //    record of their connections. After a handover they are the
        //    successor's: this process only lets go of them.
        let sessions = Arc::clone(&current.get().sessions);
        match self.control {
            Some(c) => c.end(handed_over, &sessions).await,
            None => let_go(&sessions),
        }
        // 8. Stop the record writer, which writes what is queued and hands
        //    its last segment to the sealer; 9. give the shipper the grace
        //    to deliver the spool; what it cannot deliver stays spooled
        //    for the next start (after a handover: for the successor, at
        //    once).
        self.records
            .stop(if handed_over { Duration::ZERO } else { grace })
            .await;
        drop(current);
        // 10. Exit.
        tracing::info!("stopped");
    }
}

/// A successor signs with the key the running process signs with: the
/// batch chain has one signer.
fn same_signing_key(
    config: &Config,
    options: &Options,
    o: &crate::handover::state::Offer,
    c: &ControlSetup,
) -> Result<(), StartError> {
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
    Ok(())
}

/// What a successor takes over besides the authorities.
struct TakenOver {
    statics: StaticSet,
    ended: Vec<crate::handover::state::EndedState>,
    from_generation: u64,
    handovers: Handovers,
}

/// Import every authority of `offer` into `sessions`, each with its lease
/// (`lease` of its end, against this process's clock) and its secrets,
/// read in order from `secrets`, which must hold no more than the offer
/// names.
fn import_offer(
    o: crate::handover::state::Offer,
    secrets: &mut std::vec::IntoIter<zeroize::Zeroizing<Vec<u8>>>,
    sessions: &Sessions,
    tuned: &Tuned,
    proposer: Option<&Proposer>,
    lease: impl Fn(Option<crate::session::lease::Millis>) -> Lease,
) -> Result<TakenOver, StartError> {
    for state in o.sessions {
        let lease = lease(state.lease_until);
        let (session, sources) = state
            .import(secrets, &tuned.upstream, proposer, lease)
            .map_err(|e| StartError::Takeover(e.to_string()))?;
        sessions.insert(&sources, Arc::new(session));
    }
    if secrets.next().is_some() {
        return Err(StartError::Takeover(
            "more secrets came than the offer names".into(),
        ));
    }
    Ok(TakenOver {
        statics: o.statics.into_iter().collect(),
        ended: o.ended,
        from_generation: o.from_generation,
        handovers: o.handovers,
    })
}
