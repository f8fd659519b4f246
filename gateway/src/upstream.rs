//! Connections to destinations: TLS 1.3, HTTP/2 or HTTP/1.1 as the
//! destination chooses, pooled per session and destination.
//!
//! A pool belongs to one session (it lives in the session's authority and
//! is dropped with it), so no connection — and no TLS resumption state — is
//! ever shared between sessions. Within a session, connections are keyed by
//! destination name. A new connection goes only to an address the gate
//! checked for that name.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::name::Name;

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

#[derive(Debug, Default)]
struct Idle {
    h2: Option<(http2::SendRequest<Incoming>, SocketAddr)>,
    h1: Vec<(http1::SendRequest<Incoming>, SocketAddr)>,
}

/// One session's upstream connections.
#[derive(Debug)]
pub struct Pool {
    tls: Arc<rustls::ClientConfig>,
    connect_timeout: Duration,
    port: u16,
    // The lock is held only to push or pop, never across an await.
    idle: Mutex<HashMap<Name, Idle>>,
}

impl Pool {
    /// A pool whose connections use `tls` and go to `port`.
    pub fn new(tls: Arc<rustls::ClientConfig>, port: u16, connect_timeout: Duration) -> Pool {
        Pool {
            tls,
            connect_timeout,
            port,
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// A connection to `name`: a pooled one that can take a request now,
    /// or a new one to one of `addrs` (the addresses the gate checked).
    pub async fn checkout(
        &self,
        name: &Name,
        addrs: &[IpAddr],
    ) -> Result<Checkout, ConnectFailure> {
        if let Some(c) = self.pooled(name) {
            return Ok(c);
        }
        // On the heap: a connection is made rarely, and its handshake's
        // state would otherwise be inline in every request's future.
        Box::pin(self.connect(name, addrs)).await
    }

    fn pooled(&self, name: &Name) -> Option<Checkout> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let entry = idle.get_mut(name)?;
        if let Some((h2, addr)) = &entry.h2 {
            if !h2.is_closed() {
                return Some(Checkout {
                    sender: Sender::H2(h2.clone()),
                    addr: *addr,
                });
            }
            entry.h2 = None;
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
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let entry = idle.entry(name.clone()).or_default();
        entry.h1.retain(|(s, _)| !s.is_closed());
        if entry.h1.len() < MAX_IDLE_H1 {
            entry.h1.push((sender, addr));
        }
    }

    async fn connect(&self, name: &Name, addrs: &[IpAddr]) -> Result<Checkout, ConnectFailure> {
        let (tcp, addr) = self.tcp(addrs).await?;
        let server_name =
            ServerName::try_from(name.as_str().to_owned()).map_err(|_| ConnectFailure::Tls)?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls));
        let tls = match tokio::time::timeout(
            self.connect_timeout,
            connector.connect(server_name, crate::tls::BigReads::new(tcp)),
        )
        .await
        {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::info!(destination = %name, %addr, error = %e, "upstream TLS handshake failed");
                return Err(ConnectFailure::Tls);
            }
            Err(_) => return Err(ConnectFailure::Timeout),
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        let sender = if h2 {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(Duration::from_secs(30))
                .handshake(io)
                .await
                .map_err(|_| ConnectFailure::Http)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.entry(name.clone()).or_default().h2 = Some((sender.clone(), addr));
            Sender::H2(sender)
        } else {
            let (sender, conn) = http1::Builder::new()
                .handshake(io)
                .await
                .map_err(|_| ConnectFailure::Http)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Sender::H1(sender)
        };
        Ok(Checkout { sender, addr })
    }

    async fn tcp(&self, addrs: &[IpAddr]) -> Result<(TcpStream, SocketAddr), ConnectFailure> {
        let mut failure = ConnectFailure::Unreachable;
        for ip in addrs {
            let addr = SocketAddr::new(*ip, self.port);
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await {
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
