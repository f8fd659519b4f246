//! The operator's side of the process: the reloader, the upgrader, the
//! process socket's server and the signals. Started once the data path
//! serves; stopped at the drain's start (no reload or upgrade while the
//! process goes away), with every signal logged from then on.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::handover::{SocketServer, Upgrader};
use crate::reload::{ConfigInForce, Reloader};

/// The reloader, the upgrader, and what reaches them: the process socket
/// and the signals.
#[derive(Debug)]
pub(super) struct Operator {
    pub(super) reloader: Arc<Reloader>,
    pub(super) upgrader: Arc<Upgrader>,
    /// The config in force, as the admin listener shows it.
    pub(super) in_force: Arc<ConfigInForce>,
    /// The process socket, and its path.
    process: Option<Arc<UnixListener>>,
    socket: Option<PathBuf>,
    /// The socket's server, the signal handlers and what they started.
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Operator {
    pub(super) fn new(
        reloader: Arc<Reloader>,
        upgrader: Arc<Upgrader>,
        in_force: Arc<ConfigInForce>,
        process: Option<Arc<UnixListener>>,
        socket: Option<PathBuf>,
    ) -> Operator {
        Operator {
            reloader,
            upgrader,
            in_force,
            process,
            socket,
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
        }
    }

    /// The process socket's path, if it is served.
    pub(super) fn socket(&self) -> Option<&PathBuf> {
        self.process.as_ref().and(self.socket.as_ref())
    }

    /// Serve the process socket and act on `signals` (SIGHUP reloads,
    /// SIGUSR2 upgrades, the others are logged). Returns what resolves at
    /// the first shutdown signal (SIGTERM, SIGINT, SIGQUIT).
    pub(super) fn start(&self, signals: Signals) -> impl std::future::Future<Output = ()> {
        if let Some(p) = &self.process {
            self.tasks.spawn(
                Arc::new(SocketServer::new(
                    Arc::clone(&self.reloader),
                    Arc::clone(&self.upgrader),
                ))
                .serve(Arc::clone(p), self.stop.clone()),
            );
        }
        let Signals {
            shutdown,
            reload,
            upgrade,
            logged,
        } = signals;
        self.tasks.spawn(act_on_signals(
            reload,
            upgrade,
            logged,
            Arc::clone(&self.reloader),
            Arc::clone(&self.upgrader),
            self.stop.clone(),
        ));
        shutdown_signal(shutdown)
    }

    /// No reload or upgrade from now on: the socket is no longer served
    /// and SIGHUP and SIGUSR2 are only logged.
    pub(super) fn stop_requests(&self) {
        self.stop.cancel();
    }

    /// Stop everything [`Operator::start`] started and wait for it, then
    /// let go of the socket: its file goes unless a successor answers
    /// there now.
    pub(super) async fn stop(self, handed_over: bool) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        if let (Some(path), false) = (&self.socket, handed_over) {
            let _ = std::fs::remove_file(path);
        }
    }
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
