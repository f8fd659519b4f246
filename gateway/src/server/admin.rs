//! The admin component: the admin listener (metrics, health) served, and
//! what `/readyz` answers: ready while the spool has room, not ready from
//! the drain on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::reload::ConfigInForce;

/// The admin listener and what `/readyz` answers.
#[derive(Debug)]
pub struct Admin {
    pub(super) listener: Arc<TcpListener>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// What `/readyz` answers.
    ready: Arc<AtomicBool>,
    /// Fires when draining starts: `/readyz` stops following the spool.
    draining: CancellationToken,
    /// Stops the admin listener.
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Admin {
    pub(super) fn new(
        listener: Arc<TcpListener>,
        metrics: metrics_exporter_prometheus::PrometheusHandle,
    ) -> Admin {
        Admin {
            listener,
            metrics,
            ready: Arc::new(AtomicBool::new(true)),
            draining: CancellationToken::new(),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }
    }

    /// Serve the admin listener; `/readyz` follows the spool (not ready
    /// while it is full) until the drain.
    pub(super) fn start(&self, in_force: Arc<ConfigInForce>, spool_full: watch::Receiver<bool>) {
        self.tasks.spawn(crate::admin::serve(
            Arc::clone(&self.listener),
            self.metrics.clone(),
            Arc::clone(&self.ready),
            in_force,
            self.stop.clone(),
        ));
        self.tasks.spawn(follow_spool(
            spool_full,
            Arc::clone(&self.ready),
            self.draining.clone(),
        ));
    }

    /// `/readyz` answers 503 from now on; after a handover the successor
    /// answers on the admin listener, and this process stops serving it.
    pub(super) fn not_ready(&self, handed_over: bool) {
        self.draining.cancel();
        self.ready.store(false, Ordering::Relaxed);
        if handed_over {
            self.stop.cancel();
        }
    }

    pub(super) async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// `/readyz` follows the spool: not ready while it is full, until
/// `draining` fires.
async fn follow_spool(
    mut full: watch::Receiver<bool>,
    ready: Arc<AtomicBool>,
    draining: CancellationToken,
) {
    loop {
        let room = !*full.borrow_and_update();
        if draining.is_cancelled() {
            return;
        }
        ready.store(room, Ordering::Relaxed);
        tokio::select! {
            _ = draining.cancelled() => return,
            changed = full.changed() => if changed.is_err() { return },
        }
    }
}
