//! The journal: every accepted connection is on the record, even across a
//! kill of the process.
//!
//! One thread, the journal's writer, is the only writer of three things:
//! the operators' JSON-lines record file (`[records] path`), and, when the
//! gateway ships signed batches, two journal files in
//! `<spool_dir>/journal/`:
//!
//! - `opens.log`: one line when a connection is accepted (source, time),
//!   one when the gate lets it through (session, name), one when its record
//!   is written. A connection whose opening is there and whose closing is
//!   not was open when the process died.
//! - `seg-<n>.log`: the records and reports not yet sealed in a batch, one
//!   JSON object a line, in the order they will be sealed. Each segment
//!   becomes exactly one batch: when it holds `batch_max_records` entries,
//!   or its first entry has waited `batch_interval_ms`, or something asks
//!   for a seal (a drop report, the drain), the writer hands it to the
//!   sealer and starts the next one. The sealer appends
//!   `{"sealing_as":SEQ}` and syncs it, seals the batch, puts it in the
//!   spool (synced), then deletes the segment.
//!
//! # What is durable when
//!
//! - A **record** (and a **report**) is written and synced (`fdatasync`,
//!   grouped: every entry that arrived while the last sync ran shares the
//!   next) before [`RecordSink::close`] returns, so before the connection
//!   counts as closed: its slot, its session's count of open connections
//!   and, for a refusal, the answer to the client all wait for it.
//! - An **opening** is written before the connection's first request is
//!   read: the gate's line is acknowledged once written, which survives a
//!   kill of the process at any instant. It is synced with the next group,
//!   or within [`OPENS_SYNC`] when nothing else syncs: a crash of the whole
//!   machine can lose the openings of the last few milliseconds, of
//!   connections that had only just begun.
//!
//! # Recovery
//!
//! At start, before the first connection, [`recover`] reads what an
//! earlier process left: segments not yet sealed are sealed again (one
//! whose `sealing_as` batch is already in the spool's chain is dropped),
//! and every connection opened and never recorded gets a record cut by the
//! crash, with what is known of it — opened when, from where, and, if the
//! gate had let it through, its session and name (`verdict` `allowed`,
//! cause `cut_by_crash`; before the gate, `verdict` `undecided`). They are
//! sealed first, ahead of the new process's own records and its start
//! report. A record carries its gateway process (`instance`) and a number
//! (`conn`) unique within it, so a record sealed twice (a crash between
//! putting a batch in the spool and deleting its segment, with the machine
//! going down too) is recognised by the control plane.
//!
//! # Limits
//!
//! - At most [`RECORD_QUEUE`] entries wait for the writer; a connection
//!   that would add one more waits for room (backpressure, never a loss).
//! - `opens.log` is rewritten with only the connections still open when it
//!   passes [`OPENS_COMPACT_AT`] bytes and is mostly closed connections.
//! - The writer keeps the current segment's entries in memory: at most
//!   `batch_max_records` records.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::records::record::{now, Record, Verdict};

/// How many entries may wait for the writer before connections wait for
/// it in turn. At ~400 bytes each, 4,096 is about 1.6 MiB: enough to ride
/// out a slow disk for a moment, small enough to bound memory.
pub const RECORD_QUEUE: usize = 4096;

/// The longest an opening written to `opens.log` waits for a sync when
/// nothing else syncs the file.
pub const OPENS_SYNC: Duration = Duration::from_millis(5);

/// `opens.log` is compacted once it is this large and holds more than
/// eight times the lines of the connections still open.
pub const OPENS_COMPACT_AT: u64 = 4 << 20;

/// The journal's directory inside the spool directory.
pub const JOURNAL_DIR: &str = "journal";
const OPENS: &str = "opens.log";
const INSTANCE: &str = "instance";

/// Why the journal could not be opened or recovered.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |e| JournalError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// One segment handed to the sealer: its entries become one batch.
#[derive(Debug)]
pub struct Segment {
    /// The segment file, deleted once the batch is in the spool.
    pub path: PathBuf,
    /// One JSON object each, in order.
    pub entries: Vec<Vec<u8>>,
}

/// What an earlier process left, read by [`recover`].
#[derive(Debug, Default)]
pub struct Recovered {
    /// Entries to seal before any new one: unsealed records and reports of
    /// the earlier process, then the records of connections its crash cut.
    pub entries: Vec<Vec<u8>>,
    /// How many of `entries` are records of connections cut by the crash.
    pub cut_by_crash: u64,
    /// The instance that wrote the journal before, if known.
    pub previous_instance: Option<String>,
    /// The files read, deleted once the entries are written again.
    old_files: Vec<PathBuf>,
    /// Directories of later generations, removed once emptied.
    old_dirs: Vec<PathBuf>,
    /// Crash records kept apart while the directories are read.
    cut_entries: Vec<Vec<u8>>,
    /// The next segment number.
    next_segment: u64,
}

impl Recovered {
    /// Nothing recovered: a successor's journal, fresh.
    pub fn fresh() -> Recovered {
        Recovered {
            next_segment: 1,
            ..Recovered::default()
        }
    }

    /// Whether nothing was left to recover.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Delete what was read (its entries are sealed): the files, then the
    /// directories of later generations.
    pub fn discard(&self) {
        for f in &self.old_files {
            let _ = std::fs::remove_file(f);
        }
        for d in &self.old_dirs {
            let _ = std::fs::remove_file(d.join(INSTANCE));
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Read what an earlier process left in `dir` (the journal directory,
/// made mode 0700 if missing): see the module docs. `sealed_through` is
/// the last batch in the spool's chain; `gateway_id` and `instance` name
/// the new process, which the cut records are written by.
pub fn recover(
    dir: &Path,
    sealed_through: u64,
    gateway_id: &Arc<str>,
    instance: &Arc<str>,
) -> Result<Recovered, JournalError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    let mut out = Recovered {
        previous_instance: std::fs::read_to_string(dir.join(INSTANCE))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty()),
        ..Recovered::default()
    };
    recover_one(dir, sealed_through, gateway_id, instance, &mut out)?;
    out.entries.append(&mut out.cut_entries);
    Ok(out)
}

/// [`recover`] for a cold start: `dir`, then the journal of every later
/// generation of the process that wrote it (`gen-<g>`, see
/// [`generation_dir`]), oldest first, as they would have been sealed.
/// Their directories go once the entries are written again.
pub fn recover_all(
    dir: &Path,
    sealed_through: u64,
    gateway_id: &Arc<str>,
    instance: &Arc<str>,
) -> Result<Recovered, JournalError> {
    let mut generations: Vec<(u64, PathBuf)> = Vec::new();
    if dir.is_dir() {
        for item in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let item = item.map_err(io_err(dir))?;
            let name = item.file_name();
            if let Some(g) = name
                .to_str()
                .and_then(|n| n.strip_prefix("gen-"))
                .and_then(|g| g.parse::<u64>().ok())
            {
                if item.path().is_dir() {
                    generations.push((g, item.path()));
                }
            }
        }
    }
    generations.sort();
    let mut out = Recovered {
        previous_instance: std::fs::read_to_string(dir.join(INSTANCE))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty()),
        ..Recovered::default()
    };
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    recover_one(dir, sealed_through, gateway_id, instance, &mut out)?;
    let next_segment = out.next_segment;
    // Every generation's unsealed segments in turn, then every crash
    // record (kept apart in `cut_entries` until the end).
    for (_, gen_dir) in generations {
        recover_one(&gen_dir, sealed_through, gateway_id, instance, &mut out)?;
        out.old_dirs.push(gen_dir);
    }
    out.next_segment = next_segment;
    out.entries.append(&mut out.cut_entries);
    Ok(out)
}

/// Where generation `g` of a process keeps its journal: `dir` for the
/// first (a cold start), `dir/gen-<g>` for each successor a handover
/// starts (two processes never write one journal).
pub fn generation_dir(dir: &Path, g: u64) -> PathBuf {
    if g == 0 {
        dir.to_owned()
    } else {
        dir.join(format!("gen-{g}"))
    }
}

/// Write `entries` as segment `n` of `dir` (synced): what a successor
/// found left in its predecessor's journal, put in its own before it is
/// sealed. Returns the segment to hand to the sealer.
pub fn write_segment(dir: &Path, n: u64, entries: Vec<Vec<u8>>) -> Result<Segment, JournalError> {
    let mut segment = SegmentFile::create(dir, n)?;
    segment.write_synced(&entries)?;
    sync_dir(dir)?;
    Ok(Segment {
        path: segment.path,
        entries,
    })
}

/// Read one journal directory into `out`.
fn recover_one(
    dir: &Path,
    sealed_through: u64,
    gateway_id: &Arc<str>,
    instance: &Arc<str>,
    out: &mut Recovered,
) -> Result<(), JournalError> {
    // Segments, oldest first.
    let mut segments: Vec<(u64, PathBuf)> = Vec::new();
    for item in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let item = item.map_err(io_err(dir))?;
        let name = item.file_name();
        let name = name.to_string_lossy();
        if let Some(n) = name
            .strip_prefix("seg-")
            .and_then(|r| r.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            segments.push((n, item.path()));
        } else if name.ends_with(".tmp") {
            let _ = std::fs::remove_file(item.path());
        }
    }
    segments.sort();
    out.next_segment = segments.last().map_or(1, |(n, _)| n + 1);
    // (instance, conn) of every record found unsealed: its connection
    // needs no record cut by the crash.
    let mut recorded: HashSet<(String, u64)> = HashSet::new();
    for (_, path) in &segments {
        let lines = read_lines(path)?;
        let sealed = lines
            .last()
            .and_then(|l| serde_json::from_slice::<Trailer>(l).ok())
            .is_some_and(|t| t.sealing_as <= sealed_through);
        for line in lines {
            if serde_json::from_slice::<Trailer>(&line).is_ok() {
                continue;
            }
            if let Ok(id) = serde_json::from_slice::<ConnId>(&line) {
                recorded.insert((id.instance, id.conn));
            }
            if !sealed {
                out.entries.push(line);
            }
        }
        out.old_files.push(path.clone());
    }

    // Connections opened and never recorded.
    let opens_path = dir.join(OPENS);
    if opens_path.exists() {
        let mut owner: Option<String> = None;
        let mut open: HashMap<u64, Open> = HashMap::new();
        let mut order: Vec<u64> = Vec::new();
        for line in read_lines(&opens_path)? {
            let Ok(entry) = serde_json::from_slice::<OpensLine>(&line) else {
                continue;
            };
            match entry {
                OpensLine::Instance { instance } => owner = Some(instance),
                OpensLine::Open { conn, source, at } => {
                    order.push(conn);
                    open.insert(
                        conn,
                        Open {
                            source,
                            at,
                            gate: None,
                        },
                    );
                }
                OpensLine::Gate {
                    conn,
                    session_id,
                    attempt,
                    tenant,
                    sni,
                } => {
                    if let Some(o) = open.get_mut(&conn) {
                        o.gate = Some(Gate {
                            session_id,
                            attempt,
                            tenant,
                            sni,
                        });
                    }
                }
                OpensLine::Closed { conn } => {
                    open.remove(&conn);
                }
            }
        }
        let owner = owner.or_else(|| out.previous_instance.clone());
        let closed_at = now();
        for conn in order {
            let Some(o) = open.remove(&conn) else {
                continue;
            };
            if let Some(owner) = &owner {
                if recorded.contains(&(owner.clone(), conn)) {
                    continue;
                }
            }
            let record = cut_record(gateway_id, instance, owner.as_deref(), conn, o, &closed_at);
            if let Ok(bytes) = serde_json::to_vec(&record) {
                out.cut_entries.push(bytes);
                out.cut_by_crash += 1;
            }
        }
        out.old_files.push(opens_path);
    }
    Ok(())
}

/// The record of a connection a crash cut: what its opening lines say.
fn cut_record(
    gateway_id: &Arc<str>,
    instance: &Arc<str>,
    owner: Option<&str>,
    conn: u64,
    open: Open,
    closed_at: &str,
) -> Record {
    let source = open
        .source
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    // The record is the earlier process's connection: its instance, not
    // the one that writes it now.
    let owner: Arc<str> = owner.map_or_else(|| Arc::clone(instance), Arc::from);
    let mut record = Record::open(Arc::clone(gateway_id), owner, conn, source);
    record.opened_at = open.at;
    record.closed_at = closed_at.to_owned();
    record.cause = Some("cut_by_crash");
    match open.gate {
        Some(g) => {
            record.session_id = Some(Arc::from(g.session_id.as_str()));
            record.attempt = Some(g.attempt);
            record.tenant = Some(Arc::from(g.tenant.as_str()));
            record.sni = Some(g.sni);
            record.verdict = Verdict::Allowed;
        }
        None => record.verdict = Verdict::Undecided,
    }
    record
}

/// Every whole line of `path`; a last line the crash cut short (no
/// newline, or not JSON) is left out.
fn read_lines(path: &Path) -> Result<Vec<Vec<u8>>, JournalError> {
    let file = File::open(path).map_err(io_err(path))?;
    let mut out = Vec::new();
    let mut reader = BufReader::new(file);
    loop {
        let mut line = Vec::new();
        let n = reader.read_until(b'\n', &mut line).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            break;
        }
        line.pop();
        if !line.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(&line).is_ok() {
            out.push(line);
        }
    }
    Ok(out)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Trailer {
    sealing_as: u64,
}

#[derive(serde::Deserialize)]
struct ConnId {
    instance: String,
    conn: u64,
}

#[derive(Debug)]
struct Open {
    source: String,
    at: String,
    gate: Option<Gate>,
}

#[derive(Debug)]
struct Gate {
    session_id: String,
    attempt: u32,
    tenant: String,
    sni: String,
}

/// A line of `opens.log`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum OpensLine {
    Instance {
        instance: String,
    },
    Open {
        conn: u64,
        source: String,
        at: String,
    },
    Gate {
        conn: u64,
        session_id: String,
        attempt: u32,
        tenant: String,
        sni: String,
    },
    Closed {
        conn: u64,
    },
}

/// What the writer is asked to do.
enum Msg {
    /// A line for `opens.log`; `ack` (if any) once written.
    Opening {
        line: Vec<u8>,
        ack: Option<oneshot::Sender<()>>,
    },
    /// A record: the record file, the segment, `opens.log`; `ack` once
    /// synced.
    Record {
        conn: u64,
        json: Vec<u8>,
        ack: oneshot::Sender<()>,
    },
    /// A report (or another chain entry): the segment; `ack` once synced.
    Entry {
        json: Vec<u8>,
        ack: oneshot::Sender<()>,
    },
    /// Hand the segment to the sealer now; `ack` once handed.
    Seal { ack: oneshot::Sender<()> },
}

struct Queued {
    msg: Msg,
    _permit: OwnedSemaphorePermit,
}

/// Where connections send their records: cheap to clone.
#[derive(Clone, Debug)]
pub struct RecordSink {
    inner: Arc<SinkInner>,
}

#[derive(Debug)]
struct SinkInner {
    tx: std_mpsc::Sender<Queued>,
    room: Arc<Semaphore>,
    next_conn: AtomicU64,
    gateway_id: Arc<str>,
    instance: Arc<str>,
    journal: bool,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Queued")
    }
}

/// How the writer is set up.
#[derive(Debug)]
pub struct WriterConfig {
    /// The operators' JSON-lines file (appended to).
    pub records_path: PathBuf,
    /// The journal directory, with signed batches; `None`: records go to
    /// the record file only.
    pub journal: Option<JournalSetup>,
    pub gateway_id: Arc<str>,
    pub instance: Arc<str>,
    /// The first connection number: `generation << 40`, plus one (a
    /// successor goes on as the same instance, and numbers its
    /// connections apart from its predecessor's).
    pub first_conn: u64,
}

/// The first connection number of generation `g` of a process.
pub fn first_conn(g: u64) -> u64 {
    (g << 40) + 1
}

/// The journal's part of [`WriterConfig`].
#[derive(Debug)]
pub struct JournalSetup {
    pub dir: PathBuf,
    pub recovered: Recovered,
    /// Segments go here, to be sealed.
    pub sealer: tokio::sync::mpsc::Sender<Segment>,
    pub max_records: usize,
    pub interval: Duration,
}

/// The writer thread, running: joined at the drain once every sink is gone.
#[derive(Debug)]
pub struct WriterThread {
    done: oneshot::Receiver<()>,
}

impl WriterThread {
    /// Resolves when the writer has written everything, handed its last
    /// segment to the sealer and stopped.
    pub async fn finished(self) {
        let _ = self.done.await;
    }
}

/// Start the writer thread; returns the sink connections write through.
pub fn start(config: WriterConfig) -> Result<(RecordSink, WriterThread), JournalError> {
    let records = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&config.records_path)
        .map_err(io_err(&config.records_path))?;
    let journal = match config.journal {
        Some(setup) => Some(JournalFiles::start(setup, &config.instance)?),
        None => None,
    };
    let (tx, rx) = std_mpsc::channel();
    let has_journal = journal.is_some();
    let (done_tx, done) = oneshot::channel();
    let writer = Writer {
        rx,
        records,
        records_path: config.records_path,
        journal,
    };
    std::thread::Builder::new()
        .name("records".into())
        .spawn(move || {
            writer.run();
            let _ = done_tx.send(());
        })
        .map_err(|e| JournalError::Io {
            path: PathBuf::from("(writer thread)"),
            reason: e.to_string(),
        })?;
    Ok((
        RecordSink {
            inner: Arc::new(SinkInner {
                tx,
                room: Arc::new(Semaphore::new(RECORD_QUEUE)),
                next_conn: AtomicU64::new(config.first_conn.max(1)),
                gateway_id: config.gateway_id,
                instance: config.instance,
                journal: has_journal,
            }),
        },
        WriterThread { done },
    ))
}

/// Waits for a journal entry to be written (an opening) or synced.
#[derive(Debug)]
pub struct Written(Option<oneshot::Receiver<()>>);

impl Written {
    /// Resolves once the entry is on the record. If the writer is gone
    /// (the process is going down), resolves at once.
    pub async fn wait(self) {
        if let Some(rx) = self.0 {
            let _ = rx.await;
        }
    }
}

impl RecordSink {
    /// The gateway process's instance id.
    pub fn instance(&self) -> &Arc<str> {
        &self.inner.instance
    }

    /// A record for a connection just accepted from `source`, its opening
    /// on its way to the journal.
    pub async fn open(&self, source: SocketAddr) -> Record {
        let conn = self.inner.next_conn.fetch_add(1, Ordering::Relaxed);
        let record = Record::open(
            Arc::clone(&self.inner.gateway_id),
            Arc::clone(&self.inner.instance),
            conn,
            source,
        );
        if self.inner.journal {
            let line = OpensLine::Open {
                conn,
                source: source.to_string(),
                at: record.opened_at.clone(),
            };
            self.send_opening(&line, None).await;
        }
        record
    }

    /// The gate let `record`'s connection through: its session and name go
    /// to the journal. Wait on the result before the connection's first
    /// request is read.
    pub async fn gate(&self, record: &Record) -> Written {
        if !self.inner.journal {
            return Written(None);
        }
        let line = OpensLine::Gate {
            conn: record.conn,
            session_id: record.session_id.as_deref().unwrap_or("").to_owned(),
            attempt: record.attempt.unwrap_or(0),
            tenant: record.tenant.as_deref().unwrap_or("").to_owned(),
            sni: record.sni.clone().unwrap_or_default(),
        };
        let (ack, rx) = oneshot::channel();
        self.send_opening(&line, Some(ack)).await;
        Written(Some(rx))
    }

    async fn send_opening(&self, line: &OpensLine, ack: Option<oneshot::Sender<()>>) {
        let Ok(mut bytes) = serde_json::to_vec(line) else {
            return;
        };
        bytes.push(b'\n');
        self.send(Msg::Opening { line: bytes, ack }).await;
    }

    /// Close a record: stamp its end and write it. Returns once it is on
    /// disk (synced), or at once if the writer has stopped (logged).
    pub async fn close(&self, mut record: Record) {
        record.closed_at = now();
        metrics::counter!("gateway_connections_total", "verdict" => record.verdict.as_str())
            .increment(1);
        // A Record is plain data: serialising it cannot fail.
        let Ok(json) = serde_json::to_vec(&record) else {
            return;
        };
        let (ack, rx) = oneshot::channel();
        if self
            .send(Msg::Record {
                conn: record.conn,
                json,
                ack,
            })
            .await
        {
            let _ = rx.await;
        }
    }

    /// Put a chain entry (a signed report) on the record, after every
    /// record closed before it. Returns once it is on disk.
    pub async fn entry(&self, json: Vec<u8>) {
        let (ack, rx) = oneshot::channel();
        if self.send(Msg::Entry { json, ack }).await {
            let _ = rx.await;
        }
    }

    /// Hand what the journal holds to the sealer now, rather than at the
    /// end of its interval.
    pub async fn seal(&self) {
        let (ack, rx) = oneshot::channel();
        if self.send(Msg::Seal { ack }).await {
            let _ = rx.await;
        }
    }

    /// Send `msg` once there is room; `false` if the writer has stopped.
    async fn send(&self, msg: Msg) -> bool {
        let Ok(permit) = Arc::clone(&self.inner.room).acquire_owned().await else {
            return false;
        };
        if self
            .inner
            .tx
            .send(Queued {
                msg,
                _permit: permit,
            })
            .is_err()
        {
            tracing::error!("record writer has stopped; an entry was lost");
            return false;
        }
        true
    }
}

/// The journal's files, open.
struct JournalFiles {
    dir: PathBuf,
    opens: File,
    opens_path: PathBuf,
    opens_bytes: u64,
    opens_dirty: bool,
    opens_synced_at: Instant,
    /// Connections opened and not yet recorded.
    live: HashSet<u64>,
    segment: SegmentFile,
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
    fn write_synced(&mut self, entries: &[Vec<u8>]) -> Result<(), JournalError> {
        let mut bytes = Vec::new();
        for e in entries {
            bytes.extend_from_slice(e);
            bytes.push(b'\n');
        }
        self.file
            .write_all(&bytes)
            .and_then(|()| self.file.sync_data())
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
    fn start(setup: JournalSetup, instance: &Arc<str>) -> Result<JournalFiles, JournalError> {
        let dir = setup.dir;
        // A successor's journal is new (recovery made a cold start's).
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(io_err(&dir))?;
        }
        let recovered = setup.recovered;
        let mut segment = SegmentFile::create(&dir, recovered.next_segment)?;
        segment.write_synced(&recovered.entries)?;
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
            sealer: setup.sealer,
            max_records: setup.max_records,
            interval: setup.interval,
            instance: Arc::clone(instance),
        })
    }

    /// Add a chain entry to the current segment; its line to `buf`, the
    /// bytes the segment file gets at the next write.
    fn push_entry(&mut self, json: Vec<u8>, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&json);
        buf.push(b'\n');
        if self.segment.entries.is_empty() {
            self.segment.first_at = Some(Instant::now());
        }
        self.segment.entries.push(json);
        // A full segment goes at once, even in the middle of a round: one
        // that outgrew `max_records` became a full batch and a small one.
        if self.segment.entries.len() >= self.max_records {
            self.write_entries(buf);
            self.rotate();
        }
    }

    /// Append `buf`, the entries pushed since the last write, to the
    /// current segment, synced; `buf` is emptied either way. A failure is
    /// loud, and the entries stay in memory and are sealed with the segment.
    fn write_entries(&mut self, buf: &mut Vec<u8>) {
        if buf.is_empty() {
            return;
        }
        let written = self.segment.file.write_all(buf);
        let synced = written.and_then(|()| self.segment.file.sync_data());
        if let Err(e) = synced {
            tracing::error!(path = %self.segment.path.display(), error = %e, "cannot write the journal");
            metrics::counter!("gateway_journal_write_errors_total").increment(1);
        }
        buf.clear();
    }

    /// When the current segment must be handed over at the latest.
    fn due(&self) -> Option<Instant> {
        self.segment.first_at.map(|t| t + self.interval)
    }

    /// Hand the current segment to the sealer and start the next one.
    fn rotate(&mut self) {
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
        let _ = done.file.sync_data();
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

    /// Rewrite `opens.log` with only the connections still open, when it
    /// has grown mostly dead.
    fn compact_opens(&mut self) {
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

/// The writer thread's state.
struct Writer {
    rx: std_mpsc::Receiver<Queued>,
    records: File,
    records_path: PathBuf,
    journal: Option<JournalFiles>,
}

/// The most entries one round of the writer takes before it writes.
const ROUND: usize = 1024;

impl Writer {
    fn run(mut self) {
        let mut records_buf = Vec::with_capacity(64 * 1024);
        let mut segment_buf = Vec::with_capacity(64 * 1024);
        let mut opens_buf = Vec::with_capacity(16 * 1024);
        let mut written_acks = Vec::new();
        let mut synced_acks = Vec::new();
        loop {
            // Wait for work, or for the segment's interval to run out.
            let first = match self.journal.as_ref().and_then(JournalFiles::due) {
                Some(due) => {
                    let wait = due.saturating_duration_since(Instant::now());
                    match self.rx.recv_timeout(wait) {
                        Ok(q) => Some(q),
                        Err(std_mpsc::RecvTimeoutError::Timeout) => None,
                        Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
                None => {
                    // Nothing due: sync what openings wait, then block.
                    self.sync_opens(Duration::ZERO);
                    match self.rx.recv() {
                        Ok(q) => Some(q),
                        Err(_) => break,
                    }
                }
            };
            let Some(first) = first else {
                if let Some(j) = self.journal.as_mut() {
                    j.rotate();
                }
                continue;
            };
            let mut seal = false;
            let mut round = vec![first];
            while round.len() < ROUND {
                match self.rx.try_recv() {
                    Ok(q) => round.push(q),
                    Err(_) => break,
                }
            }
            for q in round {
                match q.msg {
                    Msg::Opening { line, ack } => {
                        if let Some(j) = self.journal.as_mut() {
                            if let Ok(OpensLine::Open { conn, .. }) =
                                serde_json::from_slice::<OpensLine>(&line)
                            {
                                j.live.insert(conn);
                            }
                            opens_buf.extend_from_slice(&line);
                        }
                        if let Some(ack) = ack {
                            written_acks.push(ack);
                        }
                    }
                    Msg::Record { conn, json, ack } => {
                        records_buf.extend_from_slice(&json);
                        records_buf.push(b'\n');
                        if let Some(j) = self.journal.as_mut() {
                            j.push_entry(json, &mut segment_buf);
                            if j.live.remove(&conn) {
                                if let Ok(mut line) =
                                    serde_json::to_vec(&OpensLine::Closed { conn })
                                {
                                    line.push(b'\n');
                                    opens_buf.extend_from_slice(&line);
                                }
                            }
                            synced_acks.push(ack);
                        } else {
                            written_acks.push(ack);
                        }
                    }
                    Msg::Entry { json, ack } => {
                        if let Some(j) = self.journal.as_mut() {
                            j.push_entry(json, &mut segment_buf);
                        }
                        synced_acks.push(ack);
                    }
                    Msg::Seal { ack } => {
                        seal = true;
                        written_acks.push(ack);
                    }
                }
            }
            // Records before the lines that say they are closed.
            if let Some(j) = self.journal.as_mut() {
                j.write_entries(&mut segment_buf);
            }
            segment_buf.clear();
            if !opens_buf.is_empty() {
                if let Some(j) = self.journal.as_mut() {
                    match j.opens.write_all(&opens_buf) {
                        Ok(()) => {
                            j.opens_bytes += opens_buf.len() as u64;
                            j.opens_dirty = true;
                        }
                        Err(e) => {
                            tracing::error!(path = %j.opens_path.display(), error = %e, "cannot write opens.log");
                            metrics::counter!("gateway_journal_write_errors_total").increment(1);
                        }
                    }
                }
                opens_buf.clear();
            }
            if !records_buf.is_empty() {
                if let Err(e) = self.records.write_all(&records_buf) {
                    tracing::error!(path = %self.records_path.display(), error = %e, "cannot write records");
                }
                records_buf.clear();
            }
            for ack in written_acks.drain(..) {
                let _ = ack.send(());
            }
            for ack in synced_acks.drain(..) {
                let _ = ack.send(());
            }
            self.sync_opens(OPENS_SYNC);
            if let Some(j) = self.journal.as_mut() {
                let full = j.segment.entries.len() >= j.max_records;
                let late = j.due().is_some_and(|d| d <= Instant::now());
                if seal || full || late {
                    j.rotate();
                }
                j.compact_opens();
            }
        }
        // Every sink is gone: hand over the last segment.
        if let Some(j) = self.journal.as_mut() {
            j.rotate();
            let _ = j.opens.sync_data();
        }
        let _ = self.records.flush();
    }

    /// Sync `opens.log` if it has waited `at_least` since its last sync.
    fn sync_opens(&mut self, at_least: Duration) {
        if let Some(j) = self.journal.as_mut() {
            if j.opens_dirty && j.opens_synced_at.elapsed() >= at_least {
                let _ = j.opens.sync_data();
                j.opens_dirty = false;
                j.opens_synced_at = Instant::now();
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(
        dir: &Path,
        sealed: u64,
        instance: &str,
        max_records: usize,
    ) -> (
        RecordSink,
        WriterThread,
        tokio::sync::mpsc::Receiver<Segment>,
        Recovered,
    ) {
        let gateway: Arc<str> = Arc::from("gw-a");
        let instance: Arc<str> = Arc::from(instance);
        let journal = dir.join(JOURNAL_DIR);
        let recovered = recover(&journal, sealed, &gateway, &instance).unwrap();
        let summary = Recovered {
            entries: recovered.entries.clone(),
            cut_by_crash: recovered.cut_by_crash,
            previous_instance: recovered.previous_instance.clone(),
            ..Recovered::default()
        };
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (sink, thread) = start(WriterConfig {
            records_path: dir.join("records.jsonl"),
            journal: Some(JournalSetup {
                dir: journal,
                recovered,
                sealer: tx,
                max_records,
                interval: Duration::from_secs(3600),
            }),
            gateway_id: gateway,
            instance,
            first_conn: 1,
        })
        .unwrap();
        (sink, thread, rx, summary)
    }

    fn src(n: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, n], 40000))
    }

    #[tokio::test]
    async fn records_are_sealed_in_segments_and_nothing_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let (sink, thread, mut segments, _) = setup(dir.path(), 0, "00000000000000aa", 2);
        for n in 1..=3 {
            let r = sink.open(src(n)).await;
            sink.close(r).await;
        }
        let first = segments.recv().await.unwrap();
        assert_eq!(first.entries.len(), 2);
        sink.seal().await;
        let second = segments.recv().await.unwrap();
        assert_eq!(second.entries.len(), 1);
        drop(sink);
        thread.finished().await;
        let text = std::fs::read_to_string(dir.path().join("records.jsonl")).unwrap();
        let conns: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["conn"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(conns, [1, 2, 3]);
    }

    /// Records closing together arrive in one round of the writer; the
    /// segment still goes the moment it is full, each with its entries on
    /// disk, so every batch but the last is exactly `max_records`.
    #[tokio::test]
    async fn a_round_larger_than_a_segment_fills_segments_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let (sink, thread, mut segments, _) = setup(dir.path(), 0, "00000000000000aa", 2);
        let mut opened = Vec::new();
        for n in 1..=7 {
            opened.push(sink.open(src(n)).await);
        }
        let mut closes = tokio::task::JoinSet::new();
        for r in opened {
            let sink = sink.clone();
            closes.spawn(async move { sink.close(r).await });
        }
        while closes.join_next().await.is_some() {}
        drop(sink);
        thread.finished().await;
        let mut sizes = Vec::new();
        while let Ok(segment) = segments.try_recv() {
            let on_disk = std::fs::read_to_string(&segment.path).unwrap();
            assert_eq!(on_disk.lines().count(), segment.entries.len());
            sizes.push(segment.entries.len());
        }
        assert_eq!(sizes, [2, 2, 2, 1]);
    }

    #[tokio::test]
    async fn a_crash_leaves_open_connections_recorded_as_cut_and_unsealed_records_sealed() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (sink, thread, mut segments, recovered) =
                setup(dir.path(), 0, "00000000000000aa", 100);
            assert!(recovered.previous_instance.is_none());
            // One connection recorded (unsealed), one through the gate and
            // open, one open before the gate.
            let done = sink.open(src(1)).await;
            sink.close(done).await;
            let mut gated = sink.open(src(2)).await;
            gated.session_id = Some(Arc::from("sess-1"));
            gated.attempt = Some(3);
            gated.tenant = Some(Arc::from("acme"));
            gated.sni = Some("api.example.com".into());
            sink.gate(&gated).await.wait().await;
            let early = sink.open(src(3)).await;
            // The writer takes entries in order: once this gate line (for a
            // connection never opened, which recovery ignores) is written,
            // so is `early`'s opening.
            sink.gate(&Record::open(Arc::from("x"), Arc::from("y"), 999, src(9)))
                .await
                .wait()
                .await;
            // "Kill": the thread is left running with its files as they
            // are; nothing is sealed.
            std::mem::forget(gated);
            std::mem::forget(early);
            assert!(segments.try_recv().is_err());
            std::mem::forget(sink);
            std::mem::forget(thread);
        }
        let (sink, thread, mut segments, recovered) = setup(dir.path(), 0, "00000000000000bb", 100);
        assert_eq!(
            recovered.previous_instance.as_deref(),
            Some("00000000000000aa")
        );
        assert_eq!(recovered.cut_by_crash, 2);
        let entries: Vec<serde_json::Value> = recovered
            .entries
            .iter()
            .map(|e| serde_json::from_slice(e).unwrap())
            .collect();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0]["conn"], 1);
        assert_eq!(entries[0]["verdict"], "allowed");
        assert!(entries[0].get("cause").is_none());
        assert_eq!(entries[1]["conn"], 2);
        assert_eq!(entries[1]["instance"], "00000000000000aa");
        assert_eq!(entries[1]["verdict"], "allowed");
        assert_eq!(entries[1]["cause"], "cut_by_crash");
        assert_eq!(entries[1]["session_id"], "sess-1");
        assert_eq!(entries[1]["sni"], "api.example.com");
        assert_eq!(entries[2]["conn"], 3);
        assert_eq!(entries[2]["verdict"], "undecided");
        assert!(entries[2]["session_id"].is_null());
        sink.seal().await;
        let seg = segments.recv().await.unwrap();
        assert_eq!(seg.entries.len(), 3);
        drop(sink);
        thread.finished().await;
        // A third start finds nothing: the segment is still there
        // (unsealed), but every connection is recorded.
        let gateway: Arc<str> = Arc::from("gw-a");
        let again = recover(
            &dir.path().join(JOURNAL_DIR),
            0,
            &gateway,
            &Arc::from("00000000000000cc"),
        )
        .unwrap();
        assert_eq!(again.cut_by_crash, 0);
        assert_eq!(
            again.entries.len(),
            3,
            "the unsealed segment is sealed again"
        );
    }

    #[tokio::test]
    async fn a_segment_already_in_the_chain_is_not_sealed_twice() {
        let dir = tempfile::tempdir().unwrap();
        let (sink, thread, mut segments, _) = setup(dir.path(), 0, "00000000000000aa", 100);
        let r = sink.open(src(1)).await;
        sink.close(r).await;
        sink.seal().await;
        let seg = segments.recv().await.unwrap();
        // The sealer marked it and then died before deleting it.
        mark_sealing(&seg.path, 7).unwrap();
        drop(sink);
        thread.finished().await;
        let gateway: Arc<str> = Arc::from("gw-a");
        let instance: Arc<str> = Arc::from("00000000000000bb");
        let journal = dir.path().join(JOURNAL_DIR);
        let sealed = recover(&journal, 7, &gateway, &instance).unwrap();
        assert!(sealed.entries.is_empty());
        let not_yet = recover(&journal, 6, &gateway, &instance).unwrap();
        assert_eq!(not_yet.entries.len(), 1);
    }

    /// A writer of generation `g` of instance `aa` in `journal`'s
    /// generation directory.
    fn generation(
        dir: &Path,
        g: u64,
    ) -> (
        RecordSink,
        WriterThread,
        tokio::sync::mpsc::Receiver<Segment>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (sink, thread) = start(WriterConfig {
            records_path: dir.join("records.jsonl"),
            journal: Some(JournalSetup {
                dir: generation_dir(&dir.join(JOURNAL_DIR), g),
                recovered: Recovered::fresh(),
                sealer: tx,
                max_records: 100,
                interval: Duration::from_secs(3600),
            }),
            gateway_id: Arc::from("gw-a"),
            instance: Arc::from("00000000000000aa"),
            first_conn: first_conn(g),
        })
        .unwrap();
        (sink, thread, rx)
    }

    /// Two generations of one instance (a process and its successor)
    /// killed with records unsealed and connections open: a cold start
    /// recovers both journals, the older's records first, every crash
    /// record after them, each connection numbered in its generation; and
    /// the successor's journal goes once it is written again.
    #[tokio::test]
    async fn a_cold_start_recovers_every_generations_journal_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for g in [0, 1] {
            let (sink, thread, segments) = generation(dir.path(), g);
            let done = sink.open(src(1)).await;
            sink.close(done).await;
            let open = sink.open(src(2)).await;
            sink.gate(&Record::open(
                Arc::from("x"),
                Arc::from("y"),
                u64::MAX,
                src(9),
            ))
            .await
            .wait()
            .await;
            std::mem::forget(open);
            std::mem::forget(sink);
            std::mem::forget(thread);
            std::mem::forget(segments);
        }
        let journal = dir.path().join(JOURNAL_DIR);
        assert!(journal.join("gen-1").is_dir());
        let gateway: Arc<str> = Arc::from("gw-a");
        let found = recover_all(&journal, 0, &gateway, &Arc::from("00000000000000bb")).unwrap();
        let entries: Vec<serde_json::Value> = found
            .entries
            .iter()
            .map(|e| serde_json::from_slice(e).unwrap())
            .collect();
        let conns: Vec<(u64, Option<&str>)> = entries
            .iter()
            .map(|e| (e["conn"].as_u64().unwrap(), e["cause"].as_str()))
            .collect();
        let g1 = first_conn(1);
        assert_eq!(
            conns,
            [
                (1, None),
                (g1, None),
                (2, Some("cut_by_crash")),
                (g1 + 1, Some("cut_by_crash")),
            ]
        );
        assert!(entries.iter().all(|e| e["instance"] == "00000000000000aa"));
        assert_eq!(found.cut_by_crash, 2);
        // Written again by the next writer: the successor's journal goes.
        let (tx, _rx) = tokio::sync::mpsc::channel(16);
        let (sink, thread) = start(WriterConfig {
            records_path: dir.path().join("records.jsonl"),
            journal: Some(JournalSetup {
                dir: journal.clone(),
                recovered: found,
                sealer: tx,
                max_records: 100,
                interval: Duration::from_secs(3600),
            }),
            gateway_id: gateway,
            instance: Arc::from("00000000000000bb"),
            first_conn: 1,
        })
        .unwrap();
        drop(sink);
        thread.finished().await;
        assert!(!journal.join("gen-1").exists());
    }

    #[test]
    fn a_line_cut_short_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        std::fs::write(&path, b"{\"a\":1}\n{\"b\":2}\n{\"c\":").unwrap();
        assert_eq!(read_lines(&path).unwrap().len(), 2);
        std::fs::write(&path, b"{\"a\":1}\n{\"b\":2}").unwrap();
        assert_eq!(read_lines(&path).unwrap().len(), 1);
    }
}
