//! Waiting for what another process or task does: check until it has
//! happened, within a deadline generous enough for a loaded machine. A
//! wait that runs out panics, saying what did not happen and what was
//! seen last, so a test never asserts on a guess about timing.

use std::time::{Duration, Instant};

/// How long a test waits for an event before it fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// How often a condition that gives no signal is checked again.
const POLL: Duration = Duration::from_millis(20);

/// Check `probe` until it gives `Ok`, for at most [`DEADLINE`]; blocks
/// the thread between checks. Panics with `what` and the last `Err`.
pub fn until<T, E: std::fmt::Debug>(what: &str, mut probe: impl FnMut() -> Result<T, E>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => panic!(
                "waited {} s for {what}; last seen: {last:?}",
                DEADLINE.as_secs()
            ),
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// [`until`] for async tests: sleeps on the runtime between checks, so
/// the test's own servers (origin, DNS, client connections) go on.
pub async fn until_async<T, E: std::fmt::Debug>(
    what: &str,
    mut probe: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => panic!(
                "waited {} s for {what}; last seen: {last:?}",
                DEADLINE.as_secs()
            ),
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// `Ok(v)` when `done(&v)`, else `Err(v)`: a probe from a reading and a
/// condition on it.
pub fn check<T>(v: T, done: impl FnOnce(&T) -> bool) -> Result<T, T> {
    if done(&v) {
        Ok(v)
    } else {
        Err(v)
    }
}

/// Wait until `span` has passed since `since`, on the runtime: for a test
/// that must let a span of time run out (a lease nobody renews) and has
/// no event to wait on but the passing of time itself. Not a race: the
/// span is measured from the fault, so whatever the machine's load, it
/// has passed when this returns.
pub async fn past(since: Instant, span: Duration) {
    tokio::time::sleep_until(tokio::time::Instant::from_std(since + span)).await;
}
