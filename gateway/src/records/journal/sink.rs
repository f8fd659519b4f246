//! Where connections send their openings, records and reports.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};

use tokio::sync::{oneshot, Semaphore};

use super::queue::{Ack, Msg, Queued};
use super::{OpensLine, RECORD_QUEUE};
use crate::records::record::{now, Record};

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
    /// The sink of a writer just started: `tx` reaches it.
    pub(super) fn new(
        tx: std_mpsc::Sender<Queued>,
        first_conn: u64,
        gateway_id: Arc<str>,
        instance: Arc<str>,
        journal: bool,
    ) -> RecordSink {
        RecordSink {
            inner: Arc::new(SinkInner {
                tx,
                room: Arc::new(Semaphore::new(RECORD_QUEUE)),
                next_conn: AtomicU64::new(first_conn.max(1)),
                gateway_id,
                instance,
                journal,
            }),
        }
    }

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
            self.send_opening(&line, Some(conn), None).await;
        }
        record
    }

    /// The gate let `record`'s connection through: its session and name go
    /// to the journal. Wait on the result before the connection's first
    /// request is read.
    pub async fn let_through(&self, record: &Record) -> Written {
        if !self.inner.journal {
            return Written(None);
        }
        let line = OpensLine::Gate {
            conn: record.conn,
            session_id: record.session_id.as_deref().unwrap_or("").to_owned(),
            attempt: record.attempt.unwrap_or(0),
            tenant: record.tenant.as_deref().unwrap_or("").to_owned(),
            sni: record.sni.clone().unwrap_or_default(),
            via: record.via.as_deref().map(str::to_owned),
            forwarded_to: record.forwarded_to.as_deref().map(str::to_owned),
            passthrough: record.passthrough,
        };
        let (ack, rx) = oneshot::channel();
        self.send_opening(&line, None, Some(ack)).await;
        Written(Some(rx))
    }

    /// `opened`: the connection the line opens, if it is its first.
    async fn send_opening(
        &self,
        line: &OpensLine,
        opened: Option<u64>,
        ack: Option<oneshot::Sender<()>>,
    ) {
        let Ok(mut bytes) = serde_json::to_vec(line) else {
            return;
        };
        bytes.push(b'\n');
        self.send(Msg::Opening {
            line: bytes,
            opened,
            ack,
        })
        .await;
    }

    /// Close a record: stamp its end and write it. Returns once it is on
    /// disk (synced), or at once if the writer has stopped (logged).
    ///
    /// A forwarder's hand-off record (`forwarded_to`: the holder's record
    /// of the connection is the one counted) is handed to the writer and
    /// not waited for: it is written with the next round and synced in a
    /// group ([`super::HANDOFF_GROUP`], [`super::HANDOFF_SYNC`]). Only room
    /// in the writer's queue is waited for, as for every entry.
    pub async fn close(&self, mut record: Record) {
        record.closed_at = now();
        metrics::counter!("gateway_connections_total", "verdict" => record.verdict.as_str())
            .increment(1);
        // A Record is plain data: serialising it cannot fail.
        let Ok(json) = serde_json::to_vec(&record) else {
            return;
        };
        let conn = Some(record.conn);
        if record.forwarded_to.is_some() {
            self.send(Msg::Record {
                conn,
                json,
                ack: Ack::Grouped,
            })
            .await;
            return;
        }
        let (ack, rx) = oneshot::channel();
        if self
            .send(Msg::Record {
                conn,
                json,
                ack: Ack::Synced(ack),
            })
            .await
        {
            let _ = rx.await;
        }
    }

    /// Put a record that is no connection's (a session's DNS counts) on
    /// the record: the record file and the batches, as a connection's
    /// record goes. Returns once it is on disk.
    pub async fn note(&self, json: Vec<u8>) {
        let (ack, rx) = oneshot::channel();
        if self
            .send(Msg::Record {
                conn: None,
                json,
                ack: Ack::Synced(ack),
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

    /// Ask the writer to stop once it has written everything sent before.
    pub(super) async fn stop_writer(&self) {
        self.send(Msg::Stop).await;
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
