//! What the requests of one connection share, in four parts with one
//! owner each:
//!
//! - the fixed connection ([`Connection`]): session, name, destination,
//!   made once by the gate and never changed;
//! - the tally its record learns ([`Tally`]), written by its requests and
//!   their replies and handed to the connection's task once, when the last
//!   of them is done ([`Tally::when_done`]): no polling, no field copied
//!   twice;
//! - the requests held for approval ([`Holds`]), counted by one guard type;
//! - when the connection last had nothing to do ([`Activity`]), for the
//!   HTTP/2 idle timeout.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper::header::HeaderValue;
use hyper::http::uri::Authority;
use tokio::sync::oneshot;

use crate::gate::name::Name;
use crate::records::record::{RequestRecord, Tally};
use crate::secrets::reply::{MaskedReport, ReplyRefusal};
use crate::session::approvals::{self, ApprovalRecord, Ask, LockRule, Outcome};
use crate::session::sessions::Session;
use crate::session::share::{AtBound, Held};
use talos_contract::sync::Locked;

/// What the gate found the connection's destination to be.
#[derive(Debug)]
pub enum Destination {
    /// `approvals.hangar.internal`: answered by the gateway itself, never
    /// resolved, never forwarded.
    Approvals,
    /// A destination on the session's allowlist.
    Origin {
        /// The name as requests to it carry it.
        target: Target,
        /// The addresses the gate checked for the name: the only ones the
        /// gateway connects to.
        addrs: Vec<IpAddr>,
    },
}

/// One connection, as its requests see it.
#[derive(Debug)]
pub struct Connection {
    pub gateway_id: Arc<str>,
    pub session: Arc<Session>,
    /// The connection's name: the hello's, checked.
    pub name: Name,
    pub destination: Destination,
    pub holds: Holds,
    pub activity: Activity,
    tally: Arc<Mutex<Tally>>,
    /// Dropped with the connection's last handle: tells [`Tally::when_done`]
    /// that every request and reply has reported.
    _done: oneshot::Sender<()>,
}

/// The tally of one connection, from the side of the task that writes its
/// record.
#[derive(Debug)]
pub struct TallyReceiver {
    tally: Arc<Mutex<Tally>>,
    done: oneshot::Receiver<()>,
}

impl Connection {
    /// The connection, and the receiver its record's tally comes out of.
    pub fn new(
        gateway_id: Arc<str>,
        session: Arc<Session>,
        name: Name,
        destination: Destination,
    ) -> (Connection, TallyReceiver) {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let (done_tx, done) = oneshot::channel();
        let conn = Connection {
            gateway_id,
            session,
            name,
            destination,
            holds: Holds::default(),
            activity: Activity::new(),
            tally: Arc::clone(&tally),
            _done: done_tx,
        };
        (conn, TallyReceiver { tally, done })
    }

    /// Change the tally (one request's part of it).
    pub fn tally(&self, f: impl FnOnce(&mut Tally)) {
        f(&mut self.tally.locked());
    }

    /// One request, answered; where its entry is listed, if it is.
    pub fn note(&self, entry: RequestRecord) -> Option<usize> {
        let mut listed = None;
        self.tally(|t| listed = t.request(entry));
        listed
    }

    /// A proposal's fields that this connection fills: who asks, for which
    /// destination, and the action (`method`, `path`); the caller adds
    /// attachments, or the agent's tool and call digest.
    pub fn ask<'a>(
        &'a self,
        kind: talos_certs::ProposalKind,
        method: &'a str,
        path: &'a approvals::RoutedPath,
    ) -> Ask<'a> {
        Ask {
            gateway_id: self.gateway_id.as_ref(),
            session_id: &self.session.id,
            attempt: self.session.attempt,
            tenant: &self.session.tenant,
            kind,
            destination: &self.name,
            method,
            path,
            attachments: Vec::new(),
            tool: "",
            call_digest: "",
        }
    }

    /// Hold a request (or an agent's proposal) under `rule` until a
    /// decision, counted in [`Connection::holds`] and against the session's
    /// share while it waits; refused at once past a bound of the share.
    pub async fn hold(
        &self,
        rule: &LockRule,
        ask: &Ask<'_>,
    ) -> Result<(Outcome, ApprovalRecord), AtBound> {
        let what = match ask.kind {
            talos_certs::ProposalKind::Agent => Held::Proposal,
            talos_certs::ProposalKind::Request => Held::Request,
        };
        // Without a relay nothing waits and no card is sent: nothing to count.
        let _counted = if self.session.approvals.proposes() {
            Some(self.session.share.hold(what)?)
        } else {
            None
        };
        let guard = self.holds.enter();
        let held = self
            .session
            .approvals
            .hold(rule, ask, &self.session.ended, approvals::DECISION_TIMEOUT)
            .await;
        guard.leave(held.0 == Outcome::Withdrawn);
        Ok(held)
    }
}

impl MaskedReport for Connection {
    fn masked(&self, counts: &mut dyn Iterator<Item = (&str, u64)>) {
        self.tally(|t| t.masked(counts));
    }

    fn cut(&self, cause: ReplyRefusal) {
        tracing::info!(
            session = %self.session.id,
            destination = %self.name,
            reason = crate::refusal::Refusal::UpstreamFailed.as_str(),
            cause = cause.as_str(),
            "reply cut"
        );
        metrics::counter!("gateway_replies_cut_total", "cause" => cause.as_str()).increment(1);
        self.tally(|t| t.reply_cut(cause.as_str()));
    }
}

/// When a connection last had nothing to do: requests being answered now,
/// and when the last of them was. The HTTP/2 idle timeout closes a
/// connection that has answered nothing for a while ([`Activity::idle`]).
///
/// A request counts from its arrival until its answer's head is out; a
/// reply body still streaming does not, and needs not: the idle close is
/// graceful (a GOAWAY), so streams already open finish.
#[derive(Debug)]
pub struct Activity {
    born: tokio::time::Instant,
    // invariant: `busy` is the number of live `Busy` guards; `last_busy_ms`
    // is when (ms after `born`) the count last fell to zero.
    busy: AtomicU32,
    last_busy_ms: AtomicU64,
}

/// One request being answered: counted in its connection's [`Activity`].
#[derive(Debug)]
#[must_use = "a request is counted only while its guard lives"]
pub struct Busy<'a>(&'a Activity);

impl Activity {
    fn new() -> Activity {
        Activity {
            born: tokio::time::Instant::now(),
            busy: AtomicU32::new(0),
            last_busy_ms: AtomicU64::new(0),
        }
    }

    /// A request arrived.
    pub fn begin(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Resolves once nothing has been answered for `timeout`: no request
    /// being answered, none arrived since. Checks again at each deadline,
    /// so it costs one timer per connection, never a poll per request.
    pub async fn idle(&self, timeout: Duration) {
        loop {
            let last = self.last_busy_ms.load(Ordering::Acquire);
            let quiet_since = self.born + Duration::from_millis(last);
            let deadline = if self.busy.load(Ordering::Acquire) > 0 {
                tokio::time::Instant::now() + timeout
            } else {
                quiet_since + timeout
            };
            tokio::time::sleep_until(deadline).await;
            if self.busy.load(Ordering::Acquire) == 0
                && self.last_busy_ms.load(Ordering::Acquire) == last
                && tokio::time::Instant::now() >= quiet_since + timeout
            {
                return;
            }
        }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        // Stamp first, then count down: a reader that sees zero sees the stamp.
        let now = self.0.now_ms();
        self.0.last_busy_ms.fetch_max(now, Ordering::AcqRel);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl TallyReceiver {
    /// The tally, once every handle of the connection is dropped (its
    /// requests answered, their reply bodies ended or dropped), or after
    /// `bound`, with what it has by then. HTTP/2 reply bodies live in tasks
    /// hyper spawned, which may outlast the connection's own future by a
    /// moment.
    pub async fn when_done(self, bound: Duration) -> Tally {
        // Err: the sender is dropped, which is the event waited for.
        let _ = tokio::time::timeout(bound, self.done).await;
        std::mem::take(&mut *self.tally.locked())
    }
}

/// The destination as a request names it (`:authority` or `Host`), made
/// once per connection from its checked name.
#[derive(Debug, Clone)]
pub struct Target {
    pub authority: Authority,
    pub host: HeaderValue,
}

impl Target {
    /// For `name`, a canonical DNS name (always a valid authority and
    /// header value).
    pub fn new(name: &Name) -> Target {
        let bytes = Bytes::copy_from_slice(name.as_str().as_bytes());
        Target {
            authority: Authority::from_maybe_shared(bytes.clone())
                .unwrap_or_else(|_| Authority::from_static("invalid")),
            host: HeaderValue::from_maybe_shared(bytes)
                .unwrap_or_else(|_| HeaderValue::from_static("invalid")),
        }
    }
}

/// The requests of one connection held for approval right now. When the
/// session's authority ends, the connection lets their `approval_withdrawn`
/// answers out before it cuts itself ([`Holds::answers_pending`]).
#[derive(Debug, Default)]
pub struct Holds {
    // invariant: `held` is the number of live `HoldGuard`s; a guard whose
    // hold ended withdrawn sets `withdrawn` before it counts down, so a
    // reader that loads `held` and then `withdrawn` (both SeqCst) and sees
    // `held == 0` also sees the flag of every hold that ended withdrawn.
    held: AtomicU32,
    withdrawn: AtomicBool,
}

/// One request held: counted in its connection's [`Holds`] while it lives.
#[derive(Debug)]
#[must_use = "a hold is counted only while its guard lives"]
pub struct HoldGuard<'a> {
    holds: &'a Holds,
}

impl Holds {
    /// Count a request held.
    pub fn enter(&self) -> HoldGuard<'_> {
        self.held.fetch_add(1, Ordering::SeqCst);
        HoldGuard { holds: self }
    }

    /// Whether a held request is waiting, or one ended withdrawn and its
    /// answer may still be on its way out.
    pub fn answers_pending(&self) -> bool {
        // Count, then flag: see the invariant.
        self.held.load(Ordering::SeqCst) > 0 || self.withdrawn.load(Ordering::SeqCst)
    }
}

impl HoldGuard<'_> {
    /// The hold ended; `withdrawn` when its answer is `approval_withdrawn`.
    pub fn leave(self, withdrawn: bool) {
        if withdrawn {
            // Flag first, then count down (in `drop`): see the invariant.
            self.holds.withdrawn.store(true, Ordering::SeqCst);
        }
    }
}

impl Drop for HoldGuard<'_> {
    fn drop(&mut self) {
        self.holds.held.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The one place a request's refusal is written down, wherever it was
/// decided (the lease check here, the proxy, the agent endpoint): the
/// entry's verdict, the count in `gateway_requests_refused_total`, and the
/// log line — at debug for a session pushing at a bound of its share, so
/// that a flood does not become one of log lines.
pub(crate) fn refuse(
    conn: &Connection,
    entry: &mut crate::records::record::RequestRecord,
    refused: &crate::refusal::Refused,
) {
    entry.refusal = Some(refused.reason);
    metrics::counter!("gateway_requests_refused_total", "reason" => refused.reason.as_str())
        .increment(1);
    if refused.reason == crate::refusal::Refusal::SessionLimit {
        tracing::debug!(
            session = %conn.session.id,
            destination = %conn.name,
            cause = refused.cause,
            "request refused at a bound of the session's share"
        );
    } else {
        tracing::info!(
            session = %conn.session.id,
            destination = %conn.name,
            method = %entry.method,
            reason = refused.reason.as_str(),
            cause = refused.cause,
            "request refused"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_pending_while_held_and_after_a_withdrawal() {
        let holds = Holds::default();
        assert!(!holds.answers_pending());
        let a = holds.enter();
        let b = holds.enter();
        assert!(holds.answers_pending());
        a.leave(false);
        assert!(holds.answers_pending());
        drop(b);
        assert!(!holds.answers_pending());
        holds.enter().leave(true);
        assert!(holds.answers_pending());
    }
}
