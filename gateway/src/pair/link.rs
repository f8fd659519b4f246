//! The member link: mutual TLS 1.3 between the members of a pair, with the
//! identities `control-stub init` issues, on a listener of its own.
//!
//! - **Who may connect.** A client must present a certificate of the
//!   control CA that carries the gateway role and names one of this
//!   member's `[pair] peers` by its id. A gateway of another pair (same
//!   CA, an id not configured here), the control plane, or anyone without
//!   a certificate is refused before a byte of a session is read.
//! - **What it carries.** One session connection per link connection:
//!   first a PROXY protocol v2 header ([`super::proxy`]) naming the
//!   session's real source address and the attempt the forwarder forwards
//!   for, then the session's bytes as the session sent them (its
//!   ClientHello first), never decrypted by the forwarder.
//! - **No second hop.** A connection that came over the link is judged
//!   here, never forwarded again: `conn` serves it with its `via` set,
//!   and only connections without one consult the forwarding table.
//!
//! Every refusal is logged with its peer and a stable cause, and counted
//! in `gateway_link_refused_total{cause}`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use super::forwarding::Forwarding;
use super::proxy::{self, Header, HeaderError};
use crate::refusal::causes;

/// How long a peer has for the link's TLS handshake and header together.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the forwarder waits to reach a holder (TCP and TLS).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The link's stream on the holder's side.
pub type Accepted = tokio_rustls::server::TlsStream<TcpStream>;

/// The link's stream on the forwarder's side.
pub type Connected = tokio_rustls::client::TlsStream<TcpStream>;

causes! {
    /// Why the link refused a connection before serving its session's
    /// bytes: the `cause` label of `gateway_link_refused_total`, beside
    /// the header's own causes ([`HeaderError`]).
    pub enum LinkRefusal {
        /// The TLS handshake failed (no certificate, one of another CA, …).
        HandshakeFailed => "handshake_failed",
        /// The handshake and header did not come within ACCEPT_TIMEOUT.
        AcceptTimeout => "accept_timeout",
        /// A certificate of the CA without the gateway role.
        NotAGateway => "not_a_gateway",
        /// A gateway certificate naming no configured peer (another
        /// pair's member, say).
        NotAPeer => "not_a_peer",
    }
}

/// Why a link connection was refused.
#[derive(Debug)]
pub enum Refused {
    Link(LinkRefusal),
    Header(HeaderError),
}

impl Refused {
    pub fn as_str(&self) -> &'static str {
        match self {
            Refused::Link(l) => l.as_str(),
            Refused::Header(h) => h.as_str(),
        }
    }
}

/// A link connection accepted: who sent it and what its header says.
#[derive(Debug)]
pub struct Arrival {
    pub stream: Accepted,
    /// The peer's gateway id, as its certificate names it.
    pub peer: Arc<str>,
    pub header: Header,
}

/// The member link: its TLS on both sides, the peers, the forwarding
/// table.
pub struct Link {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
    /// Each peer's id and link address.
    peers: Vec<(Arc<str>, SocketAddr)>,
    pub forwarding: Arc<Forwarding>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("peers", &self.peers)
            .field("forwarding", &self.forwarding)
            .finish_non_exhaustive()
    }
}

impl Link {
    pub fn new(
        server: Arc<rustls::ServerConfig>,
        client: Arc<rustls::ClientConfig>,
        peers: Vec<(Arc<str>, SocketAddr)>,
        max_per_session: usize,
    ) -> Link {
        let ids = peers.iter().map(|(id, _)| Arc::clone(id)).collect();
        Link {
            acceptor: tokio_rustls::TlsAcceptor::from(server),
            connector: tokio_rustls::TlsConnector::from(client),
            peers,
            forwarding: Arc::new(Forwarding::new(ids, max_per_session)),
        }
    }

    /// Accept one link connection: its handshake, who the peer is, its
    /// header, within ACCEPT_TIMEOUT. A refusal is logged and counted
    /// here.
    pub async fn accept(&self, tcp: TcpStream, from: SocketAddr) -> Option<Arrival> {
        let _ = tcp.set_nodelay(true);
        let accepted = tokio::time::timeout(ACCEPT_TIMEOUT, self.arrive(tcp))
            .await
            .unwrap_or(Err(Refused::Link(LinkRefusal::AcceptTimeout)));
        match accepted {
            Ok(a) => Some(a),
            Err(why) => {
                tracing::warn!(peer = %from, cause = why.as_str(), "member link connection refused");
                metrics::counter!("gateway_link_refused_total", "cause" => why.as_str())
                    .increment(1);
                None
            }
        }
    }

    async fn arrive(&self, tcp: TcpStream) -> Result<Arrival, Refused> {
        let mut stream = self
            .acceptor
            .accept(tcp)
            .await
            .map_err(|_| Refused::Link(LinkRefusal::HandshakeFailed))?;
        let peer = {
            let (_, tls) = stream.get_ref();
            let leaf = tls
                .peer_certificates()
                .and_then(|c| c.first())
                .ok_or(Refused::Link(LinkRefusal::HandshakeFailed))?;
            self.member(leaf)?
        };
        // The deadline is the caller's: the header has what is left of it.
        let header = proxy::read(&mut stream, ACCEPT_TIMEOUT)
            .await
            .map_err(Refused::Header)?;
        Ok(Arrival {
            stream,
            peer,
            header,
        })
    }

    /// The configured peer `leaf` names, if it carries the gateway role.
    fn member(&self, leaf: &rustls::pki_types::CertificateDer<'_>) -> Result<Arc<str>, Refused> {
        if !crate::control::carries_role(leaf, talos_contract::role::GATEWAY) {
            return Err(Refused::Link(LinkRefusal::NotAGateway));
        }
        self.peers
            .iter()
            .find(|(id, _)| crate::control::carries_role(leaf, id))
            .map(|(id, _)| Arc::clone(id))
            .ok_or(Refused::Link(LinkRefusal::NotAPeer))
    }

    /// Reach holder `id` over the link and send `header`: the stream is
    /// ready for the session's bytes. The holder's certificate must name
    /// `id` and carry the gateway role.
    pub async fn connect(&self, id: &str, header: &Header) -> std::io::Result<Connected> {
        let addr = self
            .peers
            .iter()
            .find(|(p, _)| **p == *id)
            .map(|(_, a)| *a)
            .ok_or_else(|| std::io::Error::other("not a configured peer"))?;
        let name = rustls::pki_types::ServerName::try_from(id.to_owned())
            .map_err(|_| std::io::Error::other("peer id is no server name"))?;
        let bytes = header.encode().map_err(std::io::Error::other)?;
        let connecting = async {
            let tcp = TcpStream::connect(addr).await?;
            let _ = tcp.set_nodelay(true);
            let mut tls = self.connector.connect(name, tcp).await?;
            let carries = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .is_some_and(|leaf| {
                    crate::control::carries_role(leaf, talos_contract::role::GATEWAY)
                });
            if !carries {
                return Err(std::io::Error::other(
                    "the peer's certificate does not carry the gateway role",
                ));
            }
            tokio::io::AsyncWriteExt::write_all(&mut tls, &bytes).await?;
            Ok(tls)
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "timed out",
                ))
            })
    }
}
