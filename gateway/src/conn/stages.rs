//! The stages of one connection, each deciding what the next needs or a
//! refusal that ends it, and the one place a connection's end is written
//! down ([`super`] says how they run).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::gate::hello::HelloLimits;
use crate::gate::name::{self, Name};
use crate::gate::resolve::{Resolution, Resolver};
use crate::http::connection::{Connection, Destination, Target};
use crate::io::counted::{Counted, WireBytes};
use crate::io::replay::Replay;
use crate::pair::forwarding::ForwardResult;
use crate::records::record::Record;
use crate::refusal::{causes, Refusal, Refused};
use crate::serving::Context;
use crate::session::sessions::{Live, Session};
use crate::session::share::Slot;

use super::client::{Client, ClientStream, SessionTls};
use super::ending::{refused, stopped, Cause, Ending, Stop};

causes! {
    /// Why a session's TLS handshake failed, in a few words fit for a
    /// metric label (the `cause` of `gateway_session_handshake_failures_total`):
    /// the alert the client sent (`unknown_ca`: it does not trust the
    /// session CA; `bad_certificate`, `certificate_unknown`, …), `eof` (it
    /// closed), `tls_error` (anything else rustls refused), `io_error`, or
    /// `timeout` (the handshake took longer than `handshake_timeout_ms`).
    pub enum HandshakeFailure {
        Eof => "eof",
        UnknownCa => "unknown_ca",
        BadCertificate => "bad_certificate",
        CertificateUnknown => "certificate_unknown",
        CertificateExpired => "certificate_expired",
        CertificateRevoked => "certificate_revoked",
        UnsupportedCertificate => "unsupported_certificate",
        AccessDenied => "access_denied",
        HandshakeAlert => "handshake_failure",
        ProtocolVersion => "protocol_version",
        NoApplicationProtocol => "no_application_protocol",
        DecryptError => "decrypt_error",
        UserCanceled => "user_canceled",
        OtherAlert => "other_alert",
        TlsError => "tls_error",
        IoError => "io_error",
        Timeout => "timeout",
    }
}

/// The [`HandshakeFailure`] of a failed TLS accept.
fn handshake_failure(e: &std::io::Error) -> HandshakeFailure {
    use rustls::AlertDescription as A;
    use HandshakeFailure as F;
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        return F::Eof;
    }
    match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::AlertReceived(alert)) => match alert {
            A::UnknownCA => F::UnknownCa,
            A::BadCertificate => F::BadCertificate,
            A::CertificateUnknown => F::CertificateUnknown,
            A::CertificateExpired => F::CertificateExpired,
            A::CertificateRevoked => F::CertificateRevoked,
            A::UnsupportedCertificate => F::UnsupportedCertificate,
            A::AccessDenied => F::AccessDenied,
            A::HandshakeFailure => F::HandshakeAlert,
            A::ProtocolVersion => F::ProtocolVersion,
            A::NoApplicationProtocol => F::NoApplicationProtocol,
            A::DecryptError => F::DecryptError,
            A::UserCanceled => F::UserCanceled,
            _ => F::OtherAlert,
        },
        Some(_) => F::TlsError,
        None => F::IoError,
    }
}

/// The TLS alert a refusal before the handshake sends first, where the
/// client has shown it speaks TLS: its error then names the kind of failure.
fn alert_for(reason: Refusal) -> Option<Alert> {
    match reason {
        Refusal::NoServerName | Refusal::NotOnAllowlist => Some(Alert::UnrecognizedName),
        Refusal::EncryptedClientHello => Some(Alert::HandshakeFailure),
        Refusal::ResolvesInternal => Some(Alert::AccessDenied),
        Refusal::UpstreamFailed => Some(Alert::InternalError),
        _ => None,
    }
}

/// TLS alert descriptions the gateway sends (RFC 8446 §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Alert {
    HandshakeFailure = 40,
    AccessDenied = 49,
    InternalError = 80,
    UnrecognizedName = 112,
}

/// One connection as its stages see it: what it is served with, its
/// client, and what its record has learnt so far. Owned by [`serve`];
/// each stage takes it, fills in what it learns and returns what it
/// decided.
struct Conn<'a, S> {
    cx: &'a Context,
    client: Client<S>,
    peer: SocketAddr,
    record: Record,
    /// Counts the connection on its session until its record is written.
    live: Option<Live>,
    /// A connection a peer forwarded over the member link: the peer, and
    /// the session and attempt it forwarded for. Never forwarded again.
    via: Option<Via>,
    /// The client's sending side is shut already: a relay passed the
    /// holder's end on (a second shutdown would only fail).
    client_shut: bool,
}

/// Who forwarded a connection over the member link, and for what.
#[derive(Debug)]
struct Via {
    peer: Arc<str>,
    session: Option<(String, u32)>,
}

/// Serve one client connection and write its record.
///
/// The record is on disk before the connection counts as closed: before a
/// refusal's alert and close reach the client, before the connection's
/// slot and its session's count of open connections are given back
/// ([`crate::records::journal`]).
///
/// The socket comes with its options set: it inherits them from the data
/// listener ([`session_socket_options`]).
pub async fn serve(cx: &Context, client: TcpStream, peer: SocketAddr) {
    serve_stream(cx, client, peer, None).await;
}

/// Serve a connection a peer forwarded over the member link
/// ([`crate::member_link::link`]): judged exactly as a direct one from the
/// header's source, its record saying which peer it came through.
pub async fn serve_forwarded(cx: &Context, arrival: crate::member_link::link::Arrival) {
    let via = Via {
        peer: arrival.peer,
        session: arrival.header.session,
    };
    serve_stream(cx, arrival.stream, arrival.header.source, Some(via)).await;
}

async fn serve_stream<S: ClientStream>(
    cx: &Context,
    client: S,
    peer: SocketAddr,
    via: Option<Via>,
) {
    metrics::gauge!("gateway_connections_open").increment(1.0);
    // Boxed as the stages are: the opening's future (the record being
    // made, its line, the queue's permit) would size the task otherwise.
    let mut record = Box::pin(cx.records.open(peer)).await;
    record.via = via.as_ref().map(|v| Arc::clone(&v.peer));
    let wire = Arc::new(WireBytes::default());
    let mut conn = Conn {
        cx,
        client: Counted::new(client, Arc::clone(&wire)),
        peer,
        record,
        live: None,
        via,
        client_shut: false,
    };
    // Boxed: held inline, the stages' future would be laid out here twice
    // over (once as built, once as awaited), in every connection's task.
    let outcome = Box::pin(conn.run()).await;
    // Boxed too: the connection moves into its close, and inline the
    // task would keep room for it twice over for its whole life.
    Box::pin(conn.close(outcome, &wire)).await;
    metrics::gauge!("gateway_connections_open").decrement(1.0);
}

impl<S: ClientStream> Conn<'_, S> {
    /// The stages, in order.
    async fn run(&mut self) -> Result<Ending, Refused> {
        // Forwarding is boxed, as the other long stages are: its state
        // (the link's TLS stream, the relay's buffers) is not carried in
        // every connection's future.
        let session = match self.session() {
            Ok(session) => session,
            Err(refusal) => return Box::pin(self.forward_or(refusal)).await,
        };
        if !session.lease.live() {
            if session.lease.lapsed() {
                // Lapsed here while a peer kept it: the peer may hold it.
                let lapsed = refused(Refusal::SessionEnded, Cause::LeaseExpired);
                return Box::pin(self.forward_or(lapsed)).await;
            }
            return Err(refused(Refusal::SessionEnded, Cause::SuspendedAfterFreeze));
        }
        // A peer forwards for the authority its header names: served only
        // if that is the one held live here for the source.
        if let Some(via) = &self.via {
            if let Some((id, attempt)) = &via.session {
                use crate::member_link::link::LinkRefusal;
                let mismatch = if **id != *session.id {
                    Some((LinkRefusal::SessionMismatch, Cause::LinkSessionMismatch))
                } else if *attempt != session.attempt {
                    Some((LinkRefusal::AttemptMismatch, Cause::LinkAttemptMismatch))
                } else {
                    None
                };
                if let Some((why, cause)) = mismatch {
                    crate::member_link::link::mismatch(
                        why,
                        &via.peer,
                        (id, *attempt),
                        (&session.id, session.attempt),
                    );
                    return Err(refused(Refusal::UnknownSource, cause));
                }
            }
        }
        // The session's share: counted open, and in its handshake until TLS is up.
        let (_open, handshake) = session.share.connect().map_err(|at| at.refused())?;
        let mut first_bytes = Vec::new();
        let name = self.read_hello(&mut first_bytes).await?;
        let destination = self.destination(&session, &name).await?;
        if session.passes_through(&name) {
            if let Destination::Origin { addrs, .. } = &destination {
                tracing::debug!(source = %self.peer, session = %session.id, sni = %name, "allowed, passthrough");
                return Box::pin(self.pass_through(&session, first_bytes, handshake, addrs)).await;
            }
        }
        tracing::debug!(source = %self.peer, session = %session.id, sni = %name, "allowed");
        // The opening goes on the record with its session and name; it is
        // written before the first request is read (see `terminate`).
        let journaled = self.cx.records.let_through(&self.record).await;
        let (conn, tally) =
            Connection::new(Arc::clone(&self.cx.gateway_id), session, name, destination);
        let conn = Arc::new(conn);
        let ending = Box::pin(self.terminate(first_bytes, handshake, &conn, journaled)).await;
        drop(conn);
        self.record.absorb(tally.when_done(REPORTS_WAIT).await);
        ending
    }

    /// The one place a connection's end is written down: a refusal's log
    /// line, verdict and alert, or the cause of an ending, the bytes, then
    /// the record (on disk before the client hears of it), then the close.
    async fn close(mut self, outcome: Result<Ending, Refused>, wire: &WireBytes) {
        let mut alert = None;
        match outcome {
            Ok(ending) => {
                if let Some(cause) = ending.cause() {
                    self.record.cause = Some(cause);
                }
                self.record.cut = ending == Ending::Cut;
            }
            Err(refused) => {
                // A session pushing at a bound of its share is recorded and
                // counted; logged at debug, so that a flood does not become
                // one of log lines.
                if refused.reason == Refusal::SessionLimit {
                    tracing::debug!(source = %self.peer, cause = %refused.cause, "refused at a bound of the session's share");
                } else {
                    tracing::info!(
                        source = %self.peer,
                        session = self.record.session_id.as_deref().unwrap_or("-"),
                        sni = self.record.sni.as_deref().unwrap_or("-"),
                        reason = refused.reason.as_str(),
                        cause = %refused.cause,
                        "refused"
                    );
                }
                alert = alert_for(refused.reason);
                self.record.refuse(refused);
            }
        }
        let record = &mut self.record;
        record.bytes_from_session = wire.read.load(Ordering::Relaxed);
        record.bytes_to_session = wire.written.load(Ordering::Relaxed)
            + if alert.is_some() { ALERT_LEN as u64 } else { 0 };
        // Boxed too: handing the record over takes a future that holds the
        // record twice, and its room would be kept in every idle
        // connection's task (beside the record itself) for nothing.
        Box::pin(self.cx.records.close(self.record)).await;
        if let Some(alert) = alert {
            send_alert(&mut self.client, alert).await;
        }
        if !self.client_shut {
            let _ = self.client.shutdown().await;
        }
        drop(self.live);
    }

    /// Stage 1: the session is named by the connection's source address;
    /// the connection counts on it from here.
    fn session(&mut self) -> Result<Arc<Session>, Refused> {
        let live = self
            .cx
            .sessions
            .track_by_source(self.peer.ip())
            .ok_or(refused(Refusal::UnknownSource, Cause::NoSessionForSource))?;
        let session = Arc::clone(self.live.insert(live).session());
        self.record.session_id = Some(Arc::clone(&session.id));
        self.record.attempt = Some(session.attempt);
        self.record.tenant = Some(Arc::clone(&session.tenant));
        Ok(session)
    }

    /// A connection this member holds no live authority for: if a peer
    /// holds its session (the forwarding table, [`crate::pair::forwarding`])
    /// and it did not itself come over the member link, check what can be
    /// checked without decrypting (the hello parses and names a host, no
    /// encrypted hello), then hand its bytes, untouched, to a holder, with
    /// its source in the link's header. Otherwise `refusal` stands.
    async fn forward_or(&mut self, refusal: Refused) -> Result<Ending, Refused> {
        if self.via.is_some() {
            return Err(refusal);
        }
        let Some(link) = self.cx.link.clone() else {
            return Err(refusal);
        };
        let Some(entry) = link.forwarding.lookup(self.peer.ip(), Instant::now()) else {
            return Err(refusal);
        };
        // Not a connection of an authority here.
        self.live = None;
        self.record.session_id = Some(Arc::clone(&entry.session_id));
        self.record.attempt = Some(entry.attempt);
        self.record.tenant = Some(Arc::clone(&entry.tenant));
        let Some(_forwarded) = link.forwarding.admit(&entry) else {
            ForwardResult::SessionLimit.count();
            return Err(refused(Refusal::SessionLimit, Cause::ForwardedAtBound));
        };
        let mut first_bytes = Vec::new();
        self.read_hello(&mut first_bytes).await?;
        let header = crate::pair::proxy::Header {
            source: self.peer,
            destination: self.destination_addr(),
            session: Some((entry.session_id.to_string(), entry.attempt)),
            service: crate::pair::proxy::Service::Tls,
        };
        let mut reached = None;
        for holder in &entry.holders {
            match link.connect(holder, &header).await {
                Ok(stream) => {
                    reached = Some((Arc::clone(holder), stream));
                    break;
                }
                Err(e) => {
                    tracing::warn!(holder = %holder, session = %entry.session_id, error = %e, "holder unreachable over the member link");
                }
            }
        }
        let Some((holder, mut upstream)) = reached else {
            ForwardResult::HolderUnreachable.count();
            return Err(refused(Refusal::UpstreamFailed, Cause::HolderUnreachable));
        };
        ForwardResult::Forwarded.count();
        tracing::debug!(source = %self.peer, session = %entry.session_id, holder = %holder, "forwarded");
        self.record.forwarded_to = Some(holder);
        self.cx.records.let_through(&self.record).await.wait().await;
        if upstream.write_all(&first_bytes).await.is_err() {
            return Ok(Ending::Closed);
        }
        drop(first_bytes);
        // The bytes as they are, both ways, until either side closes or
        // the drain's grace runs out (the holder drains its end itself).
        tokio::select! {
            relayed = crate::io::relay::relay(&mut self.client, &mut upstream, RELAY_BUFFER) => {
                match relayed {
                    // Both ends passed on: the client's side is shut.
                    Ok(()) => self.client_shut = true,
                    Err(e) => tracing::debug!(error = %e, "forwarded connection ended with an error"),
                }
            }
            () = self.cx.shutdown.cut.cancelled() => return Ok(Ending::Cut),
        }
        Ok(Ending::Closed)
    }

    /// Stage 5 of a passthrough destination, in place of the TLS accept:
    /// a TCP connection to the address the gate checked (never a second
    /// lookup), the hello's bytes first, then every byte both ways as it
    /// is — inside the kernel (`splice(2)`) when the session's side is a
    /// plain socket, by the copy relay when it came over the member link —
    /// until both sides end, nothing moves for [`PASSTHROUGH_IDLE`], the
    /// session's authority ends (`session_ended`) or the drain's grace
    /// runs out. Nothing is decrypted: no leaf of the session's CA, no
    /// request seen; the record has the connection's address, times and
    /// bytes, and says `passthrough`.
    async fn pass_through(
        &mut self,
        session: &Arc<Session>,
        first_bytes: Vec<u8>,
        handshake: Slot,
        addrs: &[IpAddr],
    ) -> Result<Ending, Refused> {
        self.record.passthrough = true;
        let dialed = tokio::select! {
            dialed = session.pool.dial_tcp(addrs) => dialed,
            () = session.ended.cancelled() => {
                return Err(refused(Refusal::SessionEnded, Cause::EndedBeforeTls));
            }
        };
        let (upstream, addr) =
            dialed.map_err(|f| Refused::new(Refusal::UpstreamFailed, f.as_str()))?;
        self.record.resolved = Some(addr);
        // Past the handshake's stage: it counts as open on the share alone.
        drop(handshake);
        // The opening is on the record before a byte is passed on.
        self.cx.records.let_through(&self.record).await.wait().await;
        let stop = stopped(self.cx.shutdown.clone(), Arc::clone(session), true);
        tokio::pin!(stop);
        let relayed = async {
            let mut upstream = upstream;
            upstream.write_all(&first_bytes).await?;
            drop(first_bytes);
            if let Some(client) = self.client.get_ref().socket() {
                metrics::counter!("gateway_passthrough_total", "relay" => "splice").increment(1);
                crate::io::splice::relay(client, &upstream, self.client.bytes(), PASSTHROUGH_IDLE)
                    .await
            } else {
                metrics::counter!("gateway_passthrough_total", "relay" => "copy").increment(1);
                copy_until_idle(&mut self.client, upstream, PASSTHROUGH_IDLE).await
            }
        };
        // The drain's start does not end it (its TLS is not the gateway's
        // to close gracefully): it runs until its end, or the grace's,
        // where it is cut as a terminated connection is (`stop` was made
        // `told`: the drain's start is not among its events).
        let ended = tokio::select! {
            relayed = relayed => relayed,
            stopped = &mut stop => match stopped {
                Stop::Ended(cause) => return Err(refused(Refusal::SessionEnded, cause)),
                Stop::Cut | Stop::Drain => return Ok(Ending::Cut),
            },
        };
        match ended {
            Ok(crate::io::splice::Relayed::Ended) => {
                // Both ends passed on: the client's side is shut.
                self.client_shut = true;
                Ok(Ending::Closed)
            }
            Ok(crate::io::splice::Relayed::Idle) => Ok(Ending::Idle),
            Err(e) => {
                tracing::debug!(error = %e, "passthrough connection ended with an error");
                Ok(Ending::Closed)
            }
        }
    }

    /// The address the session connected to, for the link's header: the
    /// data listener's side of the socket, in the source's family.
    fn destination_addr(&self) -> SocketAddr {
        let local = self
            .client
            .get_ref()
            .socket()
            .and_then(|s| s.local_addr().ok());
        match local {
            Some(l) if l.is_ipv4() == self.peer.is_ipv4() => l,
            _ => {
                let ip: IpAddr = if self.peer.is_ipv4() {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                };
                SocketAddr::new(ip, 443)
            }
        }
    }

    /// Stage 2: read the ClientHello (bounded in bytes and time) and name
    /// its destination. The bytes read are kept in `first_bytes`: they
    /// belong to the connection and go on to the next stage.
    async fn read_hello(&mut self, first_bytes: &mut Vec<u8>) -> Result<Name, Refused> {
        let limits = HelloLimits {
            max_bytes: self.cx.hello_max_bytes,
            deadline: self.cx.hello_timeout,
        };
        let read = crate::gate::capture::read_hello(&mut self.client, first_bytes, limits).await;
        metrics::histogram!("gateway_hello_bytes").record(first_bytes.len() as f64);
        self.record.alpn_offered = read.alpn.clone();
        self.record.sni = read.sni.clone();
        if let Err(cause) = read.verdict {
            return Err(Refused::new(cause.refusal(), cause.as_str()));
        }
        let sni = read.sni.unwrap_or_default();
        match name::canonicalize(&sni) {
            Ok(name) => {
                self.record.sni = Some(name.as_str().to_owned());
                Ok(name)
            }
            Err(e) => {
                let cause = match e {
                    name::NameError::IpLiteral { .. } => Cause::SniIsIpLiteral,
                    _ => Cause::SniNotAHostName,
                };
                Err(refused(Refusal::NoServerName, cause))
            }
        }
    }

    /// Stages 3 and 4: what the destination is. approvals.hangar.internal
    /// is answered by the gateway itself: on every session's CA, never
    /// resolved, never forwarded. Any other name must be exactly on the
    /// session's allowlist, and resolve to public addresses only.
    async fn destination(
        &mut self,
        session: &Session,
        name: &Name,
    ) -> Result<Destination, Refused> {
        if name.as_str() == talos_certs::APPROVALS_NAME {
            return Ok(Destination::Approvals);
        }
        if !session.allows(name) {
            return Err(refused(Refusal::NotOnAllowlist, Cause::NotListed));
        }
        // Boxed, as is `terminate`: a future keeps the size of its largest
        // stage for its whole life, and an idle connection should not pay
        // for the resolver's state.
        let addrs = Box::pin(resolve(&self.cx.resolver, name, &mut self.record)).await?;
        Ok(Destination::Origin {
            target: Target::new(name),
            addrs,
        })
    }

    /// Stage 5: TLS with the session — TLS 1.3, a leaf of the session's
    /// own CA for the hello's name — then HTTP/2 or HTTP/1.1 as ALPN
    /// chose, each request through [`crate::http::serve`], until the
    /// session closes, the connection fails, or the gateway drains.
    async fn terminate(
        &mut self,
        first_bytes: Vec<u8>,
        handshake: Slot,
        conn: &Arc<Connection>,
        journaled: crate::records::journal::Written,
    ) -> Result<Ending, Refused> {
        let cx = self.cx;
        let mut tls = match accept_tls(cx, &mut self.client, first_bytes, handshake, conn).await? {
            Ok(tls) => tls,
            Err(ending) => return Ok(ending),
        };
        let (_, rustls_conn) = tls.get_mut();
        rustls_conn.set_buffer_limit(Some(crate::tls::SESSION_SEND_LIMIT));
        self.record.tls_version = rustls_conn.protocol_version().map(|v| match v {
            rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
            _ => "other",
        });
        let h2 = rustls_conn.alpn_protocol() == Some(b"h2");
        self.record.alpn_session = Some(if h2 { "h2" } else { "http/1.1" });
        // No request is read before the connection's opening is written: a
        // crash from here on leaves it on the record, cut by the crash. The
        // line went to the writer before the handshake, so this rarely waits.
        journaled.wait().await;
        super::drive::http(cx, tls, h2, conn).await
    }
}

/// Resolve the name and refuse it if any answer is internal.
async fn resolve(
    resolver: &Resolver,
    name: &Name,
    record: &mut Record,
) -> Result<Vec<IpAddr>, Refused> {
    let started = Instant::now();
    let resolution = resolver.resolve(name).await;
    metrics::histogram!("gateway_resolve_seconds").record(started.elapsed().as_secs_f64());
    match resolution {
        Resolution::Public(addrs) => Ok(addrs),
        Resolution::Internal { addr, class } => {
            record.internal_answer = Some(addr);
            Err(Refused::new(Refusal::ResolvesInternal, class.cause()))
        }
        Resolution::Failed(f) => Err(Refused::new(Refusal::UpstreamFailed, f.as_str())),
    }
}

/// The session's TLS stream, once its handshake is done.
/// The TLS handshake with the session: the stream, or how the connection
/// ended without one (no refusal: rustls has sent its own alert).
async fn accept_tls<'c, S: ClientStream>(
    cx: &Context,
    client: &'c mut Client<S>,
    first_bytes: Vec<u8>,
    handshake: Slot,
    conn: &Connection,
) -> Result<Result<SessionTls<'c, S>, Ending>, Refused> {
    // The authority may have ended while the hello was read or the name
    // resolved: no handshake with a dropped CA.
    if conn.session.ended.is_cancelled() {
        return Err(refused(Refusal::SessionEnded, Cause::EndedBeforeTls));
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&conn.session.tls));
    // The handshake's state lives on the heap for the handshake only: held
    // inline, it would set the size of this future (and so the memory of
    // every idle connection) for the connection's whole life. The stream
    // it yields is boxed inside it for the same reason.
    let accept = Box::pin(async move {
        let accept = acceptor.accept(Replay::new(first_bytes, client));
        let accepted = tokio::time::timeout(cx.handshake_timeout, accept).await;
        accepted.map(|tls| tls.map(Box::new))
    });
    let accepted = tokio::select! {
        accepted = accept => accepted,
        _ = conn.session.ended.cancelled() => {
            return Err(refused(Refusal::SessionEnded, Cause::EndedDuringTls));
        }
    };
    drop(handshake);
    Ok(match accepted {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => {
            let why = handshake_failure(&e).as_str();
            tracing::info!(session = %conn.session.id, sni = %conn.name, error = %e, cause = why, "session TLS handshake failed");
            metrics::counter!("gateway_session_handshake_failures_total", "cause" => why)
                .increment(1);
            Err(Ending::HandshakeFailed)
        }
        Err(_) => {
            metrics::counter!(
                "gateway_session_handshake_failures_total",
                "cause" => HandshakeFailure::Timeout.as_str()
            )
            .increment(1);
            Err(Ending::HandshakeTimeout)
        }
    })
}

/// Each direction's buffer of a forwarded connection's relay: larger than
/// tokio's 8 KiB default, so that a download moves in fewer, larger reads
/// and writes (and the link's TLS records are full: 16 KiB).
const RELAY_BUFFER: usize = 64 * 1024;

/// How long a passthrough connection may move no byte either way before it
/// is closed (cause `passthrough_idle`). Its requests are not the
/// gateway's to see, so no HTTP idle timeout applies; this bounds what a
/// silent connection holds of its session's share. Ten minutes leaves a
/// long-running model call's stream (which sends its own keep-alive
/// events) untouched and closes a connection its client forgot.
pub const PASSTHROUGH_IDLE: Duration = Duration::from_secs(600);

/// The copy relay for a passthrough connection whose session side is no
/// plain socket (it came over the member link): the bytes as they are,
/// both ways, until both ends pass on, either side fails, or nothing moves
/// for `idle` (found within twice `idle`: the counts are compared once per
/// `idle`).
async fn copy_until_idle<S: ClientStream>(
    client: &mut Client<S>,
    upstream: TcpStream,
    idle: Duration,
) -> std::io::Result<crate::io::splice::Relayed> {
    // The relay holds the client: its counts are read through the shared
    // counters.
    let counts = client.shared_bytes();
    let moved = || counts.read.load(Ordering::Relaxed) + counts.written.load(Ordering::Relaxed);
    let mut last = moved();
    let mut far = crate::io::relay::Plain::new(upstream, RELAY_BUFFER);
    let relay = crate::io::relay::relay(client, &mut far, RELAY_BUFFER);
    tokio::pin!(relay);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + idle, idle);
    loop {
        tokio::select! {
            relayed = &mut relay => return relayed.map(|()| crate::io::splice::Relayed::Ended),
            _ = tick.tick() => {}
        }
        let now = moved();
        if now == last {
            return Ok(crate::io::splice::Relayed::Idle);
        }
        last = now;
    }
}

/// How long a closed connection's record waits for its last requests and
/// replies to report (HTTP/2 replies end in tasks of their own).
const REPORTS_WAIT: Duration = Duration::from_secs(1);

/// The options every session socket gets, set once on the data listener:
/// Linux gives each socket a listener accepts the listener's options, so
/// no connection pays a system call for them (five per connection when
/// each accepted socket was set alone). A reload sets them again for the
/// sockets accepted after it.
///
/// - `TCP_NODELAY`: small TLS records (handshake, HTTP/2 frames, the last
///   bytes of a reply) go out at once instead of waiting out the peer's
///   delayed ACK.
/// - TCP keep-alive probes after `idle` of silence, `idle / 3` apart,
///   three of them: a peer gone without a word (its host down, the
///   network cut) is found within twice `idle`, by the kernel, at no cost
///   per request. HTTP/2 PINGs would find it too, but hyper's keep-alive
///   takes a lock and reads the clock at every frame of every connection
///   (about 9 % of an HTTP/2 request's CPU in
///   `benches/load/gateway-ab.sh`).
pub fn session_socket_options(listener: &tokio::net::TcpListener, idle: Duration) {
    let probes = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval((idle / 3).max(Duration::from_secs(1)))
        .with_retries(3);
    let socket = socket2::SockRef::from(listener);
    if let Err(e) = socket
        .set_tcp_nodelay(true)
        .and_then(|()| socket.set_tcp_keepalive(&probes))
    {
        tracing::warn!(error = %e, "cannot set the data listener's socket options");
    }
}

const ALERT_LEN: usize = 7;

/// A fatal alert in a plaintext TLS record: the handshake has not started,
/// so nothing is encrypted yet.
async fn send_alert<S: ClientStream>(client: &mut Client<S>, alert: Alert) {
    let bytes: [u8; ALERT_LEN] = [21, 3, 3, 0, 2, 2, alert as u8];
    let _ = tokio::time::timeout(Duration::from_secs(1), client.write_all(&bytes)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every session connection's task is as large as its future's largest
    /// state, for its whole life, idle or not: a stage held inline rather
    /// than boxed once cost each idle connection 8 KiB
    /// (`benches/compare/README.md`). The bound is on the type's size, so
    /// it holds on any machine.
    #[test]
    fn a_session_connections_future_stays_small() {
        fn future_size<'a, F, R>(_: F) -> usize
        where
            F: Fn(&'a Context, TcpStream, SocketAddr) -> R,
        {
            std::mem::size_of::<R>()
        }
        let size = future_size(serve);
        assert!(size <= 2048, "conn::serve's future is {size} bytes");
    }

    /// Every socket the data listener accepts has the options set on the
    /// listener (Linux copies them): none is set per connection.
    #[tokio::test]
    async fn an_accepted_socket_has_the_listeners_options() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        session_socket_options(&listener, Duration::from_secs(45));
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let s = socket2::SockRef::from(&accepted);
        assert!(s.tcp_nodelay().unwrap());
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(45));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(15));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 3);
        drop(client);
    }
}
