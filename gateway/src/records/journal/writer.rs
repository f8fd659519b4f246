//! The journal's writer: one thread, the only writer of the record file
//! and the journal's files.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::files::{JournalFiles, JournalSetup};
use super::queue::{Ack, Msg, Queued};
use super::sink::RecordSink;
use super::{io_err, JournalError, OPENS_SYNC};

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

/// The writer thread, running: joined at the drain once every sink is gone.
#[derive(Debug)]
pub struct WriterThread {
    done: oneshot::Receiver<()>,
    /// Asks the writer to stop, after everything sent before.
    sink: RecordSink,
}

impl WriterThread {
    /// Stop the writer: everything sent before is written, the last
    /// segment handed to the sealer; resolves once the thread has ended.
    /// An entry sent after this is refused and logged as lost. The drain
    /// calls it once every connection has its record and every authority
    /// its report, whatever holds a [`RecordSink`] still.
    pub async fn stop(self) {
        self.sink.stop_writer().await;
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
        round: Round::default(),
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
    let sink = RecordSink::new(
        tx,
        config.first_conn,
        config.gateway_id,
        config.instance,
        has_journal,
    );
    Ok((sink.clone(), WriterThread { done, sink }))
}

/// The writer thread's state.
struct Writer {
    rx: std_mpsc::Receiver<Queued>,
    records: File,
    records_path: PathBuf,
    journal: Option<JournalFiles>,
    /// What one round writes, gathered first.
    round: Round,
}

/// The most entries one round of the writer takes before it writes.
const ROUND: usize = 1024;

/// What one round of the writer gathers before it writes: the bytes for
/// each file and the acknowledgements owed once they are written (or
/// synced).
#[derive(Default)]
struct Round {
    records: Vec<u8>,
    segment: Vec<u8>,
    opens: Vec<u8>,
    written: Vec<oneshot::Sender<()>>,
    synced: Vec<oneshot::Sender<()>>,
    /// Something asked for the segment to be sealed now.
    seal: bool,
    /// The drain asked the writer to stop after this round.
    stop: bool,
}

impl Writer {
    fn run(mut self) {
        // Wait for work, or for the segment's interval to run out; stop
        // once every sink is gone.
        while let Some(first) = self.next() {
            let Some(first) = first else {
                // A segment's interval, or hand-off records' wait for a
                // sync, ran out.
                if let Some(j) = self.journal.as_mut() {
                    j.act_due(Instant::now());
                }
                continue;
            };
            let mut taken = 1;
            self.take(first);
            // A round ends where its hand-off records make a group: those
            // written and not yet synced never pass `HANDOFF_GROUP`.
            while taken < ROUND
                && !self.round.stop
                && !self
                    .journal
                    .as_ref()
                    .is_some_and(JournalFiles::handoffs_full)
            {
                match self.rx.try_recv() {
                    Ok(q) => self.take(q),
                    Err(_) => break,
                }
                taken += 1;
            }
            self.write_round();
            if self.round.stop {
                // Anything sent after the stop is not written: say so.
                let lost = self.rx.try_iter().count();
                if lost > 0 {
                    tracing::error!(lost, "entries came after the record writer was stopped; they are not on the record");
                }
                break;
            }
        }
        // Stopped (or every sink is gone): hand over the last segment.
        if let Some(j) = self.journal.as_mut() {
            j.rotate();
            j.sync_opens(Duration::ZERO);
        }
        let _ = self.records.flush();
    }

    /// The next entry (`Some(None)`: the segment's interval, or hand-off
    /// records' wait for a sync, ran out), or `None` once every sink is
    /// gone.
    fn next(&mut self) -> Option<Option<Queued>> {
        match self.journal.as_ref().and_then(JournalFiles::due) {
            Some(due) => {
                let wait = due.saturating_duration_since(Instant::now());
                match self.rx.recv_timeout(wait) {
                    Ok(q) => Some(Some(q)),
                    Err(std_mpsc::RecvTimeoutError::Timeout) => Some(None),
                    Err(std_mpsc::RecvTimeoutError::Disconnected) => None,
                }
            }
            None => {
                // Nothing due: sync what openings wait, then block.
                if let Some(j) = self.journal.as_mut() {
                    j.sync_opens(Duration::ZERO);
                }
                self.rx.recv().ok().map(Some)
            }
        }
    }

    /// Add one entry to the round.
    fn take(&mut self, q: Queued) {
        let round = &mut self.round;
        match q.msg {
            Msg::Opening { line, opened, ack } => {
                if let Some(j) = self.journal.as_mut() {
                    if let Some(conn) = opened {
                        j.opened(conn);
                    }
                    round.opens.extend_from_slice(&line);
                }
                round.written.extend(ack);
            }
            Msg::Record { conn, json, ack } => {
                round.records.extend_from_slice(&json);
                round.records.push(b'\n');
                let handoff = matches!(ack, Ack::Grouped);
                match self.journal.as_mut() {
                    Some(j) => {
                        j.push_entry(json, &mut round.segment, handoff);
                        if let Some(conn) = conn {
                            j.recorded(conn, &mut round.opens);
                        }
                        if let Ack::Synced(ack) = ack {
                            round.synced.push(ack);
                        }
                    }
                    None => {
                        if let Ack::Synced(ack) = ack {
                            round.written.push(ack);
                        }
                    }
                }
            }
            Msg::Entry { json, ack } => {
                if let Some(j) = self.journal.as_mut() {
                    j.push_entry(json, &mut round.segment, false);
                }
                round.synced.push(ack);
            }
            Msg::Seal { ack } => {
                round.seal = true;
                round.written.push(ack);
            }
            Msg::Stop => round.stop = true,
        }
    }

    /// Write what the round gathered, acknowledge it, then rotate and
    /// compact as due.
    fn write_round(&mut self) {
        let round = &mut self.round;
        // Records before the lines that say they are closed. The segment
        // is synced when a record or report of the round waits for it, or
        // its hand-off records are due (a group, or the oldest's wait).
        if let Some(j) = self.journal.as_mut() {
            let sync = !round.synced.is_empty() || j.handoffs_due(Instant::now());
            j.write_entries(&mut round.segment, sync);
            j.write_opens(&round.opens);
        }
        round.segment.clear();
        round.opens.clear();
        if !round.records.is_empty() {
            if let Err(e) = self.records.write_all(&round.records) {
                tracing::error!(path = %self.records_path.display(), error = %e, "cannot write records");
            }
            round.records.clear();
        }
        for ack in round.written.drain(..).chain(round.synced.drain(..)) {
            let _ = ack.send(());
        }
        let seal = std::mem::take(&mut round.seal);
        if let Some(j) = self.journal.as_mut() {
            j.sync_opens(OPENS_SYNC);
            if seal || j.full() || j.segment_due().is_some_and(|d| d <= Instant::now()) {
                j.rotate();
            }
            j.compact_opens();
        }
    }
}
