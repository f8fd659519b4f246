//! A future polled only when its own waker fired.
//!
//! A connection's task waits on its HTTP connection and, beside it, on
//! "the gateway is shutting down" and "the session's authority ended"
//! (`tokio::select!`). The task wakes for every read, write and timer of
//! the connection, and `select!` polls every branch at every wake-up: each
//! poll of a cancellation future takes the token's node lock and the
//! `Notify`'s waiters lock, for an event that comes once in a connection's
//! life, if ever. [`WokenOnly`] hands the inner future a waker of its own
//! and polls it only after that waker fired (and at the first poll, which
//! registers it), so the other wake-ups cost a flag check.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use talos_contract::sync::Locked;

/// Polls `F` only when `F` woke the task (see the module doc).
pub struct WokenOnly<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
    /// The task waker last handed to `flag`: replaced there (under its
    /// lock) only when the task's waker changes, which it does not while
    /// one task polls this.
    task: Option<Waker>,
}

struct Flag {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Set before the task waker is read: a poll that stored a new task
        // waker after this read still finds the flag set.
        self.woken.store(true, Ordering::Release);
        let task = self.task.locked().clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl<F> std::fmt::Debug for WokenOnly<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WokenOnly")
            .field("woken", &self.flag.woken.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<F: Future> WokenOnly<F> {
    /// `inner`, polled at the first poll and then only when it woke.
    pub fn new(inner: F) -> Self {
        WokenOnly {
            inner: Box::pin(inner),
            flag: Arc::new(Flag {
                woken: AtomicBool::new(true),
                task: Mutex::new(None),
            }),
            task: None,
        }
    }
}

impl<F: Future> Future for WokenOnly<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Every field is Unpin (the inner future is boxed).
        let this = self.get_mut();
        if !this.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
            let waker = cx.waker().clone();
            *this.flag.task.locked() = Some(waker.clone());
            this.task = Some(waker);
        }
        if !this.flag.woken.swap(false, Ordering::Acquire) {
            return Poll::Pending;
        }
        let own = Waker::from(Arc::clone(&this.flag));
        this.inner.as_mut().poll(&mut Context::from_waker(&own))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio_util::sync::CancellationToken;

    /// Counts its polls; ready once `ready` is set; keeps the waker it was
    /// last polled with.
    struct Probe {
        polls: Arc<AtomicUsize>,
        ready: Arc<AtomicBool>,
        waker: Arc<Mutex<Option<Waker>>>,
    }

    impl Future for Probe {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.ready.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// A probe wrapped, and handles on its polls, readiness and waker.
    type Handles = (Arc<AtomicUsize>, Arc<AtomicBool>, Arc<Mutex<Option<Waker>>>);
    fn probe() -> (WokenOnly<Probe>, Handles) {
        let (polls, ready, waker) = Handles::default();
        let f = WokenOnly::new(Probe {
            polls: Arc::clone(&polls),
            ready: Arc::clone(&ready),
            waker: Arc::clone(&waker),
        });
        (f, (polls, ready, waker))
    }

    /// A task waker counting its wakes.
    fn task() -> (Arc<AtomicUsize>, Waker) {
        struct Count(Arc<AtomicUsize>);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let n = Arc::new(AtomicUsize::new(0));
        (Arc::clone(&n), Waker::from(Arc::new(Count(n))))
    }

    #[test]
    fn the_inner_future_is_polled_first_and_then_only_when_it_woke() {
        let (mut f, (polls, ready, waker)) = probe();
        let (woken, task) = task();
        let mut cx = Context::from_waker(&task);
        for _ in 0..100 {
            assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        }
        assert_eq!(
            polls.load(Ordering::SeqCst),
            1,
            "the other wake-ups poll nothing"
        );
        assert_eq!(woken.load(Ordering::SeqCst), 0);
        // The inner future wakes: the task is woken, the next poll reaches it.
        ready.store(true, Ordering::SeqCst);
        waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert!(Pin::new(&mut f).poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_latest_task_waker_is_the_one_woken() {
        let (mut f, (polls, _, waker)) = probe();
        let (first, task1) = task();
        let (second, task2) = task();
        assert!(Pin::new(&mut f)
            .poll(&mut Context::from_waker(&task1))
            .is_pending());
        assert!(Pin::new(&mut f)
            .poll(&mut Context::from_waker(&task2))
            .is_pending());
        waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(first.load(Ordering::SeqCst), 0);
        assert_eq!(second.load(Ordering::SeqCst), 1);
        // Woken, so polled again; not ready, so pending, with nothing left
        // set for the next poll.
        assert!(Pin::new(&mut f)
            .poll(&mut Context::from_waker(&task2))
            .is_pending());
        assert!(Pin::new(&mut f)
            .poll(&mut Context::from_waker(&task2))
            .is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_cancellation_before_or_after_the_first_poll_is_seen() {
        let before = CancellationToken::new();
        before.cancel();
        WokenOnly::new(before.cancelled()).await;

        let token = CancellationToken::new();
        let wait = tokio::spawn({
            let token = token.clone();
            async move {
                tokio::select! {
                    () = WokenOnly::new(token.cancelled()) => true,
                    () = tokio::time::sleep(std::time::Duration::from_secs(30)) => false,
                }
            }
        });
        tokio::task::yield_now().await;
        token.cancel();
        assert!(wait.await.unwrap(), "the cancellation ended the wait");
    }
}
