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
}

/// `CLOCK_BOOTTIME`: the time since boot, suspend included.
#[derive(Debug, Clone, Copy, Default)]
pub struct BootClock;

impl Clock for BootClock {
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
}

impl ManualClock {
    /// A clock at `start`.
    pub fn new(start: Millis) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now: AtomicU64::new(start),
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
}

/// The clock the gateway reads leases against.
pub type SharedClock = Arc<dyn Clock>;

/// The clock of a running gateway.
pub fn boot_clock() -> SharedClock {
    Arc::new(BootClock)
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
        let until = clock.now().saturating_add(millis(length));
        Lease {
            clock,
            on_lapse,
            until: AtomicU64::new(until.min(NONE - 1)),
        }
    }

    /// A lease ending at `until` on `clock` (a lease handed over by the
    /// process that gave it: both read `CLOCK_BOOTTIME`).
    pub fn ending_at(
        clock: SharedClock,
        until: Millis,
        on_lapse: Option<Arc<tokio::sync::Notify>>,
    ) -> Lease {
        Lease {
            clock,
            on_lapse,
            until: AtomicU64::new(until.min(NONE - 1)),
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
        }
    }

    /// Whether the authority may still be used now.
    pub fn live(&self) -> bool {
        let live = self.live_at(self.clock.now());
        if !live {
            if let Some(n) = &self.on_lapse {
                n.notify_one();
            }
        }
        live
    }

    /// Whether the authority has a lease at all.
    pub fn is_leased(&self) -> bool {
        self.until.load(Ordering::Acquire) != NONE
    }

    /// Extend the lease to `length` from now, if it is live now. Returns
    /// whether it was renewed; a lapsed lease stays lapsed.
    pub fn renew(&self, length: Duration) -> bool {
        let now = self.clock.now();
        let new = now.saturating_add(millis(length)).min(NONE - 1);
        let mut current = self.until.load(Ordering::Acquire);
        loop {
            if current == NONE {
                return true;
            }
            if now >= current {
                return false;
            }
            if new <= current {
                return true;
            }
            match self
                .until
                .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
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
    fn a_shorter_renewal_never_shortens_a_lease() {
        let clock = ManualClock::new(0);
        let lease = Lease::new(clock.clone(), Duration::from_secs(60), None);
        assert!(lease.renew(Duration::from_secs(1)));
        clock.advance(Duration::from_secs(30));
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
        let a = BootClock.now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(BootClock.now() >= a + 5);
    }
}
