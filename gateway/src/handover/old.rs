//! The running process's side of a handover: start a successor, freeze
//! what could change an authority, send the offer, the listeners and the
//! secrets, wait for `ready`, stop accepting, say `go` — or, on any
//! failure before `go`, thaw and go on serving.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use zeroize::Zeroizing;

use super::state::{
    self, EndedState, ForwardingState, Handovers, ListenerState, Offer, SessionState,
};
use super::{Step, EXIT_WORD, SOCKET_ENV, TAKEOVER_TIMEOUT};
use crate::authority::Authority;
use crate::process::{link, wire, HandoverResult};
use crate::reload::{Reloader, StaticEntry};
use crate::session::approvals::Proposer;
use crate::session::sessions::Sessions;
use talos_contract::sync::Locked;

/// The listeners a process serves, handed over by descriptor.
#[derive(Debug, Clone)]
pub struct Listeners {
    pub data: Arc<TcpListener>,
    pub admin: Arc<TcpListener>,
    pub control: Option<Arc<TcpListener>>,
    /// The member link's listener (`[pair]`).
    pub pair: Option<Arc<TcpListener>>,
    /// The sessions' DNS sockets (`[dns]`): UDP, then TCP.
    pub dns: Option<(Arc<tokio::net::UdpSocket>, Arc<TcpListener>)>,
    pub process: Option<Arc<UnixListener>>,
}

/// What the old process freezes, snapshots and hands over.
#[derive(Debug)]
pub struct Holdings {
    /// The binary to start (its path at this process's start).
    pub exe: PathBuf,
    pub config_path: PathBuf,
    pub json_logs: bool,
    pub socket: Option<PathBuf>,
    pub gateway_id: Arc<str>,
    pub instance: Arc<str>,
    /// This process's generation (0 after a cold start).
    pub generation: u64,
    pub key_id: Option<String>,
    pub listeners: Listeners,
    /// How each listener is configured, as its [`ListenerState`] says.
    pub configured: Vec<ListenerState>,
    pub sessions: Arc<Sessions>,
    pub authority: Option<Arc<Authority>>,
    pub control: Option<Arc<crate::control::Runner>>,
    pub reloader: Arc<Reloader>,
    pub proposer: Option<Proposer>,
    /// The journal directory (a failed successor's is removed).
    pub journal_dir: Option<PathBuf>,
    /// Stops the accept loop; answered once it has stopped.
    pub stop_accepting: mpsc::Sender<oneshot::Sender<()>>,
    /// The lease watcher, stopped while handing over.
    pub watcher: Option<Arc<crate::authority::LeaseWatcher>>,
    /// The handovers counted so far, this process's own included (a
    /// successor's is its predecessor's counts, taken over).
    pub handovers: Handovers,
    /// The member link's forwarding table (`[pair]`), handed over as it
    /// stands.
    pub forwarding: Option<Arc<crate::pair::forwarding::Forwarding>>,
    /// The clock the forwarding table's ends are handed over on.
    pub clock: crate::session::lease::SharedClock,
}

/// The old process's side: starts successors and hands over to them.
pub struct Upgrader {
    held: Holdings,
    /// The next successor's generation (one per attempt, failed or not).
    next_generation: AtomicU64,
    /// One upgrade at a time.
    busy: tokio::sync::Mutex<()>,
    /// The successor being waited for: its pid, and where its connection
    /// (or its refusal) goes.
    waiting: Mutex<Option<(u32, oneshot::Sender<Arrival>)>>,
    /// Handovers that failed and left this process serving, counted on
    /// from `held.handovers.failed`.
    failed: AtomicU64,
}

impl std::fmt::Debug for Upgrader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgrader")
            .field("exe", &self.held.exe)
            .field("generation", &self.held.generation)
            .finish_non_exhaustive()
    }
}

/// What the awaited successor sent first.
pub(super) enum Arrival {
    Takeover(UnixStream),
    Refused(String),
}

/// Why an upgrade did not happen (the process goes on as it was).
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("no [process] socket in the config: a successor has nowhere to reach this process")]
    NoSocket,
    #[error("an upgrade or a reload is in progress")]
    Busy,
    #[error("this process has already handed over to a successor and is draining")]
    HandedOver,
    #[error("cannot start {exe}: {source}")]
    Spawn { exe: String, source: std::io::Error },
    #[error("the new process refused: {0}")]
    Refused(String),
    #[error("the new process exited ({0}) before taking over; its log says why")]
    Exited(String),
    #[error("the new process did not take over within {0:?}")]
    Timeout(Duration),
    #[error("the handover failed: {0}")]
    Failed(String),
}

/// The outcome of a handover the old process made.
#[derive(Debug)]
pub struct HandedOver {
    pub pid: u32,
}

impl Upgrader {
    pub fn new(held: Holdings) -> Upgrader {
        Upgrader {
            next_generation: AtomicU64::new(held.generation + 1),
            failed: AtomicU64::new(held.handovers.failed),
            held,
            busy: tokio::sync::Mutex::new(()),
            waiting: Mutex::new(None),
        }
    }

    /// The awaited successor arrived (or refused); anyone else is ignored.
    pub(super) fn arrive(&self, pid: u32, arrival: Arrival) {
        let mut waiting = self.waiting.locked();
        match waiting.take() {
            Some((expected, tx)) if expected == pid => {
                let _ = tx.send(arrival);
            }
            other => {
                *waiting = other;
                tracing::warn!(
                    pid,
                    "process socket: a takeover from a process this one did not start was refused"
                );
            }
        }
    }

    /// Start a successor and hand over to it; on success this process
    /// has stopped accepting and goes on only to drain. A failure is
    /// counted here (`gateway_handover_total{result="failed"}`: this
    /// process goes on serving and answering scrapes); a success by the
    /// successor, which answers them from then on.
    pub async fn upgrade(self: Arc<Self>) -> Result<HandedOver, UpgradeError> {
        let result = self.upgrade_inner().await;
        if result.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(
                "gateway_handover_total",
                "result" => HandoverResult::Failed.as_str()
            )
            .increment(1);
        }
        match &result {
            Ok(h) => tracing::info!(successor = h.pid, "handed over; draining"),
            Err(e) => tracing::error!(error = %e, "upgrade failed; this process goes on serving"),
        }
        result
    }

    async fn upgrade_inner(&self) -> Result<HandedOver, UpgradeError> {
        let socket = self.held.socket.clone().ok_or(UpgradeError::NoSocket)?;
        let _busy = self.busy.try_lock().map_err(|_| UpgradeError::Busy)?;
        let paused = self.held.reloader.pause().map_err(|e| match e {
            crate::reload::ReloadError::HandedOver => UpgradeError::HandedOver,
            _ => UpgradeError::Busy,
        })?;
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let mut command = tokio::process::Command::new(&self.held.exe);
        command
            .arg("run")
            .arg("--config")
            .arg(&self.held.config_path)
            .arg("--takeover")
            .env(SOCKET_ENV, &socket)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(false);
        if self.held.json_logs {
            command.arg("--json-logs");
        }
        let mut child = command.spawn().map_err(|source| UpgradeError::Spawn {
            exe: self.held.exe.display().to_string(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        tracing::info!(pid, generation, exe = %self.held.exe.display(), "successor started");
        let (tx, rx) = oneshot::channel();
        *self.waiting.locked() = Some((pid, tx));
        let deadline = tokio::time::Instant::now() + TAKEOVER_TIMEOUT;
        let mut rx = rx;
        let arrival = tokio::select! {
            a = &mut rx => a.ok(),
            status = child.wait() => {
                // A successor that refuses says why, then exits: its word
                // may still be on its way through the socket.
                let said = tokio::time::timeout(EXIT_WORD, rx).await.ok().and_then(Result::ok);
                self.waiting.locked().take();
                if let Some(Arrival::Refused(reason)) = said {
                    return Err(UpgradeError::Refused(reason));
                }
                let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                return Err(UpgradeError::Exited(status));
            }
            () = tokio::time::sleep_until(deadline) => None,
        };
        let stream = match arrival {
            Some(Arrival::Takeover(s)) => s,
            Some(Arrival::Refused(reason)) => {
                self.reap(child, generation).await;
                return Err(UpgradeError::Refused(reason));
            }
            None => {
                self.waiting.locked().take();
                self.reap(child, generation).await;
                return Err(UpgradeError::Timeout(TAKEOVER_TIMEOUT));
            }
        };
        // Freeze, offer, and wait for the successor's word.
        self.freeze().await;
        match self
            .offer(
                stream,
                generation,
                paused.restart_only(),
                paused.statics(),
                deadline,
            )
            .await
        {
            Ok(stream) => {
                // Committed: the successor accepts from here, and holds the
                // leases (it ends an authority here when it ends it there).
                // Reloads are refused from here: this process only drains.
                for s in self.held.sessions.all() {
                    s.lease.hand_over();
                }
                paused.hand_over();
                self.detach(child);
                self.link(stream);
                Ok(HandedOver { pid })
            }
            Err(e) => {
                self.thaw();
                self.reap(child, generation).await;
                Err(e)
            }
        }
    }

    /// Stop what could change an authority: the control channel, the
    /// lease watcher; wait for ends in progress.
    async fn freeze(&self) {
        if let Some(c) = &self.held.control {
            c.stop(Duration::from_secs(10)).await;
        }
        if let Some(w) = &self.held.watcher {
            w.stop();
        }
        if let Some(a) = &self.held.authority {
            a.quiesce().await;
        }
    }

    /// Undo [`Upgrader::freeze`]: the handover failed.
    fn thaw(&self) {
        if let Some(w) = &self.held.watcher {
            w.start();
        }
        if let Some(c) = &self.held.control {
            c.start();
        }
        tracing::info!("control channel and lease watcher running again");
    }

    /// Kill a successor that failed (if it still runs), wait for it, and
    /// remove its journal (it accepted nothing: nothing is in it).
    async fn reap(&self, mut child: tokio::process::Child, generation: u64) {
        let _ = child.start_kill();
        let _ = child.wait().await;
        if let Some(dir) = &self.held.journal_dir {
            let gen_dir = crate::records::journal::generation_dir(dir, generation);
            if gen_dir != *dir {
                let _ = std::fs::remove_dir_all(gen_dir);
            }
        }
    }

    /// The successor runs on its own from here: reap it when it exits, so
    /// it never lingers as a zombie while this process drains.
    fn detach(&self, mut child: tokio::process::Child) {
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
    }

    /// Answer the successor's questions until this process exits.
    fn link(&self, stream: UnixStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(p) = &self.held.proposer {
            p.report_first_uses(tx);
        }
        tokio::spawn(link::serve_successor(
            stream,
            Arc::clone(&self.held.sessions),
            rx,
        ));
    }

    /// Send the offer, the descriptors and the secrets; wait for `ready`;
    /// stop accepting; say `go`. Returns the stream for the link.
    async fn offer(
        &self,
        mut stream: UnixStream,
        generation: u64,
        restart_only: &[(&'static str, String)],
        statics: &HashMap<String, StaticEntry>,
        deadline: tokio::time::Instant,
    ) -> Result<UnixStream, UpgradeError> {
        let failed = |e: std::io::Error| UpgradeError::Failed(e.to_string());
        let mut sessions = Vec::new();
        let mut secrets: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        for (session, sources) in self.held.sessions.snapshot() {
            if session.ended.is_cancelled() {
                continue;
            }
            let (s, mut keys) = SessionState::export(&session, sources)
                .map_err(|e| UpgradeError::Failed(e.to_string()))?;
            sessions.push(s);
            secrets.append(&mut keys);
        }
        let ended = self.held.authority.as_ref().map_or_else(Vec::new, |a| {
            a.recent_reports()
                .into_iter()
                .map(|(id, attempt, report)| EndedState {
                    session_id: id.to_string(),
                    attempt,
                    report,
                })
                .collect()
        });
        let offer = Offer {
            version: state::VERSION,
            gateway_id: self.held.gateway_id.to_string(),
            instance: self.held.instance.to_string(),
            generation,
            from_generation: self.held.generation,
            key_id: self.held.key_id.clone(),
            listeners: self.held.configured.clone(),
            restart_only: restart_only
                .iter()
                .map(|(f, v)| ((*f).to_owned(), v.clone()))
                .collect(),
            statics: statics
                .iter()
                .map(|(id, e)| (id.clone(), e.clone()))
                .collect(),
            sessions,
            ended,
            secrets: secrets.len(),
            handovers: Handovers {
                ok: self.held.handovers.ok,
                failed: self.failed.load(Ordering::Relaxed),
            },
            forwarding: self
                .held
                .forwarding
                .as_ref()
                .map(|f| ForwardingState::export(f, &*self.held.clock)),
        };
        let live = offer.sessions.len();
        wire::write_json(&mut stream, &offer)
            .await
            .map_err(failed)?;
        let l = &self.held.listeners;
        let mut fds = vec![l.data.as_fd(), l.admin.as_fd()];
        if let Some(c) = &l.control {
            fds.push(c.as_fd());
        }
        if let Some(p) = &l.pair {
            fds.push(p.as_fd());
        }
        if let Some((udp, tcp)) = &l.dns {
            fds.push(udp.as_fd());
            fds.push(tcp.as_fd());
        }
        if let Some(p) = &l.process {
            fds.push(p.as_fd());
        }
        wire::send_fds(&stream, &fds).await.map_err(failed)?;
        for secret in &secrets {
            wire::write_frame(&mut stream, secret)
                .await
                .map_err(failed)?;
        }
        drop(secrets);
        tracing::info!(
            sessions = live,
            forwarding = offer.forwarding.as_ref().map_or(0, Vec::len),
            generation,
            "offer sent; waiting for the successor"
        );
        let step: Step = tokio::time::timeout_at(deadline, wire::read_json(&mut stream))
            .await
            .map_err(|_| UpgradeError::Timeout(TAKEOVER_TIMEOUT))?
            .map_err(failed)?;
        match step {
            Step::Ready => {}
            Step::Refused { reason } => return Err(UpgradeError::Refused(reason)),
            Step::Go => return Err(UpgradeError::Failed("the successor said go".into())),
        }
        // Stop accepting, then let the successor accept: connections
        // arriving meanwhile wait in the shared backlog.
        let (ack, stopped) = oneshot::channel();
        if self.held.stop_accepting.send(ack).await.is_ok() {
            let _ = stopped.await;
        }
        if let Err(e) = wire::write_json(&mut stream, &Step::Go).await {
            // The successor is gone between `ready` and `go`: accept again.
            tracing::error!(error = %e, "the successor went away before go");
            return Err(UpgradeError::Failed(e.to_string()));
        }
        Ok(stream)
    }
}
