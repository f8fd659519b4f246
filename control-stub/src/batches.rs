//! The batch consumer's check: a signed batch verified (signature under the
//! gateway's registered key, sequence, chain: talos-certs'
//! `ChainVerifier`) against each gateway's chain position, and the verdict
//! recorded by the store, in the one transaction that read the positions.
//!
//! - A new batch: its records, the batch itself as signed (what a
//!   certificate bundle carries), and the gateway's new chain position; the
//!   reports among its entries (`{"report": <signed envelope>}`: drop
//!   reports and start reports, each checked under the same key) confirm
//!   what they confirm ([`crate::confirm`]), in the same transaction.
//! - A re-delivery of a recorded batch: nothing changes.
//! - Anything else: the rejection with its stable reason (the gateway id
//!   and sequence number the batch claimed, and the sessions its records
//!   claimed, so the rejection shows on their certificates).

use crate::confirm::{self, SignatureVerifier};
use crate::error::Error;
use crate::link::DropReportView;
use crate::names;
use crate::store::{ed25519_key, now, StartRecord, Store, Tx};

/// What [`accept`] made of a signed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchVerdict {
    /// Verified, new, recorded.
    Accepted { gateway_id: String, seq: u64 },
    /// Verified, and recorded before (a re-delivery).
    Duplicate { gateway_id: String, seq: u64 },
    /// Refused, and the refusal recorded. `gateway_id` and `seq` are what
    /// the batch claimed (empty and 0 when it does not parse); `reason` is
    /// the stable name ([`talos_certs::Rejection::as_str`]).
    Rejected {
        gateway_id: String,
        seq: u64,
        reason: &'static str,
        detail: String,
    },
}

/// Verify a signed batch (signature, sequence, chain) against the
/// registered keys and each gateway's chain position, and have the store
/// record the outcome, all in one transaction: a new batch with its records
/// and the gateway's new chain position; a rejection with its reason; a
/// duplicate changes nothing.
pub fn accept(store: &mut Store, signed: &talos_certs::Signed) -> Result<BatchVerdict, Error> {
    store.write(|tx| {
        let mut verifier = talos_certs::ChainVerifier::new();
        for position in tx.chain_positions()? {
            // A registered key that is not an Ed25519 key verifies
            // nothing: its gateway's batches are refused unknown_gateway.
            let Some(key) = ed25519_key(&position.public_key_hex) else {
                continue;
            };
            let state = position
                .state
                .unwrap_or_else(talos_certs::ChainState::genesis);
            verifier.register(position.gateway_id, key, state);
        }
        match verifier.accept(signed) {
            Ok(talos_certs::Accepted::New {
                header,
                records,
                digest,
            }) => {
                let values = records
                    .iter()
                    .map(|r| serde_json::from_str(r))
                    .collect::<Result<Vec<serde_json::Value>, _>>()?;
                let (entries, connections): (Vec<_>, Vec<_>) = values
                    .into_iter()
                    .partition(|v| v.get("report").is_some() || v.get("gap").is_some());
                tx.insert_batch(&header.gateway_id, header.seq, &digest, &connections)?;
                tx.insert_signed_batch(&header.gateway_id, header.seq, signed)?;
                for entry in &entries {
                    if let Some(report) = entry.get("report") {
                        chain_report(tx, &header.gateway_id, header.seq, report)?;
                    } else if let Some(gap) = entry.get("gap") {
                        chain_gap(tx, &header.gateway_id, gap)?;
                    }
                }
                let state = verifier
                    .state(&header.gateway_id)
                    .ok_or_else(|| Error::Store("chain state lost".into()))?;
                tx.set_chain_state(&header.gateway_id, state)?;
                Ok(BatchVerdict::Accepted {
                    gateway_id: header.gateway_id,
                    seq: header.seq,
                })
            }
            Ok(talos_certs::Accepted::Duplicate { gateway_id, seq }) => {
                Ok(BatchVerdict::Duplicate { gateway_id, seq })
            }
            Err(rejection) => {
                let (gateway_id, seq) = talos_certs::claimed_header(&signed.payload);
                let reason = rejection.as_str();
                let gateway_id: String =
                    gateway_id.chars().take(names::MAX_GATEWAY_ID_LEN).collect();
                tx.insert_rejection(&gateway_id, seq, reason, &claimed_sessions(&signed.payload))?;
                Ok(BatchVerdict::Rejected {
                    gateway_id,
                    seq,
                    reason,
                    detail: rejection.to_string(),
                })
            }
        }
    })
}

/// The most distinct sessions a refused batch is filed under.
const MAX_CLAIMED_SESSIONS: usize = 64;

/// The sessions a batch payload's records claim to be of (unverified), at
/// most [`MAX_CLAIMED_SESSIONS`], for filing a rejection under them.
pub fn claimed_sessions(payload: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Claimed {
        #[serde(default)]
        records: Vec<serde_json::Value>,
    }
    let Ok(claimed) = serde_json::from_slice::<Claimed>(payload) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for r in &claimed.records {
        let session: Option<String> = match r.get("session_id").and_then(|v| v.as_str()) {
            Some(s) => Some(s.to_owned()),
            // A drop report names its session inside its payload.
            None => r
                .get("report")
                .and_then(|e| serde_json::from_value::<talos_certs::Signed>(e.clone()).ok())
                .and_then(|env| serde_json::from_slice::<serde_json::Value>(&env.payload).ok())
                .and_then(|p| p.get("session_id")?.as_str().map(str::to_owned)),
        };
        if let Some(s) = session {
            let s: String = s.chars().take(talos_contract::id::MAX_ID_LEN).collect();
            if !out.contains(&s) {
                out.push(s);
            }
        }
        if out.len() >= MAX_CLAIMED_SESSIONS {
            break;
        }
    }
    out
}

/// The kinds of report a batch carries ([`chain_report`]): the `kind`
/// label values of `stub_reports_accepted_total`.
pub const REPORT_KINDS: [talos_certs::Kind; 2] = [
    talos_certs::Kind::DropReport,
    talos_certs::Kind::StartReport,
];

/// One report entry of a verified batch from `gateway_id` (batch `seq`):
/// checked under the gateway's key, then recorded and confirmed. An entry
/// that does not check out is logged and changes nothing (the batch's own
/// signature held, so it is the gateway's fault, not a forgery).
fn chain_report(
    tx: &Tx<'_>,
    gateway_id: &str,
    seq: u64,
    entry: &serde_json::Value,
) -> Result<(), Error> {
    let refuse = |why: String| {
        eprintln!(
            "{}",
            serde_json::json!({"report_refused": why, "gateway_id": gateway_id, "seq": seq})
        );
        Ok(())
    };
    let Ok(signed) = serde_json::from_value::<talos_certs::Signed>(entry.clone()) else {
        return refuse("not a signed envelope".into());
    };
    let Some(key) = tx.gateway_key(gateway_id)?.and_then(|k| ed25519_key(&k)) else {
        return refuse("the gateway has no registered key".into());
    };
    let bytes = serde_json::to_vec(&signed)?;
    match signed.kind {
        talos_certs::Kind::DropReport => {
            let report = match talos_certs::verify_drop_report(&key, &signed) {
                Ok(r) => r,
                Err(e) => return refuse(e.to_string()),
            };
            if report.gateway_id != gateway_id {
                return refuse(format!("the report names gateway {}", report.gateway_id));
            }
            let view = DropReportView {
                gateway_id: report.gateway_id,
                instance: report.instance,
                session_id: report.session_id,
                attempt: report.attempt,
                reason: report.reason.as_str().to_owned(),
                ca_digest: report.ca_digest,
                secrets: report.secrets,
                signed: bytes,
            };
            metrics::counter!("stub_reports_accepted_total", "gateway" => gateway_id.to_owned(), "kind" => talos_certs::Kind::DropReport.as_str())
                .increment(1);
            confirm::chain_drop_report(tx, &SignatureVerifier, &view, seq)
        }
        talos_certs::Kind::StartReport => {
            let report = match talos_certs::verify_start_report(&key, &signed) {
                Ok(r) => r,
                Err(e) => return refuse(e.to_string()),
            };
            if report.gateway_id != gateway_id {
                return refuse(format!("the report names gateway {}", report.gateway_id));
            }
            let record = StartRecord {
                gateway_id: report.gateway_id.clone(),
                instance: report.instance.clone(),
                started_at: report.started_at,
                previous_instance: report.previous_instance,
                cut_by_crash: report.cut_by_crash,
                key_id: report.key_id,
                batch_seq: seq,
                received_at: now(),
                report_digest: talos_certs::sha384_hex(&bytes),
            };
            let digest = record.report_digest.clone();
            if tx.insert_start_report(&record, &bytes)? {
                confirm::start_report(tx, gateway_id, &report.instance, &digest)?;
                metrics::counter!("stub_reports_accepted_total", "gateway" => gateway_id.to_owned(), "kind" => talos_certs::Kind::StartReport.as_str())
                    .increment(1);
            }
            tx.gateway_seen_instance(gateway_id, &report.instance)
        }
        other => refuse(format!("a signed {other} is no report")),
    }
}

/// A gap entry of a verified batch from `gateway_id`: a batch its operator
/// set aside. Recorded, counted, and shown on every certificate it touches.
fn chain_gap(tx: &Tx<'_>, gateway_id: &str, entry: &serde_json::Value) -> Result<(), Error> {
    let Ok(mut gap) = serde_json::from_value::<crate::store::ChainGap>(entry.clone()) else {
        eprintln!(
            "{}",
            serde_json::json!({"gap_refused": "not a gap entry", "gateway_id": gateway_id})
        );
        return Ok(());
    };
    gap.gateway_id = gateway_id.to_owned();
    eprintln!(
        "{}",
        serde_json::json!({"chain_gap": gap.seq, "gateway_id": gateway_id, "found": gap.found, "reason": gap.reason})
    );
    metrics::counter!("stub_spool_gaps_total", "gateway" => gateway_id.to_owned()).increment(1);
    tx.insert_gap(&gap)
}
