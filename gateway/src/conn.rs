//! One connection, top to bottom.
//!
//! [`serve`] runs the stages in the order a connection meets them — session
//! by source address, ClientHello, name check, resolve and classify, TLS
//! accept with the session's own CA, then HTTP, request by request, through
//! [`crate::http::proxy`] — and closes with exactly one record, whatever happened.
//! Stages do not call each other; each returns what the next needs, or a
//! refusal that ends the connection.
//!
//! When the session's authority ends (a close on the control channel), its
//! connections are cut wherever they are from the TLS handshake on, and
//! recorded `session_ended`.
//!
//! When the gateway drains (a shutdown signal, or a successor's `go`),
//! every open connection is told at once ([`Shutdown::drain`]) and
//! finishes gracefully: HTTP/1.1 closes an idle keep-alive connection and
//! answers the request in flight with `Connection: close`; HTTP/2 sends
//! GOAWAY and lets the streams already open end. What still runs when the
//! grace is over is cut ([`Shutdown::cut`]).
//!
//! Refusals before the TLS handshake close the connection; where the client
//! has shown it speaks TLS, a fatal TLS alert goes first so the client's
//! error names the kind of failure.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::gate::hello::HelloLimits;
use crate::gate::name::{self, Name};
use crate::gate::resolve::{Resolution, Resolver};
use crate::http::connection::{Connection, Destination, Target};
use crate::io::counted::{Counted, WireBytes};
use crate::io::replay::Replay;
use crate::io::woken::WokenOnly;
use crate::records::journal::RecordSink;
use crate::records::record::Record;
use crate::refusal::{causes, Refusal, Refused};
use crate::session::sessions::{Live, Session, Sessions};
use crate::session::share::Slot;
use talos_contract::sync::RwLocked;

/// What every connection shares.
#[derive(Debug)]
pub struct Shared {
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

/// The [`Shared`] that new connections and control calls get: a reload
/// replaces it whole, and connections open at the time keep theirs.
#[derive(Debug)]
pub struct Current(std::sync::RwLock<Arc<Shared>>);

impl Current {
    pub fn new(shared: Arc<Shared>) -> Current {
        Current(std::sync::RwLock::new(shared))
    }

    /// The settings in force now.
    pub fn get(&self) -> Arc<Shared> {
        Arc::clone(&self.0.read_locked())
    }

    /// Replace the settings for what comes next.
    pub fn set(&self, shared: Arc<Shared>) {
        *self.0.write_locked() = shared;
    }
}

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

/// What interrupts a connection.
enum Stop {
    /// The gateway began to drain: finish gracefully.
    Drain,
    /// The gateway's drain grace ran out: cut.
    Cut,
    /// The session's authority ended.
    Ended,
}

/// The first of the events that interrupt a connection: the end of its
/// session's authority, the end of the drain's grace, and — until the
/// connection has been `told` — the drain's start.
async fn stopped(shutdown: Shutdown, ended: CancellationToken, told: bool) -> Stop {
    tokio::select! {
        biased;
        () = ended.cancelled() => Stop::Ended,
        () = shutdown.cut.cancelled() => Stop::Cut,
        () = shutdown.drain.cancelled(), if !told => Stop::Drain,
    }
}

causes! {
    /// Why a connection was refused by a stage of its own here (beside the
    /// hello's, the resolver's and the address classes' causes), or, for
    /// an allowed connection, why it ended without a request.
    pub enum Cause {
        /// `unknown_source`.
        NoSessionForSource => "no_session_for_source",
        /// `no_server_name`: the hello's name is an IP address.
        SniIsIpLiteral => "sni_is_ip_literal",
        /// `no_server_name`: the hello's name is no DNS host name.
        SniNotAHostName => "sni_not_a_host_name",
        /// `not_on_allowlist`.
        NotListed => "not_listed",
        /// `session_ended`: before the TLS handshake started.
        EndedBeforeTls => "ended_before_tls",
        /// `session_ended`: during the TLS handshake.
        EndedDuringTls => "ended_during_tls",
        /// `session_ended`: with the connection open.
        SessionClosed => "session_closed",
        /// `session_ended`: the authority's lease had lapsed (nobody renewed
        /// it) when the connection came.
        LeaseExpired => "lease_expired",
        /// Allowed: the session's TLS handshake failed (an untrusting client, say).
        SessionHandshakeFailed => "session_handshake_failed",
        /// Allowed: the session's TLS handshake did not finish in time.
        SessionHandshakeTimeout => "session_handshake_timeout",
    }
}

fn refused(reason: Refusal, cause: Cause) -> Refused {
    Refused::new(reason, cause.as_str())
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

/// Serve one client connection and write its record.
///
/// The record is on disk before the connection counts as closed: before a
/// refusal's alert and close reach the client, before the connection's
/// slot and its session's count of open connections are given back
/// ([`crate::records::journal`]).
pub async fn serve(shared: &Shared, client: TcpStream, peer: SocketAddr) {
    metrics::gauge!("gateway_connections_open").increment(1.0);
    keep_alive(&client, shared.tcp_keepalive);
    let mut record = shared.records.open(peer).await;
    let wire = Arc::new(WireBytes::default());
    let mut client = Counted::new(client, Arc::clone(&wire));
    // Counts the connection on its session until its record is written.
    let mut live: Option<Live> = None;
    // Boxed: held inline, the stages' future would be laid out here twice
    // over (once as built, once as awaited), in every connection's task.
    let outcome = Box::pin(run(shared, &mut client, peer, &mut record, &mut live)).await;
    let mut alert = None;
    if let Err(refused) = outcome {
        // A session pushing at a bound of its share is recorded and
        // counted; logged at debug, so that a flood does not become one of
        // log lines.
        if refused.reason == Refusal::SessionLimit {
            tracing::debug!(source = %peer, cause = %refused.cause, "refused at a bound of the session's share");
        } else {
            tracing::info!(
                source = %peer,
                session = record.session_id.as_deref().unwrap_or("-"),
                sni = record.sni.as_deref().unwrap_or("-"),
                reason = refused.reason.as_str(),
                cause = %refused.cause,
                "refused"
            );
        }
        alert = alert_for(refused.reason);
        record.refuse(refused);
    }
    record.bytes_from_session = wire.read.load(Ordering::Relaxed);
    record.bytes_to_session =
        wire.written.load(Ordering::Relaxed) + if alert.is_some() { ALERT_LEN as u64 } else { 0 };
    // Boxed too: handing the record over takes a future that holds the
    // record twice, and its room would be kept in every idle connection's
    // task (beside `record` itself) for nothing.
    Box::pin(shared.records.close(record)).await;
    if let Some(alert) = alert {
        send_alert(&mut client, alert).await;
    }
    let _ = client.shutdown().await;
    drop(live);
    metrics::gauge!("gateway_connections_open").decrement(1.0);
}

type Client = Counted<TcpStream>;

/// The stages, in order. Fills `record` as it learns; counts the
/// connection on its session in `live`.
async fn run(
    shared: &Shared,
    client: &mut Client,
    peer: SocketAddr,
    record: &mut Record,
    live: &mut Option<Live>,
) -> Result<(), Refused> {
    let session = Arc::clone(
        live.insert(session_of(&shared.sessions, peer.ip())?)
            .session(),
    );
    record.session_id = Some(Arc::clone(&session.id));
    record.attempt = Some(session.attempt);
    record.tenant = Some(Arc::clone(&session.tenant));
    if !session.lease.live() {
        return Err(refused(Refusal::SessionEnded, Cause::LeaseExpired));
    }
    // The session's share: counted open, and in its handshake until TLS is up.
    let (_open, handshake) = session.share.connect().map_err(|at| at.refused())?;

    let mut first_bytes = Vec::new();
    let name = read_hello(shared, client, &mut first_bytes, record).await?;
    let destination = destination(shared, &session, &name, record).await?;
    tracing::debug!(source = %peer, session = %session.id, sni = %name, "allowed");
    // The opening goes on the record with its session and name; it is
    // written before the first request is read (see `terminate`).
    let journaled = shared.records.gate(record).await;
    let (conn, tally) = Connection::new(Arc::clone(&shared.gateway_id), session, name, destination);
    let conn = Arc::new(conn);
    let result = Box::pin(terminate(
        shared,
        client,
        first_bytes,
        handshake,
        &conn,
        record,
        journaled,
    ))
    .await;
    drop(conn);
    record.absorb(tally.when_done(REPORTS_WAIT).await);
    result
}

/// Stage 1: the session is named by the connection's source address; the
/// connection counts on it from here.
fn session_of(sessions: &Sessions, source: IpAddr) -> Result<Live, Refused> {
    sessions
        .track_by_source(source)
        .ok_or(refused(Refusal::UnknownSource, Cause::NoSessionForSource))
}

/// Stage 2: read the ClientHello (bounded in bytes and time) and name its
/// destination. The bytes read are kept in `first_bytes`: they belong to the
/// connection and go on to the next stage.
async fn read_hello(
    shared: &Shared,
    client: &mut Client,
    first_bytes: &mut Vec<u8>,
    record: &mut Record,
) -> Result<Name, Refused> {
    let limits = HelloLimits {
        max_bytes: shared.hello_max_bytes,
        deadline: shared.hello_timeout,
    };
    let read = crate::gate::capture::read_hello(client, first_bytes, limits).await;
    metrics::histogram!("gateway_hello_bytes").record(first_bytes.len() as f64);
    record.alpn_offered = read.alpn.clone();
    record.sni = read.sni.clone();
    if let Err(cause) = read.verdict {
        return Err(Refused::new(cause.refusal(), cause.as_str()));
    }
    let sni = read.sni.unwrap_or_default();
    match name::canonicalize(&sni) {
        Ok(name) => {
            record.sni = Some(name.as_str().to_owned());
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

/// Stages 3 and 4: what the destination is. approvals.hangar.internal is
/// answered by the gateway itself: on every session's CA, never resolved,
/// never forwarded. Any other name must be exactly on the session's
/// allowlist, and resolve to public addresses only.
async fn destination(
    shared: &Shared,
    session: &Session,
    name: &Name,
    record: &mut Record,
) -> Result<Destination, Refused> {
    if name.as_str() == talos_certs::APPROVALS_NAME {
        return Ok(Destination::Approvals);
    }
    if !session.allows(name) {
        return Err(refused(Refusal::NotOnAllowlist, Cause::NotListed));
    }
    // Boxed, as is `terminate`: a future keeps the size of its largest
    // stage for its whole life, and an idle connection should not pay for
    // the resolver's state.
    let addrs = Box::pin(resolve(&shared.resolver, name, record)).await?;
    Ok(Destination::Origin {
        target: Target::new(name),
        addrs,
    })
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

/// Stage 5: TLS with the session — TLS 1.3, a leaf of the session's own CA
/// for the hello's name — then HTTP/2 or HTTP/1.1 as ALPN chose, each
/// request through [`proxy::handle`], until the session closes, the
/// connection fails, or the gateway cuts open connections.
async fn terminate(
    shared: &Shared,
    client: &mut Client,
    first_bytes: Vec<u8>,
    handshake: Slot,
    conn: &Arc<Connection>,
    record: &mut Record,
    journaled: crate::records::journal::Written,
) -> Result<(), Refused> {
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
        let accepted = tokio::time::timeout(shared.handshake_timeout, accept).await;
        accepted.map(|tls| tls.map(Box::new))
    });
    let accepted = tokio::select! {
        accepted = accept => accepted,
        _ = conn.session.ended.cancelled() => {
            return Err(refused(Refusal::SessionEnded, Cause::EndedDuringTls));
        }
    };
    drop(handshake);
    let tls = match accepted {
        Ok(Ok(tls)) => tls,
        // rustls has sent its own alert; the record says the session's
        // handshake failed (an untrusting client, say), which is no refusal.
        Ok(Err(e)) => {
            let why = handshake_failure(&e).as_str();
            tracing::info!(session = %conn.session.id, sni = %conn.name, error = %e, cause = why, "session TLS handshake failed");
            metrics::counter!("gateway_session_handshake_failures_total", "cause" => why)
                .increment(1);
            record.cause = Some(Cause::SessionHandshakeFailed.as_str());
            return Ok(());
        }
        Err(_) => {
            metrics::counter!(
                "gateway_session_handshake_failures_total",
                "cause" => HandshakeFailure::Timeout.as_str()
            )
            .increment(1);
            record.cause = Some(Cause::SessionHandshakeTimeout.as_str());
            return Ok(());
        }
    };
    let mut tls = tls;
    let (_, rustls_conn) = tls.get_mut();
    rustls_conn.set_buffer_limit(Some(crate::tls::SESSION_SEND_LIMIT));
    record.tls_version = rustls_conn.protocol_version().map(|v| match v {
        rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
        _ => "other",
    });
    let h2 = rustls_conn.alpn_protocol() == Some(b"h2");
    record.alpn_session = Some(if h2 { "h2" } else { "http/1.1" });
    // No request is read before the connection's opening is written: a
    // crash from here on leaves it on the record, cut by the crash. The
    // line went to the writer before the handshake, so this rarely waits.
    journaled.wait().await;

    // The events that can interrupt a connection, polled only when one of
    // them fires (`WokenOnly`), not at each of the connection's wake-ups.
    // Once the drain's start is handled, the connection waits on the
    // other two (`stops(true)`).
    let stops = {
        let (shutdown, ended) = (shared.shutdown.clone(), conn.session.ended.clone());
        move |told| WokenOnly::new(stopped(shutdown.clone(), ended.clone(), told))
    };
    let mut stop = stops(false);
    // Whether the drain's start came before hyper took the connection: an
    // HTTP/1.1 connection then serves its first request without
    // keep-alive (`Connection: close`). hyper's graceful shutdown would
    // close it unanswered: it has seen no byte of it yet.
    let mut told = false;
    // HTTP/1.1: hyper's connection state (a read buffer and a write buffer
    // of 8 KiB each, and the connection itself) is made only once the
    // client starts its first request. Until then an idle connection holds
    // its TLS state and nothing more. The wait is bounded exactly as hyper
    // bounds it: the first request's headers are due HEADER_READ_TIMEOUT
    // after the handshake, whenever the first byte comes (`FirstHeadBy`).
    let first_head_by = tokio::time::Instant::now() + HEADER_READ_TIMEOUT;
    if !h2 {
        // The drain's start does not end the wait: a connection just
        // opened is about to send its first request, which is answered
        // without keep-alive (`Connection: close`, see `told`) within the
        // grace.
        let first = {
            let first = tokio::time::timeout_at(first_head_by, first_request_byte(&mut tls));
            tokio::pin!(first);
            loop {
                tokio::select! {
                    first = &mut first => break first,
                    stopped = &mut stop => match stopped {
                        Stop::Drain => {
                            told = true;
                            stop = stops(true);
                        }
                        Stop::Cut => return Ok(()),
                        // No request yet, so none held for approval.
                        Stop::Ended => {
                            return Err(refused(Refusal::SessionEnded, Cause::SessionClosed));
                        }
                    },
                }
            }
        };
        match first {
            Ok(Ok(false)) => {}
            // The client closed without a request.
            Ok(Ok(true)) => return Ok(()),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "session connection ended with an error");
                return Ok(());
            }
            // What hyper does when the headers do not come in time: close,
            // with no response.
            Err(_elapsed) => {
                tracing::debug!("session connection ended: no request before the header timeout");
                return Ok(());
            }
        }
    }
    let holding = Arc::clone(conn);
    let conn = Arc::clone(conn);
    let service = hyper::service::service_fn(move |req| crate::http::serve(Arc::clone(&conn), req));
    // Drive the connection until it ends, the gateway cuts it, or the
    // authority ends. Then requests held for approval first answer
    // `approval_withdrawn` (a graceful close lets their answers out, for at
    // most WITHDRAW_GRACE), and the connection is cut.
    // An HTTP/2 connection that answers nothing for a while is closed
    // gracefully (GOAWAY: streams open go on to their end), as an idle
    // HTTP/1.1 one is by its header timeout. The drain's start closes
    // either gracefully, at once: an HTTP/1.1 connection waiting between
    // requests closes, the request in flight is answered with
    // `Connection: close`; HTTP/2 sends GOAWAY. The grace's end cuts it.
    macro_rules! drive {
        ($conn:expr, $idle:expr) => {{
            // On the heap, sized exactly, rather than inline in this future
            // beside the other stages' state.
            let mut conn = Box::pin($conn);
            let idle = $idle;
            tokio::pin!(idle);
            let mut closing = false;
            loop {
                // The connection first: at its first poll hyper reads the
                // request whose first byte has come, so that a drain
                // announced meanwhile answers it rather than closes it.
                tokio::select! {
                    biased;
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!(error = %e, "session connection ended with an error");
                        }
                        break Ok(());
                    }
                    () = &mut idle, if !closing => {
                        tracing::debug!("session connection idle: closing");
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    stopped = &mut stop => match stopped {
                        Stop::Drain => {
                            if !closing {
                                tracing::debug!("draining: closing the session connection gracefully");
                                conn.as_mut().graceful_shutdown();
                                closing = true;
                            }
                            stop = stops(true);
                        }
                        Stop::Cut => break Ok(()),
                        Stop::Ended => {
                            if holding.holds.answers_pending() {
                                conn.as_mut().graceful_shutdown();
                                let _ = tokio::time::timeout(WITHDRAW_GRACE, conn.as_mut()).await;
                            }
                            break Err(refused(Refusal::SessionEnded, Cause::SessionClosed));
                        }
                    }
                }
            }
        }};
    }
    if h2 {
        let activity = Arc::clone(&holding);
        drive!(
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                // Lets extended CONNECT arrive as a request, to be refused
                // `upgrade_refused` rather than reset.
                .enable_connect_protocol()
                // Replies of streams answered together leave together.
                .serve_connection(
                    TokioIo::new(crate::io::gathered::Gathered::new(tls)),
                    service
                ),
            // Polled only when its timer fires, not at each of the
            // connection's wake-ups (as `stop` is).
            WokenOnly::new(async move { activity.activity.idle(shared.h2_idle_timeout).await })
        )
    } else {
        drive!(
            hyper::server::conn::http1::Builder::new()
                .timer(FirstHeadBy::new(first_head_by.into_std()))
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(!told)
                .serve_connection(TokioIo::new(tls), service),
            std::future::pending::<()>()
        )
    }
}

/// How long a closed connection's record waits for its last requests and
/// replies to report (HTTP/2 replies end in tasks of their own).
const REPORTS_WAIT: Duration = Duration::from_secs(1);

/// How long a connection whose authority ended waits for its held
/// requests to answer `approval_withdrawn` before it is cut. The answers
/// are ready at once; this bounds a client that does not read them.
const WITHDRAW_GRACE: Duration = Duration::from_secs(2);

/// Waits until the client sends its first request byte, or closes (`true`).
/// The bytes are peeked: they stay in rustls's plaintext buffer for hyper.
///
/// Until then the connection holds no receive buffer: once the handshake's
/// bytes are all processed, rustls gives back the 4 KiB buffer it reads
/// records into (`release_receive_buffer`, a patch to rustls:
/// third_party/README.md) and the wait is on the socket's readiness, so a
/// connection opened ahead of use costs its TLS state and no more.
async fn first_request_byte(
    tls: &mut tokio_rustls::server::TlsStream<Replay<&mut Client>>,
) -> std::io::Result<bool> {
    let (io, conn) = tls.get_mut();
    // Records read with the handshake's last bytes are decrypted now; a
    // request among them (or the client's close) means no wait. An error
    // is left for the read below to meet, with its alert.
    let nothing_yet = matches!(
        conn.process_new_packets(),
        Ok(state) if state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed()
    );
    if nothing_yet {
        if let Some(client) = io.inner_once_replayed() {
            if conn.release_receive_buffer() {
                client.get_ref().readable().await?;
            }
        }
    }
    let bytes = tls.fill_buf().await?;
    Ok(bytes.is_empty())
}

/// TCP keep-alive probes after `idle` of silence, `idle / 3` apart, three
/// of them: a peer gone without a word (its host down, the network cut)
/// is found within twice `idle`, by the kernel, at no cost per request.
/// HTTP/2 PINGs would find it too, but hyper's keep-alive takes a lock and
/// reads the clock at every frame of every connection (about 9 % of an
/// HTTP/2 request's CPU in `benches/load/gateway-ab.sh`).
fn keep_alive(client: &TcpStream, idle: Duration) {
    let probes = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval((idle / 3).max(Duration::from_secs(1)))
        .with_retries(3);
    if let Err(e) = socket2::SockRef::from(client).set_tcp_keepalive(&probes) {
        tracing::debug!(error = %e, "cannot set TCP keep-alive");
    }
}

/// How long an HTTP/1.1 session may take to send a request's headers once
/// it starts one (and how long an idle keep-alive connection stays open).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// hyper's timer for an HTTP/1.1 session connection whose first request
/// hyper only sees once it has started (see `terminate`): the first
/// header-read deadline hyper sets is brought forward to `by`, so the
/// first request's headers are due when they would have been had hyper
/// been waiting since the handshake. Later deadlines are hyper's own.
///
/// hyper's HTTP/1.1 server (1.x) uses its timer for the header-read timeout
/// only. Were it to set some other deadline first, that one would come
/// early instead: stricter, never looser.
#[derive(Debug)]
struct FirstHeadBy {
    by: Instant,
    used: std::sync::atomic::AtomicBool,
}

impl FirstHeadBy {
    fn new(by: Instant) -> FirstHeadBy {
        FirstHeadBy {
            by,
            used: Default::default(),
        }
    }
}

impl hyper::rt::Timer for FirstHeadBy {
    fn sleep(&self, duration: Duration) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        TokioTimer::new().sleep(duration)
    }

    fn sleep_until(&self, deadline: Instant) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        let deadline = if self.used.swap(true, Ordering::Relaxed) {
            deadline
        } else {
            deadline.min(self.by)
        };
        TokioTimer::new().sleep_until(deadline)
    }

    fn reset(&self, sleep: &mut std::pin::Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        TokioTimer::new().reset(sleep, new_deadline)
    }

    fn now(&self) -> Instant {
        TokioTimer::new().now()
    }
}

const ALERT_LEN: usize = 7;

/// A fatal alert in a plaintext TLS record: the handshake has not started,
/// so nothing is encrypted yet.
async fn send_alert(client: &mut Client, alert: Alert) {
    let bytes: [u8; ALERT_LEN] = [21, 3, 3, 0, 2, 2, alert as u8];
    let _ = tokio::time::timeout(Duration::from_secs(1), client.write_all(&bytes)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;

    #[tokio::test(start_paused = true)]
    async fn first_head_by_brings_only_the_first_deadline_forward() {
        let start = tokio::time::Instant::now();
        let at = |secs| (start + Duration::from_secs(secs)).into_std();
        let timer = FirstHeadBy::new(at(5));
        let first = timer.sleep_until(at(60));
        let second = timer.sleep_until(at(60));
        first.await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        second.await;
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }
}
