//! When the spool is blocked: checking it, and setting a bad batch aside
//! as a signed gap.
//!
//! A batch file that is missing, unreadable, not signed by this gateway's
//! key, numbered wrongly or not linked to its predecessor stops the gateway
//! at start (the spool refuses to open), and a batch the control plane
//! refuses stays at the head of the spool for ever: every later batch waits
//! behind it. Nothing may skip it silently — the records in it are part of
//! some session's certificate. [`verify`] says what is wrong, batch by
//! batch (`gateway spool verify`); [`set_aside`] (`gateway spool
//! set-aside`), for a batch `verify` found bad:
//!
//! 1. moves the bad file, if there is one, to `<spool_dir>/set-aside/`,
//!    never deleting it;
//! 2. seals in its place, under the same sequence number, a batch whose one
//!    entry is a **gap** — `{"gap": {"seq", "found", "reason",
//!    "expected_digest", "window_after", "window_before", "set_aside_file",
//!    "set_aside_at"}}` — signed with the gateway's key like any batch;
//! 3. seals again every later batch of the spool (their records unchanged,
//!    each checked under the key first) so the chain runs on through the
//!    gap without a break.
//!
//! The control plane records the gap and shows it on the certificate of
//! every session that had an authority on this gateway in the gap's window
//! (between the batches around it): the certificate says records may be
//! missing there, rather than pretend they are not.
//!
//! Both take the spool's lock, so neither runs beside a gateway that uses
//! the spool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use talos_certs::{BatchWriter, GatewayKey, Signed};

use crate::records::spool::{read_batch, write_synced, SpoolError, SpoolLock, BATCH_EXT};

/// What is wrong with one batch of the spool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "problem")]
pub enum Problem {
    /// No file for a sequence number between the chain's last acknowledged
    /// batch and the newest file.
    Missing,
    /// The file is not a signed batch envelope.
    Unreadable { reason: String },
    /// The envelope's signature does not verify under this gateway's key,
    /// or is not a batch's.
    BadSignature { reason: String },
    /// The payload names another sequence number than its file.
    WrongSeq { claimed: u64 },
    /// The batch does not link to the one before it.
    BrokenLink { expected: String, found: String },
}

impl Problem {
    fn word(&self) -> &'static str {
        match self {
            Problem::Missing => "missing",
            Problem::Unreadable { .. } => "unreadable",
            Problem::BadSignature { .. } => "bad_signature",
            Problem::WrongSeq { .. } => "wrong_seq",
            Problem::BrokenLink { .. } => "broken_link",
        }
    }
}

/// One bad batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub seq: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    #[serde(flatten)]
    pub problem: Problem,
}

/// What [`verify`] found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// `chain.json`'s batch: the last one acknowledged when the spool last
    /// emptied (batches before the oldest file were acknowledged since).
    pub acknowledged_through: u64,
    /// The batches waiting, first and last sequence numbers.
    pub waiting: Option<(u64, u64)>,
    /// Every bad batch, oldest first; empty when the spool is sound.
    pub findings: Vec<Finding>,
}

/// One batch as read for checking.
struct Read {
    seq: u64,
    path: PathBuf,
    signed: Option<Signed>,
    problem: Option<Problem>,
    header: Option<Header>,
}

#[derive(serde::Deserialize)]
struct Header {
    seq: u64,
    prev_digest: String,
    created_at: String,
}

/// Check every batch waiting in `dir` against this gateway's public key:
/// present, readable, signed as a batch, numbered as its file, linked to
/// its predecessor.
pub fn verify(dir: &Path, public_key: &[u8; 32]) -> Result<Report, SpoolError> {
    let _lock = SpoolLock::take(dir)?;
    let (position, reads) = read_all(dir, public_key)?;
    Ok(report(&position, &reads))
}

fn report(position: &crate::records::spool::ChainPosition, reads: &[Read]) -> Report {
    let mut findings = Vec::new();
    // The first waiting batch links to `chain.json`'s only when it follows
    // it directly; otherwise its predecessor was acknowledged and deleted.
    let mut prev_digest = reads
        .first()
        .filter(|r| r.seq == position.last_seq + 1)
        .map(|_| position.last_digest.clone());
    for r in reads {
        match &r.problem {
            Some(problem) => {
                findings.push(Finding {
                    seq: r.seq,
                    file: (!matches!(problem, Problem::Missing)).then(|| r.path.clone()),
                    problem: problem.clone(),
                });
                prev_digest = None;
            }
            None => {
                let header = r
                    .header
                    .as_ref()
                    .expect("read without problem has a header");
                if let Some(expected) = &prev_digest {
                    if &header.prev_digest != expected {
                        findings.push(Finding {
                            seq: r.seq,
                            file: Some(r.path.clone()),
                            problem: Problem::BrokenLink {
                                expected: expected.clone(),
                                found: header.prev_digest.clone(),
                            },
                        });
                    }
                }
                prev_digest = r.signed.as_ref().map(talos_certs::digest);
            }
        }
    }
    Report {
        acknowledged_through: position.last_seq,
        waiting: reads
            .first()
            .map(|f| (f.seq, reads.last().map_or(f.seq, |l| l.seq))),
        findings,
    }
}

/// The chain position and every batch from the one after it to the newest
/// file, a missing one included, each checked.
fn read_all(
    dir: &Path,
    public_key: &[u8; 32],
) -> Result<(crate::records::spool::ChainPosition, Vec<Read>), SpoolError> {
    let position = crate::records::spool::read_position(dir)?;
    let mut seqs: Vec<u64> = Vec::new();
    for item in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let item = item.map_err(|e| io(dir, e))?;
        let name = item.file_name();
        let name = name.to_string_lossy();
        if let Some(seq) = name
            .strip_suffix(&format!(".{BATCH_EXT}"))
            .and_then(|s| s.parse::<u64>().ok())
        {
            if seq > position.last_seq {
                seqs.push(seq);
            }
        }
    }
    seqs.sort_unstable();
    let (Some(&oldest), Some(&newest)) = (seqs.first(), seqs.last()) else {
        return Ok((position, Vec::new()));
    };
    // Batches before the oldest file were acknowledged and deleted (the
    // spool writes `chain.json` only when it empties): the range to check
    // runs from the oldest file.
    let mut out = Vec::new();
    for seq in oldest..=newest {
        let path = batch_path(dir, seq);
        if !seqs.contains(&seq) {
            out.push(Read {
                seq,
                path,
                signed: None,
                problem: Some(Problem::Missing),
                header: None,
            });
            continue;
        }
        let (signed, problem, header) = match read_batch(&path) {
            Err(e) => (
                None,
                Some(Problem::Unreadable {
                    reason: e.to_string(),
                }),
                None,
            ),
            Ok(signed) => check(&signed, seq, public_key),
        };
        out.push(Read {
            seq,
            path,
            signed,
            problem,
            header,
        });
    }
    Ok((position, out))
}

fn check(
    signed: &Signed,
    seq: u64,
    public_key: &[u8; 32],
) -> (Option<Signed>, Option<Problem>, Option<Header>) {
    if signed.kind != talos_certs::Kind::Batch {
        return (
            None,
            Some(Problem::BadSignature {
                reason: format!("a signed {}, not a batch", signed.kind),
            }),
            None,
        );
    }
    if let Err(e) = talos_certs::verify(public_key, signed) {
        return (
            None,
            Some(Problem::BadSignature {
                reason: e.to_string(),
            }),
            None,
        );
    }
    match serde_json::from_slice::<Header>(&signed.payload) {
        Err(e) => (
            None,
            Some(Problem::Unreadable {
                reason: format!("the payload is not a batch: {e}"),
            }),
            None,
        ),
        Ok(h) if h.seq != seq => (None, Some(Problem::WrongSeq { claimed: h.seq }), None),
        Ok(h) => (Some(signed.clone()), None, Some(h)),
    }
}

/// What [`set_aside`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SetAside {
    pub seq: u64,
    /// Where the bad file went (none when it was missing).
    pub moved_to: Option<PathBuf>,
    /// The gap entry now sealed as batch `seq`.
    pub gap: serde_json::Value,
    /// Later batches sealed again to follow the gap.
    pub resealed: Vec<u64>,
    /// What `verify` finds now.
    pub after: Report,
}

/// Why [`set_aside`] refused.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error(
        "batch {seq} is not the first bad batch of the spool ({first}); set that one aside first"
    )]
    NotFirst { seq: u64, first: String },
    #[error("batch {seq} is sound: nothing to set aside")]
    Sound { seq: u64 },
    #[error("cannot seal the gap: {0}")]
    Seal(String),
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

/// Set the first bad batch of `dir`, `seq`, aside as a signed gap, and seal
/// the batches after it again (see the module docs). `reason` is the
/// operator's word for the certificate.
pub fn set_aside(
    dir: &Path,
    key: Arc<GatewayKey>,
    gateway_id: &str,
    seq: u64,
    reason: &str,
    now: &str,
) -> Result<SetAside, RepairError> {
    let _lock = SpoolLock::take(dir)?;
    let public = key.public_key();
    let (position, reads) = read_all(dir, &public)?;
    let findings = report(&position, &reads).findings;
    let Some(first) = findings.first() else {
        return Err(RepairError::Sound { seq });
    };
    if first.seq != seq {
        let sound = reads.iter().any(|r| r.seq == seq) && !findings.iter().any(|f| f.seq == seq);
        return Err(if sound {
            RepairError::Sound { seq }
        } else {
            RepairError::NotFirst {
                seq,
                first: format!("batch {}: {}", first.seq, first.problem.word()),
            }
        });
    }
    let index = reads
        .iter()
        .position(|r| r.seq == seq)
        .expect("a finding is one of the reads");
    // What the batch was meant to be: the digest its successor links to.
    let expected_digest = reads
        .get(index + 1)
        .and_then(|n| n.header.as_ref())
        .map(|h| h.prev_digest.clone());
    let window_after = index
        .checked_sub(1)
        .and_then(|i| reads[i].header.as_ref())
        .map(|h| h.created_at.clone());
    let window_before = reads
        .get(index + 1)
        .and_then(|n| n.header.as_ref())
        .map(|h| h.created_at.clone())
        .unwrap_or_else(|| now.to_owned());
    // The chain before the gap: the predecessor's digest.
    let (prev_seq, prev_digest) = match index.checked_sub(1) {
        None if seq == position.last_seq + 1 => (position.last_seq, position.last_digest.clone()),
        None => {
            return Err(RepairError::Seal(format!(
                "batch {} before it was acknowledged and is gone, and chain.json is at {}: the gap cannot be linked",
                seq - 1,
                position.last_seq
            )))
        }
        Some(i) => (
            reads[i].seq,
            reads[i]
                .signed
                .as_ref()
                .map(talos_certs::digest)
                .ok_or_else(|| RepairError::Seal("the batch before it is bad too".into()))?,
        ),
    };
    // 1. The bad file out of the way, kept.
    let moved_to = if matches!(first.problem, Problem::Missing) {
        None
    } else {
        let aside = dir.join("set-aside");
        std::fs::create_dir_all(&aside).map_err(|e| RepairError::Io {
            path: aside.clone(),
            reason: e.to_string(),
        })?;
        let to = aside.join(format!("{seq:020}.{BATCH_EXT}.{}", now.replace(':', "-")));
        std::fs::rename(&reads[index].path, &to).map_err(|e| RepairError::Io {
            path: reads[index].path.clone(),
            reason: e.to_string(),
        })?;
        Some(to)
    };
    // 2. The gap, signed, in its place.
    let gap = serde_json::json!({ "gap": {
        "seq": seq,
        "found": first.problem.word(),
        "reason": reason,
        "expected_digest": expected_digest,
        "window_after": window_after,
        "window_before": window_before,
        "set_aside_file": moved_to.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()),
        "set_aside_at": now,
    }});
    let mut writer = BatchWriter::restore(Arc::clone(&key), gateway_id, prev_seq, prev_digest);
    let entry = serde_json::to_vec(&gap).map_err(|e| RepairError::Seal(e.to_string()))?;
    let sealed = writer
        .seal(now, &[entry])
        .map_err(|e| RepairError::Seal(e.to_string()))?;
    put(dir, seq, &sealed)?;
    // 3. The batches after it, sealed again to follow.
    let mut resealed = Vec::new();
    for r in &reads[index + 1..] {
        let (Some(signed), Some(header)) = (&r.signed, &r.header) else {
            // The next bad batch: set aside next.
            break;
        };
        let records = talos_certs::batch_records(&signed.payload)
            .map_err(|e| RepairError::Seal(format!("batch {}: {e}", r.seq)))?;
        let again = writer
            .seal(&header.created_at, &records)
            .map_err(|e| RepairError::Seal(e.to_string()))?;
        put(dir, r.seq, &again)?;
        resealed.push(r.seq);
    }
    let (position, reads) = read_all(dir, &public)?;
    Ok(SetAside {
        seq,
        moved_to,
        gap,
        resealed,
        after: report(&position, &reads),
    })
}

fn put(dir: &Path, seq: u64, signed: &Signed) -> Result<(), RepairError> {
    let path = batch_path(dir, seq);
    let body = serde_json::to_vec(signed).map_err(|e| RepairError::Seal(e.to_string()))?;
    write_synced(&path, &body)
        .and_then(|()| std::fs::File::open(dir).and_then(|d| d.sync_all()))
        .map_err(|e| RepairError::Io {
            path,
            reason: e.to_string(),
        })
}

fn batch_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.{BATCH_EXT}"))
}

fn io(path: &Path, e: std::io::Error) -> SpoolError {
    SpoolError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::spool::{Spool, SpoolLimits};

    fn limits() -> SpoolLimits {
        SpoolLimits {
            max_batches: 100,
            max_bytes: 1 << 30,
        }
    }

    /// A spool with batches 1..=n, two records each; batch 1 acknowledged
    /// (removed, chain.json written) when `ack_first`.
    fn spool(dir: &Path, key: &Arc<GatewayKey>, n: u64, ack_first: bool) {
        let (spool, _) = Spool::open(dir, limits()).unwrap();
        let mut w = BatchWriter::new(Arc::clone(key), "gw-a");
        for i in 0..n {
            let seq = w.next_seq();
            let records = [
                format!("{{\"conn\":{},\"session_id\":\"s\"}}", 2 * i),
                format!("{{\"conn\":{},\"session_id\":\"s\"}}", 2 * i + 1),
            ];
            let at = format!("2026-12-01T00:00:{:02}.000Z", seq);
            spool.put(seq, &w.seal(&at, &records).unwrap()).unwrap();
        }
        if ack_first {
            spool.remove(1);
        }
    }

    fn flip(path: &Path) {
        let mut signed: Signed = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let text = String::from_utf8(signed.payload.clone()).unwrap();
        signed.payload = text.replacen("\"conn\":", "\"conn\" :", 1).into_bytes();
        std::fs::write(path, serde_json::to_vec(&signed).unwrap()).unwrap();
    }

    #[test]
    fn a_tampered_batch_is_found_set_aside_as_a_signed_gap_and_the_chain_runs_on() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        spool(dir.path(), &key, 5, true);
        assert!(verify(dir.path(), &key.public_key())
            .unwrap()
            .findings
            .is_empty());
        flip(&batch_path(dir.path(), 3));
        let report = verify(dir.path(), &key.public_key()).unwrap();
        assert_eq!(
            report.acknowledged_through, 0,
            "chain.json waits for an empty spool"
        );
        assert_eq!(report.waiting, Some((2, 5)));
        assert_eq!(report.findings.len(), 1);
        assert_eq!(report.findings[0].seq, 3);
        assert!(matches!(
            report.findings[0].problem,
            Problem::BadSignature { .. }
        ));
        // The gateway refuses the spool meanwhile? No: it opens it (the
        // control plane refuses the batch); the repair is what unblocks.
        // Batch 4 is sound: refused. Batch 3 is the one.
        let err = set_aside(dir.path(), Arc::clone(&key), "gw-a", 4, "x", "now").unwrap_err();
        assert!(matches!(err, RepairError::Sound { seq: 4 }), "{err}");
        let done = set_aside(
            dir.path(),
            Arc::clone(&key),
            "gw-a",
            3,
            "disk fault",
            "2026-12-02T00:00:00.000Z",
        )
        .unwrap();
        assert_eq!(done.resealed, [4, 5]);
        assert!(done.after.findings.is_empty(), "{:?}", done.after);
        assert!(
            done.moved_to.as_ref().unwrap().exists(),
            "the bad file is kept"
        );
        assert_eq!(done.gap["gap"]["found"], "bad_signature");
        assert_eq!(done.gap["gap"]["reason"], "disk fault");
        assert_eq!(done.gap["gap"]["window_after"], "2026-12-01T00:00:02.000Z");
        assert_eq!(done.gap["gap"]["window_before"], "2026-12-01T00:00:04.000Z");
        // Batch 3 is the gap now, signed; 4 and 5 keep their records.
        let three = read_batch(&batch_path(dir.path(), 3)).unwrap();
        talos_certs::verify(&key.public_key(), &three).unwrap();
        let entries = talos_certs::batch_records(&three.payload).unwrap();
        assert_eq!(entries.len(), 1);
        assert!(String::from_utf8_lossy(&entries[0]).starts_with("{\"gap\":"));
        let four = read_batch(&batch_path(dir.path(), 4)).unwrap();
        assert_eq!(talos_certs::batch_records(&four.payload).unwrap().len(), 2);
        // And the gateway opens the spool again.
        Spool::open(dir.path(), limits()).unwrap();
    }

    #[test]
    fn a_missing_batch_is_named_and_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        spool(dir.path(), &key, 4, false);
        std::fs::remove_file(batch_path(dir.path(), 2)).unwrap();
        let err = Spool::open(dir.path(), limits()).unwrap_err().to_string();
        assert!(err.contains("gateway spool verify"), "{err}");
        let report = verify(dir.path(), &key.public_key()).unwrap();
        assert_eq!(report.findings[0].seq, 2);
        assert_eq!(report.findings[0].problem, Problem::Missing);
        let done = set_aside(dir.path(), Arc::clone(&key), "gw-a", 2, "deleted", "t").unwrap();
        assert_eq!(done.moved_to, None);
        assert_eq!(done.gap["gap"]["found"], "missing");
        assert!(done.gap["gap"]["expected_digest"].is_string());
        assert!(done.after.findings.is_empty());
    }

    #[test]
    fn only_the_first_bad_batch_and_never_beside_a_running_gateway() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        spool(dir.path(), &key, 5, false);
        flip(&batch_path(dir.path(), 2));
        flip(&batch_path(dir.path(), 4));
        let err = set_aside(dir.path(), Arc::clone(&key), "gw-a", 4, "x", "t").unwrap_err();
        assert!(matches!(err, RepairError::NotFirst { seq: 4, .. }), "{err}");
        let done = set_aside(dir.path(), Arc::clone(&key), "gw-a", 2, "x", "t").unwrap();
        assert_eq!(done.resealed, [3], "up to the next bad batch");
        assert_eq!(done.after.findings[0].seq, 4);
        // Another key's batches are bad signatures, not sound.
        let other = GatewayKey::generate().unwrap();
        assert_eq!(
            verify(dir.path(), &other.public_key()).unwrap().findings[0].seq,
            1
        );
        // A gateway holding the spool keeps the repair out.
        let (_held, _) = Spool::open(dir.path(), limits()).unwrap();
        assert!(matches!(
            verify(dir.path(), &key.public_key()),
            Err(SpoolError::Busy { .. })
        ));
    }
}
