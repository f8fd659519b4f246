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
//! - [`writer`]: the writer thread, started by [`start`];
//! - [`queue`]: what the writer is asked to do, and what each sender
//!   waits for;
//! - [`format`]: what they all share: the bounds and timings above, the
//!   files' names, the lines of `opens.log`, a segment, the error;
//! - [`files`]: the journal's files on disk: `opens.log`, the current
//!   segment and its rotation to the sealer, compaction;
//! - [`recovery`]: what an earlier process left, read at start.

mod files;
mod format;
mod queue;
mod recovery;
mod sink;
mod writer;

pub use files::{mark_sealing, write_segment, DataSync, JournalSetup};
pub(crate) use format::{create_dir, io_err, OpensLine, INSTANCE, OPENS};
pub use format::{
    first_conn, generation_dir, JournalError, Segment, HANDOFF_GROUP, HANDOFF_SYNC, JOURNAL_DIR,
    OPENS_COMPACT_AT, OPENS_SYNC, RECORD_QUEUE,
};
pub use recovery::{recover, recover_all, Recovered};
pub use sink::{RecordSink, Written};
pub use writer::{start, WriterConfig, WriterThread};

#[cfg(test)]
mod tests;
