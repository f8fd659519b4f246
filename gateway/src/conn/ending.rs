//! How a connection ends: what interrupts it ([`Stop`]: the drain, the
//! drain's grace, the end of its session's authority), how one the gate
//! let through ended short of a refusal ([`Ending`]), and the causes its
//! record gives ([`Cause`]).

use std::sync::Arc;

use crate::refusal::{causes, Refusal, Refused};
use crate::serving::Shutdown;
use crate::session::sessions::Session;

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
        /// it) when the connection came, or lapsed with it open.
        LeaseExpired => "lease_expired",
        /// `session_ended`: the authority is suspended since this process
        /// was frozen, until the control plane renews it
        /// ([`crate::session::lease::Awake`]).
        SuspendedAfterFreeze => "suspended_after_freeze",
        /// Allowed: the session's TLS handshake failed (an untrusting client, say).
        SessionHandshakeFailed => "session_handshake_failed",
        /// Allowed: the session's TLS handshake did not finish in time.
        SessionHandshakeTimeout => "session_handshake_timeout",
        /// `upstream_failed`: the session is held by other members of the
        /// pair and none of them could be reached over the member link.
        HolderUnreachable => "holder_unreachable",
        /// `session_limit`: the session has `[pair]
        /// max_forwarded_per_session` connections forwarded already.
        ForwardedAtBound => "forwarded_connections",
        /// `unknown_source`: a connection forwarded over the member link
        /// for a session other than the one its source belongs to here.
        LinkSessionMismatch => "link_session_mismatch",
        /// `unknown_source`: a connection forwarded over the member link
        /// for another attempt of the session its source belongs to here
        /// (the forwarder's table or the holder's authority is behind).
        LinkAttemptMismatch => "link_attempt_mismatch",
        /// Allowed, passthrough: no byte moved either way for
        /// [`PASSTHROUGH_IDLE`].
        PassthroughIdle => "passthrough_idle",
        /// Allowed: still open when the drain's grace ran out, and cut
        /// (terminated, passthrough or forwarded alike; the record says
        /// `cut`).
        CutAtGrace => "cut_at_grace",
    }
}

pub(super) fn refused(reason: Refusal, cause: Cause) -> Refused {
    Refused::new(reason, cause.as_str())
}

/// How a connection the gate let through ended, short of a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ending {
    /// The client or the gateway closed it (a drain's grace included).
    Closed,
    /// The session's TLS handshake failed (an untrusting client, say).
    HandshakeFailed,
    /// The session's TLS handshake did not finish in time.
    HandshakeTimeout,
    /// A passthrough connection moved nothing for [`super::stages::PASSTHROUGH_IDLE`].
    Idle,
    /// The drain's grace ran out with the connection open: the gateway cut
    /// it ([`Shutdown::cut`]).
    Cut,
}

impl Ending {
    /// The record's cause, if this ending has one.
    pub(super) fn cause(self) -> Option<&'static str> {
        match self {
            Ending::Closed => None,
            Ending::HandshakeFailed => Some(Cause::SessionHandshakeFailed.as_str()),
            Ending::HandshakeTimeout => Some(Cause::SessionHandshakeTimeout.as_str()),
            Ending::Idle => Some(Cause::PassthroughIdle.as_str()),
            Ending::Cut => Some(Cause::CutAtGrace.as_str()),
        }
    }
}

/// What interrupts a connection.
pub(super) enum Stop {
    /// The gateway began to drain: finish gracefully.
    Drain,
    /// The gateway's drain grace ran out: cut.
    Cut,
    /// The session's authority ended: the connection is cut
    /// `session_ended` with this cause.
    Ended(Cause),
}

/// Why an open connection of `session` is cut as its authority ends: the
/// lease, when it lapsed (nobody renewed it in time: the control plane
/// was out of reach, or this member was), else the session's close (a
/// Stop, a pause, an interruption, a Revoke All, a newer authority).
fn cut_cause(session: &Session) -> Cause {
    if session.lease.lapsed() {
        Cause::LeaseExpired
    } else {
        Cause::SessionClosed
    }
}

/// The first of the events that interrupt a connection: the end of its
/// session's authority, the end of the drain's grace, and — until the
/// connection has been `told` — the drain's start.
pub(super) async fn stopped(shutdown: Shutdown, session: Arc<Session>, told: bool) -> Stop {
    tokio::select! {
        biased;
        () = session.ended.cancelled() => Stop::Ended(cut_cause(&session)),
        () = shutdown.cut.cancelled() => Stop::Cut,
        () = shutdown.drain.cancelled(), if !told => Stop::Drain,
    }
}
