//! The closed vocabularies of a session: modes, states, attempt causes and
//! ends, why an authority is dropped, why a session ended, the reset steps;
//! and the results `serve`'s metrics count closes and renewals by.
//!
//! Each is an enum with a stable snake_case `as_str()`, the same word in the
//! store, in the CLI's JSON and on the certificate. The words are the spec's
//! where it has one ("Sandbox sessions": states, attempt causes and ends;
//! "The sandbox reset": step names).

macro_rules! words {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident => $word:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The stable word.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)*
                }
            }

            /// The value whose word is `text`.
            pub fn parse(text: &str) -> Option<$name> {
                match text {
                    $($word => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                $name::parse(&text)
                    .ok_or_else(|| serde::de::Error::custom(format!("unknown word {text:?}")))
            }
        }
    };
}

/// The same closed-vocabulary enums elsewhere in the crate (the state
/// machine's events).
pub(crate) use words;

words! {
    /// How a session runs (spec: "Modes").
    pub enum Mode {
        /// The session runs the agent's command and ends when it ends; the
        /// default. It cannot pause, and an interruption ends it.
        Agent => "agent",
        /// The session runs the commands it is sent; only this mode pauses
        /// and recovers.
        Commands => "commands",
    }
}

words! {
    /// A session's state, as the store keeps it. What moves a session from
    /// one to another is [`crate::machine::next`], and nothing else.
    ///
    /// `launching`, `resuming` and `recovering` are an open in flight: the
    /// attempt is recorded and the members are being asked (or were, by a
    /// process that stopped before it recorded their answers). `pausing`
    /// never reaches the store: a pause commits at once, and the members'
    /// answers only settle the closes it owes. A session that ended
    /// before any attempt ran (a start no member opened, `start_failed`;
    /// or a stop while its first open was in flight) goes through the
    /// reset like any other end, and is `failed` once every step is
    /// confirmed.
    pub enum State {
        /// A start is committed (attempt 1, cause `launch`); the members
        /// are asked to open (spec: `launching`).
        Launching => "launching",
        Running => "running",
        Paused => "paused",
        /// A resume is committed (a new attempt, cause `resume`); the
        /// members are asked to open (spec: `resuming`). It returns to
        /// `paused` if none opens.
        Resuming => "resuming",
        Interrupted => "interrupted",
        /// A recovery is committed (a new attempt, cause `recovery`); the
        /// members are asked to open. The spec has no word of its own for
        /// it (its `resuming` is a resume's); it returns to `interrupted`
        /// if none opens.
        Recovering => "recovering",
        /// The end is committed (tokens revoked, approvals withdrawn); the
        /// reset runs (spec: `stopping`).
        Stopping => "stopping",
        /// The reset ran and every step is confirmed.
        Ended => "ended",
        /// The session ended before any attempt of it ran, and the reset
        /// ran with every step confirmed (spec: "failed: the session ended
        /// before its instance existed, and the reset is complete"). The
        /// certificate is issued as for `ended`.
        Failed => "failed",
        /// The reset ran and at least one step is not confirmed yet: a
        /// gateway has not confirmed its close. The session is over and
        /// never comes back; it becomes `ended` once every step is
        /// confirmed, and only then has a certificate (spec:
        /// `reset_incomplete`).
        ResetIncomplete => "reset_incomplete",
    }
}

impl State {
    /// The states of a session that is not over: it may still open an
    /// attempt (or holds one).
    pub const NOT_OVER: [State; 6] = [
        State::Launching,
        State::Running,
        State::Paused,
        State::Resuming,
        State::Interrupted,
        State::Recovering,
    ];

    /// True once the session's end is committed, whatever its reset shows.
    pub fn is_over(self) -> bool {
        matches!(
            self,
            State::Stopping | State::Ended | State::Failed | State::ResetIncomplete
        )
    }

    /// True once the reset is complete: `ended`, or `failed` for a
    /// session that never ran.
    pub fn is_reset(self) -> bool {
        matches!(self, State::Ended | State::Failed)
    }

    /// True while an open is in flight: committed, its answers not yet
    /// recorded.
    pub fn is_opening(self) -> bool {
        matches!(self, State::Launching | State::Resuming | State::Recovering)
    }
}

words! {
    /// Why an attempt began (spec: "Attempts and retention").
    pub enum OpenCause {
        Launch => "launch",
        Resume => "resume",
        Recovery => "recovery",
    }
}

words! {
    /// Why a session's authority was dropped on a gateway: the reasons the
    /// control stub asks for (`pause`, `interruption`, `end`, `revoke_all`)
    /// and those a gateway reports on its own (talos-certs `DropReason`),
    /// and a restart of the gateway, which its start report tells.
    pub enum CloseReason {
        Pause => "pause",
        Interruption => "interruption",
        End => "end",
        RevokeAll => "revoke_all",
        /// Nobody renewed the lease in time.
        LeaseExpired => "lease_expired",
        /// A newer open displaced it.
        Replaced => "replaced",
        /// The gateway process was shut down.
        Shutdown => "shutdown",
        /// The gateway process that held it ended (its successor's start
        /// report says so).
        GatewayRestarted => "gateway_restarted",
    }
}

words! {
    /// How an attempt ended (the spec's reasons this control stub can see).
    pub enum AttemptEnd {
        Paused => "paused",
        Interrupted => "interrupted",
        SessionEnded => "session_ended",
        /// An open that no gateway made (or that one refused, or whose
        /// answers never came): a resume or recovery returns to paused or
        /// interrupted, a start ends the session (`start_failed`).
        StartFailed => "start_failed",
    }
}

words! {
    /// Why a session ended.
    pub enum EndReason {
        /// `sandbox stop`: a cancellation.
        Stop => "stop",
        /// `sandbox revoke-all`: a cancellation as Revoke All.
        RevokeAll => "revoke_all",
        /// An interruption of a session in mode agent, or of a session in
        /// mode commands that did not recover within 30 minutes
        /// (`interruption_lost`).
        InterruptionLost => "interruption_lost",
        /// The idle timeout ended the session (`idle_action` `end`).
        IdleTimeout => "idle_timeout",
        /// The session stayed paused for 7 days.
        PausedTooLong => "paused_too_long",
        /// The session's compute reached its hard stop
        /// (`stop_after_seconds`, spec: "Hard stop").
        StopAfter => "stop_after",
        /// Its start opened on no member (none answered, one refused, or
        /// the answers never came): the session ended before it ran.
        StartFailed => "start_failed",
    }
}

words! {
    /// What the idle timeout does (spec: "Idle timeout").
    pub enum IdleAction {
        End => "end",
        Pause => "pause",
    }
}

words! {
    /// When a Lock rule holds a request (spec: "The Lock").
    pub enum LockMode {
        /// The first matching request under the session's current
        /// authority; counted again after each resume or recovery.
        FirstUse => "first_use",
        /// Every matching request.
        EveryRequest => "every_request",
    }
}

words! {
    /// Where a proposal stands at the relay.
    pub enum ProposalState {
        /// Waiting for an approver.
        Pending => "pending",
        /// Approved, and the signed decision delivered to the gateway.
        Approved => "approved",
        /// Declined, and the signed decision delivered to the gateway.
        Declined => "declined",
        /// The session paused, was interrupted or ended while it waited:
        /// it can no longer be decided (`approval_withdrawn`).
        Withdrawn => "withdrawn",
        /// No decision came before its `expires_at`.
        Expired => "expired",
    }
}

words! {
    /// What a person may do in the web app (`people enroll NAME --role`).
    /// An operator may do everything an approver may, and more: a Lock
    /// rule may name either.
    pub enum Role {
        /// Decides the cards a Lock rule names them on, and sees those
        /// cards' sessions.
        Approver => "approver",
        /// Also sees every session's page and starts Revoke All there.
        Operator => "operator",
    }
}

words! {
    /// What became of a close asked again (the `result` of
    /// `stub_close_attempts_total`).
    pub enum CloseAttempt {
        /// The member confirmed the authority gone.
        Confirmed => "confirmed",
        /// Not confirmed: it stays owed and is asked again.
        Owed => "owed",
    }
}

words! {
    /// How a member answered a lease renewal (the `result` of
    /// `stub_lease_renewals_total`).
    pub enum Renewal {
        /// It answered.
        Ok => "ok",
        /// The call failed; the leases it holds run on toward their end.
        Failed => "failed",
    }
}

/// The outcome recorded when an interruption ends a session in mode agent.
pub const OUTCOME_UNKNOWN: &str = "outcome_unknown";

/// The spec's limits on the time-driven events ("Sandbox sessions").
pub mod limits {
    use std::time::Duration;

    /// How long an open may stay in flight before `serve` gives it up (the
    /// process that committed it stopped before it recorded the members'
    /// answers). Far longer than a live open takes: the link's deadlines
    /// (3 s to connect, 4 s per call, all members at once) and the store's
    /// busy timeout (10 s) for recording the answers.
    pub const OPEN_DEADLINE: Duration = Duration::from_secs(60);
    /// An interrupted session in mode commands waits this long to recover.
    pub const INTERRUPTION_WAIT: Duration = Duration::from_secs(30 * 60);
    /// A session is paused for at most this long.
    pub const PAUSE_LIMIT: Duration = Duration::from_secs(7 * 24 * 3600);
    /// The idle timeout's range and default, in seconds.
    pub const IDLE_MIN_SECS: u32 = 60;
    pub const IDLE_MAX_SECS: u32 = 86_400;
    pub const IDLE_DEFAULT_SECS: u32 = 900;
    /// The hard stop's range (`stop_after_seconds`), in seconds of compute:
    /// one hour to seven days (spec: "Hard stop"). No default: without it
    /// a session has no hard stop.
    pub const STOP_AFTER_MIN_SECS: u32 = 3_600;
    pub const STOP_AFTER_MAX_SECS: u32 = 604_800;
}

/// A session's hard stop (spec: "Hard stop"): the most compute time it
/// runs, counted over the running time of every attempt (a pause, an
/// interruption and an open in flight use none), from
/// [`limits::STOP_AFTER_MIN_SECS`] to [`limits::STOP_AFTER_MAX_SECS`]
/// seconds. Only [`StopAfter::new`] makes one, so every entry point (the
/// CLI, the lifecycle's start) checks the range in one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopAfter(u32);

impl StopAfter {
    /// `secs` as a hard stop, or why it is not one (the range).
    pub fn new(secs: u64) -> Result<StopAfter, String> {
        let (min, max) = (limits::STOP_AFTER_MIN_SECS, limits::STOP_AFTER_MAX_SECS);
        match u32::try_from(secs) {
            Ok(s) if (min..=max).contains(&s) => Ok(StopAfter(s)),
            _ => Err(format!(
                "stop_after_seconds {secs} is outside {min}-{max} (one hour to seven days of compute)"
            )),
        }
    }

    /// The limit in seconds.
    pub fn seconds(self) -> u32 {
        self.0
    }

    /// The limit as a span of compute time.
    pub fn limit(self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.0))
    }
}

/// The five steps of the sandbox reset, in order (spec: "The sandbox reset").
pub const RESET_STEPS: [&str; 5] = [
    "instance_terminated",
    "egress_group_checked",
    "credentials_revoked",
    "gateway_ca_destroyed",
    "secrets_detached",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        for s in State::ALL {
            assert_eq!(State::parse(s.as_str()), Some(*s));
        }
        for c in CloseReason::ALL {
            assert_eq!(CloseReason::parse(c.as_str()), Some(*c));
        }
        assert_eq!(Mode::parse("Agent"), None);
    }

    #[test]
    fn a_hard_stop_is_one_hour_to_seven_days() {
        for ok in [3_600, 3_601, 86_400, 604_800] {
            assert_eq!(StopAfter::new(ok).map(StopAfter::seconds), Ok(ok as u32));
        }
        for bad in [0, 59, 3_599, 604_801, u64::from(u32::MAX) + 3_600] {
            let err = StopAfter::new(bad).unwrap_err();
            assert!(err.contains("outside 3600-604800"), "{bad}: {err}");
        }
    }
}
