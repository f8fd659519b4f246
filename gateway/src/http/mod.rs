//! HTTP inside a session's TLS: one request at a time.
//!
//! - [`connection`]: what a connection's requests share: the fixed
//!   connection, the tally its record learns, the holds.
//! - [`answers`]: every answer the gateway writes itself, masked.
//! - [`proxy`]: one request to a destination: checks, injection, forwarding, the reply.
//! - [`agent`]: approvals.hangar.internal, where agents propose actions.
//!
//! [`serve`] routes each request on what the gate found the destination
//! to be, and records it; its reply ([`Reply`]) marks the record `cut`
//! when it does not reach the session whole.

pub mod connection;
pub mod answers;
pub mod proxy;
pub mod agent;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response, StatusCode};

use crate::records::record::RequestRecord;
use crate::refusal::Refusal;
use answers::ProxyBody;
use connection::{Connection, Destination};

/// Serve one request of `conn`, and note it in the connection's tally —
/// also when it is cut short (its future dropped: the connection cut by
/// the end of the session's authority or the drain, or the client gone),
/// since it may have reached the destination, credential and all; and
/// when its reply is cut in its body ([`Reply`]).
pub async fn serve(
    conn: Arc<Connection>,
    req: Request<Incoming>,
) -> Result<Response<Reply>, Infallible> {
    let _busy = conn.activity.begin();
    let head = req.method() == Method::HEAD;
    let mut pending = Pending {
        conn: &conn,
        entry: Some(RequestRecord::new(req.method(), req.uri().path())),
    };
    let Some(entry) = pending.entry.as_mut() else {
        unreachable!("the entry was just made")
    };
    // Every request is checked against the authority's lease: a member
    // that wakes from a long stop serves not one request of an authority
    // whose lease lapsed meanwhile (the lease watcher then ends it).
    let response = if !conn.session.lease.live() {
        let cause = if conn.session.lease.lapsed() {
            proxy::Cause::LeaseExpired
        } else {
            proxy::Cause::SuspendedAfterFreeze
        };
        let refused = crate::refusal::Refused::new(Refusal::SessionEnded, cause.as_str());
        connection::refuse(&conn, entry, &refused);
        answers::refusal(&conn, refused, proxy::is_grpc(req.headers()))
    } else {
        match &conn.destination {
            // Boxed: the proxy's future, spawned or moved for every request,
            // stays its own size.
            Destination::Approvals => Box::pin(agent::answer(&conn, req, entry)).await,
            Destination::Origin { target, addrs } => {
                proxy::handle(&conn, target, addrs, req, entry).await
            }
        }
    };
    entry.status = response.status().as_u16();
    let listed = pending.entry.take().and_then(|entry| conn.note(entry));
    Ok(Reply::watch(
        response,
        head,
        listed.map(|at| (Arc::clone(&conn), at)),
    ))
}

/// A reply on its way to the session, with the request's entry in the
/// connection's tally until the reply is whole: dropped before that (its
/// connection cut under its body — a download still streaming at the
/// drain's grace, the end of the authority — or the client gone), it
/// marks the entry `cut`.
///
/// Whole is: the body ended, or every byte its head declared
/// (`Content-Length`) went out, after which hyper drops it unfinished.
/// The check is one addition per frame; the entry is touched again only
/// for a reply cut.
#[derive(Debug)]
pub struct Reply {
    body: ProxyBody,
    /// None once the reply is whole (or was never watched).
    watch: Option<Watch>,
}

#[derive(Debug)]
struct Watch {
    conn: Arc<Connection>,
    entry: usize,
    declared: Option<u64>,
    sent: u64,
}

impl Reply {
    /// `response`, its request's entry listed at `listed` (none: not
    /// listed, nothing to mark). An answer to HEAD, a 1xx, 204 or 304 has
    /// no body to watch.
    fn watch(
        response: Response<ProxyBody>,
        head: bool,
        listed: Option<(Arc<Connection>, usize)>,
    ) -> Response<Reply> {
        let status = response.status();
        let bodiless = head
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let declared = response
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .or_else(|| response.body().size_hint().exact());
        response.map(|body| {
            let watch = match listed {
                Some((conn, entry)) if !bodiless && !body.is_end_stream() => Some(Watch {
                    conn,
                    entry,
                    declared,
                    sent: 0,
                }),
                _ => None,
            };
            Reply { body, watch }
        })
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = <ProxyBody as Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // Every field is Unpin.
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.watch = None,
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(w), Some(data)) = (this.watch.as_mut(), frame.data_ref()) {
                    w.sent += data.len() as u64;
                    if w.declared.is_some_and(|n| w.sent >= n) {
                        this.watch = None;
                    }
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(w) = self.watch.take() {
            if !self.body.is_end_stream() {
                w.conn.tally(|t| t.reply_unfinished(w.entry));
            }
        }
    }
}

/// A request's entry until it is noted: dropped unnoted (the request's
/// future dropped before its answer), it is noted as cut.
struct Pending<'a> {
    conn: &'a Connection,
    entry: Option<RequestRecord>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(mut entry) = self.entry.take() {
            entry.cut = true;
            self.conn.note(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every HTTP/2 stream spawns a task holding this future, and every
    /// request moves it: the rare, large parts (a new upstream connection,
    /// a hold for approval, the agent endpoint) are boxed so it stays
    /// small. It was 8.5 KiB with them inline; 2 KiB without.
    #[test]
    fn request_future_stays_small() {
        fn size_of_return<F, Fut>(_: F) -> usize
        where
            F: Fn(Arc<Connection>, Request<Incoming>) -> Fut,
        {
            std::mem::size_of::<Fut>()
        }
        let size = size_of_return(serve);
        assert!(size <= 3 * 1024, "http::serve's future is {size} bytes");
    }
}
