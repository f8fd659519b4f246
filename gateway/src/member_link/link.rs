//! The member link: mutual TLS 1.3 between the members of a pair, with the
//! identities `control-stub init` issues, on a listener of its own.
//!
//! - **Who may connect.** A client must present a certificate of the
//!   control CA that carries the gateway role and names one of this
//!   member's `[pair] peers` by its id. A gateway of another pair (same
//!   CA, an id not configured here), the control plane, or anyone without
//!   a certificate is refused before a byte of a session is read.
//! - **What it speaks.** ALPN `talos-link/1` ([`crate::tls::LINK_ALPN`])
//!   for forwarded connections, `talos-holdings/1` to ask what a peer
//!   holds. rustls refuses a client that offers only other protocols, but
//!   not one that offers none: a peer that offers none is refused here
//!   (`no_alpn`), before a byte of a session is read.
//! - **What it carries.** Long-lived link connections from each member to
//!   each peer, HTTP/2-framed, one for each session the member forwards
//!   to that peer (another if one fills: [`super::stream::MAX_STREAMS`]);
//!   each forwarded session connection is one stream of its session's
//!   ([`super::stream`], whose docs say why one per session and how the
//!   windows are sized so that nothing one session leaves unread holds
//!   another back): first a PROXY protocol v2 header ([`crate::pair::proxy`])
//!   naming the session's real source address and the attempt the
//!   forwarder forwards for, then the session's bytes as the session sent
//!   them (its ClientHello first), never decrypted by the forwarder. A
//!   connection ended (the peer restarted, or drained it for an upgrade)
//!   is made again at the next stream; one that has carried nothing for
//!   [`LINK_IDLE`] is closed.
//! - **The header's authority.** The holder serves a stream only for the
//!   authority it holds live for the header's source: a header naming
//!   another session or another attempt of it is refused
//!   (`link_session_mismatch`, `link_attempt_mismatch`), recorded, logged
//!   and counted ([`mismatch`]).
//! - **No second hop.** A connection that came over the link is judged
//!   here, never forwarded again: `conn` serves it with its `via` set,
//!   and only connections without one consult the forwarding table.
//!
//! - **The holder's own word.** A connection with ALPN
//!   [`crate::tls::HOLDINGS_ALPN`] asks which authorities this member
//!   holds live, each with its sources and what is left of its lease; the
//!   answer is a JSON array of [`Holding`]s, then the close. Each member
//!   asks each peer every `[pair] holdings_interval_ms` ([`Link::ask_peers`])
//!   and forwards by what it was told until that lease would end, so a
//!   member cut off from the control plane, but not from its peer, still
//!   forwards, and stops when the peer's authority would have lapsed.
//!
//! Every refusal is logged with its peer and a stable cause, and counted
//! in `gateway_link_refused_total{cause}`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use bytes::Bytes;

use super::stream::{self, LinkStream, Slot, Slots};
use crate::pair::forwarding::{Forwarding, Holding};
use crate::pair::proxy::{self, Header, HeaderError};
use crate::refusal::causes;
use crate::session::sessions::Sessions;

/// The most bytes of a peer's answer on what it holds.
const MAX_HOLDINGS_ANSWER: u64 = 4 << 20;

/// How long a peer has for the link's TLS handshake and header together.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the forwarder waits to reach a holder (TCP and TLS).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a link connection that carries no stream is kept for its
/// session's next one (a session's connections often come one after
/// another), before it is closed: each costs both members its TLS and
/// HTTP/2 state, and a session that stopped forwarding should not keep
/// one.
pub const LINK_IDLE: Duration = Duration::from_secs(30);

/// A forwarded connection as the holder reads it: a stream of a link
/// connection.
pub type Accepted = LinkStream;

/// A forwarded connection as the forwarder writes it.
pub type Connected = LinkStream;

/// A link connection from a peer, after its TLS handshake and the check
/// of who the peer is: its HTTP/2 connection, each stream one forwarded
/// session connection ([`Link::open_stream`]), each holding one of its
/// `slots`.
pub struct Linked {
    pub peer: Arc<str>,
    pub conn: h2::server::Connection<tokio_rustls::server::TlsStream<TcpStream>, Bytes>,
    pub slots: Arc<Slots>,
}

impl std::fmt::Debug for Linked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linked")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

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
        /// A member that does not speak the link's HTTP/2 framing.
        NotHttp2 => "not_http2",
        /// A client that offered no ALPN protocol (the link's is
        /// `talos-link/1`; rustls lets a client that offers none through).
        NoAlpn => "no_alpn",
        /// A stream past [`super::stream::MAX_STREAMS`] held on one link
        /// connection: reset unprocessed (REFUSED_STREAM), so that the
        /// forwarder opens it on another connection.
        StreamsAtBound => "streams_at_bound",
        /// A stream whose header names a session other than the one its
        /// source belongs to here (recorded `unknown_source`).
        SessionMismatch => "link_session_mismatch",
        /// A stream whose header names another attempt of the session its
        /// source belongs to here (recorded `unknown_source`).
        AttemptMismatch => "link_attempt_mismatch",
    }
}

/// Log and count a link stream refused for what its header names
/// (`why`: [`LinkRefusal::SessionMismatch`] or
/// [`LinkRefusal::AttemptMismatch`]) against the authority held here.
pub fn mismatch(why: LinkRefusal, peer: &str, named: (&str, u32), held: (&str, u32)) {
    tracing::warn!(
        peer,
        cause = why.as_str(),
        named_session = named.0,
        named_attempt = named.1,
        held_session = held.0,
        held_attempt = held.1,
        "member link stream refused"
    );
    metrics::counter!("gateway_link_refused_total", "cause" => why.as_str()).increment(1);
}

/// Log and count a link stream reset for `why` before its header was
/// taken.
pub fn refuse_stream(peer: &str, why: &Refused) {
    tracing::warn!(peer, cause = why.as_str(), "member link stream refused");
    metrics::counter!("gateway_link_refused_total", "cause" => why.as_str()).increment(1);
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

/// The link's TLS configs: its listener's, and the client's for a
/// forwarded connection and for asking a peer what it holds.
#[derive(Debug)]
pub struct Tls {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
    pub asking: Arc<rustls::ClientConfig>,
}

/// One link connection this member made to a peer: its HTTP/2 sender,
/// and its streams.
#[derive(Clone)]
struct Channel {
    send: h2::client::SendRequest<Bytes>,
    slots: Arc<Slots>,
}

/// The link connections to one peer for one session.
#[derive(Default)]
struct Pool {
    /// Each with its streams; a stream goes on the first with room.
    conns: std::sync::Mutex<Vec<Channel>>,
    /// Held while a connection is made for this session (never while a
    /// stream is opened on one made already): the session's streams that
    /// need one wait for it, other sessions' do not.
    making: tokio::sync::Mutex<()>,
}

impl Pool {
    /// A place on a connection with room, if one has.
    fn take(&self) -> Option<(Channel, Slot)> {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns
            .iter()
            .find_map(|c| c.slots.take().map(|s| (c.clone(), s)))
    }

    /// Forget `chan`: it failed, or its peer refused a stream on it. Its
    /// open streams go on; it closes when they have ended.
    fn retire(&self, chan: &Channel) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| !Arc::ptr_eq(&c.slots, &chan.slots));
    }
}

/// Each peer's pools, by session id ("" for a header that names no
/// session): looked up by `&str`, so that a stream allocates nothing to
/// find its pool.
type Pools = std::collections::HashMap<Arc<str>, std::collections::HashMap<Arc<str>, Arc<Pool>>>;

/// The member link: its TLS on both sides, the peers, the forwarding
/// table.
pub struct Link {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
    /// The link connections made to each peer, per session: every
    /// forwarded connection of a session is a stream of one of its own.
    pools: std::sync::Mutex<Pools>,
    asker: tokio_rustls::TlsConnector,
    /// How often each peer is asked what it holds.
    interval: Duration,
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
        tls: Tls,
        peers: Vec<(Arc<str>, SocketAddr)>,
        max_per_session: usize,
        interval: Duration,
    ) -> Link {
        let ids = peers.iter().map(|(id, _)| Arc::clone(id)).collect();
        Link {
            acceptor: tokio_rustls::TlsAcceptor::from(tls.server),
            connector: tokio_rustls::TlsConnector::from(tls.client),
            pools: Default::default(),
            asker: tokio_rustls::TlsConnector::from(tls.asking),
            interval,
            peers,
            forwarding: Arc::new(Forwarding::new(ids, max_per_session)),
        }
    }

    /// Accept one link connection: its handshake, who the peer is, and
    /// its HTTP/2 preface, within ACCEPT_TIMEOUT; or answer a peer's
    /// question on what this member holds (`sessions`). A refusal is
    /// logged and counted here.
    pub async fn accept(
        &self,
        tcp: TcpStream,
        from: SocketAddr,
        sessions: &Sessions,
    ) -> Option<Linked> {
        let _ = tcp.set_nodelay(true);
        keep_alive(&tcp);
        let accepted = tokio::time::timeout(ACCEPT_TIMEOUT, self.arrive(tcp, sessions))
            .await
            .unwrap_or(Err(Refused::Link(LinkRefusal::AcceptTimeout)));
        match accepted {
            Ok(a) => a,
            Err(why) => {
                tracing::warn!(peer = %from, cause = why.as_str(), "member link connection refused");
                metrics::counter!("gateway_link_refused_total", "cause" => why.as_str())
                    .increment(1);
                None
            }
        }
    }

    async fn arrive(&self, tcp: TcpStream, sessions: &Sessions) -> Result<Option<Linked>, Refused> {
        let mut stream = self
            .acceptor
            .accept(tcp)
            .await
            .map_err(|_| Refused::Link(LinkRefusal::HandshakeFailed))?;
        let (peer, asking) = {
            let (_, tls) = stream.get_ref();
            let leaf = tls
                .peer_certificates()
                .and_then(|c| c.first())
                .ok_or(Refused::Link(LinkRefusal::HandshakeFailed))?;
            let peer = self.member(leaf)?;
            // rustls ends a handshake whose client offers protocols the
            // listener does not speak, but lets one that offers none
            // through: the link speaks nothing without one.
            let asking = match tls.alpn_protocol() {
                Some(crate::tls::HOLDINGS_ALPN) => true,
                Some(crate::tls::LINK_ALPN) => false,
                _ => return Err(Refused::Link(LinkRefusal::NoAlpn)),
            };
            (peer, asking)
        };
        if asking {
            let answer = serde_json::to_vec(&holdings(sessions)).unwrap_or_default();
            let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, &answer).await;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
            tracing::debug!(peer = %peer, "told a peer what this member holds");
            return Ok(None);
        }
        let conn = stream::server_builder()
            .handshake(stream)
            .await
            .map_err(|_| Refused::Link(LinkRefusal::NotHttp2))?;
        tracing::debug!(peer = %peer, "member link connection open");
        Ok(Some(Linked {
            peer,
            conn,
            slots: Arc::new(Slots::default()),
        }))
    }

    /// One stream of a link connection from `peer`, holding `slot` of
    /// its connection's for as long as it lives: its PROXY v2 header
    /// (within ACCEPT_TIMEOUT), then the answer that lets its bytes flow.
    /// A stream without a valid header is reset, logged and counted.
    pub async fn open_stream(
        &self,
        peer: Arc<str>,
        request: http::Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<Bytes>,
        slot: Slot,
    ) -> Option<Arrival> {
        let mut stream = LinkStream::new(None, request.into_body());
        stream.hold(slot);
        let header = match proxy::read(&mut stream, ACCEPT_TIMEOUT).await {
            Ok(h) => h,
            Err(e) => {
                refuse_stream(&peer, &Refused::Header(e));
                respond.send_reset(h2::Reason::REFUSED_STREAM);
                return None;
            }
        };
        let send = respond.send_response(http::Response::new(()), false).ok()?;
        stream.answer(send);
        Some(Arrival {
            stream,
            peer,
            header,
        })
    }

    /// Ask every peer once what it holds, waiting at most `within` in
    /// all: before anything is served, so that a member just started
    /// forwards from its first connection and DNS query where its peers
    /// hold what it does not. (A successor taken over is handed its
    /// predecessor's table instead: [`Forwarding::take_over`].)
    pub async fn ask_once(&self, within: Duration, sessions: &Sessions) {
        let asks = async {
            for (id, addr) in &self.peers {
                if let Ok(held) = self.ask(id, *addr).await {
                    self.forwarding
                        .replace_from_peer(id, &held, std::time::Instant::now());
                }
            }
        };
        let _ = tokio::time::timeout(within, asks).await;
        self.publish(sessions);
    }

    /// Set `gateway_forwarding_sessions`: the sessions the table names
    /// whose sources hold no live authority in `sessions` (this member's
    /// own), so that their connections are forwarded.
    pub fn publish(&self, sessions: &Sessions) {
        self.forwarding.publish(std::time::Instant::now(), |ip| {
            sessions.by_source(ip).is_some_and(|s| s.usable())
        });
    }

    /// Ask every peer, every interval, what it holds, until `stop`; each
    /// answer replaces that peer's word in the forwarding table. A peer
    /// that does not answer keeps what it said last, which lapses with
    /// the leases it named. Each interval also sets
    /// `gateway_forwarding_sessions` against what this member holds now
    /// (`sessions`: a session it holds again, after a resume, no longer
    /// counts), and closes link connections idle for [`LINK_IDLE`].
    pub async fn ask_peers(
        self: Arc<Self>,
        sessions: Arc<Sessions>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut every = tokio::time::interval(self.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            for (id, addr) in &self.peers {
                match tokio::time::timeout(CONNECT_TIMEOUT, self.ask(id, *addr)).await {
                    Ok(Ok(held)) => {
                        self.forwarding
                            .replace_from_peer(id, &held, std::time::Instant::now());
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(peer = %id, error = %e, "peer did not say what it holds");
                    }
                    Err(_) => tracing::debug!(peer = %id, "peer did not say what it holds in time"),
                }
            }
            self.publish(&sessions);
            self.retire_idle(std::time::Instant::now());
        }
    }

    async fn ask(&self, id: &str, addr: SocketAddr) -> std::io::Result<Vec<Holding>> {
        let tls = reach(&self.asker, id, addr).await?;
        let mut answer = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(
            &mut tokio::io::AsyncReadExt::take(tls, MAX_HOLDINGS_ANSWER),
            &mut answer,
        )
        .await?;
        serde_json::from_slice(&answer).map_err(std::io::Error::other)
    }

    /// The configured peer `leaf` names, if it carries the gateway role.
    fn member(&self, leaf: &rustls::pki_types::CertificateDer<'_>) -> Result<Arc<str>, Refused> {
        if !crate::tls::carries_role(leaf, talos_contract::role::GATEWAY) {
            return Err(Refused::Link(LinkRefusal::NotAGateway));
        }
        self.peers
            .iter()
            .find(|(id, _)| crate::tls::carries_role(leaf, id))
            .map(|(id, _)| Arc::clone(id))
            .ok_or(Refused::Link(LinkRefusal::NotAPeer))
    }

    /// Open a stream to holder `id` over the link and send `header`: the
    /// stream is ready for the session's bytes once the holder has
    /// answered. It goes on a link connection of the header's session to
    /// the holder with room for it ([`stream::MAX_STREAMS`]), made when
    /// none has (its first stream, one that filled, one that failed); the
    /// holder's certificate must name `id` and carry the gateway role.
    pub async fn connect(&self, id: &str, header: &Header) -> std::io::Result<Connected> {
        let addr = self
            .peers
            .iter()
            .find(|(p, _)| **p == *id)
            .map(|(_, a)| *a)
            .ok_or_else(|| std::io::Error::other("not a configured peer"))?;
        let bytes = Bytes::from(header.encode().map_err(std::io::Error::other)?);
        let pool = self.pool(id, header.session.as_ref().map(|(s, _)| s.as_str()));
        let mut used = None;
        let opening = async {
            let (chan, slot) = self.place(&pool, id, addr).await?;
            used = Some(chan.clone());
            // A link connection made before may have ended meanwhile (the
            // holder drained it for an upgrade: GOAWAY, its new streams
            // refused unprocessed), or the holder refused the stream on it
            // (past its bound): then once more, on another.
            match open_on(chan.send.clone(), bytes.clone()).await {
                Ok(mut stream) => {
                    stream.hold(slot);
                    Ok(stream)
                }
                Err(e) if e.retry => {
                    tracing::debug!(peer = %id, error = %e.error, "member link stream refused unprocessed; on another connection");
                    drop(slot);
                    pool.retire(&chan);
                    let (chan, slot) = self.place(&pool, id, addr).await?;
                    used = Some(chan.clone());
                    let mut stream = open_on(chan.send.clone(), bytes)
                        .await
                        .map_err(|e| e.error)?;
                    stream.hold(slot);
                    Ok(stream)
                }
                Err(e) => Err(e.error),
            }
        };
        let opened = tokio::time::timeout(CONNECT_TIMEOUT, opening)
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "timed out",
                ))
            });
        if opened.is_err() {
            // The session's next stream goes on another connection.
            if let Some(chan) = &used {
                pool.retire(chan);
            }
        }
        opened
    }

    /// The pool of link connections to peer `id` for `session`.
    fn pool(&self, id: &str, session: Option<&str>) -> Arc<Pool> {
        let session = session.unwrap_or("");
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pool) = pools.get(id).and_then(|p| p.get(session)) {
            return Arc::clone(pool);
        }
        let pool = Arc::new(Pool::default());
        pools
            .entry(Arc::from(id))
            .or_default()
            .insert(Arc::from(session), Arc::clone(&pool));
        pool
    }

    /// A place for a stream on one of `pool`'s connections to peer `id`
    /// at `addr`, on a new connection if none has room.
    async fn place(
        &self,
        pool: &Pool,
        id: &str,
        addr: SocketAddr,
    ) -> std::io::Result<(Channel, Slot)> {
        if let Some(placed) = pool.take() {
            return Ok(placed);
        }
        let _making = pool.making.lock().await;
        // Another stream of the session may have made one meanwhile.
        if let Some(placed) = pool.take() {
            return Ok(placed);
        }
        let chan = Channel {
            send: self.dial(id, addr).await?,
            slots: Arc::new(Slots::default()),
        };
        let slot = chan
            .slots
            .take()
            .ok_or_else(|| std::io::Error::other("a new link connection has no room"))?;
        pool.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(chan.clone());
        Ok((chan, slot))
    }

    /// A new link connection to peer `id` at `addr`.
    async fn dial(
        &self,
        id: &str,
        addr: SocketAddr,
    ) -> std::io::Result<h2::client::SendRequest<Bytes>> {
        let tls = reach(&self.connector, id, addr).await?;
        keep_alive(tls.get_ref().0);
        let (channel, conn) = stream::client_builder()
            .handshake(tls)
            .await
            .map_err(h2_io)?;
        let peer = id.to_owned();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::info!(peer = %peer, error = %e, "member link connection ended");
            }
        });
        tracing::debug!(peer = %id, "member link connection made");
        Ok(channel)
    }

    /// Close the link connections that have carried no stream for
    /// [`LINK_IDLE`] at `now` (their HTTP/2 sender dropped: the
    /// connection ends), and forget sessions that have none left.
    pub fn retire_idle(&self, now: std::time::Instant) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        for sessions in pools.values_mut() {
            sessions.retain(|_, pool| {
                let mut conns = pool.conns.lock().unwrap_or_else(|e| e.into_inner());
                conns.retain(|c| c.slots.idle_for(now).is_none_or(|idle| idle < LINK_IDLE));
                // Kept while a stream is being placed on it (the map's is
                // then not the only reference).
                !conns.is_empty() || Arc::strong_count(pool) > 1
            });
        }
        pools.retain(|_, sessions| !sessions.is_empty());
    }
}

/// Open one stream on `channel`, its body starting with `header`, and
/// wait for the holder's answer.
async fn open_on(
    channel: h2::client::SendRequest<Bytes>,
    header: Bytes,
) -> Result<LinkStream, OpenError> {
    let mut channel = channel.ready().await.map_err(OpenError::retry)?;
    let request = http::Request::post("https://link/")
        .body(())
        .map_err(|e| OpenError::fatal(std::io::Error::other(e)))?;
    let (response, mut send) = channel
        .send_request(request, false)
        .map_err(OpenError::retry)?;
    // The header is at most proxy::MAX_HEADER bytes, within any stream's
    // first window: sent without waiting for capacity.
    send.send_data(header, false).map_err(OpenError::retry)?;
    let response = response.await.map_err(OpenError::retry)?;
    if response.status() != http::StatusCode::OK {
        return Err(OpenError::fatal(std::io::Error::other(format!(
            "the holder answered {}",
            response.status()
        ))));
    }
    Ok(LinkStream::new(Some(send), response.into_body()))
}

/// Why a stream could not be opened, and whether a new link connection
/// may succeed where this one failed: the connection ended, or the stream
/// was refused unprocessed (REFUSED_STREAM, or past a GOAWAY), so the
/// holder has not seen its header.
#[derive(Debug)]
struct OpenError {
    error: std::io::Error,
    retry: bool,
}

impl OpenError {
    fn retry(e: h2::Error) -> OpenError {
        let retry = e.is_go_away()
            || e.is_io()
            || e.reason() == Some(h2::Reason::REFUSED_STREAM)
            || (e.is_library() && e.reason().is_none());
        OpenError {
            error: h2_io(e),
            retry,
        }
    }

    fn fatal(error: std::io::Error) -> OpenError {
        OpenError {
            error,
            retry: false,
        }
    }
}

fn h2_io(e: h2::Error) -> std::io::Error {
    if e.is_io() {
        e.into_io()
            .unwrap_or_else(|| std::io::Error::other("link I/O error"))
    } else {
        std::io::Error::other(e)
    }
}

/// TCP keep-alive on a link connection: a peer gone without a word is
/// found by the kernel, and its streams fail, within about a minute.
pub fn keep_alive(tcp: &TcpStream) {
    let probes = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10))
        .with_retries(3);
    let _ = socket2::SockRef::from(tcp).set_tcp_keepalive(&probes);
}

/// TLS with peer `id` at `addr` through `connector`: its certificate must
/// name `id` (the verifier checks it) and carry the gateway role.
async fn reach(
    connector: &tokio_rustls::TlsConnector,
    id: &str,
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let name = rustls::pki_types::ServerName::try_from(id.to_owned())
        .map_err(|_| std::io::Error::other("peer id is no server name"))?;
    let tcp = TcpStream::connect(addr).await?;
    // A peer down, its port in the ephemeral range: the kernel may hand
    // the dial that very port as its source, and TCP's simultaneous open
    // connects the socket to itself, which would hold the peer's port
    // against its restart. Such a connection is closed at once.
    if tcp.local_addr().ok() == Some(addr) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "the dial connected to itself (the peer is down)",
        ));
    }
    let _ = tcp.set_nodelay(true);
    let tls = connector.connect(name, tcp).await?;
    let carries = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .is_some_and(|leaf| crate::tls::carries_role(leaf, talos_contract::role::GATEWAY));
    if !carries {
        return Err(std::io::Error::other(
            "the peer's certificate does not carry the gateway role",
        ));
    }
    Ok(tls)
}

/// The authorities this member holds live under a lease, each with its
/// sources and what is left of its lease (static sessions have no lease
/// and are every member's own).
fn holdings(sessions: &Sessions) -> Vec<Holding> {
    sessions
        .snapshot()
        .into_iter()
        .filter(|(s, _)| s.lease.is_leased() && s.lease.live() && s.usable())
        .filter_map(|(s, sources)| {
            let left = s.lease.left()?;
            Some(Holding {
                session_id: s.id.to_string(),
                attempt: s.attempt,
                tenant: s.tenant.to_string(),
                sources: sources.iter().map(ToString::to_string).collect(),
                lease_ms_left: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
            })
        })
        .collect()
}
