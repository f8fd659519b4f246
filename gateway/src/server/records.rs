//! The records: the journal's writer, the sealer, the spool and the
//! shipper, and the proposals to the approval relay. Recovery is done
//! when the process is built (a cold start reads what an earlier process
//! left); [`Records::start`] starts the writer and the batches and signs
//! the start report; [`Records::stop`] stops the writer once nothing is
//! left to record, lets the sealer seal the last segment and gives the
//! shipper the grace to deliver the spool.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::error::StartError;
use crate::authority::report_entry;
use crate::process::link::Predecessor;
use crate::records::journal::{self, JournalSetup, RecordSink, WriterConfig, WriterThread};
use crate::records::spool::{ChainPosition, Spool, SpoolLimits};

/// What the relay's proposals arrive on.
pub(super) type Proposals = mpsc::UnboundedReceiver<crate::session::approvals::Proposed>;

/// Signed batches: the spool, where its chain stands, the control plane.
#[derive(Debug)]
pub(super) struct BatchSetup {
    /// Opened at start; a successor opens it once its predecessor, which
    /// holds it, has exited.
    pub(super) spool: Option<(Arc<Spool>, ChainPosition)>,
    pub(super) spool_dir: PathBuf,
    pub(super) limits: SpoolLimits,
    pub(super) plane: crate::records::shipper::Plane,
    pub(super) max_records: usize,
    pub(super) interval: Duration,
    /// The journal directory, and what an earlier process left there.
    pub(super) journal_dir: PathBuf,
    /// Filled by [`super::Prepared::new`] once the instance is known (a cold start).
    pub(super) recovered: Option<journal::Recovered>,
}

/// What the records are started with.
pub(super) struct RecordsStart {
    pub(super) records_path: PathBuf,
    /// Signed batches (with a control plane), and the key that signs them.
    pub(super) batches: Option<(BatchSetup, Arc<talos_certs::GatewayKey>)>,
    pub(super) proposals: Option<Proposals>,
    pub(super) gateway_id: Arc<str>,
    pub(super) instance: Arc<str>,
    pub(super) generation: u64,
    /// The predecessor's generation (a successor).
    pub(super) predecessor_generation: Option<u64>,
}

/// The records, running.
#[derive(Debug)]
pub(super) struct Records {
    /// Where connections and authorities write.
    pub(super) sink: RecordSink,
    writer: WriterThread,
    batches: Option<Batches>,
    /// `true` while the spool is full (or cannot be opened).
    pub(super) spool_full: watch::Receiver<bool>,
    /// A successor's sealer waits for its predecessor's link (once `go`
    /// has come) to learn when the predecessor has exited.
    predecessor: Option<oneshot::Sender<Arc<Predecessor>>>,
}

impl Records {
    /// Start the batches (the sealer, the shipper, the proposals to the
    /// relay) and the writer; a cold start with batches signs its start
    /// report, after what recovery sealed again and before anything of
    /// its own.
    pub(super) async fn start(s: RecordsStart) -> Result<Records, StartError> {
        let (full_tx, spool_full) = watch::channel(false);
        let mut batches = None;
        let mut journal_setup = None;
        let mut recovered_summary = None;
        let mut predecessor = None;
        let mut key = None;
        if let Some((mut b, signing)) = s.batches {
            let recovered = b.recovered.take().unwrap_or_else(journal::Recovered::fresh);
            if b.spool.is_some() {
                recovered_summary = Some((
                    recovered.previous_instance.clone(),
                    recovered.cut_by_crash,
                    recovered.entries.len(),
                ));
            }
            let (segments_tx, segments_rx) = mpsc::channel(SEGMENTS_QUEUE);
            journal_setup = Some(JournalSetup {
                dir: journal::generation_dir(&b.journal_dir, s.generation),
                recovered,
                sealer: segments_tx,
                max_records: b.max_records,
                interval: b.interval,
                sync: journal::DataSync::disk(),
            });
            let stop = CancellationToken::new();
            if let Some(rx) = s.proposals {
                tokio::spawn(crate::records::shipper::propose(
                    rx,
                    b.plane.clone(),
                    stop.clone(),
                ));
            }
            let (spool_tx, spool_rx) = watch::channel(None);
            let gate = match s.predecessor_generation {
                Some(g) => {
                    let (tx, link) = oneshot::channel();
                    predecessor = Some(tx);
                    SealFrom::Predecessor {
                        link,
                        dir: journal::generation_dir(&b.journal_dir, g),
                        own: journal::generation_dir(&b.journal_dir, s.generation),
                    }
                }
                None => SealFrom::Open,
            };
            let task = tokio::spawn(batches_task(BatchesTask {
                key: Arc::clone(&signing),
                gateway_id: Arc::clone(&s.gateway_id),
                instance: Arc::clone(&s.instance),
                setup: b,
                gate,
                segments: segments_rx,
                spool_tx,
                full_tx,
                stop: stop.clone(),
            }));
            batches = Some(Batches {
                spool: spool_rx,
                task,
                stop,
            });
            key = Some(signing);
        }
        let (sink, writer) = journal::start(WriterConfig {
            records_path: s.records_path,
            journal: journal_setup,
            gateway_id: Arc::clone(&s.gateway_id),
            instance: Arc::clone(&s.instance),
            first_conn: journal::first_conn(s.generation),
        })?;
        if let (Some(key), Some(summary)) = (key, recovered_summary) {
            start_report(&sink, &key, &s.gateway_id, &s.instance, summary).await;
        }
        Ok(Records {
            sink,
            writer,
            batches,
            spool_full,
            predecessor,
        })
    }

    /// A successor has `go`: its sealer may wait for the predecessor to
    /// exit through `link`.
    pub(super) fn predecessor_link(&mut self, link: Arc<Predecessor>) {
        if let Some(tx) = self.predecessor.take() {
            let _ = tx.send(link);
        }
    }

    /// Stop the writer (every connection has its record and every
    /// authority its report), let the sealer seal the last segment, and
    /// give the shipper `grace` to deliver the spool, woken when it
    /// empties; what it cannot deliver stays spooled for the next start.
    pub(super) async fn stop(self, grace: Duration) {
        self.writer.stop().await;
        drop(self.sink);
        if let Some(b) = self.batches {
            b.deliver(grace).await;
        }
    }
}

/// This process's word that it started afresh, signed and sealed: after
/// what recovery sealed again, before anything of its own.
async fn start_report(
    sink: &RecordSink,
    key: &talos_certs::GatewayKey,
    gateway_id: &str,
    instance: &str,
    (previous, cut, resealed): (Option<String>, u64, usize),
) {
    let report = talos_certs::StartReport {
        gateway_id: gateway_id.to_owned(),
        instance: instance.to_owned(),
        started_at: crate::records::record::now(),
        key_id: key.key_id(),
        previous_instance: previous.clone().unwrap_or_default(),
        cut_by_crash: cut,
    }
    .sign(key);
    sink.entry(report_entry(&report)).await;
    sink.seal().await;
    tracing::info!(
        instance,
        previous_instance = previous.as_deref().unwrap_or("-"),
        cut_by_crash = cut,
        resealed,
        "start report signed"
    );
}

/// Segments waiting for the sealer before the journal's writer waits: a
/// few batch intervals' worth.
const SEGMENTS_QUEUE: usize = 8;

/// When the batches may be sealed.
enum SealFrom {
    /// At once (a cold start: the spool is open).
    Open,
    /// Once the predecessor has exited: its journal (`dir`) is read for
    /// what it left, and sealed first, through `own`.
    Predecessor {
        link: oneshot::Receiver<Arc<crate::process::link::Predecessor>>,
        dir: PathBuf,
        own: PathBuf,
    },
}

struct BatchesTask {
    key: Arc<talos_certs::GatewayKey>,
    gateway_id: Arc<str>,
    instance: Arc<str>,
    setup: BatchSetup,
    gate: SealFrom,
    segments: mpsc::Receiver<journal::Segment>,
    spool_tx: watch::Sender<Option<Arc<Spool>>>,
    full_tx: watch::Sender<bool>,
    stop: CancellationToken,
}

/// The sealer, the spool and the shipper, running.
#[derive(Debug)]
struct Batches {
    /// The spool, once open.
    spool: watch::Receiver<Option<Arc<Spool>>>,
    /// Seals the journal's segments; ends when the journal's writer does,
    /// with the shipper's task.
    task: JoinHandle<Option<JoinHandle<()>>>,
    /// Stops the shipper and the proposals to the relay.
    stop: CancellationToken,
}

/// Seal the journal's segments into the spool and ship it. A successor
/// first waits for its predecessor to exit (holding its segments, which
/// are on disk, meanwhile), opens the spool, and seals what the
/// predecessor left before anything of its own.
async fn batches_task(t: BatchesTask) -> Option<JoinHandle<()>> {
    let BatchesTask {
        key,
        gateway_id,
        instance,
        setup,
        gate,
        mut segments,
        spool_tx,
        full_tx,
        stop,
    } = t;
    let mut held = std::collections::VecDeque::new();
    let mut leftovers = None;
    let (spool, position) = match (setup.spool, gate) {
        (Some(open), _) => open,
        (None, SealFrom::Open) => return None,
        (None, SealFrom::Predecessor { link, dir, own }) => {
            let Ok(predecessor) = link.await else {
                return None;
            };
            // Segments wait here (they are on disk) until the predecessor
            // has sealed its last batch and exited.
            loop {
                tokio::select! {
                    () = predecessor.gone() => break,
                    seg = segments.recv() => match seg {
                        Some(s) => held.push_back(s),
                        None => break,
                    },
                }
            }
            let opened = open_spool_when_free(&setup.spool_dir, setup.limits).await;
            let Some((spool, position)) = opened else {
                // Nothing can be sealed: fail closed.
                let _ = full_tx.send(true);
                return None;
            };
            match journal::recover(&dir, position.last_seq, &gateway_id, &instance) {
                Ok(found) => leftovers = Some((found, dir, own)),
                Err(e) => tracing::error!(error = %e, "cannot read the previous process's journal"),
            }
            (Arc::new(spool), position)
        }
    };
    let _ = spool_tx.send(Some(Arc::clone(&spool)));
    tokio::spawn(forward_full(spool.full(), full_tx, stop.clone()));
    tracing::info!(
        plane = ?setup.plane.addrs,
        spooled = spool.len().0,
        next_seq = position.last_seq + 1,
        "shipping signed batches"
    );
    let shipper = tokio::spawn(crate::records::shipper::ship(
        Arc::clone(&spool),
        setup.plane,
        stop,
    ));
    let mut sealer = crate::records::spool::Sealer::new(
        key,
        &gateway_id,
        position,
        spool,
        setup.max_records,
        setup.interval,
    );
    if let Some((found, dir, own)) = leftovers {
        if !found.is_empty() {
            tracing::warn!(
                entries = found.entries.len(),
                cut_by_crash = found.cut_by_crash,
                "the previous process left records unsealed; sealing them first"
            );
            match journal::write_segment(&own, 0, found.entries.clone()) {
                Ok(segment) => sealer.seal_segment(segment).await,
                Err(e) => tracing::error!(error = %e, "cannot keep the previous process's records"),
            }
        }
        found.discard();
        if dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("gen-"))
        {
            let _ = std::fs::remove_file(dir.join("instance"));
            let _ = std::fs::remove_dir(&dir);
        }
    }
    for segment in held {
        sealer.seal_segment(segment).await;
    }
    while let Some(segment) = segments.recv().await {
        sealer.seal_segment(segment).await;
    }
    Some(shipper)
}

/// Open the spool once no other process holds it (the predecessor lets go
/// as it exits); `None` (logged) if it cannot be opened.
async fn open_spool_when_free(
    dir: &std::path::Path,
    limits: SpoolLimits,
) -> Option<(Spool, ChainPosition)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let dir_owned = dir.to_owned();
        let opened = tokio::task::spawn_blocking(move || Spool::open(&dir_owned, limits)).await;
        match opened {
            Ok(Ok(open)) => return Some(open),
            Ok(Err(crate::records::spool::SpoolError::Busy { .. }))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot open the spool; not accepting until it can be");
                return None;
            }
            Err(_) => return None,
        }
    }
}

/// Copy the spool's fullness to what the accept loop and `/readyz` read.
async fn forward_full(
    mut from: watch::Receiver<bool>,
    to: watch::Sender<bool>,
    stop: CancellationToken,
) {
    loop {
        let full = *from.borrow_and_update();
        let _ = to.send(full);
        tokio::select! {
            () = stop.cancelled() => return,
            changed = from.changed() => if changed.is_err() { return },
        }
    }
}

impl Batches {
    /// Wait for the sealer to seal the last segment, then up to `grace` for
    /// the spool to empty; then stop the shipper and say what is left.
    async fn deliver(self, grace: Duration) {
        // The sealer ends once the writer has handed over its last segment.
        let shipper = self.task.await.ok().flatten();
        let spool = self.spool.borrow().clone();
        let delivered = match &spool {
            Some(spool) => tokio::time::timeout(grace, spool.emptied()).await.is_ok(),
            None => false,
        };
        self.stop.cancel();
        if let Some(task) = shipper {
            let _ = task.await;
        }
        let Some(spool) = spool else {
            return;
        };
        let (batches, bytes) = spool.len();
        if delivered {
            tracing::info!("every batch delivered");
        } else if batches > 0 {
            tracing::warn!(
                batches,
                bytes,
                "batches left in the spool; they are shipped by the next process"
            );
        }
    }
}
