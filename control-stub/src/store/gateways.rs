//! The registered gateways: the keys their drop reports and batches are
//! checked under.

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use super::db::{now, Store, Tx};
use crate::error::Error;
use crate::names;

/// A registered gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GatewayInfo {
    pub id: String,
    pub public_key_hex: String,
    pub registered_at: String,
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
        self.read(|tx| {
            let mut stmt = tx
                .conn
                .prepare("SELECT id, public_key_hex, registered_at FROM gateways ORDER BY id")?;
            let rows = stmt.query_map([], |r| {
                Ok(GatewayInfo {
                    id: r.get(0)?,
                    public_key_hex: r.get(1)?,
                    registered_at: r.get(2)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }
}

impl Tx<'_> {
    /// The registered public key (hex) of gateway `id`.
    pub fn gateway_key(&self, id: &str) -> Result<Option<String>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT public_key_hex FROM gateways WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?)
    }
}
