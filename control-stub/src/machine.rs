//! The session state machine as one function: [`next`] takes a session's
//! state (none: no such session), its mode and an event, and gives the
//! next state with what the transition does ([`Next`]), or the stable
//! refusal ([`Refusal`], which [`Refusal::error`] turns into the command's
//! error). It reads nothing and writes nothing; the lifecycle does what the
//! [`Next`] says, and the store writes a session's state only from one
//! ([`crate::store::Tx::apply`]), so no state changes without a decision
//! here.
//!
//! ```text
//!   (no session) ─ start ──────────────────────────► launching
//!   launching    ─ opened ─────────────────────────► running
//!   launching    ─ open_failed, open_timed_out ────► stopping (start_failed)
//!   running      ─ pause, idle_timeout_pause ──────► paused       (mode commands)
//!   running      ─ interrupt ──────────────────────► interrupted  (mode commands)
//!   running      ─ interrupt ──────────────────────► stopping     (mode agent: interruption_lost)
//!   running      ─ idle_timeout_end ───────────────► stopping     (mode commands)
//!   running      ─ stop_after ─────────────────────► stopping     (the hard stop)
//!   paused       ─ resume ─────────────────────────► resuming
//!   paused       ─ paused_too_long ────────────────► stopping
//!   resuming     ─ opened ─────────────────────────► running
//!   resuming     ─ open_failed, open_timed_out ────► paused
//!   interrupted  ─ recover ────────────────────────► recovering
//!   interrupted  ─ interruption_lost ──────────────► stopping
//!   recovering   ─ opened ─────────────────────────► running
//!   recovering   ─ open_failed, open_timed_out ────► interrupted
//!   any state before the end ─ stop, revoke_all ───► stopping
//!   stopping, reset_incomplete, ended, failed ─ reset_confirmed ──────────► ended
//!   stopping, reset_incomplete, ended, failed ─ reset_confirmed_never_ran ─► failed
//!   stopping, reset_incomplete, ended, failed ─ reset_pending ────────────► reset_incomplete
//!   attach: any state, no change of state; trust: running only, none
//! ```
//!
//! Time-driven events come from `serve`, on the clock it is given (tests
//! move it): the machine decides what they do, and [`compute_used`] says,
//! on that clock, how much of its hard stop a session has used.
//!
//! # The rules
//!
//! - **Mode first.** A session in mode agent cannot pause
//!   (`sandbox_pause_unavailable`, whatever its state, for `pause` and the
//!   idle timeout's pause) and is never idle; an interruption ends it
//!   (`interruption_lost`, outcome `outcome_unknown`). Resume and recover
//!   need no rule of their own: an agent session is never paused or
//!   interrupted, so its state refuses them.
//! - **An end is final.** Every event that would change a session that is
//!   over is refused `sandbox_ended`, but these: `pause`, the idle
//!   timeout's pause and `trust` take the spec's words for a session that
//!   is not running (`sandbox_not_running`), `attach` changes nothing of a
//!   session that is over, and the reset's progress applies only to one.
//! - **Each event from its state**, else the state's refusal: pause,
//!   interrupt, the idle timeout and the hard stop from running
//!   (`sandbox_not_running`);
//!   resume and `paused_too_long` from paused (`sandbox_not_paused`);
//!   recover and `interruption_lost` from interrupted
//!   (`sandbox_not_interrupted`); stop and revoke-all from any state before
//!   the end, an open in flight included (its answers, or `serve` giving it
//!   up, then end its attempt).
//! - **An open's answers** apply only to an open in flight: a session that
//!   ended meanwhile refuses them `sandbox_ended`, one whose open `serve`
//!   gave up `gateway_unreachable` (they came too late); the lifecycle then
//!   still records what they made and owes it a close.
//! - **The reset's end** says whether the session ever ran: one whose
//!   every step is confirmed is `ended`, or `failed` when no attempt of it
//!   ever ran (spec: "the session ended before its instance existed"). The
//!   caller tells which from its attempts, facts that never change once
//!   the session is over (an open's answers that come after the end never
//!   make its attempt run).

use std::time::{Duration, SystemTime};

use crate::error::{Error, LinkError};
use crate::model::{
    limits, words, AttemptEnd, CloseReason, EndReason, Mode, OpenCause, State, OUTCOME_UNKNOWN,
};

words! {
    /// Everything that happens to a session: the commands, the answers to
    /// an open, `serve`'s time-driven events (the clock is the caller's)
    /// and the reset's progress.
    pub enum Event {
        /// `sandbox start`.
        Start => "start",
        /// `sandbox attach`: a client attached.
        Attach => "attach",
        /// `sandbox trust`: the CAs the session trusts now.
        Trust => "trust",
        Pause => "pause",
        Resume => "resume",
        Interrupt => "interrupt",
        Recover => "recover",
        Stop => "stop",
        RevokeAll => "revoke_all",
        /// The members answered an open, and at least one opened: none
        /// refused, none answered something that does not hold together.
        Opened => "opened",
        /// The members answered an open, and none opened, or one refused or
        /// answered something that does not hold together.
        OpenFailed => "open_failed",
        /// `serve`: an open stayed in flight past [`limits::OPEN_DEADLINE`]
        /// (the process that committed it is gone).
        OpenTimedOut => "open_timed_out",
        /// `serve`: idle for the idle timeout, `idle_action` `pause`.
        IdleTimeoutPause => "idle_timeout_pause",
        /// `serve`: idle for the idle timeout, `idle_action` `end`.
        IdleTimeoutEnd => "idle_timeout_end",
        /// `serve`: interrupted, and not recovered within
        /// [`limits::INTERRUPTION_WAIT`].
        InterruptionLost => "interruption_lost",
        /// `serve`: paused for [`limits::PAUSE_LIMIT`].
        PausedTooLong => "paused_too_long",
        /// `serve`: a running session's compute ([`compute_used`]) reached
        /// its hard stop (`stop_after_seconds`).
        StopAfter => "stop_after",
        /// The reset ran and every step is confirmed; an attempt of the
        /// session ran.
        ResetConfirmed => "reset_confirmed",
        /// The reset ran and every step is confirmed; no attempt of the
        /// session ever ran.
        ResetConfirmedNeverRan => "reset_confirmed_never_ran",
        /// The reset ran and a step is not confirmed yet.
        ResetPending => "reset_pending",
    }
}

/// A decided transition: the state to write, and what else it does. Only
/// [`next`] makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Next {
    state: State,
    step: Step,
}

/// What a transition does besides setting the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing is written.
    Nothing,
    /// Idle time counts from now.
    Touch,
    /// A new attempt with this cause is recorded in flight (a start also
    /// records the session); then the members are asked to open it.
    Open(OpenCause),
    /// The open's answers are in and it opened: the attempt runs, idle time
    /// counts from now.
    Run,
    /// The attempt ends (`end`), pending approvals are withdrawn, and a
    /// close (for `close`) is owed to every member whose CA of that attempt
    /// is not confirmed destroyed.
    Drop { end: AttemptEnd, close: CloseReason },
    /// The end is committed: why (and the outcome it implies), every
    /// pending approval withdrawn, and a close (for `close`) owed to every
    /// member whose CA of any attempt is not confirmed destroyed. `attempt`
    /// ends the attempt still running, if one is; `None` when none runs,
    /// or when an open is in flight (its answers, or `serve` giving it up,
    /// end that attempt, and the reset waits for them).
    End {
        why: EndReason,
        attempt: Option<AttemptEnd>,
        close: CloseReason,
    },
    /// The reset ran; the state says whether every step is confirmed.
    Reset,
}

impl Next {
    const fn to(state: State, step: Step) -> Next {
        Next { state, step }
    }

    /// The state the session is in after the transition.
    pub fn state(&self) -> State {
        self.state
    }

    pub fn step(&self) -> Step {
        self.step
    }

    /// Why the session ended, when this transition ends it.
    pub fn end_reason(&self) -> Option<EndReason> {
        match self.step {
            Step::End { why, .. } => Some(why),
            _ => None,
        }
    }

    /// The outcome an end records: `outcome_unknown` for an interruption
    /// that ends the session (spec: "Interruption").
    pub fn outcome(&self) -> Option<&'static str> {
        (self.end_reason() == Some(EndReason::InterruptionLost)).then_some(OUTCOME_UNKNOWN)
    }

    /// Whether idle time counts from this transition.
    pub fn touches(&self) -> bool {
        matches!(self.step, Step::Touch | Step::Run)
    }
}

/// Why an event does not apply: each is one stable error
/// ([`Refusal::error`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No session has the id (`sandbox_not_found`).
    NotFound,
    /// A start for an id a session already has: the store's id generator
    /// failed (`store_failed`).
    Exists,
    /// Mode agent does not pause (`sandbox_pause_unavailable`).
    PauseUnavailable,
    /// Mode agent is never idle (`sandbox_request_invalid`).
    NeverIdle,
    /// `sandbox_not_running`.
    NotRunning,
    /// `sandbox_not_paused`.
    NotPaused,
    /// `sandbox_not_interrupted`.
    NotInterrupted,
    /// `sandbox_ended`: a session that ended never comes back.
    Ended,
    /// An open's answers (or its deadline) for a session whose open is no
    /// longer in flight: `serve` gave it up (`gateway_unreachable`: the
    /// answers came too late).
    NotOpening,
    /// The reset's progress for a session that is not over
    /// (`store_failed`: the reset runs only after an end).
    NotOver,
}

impl Refusal {
    /// The error session `id`, in `state`, is refused with: the code and
    /// message each command has always given.
    pub fn error(self, id: &str, state: Option<State>) -> Error {
        let id = id.to_owned();
        let word = state.map_or("absent", State::as_str);
        match self {
            Refusal::NotFound => Error::SandboxNotFound {
                id: id.chars().take(100).collect(),
            },
            Refusal::Exists => Error::Store(format!("session {id} exists already")),
            Refusal::PauseUnavailable => Error::PauseUnavailable { id },
            Refusal::NeverIdle => Error::invalid(format!(
                "session {id} is in mode agent, which runs its agent for as long as it exists and is never idle"
            )),
            Refusal::NotRunning => Error::NotRunning { id, state: word },
            Refusal::NotPaused => Error::NotPaused { id, state: word },
            Refusal::NotInterrupted => Error::NotInterrupted { id, state: word },
            Refusal::Ended => Error::Ended { id, state: word },
            Refusal::NotOpening => Error::Link(LinkError::Unreachable(format!(
                "session {id} is {word}: the gateways' answers came after the open was given up ({} s without them)",
                limits::OPEN_DEADLINE.as_secs()
            ))),
            Refusal::NotOver => Error::Store(format!(
                "session {id} is {word}: its reset runs only after its end"
            )),
        }
    }
}

/// The refusals that come before the transitions: the mode's rules (spec:
/// "Modes"; "The behaviour table"), and an end being final (only these
/// events read or finish a session that is over).
fn refused_first(state: State, mode: Mode, event: Event) -> Result<(), Refusal> {
    use Event as E;
    match (mode, event) {
        (Mode::Agent, E::Pause | E::IdleTimeoutPause) => return Err(Refusal::PauseUnavailable),
        (Mode::Agent, E::IdleTimeoutEnd) => return Err(Refusal::NeverIdle),
        _ => {}
    }
    if state.is_over()
        && !matches!(
            event,
            E::Attach
                | E::Trust
                | E::Pause
                | E::IdleTimeoutPause
                | E::ResetConfirmed
                | E::ResetConfirmedNeverRan
                | E::ResetPending
        )
    {
        return Err(match event {
            E::Start => Refusal::Exists,
            _ => Refusal::Ended,
        });
    }
    Ok(())
}

/// The transition `event` makes from `state` (`None`: no session has the
/// id) for a session in `mode`: see the module docs for the rules, and the
/// table in this module's tests for every case.
pub fn next(state: Option<State>, mode: Mode, event: Event) -> Result<Next, Refusal> {
    use Event as E;
    use State as S;

    let Some(state) = state else {
        return match event {
            E::Start => Ok(Next::to(S::Launching, Step::Open(OpenCause::Launch))),
            _ => Err(Refusal::NotFound),
        };
    };
    refused_first(state, mode, event)?;
    let end = |why: EndReason, attempt: Option<AttemptEnd>, close: CloseReason| {
        Ok(Next::to(
            S::Stopping,
            Step::End {
                why,
                attempt,
                close,
            },
        ))
    };
    // What an end finds running: the attempt that runs ends with the
    // session; a paused or interrupted session has none, and an open in
    // flight is ended by its answers.
    let running = (state == S::Running).then_some(AttemptEnd::SessionEnded);
    match event {
        E::Start => Err(Refusal::Exists),
        E::Attach if state.is_over() => Ok(Next::to(state, Step::Nothing)),
        E::Attach => Ok(Next::to(state, Step::Touch)),
        E::Trust if state == S::Running => Ok(Next::to(state, Step::Nothing)),
        E::Trust => Err(Refusal::NotRunning),
        E::Pause | E::IdleTimeoutPause if state == S::Running => Ok(Next::to(
            S::Paused,
            Step::Drop {
                end: AttemptEnd::Paused,
                close: CloseReason::Pause,
            },
        )),
        E::Pause | E::IdleTimeoutPause => Err(Refusal::NotRunning),
        E::Interrupt if state != S::Running => Err(Refusal::NotRunning),
        E::Interrupt => match mode {
            Mode::Commands => Ok(Next::to(
                S::Interrupted,
                Step::Drop {
                    end: AttemptEnd::Interrupted,
                    close: CloseReason::Interruption,
                },
            )),
            Mode::Agent => end(
                EndReason::InterruptionLost,
                Some(AttemptEnd::Interrupted),
                CloseReason::Interruption,
            ),
        },
        E::Resume if state == S::Paused => Ok(Next::to(S::Resuming, Step::Open(OpenCause::Resume))),
        E::Resume => Err(Refusal::NotPaused),
        E::Recover if state == S::Interrupted => {
            Ok(Next::to(S::Recovering, Step::Open(OpenCause::Recovery)))
        }
        E::Recover => Err(Refusal::NotInterrupted),
        E::Stop => end(EndReason::Stop, running, CloseReason::End),
        E::RevokeAll => end(EndReason::RevokeAll, running, CloseReason::RevokeAll),
        E::Opened if state.is_opening() => Ok(Next::to(S::Running, Step::Run)),
        E::OpenFailed | E::OpenTimedOut => {
            let undo = Step::Drop {
                end: AttemptEnd::StartFailed,
                close: CloseReason::End,
            };
            match state {
                S::Launching => end(
                    EndReason::StartFailed,
                    Some(AttemptEnd::StartFailed),
                    CloseReason::End,
                ),
                S::Resuming => Ok(Next::to(S::Paused, undo)),
                S::Recovering => Ok(Next::to(S::Interrupted, undo)),
                _ => Err(Refusal::NotOpening),
            }
        }
        E::Opened => Err(Refusal::NotOpening),
        E::IdleTimeoutEnd if state == S::Running => end(
            EndReason::IdleTimeout,
            Some(AttemptEnd::SessionEnded),
            CloseReason::End,
        ),
        E::IdleTimeoutEnd => Err(Refusal::NotRunning),
        E::InterruptionLost if state == S::Interrupted => {
            end(EndReason::InterruptionLost, None, CloseReason::End)
        }
        E::InterruptionLost => Err(Refusal::NotInterrupted),
        E::PausedTooLong if state == S::Paused => {
            end(EndReason::PausedTooLong, None, CloseReason::End)
        }
        E::PausedTooLong => Err(Refusal::NotPaused),
        E::StopAfter if state == S::Running => end(
            EndReason::StopAfter,
            Some(AttemptEnd::SessionEnded),
            CloseReason::End,
        ),
        E::StopAfter => Err(Refusal::NotRunning),
        E::ResetConfirmed if state.is_over() => Ok(Next::to(S::Ended, Step::Reset)),
        E::ResetConfirmedNeverRan if state.is_over() => Ok(Next::to(S::Failed, Step::Reset)),
        E::ResetPending if state.is_over() => Ok(Next::to(S::ResetIncomplete, Step::Reset)),
        E::ResetConfirmed | E::ResetConfirmedNeverRan | E::ResetPending => Err(Refusal::NotOver),
    }
}

/// The compute a session has used by `now` (spec: "Hard stop": "the
/// metered compute seconds of the session across all attempts"): the sum,
/// over its attempts that ran, of each one's running time — from when its
/// open's answers made it run to its end, or to `now` for the attempt that
/// runs. An open in flight, a pause and an interruption use none. `spans`
/// are (began running, ended) per attempt that ran, on the store's clock;
/// `now` is the caller's (tests move it). A span that ends before it
/// begins, or begins after `now`, counts nothing.
pub fn compute_used(
    spans: impl IntoIterator<Item = (SystemTime, Option<SystemTime>)>,
    now: SystemTime,
) -> Duration {
    spans
        .into_iter()
        .map(|(began, ended)| {
            ended
                .unwrap_or(now)
                .duration_since(began)
                .unwrap_or(Duration::ZERO)
        })
        .fold(Duration::ZERO, Duration::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::Event::*;
    use super::State::*;
    use super::*;
    use Refusal as R;

    const C: Mode = Mode::Commands;
    const A: Mode = Mode::Agent;

    const PAUSE: Step = Step::Drop {
        end: AttemptEnd::Paused,
        close: CloseReason::Pause,
    };
    const INTERRUPT: Step = Step::Drop {
        end: AttemptEnd::Interrupted,
        close: CloseReason::Interruption,
    };
    /// A failed or abandoned resume or recovery: its attempt ends
    /// `start_failed`, what it opened is closed.
    const UNDO: Step = Step::Drop {
        end: AttemptEnd::StartFailed,
        close: CloseReason::End,
    };

    type Row = (Option<State>, Mode, Event, Result<Next, Refusal>);

    fn ok(state: State, step: Step) -> Result<Next, Refusal> {
        Ok(Next { state, step })
    }

    fn no(refusal: Refusal) -> Result<Next, Refusal> {
        Err(refusal)
    }

    fn ends(why: EndReason, attempt: Option<AttemptEnd>, close: CloseReason) -> Step {
        Step::End {
            why,
            attempt,
            close,
        }
    }

    /// Every state (none: no such session) × mode × event, with what it
    /// gives: written out, one line each, grouped by event.
    #[rustfmt::skip]
    fn table() -> Vec<Row> {
        vec![
        // Start
        (None,                   C, Start,            ok(Launching, Step::Open(OpenCause::Launch))),
        (None,                   A, Start,            ok(Launching, Step::Open(OpenCause::Launch))),
        (Some(Launching),        C, Start,            no(R::Exists)),
        (Some(Launching),        A, Start,            no(R::Exists)),
        (Some(Running),          C, Start,            no(R::Exists)),
        (Some(Running),          A, Start,            no(R::Exists)),
        (Some(Paused),           C, Start,            no(R::Exists)),
        (Some(Paused),           A, Start,            no(R::Exists)),
        (Some(Resuming),         C, Start,            no(R::Exists)),
        (Some(Resuming),         A, Start,            no(R::Exists)),
        (Some(Interrupted),      C, Start,            no(R::Exists)),
        (Some(Interrupted),      A, Start,            no(R::Exists)),
        (Some(Recovering),       C, Start,            no(R::Exists)),
        (Some(Recovering),       A, Start,            no(R::Exists)),
        (Some(Stopping),         C, Start,            no(R::Exists)),
        (Some(Stopping),         A, Start,            no(R::Exists)),
        (Some(Ended),            C, Start,            no(R::Exists)),
        (Some(Ended),            A, Start,            no(R::Exists)),
        (Some(Failed),           C, Start,            no(R::Exists)),
        (Some(Failed),           A, Start,            no(R::Exists)),
        (Some(ResetIncomplete),  C, Start,            no(R::Exists)),
        (Some(ResetIncomplete),  A, Start,            no(R::Exists)),
        // Attach
        (None,                   C, Attach,           no(R::NotFound)),
        (None,                   A, Attach,           no(R::NotFound)),
        (Some(Launching),        C, Attach,           ok(Launching, Step::Touch)),
        (Some(Launching),        A, Attach,           ok(Launching, Step::Touch)),
        (Some(Running),          C, Attach,           ok(Running, Step::Touch)),
        (Some(Running),          A, Attach,           ok(Running, Step::Touch)),
        (Some(Paused),           C, Attach,           ok(Paused, Step::Touch)),
        (Some(Paused),           A, Attach,           ok(Paused, Step::Touch)),
        (Some(Resuming),         C, Attach,           ok(Resuming, Step::Touch)),
        (Some(Resuming),         A, Attach,           ok(Resuming, Step::Touch)),
        (Some(Interrupted),      C, Attach,           ok(Interrupted, Step::Touch)),
        (Some(Interrupted),      A, Attach,           ok(Interrupted, Step::Touch)),
        (Some(Recovering),       C, Attach,           ok(Recovering, Step::Touch)),
        (Some(Recovering),       A, Attach,           ok(Recovering, Step::Touch)),
        (Some(Stopping),         C, Attach,           ok(Stopping, Step::Nothing)),
        (Some(Stopping),         A, Attach,           ok(Stopping, Step::Nothing)),
        (Some(Ended),            C, Attach,           ok(Ended, Step::Nothing)),
        (Some(Ended),            A, Attach,           ok(Ended, Step::Nothing)),
        (Some(Failed),           C, Attach,           ok(Failed, Step::Nothing)),
        (Some(Failed),           A, Attach,           ok(Failed, Step::Nothing)),
        (Some(ResetIncomplete),  C, Attach,           ok(ResetIncomplete, Step::Nothing)),
        (Some(ResetIncomplete),  A, Attach,           ok(ResetIncomplete, Step::Nothing)),
        // Trust
        (None,                   C, Trust,            no(R::NotFound)),
        (None,                   A, Trust,            no(R::NotFound)),
        (Some(Launching),        C, Trust,            no(R::NotRunning)),
        (Some(Launching),        A, Trust,            no(R::NotRunning)),
        (Some(Running),          C, Trust,            ok(Running, Step::Nothing)),
        (Some(Running),          A, Trust,            ok(Running, Step::Nothing)),
        (Some(Paused),           C, Trust,            no(R::NotRunning)),
        (Some(Paused),           A, Trust,            no(R::NotRunning)),
        (Some(Resuming),         C, Trust,            no(R::NotRunning)),
        (Some(Resuming),         A, Trust,            no(R::NotRunning)),
        (Some(Interrupted),      C, Trust,            no(R::NotRunning)),
        (Some(Interrupted),      A, Trust,            no(R::NotRunning)),
        (Some(Recovering),       C, Trust,            no(R::NotRunning)),
        (Some(Recovering),       A, Trust,            no(R::NotRunning)),
        (Some(Stopping),         C, Trust,            no(R::NotRunning)),
        (Some(Stopping),         A, Trust,            no(R::NotRunning)),
        (Some(Ended),            C, Trust,            no(R::NotRunning)),
        (Some(Ended),            A, Trust,            no(R::NotRunning)),
        (Some(Failed),           C, Trust,            no(R::NotRunning)),
        (Some(Failed),           A, Trust,            no(R::NotRunning)),
        (Some(ResetIncomplete),  C, Trust,            no(R::NotRunning)),
        (Some(ResetIncomplete),  A, Trust,            no(R::NotRunning)),
        // Pause
        (None,                   C, Pause,            no(R::NotFound)),
        (None,                   A, Pause,            no(R::NotFound)),
        (Some(Launching),        C, Pause,            no(R::NotRunning)),
        (Some(Launching),        A, Pause,            no(R::PauseUnavailable)),
        (Some(Running),          C, Pause,            ok(Paused, PAUSE)),
        (Some(Running),          A, Pause,            no(R::PauseUnavailable)),
        (Some(Paused),           C, Pause,            no(R::NotRunning)),
        (Some(Paused),           A, Pause,            no(R::PauseUnavailable)),
        (Some(Resuming),         C, Pause,            no(R::NotRunning)),
        (Some(Resuming),         A, Pause,            no(R::PauseUnavailable)),
        (Some(Interrupted),      C, Pause,            no(R::NotRunning)),
        (Some(Interrupted),      A, Pause,            no(R::PauseUnavailable)),
        (Some(Recovering),       C, Pause,            no(R::NotRunning)),
        (Some(Recovering),       A, Pause,            no(R::PauseUnavailable)),
        (Some(Stopping),         C, Pause,            no(R::NotRunning)),
        (Some(Stopping),         A, Pause,            no(R::PauseUnavailable)),
        (Some(Ended),            C, Pause,            no(R::NotRunning)),
        (Some(Ended),            A, Pause,            no(R::PauseUnavailable)),
        (Some(Failed),           C, Pause,            no(R::NotRunning)),
        (Some(Failed),           A, Pause,            no(R::PauseUnavailable)),
        (Some(ResetIncomplete),  C, Pause,            no(R::NotRunning)),
        (Some(ResetIncomplete),  A, Pause,            no(R::PauseUnavailable)),
        // Resume
        (None,                   C, Resume,           no(R::NotFound)),
        (None,                   A, Resume,           no(R::NotFound)),
        (Some(Launching),        C, Resume,           no(R::NotPaused)),
        (Some(Launching),        A, Resume,           no(R::NotPaused)),
        (Some(Running),          C, Resume,           no(R::NotPaused)),
        (Some(Running),          A, Resume,           no(R::NotPaused)),
        (Some(Paused),           C, Resume,           ok(Resuming, Step::Open(OpenCause::Resume))),
        (Some(Paused),           A, Resume,           ok(Resuming, Step::Open(OpenCause::Resume))),
        (Some(Resuming),         C, Resume,           no(R::NotPaused)),
        (Some(Resuming),         A, Resume,           no(R::NotPaused)),
        (Some(Interrupted),      C, Resume,           no(R::NotPaused)),
        (Some(Interrupted),      A, Resume,           no(R::NotPaused)),
        (Some(Recovering),       C, Resume,           no(R::NotPaused)),
        (Some(Recovering),       A, Resume,           no(R::NotPaused)),
        (Some(Stopping),         C, Resume,           no(R::Ended)),
        (Some(Stopping),         A, Resume,           no(R::Ended)),
        (Some(Ended),            C, Resume,           no(R::Ended)),
        (Some(Ended),            A, Resume,           no(R::Ended)),
        (Some(Failed),           C, Resume,           no(R::Ended)),
        (Some(Failed),           A, Resume,           no(R::Ended)),
        (Some(ResetIncomplete),  C, Resume,           no(R::Ended)),
        (Some(ResetIncomplete),  A, Resume,           no(R::Ended)),
        // Interrupt
        (None,                   C, Interrupt,        no(R::NotFound)),
        (None,                   A, Interrupt,        no(R::NotFound)),
        (Some(Launching),        C, Interrupt,        no(R::NotRunning)),
        (Some(Launching),        A, Interrupt,        no(R::NotRunning)),
        (Some(Running),          C, Interrupt,        ok(Interrupted, INTERRUPT)),
        (Some(Running),          A, Interrupt,        ok(Stopping, ends(EndReason::InterruptionLost, Some(AttemptEnd::Interrupted), CloseReason::Interruption))),
        (Some(Paused),           C, Interrupt,        no(R::NotRunning)),
        (Some(Paused),           A, Interrupt,        no(R::NotRunning)),
        (Some(Resuming),         C, Interrupt,        no(R::NotRunning)),
        (Some(Resuming),         A, Interrupt,        no(R::NotRunning)),
        (Some(Interrupted),      C, Interrupt,        no(R::NotRunning)),
        (Some(Interrupted),      A, Interrupt,        no(R::NotRunning)),
        (Some(Recovering),       C, Interrupt,        no(R::NotRunning)),
        (Some(Recovering),       A, Interrupt,        no(R::NotRunning)),
        (Some(Stopping),         C, Interrupt,        no(R::Ended)),
        (Some(Stopping),         A, Interrupt,        no(R::Ended)),
        (Some(Ended),            C, Interrupt,        no(R::Ended)),
        (Some(Ended),            A, Interrupt,        no(R::Ended)),
        (Some(Failed),           C, Interrupt,        no(R::Ended)),
        (Some(Failed),           A, Interrupt,        no(R::Ended)),
        (Some(ResetIncomplete),  C, Interrupt,        no(R::Ended)),
        (Some(ResetIncomplete),  A, Interrupt,        no(R::Ended)),
        // Recover
        (None,                   C, Recover,          no(R::NotFound)),
        (None,                   A, Recover,          no(R::NotFound)),
        (Some(Launching),        C, Recover,          no(R::NotInterrupted)),
        (Some(Launching),        A, Recover,          no(R::NotInterrupted)),
        (Some(Running),          C, Recover,          no(R::NotInterrupted)),
        (Some(Running),          A, Recover,          no(R::NotInterrupted)),
        (Some(Paused),           C, Recover,          no(R::NotInterrupted)),
        (Some(Paused),           A, Recover,          no(R::NotInterrupted)),
        (Some(Resuming),         C, Recover,          no(R::NotInterrupted)),
        (Some(Resuming),         A, Recover,          no(R::NotInterrupted)),
        (Some(Interrupted),      C, Recover,          ok(Recovering, Step::Open(OpenCause::Recovery))),
        (Some(Interrupted),      A, Recover,          ok(Recovering, Step::Open(OpenCause::Recovery))),
        (Some(Recovering),       C, Recover,          no(R::NotInterrupted)),
        (Some(Recovering),       A, Recover,          no(R::NotInterrupted)),
        (Some(Stopping),         C, Recover,          no(R::Ended)),
        (Some(Stopping),         A, Recover,          no(R::Ended)),
        (Some(Ended),            C, Recover,          no(R::Ended)),
        (Some(Ended),            A, Recover,          no(R::Ended)),
        (Some(Failed),           C, Recover,          no(R::Ended)),
        (Some(Failed),           A, Recover,          no(R::Ended)),
        (Some(ResetIncomplete),  C, Recover,          no(R::Ended)),
        (Some(ResetIncomplete),  A, Recover,          no(R::Ended)),
        // Stop
        (None,                   C, Stop,             no(R::NotFound)),
        (None,                   A, Stop,             no(R::NotFound)),
        (Some(Launching),        C, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Launching),        A, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Running),          C, Stop,             ok(Stopping, ends(EndReason::Stop, Some(AttemptEnd::SessionEnded), CloseReason::End))),
        (Some(Running),          A, Stop,             ok(Stopping, ends(EndReason::Stop, Some(AttemptEnd::SessionEnded), CloseReason::End))),
        (Some(Paused),           C, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Paused),           A, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Resuming),         C, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Resuming),         A, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Interrupted),      C, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Interrupted),      A, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Recovering),       C, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Recovering),       A, Stop,             ok(Stopping, ends(EndReason::Stop, None, CloseReason::End))),
        (Some(Stopping),         C, Stop,             no(R::Ended)),
        (Some(Stopping),         A, Stop,             no(R::Ended)),
        (Some(Ended),            C, Stop,             no(R::Ended)),
        (Some(Ended),            A, Stop,             no(R::Ended)),
        (Some(Failed),           C, Stop,             no(R::Ended)),
        (Some(Failed),           A, Stop,             no(R::Ended)),
        (Some(ResetIncomplete),  C, Stop,             no(R::Ended)),
        (Some(ResetIncomplete),  A, Stop,             no(R::Ended)),
        // RevokeAll
        (None,                   C, RevokeAll,        no(R::NotFound)),
        (None,                   A, RevokeAll,        no(R::NotFound)),
        (Some(Launching),        C, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Launching),        A, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Running),          C, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, Some(AttemptEnd::SessionEnded), CloseReason::RevokeAll))),
        (Some(Running),          A, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, Some(AttemptEnd::SessionEnded), CloseReason::RevokeAll))),
        (Some(Paused),           C, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Paused),           A, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Resuming),         C, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Resuming),         A, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Interrupted),      C, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Interrupted),      A, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Recovering),       C, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Recovering),       A, RevokeAll,        ok(Stopping, ends(EndReason::RevokeAll, None, CloseReason::RevokeAll))),
        (Some(Stopping),         C, RevokeAll,        no(R::Ended)),
        (Some(Stopping),         A, RevokeAll,        no(R::Ended)),
        (Some(Ended),            C, RevokeAll,        no(R::Ended)),
        (Some(Ended),            A, RevokeAll,        no(R::Ended)),
        (Some(Failed),           C, RevokeAll,        no(R::Ended)),
        (Some(Failed),           A, RevokeAll,        no(R::Ended)),
        (Some(ResetIncomplete),  C, RevokeAll,        no(R::Ended)),
        (Some(ResetIncomplete),  A, RevokeAll,        no(R::Ended)),
        // Opened
        (None,                   C, Opened,           no(R::NotFound)),
        (None,                   A, Opened,           no(R::NotFound)),
        (Some(Launching),        C, Opened,           ok(Running, Step::Run)),
        (Some(Launching),        A, Opened,           ok(Running, Step::Run)),
        (Some(Running),          C, Opened,           no(R::NotOpening)),
        (Some(Running),          A, Opened,           no(R::NotOpening)),
        (Some(Paused),           C, Opened,           no(R::NotOpening)),
        (Some(Paused),           A, Opened,           no(R::NotOpening)),
        (Some(Resuming),         C, Opened,           ok(Running, Step::Run)),
        (Some(Resuming),         A, Opened,           ok(Running, Step::Run)),
        (Some(Interrupted),      C, Opened,           no(R::NotOpening)),
        (Some(Interrupted),      A, Opened,           no(R::NotOpening)),
        (Some(Recovering),       C, Opened,           ok(Running, Step::Run)),
        (Some(Recovering),       A, Opened,           ok(Running, Step::Run)),
        (Some(Stopping),         C, Opened,           no(R::Ended)),
        (Some(Stopping),         A, Opened,           no(R::Ended)),
        (Some(Ended),            C, Opened,           no(R::Ended)),
        (Some(Ended),            A, Opened,           no(R::Ended)),
        (Some(Failed),           C, Opened,           no(R::Ended)),
        (Some(Failed),           A, Opened,           no(R::Ended)),
        (Some(ResetIncomplete),  C, Opened,           no(R::Ended)),
        (Some(ResetIncomplete),  A, Opened,           no(R::Ended)),
        // OpenFailed
        (None,                   C, OpenFailed,       no(R::NotFound)),
        (None,                   A, OpenFailed,       no(R::NotFound)),
        (Some(Launching),        C, OpenFailed,       ok(Stopping, ends(EndReason::StartFailed, Some(AttemptEnd::StartFailed), CloseReason::End))),
        (Some(Launching),        A, OpenFailed,       ok(Stopping, ends(EndReason::StartFailed, Some(AttemptEnd::StartFailed), CloseReason::End))),
        (Some(Running),          C, OpenFailed,       no(R::NotOpening)),
        (Some(Running),          A, OpenFailed,       no(R::NotOpening)),
        (Some(Paused),           C, OpenFailed,       no(R::NotOpening)),
        (Some(Paused),           A, OpenFailed,       no(R::NotOpening)),
        (Some(Resuming),         C, OpenFailed,       ok(Paused, UNDO)),
        (Some(Resuming),         A, OpenFailed,       ok(Paused, UNDO)),
        (Some(Interrupted),      C, OpenFailed,       no(R::NotOpening)),
        (Some(Interrupted),      A, OpenFailed,       no(R::NotOpening)),
        (Some(Recovering),       C, OpenFailed,       ok(Interrupted, UNDO)),
        (Some(Recovering),       A, OpenFailed,       ok(Interrupted, UNDO)),
        (Some(Stopping),         C, OpenFailed,       no(R::Ended)),
        (Some(Stopping),         A, OpenFailed,       no(R::Ended)),
        (Some(Ended),            C, OpenFailed,       no(R::Ended)),
        (Some(Ended),            A, OpenFailed,       no(R::Ended)),
        (Some(Failed),           C, OpenFailed,       no(R::Ended)),
        (Some(Failed),           A, OpenFailed,       no(R::Ended)),
        (Some(ResetIncomplete),  C, OpenFailed,       no(R::Ended)),
        (Some(ResetIncomplete),  A, OpenFailed,       no(R::Ended)),
        // OpenTimedOut
        (None,                   C, OpenTimedOut,     no(R::NotFound)),
        (None,                   A, OpenTimedOut,     no(R::NotFound)),
        (Some(Launching),        C, OpenTimedOut,     ok(Stopping, ends(EndReason::StartFailed, Some(AttemptEnd::StartFailed), CloseReason::End))),
        (Some(Launching),        A, OpenTimedOut,     ok(Stopping, ends(EndReason::StartFailed, Some(AttemptEnd::StartFailed), CloseReason::End))),
        (Some(Running),          C, OpenTimedOut,     no(R::NotOpening)),
        (Some(Running),          A, OpenTimedOut,     no(R::NotOpening)),
        (Some(Paused),           C, OpenTimedOut,     no(R::NotOpening)),
        (Some(Paused),           A, OpenTimedOut,     no(R::NotOpening)),
        (Some(Resuming),         C, OpenTimedOut,     ok(Paused, UNDO)),
        (Some(Resuming),         A, OpenTimedOut,     ok(Paused, UNDO)),
        (Some(Interrupted),      C, OpenTimedOut,     no(R::NotOpening)),
        (Some(Interrupted),      A, OpenTimedOut,     no(R::NotOpening)),
        (Some(Recovering),       C, OpenTimedOut,     ok(Interrupted, UNDO)),
        (Some(Recovering),       A, OpenTimedOut,     ok(Interrupted, UNDO)),
        (Some(Stopping),         C, OpenTimedOut,     no(R::Ended)),
        (Some(Stopping),         A, OpenTimedOut,     no(R::Ended)),
        (Some(Ended),            C, OpenTimedOut,     no(R::Ended)),
        (Some(Ended),            A, OpenTimedOut,     no(R::Ended)),
        (Some(Failed),           C, OpenTimedOut,     no(R::Ended)),
        (Some(Failed),           A, OpenTimedOut,     no(R::Ended)),
        (Some(ResetIncomplete),  C, OpenTimedOut,     no(R::Ended)),
        (Some(ResetIncomplete),  A, OpenTimedOut,     no(R::Ended)),
        // IdleTimeoutPause
        (None,                   C, IdleTimeoutPause, no(R::NotFound)),
        (None,                   A, IdleTimeoutPause, no(R::NotFound)),
        (Some(Launching),        C, IdleTimeoutPause, no(R::NotRunning)),
        (Some(Launching),        A, IdleTimeoutPause, no(R::PauseUnavailable)),
        (Some(Running),          C, IdleTimeoutPause, ok(Paused, PAUSE)),
        (Some(Running),          A, IdleTimeoutPause, no(R::PauseUnavailable)),
        (Some(Paused),           C, IdleTimeoutPause, no(R::NotRunning)),
        (Some(Paused),           A, IdleTimeoutPause, no(R::PauseUnavailable)),
        (Some(Resuming),         C, IdleTimeoutPause, no(R::NotRunning)),
        (Some(Resuming),         A, IdleTimeoutPause, no(R::PauseUnavailable)),
        (Some(Interrupted),      C, IdleTimeoutPause, no(R::NotRunning)),
        (Some(Interrupted),      A, IdleTimeoutPause, no(R::PauseUnavailable)),
        (Some(Recovering),       C, IdleTimeoutPause, no(R::NotRunning)),
        (Some(Recovering),       A, IdleTimeoutPause, no(R::PauseUnavailable)),
        (Some(Stopping),         C, IdleTimeoutPause, no(R::NotRunning)),
        (Some(Stopping),         A, IdleTimeoutPause, no(R::PauseUnavailable)),
        (Some(Ended),            C, IdleTimeoutPause, no(R::NotRunning)),
        (Some(Ended),            A, IdleTimeoutPause, no(R::PauseUnavailable)),
        (Some(Failed),           C, IdleTimeoutPause, no(R::NotRunning)),
        (Some(Failed),           A, IdleTimeoutPause, no(R::PauseUnavailable)),
        (Some(ResetIncomplete),  C, IdleTimeoutPause, no(R::NotRunning)),
        (Some(ResetIncomplete),  A, IdleTimeoutPause, no(R::PauseUnavailable)),
        // IdleTimeoutEnd
        (None,                   C, IdleTimeoutEnd,   no(R::NotFound)),
        (None,                   A, IdleTimeoutEnd,   no(R::NotFound)),
        (Some(Launching),        C, IdleTimeoutEnd,   no(R::NotRunning)),
        (Some(Launching),        A, IdleTimeoutEnd,   no(R::NeverIdle)),
        (Some(Running),          C, IdleTimeoutEnd,   ok(Stopping, ends(EndReason::IdleTimeout, Some(AttemptEnd::SessionEnded), CloseReason::End))),
        (Some(Running),          A, IdleTimeoutEnd,   no(R::NeverIdle)),
        (Some(Paused),           C, IdleTimeoutEnd,   no(R::NotRunning)),
        (Some(Paused),           A, IdleTimeoutEnd,   no(R::NeverIdle)),
        (Some(Resuming),         C, IdleTimeoutEnd,   no(R::NotRunning)),
        (Some(Resuming),         A, IdleTimeoutEnd,   no(R::NeverIdle)),
        (Some(Interrupted),      C, IdleTimeoutEnd,   no(R::NotRunning)),
        (Some(Interrupted),      A, IdleTimeoutEnd,   no(R::NeverIdle)),
        (Some(Recovering),       C, IdleTimeoutEnd,   no(R::NotRunning)),
        (Some(Recovering),       A, IdleTimeoutEnd,   no(R::NeverIdle)),
        (Some(Stopping),         C, IdleTimeoutEnd,   no(R::Ended)),
        (Some(Stopping),         A, IdleTimeoutEnd,   no(R::NeverIdle)),
        (Some(Ended),            C, IdleTimeoutEnd,   no(R::Ended)),
        (Some(Ended),            A, IdleTimeoutEnd,   no(R::NeverIdle)),
        (Some(Failed),           C, IdleTimeoutEnd,   no(R::Ended)),
        (Some(Failed),           A, IdleTimeoutEnd,   no(R::NeverIdle)),
        (Some(ResetIncomplete),  C, IdleTimeoutEnd,   no(R::Ended)),
        (Some(ResetIncomplete),  A, IdleTimeoutEnd,   no(R::NeverIdle)),
        // InterruptionLost
        (None,                   C, InterruptionLost, no(R::NotFound)),
        (None,                   A, InterruptionLost, no(R::NotFound)),
        (Some(Launching),        C, InterruptionLost, no(R::NotInterrupted)),
        (Some(Launching),        A, InterruptionLost, no(R::NotInterrupted)),
        (Some(Running),          C, InterruptionLost, no(R::NotInterrupted)),
        (Some(Running),          A, InterruptionLost, no(R::NotInterrupted)),
        (Some(Paused),           C, InterruptionLost, no(R::NotInterrupted)),
        (Some(Paused),           A, InterruptionLost, no(R::NotInterrupted)),
        (Some(Resuming),         C, InterruptionLost, no(R::NotInterrupted)),
        (Some(Resuming),         A, InterruptionLost, no(R::NotInterrupted)),
        (Some(Interrupted),      C, InterruptionLost, ok(Stopping, ends(EndReason::InterruptionLost, None, CloseReason::End))),
        (Some(Interrupted),      A, InterruptionLost, ok(Stopping, ends(EndReason::InterruptionLost, None, CloseReason::End))),
        (Some(Recovering),       C, InterruptionLost, no(R::NotInterrupted)),
        (Some(Recovering),       A, InterruptionLost, no(R::NotInterrupted)),
        (Some(Stopping),         C, InterruptionLost, no(R::Ended)),
        (Some(Stopping),         A, InterruptionLost, no(R::Ended)),
        (Some(Ended),            C, InterruptionLost, no(R::Ended)),
        (Some(Ended),            A, InterruptionLost, no(R::Ended)),
        (Some(Failed),           C, InterruptionLost, no(R::Ended)),
        (Some(Failed),           A, InterruptionLost, no(R::Ended)),
        (Some(ResetIncomplete),  C, InterruptionLost, no(R::Ended)),
        (Some(ResetIncomplete),  A, InterruptionLost, no(R::Ended)),
        // PausedTooLong
        (None,                   C, PausedTooLong,    no(R::NotFound)),
        (None,                   A, PausedTooLong,    no(R::NotFound)),
        (Some(Launching),        C, PausedTooLong,    no(R::NotPaused)),
        (Some(Launching),        A, PausedTooLong,    no(R::NotPaused)),
        (Some(Running),          C, PausedTooLong,    no(R::NotPaused)),
        (Some(Running),          A, PausedTooLong,    no(R::NotPaused)),
        (Some(Paused),           C, PausedTooLong,    ok(Stopping, ends(EndReason::PausedTooLong, None, CloseReason::End))),
        (Some(Paused),           A, PausedTooLong,    ok(Stopping, ends(EndReason::PausedTooLong, None, CloseReason::End))),
        (Some(Resuming),         C, PausedTooLong,    no(R::NotPaused)),
        (Some(Resuming),         A, PausedTooLong,    no(R::NotPaused)),
        (Some(Interrupted),      C, PausedTooLong,    no(R::NotPaused)),
        (Some(Interrupted),      A, PausedTooLong,    no(R::NotPaused)),
        (Some(Recovering),       C, PausedTooLong,    no(R::NotPaused)),
        (Some(Recovering),       A, PausedTooLong,    no(R::NotPaused)),
        (Some(Stopping),         C, PausedTooLong,    no(R::Ended)),
        (Some(Stopping),         A, PausedTooLong,    no(R::Ended)),
        (Some(Ended),            C, PausedTooLong,    no(R::Ended)),
        (Some(Ended),            A, PausedTooLong,    no(R::Ended)),
        (Some(Failed),           C, PausedTooLong,    no(R::Ended)),
        (Some(Failed),           A, PausedTooLong,    no(R::Ended)),
        (Some(ResetIncomplete),  C, PausedTooLong,    no(R::Ended)),
        (Some(ResetIncomplete),  A, PausedTooLong,    no(R::Ended)),
        // StopAfter
        (None,                   C, StopAfter,        no(R::NotFound)),
        (None,                   A, StopAfter,        no(R::NotFound)),
        (Some(Launching),        C, StopAfter,        no(R::NotRunning)),
        (Some(Launching),        A, StopAfter,        no(R::NotRunning)),
        (Some(Running),          C, StopAfter,        ok(Stopping, ends(EndReason::StopAfter, Some(AttemptEnd::SessionEnded), CloseReason::End))),
        (Some(Running),          A, StopAfter,        ok(Stopping, ends(EndReason::StopAfter, Some(AttemptEnd::SessionEnded), CloseReason::End))),
        (Some(Paused),           C, StopAfter,        no(R::NotRunning)),
        (Some(Paused),           A, StopAfter,        no(R::NotRunning)),
        (Some(Resuming),         C, StopAfter,        no(R::NotRunning)),
        (Some(Resuming),         A, StopAfter,        no(R::NotRunning)),
        (Some(Interrupted),      C, StopAfter,        no(R::NotRunning)),
        (Some(Interrupted),      A, StopAfter,        no(R::NotRunning)),
        (Some(Recovering),       C, StopAfter,        no(R::NotRunning)),
        (Some(Recovering),       A, StopAfter,        no(R::NotRunning)),
        (Some(Stopping),         C, StopAfter,        no(R::Ended)),
        (Some(Stopping),         A, StopAfter,        no(R::Ended)),
        (Some(Ended),            C, StopAfter,        no(R::Ended)),
        (Some(Ended),            A, StopAfter,        no(R::Ended)),
        (Some(Failed),           C, StopAfter,        no(R::Ended)),
        (Some(Failed),           A, StopAfter,        no(R::Ended)),
        (Some(ResetIncomplete),  C, StopAfter,        no(R::Ended)),
        (Some(ResetIncomplete),  A, StopAfter,        no(R::Ended)),
        // ResetConfirmed
        (None,                   C, ResetConfirmed,   no(R::NotFound)),
        (None,                   A, ResetConfirmed,   no(R::NotFound)),
        (Some(Launching),        C, ResetConfirmed,   no(R::NotOver)),
        (Some(Launching),        A, ResetConfirmed,   no(R::NotOver)),
        (Some(Running),          C, ResetConfirmed,   no(R::NotOver)),
        (Some(Running),          A, ResetConfirmed,   no(R::NotOver)),
        (Some(Paused),           C, ResetConfirmed,   no(R::NotOver)),
        (Some(Paused),           A, ResetConfirmed,   no(R::NotOver)),
        (Some(Resuming),         C, ResetConfirmed,   no(R::NotOver)),
        (Some(Resuming),         A, ResetConfirmed,   no(R::NotOver)),
        (Some(Interrupted),      C, ResetConfirmed,   no(R::NotOver)),
        (Some(Interrupted),      A, ResetConfirmed,   no(R::NotOver)),
        (Some(Recovering),       C, ResetConfirmed,   no(R::NotOver)),
        (Some(Recovering),       A, ResetConfirmed,   no(R::NotOver)),
        (Some(Stopping),         C, ResetConfirmed,   ok(Ended, Step::Reset)),
        (Some(Stopping),         A, ResetConfirmed,   ok(Ended, Step::Reset)),
        (Some(Ended),            C, ResetConfirmed,   ok(Ended, Step::Reset)),
        (Some(Ended),            A, ResetConfirmed,   ok(Ended, Step::Reset)),
        (Some(Failed),           C, ResetConfirmed,   ok(Ended, Step::Reset)),
        (Some(Failed),           A, ResetConfirmed,   ok(Ended, Step::Reset)),
        (Some(ResetIncomplete),  C, ResetConfirmed,   ok(Ended, Step::Reset)),
        (Some(ResetIncomplete),  A, ResetConfirmed,   ok(Ended, Step::Reset)),
        // ResetConfirmedNeverRan
        (None,                   C, ResetConfirmedNeverRan, no(R::NotFound)),
        (None,                   A, ResetConfirmedNeverRan, no(R::NotFound)),
        (Some(Launching),        C, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Launching),        A, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Running),          C, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Running),          A, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Paused),           C, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Paused),           A, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Resuming),         C, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Resuming),         A, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Interrupted),      C, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Interrupted),      A, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Recovering),       C, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Recovering),       A, ResetConfirmedNeverRan, no(R::NotOver)),
        (Some(Stopping),         C, ResetConfirmedNeverRan, ok(Failed, Step::Reset)),
        (Some(Stopping),         A, ResetConfirmedNeverRan, ok(Failed, Step::Reset)),
        (Some(Ended),            C, ResetConfirmedNeverRan, ok(Failed, Step::Reset)),
        (Some(Ended),            A, ResetConfirmedNeverRan, ok(Failed, Step::Reset)),
        (Some(Failed),           C, ResetConfirmedNeverRan, ok(Failed, Step::Reset)),
        (Some(Failed),           A, ResetConfirmedNeverRan, ok(Failed, Step::Reset)),
        (Some(ResetIncomplete),  C, ResetConfirmedNeverRan, ok(Failed, Step::Reset)),
        (Some(ResetIncomplete),  A, ResetConfirmedNeverRan, ok(Failed, Step::Reset)),
        // ResetPending
        (None,                   C, ResetPending,     no(R::NotFound)),
        (None,                   A, ResetPending,     no(R::NotFound)),
        (Some(Launching),        C, ResetPending,     no(R::NotOver)),
        (Some(Launching),        A, ResetPending,     no(R::NotOver)),
        (Some(Running),          C, ResetPending,     no(R::NotOver)),
        (Some(Running),          A, ResetPending,     no(R::NotOver)),
        (Some(Paused),           C, ResetPending,     no(R::NotOver)),
        (Some(Paused),           A, ResetPending,     no(R::NotOver)),
        (Some(Resuming),         C, ResetPending,     no(R::NotOver)),
        (Some(Resuming),         A, ResetPending,     no(R::NotOver)),
        (Some(Interrupted),      C, ResetPending,     no(R::NotOver)),
        (Some(Interrupted),      A, ResetPending,     no(R::NotOver)),
        (Some(Recovering),       C, ResetPending,     no(R::NotOver)),
        (Some(Recovering),       A, ResetPending,     no(R::NotOver)),
        (Some(Stopping),         C, ResetPending,     ok(ResetIncomplete, Step::Reset)),
        (Some(Stopping),         A, ResetPending,     ok(ResetIncomplete, Step::Reset)),
        (Some(Ended),            C, ResetPending,     ok(ResetIncomplete, Step::Reset)),
        (Some(Ended),            A, ResetPending,     ok(ResetIncomplete, Step::Reset)),
        (Some(Failed),           C, ResetPending,     ok(ResetIncomplete, Step::Reset)),
        (Some(Failed),           A, ResetPending,     ok(ResetIncomplete, Step::Reset)),
        (Some(ResetIncomplete),  C, ResetPending,     ok(ResetIncomplete, Step::Reset)),
        (Some(ResetIncomplete),  A, ResetPending,     ok(ResetIncomplete, Step::Reset)),
        ]
    }

    #[test]
    fn compute_counts_running_time_only() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Ran 50 minutes, paused for 2 hours, runs again since: at 2 h 59
        // min it has used 59 minutes, the pause none.
        let spans = [(at(0), Some(at(3_000))), (at(10_200), None)];
        assert_eq!(
            compute_used(spans, at(10_200 + 540)),
            Duration::from_secs(3_540)
        );
        // An attempt whose end the clock puts before its start, or one that
        // began after `now` (a clock stepped back), counts nothing.
        assert_eq!(
            compute_used([(at(50), Some(at(10))), (at(500), None)], at(100)),
            Duration::ZERO
        );
        assert_eq!(compute_used([], at(100)), Duration::ZERO);
    }

    #[test]
    fn every_transition_is_the_tables() {
        for (state, mode, event, want) in table() {
            assert_eq!(
                next(state, mode, event),
                want,
                "{state:?} × {mode} × {event}"
            );
        }
    }

    #[test]
    fn the_table_lists_every_state_mode_and_event_once() {
        let table = table();
        let states = std::iter::once(None).chain(State::ALL.iter().copied().map(Some));
        let mut n = 0;
        for state in states {
            for &mode in Mode::ALL {
                for &event in Event::ALL {
                    let rows = table
                        .iter()
                        .filter(|(s, m, e, _)| (*s, *m, *e) == (state, mode, event))
                        .count();
                    assert_eq!(rows, 1, "{state:?} × {mode} × {event}: {rows} rows");
                    n += 1;
                }
            }
        }
        assert_eq!(table.len(), n, "the table has rows for no combination");
    }

    #[test]
    fn each_refusal_is_the_commands_stable_error() {
        let cases = [
            (R::NotFound, None, "sandbox_not_found", "no session sbx-1"),
            (R::PauseUnavailable, Some(Running), "sandbox_pause_unavailable",
             "session sbx-1 is in mode agent, and only a session in mode commands can pause"),
            (R::NotRunning, Some(Ended), "sandbox_not_running", "session sbx-1 is ended, not running"),
            (R::NotPaused, Some(Resuming), "sandbox_not_paused", "session sbx-1 is resuming, not paused"),
            (R::NotInterrupted, Some(Running), "sandbox_not_interrupted",
             "session sbx-1 is running, not interrupted"),
            (R::Ended, Some(ResetIncomplete), "sandbox_ended",
             "session sbx-1 has ended (reset_incomplete); a session that ended never comes back"),
            (R::NeverIdle, Some(Running), "sandbox_request_invalid",
             "session sbx-1 is in mode agent, which runs its agent for as long as it exists and is never idle"),
            (R::NotOpening, Some(Paused), "gateway_unreachable",
             "gateways unreachable: session sbx-1 is paused: the gateways' answers came after the open was given up (60 s without them)"),
            (R::Exists, Some(Running), "store_failed", "store: session sbx-1 exists already"),
            (R::NotOver, Some(Running), "store_failed",
             "store: session sbx-1 is running: its reset runs only after its end"),
        ];
        for (refusal, state, code, message) in cases {
            let e = refusal.error("sbx-1", state);
            assert_eq!(
                (e.code(), e.to_string().as_str()),
                (code, message),
                "{refusal:?}"
            );
        }
    }
}
