//! Driving hyper over a session connection and its timers, apart from the
//! stages that decide what a connection is ([`super::stages`]): HTTP/1.1
//! or HTTP/2 as ALPN chose, each request through [`crate::http::serve`],
//! until the session closes, the connection fails, goes idle or the
//! gateway drains; what interrupts it waited on only when it fires.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncBufReadExt;

use super::client::{Client, ClientStream, SessionTls};
use super::ending::{refused, stopped, Ending, Stop};
use crate::http::connection::Connection;
use crate::io::replay::Replay;
use crate::io::woken::WokenOnly;
use crate::refusal::{Refusal, Refused};
use crate::serving::Context;

/// How long an HTTP/1.1 session may take to send a request's headers once
/// it starts one (and how long an idle keep-alive connection stays open).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a connection whose authority ended waits for its held
/// requests to answer `approval_withdrawn` before it is cut. The answers
/// are ready at once; this bounds a client that does not read them.
const WITHDRAW_GRACE: Duration = Duration::from_secs(2);

/// Serve HTTP on the session's TLS `tls` (HTTP/2 when `h2`) for `conn`
/// until it ends: the connection's requests, its timers, and what
/// interrupts it.
pub(super) async fn http<S: ClientStream>(
    cx: &Context,
    mut tls: SessionTls<'_, S>,
    h2: bool,
    conn: &Arc<Connection>,
) -> Result<Ending, Refused> {
    let mut stop = {
        let (shutdown, session) = (cx.shutdown.clone(), Arc::clone(&conn.session));
        Stops::new(move |told| {
            WokenOnly::new(stopped(shutdown.clone(), Arc::clone(&session), told))
        })
    };
    // HTTP/1.1: hyper's connection state (a read buffer and a write
    // buffer of 8 KiB each, and the connection itself) is made only
    // once the client starts its first request. Until then an idle
    // connection holds its TLS state and nothing more. The wait is
    // bounded exactly as hyper bounds it: the first request's headers
    // are due HEADER_READ_TIMEOUT after the handshake, whenever the
    // first byte comes (`FirstHeadBy`).
    let first_head_by = tokio::time::Instant::now() + HEADER_READ_TIMEOUT;
    if !h2 {
        if let Some(ended) = first_request(&mut tls, first_head_by, &mut stop).await {
            return ended;
        }
    }
    let holding = Arc::clone(conn);
    let conn = Arc::clone(conn);
    let service = hyper::service::service_fn(move |req| crate::http::serve(Arc::clone(&conn), req));
    if h2 {
        let activity = Arc::clone(&holding);
        let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            // Lets extended CONNECT arrive as a request, to be refused
            // `upgrade_refused` rather than reset.
            .enable_connect_protocol()
            // Replies of streams answered together leave together.
            .serve_connection(
                TokioIo::new(crate::io::gathered::Gathered::new(tls)),
                service,
            );
        // Polled only when its timer fires, not at each of the
        // connection's wake-ups (as `stop` is).
        let idle = WokenOnly::new(async move { activity.activity.idle(cx.h2_idle_timeout).await });
        drive(served, idle, stop, &holding).await
    } else {
        let served = hyper::server::conn::http1::Builder::new()
            .timer(FirstHeadBy::new(first_head_by.into_std()))
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .keep_alive(!stop.told)
            .serve_connection(TokioIo::new(tls), service);
        drive(served, std::future::pending::<()>(), stop, &holding).await
    }
}

/// The events that can interrupt a connection, polled only when one of
/// them fires (`WokenOnly`), not at each of the connection's wake-ups.
/// Once the drain's start is handled (`told`), the connection waits on
/// the other two.
struct Stops<M, W> {
    make: M,
    next: W,
    /// Whether the drain's start has come: an HTTP/1.1 connection told
    /// before hyper took it serves its first request without keep-alive
    /// (`Connection: close`). hyper's graceful shutdown would close it
    /// unanswered: it has seen no byte of it yet.
    told: bool,
}

impl<M, W> Stops<M, W>
where
    M: Fn(bool) -> W,
    W: std::future::Future<Output = Stop> + Unpin,
{
    /// `make(told)` waits for the next event.
    fn new(make: M) -> Self {
        let next = make(false);
        Stops {
            make,
            next,
            told: false,
        }
    }

    /// The next event; the drain's start comes once.
    async fn next(&mut self) -> Stop {
        let stop = (&mut self.next).await;
        if let Stop::Drain = stop {
            self.told = true;
            self.next = (self.make)(true);
        }
        stop
    }
}

/// HTTP/1.1: wait for the client's first request byte (hyper is handed
/// the connection only then). `None`: a request has begun; otherwise how
/// the connection ended first. The drain's start does not end the wait: a
/// connection just opened is about to send its first request, which is
/// answered without keep-alive (`Connection: close`, see [`Stops`])
/// within the grace.
async fn first_request<M, W, S: ClientStream>(
    tls: &mut SessionTls<'_, S>,
    by: tokio::time::Instant,
    stop: &mut Stops<M, W>,
) -> Option<Result<Ending, Refused>>
where
    M: Fn(bool) -> W,
    W: std::future::Future<Output = Stop> + Unpin,
{
    let first = {
        let first = tokio::time::timeout_at(by, first_request_byte(tls));
        tokio::pin!(first);
        loop {
            tokio::select! {
                first = &mut first => break first,
                stopped = stop.next() => match stopped {
                    Stop::Drain => {}
                    Stop::Cut => return Some(Ok(Ending::Cut)),
                    // No request yet, so none held for approval.
                    Stop::Ended(cause) => {
                        return Some(Err(refused(Refusal::SessionEnded, cause)));
                    }
                },
            }
        }
    };
    match first {
        Ok(Ok(false)) => None,
        // The client closed without a request.
        Ok(Ok(true)) => Some(Ok(Ending::Closed)),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "session connection ended with an error");
            Some(Ok(Ending::Closed))
        }
        // What hyper does when the headers do not come in time: close,
        // with no response.
        Err(_elapsed) => {
            tracing::debug!("session connection ended: no request before the header timeout");
            Some(Ok(Ending::Closed))
        }
    }
}

/// Waits until the client sends its first request byte, or closes (`true`).
/// The bytes are peeked: they stay in rustls's plaintext buffer for hyper.
///
/// Until then the connection holds no receive buffer: once the handshake's
/// bytes are all processed, rustls gives back the 4 KiB buffer it reads
/// records into (`release_receive_buffer`, a patch to rustls:
/// third_party/README.md) and the wait is on the socket's readiness, so a
/// connection opened ahead of use costs its TLS state and no more.
async fn first_request_byte<S: ClientStream>(
    tls: &mut tokio_rustls::server::TlsStream<Replay<&mut Client<S>>>,
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
        // Through the member link the bytes come inside the link's TLS:
        // readable is no sign of them, so the buffer is kept.
        if let Some(socket) = io.inner_once_replayed().and_then(|c| c.get_ref().socket()) {
            if conn.release_receive_buffer() {
                socket.readable().await?;
            }
        }
    }
    let bytes = tls.fill_buf().await?;
    Ok(bytes.is_empty())
}

/// A hyper server connection, HTTP/1.1 or HTTP/2: a future that ends with
/// the connection, and a graceful close.
trait Graceful: std::future::Future<Output = Result<(), hyper::Error>> {
    fn graceful(self: std::pin::Pin<&mut Self>);
}

impl<I, S, B> Graceful for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, B, E> Graceful for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Drive the connection until it ends, the drain's grace cuts it, or the
/// authority ends; then requests held for approval first answer
/// `approval_withdrawn` (a graceful close lets their answers out, for at
/// most WITHDRAW_GRACE), and the connection is cut. An HTTP/2 connection
/// that answers nothing for a while (`idle`) is closed gracefully
/// (GOAWAY: streams open go on to their end), as an idle HTTP/1.1 one is
/// by its header timeout. The drain's start closes either gracefully, at
/// once: an HTTP/1.1 connection waiting between requests closes, the
/// request in flight is answered with `Connection: close`; HTTP/2 sends
/// GOAWAY.
async fn drive<C, M, W>(
    served: C,
    idle: impl std::future::Future<Output = ()>,
    mut stop: Stops<M, W>,
    conn: &Connection,
) -> Result<Ending, Refused>
where
    C: Graceful,
    M: Fn(bool) -> W,
    W: std::future::Future<Output = Stop> + Unpin,
{
    // On the heap, sized exactly, rather than inline in the connection's
    // future beside the other stages' state.
    let mut served = Box::pin(served);
    tokio::pin!(idle);
    // A drain announced before hyper took an HTTP/1.1 connection is not
    // announced again (`stop` waits on the other two events): hyper serves
    // its first request without keep-alive instead, since a graceful close
    // now would close it unanswered.
    let mut closing = false;
    loop {
        // The connection first: at its first poll hyper reads the request
        // whose first byte has come, so that a drain announced meanwhile
        // answers it rather than closes it.
        tokio::select! {
            biased;
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "session connection ended with an error");
                }
                return Ok(Ending::Closed);
            }
            () = &mut idle, if !closing => {
                tracing::debug!("session connection idle: closing");
                served.as_mut().graceful();
                closing = true;
            }
            stopped = stop.next() => match stopped {
                Stop::Drain => {
                    if !closing {
                        tracing::debug!("draining: closing the session connection gracefully");
                        served.as_mut().graceful();
                        closing = true;
                    }
                }
                Stop::Cut => return Ok(Ending::Cut),
                Stop::Ended(cause) => {
                    if conn.holds.answers_pending() {
                        served.as_mut().graceful();
                        let _ = tokio::time::timeout(WITHDRAW_GRACE, served.as_mut()).await;
                    }
                    return Err(refused(Refusal::SessionEnded, cause));
                }
            }
        }
    }
}

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
