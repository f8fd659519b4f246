//! HTTP inside a session's TLS: one request at a time.
//!
//! - [`connection`]: what a connection's requests share: the fixed
//!   connection, the tally its record learns, the holds.
//! - [`answers`]: every answer the gateway writes itself, masked.
//! - [`proxy`]: one request to a destination: checks, injection, forwarding, the reply.
//! - [`agent`]: approvals.hangar.internal, where agents propose actions.
//!
//! [`serve`] routes each request on what the gate found the destination
//! to be, and records it.

pub mod connection;
pub mod answers;
pub mod proxy;
pub mod agent;

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response};

use crate::records::record::RequestRecord;
use crate::refusal::Refusal;
use answers::ProxyBody;
use connection::{Connection, Destination};

/// Serve one request of `conn`, and note it in the connection's tally —
/// also when it is cut short (its future dropped: the connection cut by
/// the end of the session's authority or the drain, or the client gone),
/// since it may have reached the destination, credential and all.
pub async fn serve(
    conn: Arc<Connection>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let _busy = conn.activity.begin();
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
        let reason = Refusal::SessionEnded;
        tracing::info!(
            session = %conn.session.id,
            destination = %conn.name,
            reason = reason.as_str(),
            cause = proxy::Cause::LeaseExpired.as_str(),
            "request refused"
        );
        entry.refusal = Some(reason);
        answers::refusal(
            &conn,
            crate::refusal::Refused::new(reason, proxy::Cause::LeaseExpired.as_str()),
            proxy::is_grpc(req.headers()),
        )
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
    if let Some(reason) = entry.refusal {
        metrics::counter!("gateway_requests_refused_total", "reason" => reason.as_str())
            .increment(1);
    }
    if let Some(entry) = pending.entry.take() {
        conn.note(entry);
    }
    Ok(response)
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
