//! The fields only a restart changes: what a reload and a successor must
//! find as the running process has them, and the error that names the
//! one that differs, at its line.

use std::path::Path;

use super::text::{find_field, line_of};
use super::{Config, ConfigError};

impl Config {
    /// The fields only a restart changes, each with its value as text (see
    /// `docs/operators.md`, "Reload"): listen addresses, the gateway's id,
    /// the control identity and channel, the record file, the spool and
    /// its batches, the threads, the process socket.
    pub fn restart_only(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("gateway_id", self.gateway_id.get_ref().clone()),
            ("listen.data", self.listen.data.to_string()),
            ("listen.admin", self.listen.admin.to_string()),
            ("records.path", self.records.path.display().to_string()),
            (
                "runtime.workers",
                format!("{:?}", self.runtime.workers.as_ref().map(|w| *w.get_ref())),
            ),
            (
                "process.socket",
                format!("{:?}", self.process.socket.as_ref().map(|s| s.get_ref())),
            ),
        ];
        match &self.pair {
            None => fields.push(("pair", "none".into())),
            Some(p) => fields.extend([
                ("pair.listen", p.listen.get_ref().to_string()),
                (
                    "pair.peers",
                    p.peers
                        .iter()
                        .map(|peer| format!("{}={}", peer.id.get_ref(), peer.link.get_ref()))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                (
                    "pair.max_forwarded_per_session",
                    p.max_forwarded_per_session.get_ref().to_string(),
                ),
                (
                    "pair.holdings_interval_ms",
                    p.holdings_interval_ms.get_ref().to_string(),
                ),
            ]),
        }
        match &self.dns {
            None => fields.push(("dns", "none".into())),
            Some(d) => fields.extend([
                ("dns.listen", d.listen.get_ref().to_string()),
                ("dns.approvals", format!("{:?}", d.approvals())),
                ("dns.ttl_s", d.ttl_s.get_ref().to_string()),
                (
                    "dns.queries_per_second",
                    d.queries_per_second.get_ref().to_string(),
                ),
                (
                    "dns.max_tcp_per_session",
                    d.max_tcp_per_session.get_ref().to_string(),
                ),
                (
                    "dns.record_interval_ms",
                    d.record_interval_ms.get_ref().to_string(),
                ),
            ]),
        }
        match &self.control {
            None => fields.push(("control", "none".into())),
            Some(c) => fields.extend([
                ("control.listen", c.listen.get_ref().to_string()),
                ("control.ca_file", c.ca_file.get_ref().display().to_string()),
                (
                    "control.cert_file",
                    c.cert_file.get_ref().display().to_string(),
                ),
                (
                    "control.key_file",
                    c.key_file.get_ref().display().to_string(),
                ),
                (
                    "control.signing_key_file",
                    c.signing_key_file.get_ref().display().to_string(),
                ),
                (
                    "control.plane",
                    format!("{:?}", c.plane.as_ref().map(|p| p.get_ref().addrs())),
                ),
                ("control.plane_name", c.plane_name.get_ref().clone()),
                (
                    "control.spool_dir",
                    format!("{:?}", c.spool_dir.as_ref().map(|d| d.get_ref())),
                ),
                (
                    "control.batch_max_records",
                    c.batch_max_records.get_ref().to_string(),
                ),
                (
                    "control.batch_interval_ms",
                    c.batch_interval_ms.get_ref().to_string(),
                ),
                (
                    "control.spool_max_batches",
                    c.spool_max_batches.get_ref().to_string(),
                ),
                (
                    "control.spool_max_bytes",
                    c.spool_max_bytes.get_ref().to_string(),
                ),
            ]),
        }
        fields
    }

    /// The first field only a restart changes whose value differs between
    /// `running` (its fields as [`Config::restart_only`] gave them) and this
    /// config, as an error naming its line in this file.
    pub fn check_restart_only(
        &self,
        path: &Path,
        running: &[(&'static str, String)],
    ) -> Result<(), ConfigError> {
        let mine = self.restart_only();
        for (field, was) in running {
            // `control` (the whole table) is reported under its own name.
            if mine.iter().find(|(f, _)| f == field).map(|(_, v)| v) != Some(was) {
                return Err(self.changed_field(path, field, was));
            }
        }
        if let Some((field, _)) = mine
            .iter()
            .find(|(f, _)| !running.iter().any(|(r, _)| r == f))
        {
            return Err(self.changed_field(path, field, "none"));
        }
        Ok(())
    }

    /// `field`, one only a restart changes, is `was` in the running
    /// process and otherwise here: the error a reload or a successor
    /// refuses this config with, naming the field's line.
    pub fn changed_field(&self, path: &Path, field: &str, was: &str) -> ConfigError {
        let mine = self.restart_only();
        let now = mine
            .iter()
            .find(|(f, _)| *f == field)
            .map_or("none", |(_, v)| v.as_str());
        self.field_error(
            path,
            field,
            format!(
                "changes only with a restart: a reload or an upgrade keeps it as running (running: {was}; here: {now})"
            ),
        )
    }

    /// An error about `field` (dotted: `control.signing_key_file`) of this
    /// config, naming the line that sets it (or its table's header).
    pub fn field_error(&self, path: &Path, field: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: path.to_owned(),
            line: line_of(&self.source, find_field(&self.source, field).start),
            field: field.to_owned(),
            message,
        }
    }
}
