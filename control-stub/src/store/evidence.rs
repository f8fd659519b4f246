//! The evidence a certificate bundle carries exactly as it was signed
//! (`crate::bundle`): each accepted batch's signed envelope, each gateway
//! signing key's binding under the control CA, and the look-ups a bundle
//! is assembled with (the reports and decisions the other tables keep as
//! signed).

use super::value::{params, OptionalExtension};

use super::db::{now, Store, Tx};
use crate::error::Error;

/// A signed report as the store keeps it: the envelope's JSON bytes
/// (talos-certs `Signed`), and how it came.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredReport {
    /// `reply` (a close's answer) or `chain` (an entry of batch
    /// `batch_seq` of `gateway_id`'s chain).
    pub via: String,
    pub gateway_id: String,
    pub batch_seq: Option<u64>,
    /// The envelope's JSON, as received.
    pub signed: Vec<u8>,
}

impl Store {
    /// Keep `binding` (talos-certs `KeyBinding`, JSON) for gateway
    /// `gateway_id`'s key `public_key_hex`, unless one is kept already.
    /// Only reads when it is (every renewal round but a member's first),
    /// and writes only if the write lock is free now: a renewal round waits
    /// for no writer, and the next round keeps it if this one could not.
    pub fn keep_key_binding(
        &mut self,
        gateway_id: &str,
        public_key_hex: &str,
        binding: &[u8],
    ) -> Result<(), Error> {
        if binding.is_empty() {
            return Ok(());
        }
        let key = public_key_hex.to_ascii_lowercase();
        if self.read(|tx| tx.key_binding(gateway_id, &key))?.is_some() {
            return Ok(());
        }
        self.try_write(|tx| {
            tx.conn.execute(
                "INSERT INTO key_bindings (gateway_id, public_key_hex, binding, received_at)
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                params![gateway_id, key, binding, now()],
            )?;
            Ok(())
        })
        .map(|_| ())
    }
}

impl Tx<'_> {
    /// Keep batch `seq` of `gateway_id` as it was signed, beside its
    /// records (the batch consumer's transaction that accepted it).
    pub fn insert_signed_batch(
        &self,
        gateway_id: &str,
        seq: u64,
        signed: &talos_certs::Signed,
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO signed_batches (gateway_id, seq, key_id, payload, signature)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
            params![
                gateway_id,
                seq_sql(seq)?,
                signed.key_id,
                signed.payload,
                signed.signature
            ],
        )?;
        Ok(())
    }

    /// The signed batches `from..=to` of `gateway_id`, in order: each as
    /// kept, or `None` for a number accepted before signed batches were
    /// kept (or never accepted).
    pub fn signed_batches(
        &self,
        gateway_id: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, Option<talos_certs::Signed>)>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT seq, key_id, payload, signature FROM signed_batches
             WHERE gateway_id = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq",
        )?;
        let rows = stmt.query_map(params![gateway_id, seq_sql(from)?, seq_sql(to)?], |r| {
            Ok((
                r.get::<_, u64>(0)?,
                talos_certs::Signed {
                    kind: talos_certs::Kind::Batch,
                    key_id: r.get(1)?,
                    payload: r.get(2)?,
                    signature: r.get(3)?,
                },
            ))
        })?;
        let mut kept = rows.collect::<Result<Vec<_>, _>>()?.into_iter().peekable();
        let mut out = Vec::new();
        for seq in from..=to {
            match kept.next_if(|(s, _)| *s == seq) {
                Some((_, signed)) => out.push((seq, Some(signed))),
                None => out.push((seq, None)),
            }
        }
        Ok(out)
    }

    /// The binding kept for gateway `gateway_id`'s key `public_key_hex`.
    pub fn key_binding(
        &self,
        gateway_id: &str,
        public_key_hex: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.conn
            .query_row(
                "SELECT binding FROM key_bindings WHERE gateway_id = ?1 AND public_key_hex = ?2",
                params![gateway_id, public_key_hex],
                |r| r.get(0),
            )
            .optional()
    }

    /// Every drop report received for session `id`, as signed, in order of
    /// receipt.
    pub fn drop_report_envelopes(&self, id: &str) -> Result<Vec<StoredReport>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT via, gateway_id, batch_seq, signed FROM drop_reports
             WHERE session_id = ?1 ORDER BY rowid",
        )?;
        let rows = stmt.query_map(params![id], |r| {
            Ok(StoredReport {
                via: r.get(0)?,
                gateway_id: r.get(1)?,
                batch_seq: r
                    .get::<_, Option<i64>>(2)?
                    .and_then(|n| u64::try_from(n).ok()),
                signed: r.get(3)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Every start report of `gateway_id`, as signed: the batch that
    /// carried it and the envelope's JSON.
    pub fn start_report_envelopes(&self, gateway_id: &str) -> Result<Vec<StoredReport>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT batch_seq, signed FROM start_reports WHERE gateway_id = ?1 ORDER BY batch_seq",
        )?;
        let rows = stmt.query_map(params![gateway_id], |r| {
            Ok(StoredReport {
                via: "chain".into(),
                gateway_id: gateway_id.to_owned(),
                batch_seq: u64::try_from(r.get::<_, i64>(0)?).ok(),
                signed: r.get(1)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }
}

fn seq_sql(seq: u64) -> Result<i64, Error> {
    i64::try_from(seq).map_err(|_| Error::Store(format!("sequence number {seq} is out of range")))
}
