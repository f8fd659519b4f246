//! The process socket's request server: `gateway reload` and `gateway
//! upgrade` ask here, and a successor arrives here (its pid checked
//! against the one the upgrade started).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

use super::old::Arrival;
use super::{Answer, Request, Upgrader, REQUEST_TIMEOUT};
use crate::process::wire;
use crate::reload::Reloader;

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

/// Answers on the process socket: reloads go to the reloader, upgrades
/// and successors' arrivals to the upgrader.
#[derive(Debug)]
pub struct SocketServer {
    reloader: Arc<Reloader>,
    upgrader: Arc<Upgrader>,
}

impl SocketServer {
    pub fn new(reloader: Arc<Reloader>, upgrader: Arc<Upgrader>) -> SocketServer {
        SocketServer { reloader, upgrader }
    }

    /// Serve the process socket until `stop` fires: reloads, upgrades,
    /// and the successor's arrival.
    pub async fn serve(
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
            Request::Reload { config } => match self.reloader.reload_file(&config).await {
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
            Request::Upgrade => match Arc::clone(&self.upgrader).upgrade().await {
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
                self.upgrader.arrive(pid, Arrival::Takeover(stream));
                return;
            }
            Request::Refuse { pid, reason } => {
                self.upgrader.arrive(pid, Arrival::Refused(reason));
                return;
            }
        };
        let _ = wire::write_json(&mut stream, &answer).await;
    }
}
