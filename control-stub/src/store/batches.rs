//! The batch consumer's tables: the batches received, their connection
//! records, the refused batches and each gateway's chain position.

use serde::Serialize;

use super::db::{now, Store, Tx};
use super::value::{json_col, params, OptionalExtension, Row};
use crate::error::Error;
use crate::names;

/// Whether [`Store::record_batch`] recorded the batch or had it already.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchOutcome {
    Recorded,
    AlreadyRecorded,
}

/// A connection record from a batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConnectionRecord {
    pub gateway_id: String,
    pub seq: u64,
    pub idx: u32,
    pub record: serde_json::Value,
}

/// A batch a session's records came in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BatchInfo {
    pub gateway_id: String,
    pub seq: u64,
    pub digest: String,
    pub received_at: String,
}

/// A registered gateway and where the batch consumer stands in its chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainPosition {
    pub gateway_id: String,
    pub public_key_hex: String,
    /// `None`: no batch of this gateway accepted yet.
    pub state: Option<talos_certs::ChainState>,
}

/// A refused batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BatchRejection {
    pub gateway_id: String,
    pub seq: u64,
    pub reason: String,
    pub at: String,
    /// Whether a batch with that number was accepted afterwards (the
    /// gateway sent it again once the cause was gone: a key registered, a
    /// predecessor arrived).
    pub resolved: bool,
}

impl Store {
    /// Record a verified batch: its digest and its connection records.
    ///
    /// The caller has checked the batch's signature, sequence and chain.
    /// Idempotent per `(gateway_id, seq)`: the same batch again returns
    /// [`BatchOutcome::AlreadyRecorded`] and changes nothing; another digest
    /// under a recorded sequence number is `batch_conflict`. Each record's
    /// `session_id` field files it under its session (records without one,
    /// such as `unknown_source`, are kept under none).
    pub fn record_batch(
        &mut self,
        gateway_id: &str,
        seq: u64,
        digest: &str,
        records: &[serde_json::Value],
    ) -> Result<BatchOutcome, Error> {
        let gateway_id = names::gateway_id(gateway_id)?;
        self.write(|tx| tx.insert_batch(&gateway_id, seq, digest, records))
    }

    /// Record that the batch consumer refused batch `seq` of `gateway_id`
    /// (bad signature, a gap or repeat in the sequence, a broken chain).
    pub fn record_rejection(
        &mut self,
        gateway_id: &str,
        seq: u64,
        reason: &str,
        sessions: &[String],
    ) -> Result<(), Error> {
        // Out of SQLite's range, the number is refused here, not saturated.
        seq_to_sql(seq)?;
        // The id is what the refused batch claimed: kept as given, bounded.
        let gateway_id: String = gateway_id.chars().take(names::MAX_GATEWAY_ID_LEN).collect();
        self.write(|tx| tx.insert_rejection(&gateway_id, seq, reason, sessions))
    }
}

impl Tx<'_> {
    /// Record a verified batch (see [`Store::record_batch`]).
    pub fn insert_batch(
        &self,
        gateway_id: &str,
        seq: u64,
        digest: &str,
        records: &[serde_json::Value],
    ) -> Result<BatchOutcome, Error> {
        let seq_sql = seq_to_sql(seq)?;
        let recorded: Option<String> = self
            .conn
            .query_row(
                "SELECT digest FROM batches WHERE gateway_id = ?1 AND seq = ?2",
                params![gateway_id, seq_sql],
                |r| r.get(0),
            )
            .optional()?;
        match recorded {
            Some(d) if d == digest => return Ok(BatchOutcome::AlreadyRecorded),
            Some(d) => {
                return Err(Error::BatchConflict {
                    gateway_id: gateway_id.to_owned(),
                    seq,
                    recorded: d,
                })
            }
            None => {}
        }
        self.conn.execute(
            "INSERT INTO batches (gateway_id, seq, digest, received_at) VALUES (?1, ?2, ?3, ?4)",
            params![gateway_id, seq_sql, digest, now()],
        )?;
        let mut stmt = self.conn.prepare(
            "INSERT INTO connection_records (gateway_id, seq, idx, session_id, json, instance,
                                             conn, superseded)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        for (idx, record) in records.iter().enumerate() {
            let session_id = record.get("session_id").and_then(|v| v.as_str());
            let instance = record.get("instance").and_then(|v| v.as_str());
            let conn = record
                .get("conn")
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| i64::try_from(n).ok());
            let superseded = match (instance, conn) {
                (Some(i), Some(c)) => self.supersede(gateway_id, i, c, record)?,
                _ => false,
            };
            let idx = i64::try_from(idx).map_err(|_| Error::Store("batch too long".into()))?;
            stmt.execute(params![
                gateway_id,
                seq_sql,
                idx,
                session_id,
                serde_json::to_string(record)?,
                instance,
                conn,
                superseded,
            ])?;
        }
        Ok(BatchOutcome::Recorded)
    }

    /// A record names its connection by gateway process and number; one
    /// connection may come twice (a segment sealed again after a crash),
    /// or first as cut by a crash and then whole. Keep one: the whole
    /// record over one cut by the crash, else the first. Returns whether
    /// `record` is the one set aside.
    fn supersede(
        &self,
        gateway_id: &str,
        instance: &str,
        conn: i64,
        record: &serde_json::Value,
    ) -> Result<bool, Error> {
        let kept: Option<(i64, String)> = self
            .conn
            .query_row(
                "SELECT rowid, json FROM connection_records
                 WHERE gateway_id = ?1 AND instance = ?2 AND conn = ?3 AND superseded = 0",
                params![gateway_id, instance, conn],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((rowid, kept)) = kept else {
            return Ok(false);
        };
        let cut =
            |v: &serde_json::Value| v.get("cause").and_then(|c| c.as_str()) == Some("cut_by_crash");
        let kept: serde_json::Value = serde_json::from_str(&kept)?;
        if cut(&kept) && !cut(record) {
            self.conn.execute(
                "UPDATE connection_records SET superseded = 1 WHERE rowid = ?1",
                params![rowid],
            )?;
            Ok(false)
        } else {
            Ok(true)
        }
    }

    /// The last batch of `gateway_id` accepted, 0 before the first.
    pub fn chain_seq(&self, gateway_id: &str) -> Result<u64, Error> {
        let n: Option<i64> = self.conn.query_row(
            "SELECT max(seq) FROM batches WHERE gateway_id = ?1",
            params![gateway_id],
            |r| r.get(0),
        )?;
        Ok(n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
    }

    /// Every registered gateway with its public key (hex) and the batch
    /// consumer's position in its chain (`None`: no batch accepted yet).
    pub fn chain_positions(&self) -> Result<Vec<ChainPosition>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT g.id, g.public_key_hex, c.json FROM gateways g
             LEFT JOIN chain_state c ON c.gateway_id = g.id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (gateway_id, public_key_hex, state) = row?;
            out.push(ChainPosition {
                gateway_id,
                public_key_hex,
                state: state.map(|json| serde_json::from_str(&json)).transpose()?,
            });
        }
        Ok(out)
    }

    /// Set the batch consumer's position in `gateway_id`'s chain.
    pub fn set_chain_state(
        &self,
        gateway_id: &str,
        state: &talos_certs::ChainState,
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO chain_state (gateway_id, json) VALUES (?1, ?2)
             ON CONFLICT (gateway_id) DO UPDATE SET json = excluded.json",
            params![gateway_id, serde_json::to_string(state)?],
        )?;
        Ok(())
    }

    /// Record that batch `seq` of `gateway_id` was refused for `reason`; a
    /// sequence number beyond SQLite's range is recorded as its largest.
    /// `sessions` are the sessions the batch's records claim to be of
    /// (unverified: the batch was refused), so the rejection is shown on
    /// their certificates.
    pub fn insert_rejection(
        &self,
        gateway_id: &str,
        seq: u64,
        reason: &str,
        sessions: &[String],
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO batch_rejections (gateway_id, seq, reason, at, sessions)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                gateway_id,
                seq_to_sql(seq).unwrap_or(i64::MAX),
                reason,
                now(),
                serde_json::to_string(sessions)?
            ],
        )?;
        Ok(())
    }

    /// Every connection record naming the session, by gateway, batch and
    /// position.
    pub fn connection_records(&self, session_id: &str) -> Result<Vec<ConnectionRecord>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT gateway_id, seq, idx, json FROM connection_records
             WHERE session_id = ?1 AND superseded = 0 ORDER BY gateway_id, seq, idx",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(ConnectionRecord {
                gateway_id: r.get(0)?,
                seq: get_u64(r, 1)?,
                idx: r.get(2)?,
                record: json_col(3, r.get(3)?)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// The batches that carried records of the session.
    pub fn batches_of(&self, session_id: &str) -> Result<Vec<BatchInfo>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT gateway_id, seq, digest, received_at FROM batches b
             WHERE EXISTS (SELECT 1 FROM connection_records c
                           WHERE c.gateway_id = b.gateway_id AND c.seq = b.seq
                             AND c.session_id = ?1)
             ORDER BY gateway_id, seq",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(BatchInfo {
                gateway_id: r.get(0)?,
                seq: get_u64(r, 1)?,
                digest: r.get(2)?,
                received_at: r.get(3)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Every refused batch that claimed to hold records of the session.
    pub fn batch_rejections(&self, session_id: &str) -> Result<Vec<BatchRejection>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT r.gateway_id, r.seq, r.reason, r.at,
                    EXISTS (SELECT 1 FROM batches b
                            WHERE b.gateway_id = r.gateway_id AND b.seq = r.seq)
             FROM batch_rejections r
             WHERE {}
             ORDER BY r.rowid",
            self.conn.dialect().json_array_contains("r.sessions", "?1")
        ))?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(BatchRejection {
                gateway_id: r.get(0)?,
                seq: get_u64(r, 1)?,
                reason: r.get(2)?,
                at: r.get(3)?,
                resolved: r.get(4)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// How many batches of each gateway were refused and never accepted
    /// since (for the metrics).
    pub fn rejections_by_gateway(&self) -> Result<Vec<(String, String, u64)>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT gateway_id, reason, count(*) FROM batch_rejections GROUP BY gateway_id, reason",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, get_u64(r, 2)?)))?;
        rows.collect::<Result<Vec<_>, _>>()
    }
}

fn seq_to_sql(seq: u64) -> Result<i64, Error> {
    i64::try_from(seq).map_err(|_| Error::Store(format!("sequence number {seq} is out of range")))
}

/// A non-negative integer column (SQLite stores signed 64-bit integers).
fn get_u64(r: &Row, idx: usize) -> Result<u64, Error> {
    r.get(idx)
}

/// A batch a gateway's operator set aside (`gateway spool set-aside`): its
/// records may be lost; it stands in the chain as a signed gap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ChainGap {
    #[serde(default)]
    pub gateway_id: String,
    pub seq: u64,
    /// What was wrong: `missing`, `unreadable`, `bad_signature`,
    /// `wrong_seq`, `broken_link`.
    pub found: String,
    /// The operator's words.
    pub reason: String,
    /// The digest the batch should have had, when its successor said.
    pub expected_digest: Option<String>,
    /// The time the lost records may fall in: after the batch before it
    /// (when known), before the one after it.
    pub window_after: Option<String>,
    pub window_before: String,
    pub set_aside_file: Option<String>,
    pub set_aside_at: String,
    #[serde(default)]
    pub received_at: String,
}

impl Tx<'_> {
    /// Record a gap from `gateway_id`'s chain; a window with no start is
    /// given the time the batch before it was received here.
    pub fn insert_gap(&self, gap: &ChainGap) -> Result<(), Error> {
        let after = match &gap.window_after {
            Some(a) => Some(a.clone()),
            None => self
                .conn
                .query_row(
                    "SELECT received_at FROM batches WHERE gateway_id = ?1 AND seq = ?2",
                    params![gap.gateway_id, seq_to_sql(gap.seq.saturating_sub(1))?],
                    |r| r.get(0),
                )
                .optional()?,
        };
        self.conn.execute(
            "INSERT INTO chain_gaps (gateway_id, seq, found, reason, expected_digest,
                 window_after, window_before, set_aside_file, set_aside_at, received_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING",
            params![
                gap.gateway_id,
                seq_to_sql(gap.seq)?,
                gap.found,
                gap.reason,
                gap.expected_digest,
                after,
                gap.window_before,
                gap.set_aside_file,
                gap.set_aside_at,
                now(),
            ],
        )?;
        Ok(())
    }

    /// Every gap that touches session `id`: in the chain of a gateway that
    /// held an authority of the session at some time in the gap's window.
    pub fn gaps_touching(&self, id: &str) -> Result<Vec<ChainGap>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT g.gateway_id, g.seq, g.found, g.reason, g.expected_digest, g.window_after,
                    g.window_before, g.set_aside_file, g.set_aside_at, g.received_at
             FROM chain_gaps g
             WHERE EXISTS (SELECT 1 FROM ca_events c
                           WHERE c.session_id = ?1 AND c.gateway_id = g.gateway_id
                             AND c.made_at <= g.window_before
                             AND (g.window_after IS NULL OR c.destroyed_at IS NULL
                                  OR c.destroyed_at >= g.window_after))
             ORDER BY g.gateway_id, g.seq",
        )?;
        let rows = stmt.query_map(params![id], |r| {
            Ok(ChainGap {
                gateway_id: r.get(0)?,
                seq: get_u64(r, 1)?,
                found: r.get(2)?,
                reason: r.get(3)?,
                expected_digest: r.get(4)?,
                window_after: r.get(5)?,
                window_before: r.get(6)?,
                set_aside_file: r.get(7)?,
                set_aside_at: r.get(8)?,
                received_at: r.get(9)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }
}
