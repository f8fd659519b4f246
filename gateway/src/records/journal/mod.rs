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
//! - A forwarder's **hand-off record** (a connection handed, untouched, to
//!   the member that holds its session: `forwarded_to`) is the exception.
//!   The holder's record of the same connection is the one the session's
//!   certificate counts; the hand-off's is listed beside it. So
//!   [`RecordSink::close`] hands it to the writer and returns: the
//!   connection waits for no write and no sync. The writer writes it with
//!   the next round and syncs it in a group: with the next entry that is
//!   synced anyway, or once [`HANDOFF_GROUP`] hand-off records wait for a
//!   sync, or once the oldest has waited [`HANDOFF_SYNC`], or when the
//!   segment goes to the sealer, whichever comes first. A kill of the
//!   process loses none that were written (they are in the segment file,
//!   which recovery reads); one still queued has its connection recorded
//!   cut by the crash, from its gate line, as before. A crash of the whole
//!   machine loses at most the last group: the hand-off records written
//!   since the last sync, at most [`HANDOFF_GROUP`] of them and at most
//!   [`HANDOFF_SYNC`] old. Their connections are on the holders' records.
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
//!
//! # Files
//!
//! - [`sink`]: the [`RecordSink`] connections write through, and what
//!   they wait on ([`Written`]);
//! - [`writer`]: the writer thread, started by [`start`], and what it is
//!   asked to do;
//! - [`files`]: the journal's files on disk: `opens.log`, the current
//!   segment and its rotation to the sealer, compaction;
//! - [`recovery`]: what an earlier process left, read at start.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod files;
mod recovery;
mod sink;
mod writer;

pub use files::{mark_sealing, write_segment, DataSync};
pub use recovery::{recover, recover_all, Recovered};
pub use sink::{RecordSink, Written};
pub use writer::{start, JournalSetup, WriterConfig, WriterThread};

/// How many entries may wait for the writer before connections wait for
/// it in turn. At ~400 bytes each, 4,096 is about 1.6 MiB: enough to ride
/// out a slow disk for a moment, small enough to bound memory.
pub const RECORD_QUEUE: usize = 4096;

/// The longest an opening written to `opens.log` waits for a sync when
/// nothing else syncs the file.
pub const OPENS_SYNC: Duration = Duration::from_millis(5);

/// The most hand-off records written and not yet synced: the writer syncs
/// them as a group once this many wait. A crash of the machine loses at
/// most these (~400 bytes each). At the rate a forwarder hands connections
/// on (a few thousand a second on one core), [`HANDOFF_SYNC`] comes first.
pub const HANDOFF_GROUP: usize = 256;

/// The longest a hand-off record written waits for its sync. 50 ms is
/// ten times [`OPENS_SYNC`]: a forwarder handing on a few thousand
/// connections a second then syncs its hand-off records about twenty
/// times a second instead of after every few connections, and a crash of
/// the machine loses at most the hand-offs of the last 50 ms, which the
/// holders' records cover.
pub const HANDOFF_SYNC: Duration = Duration::from_millis(50);

/// `opens.log` is compacted once it is this large and holds more than
/// eight times the lines of the connections still open.
pub const OPENS_COMPACT_AT: u64 = 4 << 20;

/// The journal's directory inside the spool directory.
pub const JOURNAL_DIR: &str = "journal";
pub(crate) const OPENS: &str = "opens.log";
pub(crate) const INSTANCE: &str = "instance";

/// Why the journal could not be opened or recovered.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |e| JournalError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// The first connection number of generation `g` of a process.
pub fn first_conn(g: u64) -> u64 {
    (g << 40) + 1
}

/// Make the journal directory `dir` (mode 0700: records name sessions and
/// destinations) if it is missing.
pub(crate) fn create_dir(dir: &Path) -> Result<(), JournalError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))
}

/// One segment handed to the sealer: its entries become one batch.
#[derive(Debug)]
pub struct Segment {
    /// The segment file, deleted once the batch is in the spool.
    pub path: PathBuf,
    /// One JSON object each, in order.
    pub entries: Vec<Vec<u8>>,
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

/// A line of `opens.log`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OpensLine {
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
        /// The member the connection came through (the member link).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        via: Option<String>,
        /// The member the connection was handed to (the member link).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forwarded_to: Option<String>,
        /// The destination is passthrough (its bytes passed on unread).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        passthrough: bool,
    },
    Closed {
        conn: u64,
    },
}

#[cfg(test)]
mod tests;
