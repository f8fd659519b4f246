//! One session's share of the gateway: the bounds no session may pass, so
//! that a session at every one of them at once still leaves the gateway to
//! the others.
//!
//! The gateway's own bounds (`limits.max_connections`, the hello and
//! handshake deadlines) protect the process; these protect sessions from
//! each other. Each is counted here, per session, and checked where the
//! thing it bounds begins:
//!
//! - **open connections** ([`Limits::connections`]) and **connections
//!   still in the hello or the TLS handshake** ([`Limits::handshakes`]):
//!   when a connection's source has named its session, before a byte of
//!   its hello is read ([`Share::connect`]);
//! - **requests held for approval** ([`Limits::held_requests`]) and
//!   **agent proposals waiting** ([`Limits::pending_proposals`]), and the
//!   **rate of proposals** — the cards a person is sent, both kinds
//!   together ([`Limits::proposals_per_minute`], [`Limits::proposal_burst`])
//!   — when a request or proposal is about to be held ([`Share::hold`]);
//! - how far one reply may be **decoded** ([`Limits::decode`]), by the
//!   reply filter.
//!
//! Past a bound the gateway refuses with the reason `session_limit` and
//! the bound's name as the cause ([`Bound`]), counts it in
//! `gateway_session_limit_total{bound}`, and holds nothing for it: a
//! connection is closed before its hello is read, a request or proposal is
//! answered (429, with `retry-after` for the rate) after a short pause
//! ([`REFUSAL_PAUSE`]) that makes pushing at a bound slow for the session
//! and cheap for the gateway. No bound queues: a queue would be one more
//! thing a session could fill.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::refusal::{causes, Refusal, Refused};
use crate::secrets::decode::Bounds;
use talos_contract::sync::Locked;

/// How long a request or proposal refused at a bound waits for its answer.
/// A session that pushes at a bound as fast as the answers come then makes
/// a few attempts a second per stream, not thousands: the gateway's work
/// for it stays small beside the other sessions', and nothing is held for
/// it but the stream it already has (within its connections' bound). A
/// client that honours the answer (and `retry-after`) loses nothing.
pub const REFUSAL_PAUSE: Duration = Duration::from_millis(250);

/// The bounds of every session's share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections of the session open at once, in any stage.
    pub connections: u32,
    /// Of those, connections still in the hello or the TLS handshake.
    pub handshakes: u32,
    /// Requests of the session held for approval at once.
    pub held_requests: u32,
    /// Agent proposals of the session waiting for a decision at once.
    pub pending_proposals: u32,
    /// Proposals (held requests' and agents' together: each is a card on a
    /// person's phone) a session may make per minute, on average.
    pub proposals_per_minute: u32,
    /// How many proposals may come at once before the rate applies.
    pub proposal_burst: u32,
    /// How far one reply may be decoded.
    pub decode: Bounds,
}

impl Default for Limits {
    /// The defaults of `[limits]`, which `docs/configuration.md` justifies.
    fn default() -> Limits {
        Limits::from(&crate::config::Limits::default())
    }
}

impl From<&crate::config::Limits> for Limits {
    /// Every session's share as `[limits]` sets it.
    fn from(l: &crate::config::Limits) -> Limits {
        Limits {
            connections: *l.session_connections.get_ref(),
            handshakes: *l.session_handshakes.get_ref(),
            held_requests: *l.session_held_requests.get_ref(),
            pending_proposals: *l.session_pending_proposals.get_ref(),
            proposals_per_minute: *l.session_proposals_per_minute.get_ref(),
            proposal_burst: *l.session_proposal_burst.get_ref(),
            decode: Bounds {
                max_bytes: *l.reply_decoded_max_bytes.get_ref(),
                max_ratio: *l.reply_decoded_max_ratio.get_ref(),
            },
        }
    }
}

causes! {
    /// Which bound of a session's share was reached: the cause recorded
    /// with `session_limit`, and the `bound` label of
    /// `gateway_session_limit_total`.
    pub enum Bound {
        /// [`Limits::connections`].
        Connections => "connections",
        /// [`Limits::handshakes`].
        Handshakes => "handshakes",
        /// [`Limits::held_requests`].
        HeldRequests => "held_requests",
        /// [`Limits::pending_proposals`].
        PendingProposals => "pending_proposals",
        /// [`Limits::proposals_per_minute`] and [`Limits::proposal_burst`].
        ProposalRate => "proposal_rate",
    }
}

/// A refusal at a bound: which one, and when to try again if that can be
/// known (the rate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtBound {
    pub bound: Bound,
    pub retry_after: Option<Duration>,
}

impl AtBound {
    fn new(bound: Bound) -> AtBound {
        metrics::counter!("gateway_session_limit_total", "bound" => bound.as_str()).increment(1);
        AtBound {
            bound,
            retry_after: None,
        }
    }

    /// As a refusal: `session_limit`, the bound as the cause.
    pub fn refused(self) -> Refused {
        Refused {
            retry_after: self.retry_after,
            ..Refused::new(Refusal::SessionLimit, self.bound.as_str())
        }
    }
}

/// What a proposal is, for its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// A request a Lock rule holds.
    Request,
    /// A proposal of the agent's own.
    Proposal,
}

/// One session's counts against its [`Limits`].
#[derive(Debug)]
pub struct Share {
    // Each bound is read on its own (a reload may change them while
    // connections count against them; a count above a lowered bound only
    // refuses until it falls back under).
    bounds: Bounds4,
    decode_bytes: AtomicU64,
    decode_ratio: AtomicU64,
    connections: AtomicU32,
    handshakes: AtomicU32,
    held_requests: AtomicU32,
    pending_proposals: AtomicU32,
    cards: Mutex<Bucket>,
}

/// A token bucket of cards: `tokens` as of `at`.
/// The counted bounds of [`Limits`], each its own word.
#[derive(Debug)]
struct Bounds4 {
    connections: AtomicU32,
    handshakes: AtomicU32,
    held_requests: AtomicU32,
    pending_proposals: AtomicU32,
    proposals_per_minute: AtomicU32,
    proposal_burst: AtomicU32,
}

impl Bounds4 {
    fn new(l: &Limits) -> Bounds4 {
        Bounds4 {
            connections: AtomicU32::new(l.connections),
            handshakes: AtomicU32::new(l.handshakes),
            held_requests: AtomicU32::new(l.held_requests),
            pending_proposals: AtomicU32::new(l.pending_proposals),
            proposals_per_minute: AtomicU32::new(l.proposals_per_minute),
            proposal_burst: AtomicU32::new(l.proposal_burst),
        }
    }

    fn set(&self, l: &Limits) {
        self.connections.store(l.connections, Ordering::Relaxed);
        self.handshakes.store(l.handshakes, Ordering::Relaxed);
        self.held_requests.store(l.held_requests, Ordering::Relaxed);
        self.pending_proposals
            .store(l.pending_proposals, Ordering::Relaxed);
        self.proposals_per_minute
            .store(l.proposals_per_minute, Ordering::Relaxed);
        self.proposal_burst
            .store(l.proposal_burst, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// One unit counted against a bound while it lives.
#[derive(Debug)]
#[must_use = "a slot is counted only while it lives"]
pub struct Slot {
    share: Arc<Share>,
    which: Bound,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.share
            .counter(self.which)
            .fetch_sub(1, Ordering::AcqRel);
    }
}

impl Share {
    /// A share with nothing counted yet.
    pub fn new(limits: Limits) -> Share {
        Share {
            cards: Mutex::new(Bucket {
                tokens: f64::from(limits.proposal_burst),
                at: Instant::now(),
            }),
            bounds: Bounds4::new(&limits),
            decode_bytes: AtomicU64::new(limits.decode.max_bytes),
            decode_ratio: AtomicU64::new(limits.decode.max_ratio),
            connections: AtomicU32::new(0),
            handshakes: AtomicU32::new(0),
            held_requests: AtomicU32::new(0),
            pending_proposals: AtomicU32::new(0),
        }
    }

    /// The bounds.
    pub fn limits(&self) -> Limits {
        let b = &self.bounds;
        let get = |a: &AtomicU32| a.load(Ordering::Relaxed);
        Limits {
            connections: get(&b.connections),
            handshakes: get(&b.handshakes),
            held_requests: get(&b.held_requests),
            pending_proposals: get(&b.pending_proposals),
            proposals_per_minute: get(&b.proposals_per_minute),
            proposal_burst: get(&b.proposal_burst),
            decode: self.decode(),
        }
    }

    /// How far one reply may be decoded.
    pub fn decode(&self) -> Bounds {
        Bounds {
            max_bytes: self.decode_bytes.load(Ordering::Relaxed),
            max_ratio: self.decode_ratio.load(Ordering::Relaxed),
        }
    }

    /// New bounds (a reload): counts stay; what they allow changes from
    /// the next connection, hold or reply.
    pub fn set_limits(&self, limits: &Limits) {
        self.bounds.set(limits);
        self.decode_bytes
            .store(limits.decode.max_bytes, Ordering::Relaxed);
        self.decode_ratio
            .store(limits.decode.max_ratio, Ordering::Relaxed);
    }

    /// How many are counted against `bound` now.
    pub fn count(&self, bound: Bound) -> u32 {
        self.counter(bound).load(Ordering::Acquire)
    }

    fn counter(&self, bound: Bound) -> &AtomicU32 {
        match bound {
            Bound::Connections => &self.connections,
            Bound::Handshakes => &self.handshakes,
            Bound::HeldRequests => &self.held_requests,
            Bound::PendingProposals | Bound::ProposalRate => &self.pending_proposals,
        }
    }

    fn limit(&self, bound: Bound) -> u32 {
        match bound {
            Bound::Connections => &self.bounds.connections,
            Bound::Handshakes => &self.bounds.handshakes,
            Bound::HeldRequests => &self.bounds.held_requests,
            Bound::PendingProposals | Bound::ProposalRate => &self.bounds.pending_proposals,
        }
        .load(Ordering::Relaxed)
    }

    /// Count one against `bound` if that stays within it.
    fn take(self: &Arc<Share>, bound: Bound) -> Result<Slot, AtBound> {
        let limit = self.limit(bound);
        self.counter(bound)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .map_err(|_| AtBound::new(bound))?;
        Ok(Slot {
            share: Arc::clone(self),
            which: bound,
        })
    }

    /// A new connection of the session: counted open, and in its
    /// handshake until the second slot is dropped (when the TLS handshake
    /// has ended, however it ended).
    pub fn connect(self: &Arc<Share>) -> Result<(Slot, Slot), AtBound> {
        let open = self.take(Bound::Connections)?;
        let handshake = self.take(Bound::Handshakes)?;
        Ok((open, handshake))
    }

    /// A request or proposal about to be held for a decision: counted
    /// while the slot lives, if within its bound and the proposal rate.
    pub fn hold(self: &Arc<Share>, what: Held) -> Result<Slot, AtBound> {
        let slot = self.take(match what {
            Held::Request => Bound::HeldRequests,
            Held::Proposal => Bound::PendingProposals,
        })?;
        self.card()?;
        Ok(slot)
    }

    /// Take one card from the bucket, or say when one will be there.
    fn card(&self) -> Result<(), AtBound> {
        let per_second = f64::from(self.bounds.proposals_per_minute.load(Ordering::Relaxed)) / 60.0;
        let burst = f64::from(self.bounds.proposal_burst.load(Ordering::Relaxed).max(1));
        let mut bucket = self.cards.locked();
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let mut at = AtBound::new(Bound::ProposalRate);
        at.retry_after = (per_second > 0.0)
            .then(|| Duration::from_secs_f64(((1.0 - bucket.tokens) / per_second).ceil().max(1.0)));
        Err(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(limits: Limits) -> Arc<Share> {
        Arc::new(Share::new(limits))
    }

    #[test]
    fn connections_and_handshakes_are_bounded_and_given_back() {
        let s = share(Limits {
            connections: 3,
            handshakes: 2,
            ..Limits::default()
        });
        let (a, a_hs) = s.connect().unwrap();
        let (_b, b_hs) = s.connect().unwrap();
        // Two in their handshake: a third is refused, and counted nowhere.
        assert_eq!(s.connect().unwrap_err().bound, Bound::Handshakes);
        assert_eq!(s.count(Bound::Connections), 2);
        drop(a_hs);
        let (_c, _c_hs) = s.connect().unwrap();
        // Three open.
        drop(b_hs);
        assert_eq!(s.connect().unwrap_err().bound, Bound::Connections);
        drop(a);
        assert!(s.connect().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn holds_are_bounded_by_kind_and_cards_by_rate() {
        let s = share(Limits {
            held_requests: 2,
            pending_proposals: 1,
            proposals_per_minute: 6,
            proposal_burst: 4,
            ..Limits::default()
        });
        let r1 = s.hold(Held::Request).unwrap();
        let _r2 = s.hold(Held::Request).unwrap();
        assert_eq!(
            s.hold(Held::Request).unwrap_err().bound,
            Bound::HeldRequests
        );
        let p1 = s.hold(Held::Proposal).unwrap();
        assert_eq!(
            s.hold(Held::Proposal).unwrap_err().bound,
            Bound::PendingProposals
        );
        drop(p1);
        drop(r1);
        // Three cards spent of a burst of four: one left.
        let p2 = s.hold(Held::Proposal).unwrap();
        // None left: a request within its own bound meets the rate, and
        // is not counted held.
        assert_eq!(
            s.hold(Held::Request).unwrap_err().bound,
            Bound::ProposalRate
        );
        assert_eq!(s.count(Bound::HeldRequests), 1);
        drop(p2);
        let rate = s.hold(Held::Proposal).unwrap_err();
        assert_eq!(rate.bound, Bound::ProposalRate);
        // Six a minute: the next card in ten seconds.
        assert_eq!(rate.retry_after, Some(Duration::from_secs(10)));
        assert_eq!(
            s.count(Bound::PendingProposals),
            0,
            "a refused hold holds nothing"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        let _p3 = s.hold(Held::Proposal).unwrap();
    }
}
