//! What the journal's parts share: its bounds and timings, its files'
//! names and generations, the lines of `opens.log`, a segment handed to
//! the sealer, and its error (the module docs of [`super`] say what each
//! is for).

use std::path::{Path, PathBuf};
use std::time::Duration;

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
