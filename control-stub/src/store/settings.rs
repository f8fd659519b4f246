//! The account's settings (schema version 13): one row per setting, with
//! who set it and when. Two kinds today:
//!
//! - `lab_approvals` (`on`/`off`, `control-stub policy lab-approvals`):
//!   whether a decision with no person's passkey assertion (`approvals
//!   approve --as`) may be signed and counts at the gateways. Every open
//!   carries it; off (the default), the CLI refuses to decide and the
//!   gateways refuse such a decision `no_assertion`.
//! - `web_origin` and `web_rp_id`: the people's web app's relying party as
//!   `serve --web-origin`/`--web-rp-id` last started it, which every open
//!   carries so the gateways can check a person's assertion (issue 42).

use super::value::{params, OptionalExtension};

use super::db::{now, Store, Tx};
use crate::error::Error;

/// The setting's name for the lab approvals switch.
pub const LAB_APPROVALS: &str = "lab_approvals";
/// The web app's origin, as `serve` last started it.
pub const WEB_ORIGIN: &str = "web_origin";
/// The web app's rp id, as `serve` last started it.
pub const WEB_RP_ID: &str = "web_rp_id";

impl Tx<'_> {
    /// A setting's value, if set.
    pub fn setting(&self, name: &str) -> Result<Option<String>, Error> {
        self.conn
            .query_row(
                "SELECT value FROM account_settings WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )
            .optional()
    }

    /// Set `name` to `value`, recording who (`by`) and when.
    pub fn set_setting(&self, name: &str, value: &str, by: &str) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO account_settings (name, value, changed_at, changed_by) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (name) DO UPDATE SET value = excluded.value, changed_at = excluded.changed_at, changed_by = excluded.changed_by",
            params![name, value, now(), by],
        )?;
        Ok(())
    }

    /// Whether the account is in lab mode for approvals.
    pub fn lab_approvals(&self) -> Result<bool, Error> {
        Ok(self.setting(LAB_APPROVALS)?.as_deref() == Some("on"))
    }

    /// The web app's (rp id, origin), if `serve` ever ran it.
    pub fn web_relying_party(&self) -> Result<Option<(String, String)>, Error> {
        match (self.setting(WEB_RP_ID)?, self.setting(WEB_ORIGIN)?) {
            (Some(rp_id), Some(origin)) => Ok(Some((rp_id, origin))),
            _ => Ok(None),
        }
    }
}

impl Store {
    /// Turn the lab approvals setting on or off, as `by`; the setting as
    /// it now stands (with who set it and when).
    pub fn set_lab_approvals(&mut self, on: bool, by: &str) -> Result<serde_json::Value, Error> {
        self.write(|tx| {
            tx.set_setting(LAB_APPROVALS, if on { "on" } else { "off" }, by)?;
            tx.lab_approvals_shown()
        })
    }

    /// The lab approvals setting as it stands.
    pub fn lab_approvals_show(&mut self) -> Result<serde_json::Value, Error> {
        self.read(|tx| tx.lab_approvals_shown())
    }
}

impl Tx<'_> {
    fn lab_approvals_shown(&self) -> Result<serde_json::Value, Error> {
        let row: Option<(String, String, String)> = self
            .conn
            .query_row(
                "SELECT value, changed_at, changed_by FROM account_settings WHERE name = ?1",
                params![LAB_APPROVALS],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        Ok(match row {
            Some((value, at, by)) => serde_json::json!({
                "lab_approvals": value, "changed_at": at, "changed_by": by,
            }),
            None => serde_json::json!({"lab_approvals": "off"}),
        })
    }
}
