//! The secret store: each tenant's secrets, by name. No list shows a
//! value; a change checkpoints the WAL so an old value does not linger.

use serde::Serialize;
use zeroize::Zeroizing;

use super::db::{now, Store, Tx};
use super::value::{params, OptionalExtension};
use crate::error::Error;
use crate::names;

/// A secret as `secret list` shows it: no value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SecretInfo {
    pub name: String,
    pub updated_at: String,
}

impl Store {
    /// Set tenant `tenant`'s secret `name` to `value` (a new value replaces
    /// the old one). Sessions already running keep the value they opened
    /// with; the next resume or recovery reads the new one.
    pub fn secret_set(&mut self, tenant: &str, name: &str, value: &[u8]) -> Result<(), Error> {
        let tenant = names::tenant(tenant)?;
        let name = names::secret_name(name)?;
        names::secret_value(&name, value)?;
        self.write(|tx| {
            tx.conn.execute(
                "INSERT INTO secrets (tenant, name, value, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (tenant, name) DO UPDATE SET value = ?3, updated_at = ?4",
                params![tenant, name, value, now()],
            )?;
            Ok(())
        })?;
        self.checkpoint()
    }

    /// Delete tenant `tenant`'s secret `name`.
    pub fn secret_delete(&mut self, tenant: &str, name: &str) -> Result<(), Error> {
        let tenant = names::tenant(tenant)?;
        let name = names::secret_name(name)?;
        self.write(|tx| {
            let n = tx.conn.execute(
                "DELETE FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )?;
            if n == 0 {
                return Err(Error::SecretNotFound {
                    tenant: tenant.clone(),
                    name: name.clone(),
                });
            }
            Ok(())
        })?;
        self.checkpoint()
    }

    /// The tenant's secrets: names and times, never values.
    pub fn secret_list(&self, tenant: &str) -> Result<Vec<SecretInfo>, Error> {
        let tenant = names::tenant(tenant)?;
        self.read(|tx| {
            let mut stmt = tx
                .conn
                .prepare("SELECT name, updated_at FROM secrets WHERE tenant = ?1 ORDER BY name")?;
            let rows = stmt.query_map(params![tenant], |r| {
                Ok(SecretInfo {
                    name: r.get(0)?,
                    updated_at: r.get(1)?,
                })
            })?;
            rows.collect::<Result<Vec<_>, _>>()
        })
    }
}

impl Tx<'_> {
    /// Whether tenant `tenant` has secret `name`.
    pub fn secret_exists(&self, tenant: &str, name: &str) -> Result<bool, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT 1 FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// The value of tenant `tenant`'s secret `name`, as stored now.
    pub fn secret_value(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<Zeroizing<Vec<u8>>>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT value FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                |r| r.get::<_, Vec<u8>>(0),
            )
            .optional()?
            .map(Zeroizing::new))
    }
}
