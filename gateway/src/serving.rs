//! What connections, DNS queries and control calls are served with: the
//! process-wide [`Context`] (the sessions, the resolver, the record sink,
//! the settings in force), the one [`InForce`] now, and the drain's
//! [`Shutdown`] signals. Built by `reload` (and at start by `server`), read
//! as peers by `conn`, the DNS answerer and `control`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::gate::resolve::Resolver;
use crate::records::journal::RecordSink;
use crate::session::sessions::Sessions;
use talos_contract::sync::RwLocked;

/// What every connection is served with: the sessions, the resolver, the
/// record sink, and the settings in force when it was accepted.
#[derive(Debug)]
pub struct Context {
    pub gateway_id: Arc<str>,
    pub sessions: Arc<Sessions>,
    pub resolver: Resolver,
    pub records: RecordSink,
    /// How sessions opened now reach destinations, and their share's
    /// bounds.
    pub upstream: crate::session::sessions::UpstreamSettings,
    /// The most bytes read while waiting for a whole ClientHello.
    pub hello_max_bytes: usize,
    /// How long a client has to send its whole ClientHello.
    pub hello_timeout: Duration,
    /// How long the session-side TLS handshake may take.
    pub handshake_timeout: Duration,
    /// How long an HTTP/2 session connection may answer nothing.
    pub h2_idle_timeout: Duration,
    /// How long a session connection may be silent before TCP keep-alive
    /// probes it (a peer gone without a word is cut within twice this).
    pub tcp_keepalive: Duration,
    /// The drain: its start, and the end of its grace.
    pub shutdown: Shutdown,
    /// Delivers held requests' proposals to the approval relay (with a
    /// control plane).
    pub proposer: Option<crate::session::approvals::Proposer>,
    /// The member link and its forwarding table (`[pair]`).
    pub link: Option<Arc<crate::member_link::link::Link>>,
}

/// What the gateway's drain tells open connections, each when it comes;
/// a connection waits on both beside its own work, woken by them alone
/// (see `terminate`).
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    /// The drain began: finish gracefully. HTTP/1.1 closes a connection
    /// that waits between requests and answers the request in flight with
    /// `Connection: close`; HTTP/2 sends GOAWAY, so the client opens new
    /// streams elsewhere, and answers the streams already open.
    pub drain: CancellationToken,
    /// The drain's grace ran out: cut what is still open.
    pub cut: CancellationToken,
}

/// The [`Context`] that new connections and control calls get: a reload
/// replaces it whole, and connections open at the time keep theirs.
#[derive(Debug)]
pub struct InForce(std::sync::RwLock<Arc<Context>>);

impl InForce {
    pub fn new(cx: Arc<Context>) -> InForce {
        InForce(std::sync::RwLock::new(cx))
    }

    /// The settings in force now.
    pub fn get(&self) -> Arc<Context> {
        Arc::clone(&self.0.read_locked())
    }

    /// Replace the settings for what comes next.
    pub fn set(&self, cx: Arc<Context>) {
        *self.0.write_locked() = cx;
    }
}
