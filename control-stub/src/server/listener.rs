//! A listener and the connections it accepted, as each of `serve`'s
//! listeners (control, approvals, metrics) runs them: bound before
//! anything starts ([`bind`]); accepting, at most [`MAX_CONNECTIONS`] at
//! once, each TLS handshake bounded by [`HANDSHAKE_TIMEOUT`]
//! ([`Listener::start_tls`], [`Listener::start_plain`]); then stopped in
//! two explicit moves: [`Listener::close`] stops accepting, closes the
//! socket and tells every open connection to finish (each learns it from
//! the [`Drain`] it was given: HTTP/1.1 closes once the request in flight
//! is answered, at once when idle; HTTP/2 sends GOAWAY and answers the
//! streams already open), and [`Listener::finish`] waits for them until
//! a deadline, then cuts the rest.
//!
//! # Limits
//!
//! - At most [`MAX_CONNECTIONS`] connections at once per listener; more
//!   wait in the listen queue.
//! - A TLS handshake gets [`HANDSHAKE_TIMEOUT`].

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use talos_contract::sync::Locked;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::Error;

/// Connections served at once by one listener: a pair of gateways needs
/// two on the control listener; the rest is room for reconnects while old
/// connections drain.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a client has to finish its TLS handshake: a peer that stalls
/// must not hold a connection slot.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bind `addr` (an error names it). Needs the serving runtime's context
/// (`Runtime::enter`); nothing is accepted until the listener is started.
pub fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    let io = |e: std::io::Error| Error::Io {
        what: addr.to_string(),
        reason: e.to_string(),
    };
    let std = std::net::TcpListener::bind(addr).map_err(io)?;
    std.set_nonblocking(true).map_err(io)?;
    TcpListener::from_std(std).map_err(io)
}

/// How a connection learns that the drain has begun.
#[derive(Clone, Debug)]
pub struct Drain(CancellationToken);

impl Drain {
    /// Resolves once the connection should finish.
    pub async fn begun(&self) {
        self.0.cancelled().await;
    }
}

/// Serve hyper connection `conn` to its end, telling it to finish
/// (`finish`: its `graceful_shutdown`) once `drain` begins.
pub async fn until_drained<C>(conn: C, drain: &Drain, finish: impl FnOnce(Pin<&mut C>))
where
    C: Future,
{
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = drain.begun() => finish(conn.as_mut()),
    }
    let _ = conn.await;
}

/// What became of a listener's connections at [`Listener::finish`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Finished {
    /// Open when the drain began, or accepted before the socket closed,
    /// and finished by themselves.
    pub finished: usize,
    /// Still open at the deadline, and cut.
    pub cut: usize,
}

/// A bound listener, its accept loop and its connections.
#[derive(Debug)]
pub struct Listener {
    addr: SocketAddr,
    /// Taken by the accept loop when it starts; closed when it ends.
    socket: Mutex<Option<TcpListener>>,
    accept: Mutex<Option<JoinHandle<()>>>,
    /// Stops the accept loop.
    accepting: CancellationToken,
    /// Tells every connection to finish.
    draining: CancellationToken,
    /// Cuts every connection still open.
    cut: CancellationToken,
    /// Every connection's task.
    connections: TaskTracker,
    /// Connections accepted and not yet ended.
    open: Arc<AtomicUsize>,
    /// Connections accepted since the start.
    accepted: Arc<AtomicUsize>,
}

impl Listener {
    /// The listener over `socket`; nothing is accepted yet.
    pub fn new(socket: TcpListener) -> Result<Listener, Error> {
        let addr = socket.local_addr().map_err(|e| Error::Io {
            what: "listener".into(),
            reason: e.to_string(),
        })?;
        Ok(Listener {
            addr,
            socket: Mutex::new(Some(socket)),
            accept: Mutex::new(None),
            accepting: CancellationToken::new(),
            draining: CancellationToken::new(),
            cut: CancellationToken::new(),
            connections: TaskTracker::new(),
            open: Arc::new(AtomicUsize::new(0)),
            accepted: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The address it is bound to (the port the kernel picked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Accept TLS connections with `tls`: each handshake bounded by
    /// [`HANDSHAKE_TIMEOUT`], a failed one logged as one JSON line under
    /// `log_key`; each handshaken stream served by `serve_conn` on a task
    /// of its own. Does nothing if started before.
    pub fn start_tls<F, Fut>(&self, tls: rustls::ServerConfig, log_key: &'static str, serve_conn: F)
    where
        F: Fn(TlsStream<TcpStream>, Drain) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        self.start_with(move |tcp: TcpStream, peer: SocketAddr, drain: Drain| {
            let acceptor = acceptor.clone();
            let serve_conn = serve_conn.clone();
            async move {
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => return log_refused(log_key, peer, &e.to_string()),
                    Err(_) => return log_refused(log_key, peer, "handshake timed out"),
                };
                serve_conn(tls, drain).await;
            }
        });
    }

    /// Accept plain TCP connections, each served by `serve_conn` on a
    /// task of its own. Does nothing if started before.
    pub fn start_plain<F, Fut>(&self, serve_conn: F)
    where
        F: Fn(TcpStream, Drain) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.start_with(move |tcp, _peer, drain| serve_conn(tcp, drain));
    }

    fn start_with<F, Fut>(&self, serve_conn: F)
    where
        F: Fn(TcpStream, SocketAddr, Drain) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(socket) = self.socket.locked().take() else {
            return;
        };
        let accepting = self.accepting.clone();
        let draining = Drain(self.draining.clone());
        let cut = self.cut.clone();
        let connections = self.connections.clone();
        let open = Arc::clone(&self.open);
        let accepted = Arc::clone(&self.accepted);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let task = tokio::spawn(async move {
            loop {
                let permit = tokio::select! {
                    () = accepting.cancelled() => break,
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                };
                let (tcp, peer) = tokio::select! {
                    () = accepting.cancelled() => break,
                    a = socket.accept() => match a {
                        Ok(a) => a,
                        // A failed accept (e.g. out of descriptors) is the
                        // connection's, not the listener's: go on.
                        Err(_) => continue,
                    },
                };
                accepted.fetch_add(1, Ordering::Relaxed);
                open.fetch_add(1, Ordering::Relaxed);
                let served = serve_conn(tcp, peer, draining.clone());
                let cut = cut.clone();
                let open = Arc::clone(&open);
                connections.spawn(async move {
                    let _permit = permit;
                    tokio::select! {
                        () = served => {}
                        () = cut.cancelled() => {}
                    }
                    open.fetch_sub(1, Ordering::Relaxed);
                });
            }
            // The socket closes here: connections still arriving are
            // refused by the kernel from now on.
            drop(socket);
        });
        *self.accept.locked() = Some(task);
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// The drain's first move: stop accepting and close the socket, then
    /// tell every open connection to finish. Returns the connections open
    /// then.
    pub async fn close(&self) -> usize {
        self.accepting.cancel();
        let accept = self.accept.locked().take();
        if let Some(task) = accept {
            let _ = task.await;
        }
        // Never started: the socket closes here.
        drop(self.socket.locked().take());
        self.draining.cancel();
        self.connections.close();
        self.open.load(Ordering::Relaxed)
    }

    /// The drain's second move, after [`Listener::close`]: wait until
    /// `deadline` for the open connections to finish, then cut the rest
    /// (their tasks end; the sockets close).
    pub async fn finish(&self, deadline: tokio::time::Instant) -> Finished {
        let before = self.open.load(Ordering::Relaxed);
        if tokio::time::timeout_at(deadline, self.connections.wait())
            .await
            .is_ok()
        {
            return Finished {
                finished: before,
                cut: 0,
            };
        }
        let cut = self.open.load(Ordering::Relaxed);
        self.cut.cancel();
        self.connections.wait().await;
        Finished {
            finished: before.saturating_sub(cut),
            cut,
        }
    }
}

fn log_refused(log_key: &str, peer: SocketAddr, why: &str) {
    eprintln!(
        "{}",
        serde_json::json!({log_key: peer.to_string(), "reason": why})
    );
}
