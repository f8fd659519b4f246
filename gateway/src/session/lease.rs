//! Authority leases: an authority nobody renews ends by itself.
//!
//! Every authority the control plane opens carries a lease; the control
//! plane renews the leases of its live sessions on every member at a
//! fixed interval (`RenewLeases`). A member drops an authority whose lease
//! has lapsed by its own clock exactly as a close does, and signs a drop
//! report with the reason `lease_expired` (see [`crate::authority`]). The
//! lapse is checked at every new connection and every request, and a
//! watcher drops lapsed authorities even when no traffic comes, so a member
//! that wakes from a long stop (SIGSTOP, a frozen VM, a partition) serves
//! no request of an authority that ended meanwhile.
//!
//! # The clock
//!
//! Leases are read against a [`Clock`] that never goes backwards and counts
//! time the machine spent suspended: `CLOCK_BOOTTIME`. The wall clock can
//! jump (NTP, an operator), and `CLOCK_MONOTONIC` (what `Instant` reads)
//! stops while the machine sleeps, which would stretch a lease by the
//! length of the sleep. Tests inject a [`ManualClock`].
//!
//! A renewal never brings back an authority whose lease has lapsed: the
//! lapse is a fact at the moment it is observed, whatever comes after.
//!
//! # A process woken from a freeze
//!
//! A member stopped (SIGSTOP, a frozen VM, a long pause) inside its
//! leases misses what the control plane did meanwhile: a Stop whose close
//! could not reach it leaves the session's lease live here until it runs
//! out. So the process watches itself ([`Awake`]): a thread of its own
//! ticks every [`TICK`], and a tick that comes more than [`FREEZE_AFTER`]
//! after the one before means the process was frozen. Every use of a
//! lease checks the same thing against the last tick (one more atomic
//! load beside the clock read it makes anyway), so a request served by a
//! worker that woke before the ticker did is caught too. From the freeze
//! on, every leased authority is **suspended** until the control plane
//! next renews it: its connections and requests are refused
//! `session_ended` (cause `suspended_after_freeze`); nothing is ended or
//! reported, and the first renewal serves it again. An authority the
//! control plane ended meanwhile is never renewed: its retried close ends
//! it, or its lease lapses. Authorities without a lease (the config's
//! static sessions) are not suspended: no control plane could have ended
//! them.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A point on a [`Clock`], in milliseconds since the clock's origin.
pub type Millis = u64;

/// A clock that never goes backwards and counts suspended time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now, in milliseconds since the clock's origin.
    fn now(&self) -> Millis;

    /// Whether the process was frozen, as this clock tells (none: never).
    fn awake(&self) -> Option<&Awake> {
        None
    }
}

/// How often the process's own ticker ticks.
pub const TICK: Duration = Duration::from_millis(250);

/// A gap between two ticks longer than this is a freeze. Far beyond what a
/// busy machine delays a sleeping thread, short enough that a member woken
/// from a freeze serves nothing of what it may have missed.
pub const FREEZE_AFTER: Duration = Duration::from_secs(2);

/// Whether the process was frozen, and since when: see the module docs.
#[derive(Debug, Default)]
pub struct Awake {
    /// The last tick (0: the ticker has not started; nothing is judged).
    last_tick: AtomicU64,
    /// Where the last freeze began to count: leases renewed before it are
    /// suspended (0: no freeze yet).
    frozen_at: AtomicU64,
}

impl Awake {
    /// The ticker's tick at `now`: the length of the freeze it ends, if
    /// the tick before came more than [`FREEZE_AFTER`] earlier.
    pub fn tick(&self, now: Millis) -> Option<Duration> {
        let last = self.last_tick.swap(now, Ordering::AcqRel);
        let gap = now.saturating_sub(last);
        (last != 0 && gap > millis(FREEZE_AFTER)).then(|| {
            self.frozen_at
                .fetch_max(last + millis(FREEZE_AFTER), Ordering::AcqRel);
            Duration::from_millis(gap)
        })
    }

    /// Whether a lease last renewed at `renewed_at` is suspended at `now`.
    /// A freeze the ticker has not seen yet (it may wake after the worker
    /// asking) is seen here: the last tick is too old.
    fn suspends(&self, renewed_at: Millis, now: Millis) -> bool {
        let last = self.last_tick.load(Ordering::Acquire);
        if last != 0 && now.saturating_sub(last) > millis(FREEZE_AFTER) {
            // The freeze counts from where the ticks stopped plus the
            // bound, the same point the ticker sets: renewals after the
            // wake are later.
            self.frozen_at
                .fetch_max(last + millis(FREEZE_AFTER), Ordering::AcqRel);
        }
        renewed_at < self.frozen_at.load(Ordering::Acquire)
    }
}

/// `CLOCK_BOOTTIME`: the time since boot, suspend included; and whether
/// the process was frozen ([`Awake`]).
#[derive(Debug, Default)]
pub struct BootClock {
    awake: Awake,
}

impl Clock for BootClock {
    fn awake(&self) -> Option<&Awake> {
        Some(&self.awake)
    }

    fn now(&self) -> Millis {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        // Seconds since boot fit a u64 of milliseconds for 584 million years.
        (t.tv_sec as u64)
            .saturating_mul(1000)
            .saturating_add(t.tv_nsec as u64 / 1_000_000)
    }
}

/// A clock that moves only when told: for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
    awake: Awake,
}

impl ManualClock {
    /// A clock at `start`.
    pub fn new(start: Millis) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now: AtomicU64::new(start),
            awake: Awake::default(),
        })
    }

    /// Move the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(
            u64::try_from(by.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }

    fn awake(&self) -> Option<&Awake> {
        Some(&self.awake)
    }
}

/// The clock the gateway reads leases against.
pub type SharedClock = Arc<dyn Clock>;

/// The clock of a running gateway.
pub fn boot_clock() -> SharedClock {
    Arc::new(BootClock::default())
}

/// Start the process's ticker (see the module docs) on a thread of its
/// own, for the process's life: a freeze it sees is logged and counted in
/// `gateway_freezes_total`.
pub fn start_ticker(clock: SharedClock) {
    let spawned = std::thread::Builder::new()
        .name("awake".into())
        .spawn(move || loop {
            if let Some(awake) = clock.awake() {
                if let Some(gap) = awake.tick(clock.now()) {
                    tracing::warn!(
                        frozen_ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX),
                        "the process was frozen: every leased authority is suspended until the control plane renews it"
                    );
                    metrics::counter!("gateway_freezes_total").increment(1);
                }
            }
            std::thread::sleep(TICK);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the freeze ticker");
    }
}

/// One authority's lease.
///
/// # Limits
///
/// A lease is one atomic word; checking it is one clock read (a vDSO call,
/// no system call) and one load, on every new connection and request.
pub struct Lease {
    clock: SharedClock,
    /// Told when a use finds the lease lapsed, so the authority is dropped
    /// at once rather than at the watcher's next look.
    on_lapse: Option<Arc<tokio::sync::Notify>>,
    // invariant: `until` only moves forward while the lease is live, and
    // `NONE` means the authority has no lease (a static session from the
    // config file, which no control plane renews). Once `now >= until`
    // the lease is lapsed for good: `renew` checks liveness first, so no
    // renewal can move a lapsed `until` again.
    until: AtomicU64,
    /// When the lease was last given or renewed: a freeze after it
    /// suspends the authority ([`Awake`]).
    renewed_at: AtomicU64,
}

/// `until` of an authority without a lease.
const NONE: u64 = u64::MAX;

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.until.load(Ordering::Acquire) {
            NONE => f.write_str("Lease(none)"),
            until => write!(f, "Lease(until {until} ms)"),
        }
    }
}

impl Lease {
    /// A lease of `length` from now; `on_lapse` is told when a use finds
    /// it lapsed.
    pub fn new(
        clock: SharedClock,
        length: Duration,
        on_lapse: Option<Arc<tokio::sync::Notify>>,
    ) -> Lease {
        let now = clock.now();
        let until = now.saturating_add(millis(length));
        Lease {
            clock,
            on_lapse,
            until: AtomicU64::new(until.min(NONE - 1)),
            renewed_at: AtomicU64::new(now),
        }
    }

    /// A lease ending at `until` on `clock` (a lease handed over by the
    /// process that gave it: both read `CLOCK_BOOTTIME`).
    pub fn ending_at(
        clock: SharedClock,
        until: Millis,
        on_lapse: Option<Arc<tokio::sync::Notify>>,
    ) -> Lease {
        let now = clock.now();
        Lease {
            clock,
            on_lapse,
            until: AtomicU64::new(until.min(NONE - 1)),
            renewed_at: AtomicU64::new(now),
        }
    }

    /// The authority went to a successor process, which holds its lease
    /// now and ends it there and here ([`crate::process::link`]): this
    /// process stops reading the lease.
    pub fn hand_over(&self) {
        self.until.store(NONE, Ordering::Release);
    }

    /// Where the lease ends; `None` without a lease.
    pub fn until(&self) -> Option<Millis> {
        match self.until.load(Ordering::Acquire) {
            NONE => None,
            until => Some(until),
        }
    }

    /// No lease: the authority lives until it is closed.
    pub fn none(clock: SharedClock) -> Lease {
        Lease {
            clock,
            on_lapse: None,
            until: AtomicU64::new(NONE),
            renewed_at: AtomicU64::new(0),
        }
    }

    /// Whether the authority may be used now: its lease not lapsed, and
    /// not suspended after a freeze of the process ([`Awake`]).
    pub fn live(&self) -> bool {
        let now = self.clock.now();
        let until = self.until.load(Ordering::Acquire);
        if now >= until {
            if let Some(n) = &self.on_lapse {
                n.notify_one();
            }
            return false;
        }
        until == NONE
            || !self
                .clock
                .awake()
                .is_some_and(|a| a.suspends(self.renewed_at.load(Ordering::Acquire), now))
    }

    /// Whether the lease has lapsed (a use refused for a suspension after
    /// a freeze, [`Lease::live`], is not a lapse).
    pub fn lapsed(&self) -> bool {
        !self.live_at(self.clock.now())
    }

    /// Whether the authority has a lease at all.
    pub fn is_leased(&self) -> bool {
        self.until.load(Ordering::Acquire) != NONE
    }

    /// Extend the lease to `length` from now, if it is live now. Returns
    /// whether it was renewed; a lapsed lease stays lapsed.
    pub fn renew(&self, length: Duration) -> bool {
        self.renew_from(length, Duration::ZERO)
    }

    /// Extend the lease to `length` from `age` ago (when the control plane
    /// read what the renewal says), if it is live now: a renewal that was
    /// held up on its way grants only what is left of it, and counts as
    /// news of the control plane from then (a suspension after a freeze,
    /// [`Lease::live`], lifts only for news from after the freeze). Returns
    /// whether the lease is still live and held; a lapsed lease stays
    /// lapsed.
    pub fn renew_from(&self, length: Duration, age: Duration) -> bool {
        let now = self.clock.now();
        let from = now.saturating_sub(millis(age));
        let new = from.saturating_add(millis(length)).min(NONE - 1);
        let mut current = self.until.load(Ordering::Acquire);
        loop {
            if current == NONE {
                return true;
            }
            if now >= current {
                return false;
            }
            if new <= current {
                // Renewed all the same: the control plane still holds it.
                self.renewed_at.fetch_max(from, Ordering::AcqRel);
                return true;
            }
            match self
                .until
                .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.renewed_at.fetch_max(from, Ordering::AcqRel);
                    return true;
                }
                Err(seen) => current = seen,
            }
        }
    }

    /// How long the lease has left; `None` without a lease, zero once
    /// lapsed.
    pub fn left(&self) -> Option<Duration> {
        self.left_at(self.clock.now())
    }

    /// Whether the lease is live at `now`, a reading of its clock taken
    /// once for many leases (the watcher's pass); unlike [`Lease::live`]
    /// it tells nobody of a lapse: the caller is the one told.
    pub fn live_at(&self, now: Millis) -> bool {
        now < self.until.load(Ordering::Acquire)
    }

    /// What is left of the lease at `now` (see [`Lease::live_at`]); none
    /// without a lease, zero once lapsed.
    pub fn left_at(&self, now: Millis) -> Option<Duration> {
        match self.until.load(Ordering::Acquire) {
            NONE => None,
            until => Some(Duration::from_millis(until.saturating_sub(now))),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_lapses_and_no_renewal_brings_it_back() {
        let clock = ManualClock::new(1_000);
        let lapsed = Arc::new(tokio::sync::Notify::new());
        let lease = Lease::new(clock.clone(), Duration::from_secs(10), Some(lapsed.clone()));
        assert!(lease.live());
        assert_eq!(lease.left(), Some(Duration::from_secs(10)));
        clock.advance(Duration::from_secs(6));
        assert!(lease.renew(Duration::from_secs(10)));
        clock.advance(Duration::from_secs(9));
        assert!(lease.live(), "renewed at 6 s for 10 s: live at 15 s");
        clock.advance(Duration::from_secs(1));
        assert!(!lease.live(), "lapsed at exactly 16 s");
        // The use that found it lapsed told the watcher.
        assert!(futures_ready(lapsed.notified()));
        assert!(!lease.renew(Duration::from_secs(10)));
        assert!(!lease.live());
        assert_eq!(lease.left(), Some(Duration::ZERO));
    }

    #[test]
    fn a_renewal_held_up_on_its_way_runs_from_when_it_was_decided() {
        let clock = ManualClock::new(1_000);
        let lease = Lease::new(clock.clone(), Duration::from_secs(10), None);
        clock.advance(Duration::from_secs(8));
        // Decided 7 s ago (its replica froze between its read and its
        // call): 3 s left of it, not 10.
        assert!(lease.renew_from(Duration::from_secs(10), Duration::from_secs(7)));
        assert_eq!(lease.left(), Some(Duration::from_secs(3)));
        // One decided before the lease's own start grants nothing more,
        // and never shortens it.
        assert!(lease.renew_from(Duration::from_secs(10), Duration::from_secs(20)));
        assert_eq!(lease.left(), Some(Duration::from_secs(3)));
        clock.advance(Duration::from_secs(3));
        assert!(!lease.live(), "lapsed 10 s after the decision");
    }

    #[test]
    fn a_freeze_is_lifted_only_by_news_from_after_it() {
        let clock = ManualClock::new(1_000);
        let shared: SharedClock = clock.clone();
        let lease = Lease::new(Arc::clone(&shared), Duration::from_secs(60), None);
        let awake = clock.awake().unwrap();
        assert_eq!(awake.tick(clock.now()), None);
        clock.advance(Duration::from_secs(10));
        assert!(awake.tick(clock.now()).is_some(), "the freeze is seen");
        assert!(!lease.live());
        // A renewal decided 12 s ago, before the freeze: no news of after.
        assert!(lease.renew_from(Duration::from_secs(60), Duration::from_secs(12)));
        assert!(!lease.live(), "still suspended");
        assert!(lease.renew_from(Duration::from_secs(60), Duration::ZERO));
        assert!(lease.live(), "news from after the wake");
    }

    #[test]
    fn a_shorter_renewal_never_shortens_a_lease() {
        let clock = ManualClock::new(0);
        let lease = Lease::new(clock.clone(), Duration::from_secs(60), None);
        assert!(lease.renew(Duration::from_secs(1)));
        clock.advance(Duration::from_secs(30));
        assert!(lease.live());
    }

    #[test]
    fn a_freeze_suspends_leases_until_their_next_renewal() {
        let clock = ManualClock::new(1_000);
        let shared: SharedClock = clock.clone();
        let lease = Lease::new(Arc::clone(&shared), Duration::from_secs(60), None);
        let fixed = Lease::none(Arc::clone(&shared));
        let awake = clock.awake().unwrap();
        assert_eq!(awake.tick(clock.now()), None);
        clock.advance(TICK);
        assert_eq!(awake.tick(clock.now()), None, "a tick on time");
        assert!(lease.live());
        // Frozen for 10 s: the first use after the wake finds the last
        // tick too old, before the ticker has run again.
        clock.advance(Duration::from_secs(10));
        assert!(!lease.live(), "suspended: the ticks stopped");
        assert!(!lease.lapsed(), "not a lapse");
        assert!(fixed.live(), "a lease-less authority is not suspended");
        assert_eq!(
            awake.tick(clock.now()),
            Some(Duration::from_secs(10)),
            "the ticker sees the freeze"
        );
        assert!(!lease.live(), "still suspended once the ticker runs again");
        assert!(lease.renew(Duration::from_secs(60)));
        assert!(lease.live(), "renewed after the wake: served again");
        clock.advance(TICK);
        assert_eq!(awake.tick(clock.now()), None);
        assert!(lease.live());
    }

    #[test]
    fn no_lease_never_lapses() {
        let clock = ManualClock::new(0);
        let lease = Lease::none(clock.clone());
        clock.advance(Duration::from_secs(1 << 40));
        assert!(lease.live());
        assert!(!lease.is_leased());
        assert_eq!(lease.left(), None);
    }

    /// Whether `f` is ready at its first poll.
    fn futures_ready(f: impl std::future::Future<Output = ()>) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        f.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn the_boot_clock_moves_forward() {
        let a = BootClock::default().now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(BootClock::default().now() >= a + 5);
    }
}
