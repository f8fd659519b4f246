//! Restart and upgrade without losing a session: the running process hands
//! every live authority and its listening sockets to a successor on the
//! same machine, over the process socket.
//!
//! # Why this keeps "the key stayed in the gateway's memory"
//!
//! A session's CA keys exist only in the gateway's memory; a restart that
//! dropped them would end every authority on the member. A handover moves
//! them from one gateway process to the next without their ever touching a
//! disk: the old process encodes each intermediate's key (PKCS#8) into a
//! buffer wiped on drop, writes it to a Unix socket only the gateway's
//! user can open, and the successor — which the old process itself
//! started, and which must prove it by its process id (`SO_PEERCRED`) —
//! reads it into a wiped buffer and into aws-lc. The same goes for
//! attached values. Core dumps are off in both. The root keys are long
//! gone (see `talos_certs`): the successor can mint leaves, never another
//! CA.
//!
//! # The steps
//!
//! 1. `gateway upgrade` (or SIGUSR2) asks the running process; it starts
//!    its own binary's path again (so a new binary installed there runs)
//!    with `run --config <same file> --takeover`.
//! 2. The successor reads its config (a bad one: it says why over the
//!    socket and exits; the old process goes on, nothing changed) and
//!    connects; the old process checks that the peer is its child.
//! 3. The old process **freezes** what could change an authority: the
//!    control channel stops serving (calls in progress finish; new ones
//!    wait in its listener's backlog), the lease watcher stops, ends in
//!    progress finish, reloads wait. Connections go on being served.
//! 4. It sends the [`state::Offer`]: every live authority (CA, names,
//!    Lock, first uses, lease end, sources), the reports of the ends it
//!    remembers, the static sessions' definitions, how its listeners are
//!    configured and which fields only a restart changes; then the
//!    listening sockets (`SCM_RIGHTS`); then the secrets, frame by frame.
//! 5. The successor checks that its config changes no field only a
//!    restart changes, imports everything, starts its record writer (a
//!    journal of its own) and every task but the accept loops, and says
//!    `ready`.
//! 6. The old process stops accepting (connections arriving wait in the
//!    listeners' backlogs, which both processes share: none is refused),
//!    says `go`, and the successor accepts. From here the successor holds
//!    every authority; the old process drains the connections it had
//!    accepted, within the grace, and exits ([`crate::process::link`]).
//! 7. Any failure before `go` — a refusal, a crash, a timeout — and the
//!    old process unfreezes and goes on serving; the successor, if still
//!    running, is killed. `gateway_handover_total{result}` counts both:
//!    `failed` in the old process, which goes on serving; `ok` in the
//!    successor once it has `go`, counting on from the old process's
//!    counts (the offer carries them), so that the scrape after an upgrade
//!    shows one more.
//!
//! The signing key is the same file, and the successor checks it is the
//! same key. The batch chain goes on without a gap: the old process seals
//! and spools its last records before it exits; the successor journals
//! its own meanwhile and seals them only once the old process is gone and
//! the spool's lock is free. The successor is the same instance (its
//! records and reports say so) in a new generation: its connections are
//! numbered from `generation << 40`. It makes no start report: nothing
//! started afresh.

pub mod state;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use zeroize::Zeroizing;

use crate::authority::Authority;
use crate::config::Config;
use crate::process::{link, wire, HandoverResult};
use crate::reload::{Reloader, StaticEntry};
use crate::session::approvals::Proposer;
use crate::session::sessions::Sessions;
use state::{EndedState, Handovers, ListenerState, Offer, SessionState};

/// The longest a successor may take from its start to `ready`.
pub const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(60);

/// How long, once a successor has exited, its last word may take to come.
const EXIT_WORD: Duration = Duration::from_secs(2);

/// The longest one question on the process socket may take to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable that names the process socket to a successor
/// (so that it can say why it refuses even when its config does not load).
pub const SOCKET_ENV: &str = "TALOS_GATEWAY_TAKEOVER_SOCKET";

/// A question on the process socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    /// Read the config again (as SIGHUP does). `config` is the file the
    /// asker means (`gateway reload --config`), made absolute: another
    /// file than the one this process runs with is refused.
    Reload { config: PathBuf },
    /// Start a successor and hand over to it (as SIGUSR2 does).
    Upgrade,
    /// A successor: hand over to me.
    Takeover { pid: u32 },
    /// A successor that cannot take over, and why.
    Refuse { pid: u32, reason: String },
}

/// The answer to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Answer {
    pub ok: bool,
    pub message: String,
    /// The successor's process id (an upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The config's digest (a reload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// A successor's steps after the offer, and the old process's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    Ready,
    Refused { reason: String },
    Go,
}

/// Ask the process at `socket` (the `gateway reload` and `gateway upgrade`
/// commands). Waits up to `timeout` for the answer.
pub async fn ask(socket: &Path, request: &Request, timeout: Duration) -> std::io::Result<Answer> {
    let mut stream = UnixStream::connect(socket).await?;
    wire::write_json(&mut stream, request).await?;
    tokio::time::timeout(timeout, wire::read_json(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))?
}

/// Bind the process socket at `path` (mode 0600). A socket file left by a
/// process that is gone is replaced; one a live process answers on is not.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let listener = match UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("{}: another gateway process answers there", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
            UnixListener::bind(path)?
        }
        Err(e) => return Err(e),
    };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Whether `stream`'s peer runs as this process's user (anyone else is
/// refused, whatever the socket file's mode).
fn same_user(stream: &UnixStream) -> Option<u32> {
    let cred = stream.peer_cred().ok()?;
    let me = rustix::process::geteuid().as_raw();
    (cred.uid() == me).then(|| cred.pid().and_then(|p| u32::try_from(p).ok()))?
}

/// The listeners a process serves, handed over by descriptor.
#[derive(Debug, Clone)]
pub struct Listeners {
    pub data: Arc<TcpListener>,
    pub admin: Arc<TcpListener>,
    pub control: Option<Arc<TcpListener>>,
    pub process: Option<Arc<UnixListener>>,
}

/// What the old process freezes, snapshots and hands over.
#[derive(Debug)]
pub struct Parts {
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
}

/// The old process's side: starts successors and hands over to them.
pub struct Upgrader {
    parts: Parts,
    /// The next successor's generation (one per attempt, failed or not).
    next_generation: AtomicU64,
    /// One upgrade at a time.
    busy: tokio::sync::Mutex<()>,
    /// The successor being waited for: its pid, and where its connection
    /// (or its refusal) goes.
    waiting: Mutex<Option<(u32, oneshot::Sender<Arrival>)>>,
    /// Handovers that failed and left this process serving, counted on
    /// from `parts.handovers.failed`.
    failed: AtomicU64,
}

impl std::fmt::Debug for Upgrader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgrader")
            .field("exe", &self.parts.exe)
            .field("generation", &self.parts.generation)
            .finish_non_exhaustive()
    }
}

/// What the awaited successor sent first.
enum Arrival {
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
    pub fn new(parts: Parts) -> Upgrader {
        Upgrader {
            next_generation: AtomicU64::new(parts.generation + 1),
            failed: AtomicU64::new(parts.handovers.failed),
            parts,
            busy: tokio::sync::Mutex::new(()),
            waiting: Mutex::new(None),
        }
    }

    /// Serve the process socket until `stop` fires: reloads, upgrades,
    /// and the successor's arrival.
    pub async fn serve_socket(
        self: Arc<Self>,
        listener: Arc<UnixListener>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        loop {
            let stream = tokio::select! {
                () = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "process socket accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let this = Arc::clone(&self);
            tokio::spawn(async move { this.answer(stream).await });
        }
    }

    async fn answer(self: Arc<Self>, mut stream: UnixStream) {
        let Some(peer) = same_user(&stream) else {
            tracing::warn!("process socket: a peer of another user was refused");
            return;
        };
        let request: Request =
            match tokio::time::timeout(REQUEST_TIMEOUT, wire::read_json(&mut stream)).await {
                Ok(Ok(r)) => r,
                _ => return,
            };
        let answer = match request {
            Request::Reload { config } => match self.parts.reloader.reload_file(&config).await {
                Ok(r) => Answer {
                    ok: true,
                    message: format!(
                        "reloaded: {} session(s) opened, {} closed, {} kept",
                        r.sessions_opened, r.sessions_closed, r.sessions_kept
                    ),
                    pid: None,
                    digest: Some(r.digest),
                },
                Err(e) => Answer {
                    ok: false,
                    message: e.to_string(),
                    pid: None,
                    digest: None,
                },
            },
            Request::Upgrade => match Arc::clone(&self).upgrade().await {
                Ok(done) => Answer {
                    ok: true,
                    message: format!("process {} took over", done.pid),
                    pid: Some(done.pid),
                    digest: None,
                },
                Err(e) => Answer {
                    ok: false,
                    message: e.to_string(),
                    pid: None,
                    digest: None,
                },
            },
            Request::Takeover { pid } | Request::Refuse { pid, .. } if pid != peer => {
                tracing::warn!(
                    claimed = pid,
                    peer,
                    "process socket: a peer claimed another's pid"
                );
                return;
            }
            Request::Takeover { pid } => {
                self.arrive(pid, Arrival::Takeover(stream));
                return;
            }
            Request::Refuse { pid, reason } => {
                self.arrive(pid, Arrival::Refused(reason));
                return;
            }
        };
        let _ = wire::write_json(&mut stream, &answer).await;
    }

    /// The awaited successor arrived (or refused); anyone else is ignored.
    fn arrive(&self, pid: u32, arrival: Arrival) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
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
        let socket = self.parts.socket.clone().ok_or(UpgradeError::NoSocket)?;
        let _busy = self.busy.try_lock().map_err(|_| UpgradeError::Busy)?;
        let paused = self.parts.reloader.pause().ok_or(UpgradeError::Busy)?;
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let mut command = tokio::process::Command::new(&self.parts.exe);
        command
            .arg("run")
            .arg("--config")
            .arg(&self.parts.config_path)
            .arg("--takeover")
            .env(SOCKET_ENV, &socket)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(false);
        if self.parts.json_logs {
            command.arg("--json-logs");
        }
        let mut child = command.spawn().map_err(|source| UpgradeError::Spawn {
            exe: self.parts.exe.display().to_string(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        tracing::info!(pid, generation, exe = %self.parts.exe.display(), "successor started");
        let (tx, rx) = oneshot::channel();
        *self.waiting.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, tx));
        let deadline = tokio::time::Instant::now() + TAKEOVER_TIMEOUT;
        let mut rx = rx;
        let arrival = tokio::select! {
            a = &mut rx => a.ok(),
            status = child.wait() => {
                // A successor that refuses says why, then exits: its word
                // may still be on its way through the socket.
                let said = tokio::time::timeout(EXIT_WORD, rx).await.ok().and_then(Result::ok);
                self.waiting.lock().unwrap_or_else(|p| p.into_inner()).take();
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
                self.waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
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
                // Reloads stay paused for good: this process only drains.
                for s in self.parts.sessions.all() {
                    s.lease.hand_over();
                }
                std::mem::forget(paused);
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
        if let Some(c) = &self.parts.control {
            c.stop(Duration::from_secs(10)).await;
        }
        if let Some(w) = &self.parts.watcher {
            w.stop();
        }
        if let Some(a) = &self.parts.authority {
            a.quiesce().await;
        }
    }

    /// Undo [`Upgrader::freeze`]: the handover failed.
    fn thaw(&self) {
        if let Some(w) = &self.parts.watcher {
            w.start();
        }
        if let Some(c) = &self.parts.control {
            c.start();
        }
        tracing::info!("control channel and lease watcher running again");
    }

    /// Kill a successor that failed (if it still runs), wait for it, and
    /// remove its journal (it accepted nothing: nothing is in it).
    async fn reap(&self, mut child: tokio::process::Child, generation: u64) {
        let _ = child.start_kill();
        let _ = child.wait().await;
        if let Some(dir) = &self.parts.journal_dir {
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
        if let Some(p) = &self.parts.proposer {
            p.report_first_uses(tx);
        }
        tokio::spawn(link::serve_successor(
            stream,
            Arc::clone(&self.parts.sessions),
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
        for (session, sources) in self.parts.sessions.snapshot() {
            if session.ended.is_cancelled() {
                continue;
            }
            let (s, mut keys) = SessionState::export(&session, sources)
                .map_err(|e| UpgradeError::Failed(e.to_string()))?;
            sessions.push(s);
            secrets.append(&mut keys);
        }
        let ended = self.parts.authority.as_ref().map_or_else(Vec::new, |a| {
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
            gateway_id: self.parts.gateway_id.to_string(),
            instance: self.parts.instance.to_string(),
            generation,
            from_generation: self.parts.generation,
            key_id: self.parts.key_id.clone(),
            listeners: self.parts.configured.clone(),
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
                ok: self.parts.handovers.ok,
                failed: self.failed.load(Ordering::Relaxed),
            },
        };
        let live = offer.sessions.len();
        wire::write_json(&mut stream, &offer)
            .await
            .map_err(failed)?;
        let l = &self.parts.listeners;
        let mut fds = vec![l.data.as_fd(), l.admin.as_fd()];
        if let Some(c) = &l.control {
            fds.push(c.as_fd());
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
        if self.parts.stop_accepting.send(ack).await.is_ok() {
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

/// What a successor received.
pub struct Taken {
    pub offer: Offer,
    /// The descriptors, by listener role.
    pub fds: HashMap<String, OwnedFd>,
    /// The secret frames, in order.
    pub secrets: Vec<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taken")
            .field("sessions", &self.offer.sessions.len())
            .field("fds", &self.fds.len())
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

/// Why a successor could not take over.
#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    #[error("no [process] socket in the config: nothing to take over from")]
    NoSocket,
    #[error("cannot reach the running process at {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("the handover broke: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Refused(String),
}

/// The successor's side: connect to the running process, and read its
/// offer, descriptors and secrets. The stream stays open for the rest of
/// the handover (see [`ready_and_go`]) and the link.
pub async fn take_over(config: &Config, path: &Path) -> Result<(Taken, UnixStream), TakeoverError> {
    let socket = config
        .process
        .socket
        .as_ref()
        .map(|s| s.get_ref().clone())
        .ok_or(TakeoverError::NoSocket)?;
    let mut stream =
        UnixStream::connect(&socket)
            .await
            .map_err(|source| TakeoverError::Connect {
                path: socket.display().to_string(),
                source,
            })?;
    wire::write_json(
        &mut stream,
        &Request::Takeover {
            pid: std::process::id(),
        },
    )
    .await?;
    let offer: Offer = wire::read_json(&mut stream).await?;
    let fds = wire::recv_fds(&stream, offer.listeners.len()).await?;
    let mut secrets = Vec::with_capacity(offer.secrets.min(1 << 20));
    for _ in 0..offer.secrets {
        secrets.push(wire::read_secret(&mut stream).await?);
    }
    let refuse = |reason: String| TakeoverError::Refused(reason);
    let checked = (|| {
        if offer.version != state::VERSION {
            return Err(refuse(format!(
                "the running process hands over version {}, this binary takes {}",
                offer.version,
                state::VERSION
            )));
        }
        if offer.gateway_id != *config.gateway_id.get_ref() {
            return Err(refuse(
                config
                    .changed_field(path, "gateway_id", &offer.gateway_id)
                    .to_string(),
            ));
        }
        let running: Vec<(&'static str, String)> = offer
            .restart_only
            .iter()
            .filter_map(|(f, v)| {
                config
                    .restart_only()
                    .into_iter()
                    .find(|(mine, _)| mine == f)
                    .map(|(name, _)| (name, v.clone()))
            })
            .collect();
        if running.len() != offer.restart_only.len() {
            return Err(refuse(
                "the running process has fields this binary does not know".into(),
            ));
        }
        config
            .check_restart_only(path, &running)
            .map_err(|e| refuse(e.to_string()))
    })();
    if let Err(e) = checked {
        refuse_on(&mut stream, &e.to_string()).await;
        return Err(e);
    }
    let fds = offer
        .listeners
        .iter()
        .map(|l| l.role.clone())
        .zip(fds)
        .collect();
    Ok((
        Taken {
            offer,
            fds,
            secrets,
        },
        stream,
    ))
}

/// Tell the running process this successor refuses (best effort).
pub async fn refuse_on(stream: &mut UnixStream, reason: &str) {
    let _ = wire::write_json(
        stream,
        &Step::Refused {
            reason: reason.to_owned(),
        },
    )
    .await;
}

/// A successor whose config does not even load says so to the process
/// that started it (named by [`SOCKET_ENV`]) before it exits.
pub async fn refuse_early(reason: &str) {
    let Some(socket) = std::env::var_os(SOCKET_ENV) else {
        return;
    };
    if let Ok(mut stream) = UnixStream::connect(PathBuf::from(socket)).await {
        let _ = wire::write_json(
            &mut stream,
            &Request::Refuse {
                pid: std::process::id(),
                reason: reason.to_owned(),
            },
        )
        .await;
    }
}

/// Say `ready` and wait for `go`: then this process accepts.
pub async fn ready_and_go(stream: &mut UnixStream) -> Result<(), TakeoverError> {
    wire::write_json(stream, &Step::Ready).await?;
    match wire::read_json::<Step, _>(stream).await? {
        Step::Go => Ok(()),
        other => Err(TakeoverError::Refused(format!(
            "the running process answered {other:?} instead of go"
        ))),
    }
}
