//! Connections to destinations: TLS 1.3, HTTP/2 or HTTP/1.1 as the
//! destination chooses, pooled per session and destination.
//!
//! A pool belongs to one session (it lives in the session's authority and
//! is dropped with it), so no connection — and no TLS resumption state — is
//! ever shared between sessions. Within a session, connections are keyed by
//! destination name. A new connection goes only to an address the gate
//! checked for that name.
//!
//! Protocol: a request from an HTTP/2 session, and every gRPC request, goes
//! over HTTP/2 when the destination chooses it (ALPN `h2, http/1.1`: one
//! pooled connection carries them all). A plain HTTP/1.1 request goes over
//! HTTP/1.1 (ALPN `http/1.1` alone), as it came: re-framing it into HTTP/2
//! cost the gateway 5-10 % more CPU per small request and a sixth of its
//! request rate (`benches/load/gateway-ab.sh`, `benches/compare`). A destination that
//! speaks only HTTP/2 refuses that handshake (`no_application_protocol`);
//! the pool then connects again offering both, and remembers the answer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore, Resumption};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::gate::name::Name;
use crate::io::gathered::Gathered;
use talos_contract::sync::{Locked, RwLocked};

/// Idle HTTP/1.1 connections kept per destination. A session rarely needs
/// more in parallel to one host; past it, connections close after use.
pub const MAX_IDLE_H1: usize = 32;

/// Which protocol the destination chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Http1,
    Http2,
}

impl Proto {
    /// The ALPN name.
    pub fn alpn(self) -> &'static str {
        match self {
            Proto::Http1 => "http/1.1",
            Proto::Http2 => "h2",
        }
    }
}

/// What the request needs of its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// HTTP/1.1 when the destination speaks it (a plain HTTP/1.1 request).
    Http1,
    /// HTTP/2 when the destination chooses it (HTTP/2 sessions, gRPC).
    Any,
}

/// A connection ready to take one request.
#[derive(Debug)]
pub enum Sender {
    H1(http1::SendRequest<Incoming>),
    H2(http2::SendRequest<Incoming>),
}

/// A sender and where it goes.
#[derive(Debug)]
pub struct Checkout {
    pub sender: Sender,
    /// The checked address the connection went to.
    pub addr: SocketAddr,
}

impl Checkout {
    /// The protocol of the connection.
    pub fn proto(&self) -> Proto {
        match self.sender {
            Sender::H1(_) => Proto::Http1,
            Sender::H2(_) => Proto::Http2,
        }
    }
}

/// Why a destination could not be reached: the fixed cause recorded with
/// `upstream_failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    Refused,
    Timeout,
    Unreachable,
    /// The TLS handshake failed: bad certificate, wrong name, expired, no
    /// TLS 1.3, or the destination closed.
    Tls,
    /// The HTTP handshake failed.
    Http,
}

impl ConnectFailure {
    /// Every failure.
    pub const ALL: &'static [ConnectFailure] = &[
        ConnectFailure::Refused,
        ConnectFailure::Timeout,
        ConnectFailure::Unreachable,
        ConnectFailure::Tls,
        ConnectFailure::Http,
    ];

    /// The cause word.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectFailure::Refused => "connect_refused",
            ConnectFailure::Timeout => "connect_timeout",
            ConnectFailure::Unreachable => "connect_failed",
            ConnectFailure::Tls => "tls_handshake_failed",
            ConnectFailure::Http => "http_handshake_failed",
        }
    }
}

/// How a connection attempt failed.
enum ConnectError {
    /// The destination refused a handshake offering HTTP/1.1 alone.
    NoHttp1,
    Failed(ConnectFailure),
}

impl ConnectError {
    fn failure(self) -> ConnectFailure {
        match self {
            ConnectError::NoHttp1 => ConnectFailure::Tls,
            ConnectError::Failed(f) => f,
        }
    }
}

/// Whether a TLS handshake failed on the destination's
/// `no_application_protocol` alert (it speaks none of the ALPN offered).
fn no_application_protocol(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .is_some_and(|e| {
            matches!(
                e,
                rustls::Error::AlertReceived(rustls::AlertDescription::NoApplicationProtocol)
            )
        })
}

#[derive(Debug, Default)]
struct Idle {
    h2: Option<(http2::SendRequest<Incoming>, SocketAddr)>,
    h1: Vec<(http1::SendRequest<Incoming>, SocketAddr)>,
    /// What the destination chose when offered both (None: not asked yet).
    chose_h2: Option<bool>,
    /// It refused a handshake offering HTTP/1.1 alone.
    h2_only: bool,
}

/// How a pool's new connections are made: the TLS configs (offering both
/// protocols, and HTTP/1.1 alone), the port, the connect timeout.
#[derive(Debug)]
pub struct Dialing {
    /// ALPN `h2, http/1.1`.
    tls: Arc<rustls::ClientConfig>,
    /// ALPN `http/1.1` alone.
    tls_h1: Arc<rustls::ClientConfig>,
    connect_timeout: Duration,
    port: u16,
}

impl Dialing {
    /// Connections with `tls` (trust anchors, ALPN `h2, http/1.1`) to
    /// `port`, each given `connect_timeout` to connect and to shake hands.
    pub fn new(tls: Arc<rustls::ClientConfig>, port: u16, connect_timeout: Duration) -> Dialing {
        let mut h1 = (*tls).clone();
        h1.alpn_protocols = vec![b"http/1.1".to_vec()];
        Dialing {
            tls_h1: Arc::new(h1),
            tls,
            connect_timeout,
            port,
        }
    }

    /// This dialing for one pool: the same, but resuming TLS only with
    /// the tickets in `tickets` (the pool's own), so that no destination
    /// ever sees one session resume another's TLS session.
    fn with_tickets(&self, tickets: &Arc<dyn ClientSessionStore>) -> Dialing {
        let own = |c: &Arc<rustls::ClientConfig>| {
            let mut c = (**c).clone();
            c.resumption = Resumption::store(Arc::clone(tickets));
            Arc::new(c)
        };
        Dialing {
            tls: own(&self.tls),
            tls_h1: own(&self.tls_h1),
            connect_timeout: self.connect_timeout,
            port: self.port,
        }
    }
}

/// Destinations a pool keeps TLS tickets for: rustls keeps up to 8 per
/// destination, the oldest destination going first past this many.
const TICKET_DESTINATIONS: usize = 16;
/// rustls's own bound on the tickets it keeps per destination.
const MAX_TICKETS_PER_DESTINATION: usize = 8;

/// One session's upstream connections.
#[derive(Debug)]
pub struct Pool {
    /// Read once per new connection; a reload replaces it, and pooled
    /// connections go on as they were made. Its TLS configs resume with
    /// `tickets` alone.
    dialing: std::sync::RwLock<Arc<Dialing>>,
    /// The TLS sessions this pool's destinations offered to resume (a
    /// destination's tickets, in memory): the pool's own, dropped with it,
    /// kept across a reload.
    tickets: Arc<dyn ClientSessionStore>,
    // The lock is held only to push or pop, never across an await.
    idle: Mutex<HashMap<Name, Idle>>,
}

impl Pool {
    /// A pool whose new connections are made as `dialing` says.
    pub fn new(dialing: &Dialing) -> Pool {
        let tickets: Arc<dyn ClientSessionStore> = Arc::new(ClientSessionMemoryCache::new(
            TICKET_DESTINATIONS * MAX_TICKETS_PER_DESTINATION,
        ));
        Pool {
            dialing: std::sync::RwLock::new(Arc::new(dialing.with_tickets(&tickets))),
            tickets,
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// Make new connections as `dialing` says from now on (resuming with
    /// the tickets this pool already holds).
    pub fn redial(&self, dialing: &Dialing) {
        let own = Arc::new(dialing.with_tickets(&self.tickets));
        *self.dialing.write_locked() = own;
    }

    fn dialing(&self) -> Arc<Dialing> {
        Arc::clone(&self.dialing.read_locked())
    }

    /// A connection to `name` for a request that needs `want`: a pooled one
    /// that can take a request now, or a new one to one of `addrs` (the
    /// addresses the gate checked).
    pub async fn checkout(
        &self,
        name: &Name,
        addrs: &[IpAddr],
        want: Want,
    ) -> Result<Checkout, ConnectFailure> {
        if let Some(c) = self.pooled(name, want) {
            return Ok(c);
        }
        // On the heap: a connection is made rarely, and its handshake's
        // state would otherwise be inline in every request's future.
        let dialing = self.dialing();
        if want == Want::Http1 && !self.h2_only(name) {
            match Box::pin(self.connect(name, addrs, &dialing, &dialing.tls_h1)).await {
                Err(ConnectError::NoHttp1) => {
                    let mut idle = self.idle.locked();
                    idle.entry(name.clone()).or_default().h2_only = true;
                    drop(idle);
                    if let Some(c) = self.pooled(name, Want::Any) {
                        return Ok(c);
                    }
                }
                other => return other.map_err(ConnectError::failure),
            }
        }
        Box::pin(self.connect(name, addrs, &dialing, &dialing.tls))
            .await
            .map_err(ConnectError::failure)
    }

    /// A plain TCP connection to the first of `addrs` (the addresses the
    /// gate checked) that answers, on the destinations' port, within the
    /// connect timeout: for a passthrough connection, whose TLS is the
    /// session's own with the destination. Never pooled.
    pub async fn dial_tcp(
        &self,
        addrs: &[IpAddr],
    ) -> Result<(TcpStream, SocketAddr), ConnectFailure> {
        let dialing = self.dialing();
        self.tcp(addrs, &dialing).await
    }

    fn h2_only(&self, name: &Name) -> bool {
        let idle = self.idle.locked();
        idle.get(name).is_some_and(|e| e.h2_only)
    }

    fn pooled(&self, name: &Name, want: Want) -> Option<Checkout> {
        let mut idle = self.idle.locked();
        let entry = idle.get_mut(name)?;
        // HTTP/2 serves a request that may take it, and any request to a
        // destination that speaks nothing else.
        let try_h2 = want == Want::Any || entry.h2_only;
        // HTTP/1.1 serves an HTTP/1.1 request, and one that may take HTTP/2
        // only if the destination chose HTTP/1.1 when offered both.
        let try_h1 = match want {
            Want::Http1 => !entry.h2_only,
            Want::Any => entry.chose_h2 == Some(false),
        };
        if try_h2 {
            if let Some((h2, addr)) = &entry.h2 {
                if !h2.is_closed() {
                    return Some(Checkout {
                        sender: Sender::H2(h2.clone()),
                        addr: *addr,
                    });
                }
                entry.h2 = None;
            }
        }
        if !try_h1 {
            return None;
        }
        entry.h1.retain(|(s, _)| !s.is_closed());
        let ready = entry.h1.iter().position(|(s, _)| s.is_ready())?;
        let (s, addr) = entry.h1.swap_remove(ready);
        Some(Checkout {
            sender: Sender::H1(s),
            addr,
        })
    }

    /// Give an HTTP/1.1 connection back once its request is sent; it is
    /// used again when its response has been read (it is then ready).
    pub fn give_back_h1(
        &self,
        name: &Name,
        sender: http1::SendRequest<Incoming>,
        addr: SocketAddr,
    ) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.locked();
        let entry = idle.entry(name.clone()).or_default();
        entry.h1.retain(|(s, _)| !s.is_closed());
        if entry.h1.len() < MAX_IDLE_H1 {
            entry.h1.push((sender, addr));
        }
    }

    async fn connect(
        &self,
        name: &Name,
        addrs: &[IpAddr],
        dialing: &Dialing,
        tls: &Arc<rustls::ClientConfig>,
    ) -> Result<Checkout, ConnectError> {
        let (tcp, addr) = self
            .tcp(addrs, dialing)
            .await
            .map_err(ConnectError::Failed)?;
        let server_name = ServerName::try_from(name.as_str().to_owned())
            .map_err(|_| ConnectError::Failed(ConnectFailure::Tls))?;
        let offered_both = tls.alpn_protocols.len() > 1;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
        let tls = match tokio::time::timeout(
            dialing.connect_timeout,
            connector.connect(server_name, tcp),
        )
        .await
        {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) if no_application_protocol(&e) => return Err(ConnectError::NoHttp1),
            Ok(Err(e)) => {
                tracing::info!(destination = %name, %addr, error = %e, "upstream TLS handshake failed");
                return Err(ConnectError::Failed(ConnectFailure::Tls));
            }
            Err(_) => return Err(ConnectError::Failed(ConnectFailure::Timeout)),
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        if offered_both {
            let mut idle = self.idle.locked();
            idle.entry(name.clone()).or_default().chose_h2 = Some(h2);
        }
        let sender = if h2 {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(Duration::from_secs(30))
                // Requests sent together leave together. The stream on the
                // heap: hyper spawns a task for every request whose future
                // is as large as its connection's (an enum that can also
                // hold the connection), so a TLS stream held inline was
                // 1.2 KiB more moved and copied per request (2,624 bytes
                // a request task against 1,432).
                .handshake(TokioIo::new(Box::new(Gathered::new(tls))))
                .await
                .map_err(|_| ConnectError::Failed(ConnectFailure::Http))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let mut idle = self.idle.locked();
            idle.entry(name.clone()).or_default().h2 = Some((sender.clone(), addr));
            Sender::H2(sender)
        } else {
            let (sender, conn) = http1::Builder::new()
                .handshake(TokioIo::new(tls))
                .await
                .map_err(|_| ConnectError::Failed(ConnectFailure::Http))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Sender::H1(sender)
        };
        Ok(Checkout { sender, addr })
    }

    async fn tcp(
        &self,
        addrs: &[IpAddr],
        dialing: &Dialing,
    ) -> Result<(TcpStream, SocketAddr), ConnectFailure> {
        let mut failure = ConnectFailure::Unreachable;
        for ip in addrs {
            let addr = SocketAddr::new(*ip, dialing.port);
            match tokio::time::timeout(dialing.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok((stream, addr));
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    failure = ConnectFailure::Refused;
                }
                Ok(Err(_)) => failure = ConnectFailure::Unreachable,
                Err(_) => failure = ConnectFailure::Timeout,
            }
        }
        Err(failure)
    }
}
