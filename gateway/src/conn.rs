//! One connection, top to bottom.
//!
//! [`serve`] runs the stages in the order a connection meets them — session
//! by source address, ClientHello, name check, resolve and classify, connect
//! to the checked address, carry the bytes — and closes with exactly one
//! record, whatever happened. Stages do not call each other; each returns
//! what the next needs, or a [`Refused`] that ends the connection.
//!
//! Refusals before the TLS handshake close the connection; where the client
//! has shown it speaks TLS, a fatal TLS alert goes first so the client's
//! error names the kind of failure.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::hello::HelloLimits;
use crate::name::{self, Name};
use crate::record::{Record, RecordSink};
use crate::refusal::Refusal;
use crate::resolve::{self, Resolution, Resolver};
use crate::session::{Session, Sessions};

/// What every connection shares.
#[derive(Debug)]
pub struct Shared {
    pub gateway_id: Arc<str>,
    pub sessions: Sessions,
    pub resolver: Resolver,
    pub records: RecordSink,
    /// The most bytes read while waiting for a whole ClientHello.
    pub hello_max_bytes: usize,
    /// How long a client has to send its whole ClientHello.
    pub hello_timeout: Duration,
    /// The destination port (443 outside labs and tests).
    pub upstream_port: u16,
    /// The bound on one TCP connect to one candidate address.
    pub connect_timeout: Duration,
    /// Fires when open connections must be cut (end of the drain grace).
    pub shutdown: CancellationToken,
}

/// A refusal with the fixed cause recorded beside it.
#[derive(Debug)]
struct Refused {
    reason: Refusal,
    cause: String,
    /// The TLS alert to send first, when the client spoke TLS.
    alert: Option<Alert>,
}

impl Refused {
    fn new(reason: Refusal, cause: impl Into<String>) -> Refused {
        Refused {
            reason,
            cause: cause.into(),
            alert: None,
        }
    }

    fn with_alert(mut self, alert: Alert) -> Refused {
        self.alert = Some(alert);
        self
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
pub async fn serve(shared: &Shared, client: TcpStream, peer: SocketAddr) {
    metrics::gauge!("gateway_connections_open").increment(1.0);
    let mut record = Record::open(Arc::clone(&shared.gateway_id), peer);
    let mut client = client;
    if let Err(refused) = run(shared, &mut client, peer, &mut record).await {
        tracing::info!(
            source = %peer,
            session = record.session_id.as_deref().unwrap_or("-"),
            sni = record.sni.as_deref().unwrap_or("-"),
            reason = refused.reason.as_str(),
            cause = %refused.cause,
            "refused"
        );
        if let Some(alert) = refused.alert {
            send_alert(&mut client, alert).await;
            record.bytes_to_session += ALERT_LEN as u64;
        }
        record.refuse(refused.reason, refused.cause);
    }
    let _ = client.shutdown().await;
    metrics::gauge!("gateway_connections_open").decrement(1.0);
    shared.records.close(record).await;
}

/// The stages, in order. Fills `record` as it learns.
async fn run(
    shared: &Shared,
    client: &mut TcpStream,
    peer: SocketAddr,
    record: &mut Record,
) -> Result<(), Refused> {
    let session = session_of(&shared.sessions, peer.ip())?;
    record.session_id = Some(Arc::clone(&session.id));
    record.attempt = Some(session.attempt);
    record.tenant = Some(Arc::clone(&session.tenant));

    let mut first_bytes = Vec::new();
    let name = read_hello(shared, client, &mut first_bytes, record).await?;
    check_name(&session, &name)?;

    let addrs = resolve(&shared.resolver, &name, record).await?;
    let mut upstream =
        connect(&addrs, shared.upstream_port, shared.connect_timeout, record).await?;

    tracing::debug!(source = %peer, session = %session.id, sni = %name, upstream = ?record.resolved, "allowed");
    relay(shared, client, &mut upstream, &first_bytes, record).await;
    Ok(())
}

/// Stage 1: the session is named by the connection's source address.
fn session_of(sessions: &Sessions, source: IpAddr) -> Result<Arc<Session>, Refused> {
    sessions
        .by_source(source)
        .ok_or_else(|| Refused::new(Refusal::UnknownSource, "no_session_for_source"))
}

/// Stage 2: read the ClientHello (bounded in bytes and time) and name its
/// destination. The bytes read are kept in `first_bytes`: they belong to the
/// connection and go on to the next stage.
async fn read_hello(
    shared: &Shared,
    client: &mut TcpStream,
    first_bytes: &mut Vec<u8>,
    record: &mut Record,
) -> Result<Name, Refused> {
    let limits = HelloLimits {
        max_bytes: shared.hello_max_bytes,
        deadline: shared.hello_timeout,
    };
    let read = crate::capture::read_hello(client, first_bytes, limits).await;
    record.bytes_from_session = first_bytes.len() as u64;
    metrics::histogram!("gateway_hello_bytes").record(first_bytes.len() as f64);
    record.alpn_offered = read.alpn.clone();
    record.sni = read.sni.clone();
    if let Err(cause) = read.verdict {
        let reason = cause.refusal();
        let refused = Refused::new(reason, cause.as_str());
        return Err(match reason {
            // The client spoke TLS: tell it why in its own language.
            Refusal::NoServerName => refused.with_alert(Alert::UnrecognizedName),
            Refusal::EncryptedClientHello => refused.with_alert(Alert::HandshakeFailure),
            _ => refused,
        });
    }
    let sni = read.sni.unwrap_or_default();
    match name::canonicalize(&sni) {
        Ok(name) => {
            record.sni = Some(name.as_str().to_owned());
            Ok(name)
        }
        Err(e) => {
            let cause = match e {
                name::NameError::IpLiteral { .. } => "sni_is_ip_literal",
                _ => "sni_not_a_host_name",
            };
            Err(Refused::new(Refusal::NoServerName, cause).with_alert(Alert::UnrecognizedName))
        }
    }
}

/// Stage 3: the name must be exactly on the session's allowlist.
fn check_name(session: &Session, name: &Name) -> Result<(), Refused> {
    if session.allows(name) {
        Ok(())
    } else {
        Err(Refused::new(Refusal::NotOnAllowlist, "not_listed").with_alert(Alert::UnrecognizedName))
    }
}

/// Stage 4: resolve the name and refuse it if any answer is internal.
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
            Err(Refused::new(
                Refusal::ResolvesInternal,
                format!("internal:{}", class.as_str()),
            )
            .with_alert(Alert::AccessDenied))
        }
        Resolution::Failed(f) => {
            Err(Refused::new(Refusal::UpstreamFailed, f.as_str()).with_alert(Alert::InternalError))
        }
    }
}

/// Stage 5: connect to one of the checked addresses, in answer order.
async fn connect(
    addrs: &[IpAddr],
    port: u16,
    timeout: Duration,
    record: &mut Record,
) -> Result<TcpStream, Refused> {
    let mut cause = "connect_failed";
    for addr in resolve::candidates(addrs, port) {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                record.resolved = Some(addr);
                return Ok(stream);
            }
            Ok(Err(e)) => {
                cause = match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => "connect_refused",
                    _ => "connect_failed",
                };
                tracing::debug!(%addr, error = %e, "upstream connect failed");
            }
            Err(_) => cause = "connect_timeout",
        }
    }
    Err(Refused::new(Refusal::UpstreamFailed, cause).with_alert(Alert::InternalError))
}

/// Stage 6: carry the connection's bytes, hello first, until both sides
/// have closed, either fails, or the gateway cuts open connections. Byte
/// counts are kept as they go, so a reset still leaves an exact record.
async fn relay(
    shared: &Shared,
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    first_bytes: &[u8],
    record: &mut Record,
) {
    if upstream.write_all(first_bytes).await.is_err() {
        return;
    }
    let (mut client_rd, mut client_wr) = client.split();
    let (mut upstream_rd, mut upstream_wr) = upstream.split();
    let mut up_bytes = 0u64;
    let mut down_bytes = 0u64;
    {
        let up = pump(&mut client_rd, &mut upstream_wr, &mut up_bytes);
        let down = pump(&mut upstream_rd, &mut client_wr, &mut down_bytes);
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        while !(up_done && down_done) {
            tokio::select! {
                r = &mut up, if !up_done => {
                    up_done = true;
                    if r.is_err() { break; }
                }
                r = &mut down, if !down_done => {
                    down_done = true;
                    if r.is_err() { break; }
                }
                _ = shared.shutdown.cancelled() => break,
            }
        }
    }
    record.bytes_from_session += up_bytes;
    record.bytes_to_session += down_bytes;
}

/// One relay buffer per direction. 16 KiB holds one full TLS record, so a
/// record crosses in one read and one write.
const RELAY_BUF: usize = 16 * 1024 + 64;

/// Copy `from` to `to` until end of stream, counting bytes as they are
/// written; at end of stream, half-close `to`.
async fn pump<R, W>(from: &mut R, to: &mut W, count: &mut u64) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; RELAY_BUF];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        *count += n as u64;
    }
}

const ALERT_LEN: usize = 7;

/// A fatal alert in a plaintext TLS record: the handshake has not started,
/// so nothing is encrypted yet.
async fn send_alert(client: &mut TcpStream, alert: Alert) {
    let bytes: [u8; ALERT_LEN] = [21, 3, 3, 0, 2, 2, alert as u8];
    let _ = tokio::time::timeout(Duration::from_secs(1), client.write_all(&bytes)).await;
}
