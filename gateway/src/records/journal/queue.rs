//! What the record sinks hand the writer, one message at a time through a
//! bounded queue, and what each sender waits for.

use tokio::sync::{oneshot, OwnedSemaphorePermit};

/// What the writer is asked to do.
pub(super) enum Msg {
    /// A line for `opens.log`, the first of connection `opened` if
    /// given; `ack` (if any) once written.
    Opening {
        line: Vec<u8>,
        opened: Option<u64>,
        ack: Option<oneshot::Sender<()>>,
    },
    /// A record: the record file, the segment, `opens.log` (a
    /// connection's, `conn`); acknowledged once synced, or, a forwarder's
    /// hand-off record, not at all (synced with a group).
    Record {
        conn: Option<u64>,
        json: Vec<u8>,
        ack: Ack,
    },
    /// A report (or another chain entry): the segment; `ack` once synced.
    Entry {
        json: Vec<u8>,
        ack: oneshot::Sender<()>,
    },
    /// Hand the segment to the sealer now; `ack` once handed.
    Seal { ack: oneshot::Sender<()> },
    /// Write what came before, hand the last segment to the sealer and
    /// stop (the drain, once nothing is left to record).
    Stop,
}

/// What a record's sender waits for.
pub(super) enum Ack {
    /// Its sync: told once the record is on disk.
    Synced(oneshot::Sender<()>),
    /// Nothing: a forwarder's hand-off record, synced with a group of
    /// them (see the module docs of [`crate::records::journal`]).
    Grouped,
}

pub(super) struct Queued {
    pub(super) msg: Msg,
    pub(super) _permit: OwnedSemaphorePermit,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Queued")
    }
}
