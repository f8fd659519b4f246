//! Signed batches of records, kept on disk until the control plane has
//! them.
//!
//! The journal ([`crate::records::journal`]) hands each of its segments to
//! the [`Sealer`], which signs its entries as one batch (talos-certs
//! `BatchWriter`: gateway id, sequence number, digest of the previous
//! batch, the records, the gateway's Ed25519 signature) and puts each batch
//! in the [`Spool`], a directory with one file per batch. The
//! [`crate::records::shipper`] task
//! submits the oldest batch to the control plane's `ControlPlane` service
//! over mutual TLS and deletes it only when the answer is `ACCEPTED` or
//! `DUPLICATE`. So a record survives a control-plane outage and a gateway
//! restart: it is either in the control plane's store or in the spool.
//! While the gateway drains, [`Spool::emptied`] tells it when the last
//! batch is acknowledged (a change notification, not a poll).
//!
//! # Files
//!
//! `<spool_dir>/<seq, 20 digits>.batch` holds one batch waiting, as
//! talos-certs `Signed` JSON. `<spool_dir>/chain.json`
//! (`{"last_seq":N,"last_digest":"…"}`) is the **acknowledged point**: the
//! last batch the control plane acknowledged, written at every
//! acknowledgement before that batch's file is deleted. So, on disk:
//!
//! - the batches waiting are the files numbered after `chain.json`'s
//!   batch, without a hole, and the first of them links to its digest:
//!   whichever batch is bad, [`crate::records::repair`] knows what the gap
//!   it seals in its place must link to;
//! - the chain goes on from the newest file, or from `chain.json` when
//!   none waits (every batch was shipped).
//!
//! Every file is written to a temporary file, synced and renamed, and the
//! directory synced, so a crash leaves either the old file or the new one
//! (a temporary file left behind is deleted at the next open). A crash
//! while a batch is acknowledged leaves one of three states, each sound:
//! before `chain.json` is written, the batch still waits (sent again, it
//! is answered `DUPLICATE`); after it, before the batch file is deleted
//! (or when the delete failed), the file is numbered at or before
//! `chain.json`'s batch: an acknowledged leftover, which [`Spool::open`]
//! deletes; after both, nothing is left to do. The cost is two syncs per
//! batch sealed and two per batch acknowledged: per batch, never per
//! record or request. Records are not secrets (no body, header value,
//! query or credential ever enters one), but the directory is made mode
//! 0700 anyway: they are a tenant's traffic pattern.
//!
//! A spool left by an earlier build, which wrote `chain.json` only when
//! the spool emptied, may have `chain.json` behind the oldest batch
//! waiting: the batches between were acknowledged and deleted since. It
//! opens as it is (said once at `warn`): the chain goes on from the newest
//! file, and the first acknowledgement brings `chain.json` up to date.
//! Here those batches cannot be told from batches deleted by hand; the
//! control plane tells them apart, as it accepts the oldest batch waiting
//! or refuses it `gap`. Refusing such a spool would stop a gateway
//! upgraded over a backlog (the successor opens the spool its predecessor
//! left) for what is, after an upgrade, the normal state.
//!
//! # The bound, and failing closed
//!
//! The spool holds at most `spool_max_batches` batches and
//! `spool_max_bytes` bytes. When it reaches either bound — the control
//! plane has been away too long, or refuses what it is sent — or when a
//! batch cannot be written to disk, the gateway **fails closed**: it stops
//! accepting new connections (they wait in the kernel's backlog), says so
//! once in the log at `error`, sets `gateway_spool_full` to 1 and
//! `/readyz` to 503. Connections already open go on, and their records are
//! still spooled (so the spool may pass its bound by at most the records
//! of the connections open at that moment): nothing is forgotten. As soon
//! as acknowledgements bring it under the bound, accepting resumes.

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use talos_certs::{BatchWriter, GatewayKey, Signed};

use crate::records::journal::{mark_sealing, Segment};
use talos_contract::sync::Locked;
use tokio::sync::{watch, Notify};

/// The chain position file in the spool directory.
const CHAIN_FILE: &str = "chain.json";
/// The extension of a batch file.
pub(crate) const BATCH_EXT: &str = "batch";
/// The lock file: one process at a time uses a spool.
const LOCK_FILE: &str = "lock";

/// An exclusive lock on a spool directory (`flock` on `<dir>/lock`), held
/// while a gateway process (or a repair) uses it: two writers would fork
/// the chain. Released when dropped, or when the process dies.
#[derive(Debug)]
pub struct SpoolLock {
    _file: std::fs::File,
}

impl SpoolLock {
    /// Take the lock, or fail at once naming the directory.
    pub fn take(dir: &Path) -> Result<SpoolLock, SpoolError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |e| SpoolError::Busy {
                path: dir.to_owned(),
                reason: e.to_string(),
            },
        )?;
        Ok(SpoolLock { _file: file })
    }
}

/// The acknowledged point recorded in `dir` (`chain.json`: the last batch
/// the control plane acknowledged), or the genesis.
pub fn read_position(dir: &Path) -> Result<ChainPosition, SpoolError> {
    match std::fs::read(dir.join(CHAIN_FILE)) {
        Ok(bytes) => {
            serde_json::from_slice::<ChainPosition>(&bytes).map_err(|e| SpoolError::Corrupt {
                path: dir.join(CHAIN_FILE),
                reason: format!("not a chain position: {e}"),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ChainPosition::genesis()),
        Err(e) => Err(io_err(&dir.join(CHAIN_FILE), e)),
    }
}

/// Why the spool could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("spool {path}: {reason} (`gateway spool verify` says what, `gateway spool set-aside` sets a bad batch aside as a signed gap)")]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "spool {path} is in use by another process ({reason}): a running gateway, or a repair"
    )]
    Busy { path: PathBuf, reason: String },
}

fn io_err(path: &Path, e: std::io::Error) -> SpoolError {
    SpoolError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// The bounds of the spool.
#[derive(Clone, Copy, Debug)]
pub struct SpoolLimits {
    pub max_batches: usize,
    pub max_bytes: u64,
}

/// One batch waiting in the spool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub path: PathBuf,
    pub bytes: u64,
    /// The batch's digest (SHA-384 of its payload).
    pub digest: String,
}

/// Where the chain stood after the last batch sealed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainPosition {
    pub last_seq: u64,
    pub last_digest: String,
}

impl ChainPosition {
    fn genesis() -> Self {
        ChainPosition {
            last_seq: 0,
            last_digest: talos_certs::GENESIS_DIGEST.to_owned(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    entries: VecDeque<Entry>,
    bytes: u64,
    /// The last attempt to write a batch failed: fail closed until one
    /// succeeds.
    write_failed: bool,
}

/// The batches not yet acknowledged, on disk, oldest first.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    _lock: SpoolLock,
    limits: SpoolLimits,
    inner: Mutex<Inner>,
    /// Wakes the shipper when a batch arrives.
    pub(crate) arrived: Notify,
    /// `true` while the gateway must not accept new connections.
    full: watch::Sender<bool>,
    /// The number of batches waiting, sent at every change.
    waiting: watch::Sender<usize>,
}

impl Spool {
    /// Open (or create, mode 0700) the spool in `dir`: the batches left
    /// waiting by an earlier run (the files after `chain.json`'s batch),
    /// oldest first, and the chain position to go on from. Files at or
    /// before `chain.json`'s batch were acknowledged, and are deleted.
    /// Refuses a directory whose waiting batches do not follow one
    /// another, rather than seal a batch the control plane would refuse.
    pub fn open(dir: &Path, limits: SpoolLimits) -> Result<(Spool, ChainPosition), SpoolError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io_err(dir, e))?;
        let meta = std::fs::metadata(dir).map_err(|e| io_err(dir, e))?;
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| io_err(dir, e))?;
        }
        let lock = SpoolLock::take(dir)?;
        let mut position = read_position(dir)?;
        let mut entries = Vec::new();
        for item in std::fs::read_dir(dir).map_err(|e| io_err(dir, e))? {
            let item = item.map_err(|e| io_err(dir, e))?;
            let path = item.path();
            let name = item.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") {
                // A write that a crash interrupted: never renamed, so never
                // relied on.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(stem) = name.strip_suffix(&format!(".{BATCH_EXT}")) else {
                continue;
            };
            let Ok(seq) = stem.parse::<u64>() else {
                continue;
            };
            if seq <= position.last_seq {
                // Acknowledged (chain.json is written first): a crash or a
                // failed delete left the file.
                remove_leftover(&path, seq);
                continue;
            }
            let bytes = item.metadata().map_err(|e| io_err(&path, e))?.len();
            let signed = read_batch(&path)?;
            let (_, claimed_seq) = talos_certs::claimed_header(&signed.payload);
            if claimed_seq != seq {
                return Err(SpoolError::Corrupt {
                    path,
                    reason: format!("the file is named {seq} but holds batch {claimed_seq}"),
                });
            }
            let digest = talos_certs::digest(&signed);
            entries.push(Entry {
                seq,
                path,
                bytes,
                digest,
            });
        }
        entries.sort_by_key(|e| e.seq);
        for pair in entries.windows(2) {
            if pair[1].seq != pair[0].seq + 1 {
                return Err(SpoolError::Corrupt {
                    path: dir.to_owned(),
                    reason: format!(
                        "batch {} is followed by batch {}: a batch is missing",
                        pair[0].seq, pair[1].seq
                    ),
                });
            }
        }
        if let (Some(first), Some(last)) = (entries.first(), entries.last()) {
            if first.seq > position.last_seq + 1 {
                // An earlier build's spool (see the module docs), or
                // batches deleted by hand: the control plane tells which.
                tracing::warn!(
                    acknowledged_through = position.last_seq,
                    oldest_waiting = first.seq,
                    "chain.json is behind the oldest batch waiting: the batches between were acknowledged under an earlier build (which wrote chain.json only when the spool emptied), or were lost; the control plane refuses the oldest batch as a gap if they never reached it"
                );
            }
            // Every file left is newer than chain.json.
            position = ChainPosition {
                last_seq: last.seq,
                last_digest: last.digest.clone(),
            };
        }
        let bytes = entries.iter().map(|e| e.bytes).sum();
        let spool = Spool {
            dir: dir.to_owned(),
            _lock: lock,
            limits,
            inner: Mutex::new(Inner {
                entries: entries.into(),
                bytes,
                write_failed: false,
            }),
            arrived: Notify::new(),
            full: watch::channel(false).0,
            waiting: watch::channel(0).0,
        };
        spool.update_full();
        Ok((spool, position))
    }

    /// A receiver that reads `true` while the gateway must not accept new
    /// connections.
    pub fn full(&self) -> watch::Receiver<bool> {
        self.full.subscribe()
    }

    /// Resolves once no batch waits: woken by each batch put or removed,
    /// never by a timer.
    pub async fn emptied(&self) {
        let mut waiting = self.waiting.subscribe();
        // The sender lives in `self`, so the wait cannot end in an error.
        let _ = waiting.wait_for(|n| *n == 0).await;
    }

    /// The number of batches and bytes waiting.
    pub fn len(&self) -> (usize, u64) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }

    /// Whether no batch waits.
    pub fn is_empty(&self) -> bool {
        self.lock().entries.is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The lock guards plain bookkeeping: a panic elsewhere cannot leave
        // it half-updated in a way that matters more than losing it would.
        self.inner.locked()
    }

    /// Write a sealed batch to disk (synced, renamed, directory synced).
    /// Blocking: call from a blocking thread.
    pub fn put(&self, seq: u64, signed: &Signed) -> std::io::Result<()> {
        let path = self.dir.join(format!("{seq:020}.{BATCH_EXT}"));
        let body = serde_json::to_vec(signed).map_err(std::io::Error::other)?;
        let written = write_synced(&path, &body).and_then(|()| sync_dir(&self.dir));
        {
            let mut inner = self.lock();
            match &written {
                Ok(()) => {
                    inner.entries.push_back(Entry {
                        seq,
                        path,
                        bytes: body.len() as u64,
                        digest: talos_certs::digest(signed),
                    });
                    inner.bytes += body.len() as u64;
                    inner.write_failed = false;
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&path);
                    inner.write_failed = true;
                }
            }
        }
        self.update_full();
        if written.is_ok() {
            metrics::counter!("gateway_batches_sealed_total").increment(1);
            self.arrived.notify_one();
        }
        written
    }

    /// The oldest batch waiting.
    pub fn oldest(&self) -> Option<Entry> {
        self.lock().entries.front().cloned()
    }

    /// Forget batch `seq` (acknowledged): record it in `chain.json` as the
    /// acknowledged point (synced, renamed, directory synced), then delete
    /// its file. A `seq` that is not the oldest waiting is ignored. An
    /// error means `chain.json` could not be written: the batch stays
    /// waiting (sent again, it is answered `DUPLICATE`, and this is tried
    /// again). Blocking: call from a blocking thread.
    pub fn remove(&self, seq: u64) -> std::io::Result<()> {
        let mut inner = self.lock();
        let Some(front) = inner.entries.front().cloned() else {
            return Ok(());
        };
        if front.seq != seq {
            return Ok(());
        }
        let position = ChainPosition {
            last_seq: front.seq,
            last_digest: front.digest.clone(),
        };
        serde_json::to_vec(&position)
            .map_err(std::io::Error::other)
            .and_then(|chain| write_synced(&self.dir.join(CHAIN_FILE), &chain))
            .and_then(|()| sync_dir(&self.dir))?;
        inner.entries.pop_front();
        inner.bytes -= front.bytes;
        drop(inner);
        if let Err(err) = std::fs::remove_file(&front.path) {
            // chain.json has it: the next open deletes the leftover.
            tracing::warn!(path = %front.path.display(), error = %err, "cannot delete an acknowledged batch");
        }
        self.update_full();
        Ok(())
    }

    /// Recompute the fail-closed flag and the gauges; log the changes.
    fn update_full(&self) {
        let (batches, bytes, failed) = {
            let inner = self.lock();
            (inner.entries.len(), inner.bytes, inner.write_failed)
        };
        self.waiting.send_replace(batches);
        metrics::gauge!("gateway_spool_batches").set(batches as f64);
        metrics::gauge!("gateway_spool_bytes").set(bytes as f64);
        let full = failed || batches >= self.limits.max_batches || bytes >= self.limits.max_bytes;
        let was = self.full.send_replace(full);
        metrics::gauge!("gateway_spool_full").set(if full { 1.0 } else { 0.0 });
        if full && !was {
            tracing::error!(
                batches,
                bytes,
                max_batches = self.limits.max_batches,
                max_bytes = self.limits.max_bytes,
                write_failed = failed,
                "record spool full: not accepting new connections until the control plane acknowledges batches"
            );
        } else if was && !full {
            tracing::warn!(
                batches,
                bytes,
                "record spool has room again: accepting connections"
            );
        }
    }
}

/// Write `body` to `path` through a synced temporary file and a rename.
pub(crate) fn write_synced(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(body)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

/// Delete batch file `path` (batch `seq`), acknowledged before the spool
/// was last closed.
fn remove_leftover(path: &Path, seq: u64) {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(seq, "deleted a batch file left after its acknowledgement"),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot delete a batch file left after its acknowledgement; it is ignored")
        }
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Read a spooled batch.
pub fn read_batch(path: &Path) -> Result<Signed, SpoolError> {
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| SpoolError::Corrupt {
        path: path.to_owned(),
        reason: format!("not a signed batch: {e}"),
    })
}

/// Seals records into batches and spools them: the record writer's side.
#[derive(Debug)]
pub struct Sealer {
    writer: Option<BatchWriter>,
    key: Arc<GatewayKey>,
    spool: Arc<Spool>,
    pending: Vec<Vec<u8>>,
    pub max_records: usize,
    pub interval: Duration,
}

impl Sealer {
    /// A sealer that goes on from `position` (from [`Spool::open`]).
    pub fn new(
        key: Arc<GatewayKey>,
        gateway_id: &str,
        position: ChainPosition,
        spool: Arc<Spool>,
        max_records: usize,
        interval: Duration,
    ) -> Sealer {
        Sealer {
            writer: Some(BatchWriter::restore(
                Arc::clone(&key),
                gateway_id,
                position.last_seq,
                position.last_digest,
            )),
            key,
            spool,
            pending: Vec::new(),
            max_records,
            interval,
        }
    }

    /// Add one record (one JSON object, no newline).
    pub fn push(&mut self, record: Vec<u8>) {
        self.pending.push(record);
    }

    /// Seal the journal's segments as they come, until the journal stops.
    pub async fn run(mut self, mut segments: tokio::sync::mpsc::Receiver<Segment>) {
        while let Some(segment) = segments.recv().await {
            self.seal_segment(segment).await;
        }
    }

    /// Seal one segment: mark it with the last sequence number its entries
    /// become (synced), seal them (one batch unless recovery made it
    /// larger than `max_records`), spool, then delete the segment. A
    /// failure is retried every `interval`: the spool then fails closed
    /// ([`Spool::full`]) and nothing is forgotten.
    pub async fn seal_segment(&mut self, segment: Segment) {
        let batches = segment.entries.len().div_ceil(self.max_records.max(1)) as u64;
        if batches == 0 {
            let _ = std::fs::remove_file(&segment.path);
            return;
        }
        let last = self
            .writer
            .as_ref()
            .map_or(0, |w| w.next_seq() + batches - 1);
        loop {
            let path = segment.path.clone();
            let marked = tokio::task::spawn_blocking(move || mark_sealing(&path, last)).await;
            match marked {
                Ok(Ok(())) => break,
                Ok(Err(e)) => {
                    tracing::error!(path = %segment.path.display(), error = %e, "cannot mark a journal segment");
                    metrics::counter!("gateway_batch_write_errors_total").increment(1);
                    tokio::time::sleep(self.interval).await;
                }
                Err(_) => return,
            }
        }
        self.pending.extend(segment.entries);
        loop {
            self.seal().await;
            if self.pending.is_empty() {
                break;
            }
            tokio::time::sleep(self.interval).await;
        }
        let path = segment.path;
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot delete a sealed journal segment; the next start drops it");
            }
        })
        .await;
    }

    /// Records waiting for the next batch.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Seal every full batch pending (`max_records` records each); the
    /// rest waits for more records or its interval.
    pub async fn seal_full(&mut self) {
        self.seal_while(self.max_records).await;
    }

    /// Seal everything pending (up to `max_records` per batch) and spool
    /// it. On a write failure the records stay pending and the writer stays
    /// where it was, so the next try seals the same sequence number.
    pub async fn seal(&mut self) {
        self.seal_while(1).await;
    }

    async fn seal_while(&mut self, at_least: usize) {
        while !self.pending.is_empty() && self.pending.len() >= at_least {
            let Some(writer) = self.writer.take() else {
                return;
            };
            let take = self.pending.len().min(self.max_records);
            let records: Vec<Vec<u8>> = self.pending.drain(..take).collect();
            let spool = Arc::clone(&self.spool);
            let key = Arc::clone(&self.key);
            let joined = tokio::task::spawn_blocking(move || {
                let mut writer = writer;
                let before = (
                    writer.next_seq().saturating_sub(1),
                    writer.last_digest().to_owned(),
                );
                let seq = writer.next_seq();
                let result = writer
                    .seal(
                        &humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
                        &records,
                    )
                    .map_err(|e| e.to_string())
                    .and_then(|signed| spool.put(seq, &signed).map_err(|e| e.to_string()));
                if result.is_err() {
                    let id = writer.gateway_id().to_owned();
                    writer = BatchWriter::restore(key, id, before.0, before.1);
                }
                (writer, records, result)
            })
            .await;
            let Ok((writer, records, result)) = joined else {
                tracing::error!("batch sealing task failed");
                return;
            };
            self.writer = Some(writer);
            if let Err(e) = result {
                tracing::error!(error = %e, records = records.len(), "cannot seal or spool a batch; records kept in memory");
                metrics::counter!("gateway_batch_write_errors_total").increment(1);
                // Put them back in front, in order.
                let rest = std::mem::replace(&mut self.pending, records);
                self.pending.extend(rest);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> SpoolLimits {
        SpoolLimits {
            max_batches: 3,
            max_bytes: 1 << 30,
        }
    }

    fn sealed(writer: &mut BatchWriter, n: usize) -> (u64, Signed) {
        let seq = writer.next_seq();
        let records: Vec<String> = (0..n).map(|i| format!("{{\"n\":{i}}}")).collect();
        (
            seq,
            writer.seal("2026-11-29T00:00:00.000Z", &records).unwrap(),
        )
    }

    #[test]
    fn batches_survive_a_reopen_and_the_chain_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let (spool, pos) = Spool::open(dir.path(), limits()).unwrap();
        assert_eq!(pos, ChainPosition::genesis());
        let mut w = BatchWriter::new(Arc::clone(&key), "gw");
        for n in [1, 2] {
            let (seq, s) = sealed(&mut w, n);
            spool.put(seq, &s).unwrap();
        }
        spool.remove(1).unwrap();
        drop(spool);
        let (spool, pos) = Spool::open(dir.path(), limits()).unwrap();
        assert_eq!(pos.last_seq, 2);
        assert_eq!(pos.last_digest, w.last_digest());
        assert_eq!(spool.len().0, 1);
        assert_eq!(spool.oldest().unwrap().seq, 2);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path()).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn every_acknowledgement_writes_chain_json_before_the_file_goes() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        let mut w = BatchWriter::new(Arc::clone(&key), "gw");
        let mut digests = Vec::new();
        for _ in 0..3 {
            let (seq, s) = sealed(&mut w, 1);
            digests.push(talos_certs::digest(&s));
            spool.put(seq, &s).unwrap();
        }
        assert_eq!(read_position(dir.path()).unwrap(), ChainPosition::genesis());
        for seq in 1..=3u64 {
            spool.remove(seq).unwrap();
            assert_eq!(
                read_position(dir.path()).unwrap(),
                ChainPosition {
                    last_seq: seq,
                    last_digest: digests[seq as usize - 1].clone(),
                },
                "the acknowledged point after batch {seq}"
            );
            assert!(!dir.path().join(format!("{seq:020}.batch")).exists());
        }
        assert!(spool.is_empty());
        drop(spool);
        let (_, pos) = Spool::open(dir.path(), limits()).unwrap();
        assert_eq!(pos.last_seq, 3);
        assert_eq!(pos.last_digest, w.last_digest());
        // A batch sealed after that is newer than chain.json, and wins.
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        let (seq, s) = sealed(&mut w, 1);
        spool.put(seq, &s).unwrap();
        drop(spool);
        let (_, pos) = Spool::open(dir.path(), limits()).unwrap();
        assert_eq!(pos.last_seq, 4);
        assert_eq!(pos.last_digest, w.last_digest());
    }

    #[test]
    fn a_crash_between_chain_json_and_the_delete_leaves_a_leftover_the_next_open_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        let mut w = BatchWriter::new(Arc::clone(&key), "gw");
        for _ in 0..3 {
            let (seq, s) = sealed(&mut w, 1);
            spool.put(seq, &s).unwrap();
        }
        // Batch 1 acknowledged, and its file back as if the crash came
        // before the delete.
        let one = dir.path().join(format!("{:020}.batch", 1));
        let kept = std::fs::read(&one).unwrap();
        spool.remove(1).unwrap();
        std::fs::write(&one, &kept).unwrap();
        drop(spool);
        let (spool, pos) = Spool::open(dir.path(), limits()).unwrap();
        assert_eq!(pos.last_seq, 3, "the chain goes on from the newest");
        assert_eq!(spool.oldest().unwrap().seq, 2, "batch 1 is not resent");
        assert_eq!(spool.len().0, 2);
        assert!(!one.exists(), "the leftover is deleted");
        // The same with the last batch: the spool is empty, the chain
        // goes on from chain.json.
        let three = dir.path().join(format!("{:020}.batch", 3));
        spool.remove(2).unwrap();
        let kept = std::fs::read(&three).unwrap();
        spool.remove(3).unwrap();
        std::fs::write(&three, &kept).unwrap();
        drop(spool);
        let (spool, pos) = Spool::open(dir.path(), limits()).unwrap();
        assert!(spool.is_empty());
        assert_eq!(pos.last_seq, 3);
        assert_eq!(pos.last_digest, w.last_digest());
        assert!(!three.exists());
        // A crash before chain.json: the batch still waits.
        let (seq, s) = sealed(&mut w, 1);
        spool.put(seq, &s).unwrap();
        drop(spool);
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        assert_eq!(spool.oldest().unwrap().seq, 4);
    }

    #[test]
    fn a_chain_json_that_cannot_be_written_keeps_the_acknowledged_batch() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        let mut w = BatchWriter::new(Arc::clone(&key), "gw");
        let (seq, s) = sealed(&mut w, 1);
        spool.put(seq, &s).unwrap();
        // A directory in chain.json's place: the rename onto it fails.
        std::fs::create_dir_all(dir.path().join(CHAIN_FILE).join("x")).unwrap();
        assert!(spool.remove(1).is_err());
        assert_eq!(spool.oldest().unwrap().seq, 1, "still waiting");
        assert!(dir.path().join(format!("{:020}.batch", 1)).exists());
        std::fs::remove_dir_all(dir.path().join(CHAIN_FILE)).unwrap();
        spool.remove(1).unwrap();
        assert!(spool.is_empty());
        assert_eq!(read_position(dir.path()).unwrap().last_seq, 1);
    }

    #[test]
    fn an_earlier_builds_chain_json_behind_the_oldest_batch_opens_and_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        let mut w = BatchWriter::new(Arc::clone(&key), "gw");
        let mut digests = Vec::new();
        for _ in 0..4 {
            let (seq, s) = sealed(&mut w, 1);
            digests.push(talos_certs::digest(&s));
            spool.put(seq, &s).unwrap();
        }
        drop(spool);
        // As an earlier build left it: 1 and 2 acknowledged and deleted,
        // chain.json not written (the spool never emptied).
        for seq in [1, 2] {
            std::fs::remove_file(dir.path().join(format!("{seq:020}.batch"))).unwrap();
        }
        let (spool, pos) = Spool::open(dir.path(), limits()).unwrap();
        assert_eq!(pos.last_seq, 4);
        assert_eq!(spool.oldest().unwrap().seq, 3);
        spool.remove(3).unwrap();
        assert_eq!(
            read_position(dir.path()).unwrap(),
            ChainPosition {
                last_seq: 3,
                last_digest: digests[2].clone(),
            }
        );
    }

    #[test]
    fn a_missing_batch_in_the_middle_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        let mut w = BatchWriter::new(key, "gw");
        for _ in 0..3 {
            let (seq, s) = sealed(&mut w, 1);
            spool.put(seq, &s).unwrap();
        }
        drop(spool);
        std::fs::remove_file(dir.path().join(format!("{:020}.batch", 2))).unwrap();
        let err = Spool::open(dir.path(), limits()).unwrap_err().to_string();
        assert!(err.contains("batch 1 is followed by batch 3"), "{err}");
    }

    #[test]
    fn the_bound_fails_closed_and_acknowledgements_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        let full = spool.full();
        let mut w = BatchWriter::new(key, "gw");
        for _ in 0..2 {
            let (seq, s) = sealed(&mut w, 1);
            spool.put(seq, &s).unwrap();
            assert!(!*full.borrow());
        }
        let (seq, s) = sealed(&mut w, 1);
        spool.put(seq, &s).unwrap();
        assert!(*full.borrow(), "3 of 3 batches: full");
        spool.remove(2).unwrap(); // not the oldest: ignored
        assert!(*full.borrow());
        spool.remove(1).unwrap();
        assert!(!*full.borrow());
        // Reopening a full spool starts closed.
        let (seq, s) = sealed(&mut w, 1);
        spool.put(seq, &s).unwrap();
        drop(spool);
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        assert!(*spool.full().borrow());
    }

    #[tokio::test]
    async fn emptied_wakes_when_the_last_batch_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let (spool, _) = Spool::open(dir.path(), limits()).unwrap();
        let spool = Arc::new(spool);
        spool.emptied().await;
        let mut w = BatchWriter::new(key, "gw");
        for _ in 0..2 {
            let (seq, s) = sealed(&mut w, 1);
            spool.put(seq, &s).unwrap();
        }
        let waiter = tokio::spawn({
            let spool = Arc::clone(&spool);
            async move { spool.emptied().await }
        });
        tokio::task::yield_now().await;
        spool.remove(1).unwrap();
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "batch 2 still waits");
        spool.remove(2).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
    }

    #[tokio::test]
    async fn a_failed_write_keeps_the_records_and_the_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let (spool, pos) = Spool::open(&dir.path().join("spool"), limits()).unwrap();
        let spool = Arc::new(spool);
        let mut sealer = Sealer::new(
            Arc::clone(&key),
            "gw",
            pos,
            Arc::clone(&spool),
            10,
            Duration::from_secs(1),
        );
        sealer.push(b"{\"a\":1}".to_vec());
        // Make the directory unwritable by replacing it with a file.
        std::fs::remove_dir_all(dir.path().join("spool")).unwrap();
        std::fs::write(dir.path().join("spool"), b"not a directory").unwrap();
        sealer.seal().await;
        assert_eq!(sealer.pending(), 1);
        assert!(*spool.full().borrow(), "a failed write fails closed");
        std::fs::remove_file(dir.path().join("spool")).unwrap();
        std::fs::create_dir(dir.path().join("spool")).unwrap();
        sealer.seal().await;
        assert_eq!(sealer.pending(), 0);
        assert!(!*spool.full().borrow());
        assert_eq!(spool.oldest().unwrap().seq, 1, "the same sequence number");
    }
}
