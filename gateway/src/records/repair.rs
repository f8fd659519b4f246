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
//! # What the gap links to
//!
//! The gap takes the bad batch's place in the chain, so it links to the
//! batch before it: the one before in the spool, or — when the bad batch
//! is the oldest waiting, as a batch the control plane refuses is —
//! `chain.json`'s, the acknowledged point the spool keeps at every
//! acknowledgement ([`crate::records::spool`]). So the repair works
//! wherever the bad batch sits.
//!
//! A spool left by an earlier build may have `chain.json` behind the
//! oldest batch waiting (it was written only when the spool emptied), and
//! then the digest of the batch before a bad oldest batch is not here.
//! The repair never guesses it. It takes the digest the bad batch's own
//! payload claims for its predecessor only when that payload is vouched
//! for: the next batch, soundly signed, links to exactly its digest, so
//! it is the payload this gateway sealed and only the envelope was
//! damaged. Otherwise it refuses, and says what to do: give the digest
//! the control plane holds for the batch before (`control-stub gateway
//! list`: the gateway's `chain_last_seq` and `chain_last_digest`) with
//! `--prev-digest`. Either way the control plane checks the link against
//! its own digest of that batch, so a wrong one is refused there
//! (`broken_chain`), never accepted.
//!
//! Both take the spool's lock, so neither runs beside a gateway that uses
//! the spool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use talos_certs::{BatchWriter, GatewayKey, Signed};

use crate::records::spool::{
    read_batch, read_position, write_synced, ChainPosition, SpoolError, SpoolLock, BATCH_EXT,
};

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
    /// `chain.json`'s batch: the last one the control plane acknowledged.
    pub acknowledged_through: u64,
    /// The batches waiting, first and last sequence numbers.
    pub waiting: Option<(u64, u64)>,
    /// Batches after `acknowledged_through` and before the first waiting,
    /// first and last: `chain.json` is behind. A spool left by an earlier
    /// build (which wrote `chain.json` only when the spool emptied) looks
    /// so, and those batches were acknowledged; or they were deleted. Not
    /// a finding: the control plane tells which, as it accepts the first
    /// batch waiting or refuses it `gap`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unaccounted: Option<(u64, u64)>,
    /// Every bad batch, oldest first; empty when the spool is sound.
    pub findings: Vec<Finding>,
}

/// One batch as read for checking.
struct Read {
    seq: u64,
    path: PathBuf,
    /// The envelope as read, whether its signature holds or not.
    envelope: Option<Signed>,
    /// The envelope, when it is a sound batch of this gateway's.
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

fn report(position: &ChainPosition, reads: &[Read]) -> Report {
    let mut findings = Vec::new();
    // The first waiting batch links to `chain.json`'s; unless chain.json is
    // behind (an earlier build's spool), and its predecessor is not here.
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
        unaccounted: reads
            .first()
            .filter(|f| f.seq > position.last_seq + 1)
            .map(|f| (position.last_seq + 1, f.seq - 1)),
        findings,
    }
}

/// The chain position and every batch from the one after it to the newest
/// file, a missing one included, each checked.
fn read_all(dir: &Path, public_key: &[u8; 32]) -> Result<(ChainPosition, Vec<Read>), SpoolError> {
    let position = read_position(dir)?;
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
    // Files at or before chain.json's batch are acknowledged leftovers,
    // skipped above. The range to check runs from the oldest file: it is
    // chain.json's next, unless chain.json is behind (`unaccounted`).
    let mut out = Vec::new();
    for seq in oldest..=newest {
        let path = batch_path(dir, seq);
        if !seqs.contains(&seq) {
            out.push(Read {
                seq,
                path,
                envelope: None,
                signed: None,
                problem: Some(Problem::Missing),
                header: None,
            });
            continue;
        }
        let (envelope, (signed, problem, header)) = match read_batch(&path) {
            Err(e) => (
                None,
                (
                    None,
                    Some(Problem::Unreadable {
                        reason: e.to_string(),
                    }),
                    None,
                ),
            ),
            Ok(envelope) => {
                let checked = check(&envelope, seq, public_key);
                (Some(envelope), checked)
            }
        };
        out.push(Read {
            seq,
            path,
            envelope,
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
    /// The digest the gap must link to is not known here (see the module
    /// docs, "What the gap links to").
    #[error("batch {seq} is the oldest waiting and chain.json is at batch {acknowledged}, so the digest of batch {before} (the gap links to it) is not here: batches {first_unaccounted} to {before} were acknowledged under an earlier build, which wrote chain.json only when the spool emptied, or were deleted{claim}. Ask the control plane: if `control-stub gateway list` shows this gateway's chain_last_seq {before}, run set-aside again with --prev-digest <its chain_last_digest>; if it shows less, batches up to {before} never reached it, and this spool cannot be repaired by set-aside", first_unaccounted = .acknowledged + 1)]
    Unlinked {
        seq: u64,
        acknowledged: u64,
        before: u64,
        /// What the bad batch itself claims, and why it is not taken.
        claim: String,
    },
    #[error("--prev-digest {given} is not the digest of batch {before} this spool knows ({known}): the spool's own is used, and needs no --prev-digest")]
    PrevDigestDiffers {
        before: u64,
        given: String,
        known: String,
    },
    #[error("--prev-digest {0:?} is not a digest (96 lowercase hex digits: SHA-384)")]
    NotADigest(String),
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

/// Set the first bad batch of `dir`, `seq`, aside as a signed gap, and seal
/// the batches after it again (see the module docs). `reason` is the
/// operator's word for the certificate. `prev_digest` is the digest of
/// batch `seq - 1` as the control plane holds it, for a spool that does
/// not know it (see "What the gap links to"); where the spool knows it,
/// it must agree.
pub fn set_aside(
    dir: &Path,
    key: Arc<GatewayKey>,
    gateway_id: &str,
    seq: u64,
    reason: &str,
    prev_digest: Option<&str>,
    now: &str,
) -> Result<SetAside, RepairError> {
    if let Some(d) = prev_digest {
        if !is_digest(d) {
            return Err(RepairError::NotADigest(d.to_owned()));
        }
    }
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
    let (prev_seq, prev_digest) = predecessor(&position, &reads, index, prev_digest)?;
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

/// The batch the gap in place of `reads[index]` links to: its sequence
/// number and digest (see the module docs, "What the gap links to").
fn predecessor(
    position: &ChainPosition,
    reads: &[Read],
    index: usize,
    given: Option<&str>,
) -> Result<(u64, String), RepairError> {
    let seq = reads[index].seq;
    let known = match index.checked_sub(1) {
        Some(i) => Some(
            reads[i]
                .signed
                .as_ref()
                .map(talos_certs::digest)
                .ok_or_else(|| RepairError::Seal("the batch before it is bad too".into()))?,
        ),
        None if seq == position.last_seq + 1 => Some(position.last_digest.clone()),
        None => None,
    };
    match (known, given) {
        (Some(known), Some(given)) if known != given => Err(RepairError::PrevDigestDiffers {
            before: seq - 1,
            given: given.to_owned(),
            known,
        }),
        (Some(known), _) => Ok((seq - 1, known)),
        (None, Some(given)) => Ok((seq - 1, given.to_owned())),
        (None, None) => vouched_claim(&reads[index], reads.get(index + 1))
            .map(|d| (seq - 1, d))
            .map_err(|claim| RepairError::Unlinked {
                seq,
                acknowledged: position.last_seq,
                before: seq - 1,
                claim,
            }),
    }
}

/// The digest bad batch `bad` claims for its predecessor, when `next`,
/// soundly signed, links to exactly `bad`'s payload: then it is the
/// payload this gateway sealed, and only the envelope was damaged. Else
/// why not, for the operator (empty when there is no claim to speak of).
fn vouched_claim(bad: &Read, next: Option<&Read>) -> Result<String, String> {
    let Some(envelope) = &bad.envelope else {
        return Err(String::new());
    };
    let Ok(claimed) = serde_json::from_slice::<Header>(&envelope.payload) else {
        return Err(format!("; batch {}'s payload is not a batch", bad.seq));
    };
    let vouched = next
        .and_then(|n| n.signed.as_ref().and(n.header.as_ref()))
        .is_some_and(|h| h.prev_digest == talos_certs::digest(envelope));
    if vouched && claimed.seq == bad.seq && is_digest(&claimed.prev_digest) {
        return Ok(claimed.prev_digest);
    }
    // A damaged payload's claim may be anything: shown bounded, quoted.
    let shown: String = claimed.prev_digest.chars().take(96).collect();
    Err(format!(
        "; batch {}'s payload claims {shown:?} for it, but no sound batch after it links to that payload, so the claim is not taken",
        bad.seq
    ))
}

/// Whether `d` is a digest as batches carry them: SHA-384, 96 lowercase
/// hex digits.
fn is_digest(d: &str) -> bool {
    d.len() == 96 && d.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
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

    /// A spool with batches 1..=n, two records each, the first `acked`
    /// acknowledged (removed: chain.json written, file deleted). Returns
    /// each batch's digest, batch 1's first.
    fn spool(dir: &Path, key: &Arc<GatewayKey>, n: u64, acked: u64) -> Vec<String> {
        let (spool, _) = Spool::open(dir, limits()).unwrap();
        let mut w = BatchWriter::new(Arc::clone(key), "gw-a");
        let mut digests = Vec::new();
        for i in 0..n {
            let seq = w.next_seq();
            let records = [
                format!("{{\"conn\":{},\"session_id\":\"s\"}}", 2 * i),
                format!("{{\"conn\":{},\"session_id\":\"s\"}}", 2 * i + 1),
            ];
            let at = format!("2026-12-01T00:00:{:02}.000Z", seq);
            let signed = w.seal(&at, &records).unwrap();
            digests.push(talos_certs::digest(&signed));
            spool.put(seq, &signed).unwrap();
        }
        for seq in 1..=acked {
            spool.remove(seq).unwrap();
        }
        digests
    }

    /// As an earlier build left a spool: batches 1..=`gone` acknowledged
    /// and their files deleted, chain.json never written (the spool never
    /// emptied).
    fn earlier_build(dir: &Path, key: &Arc<GatewayKey>, n: u64, gone: u64) -> Vec<String> {
        let digests = spool(dir, key, n, 0);
        for seq in 1..=gone {
            std::fs::remove_file(batch_path(dir, seq)).unwrap();
        }
        digests
    }

    /// Alter the payload (the JSON stays a batch): a bad signature.
    fn flip(path: &Path) {
        let mut signed: Signed = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let text = String::from_utf8(signed.payload.clone()).unwrap();
        signed.payload = text.replacen("\"conn\":", "\"conn\" :", 1).into_bytes();
        std::fs::write(path, serde_json::to_vec(&signed).unwrap()).unwrap();
    }

    /// Alter the signature only: the payload is the one sealed.
    fn flip_signature(path: &Path) {
        let mut signed: Signed = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        signed.signature[0] ^= 1;
        std::fs::write(path, serde_json::to_vec(&signed).unwrap()).unwrap();
    }

    /// A control plane that holds batches 1..=`through` of `digests`:
    /// which of the spool's batches, oldest first, it takes.
    fn control_plane_takes(
        dir: &Path,
        key: &GatewayKey,
        digests: &[String],
        through: u64,
    ) -> Result<Vec<u64>, talos_certs::Rejection> {
        let mut verifier = talos_certs::ChainVerifier::new();
        let state =
            talos_certs::ChainState::new(through, digests[..through as usize].to_vec()).unwrap();
        verifier.register("gw-a", key.public_key(), state);
        let (_, reads) = read_all(dir, &key.public_key()).unwrap();
        let mut taken = Vec::new();
        for r in reads {
            let signed = read_batch(&r.path).unwrap();
            verifier.accept(&signed)?;
            taken.push(r.seq);
        }
        Ok(taken)
    }

    #[test]
    fn a_tampered_batch_is_found_set_aside_as_a_signed_gap_and_the_chain_runs_on() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let digests = spool(dir.path(), &key, 5, 1);
        assert!(verify(dir.path(), &key.public_key())
            .unwrap()
            .findings
            .is_empty());
        flip(&batch_path(dir.path(), 3));
        let report = verify(dir.path(), &key.public_key()).unwrap();
        assert_eq!(
            report.acknowledged_through, 1,
            "chain.json follows every acknowledgement"
        );
        assert_eq!(report.waiting, Some((2, 5)));
        assert_eq!(report.unaccounted, None);
        assert_eq!(report.findings.len(), 1);
        assert_eq!(report.findings[0].seq, 3);
        assert!(matches!(
            report.findings[0].problem,
            Problem::BadSignature { .. }
        ));
        // The gateway refuses the spool meanwhile? No: it opens it (the
        // control plane refuses the batch); the repair is what unblocks.
        // Batch 4 is sound: refused. Batch 3 is the one.
        let err = set_aside(dir.path(), Arc::clone(&key), "gw-a", 4, "x", None, "now").unwrap_err();
        assert!(matches!(err, RepairError::Sound { seq: 4 }), "{err}");
        let done = set_aside(
            dir.path(),
            Arc::clone(&key),
            "gw-a",
            3,
            "disk fault",
            None,
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
        // The control plane, which holds batch 1, takes all of them; and
        // the gateway opens the spool again.
        assert_eq!(
            control_plane_takes(dir.path(), &key, &digests, 1).unwrap(),
            [2, 3, 4, 5]
        );
        Spool::open(dir.path(), limits()).unwrap();
    }

    #[test]
    fn a_bad_batch_at_the_head_behind_acknowledged_batches_links_its_gap_to_chain_json() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        // Batches 1 and 2 acknowledged and gone; 3 is refused at the head.
        let digests = spool(dir.path(), &key, 5, 2);
        flip(&batch_path(dir.path(), 3));
        let report = verify(dir.path(), &key.public_key()).unwrap();
        assert_eq!(report.acknowledged_through, 2);
        assert_eq!(report.waiting, Some((3, 5)));
        assert_eq!(report.findings[0].seq, 3);
        // An operator's digest that is not the one the spool knows.
        let err = set_aside(
            dir.path(),
            Arc::clone(&key),
            "gw-a",
            3,
            "x",
            Some(&digests[0]),
            "t",
        )
        .unwrap_err();
        assert!(
            matches!(err, RepairError::PrevDigestDiffers { before: 2, .. }),
            "{err}"
        );
        let done = set_aside(
            dir.path(),
            Arc::clone(&key),
            "gw-a",
            3,
            "disk fault",
            None,
            "2026-12-02T00:00:00.000Z",
        )
        .unwrap();
        assert_eq!(done.resealed, [4, 5]);
        assert!(done.after.findings.is_empty(), "{:?}", done.after);
        // No batch before it here: the control plane dates the window's
        // start by the batch before, as it received it.
        assert_eq!(done.gap["gap"]["window_after"], serde_json::Value::Null);
        assert_eq!(done.gap["gap"]["window_before"], "2026-12-01T00:00:04.000Z");
        assert_eq!(
            control_plane_takes(dir.path(), &key, &digests, 2).unwrap(),
            [3, 4, 5],
            "the gap links to batch 2"
        );
        Spool::open(dir.path(), limits()).unwrap();
    }

    #[test]
    fn an_earlier_builds_spool_is_repaired_only_with_a_link_it_can_vouch_for_or_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        // chain.json at 0, batches 1 and 2 acknowledged and deleted.
        let digests = earlier_build(dir.path(), &key, 5, 2);
        let report = verify(dir.path(), &key.public_key()).unwrap();
        assert_eq!(report.acknowledged_through, 0);
        assert_eq!(report.waiting, Some((3, 5)));
        assert_eq!(report.unaccounted, Some((1, 2)));
        assert!(report.findings.is_empty(), "not a finding: {report:?}");
        Spool::open(dir.path(), limits()).unwrap();

        // The payload altered: what it claims for batch 2 is not taken.
        flip(&batch_path(dir.path(), 3));
        let err = set_aside(dir.path(), Arc::clone(&key), "gw-a", 3, "x", None, "t").unwrap_err();
        assert!(matches!(err, RepairError::Unlinked { seq: 3, .. }), "{err}");
        let text = err.to_string();
        for says in [
            "chain.json is at batch 0",
            "batches 1 to 2",
            "control-stub gateway list",
            "chain_last_seq 2",
            "--prev-digest",
            "the claim is not taken",
        ] {
            assert!(text.contains(says), "{says:?} in {text}");
        }
        assert!(
            batch_path(dir.path(), 3).exists(),
            "nothing moved on a refusal"
        );
        let err = set_aside(
            dir.path(),
            Arc::clone(&key),
            "gw-a",
            3,
            "x",
            Some("abc"),
            "t",
        )
        .unwrap_err();
        assert!(matches!(err, RepairError::NotADigest(_)), "{err}");
        // With the control plane's digest of batch 2, it is repaired.
        let done = set_aside(
            dir.path(),
            Arc::clone(&key),
            "gw-a",
            3,
            "x",
            Some(&digests[1]),
            "t",
        )
        .unwrap();
        assert_eq!(done.resealed, [4, 5]);
        assert_eq!(
            control_plane_takes(dir.path(), &key, &digests, 2).unwrap(),
            [3, 4, 5]
        );
    }

    #[test]
    fn an_earlier_builds_spool_takes_the_link_a_damaged_envelope_claims_when_its_successor_vouches()
    {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        let digests = earlier_build(dir.path(), &key, 5, 2);
        flip_signature(&batch_path(dir.path(), 3));
        let done = set_aside(dir.path(), Arc::clone(&key), "gw-a", 3, "x", None, "t").unwrap();
        assert_eq!(done.gap["gap"]["expected_digest"], digests[2]);
        assert_eq!(
            control_plane_takes(dir.path(), &key, &digests, 2).unwrap(),
            [3, 4, 5]
        );

        // A wrong link given by hand is sealed, and the control plane
        // refuses it: never accepted.
        let dir = tempfile::tempdir().unwrap();
        let digests = earlier_build(dir.path(), &key, 4, 2);
        flip(&batch_path(dir.path(), 3));
        set_aside(
            dir.path(),
            Arc::clone(&key),
            "gw-a",
            3,
            "x",
            Some(&digests[0]),
            "t",
        )
        .unwrap();
        assert!(matches!(
            control_plane_takes(dir.path(), &key, &digests, 2),
            Err(talos_certs::Rejection::BrokenChain { seq: 3, .. })
        ));
    }

    #[test]
    fn a_missing_batch_is_named_and_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        spool(dir.path(), &key, 4, 0);
        std::fs::remove_file(batch_path(dir.path(), 2)).unwrap();
        let err = Spool::open(dir.path(), limits()).unwrap_err().to_string();
        assert!(err.contains("gateway spool verify"), "{err}");
        let report = verify(dir.path(), &key.public_key()).unwrap();
        assert_eq!(report.findings[0].seq, 2);
        assert_eq!(report.findings[0].problem, Problem::Missing);
        let done = set_aside(
            dir.path(),
            Arc::clone(&key),
            "gw-a",
            2,
            "deleted",
            None,
            "t",
        )
        .unwrap();
        assert_eq!(done.moved_to, None);
        assert_eq!(done.gap["gap"]["found"], "missing");
        assert!(done.gap["gap"]["expected_digest"].is_string());
        assert!(done.after.findings.is_empty());
    }

    #[test]
    fn only_the_first_bad_batch_and_never_beside_a_running_gateway() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(GatewayKey::generate().unwrap());
        spool(dir.path(), &key, 5, 0);
        flip(&batch_path(dir.path(), 2));
        flip(&batch_path(dir.path(), 4));
        let err = set_aside(dir.path(), Arc::clone(&key), "gw-a", 4, "x", None, "t").unwrap_err();
        assert!(matches!(err, RepairError::NotFirst { seq: 4, .. }), "{err}");
        let done = set_aside(dir.path(), Arc::clone(&key), "gw-a", 2, "x", None, "t").unwrap();
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
