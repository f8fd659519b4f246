//! The journal's files on disk: `opens.log`, the segment being written
//! and its rotation to the sealer, and the compaction of `opens.log`.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::recovery::{read_lines, Recovered};
use super::{
    create_dir, io_err, JournalError, OpensLine, Segment, HANDOFF_GROUP, HANDOFF_SYNC, INSTANCE,
    OPENS, OPENS_COMPACT_AT,
};

/// The journal's part of [`super::WriterConfig`].
#[derive(Debug)]
pub struct JournalSetup {
    pub dir: PathBuf,
    pub recovered: Recovered,
    /// Segments go here, to be sealed.
    pub sealer: tokio::sync::mpsc::Sender<Segment>,
    pub max_records: usize,
    pub interval: Duration,
    /// How writes are made durable: [`DataSync::disk`].
    pub sync: DataSync,
}

/// How the journal makes what it wrote durable: `fdatasync(2)` on the
/// file ([`DataSync::disk`], what the gateway runs with). A test gives one
/// that watches the syncs, or holds them, to see what waits for them.
#[derive(Clone)]
pub struct DataSync(Arc<SyncFn>);

type SyncFn = dyn Fn(&File, &Path) -> std::io::Result<()> + Send + Sync;

impl DataSync {
    /// `fdatasync(2)`.
    pub fn disk() -> DataSync {
        DataSync(Arc::new(|file, _| file.sync_data()))
    }

    /// `sync` in place of `fdatasync(2)`: given each file and its path.
    #[cfg(test)]
    pub(crate) fn watched(
        sync: impl Fn(&File, &Path) -> std::io::Result<()> + Send + Sync + 'static,
    ) -> DataSync {
        DataSync(Arc::new(sync))
    }

    fn sync(&self, file: &File, path: &Path) -> std::io::Result<()> {
        (self.0)(file, path)
    }
}

impl std::fmt::Debug for DataSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataSync")
    }
}

/// Write `entries` as segment `n` of `dir` (synced): what a successor
/// found left in its predecessor's journal, put in its own before it is
/// sealed. Returns the segment to hand to the sealer.
pub fn write_segment(dir: &Path, n: u64, entries: Vec<Vec<u8>>) -> Result<Segment, JournalError> {
    let mut segment = SegmentFile::create(dir, n)?;
    segment.write_synced(&entries, &DataSync::disk())?;
    sync_dir(dir)?;
    Ok(Segment {
        path: segment.path,
        entries,
    })
}

/// The journal's files, open.
pub(super) struct JournalFiles {
    dir: PathBuf,
    opens: File,
    opens_path: PathBuf,
    opens_bytes: u64,
    opens_dirty: bool,
    opens_synced_at: Instant,
    /// Connections opened and not yet recorded.
    live: HashSet<u64>,
    segment: SegmentFile,
    /// Hand-off records pushed since the last write (in the round's
    /// buffer), and written since the segment's last sync; when the
    /// oldest of those was written.
    handoffs_buffered: usize,
    handoffs_unsynced: usize,
    unsynced_since: Option<Instant>,
    sync: DataSync,
    sealer: tokio::sync::mpsc::Sender<Segment>,
    max_records: usize,
    interval: Duration,
    instance: Arc<str>,
}

struct SegmentFile {
    n: u64,
    path: PathBuf,
    file: File,
    entries: Vec<Vec<u8>>,
    first_at: Option<Instant>,
}

impl SegmentFile {
    fn create(dir: &Path, n: u64) -> Result<SegmentFile, JournalError> {
        let path = dir.join(format!("seg-{n:020}.log"));
        let file = create_private(&path)?;
        Ok(SegmentFile {
            n,
            path,
            file,
            entries: Vec::new(),
            first_at: None,
        })
    }
}

impl SegmentFile {
    /// Write `entries`, one a line, and sync them.
    fn write_synced(&mut self, entries: &[Vec<u8>], sync: &DataSync) -> Result<(), JournalError> {
        let mut bytes = Vec::new();
        for e in entries {
            bytes.extend_from_slice(e);
            bytes.push(b'\n');
        }
        self.file
            .write_all(&bytes)
            .and_then(|()| sync.sync(&self.file, &self.path))
            .map_err(io_err(&self.path))
    }
}

fn create_private(path: &Path) -> Result<File, JournalError> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))
}

fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

impl JournalFiles {
    /// Open the journal for a new process: write what recovery found into
    /// the first segment (synced), start `opens.log` afresh, then delete
    /// the old files.
    pub(super) fn start(
        setup: JournalSetup,
        instance: &Arc<str>,
    ) -> Result<JournalFiles, JournalError> {
        let dir = setup.dir;
        // A successor's journal is new (recovery made a cold start's).
        create_dir(&dir)?;
        let recovered = setup.recovered;
        let mut segment = SegmentFile::create(&dir, recovered.next_segment)?;
        segment.write_synced(&recovered.entries, &setup.sync)?;
        if !recovered.entries.is_empty() {
            segment.first_at = Some(Instant::now());
        }
        segment.entries = recovered.entries;
        // The instance file names who writes the journal now.
        let instance_tmp = dir.join(format!("{INSTANCE}.tmp"));
        let mut f = create_private(&instance_tmp)?;
        f.write_all(instance.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io_err(&instance_tmp))?;
        std::fs::rename(&instance_tmp, dir.join(INSTANCE)).map_err(io_err(&dir))?;
        // A fresh opens.log: the old one's open connections are all
        // recorded now, in the segment just synced.
        let opens_path = dir.join(OPENS);
        let opens_tmp = dir.join(format!("{OPENS}.tmp"));
        let mut opens = create_private(&opens_tmp)?;
        let mut header = serde_json::to_vec(&OpensLine::Instance {
            instance: instance.to_string(),
        })
        .unwrap_or_default();
        header.push(b'\n');
        opens
            .write_all(&header)
            .and_then(|()| opens.sync_all())
            .map_err(io_err(&opens_tmp))?;
        std::fs::rename(&opens_tmp, &opens_path).map_err(io_err(&dir))?;
        for old in &recovered.old_files {
            if old != &opens_path && old != &segment.path {
                let _ = std::fs::remove_file(old);
            }
        }
        for d in &recovered.old_dirs {
            let _ = std::fs::remove_file(d.join(INSTANCE));
            let _ = std::fs::remove_dir(d);
        }
        sync_dir(&dir)?;
        let opens = OpenOptions::new()
            .append(true)
            .open(&opens_path)
            .map_err(io_err(&opens_path))?;
        Ok(JournalFiles {
            dir,
            opens,
            opens_path,
            opens_bytes: header.len() as u64,
            opens_dirty: false,
            opens_synced_at: Instant::now(),
            live: HashSet::new(),
            segment,
            handoffs_buffered: 0,
            handoffs_unsynced: 0,
            unsynced_since: None,
            sync: setup.sync,
            sealer: setup.sealer,
            max_records: setup.max_records,
            interval: setup.interval,
            instance: Arc::clone(instance),
        })
    }

    /// Add a chain entry to the current segment; its line to `buf`, the
    /// bytes the segment file gets at the next write. `handoff`: a
    /// forwarder's hand-off record, which is synced in a group (see the
    /// module docs of [`crate::records::journal`]).
    pub(super) fn push_entry(&mut self, json: Vec<u8>, buf: &mut Vec<u8>, handoff: bool) {
        buf.extend_from_slice(&json);
        buf.push(b'\n');
        if self.segment.entries.is_empty() {
            self.segment.first_at = Some(Instant::now());
        }
        self.segment.entries.push(json);
        if handoff {
            self.handoffs_buffered += 1;
        }
        // A full segment goes at once, even in the middle of a round: one
        // that outgrew `max_records` became a full batch and a small one.
        // (Its rotation syncs what is written.)
        if self.segment.entries.len() >= self.max_records {
            self.write_entries(buf, false);
            self.rotate();
        }
    }

    /// Append `buf`, the entries pushed since the last write, to the
    /// current segment, and sync the segment if `sync` and it holds
    /// anything not yet synced (whatever was written before included);
    /// `buf` is emptied either way. A failure is loud, and the entries
    /// stay in memory and are sealed with the segment.
    pub(super) fn write_entries(&mut self, buf: &mut Vec<u8>, sync: bool) {
        let wrote = !buf.is_empty();
        if wrote {
            if let Err(e) = self.segment.file.write_all(buf) {
                self.write_failed(&e);
            }
            buf.clear();
            if self.handoffs_buffered > 0 {
                self.handoffs_unsynced += std::mem::take(&mut self.handoffs_buffered);
                self.unsynced_since.get_or_insert_with(Instant::now);
            }
        }
        if sync && (wrote || self.handoffs_unsynced > 0) {
            self.sync_segment();
        }
    }

    /// Sync the current segment: every entry written to it is on disk.
    fn sync_segment(&mut self) {
        if let Err(e) = self.sync.sync(&self.segment.file, &self.segment.path) {
            self.write_failed(&e);
        }
        self.handoffs_unsynced = 0;
        self.unsynced_since = None;
    }

    fn write_failed(&self, e: &std::io::Error) {
        tracing::error!(path = %self.segment.path.display(), error = %e, "cannot write the journal");
        metrics::counter!("gateway_journal_write_errors_total").increment(1);
    }

    /// Whether the hand-off records written and waiting, with those about
    /// to be, are a whole group ([`HANDOFF_GROUP`]) or the oldest has
    /// waited [`HANDOFF_SYNC`] by `now`: they are synced now.
    pub(super) fn handoffs_due(&self, now: Instant) -> bool {
        self.handoffs_unsynced + self.handoffs_buffered >= HANDOFF_GROUP
            || self.unsynced_since.is_some_and(|t| t + HANDOFF_SYNC <= now)
    }

    /// Whether the hand-off records about to be written make a group with
    /// those waiting: the writer ends its round there.
    pub(super) fn handoffs_full(&self) -> bool {
        self.handoffs_unsynced + self.handoffs_buffered >= HANDOFF_GROUP
    }

    /// When the writer must act at the latest, if nothing comes before:
    /// the current segment's hand-over, or the sync of the hand-off records
    /// waiting for one.
    pub(super) fn due(&self) -> Option<Instant> {
        let handoffs = self.unsynced_since.map(|t| t + HANDOFF_SYNC);
        match (self.segment_due(), handoffs) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the current segment must be handed over at the latest.
    pub(super) fn segment_due(&self) -> Option<Instant> {
        self.segment.first_at.map(|t| t + self.interval)
    }

    /// What is due by `now`: the hand-off records waiting are synced, the
    /// segment handed over.
    pub(super) fn act_due(&mut self, now: Instant) {
        if self.handoffs_unsynced > 0 && self.handoffs_due(now) {
            self.sync_segment();
        }
        if self.segment_due().is_some_and(|d| d <= now) {
            self.rotate();
        }
    }

    /// Hand the current segment to the sealer and start the next one.
    pub(super) fn rotate(&mut self) {
        if self.segment.entries.is_empty() {
            return;
        }
        let next = match SegmentFile::create(&self.dir, self.segment.n + 1) {
            Ok(s) => s,
            Err(e) => {
                // Keep appending to this one; the next rotation tries again.
                tracing::error!(error = %e, "cannot start a journal segment");
                return;
            }
        };
        let done = std::mem::replace(&mut self.segment, next);
        let _ = self.sync.sync(&done.file, &done.path);
        self.handoffs_unsynced = 0;
        self.unsynced_since = None;
        let _ = sync_dir(&self.dir);
        // Blocks while the sealer is behind: connections then wait on
        // their records, which is the backpressure wanted.
        if self
            .sealer
            .blocking_send(Segment {
                path: done.path,
                entries: done.entries,
            })
            .is_err()
        {
            tracing::error!(
                "batch sealer has stopped; a segment stays in the journal for the next start"
            );
        }
    }

    /// Connection `conn`'s opening line is on its way to `opens.log`: it
    /// is live until its record is written.
    pub(super) fn opened(&mut self, conn: u64) {
        self.live.insert(conn);
    }

    /// `conn`'s record is in the segment: the line that says so goes to
    /// `opens` (written after the segment).
    pub(super) fn recorded(&mut self, conn: u64, opens: &mut Vec<u8>) {
        if self.live.remove(&conn) {
            if let Ok(mut line) = serde_json::to_vec(&OpensLine::Closed { conn }) {
                line.push(b'\n');
                opens.extend_from_slice(&line);
            }
        }
    }

    /// Append `lines` to `opens.log` (synced later, see [`Self::sync_opens`]).
    pub(super) fn write_opens(&mut self, lines: &[u8]) {
        if lines.is_empty() {
            return;
        }
        match self.opens.write_all(lines) {
            Ok(()) => {
                self.opens_bytes += lines.len() as u64;
                self.opens_dirty = true;
            }
            Err(e) => {
                tracing::error!(path = %self.opens_path.display(), error = %e, "cannot write opens.log");
                metrics::counter!("gateway_journal_write_errors_total").increment(1);
            }
        }
    }

    /// Sync `opens.log` if it has waited `at_least` since its last sync.
    pub(super) fn sync_opens(&mut self, at_least: Duration) {
        if self.opens_dirty && self.opens_synced_at.elapsed() >= at_least {
            let _ = self.sync.sync(&self.opens, &self.opens_path);
            self.opens_dirty = false;
            self.opens_synced_at = Instant::now();
        }
    }

    /// Whether the current segment holds a whole batch.
    pub(super) fn full(&self) -> bool {
        self.segment.entries.len() >= self.max_records
    }

    /// Rewrite `opens.log` with only the connections still open, when it
    /// has grown mostly dead.
    pub(super) fn compact_opens(&mut self) {
        if self.opens_bytes < OPENS_COMPACT_AT
            || self.opens_bytes < (self.live.len() as u64).saturating_mul(8 * 256)
        {
            return;
        }
        let lines = match read_lines(&self.opens_path) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot compact opens.log");
                return;
            }
        };
        let mut keep = Vec::new();
        let header = serde_json::to_vec(&OpensLine::Instance {
            instance: self.instance.to_string(),
        })
        .unwrap_or_default();
        keep.extend_from_slice(&header);
        keep.push(b'\n');
        for line in lines {
            let live = match serde_json::from_slice::<OpensLine>(&line) {
                Ok(OpensLine::Open { conn, .. } | OpensLine::Gate { conn, .. }) => {
                    self.live.contains(&conn)
                }
                _ => false,
            };
            if live {
                keep.extend_from_slice(&line);
                keep.push(b'\n');
            }
        }
        let tmp = self.dir.join(format!("{OPENS}.tmp"));
        let written = create_private(&tmp).and_then(|mut f| {
            f.write_all(&keep)
                .and_then(|()| f.sync_all())
                .map_err(io_err(&tmp))
        });
        let renamed = written.and_then(|()| {
            std::fs::rename(&tmp, &self.opens_path).map_err(io_err(&self.opens_path))
        });
        match renamed.and_then(|()| {
            OpenOptions::new()
                .append(true)
                .open(&self.opens_path)
                .map_err(io_err(&self.opens_path))
        }) {
            Ok(f) => {
                self.opens = f;
                self.opens_bytes = keep.len() as u64;
                let _ = sync_dir(&self.dir);
            }
            Err(e) => tracing::warn!(error = %e, "cannot compact opens.log"),
        }
    }
}

/// Mark a segment as being sealed as batch `seq`, synced, before the batch
/// is made: recovery then knows whether the batch reached the spool.
pub fn mark_sealing(path: &Path, seq: u64) -> std::io::Result<()> {
    let mut f = OpenOptions::new().append(true).open(path)?;
    writeln!(f, "{{\"sealing_as\":{seq}}}")?;
    f.sync_data()
}
