//! The registered gateways: the keys their drop reports and batches are
//! checked under.

use serde::Serialize;

use super::db::{now, Store, Tx};
use super::value::{params, OptionalExtension};
use crate::error::Error;
use crate::names;

/// A registered gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GatewayInfo {
    pub id: String,
    pub public_key_hex: String,
    pub registered_at: String,
    /// The gateway process last seen (`Describe`, a reply, a start report).
    pub instance: Option<String>,
    /// The lease that process gives, in milliseconds.
    pub lease_ms: Option<u64>,
    /// When the control stub last reached it, and what the last failed
    /// call met (cleared by the next success).
    pub last_contact_at: Option<String>,
    pub last_error: Option<String>,
    /// The last batch of its chain accepted (0 before the first), and its
    /// digest, which the next batch must link to: what `gateway spool
    /// set-aside --prev-digest` is given when the gateway's spool does not
    /// know it (docs/runbook.md, "A spool blocked by a bad batch").
    pub chain_last_seq: u64,
    pub chain_last_digest: Option<String>,
}

/// A start report, as received in a gateway's batch chain and checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StartRecord {
    pub gateway_id: String,
    pub instance: String,
    pub started_at: String,
    pub previous_instance: String,
    pub cut_by_crash: u64,
    pub key_id: String,
    /// The batch that carried it.
    pub batch_seq: u64,
    pub received_at: String,
    /// SHA-384 of the signed envelope (JSON), naming the report.
    pub report_digest: String,
}

/// A registered public key (hex) as an Ed25519 key, if it is one.
pub fn ed25519_key(hex_key: &str) -> Option<[u8; 32]> {
    hex::decode(hex_key).ok()?.try_into().ok()
}

impl Store {
    /// Register gateway `id` with its public key (hex). Registering the
    /// same key again changes nothing; another key is refused.
    pub fn register_gateway(&mut self, id: &str, public_key_hex: &str) -> Result<(), Error> {
        let id = names::gateway_id(id)?;
        if public_key_hex.is_empty()
            || !public_key_hex.len().is_multiple_of(2)
            || !public_key_hex.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(Error::NameInvalid {
                what: "public key",
                got: public_key_hex.chars().take(300).collect(),
                reason: "a public key is given as an even number of hex digits".into(),
            });
        }
        let key = public_key_hex.to_ascii_lowercase();
        // Known with this key (every renewal round but a member's first):
        // nothing to write, so the write lock is not waited for.
        if self.read(|tx| tx.gateway_key(&id))?.as_deref() == Some(key.as_str()) {
            return Ok(());
        }
        self.write(|tx| {
            match tx.gateway_key(&id)? {
                Some(k) if k == key => {}
                Some(_) => return Err(Error::GatewayKeyConflict { gateway_id: id }),
                None => {
                    tx.conn.execute(
                        "INSERT INTO gateways (id, public_key_hex, registered_at) VALUES (?1, ?2, ?3)",
                        params![id, key, now()],
                    )?;
                }
            }
            Ok(())
        })
    }

    /// Every registered gateway.
    pub fn gateways(&self) -> Result<Vec<GatewayInfo>, Error> {
        self.read(|tx| tx.gateway_list())
    }
}

impl Tx<'_> {
    /// Every registered gateway.
    pub fn gateway_list(&self) -> Result<Vec<GatewayInfo>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT g.id, g.public_key_hex, g.registered_at, g.instance, g.lease_ms,
                    g.last_contact_at, g.last_error, c.json
             FROM gateways g LEFT JOIN chain_state c ON c.gateway_id = g.id
             ORDER BY g.id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                GatewayInfo {
                    id: r.get(0)?,
                    public_key_hex: r.get(1)?,
                    registered_at: r.get(2)?,
                    instance: r.get(3)?,
                    lease_ms: r
                        .get::<_, Option<i64>>(4)?
                        .and_then(|n| u64::try_from(n).ok()),
                    last_contact_at: r.get(5)?,
                    last_error: r.get(6)?,
                    chain_last_seq: 0,
                    chain_last_digest: None,
                },
                r.get::<_, Option<String>>(7)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (mut info, chain) = row?;
            if let Some(json) = chain {
                let state: talos_certs::ChainState = serde_json::from_str(&json)?;
                info.chain_last_seq = state.last_seq();
                info.chain_last_digest =
                    (state.last_seq() > 0).then(|| state.last_digest().to_owned());
            }
            out.push(info);
        }
        Ok(out)
    }

    /// Gateway `id` answered at `at`: the process it runs now, the lease it
    /// gives.
    pub fn gateway_seen(
        &self,
        id: &str,
        instance: &str,
        lease_ms: u64,
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE gateways SET instance = ?2, lease_ms = ?3, last_contact_at = ?4,
                                 last_error = NULL
             WHERE id = ?1",
            params![
                id,
                instance,
                i64::try_from(lease_ms).unwrap_or(i64::MAX),
                at
            ],
        )?;
        Ok(())
    }

    /// Gateway `id` spoke as process `instance` (in a signed report).
    pub fn gateway_seen_instance(&self, id: &str, instance: &str) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE gateways SET instance = ?2, last_contact_at = ?3, last_error = NULL
             WHERE id = ?1",
            params![id, instance, now()],
        )?;
        Ok(())
    }

    /// A call to gateway `id` failed with `error`.
    pub fn gateway_unreached(&self, id: &str, error: &str) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE gateways SET last_error = ?2 WHERE id = ?1",
            params![id, error],
        )?;
        Ok(())
    }

    /// Record a checked start report. Returns `false` if it was recorded
    /// before.
    pub fn insert_start_report(&self, r: &StartRecord, signed: &[u8]) -> Result<bool, Error> {
        let n = self.conn.execute(
            "INSERT INTO start_reports (gateway_id, instance, started_at,
                 previous_instance, cut_by_crash, key_id, batch_seq, signed, received_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT DO NOTHING",
            params![
                r.gateway_id,
                r.instance,
                r.started_at,
                r.previous_instance,
                i64::try_from(r.cut_by_crash).unwrap_or(i64::MAX),
                r.key_id,
                i64::try_from(r.batch_seq).unwrap_or(i64::MAX),
                signed,
                r.received_at,
            ],
        )?;
        Ok(n > 0)
    }

    /// Every start report of gateway `id`, oldest first.
    pub fn start_reports(&self, id: &str) -> Result<Vec<StartRecord>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT gateway_id, instance, started_at, previous_instance, cut_by_crash, key_id,
                    batch_seq, received_at, signed
             FROM start_reports WHERE gateway_id = ?1 ORDER BY batch_seq",
        )?;
        let rows = stmt.query_map(params![id], |r| {
            Ok(StartRecord {
                gateway_id: r.get(0)?,
                instance: r.get(1)?,
                started_at: r.get(2)?,
                previous_instance: r.get(3)?,
                cut_by_crash: u64::try_from(r.get::<_, i64>(4)?).unwrap_or(0),
                key_id: r.get(5)?,
                batch_seq: u64::try_from(r.get::<_, i64>(6)?).unwrap_or(0),
                received_at: r.get(7)?,
                report_digest: talos_certs::sha384_hex(&r.get::<_, Vec<u8>>(8)?),
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// The registered public key (hex) of gateway `id`.
    pub fn gateway_key(&self, id: &str) -> Result<Option<String>, Error> {
        self.conn
            .query_row(
                "SELECT public_key_hex FROM gateways WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()
    }
}
