//! Who asked: every command and time-driven event that moved a session,
//! one row each, never changed.
//!
//! # What proved who asked
//!
//! A command's requester is verified when something proved who asked
//! ([`Proof`]): a person's passkey assertion over the command's challenge
//! (the web app), or an operator's client certificate under the operator
//! CA (`POST /v1/sandboxes/{id}/revoke-all`). Both are kept in the row's
//! `assertion` column: the passkey's record as it always was, a client
//! certificate's as `{"client_certificate": {…}}` (a key no passkey
//! record has), so no schema change was needed. A command-line call names
//! its operator and nothing proves it: not verified.

use serde::{Deserialize, Serialize};

use super::db::Tx;
use super::people::SignedByPasskey;
use super::value::{json_col, params, parse_word};
use crate::error::Error;

/// Who asked for a session's change.
///
/// Serialised (`sandbox status`, the certificate, its bundle) as
/// `requester`, `requested_by`, `verified`, then, when verified,
/// `verified_by` (`passkey` or `client_certificate`) and the proof itself:
/// `assertion` (the passkey's) or `client_certificate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requester {
    /// `operator` (a CLI call, an operator in the web app or on the API),
    /// `approver`, or `time` (one of `serve`'s time-driven events).
    pub requester: RequesterKind,
    /// The operator's identity, the person's name, or the time-driven
    /// cause (`idle_timeout_end`, …).
    pub requested_by: String,
    /// What proved who asked; none for a command-line call (its operator
    /// is named by `--operator`, `TALOS_OPERATOR` or the login name, and
    /// nothing proves it) and for time.
    pub proof: Option<Proof>,
}

/// What proved who asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proof {
    /// The person's passkey assertion over the command's challenge
    /// (`talos_certs::webauthn::command_challenge`), as verified.
    Passkey(SignedByPasskey),
    /// The operator's client certificate, verified under the operator CA
    /// on the TLS connection the command came on.
    ClientCertificate(ClientCertificate),
}

impl Proof {
    /// `passkey` or `client_certificate`.
    pub fn method(&self) -> &'static str {
        match self {
            Proof::Passkey(_) => "passkey",
            Proof::ClientCertificate(_) => "client_certificate",
        }
    }
}

/// An operator's client certificate as it was verified: which one, under
/// which CA, and when. All public: a certificate, never its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCertificate {
    /// The operator it names (its `talos:operator:NAME` URI).
    pub operator: String,
    /// SHA-256 of the certificate's DER, lowercase hex (`openssl x509
    /// -noout -fingerprint -sha256` shows it in upper case with colons).
    pub sha256: String,
    /// Its serial number, lowercase hex.
    pub serial: String,
    /// SHA-256 of the operator CA's certificate (DER) it chains to.
    pub issuer_sha256: String,
    /// The certificate itself, DER in standard base64: an auditor checks
    /// it against the operator CA (`operator-ca.pem`).
    pub certificate: String,
    pub verified_at: String,
}

impl Serialize for Requester {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct View<'a> {
            requester: RequesterKind,
            requested_by: &'a str,
            /// Whether something proved who asked.
            verified: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            verified_by: Option<&'static str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            assertion: Option<&'a SignedByPasskey>,
            #[serde(skip_serializing_if = "Option::is_none")]
            client_certificate: Option<&'a ClientCertificate>,
        }
        View {
            requester: self.requester,
            requested_by: &self.requested_by,
            verified: self.is_verified(),
            verified_by: self.proof.as_ref().map(Proof::method),
            assertion: match &self.proof {
                Some(Proof::Passkey(a)) => Some(a),
                _ => None,
            },
            client_certificate: match &self.proof {
                Some(Proof::ClientCertificate(c)) => Some(c),
                _ => None,
            },
        }
        .serialize(s)
    }
}

crate::model::words! {
    /// The kinds of requester.
    pub enum RequesterKind {
        Operator => "operator",
        Approver => "approver",
        Time => "time",
    }
}

impl Requester {
    /// An operator named by the command line: not verified.
    pub fn operator(name: &str) -> Requester {
        Requester {
            requester: RequesterKind::Operator,
            requested_by: name.to_owned(),
            proof: None,
        }
    }

    /// A person whose passkey signed the command (`assertion`, verified).
    pub fn verified(kind: RequesterKind, assertion: SignedByPasskey) -> Requester {
        Requester {
            requester: kind,
            requested_by: assertion.person.clone(),
            proof: Some(Proof::Passkey(assertion)),
        }
    }

    /// An operator whose client certificate was verified (`certificate`).
    pub fn by_certificate(certificate: ClientCertificate) -> Requester {
        Requester {
            requester: RequesterKind::Operator,
            requested_by: certificate.operator.clone(),
            proof: Some(Proof::ClientCertificate(certificate)),
        }
    }

    pub fn time(cause: &str) -> Requester {
        Requester {
            requester: RequesterKind::Time,
            requested_by: cause.to_owned(),
            proof: None,
        }
    }

    /// Whether something proved who asked.
    pub fn is_verified(&self) -> bool {
        self.proof.is_some()
    }

    /// The passkey assertion that proved it, if one did.
    pub fn assertion(&self) -> Option<&SignedByPasskey> {
        match &self.proof {
            Some(Proof::Passkey(a)) => Some(a),
            _ => None,
        }
    }
}

/// The `assertion` column's JSON of a client certificate (see the module
/// docs).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredCertificate {
    client_certificate: ClientCertificate,
}

/// The `assertion` column of `proof`.
fn stored(proof: &Proof) -> Result<String, Error> {
    Ok(match proof {
        Proof::Passkey(a) => serde_json::to_string(a)?,
        Proof::ClientCertificate(c) => serde_json::to_string(&StoredCertificate {
            client_certificate: c.clone(),
        })?,
    })
}

/// The proof an `assertion` column holds.
fn proof_of(idx: usize, text: String) -> Result<Proof, Error> {
    let value: serde_json::Value = json_col(idx, text)?;
    if value.get("client_certificate").is_some() {
        let c: StoredCertificate = serde_json::from_value(value)?;
        return Ok(Proof::ClientCertificate(c.client_certificate));
    }
    Ok(Proof::Passkey(serde_json::from_value(value)?))
}

/// One recorded command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CommandRecord {
    /// The machine's event: `start`, `pause`, `resume`, `interrupt`,
    /// `recover`, `stop`, `revoke_all`, or a time-driven one.
    pub event: String,
    #[serde(flatten)]
    pub by: Requester,
    /// The attempt it opened or ended, when it concerned one.
    pub attempt: Option<u32>,
    pub at: String,
}

impl Tx<'_> {
    /// Record that `by` asked for `event` on session `session_id` at `at`.
    pub fn record_command(
        &self,
        session_id: &str,
        event: &str,
        by: &Requester,
        attempt: Option<u32>,
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO commands (session_id, n, event, requester, requested_by, attempt, at,
                                   verified, assertion)
             VALUES (?1, (SELECT coalesce(max(n), 0) + 1 FROM commands WHERE session_id = ?1),
                     ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                session_id,
                event,
                by.requester.as_str(),
                by.requested_by,
                attempt,
                at,
                by.is_verified(),
                by.proof.as_ref().map(stored).transpose()?,
            ],
        )?;
        Ok(())
    }

    /// The session's commands, in the order they were committed.
    pub fn commands(&self, session_id: &str) -> Result<Vec<CommandRecord>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT event, requester, requested_by, attempt, at, verified, assertion FROM commands
             WHERE session_id = ?1 ORDER BY n",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            let verified: bool = r.get(5)?;
            let proof = match r.get::<_, Option<String>>(6)? {
                Some(text) if verified => Some(proof_of(6, text)?),
                _ => None,
            };
            Ok(CommandRecord {
                event: r.get(0)?,
                by: Requester {
                    requester: parse_word(1, r.get(1)?, RequesterKind::parse)?,
                    requested_by: r.get(2)?,
                    proof,
                },
                attempt: r.get(3)?,
                at: r.get(4)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate() -> ClientCertificate {
        ClientCertificate {
            operator: "opal".into(),
            sha256: "ab".repeat(32),
            serial: "01".into(),
            issuer_sha256: "cd".repeat(32),
            certificate: "MAA=".into(),
            verified_at: "2026-12-07T09:00:00.000Z".into(),
        }
    }

    #[test]
    fn each_proof_is_stored_and_read_back_as_itself_and_says_how() {
        let by = Requester::by_certificate(certificate());
        let text = stored(by.proof.as_ref().unwrap()).unwrap();
        assert!(text.starts_with("{\"client_certificate\":"), "{text}");
        assert_eq!(proof_of(6, text).unwrap(), by.proof.clone().unwrap());
        let shown = serde_json::to_value(&by).unwrap();
        assert_eq!(shown["requester"], "operator");
        assert_eq!(shown["requested_by"], "opal");
        assert_eq!(shown["verified"], true);
        assert_eq!(shown["verified_by"], "client_certificate");
        assert_eq!(shown["client_certificate"]["sha256"], "ab".repeat(32));
        assert!(shown.get("assertion").is_none());

        // A command-line call: not verified, and nothing says how.
        let cli = serde_json::to_value(Requester::operator("ops")).unwrap();
        assert_eq!(
            cli,
            serde_json::json!({"requester": "operator", "requested_by": "ops", "verified": false})
        );
    }
}
