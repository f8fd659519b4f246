//! Issued session certificates: written once, never changed.

use super::db::Tx;
use super::value::{params, OptionalExtension};
use crate::error::Error;

/// A certificate as issued: the signed payload and the control plane's
/// signature over it (talos-certs `Signed`, kind `certificate`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCertificate {
    pub issued_at: String,
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
    pub key_id: String,
}

impl Tx<'_> {
    /// Store session `id`'s certificate. Refuses a second one: an issued
    /// certificate never changes.
    pub fn insert_certificate(&self, id: &str, cert: &IssuedCertificate) -> Result<(), Error> {
        let n = self.conn.execute(
            "INSERT INTO certificates (session_id, issued_at, payload, signature, key_id)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
            params![
                id,
                cert.issued_at,
                cert.payload,
                cert.signature,
                cert.key_id
            ],
        )?;
        if n == 0 {
            return Err(Error::Store(format!(
                "session {id} already has a certificate; an issued certificate never changes"
            )));
        }
        Ok(())
    }

    /// Session `id`'s issued certificate, if there is one.
    pub fn issued_certificate(&self, id: &str) -> Result<Option<IssuedCertificate>, Error> {
        self.conn
            .query_row(
                "SELECT issued_at, payload, signature, key_id FROM certificates
                 WHERE session_id = ?1",
                params![id],
                |r| {
                    Ok(IssuedCertificate {
                        issued_at: r.get(0)?,
                        payload: r.get(1)?,
                        signature: r.get(2)?,
                        key_id: r.get(3)?,
                    })
                },
            )
            .optional()
    }

    /// Sessions over (ended or reset incomplete) without a certificate.
    pub fn certificates_owed(&self) -> Result<Vec<String>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT id FROM sessions s
             WHERE state IN ('stopping', 'ended', 'failed', 'reset_incomplete')
               AND NOT EXISTS (SELECT 1 FROM certificates c WHERE c.session_id = s.id)
             ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect::<Result<Vec<_>, _>>()
    }
}
