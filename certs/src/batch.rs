//! Signed batches of connection records, and the control plane's check of
//! each gateway's chain of them.
//!
//! # The payload
//!
//! A batch's payload is one JSON object, keys in this order, no whitespace
//! outside the records:
//!
//! ```text
//! {"gateway_id":"gw-a","seq":7,"prev_digest":"<96 hex>","created_at":"2026-11-29T10:00:00Z","count":2,"records":[{…},{…}]}
//! ```
//!
//! - `gateway_id`: the sealing gateway (pair member), as registered.
//! - `seq`: 1 for a gateway's first batch, then each batch one more.
//! - `prev_digest`: the [`digest`](crate::digest) (SHA-384 hex of the
//!   payload) of the batch with `seq - 1`; for `seq` 1, [`GENESIS_DIGEST`].
//! - `created_at`: when the batch was sealed, as the gateway wrote it
//!   (RFC 3339 by convention; not interpreted here).
//! - `count`: the number of records.
//! - `records`: the records in order, each one JSON object embedded byte
//!   for byte as the gateway serialised it (this crate does not know the
//!   record type).
//!
//! Strings are escaped the way `serde_json` writes them: `"`, `\` and the
//! control characters U+0000–U+001F only (`\b \t \n \f \r` by name, the
//! others `\u00xx` in lowercase hex), every other character as UTF-8 — what
//! Python's `json.dumps(v, ensure_ascii=False, separators=(",", ":"))`
//! writes too, which is how a verifier that shares no code with this crate
//! re-encodes a payload to check it (`docs/records.md`, "Canonical JSON").
//! The encoding is a function of its inputs: the same header and records
//! give the same bytes. The payload is signed as [`Kind::Batch`] (see `crate::signing`
//! for the signed message).
//!
//! # What the control plane checks
//!
//! [`ChainVerifier::accept`] checks, in this order, and refuses with the
//! first [`Rejection`] that applies:
//!
//! | refusal | meaning |
//! |---|---|
//! | `wrong_kind` | the envelope holds a drop report or decision, not a batch |
//! | `malformed` | not a batch payload in the encoding above (too large, bad JSON, unknown or missing field, extra whitespace, a record that is not an object, `count` not the number of records, `seq` 0) |
//! | `unknown_gateway` | no key is registered for the payload's `gateway_id` |
//! | `bad_signature` | the signature does not verify under that gateway's key: the payload or signature was altered, another key signed it, or it was signed as another kind |
//! | `gap` | `seq` is beyond the next expected: a batch before it was lost (or this one arrived early; the gateway re-sends in order) |
//! | `broken_chain` | `seq` is the next expected, but `prev_digest` is not the digest of the last accepted batch: the chain was forked or the previous batch was not the one the gateway sealed |
//! | `replayed_different` | `seq` was accepted before, with other bytes: two different batches with one number |
//! | `stale` | `seq` was accepted before, so long ago that its digest is no longer kept: whether it is the same batch cannot be told |
//!
//! A batch whose `seq` was accepted before with identical payload bytes is
//! [`Accepted::Duplicate`], not a refusal: a gateway re-sends what it has
//! no acknowledgement for, and the answer lets it drop the batch.
//!
//! Batches must arrive in order; the verifier keeps no out-of-order
//! buffer. A batch that arrives before its predecessor is refused `gap`,
//! and accepted when the gateway sends it again after the predecessor.
//!
//! # State
//!
//! Per gateway the verifier keeps a [`ChainState`]: the last accepted
//! `seq` and the digests of the most recent accepted batches, newest last
//! (the newest is the chain's head). It is plain data, serde-serialisable,
//! so the control plane can persist it after each acceptance and hand it
//! back to [`ChainVerifier::register`] after a restart.
//!
//! # Limits
//!
//! - A payload is at most [`MAX_PAYLOAD_LEN`] bytes; [`BatchWriter::seal`]
//!   refuses to make a larger one, and the verifier refuses to parse one.
//! - The verifier remembers the digests of the last `window` batches per
//!   gateway ([`DEFAULT_DIGEST_WINDOW`] unless set with
//!   [`ChainVerifier::with_window`]): about 100 bytes each. A re-sent batch
//!   older than that is refused `stale` rather than answered `Duplicate`,
//!   so the window must be larger than the number of batches a gateway may
//!   hold unacknowledged.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::digest::{is_sha384_hex, sha384_hex};
use crate::signing::{key_id_for, verify, GatewayKey, Kind, Signed};

/// What a gateway's first batch names as its predecessor: 96 zeros, the
/// form of a SHA-384 digest but the digest of no known input.
pub const GENESIS_DIGEST: &str = "000000000000000000000000000000000000000000000000\
                                  000000000000000000000000000000000000000000000000";

/// The largest batch payload sealed or parsed: 32 MiB. A batch of 1,000
/// records of ~400 bytes is ~400 KiB, so this is ample headroom for large
/// records, and bounds what one delivery can make the control plane parse.
pub const MAX_PAYLOAD_LEN: usize = 32 << 20;

/// How many accepted digests per gateway a [`ChainVerifier`] keeps by
/// default, to tell a re-sent batch (`Duplicate`) from a different one with
/// the same number (`replayed_different`): 1,024, about 100 KiB per
/// gateway. A gateway holds fewer unacknowledged batches than that.
pub const DEFAULT_DIGEST_WINDOW: usize = 1024;

/// A batch's header: every payload field but the records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchHeader {
    /// The sealing gateway.
    pub gateway_id: String,
    /// 1, 2, 3, … per gateway.
    pub seq: u64,
    /// Digest of the batch with `seq - 1`, or [`GENESIS_DIGEST`].
    pub prev_digest: String,
    /// When the batch was sealed (RFC 3339 by convention).
    pub created_at: String,
    /// The number of records.
    pub count: u32,
}

/// The payload as written: fields in the documented order.
#[derive(Serialize)]
struct PayloadOut<'a> {
    gateway_id: &'a str,
    seq: u64,
    prev_digest: &'a str,
    created_at: &'a str,
    count: u32,
    records: &'a [&'a RawValue],
}

/// The payload as read; records borrowed from the payload, verbatim.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PayloadIn<'a> {
    gateway_id: String,
    seq: u64,
    prev_digest: String,
    created_at: String,
    count: u32,
    #[serde(borrow)]
    records: Vec<&'a RawValue>,
}

/// The payload of a batch with `header` and `records` (see the module
/// docs for the encoding).
///
/// Each record must be exactly one JSON object, with no whitespace before
/// or after it, and `header.count` must be the number of records.
pub fn batch_payload<R: AsRef<[u8]>>(
    header: &BatchHeader,
    records: &[R],
) -> Result<Vec<u8>, SealError> {
    if usize::try_from(header.count).ok() != Some(records.len()) {
        return Err(SealError::CountMismatch {
            count: header.count,
            records: records.len(),
        });
    }
    let mut raw = Vec::with_capacity(records.len());
    let mut len = 256 + header.gateway_id.len() + header.created_at.len();
    for (index, record) in records.iter().enumerate() {
        let bytes = record.as_ref();
        let value: &RawValue =
            serde_json::from_slice(bytes).map_err(|e| SealError::NotAnObject {
                index,
                reason: json_error(&e),
            })?;
        if !value.get().starts_with('{') || value.get().len() != bytes.len() {
            return Err(SealError::NotAnObject {
                index,
                reason: "not exactly one JSON object without surrounding whitespace".into(),
            });
        }
        len += bytes.len() + 1;
        raw.push(value);
    }
    if len > MAX_PAYLOAD_LEN {
        return Err(SealError::TooLarge { len });
    }
    let mut out = Vec::with_capacity(len);
    serde_json::to_writer(
        &mut out,
        &PayloadOut {
            gateway_id: &header.gateway_id,
            seq: header.seq,
            prev_digest: &header.prev_digest,
            created_at: &header.created_at,
            count: header.count,
            records: &raw,
        },
    )
    .expect("strings and raw JSON always serialise into a Vec");
    if out.len() > MAX_PAYLOAD_LEN {
        return Err(SealError::TooLarge { len: out.len() });
    }
    Ok(out)
}

/// The records of a batch payload, each as its exact bytes, after checking
/// the payload is in the canonical encoding (not its signature: verify
/// that first). For sealing the same records again (a spool repair).
pub fn batch_records(payload: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let (_, records) = parse_batch(payload)?;
    Ok(records
        .iter()
        .map(|r| r.get().as_bytes().to_vec())
        .collect())
}

/// The gateway id and seq a batch payload claims, unverified (empty and 0
/// when it names none): to name a batch in a rejection record or a spool
/// file before, or instead of, checking it.
pub fn claimed_header(payload: &[u8]) -> (String, u64) {
    #[derive(Deserialize)]
    struct Claimed {
        #[serde(default)]
        gateway_id: String,
        #[serde(default)]
        seq: u64,
    }
    serde_json::from_slice::<Claimed>(payload)
        .map(|c| (c.gateway_id, c.seq))
        .unwrap_or_default()
}

/// Parses a batch payload, insisting on the exact encoding `batch_payload`
/// writes. The reason never quotes the payload.
fn parse_batch(payload: &[u8]) -> Result<(BatchHeader, Vec<&RawValue>), String> {
    if payload.len() > MAX_PAYLOAD_LEN {
        return Err(format!(
            "payload is {} bytes, over the {MAX_PAYLOAD_LEN}-byte limit",
            payload.len()
        ));
    }
    let parsed: PayloadIn<'_> = serde_json::from_slice(payload).map_err(|e| json_error(&e))?;
    if usize::try_from(parsed.count).ok() != Some(parsed.records.len()) {
        return Err(format!(
            "count is {} but {} records follow",
            parsed.count,
            parsed.records.len()
        ));
    }
    if parsed.seq == 0 {
        return Err("seq is 0; a gateway's first batch is 1".into());
    }
    if let Some(index) = parsed
        .records
        .iter()
        .position(|r| !r.get().starts_with('{'))
    {
        return Err(format!("record {index} is not a JSON object"));
    }
    // Canonical: writing the parsed fields again gives the same bytes.
    let mut same = SameBytes { rest: payload };
    let written = serde_json::to_writer(
        &mut same,
        &PayloadOut {
            gateway_id: &parsed.gateway_id,
            seq: parsed.seq,
            prev_digest: &parsed.prev_digest,
            created_at: &parsed.created_at,
            count: parsed.count,
            records: &parsed.records,
        },
    );
    if written.is_err() || !same.rest.is_empty() {
        return Err("not in the canonical batch encoding".into());
    }
    let header = BatchHeader {
        gateway_id: parsed.gateway_id,
        seq: parsed.seq,
        prev_digest: parsed.prev_digest,
        created_at: parsed.created_at,
        count: parsed.count,
    };
    Ok((header, parsed.records))
}

/// A writer that checks its input against expected bytes instead of
/// storing it: re-encoding a payload to compare costs no allocation.
pub(crate) struct SameBytes<'a> {
    pub(crate) rest: &'a [u8],
}

impl io::Write for SameBytes<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.rest.strip_prefix(buf) {
            Some(rest) => {
                self.rest = rest;
                Ok(buf.len())
            }
            None => Err(io::ErrorKind::InvalidData.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A JSON error as its category and position: never the offending text,
/// which a record could have put there.
pub(crate) fn json_error(e: &serde_json::Error) -> String {
    let category = match e.classify() {
        serde_json::error::Category::Io => "I/O error",
        serde_json::error::Category::Syntax => "JSON syntax error",
        serde_json::error::Category::Data => "unexpected JSON content",
        serde_json::error::Category::Eof => "truncated JSON",
    };
    format!("{category} at line {} column {}", e.line(), e.column())
}

/// Why [`BatchWriter::seal`] or [`batch_payload`] made no batch. Nothing
/// changes in the writer when sealing fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// A record is not one JSON object without surrounding whitespace.
    #[error("record {index} cannot go into a batch: {reason}")]
    NotAnObject {
        /// Its position in the list.
        index: usize,
        /// What is wrong, without the record's contents.
        reason: String,
    },
    /// The payload would exceed [`MAX_PAYLOAD_LEN`].
    #[error("a batch of {len} bytes is over the {MAX_PAYLOAD_LEN}-byte limit")]
    TooLarge {
        /// The payload's length (or a lower bound of it).
        len: usize,
    },
    /// The header's count is not the number of records (or more than a
    /// `u32` holds).
    #[error("header count {count} but {records} records")]
    CountMismatch {
        /// The header's count.
        count: u32,
        /// The records given.
        records: usize,
    },
    /// The writer has sealed `u64::MAX` batches.
    #[error("sequence numbers exhausted")]
    SeqExhausted,
}

/// The gateway's side: numbers, links and signs each batch.
///
/// The writer advances with each successful [`seal`](BatchWriter::seal).
/// The gateway must store each sealed batch (it keeps them until they are
/// acknowledged anyway) before it relies on the writer's new position, and
/// after a restart [`restore`](BatchWriter::restore) the writer from the
/// last batch it stored: a writer that forgot a sealed batch would seal a
/// different one with the same number, which the control plane refuses
/// `replayed_different` (if the first was delivered) or `broken_chain`.
pub struct BatchWriter {
    key: Arc<GatewayKey>,
    gateway_id: String,
    // invariant: `next_seq` is one more than the seq of the batch whose
    // payload digest is `last_digest` (GENESIS_DIGEST when `next_seq` is 1).
    next_seq: u64,
    last_digest: String,
}

impl BatchWriter {
    /// A writer for a gateway that has sealed nothing yet: the first batch
    /// is `seq` 1 and links to [`GENESIS_DIGEST`].
    pub fn new(key: Arc<GatewayKey>, gateway_id: impl Into<String>) -> Self {
        Self::restore(key, gateway_id, 0, GENESIS_DIGEST.to_owned())
    }

    /// A writer that continues after the batch with `last_seq` and
    /// `last_digest` (0 and [`GENESIS_DIGEST`] if none).
    pub fn restore(
        key: Arc<GatewayKey>,
        gateway_id: impl Into<String>,
        last_seq: u64,
        last_digest: String,
    ) -> Self {
        BatchWriter {
            key,
            gateway_id: gateway_id.into(),
            next_seq: last_seq.saturating_add(1),
            last_digest,
        }
    }

    /// Seals `records`, in order, as the next batch, stamped `created_at`.
    ///
    /// Each record is one JSON object, as serialised by the gateway (see
    /// [`batch_payload`]). An empty list makes a batch of 0 records.
    pub fn seal<R: AsRef<[u8]>>(
        &mut self,
        created_at: &str,
        records: &[R],
    ) -> Result<Signed, SealError> {
        let count = u32::try_from(records.len()).map_err(|_| SealError::CountMismatch {
            count: u32::MAX,
            records: records.len(),
        })?;
        let after = self
            .next_seq
            .checked_add(1)
            .ok_or(SealError::SeqExhausted)?;
        let header = BatchHeader {
            gateway_id: self.gateway_id.clone(),
            seq: self.next_seq,
            prev_digest: self.last_digest.clone(),
            created_at: created_at.to_owned(),
            count,
        };
        let payload = batch_payload(&header, records)?;
        self.last_digest = sha384_hex(&payload);
        self.next_seq = after;
        Ok(self.key.sign(Kind::Batch, payload))
    }

    /// The gateway id every batch carries.
    pub fn gateway_id(&self) -> &str {
        &self.gateway_id
    }

    /// The seq of the next batch.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The digest the next batch links to.
    pub fn last_digest(&self) -> &str {
        &self.last_digest
    }
}

impl fmt::Debug for BatchWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchWriter")
            .field("key", &self.key)
            .field("gateway_id", &self.gateway_id)
            .field("next_seq", &self.next_seq)
            .field("last_digest", &self.last_digest)
            .finish()
    }
}

/// What the verifier knows of one gateway's chain: the last accepted seq
/// and the digests of recent accepted batches.
///
/// Serialised as `{"last_seq":12,"recent":["<digest of 10>","<of 11>","<of
/// 12>"]}`; deserialising checks the same invariants as
/// [`ChainState::new`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ChainStateFields")]
pub struct ChainState {
    /// 0 before the first batch.
    last_seq: u64,
    // invariant: `recent[i]` is the digest of batch
    // `last_seq + 1 - recent.len() + i`; empty iff `last_seq` is 0; never
    // longer than `last_seq`; each is 96 lowercase hex digits.
    recent: VecDeque<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChainStateFields {
    last_seq: u64,
    recent: Vec<String>,
}

impl TryFrom<ChainStateFields> for ChainState {
    type Error = ChainStateError;

    fn try_from(fields: ChainStateFields) -> Result<Self, Self::Error> {
        ChainState::new(fields.last_seq, fields.recent)
    }
}

impl Default for ChainState {
    fn default() -> Self {
        Self::genesis()
    }
}

impl ChainState {
    /// A gateway that has delivered nothing yet.
    pub fn genesis() -> Self {
        ChainState {
            last_seq: 0,
            recent: VecDeque::new(),
        }
    }

    /// The state after batch `last_seq`, with `recent` the digests of the
    /// batches up to it, oldest first, its own last (as many as the caller
    /// kept: at least that one, unless `last_seq` is 0).
    pub fn new(last_seq: u64, recent: Vec<String>) -> Result<Self, ChainStateError> {
        let reason = if last_seq == 0 && !recent.is_empty() {
            "digests given before any batch"
        } else if last_seq > 0 && recent.is_empty() {
            "no digest for the last batch"
        } else if recent.len() as u64 > last_seq {
            "more digests than batches"
        } else if !recent.iter().all(|d| is_sha384_hex(d)) {
            "a digest is not 96 lowercase hex digits"
        } else {
            return Ok(ChainState {
                last_seq,
                recent: recent.into(),
            });
        };
        Err(ChainStateError { last_seq, reason })
    }

    /// The seq of the last accepted batch; 0 before the first.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The digest the next batch must link to.
    pub fn last_digest(&self) -> &str {
        self.recent.back().map_or(GENESIS_DIGEST, String::as_str)
    }

    /// The kept digests, oldest first, the last accepted batch's last.
    pub fn recent(&self) -> impl ExactSizeIterator<Item = &str> {
        self.recent.iter().map(String::as_str)
    }

    /// The digest of accepted batch `seq`, if still kept.
    fn digest_of(&self, seq: u64) -> Option<&str> {
        let back = self.last_seq.checked_sub(seq)?;
        let back = usize::try_from(back).ok()?;
        let index = self.recent.len().checked_sub(back + 1)?;
        self.recent.get(index).map(String::as_str)
    }

    fn push(&mut self, digest: String, window: usize) {
        self.last_seq += 1;
        self.recent.push_back(digest);
        self.trim(window);
    }

    fn trim(&mut self, window: usize) {
        // Keep at least the head: the next batch links to it.
        while self.recent.len() > window.max(1) {
            self.recent.pop_front();
        }
    }
}

/// A [`ChainState`] that breaks its invariants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("chain state after seq {last_seq} is inconsistent: {reason}")]
pub struct ChainStateError {
    /// The state's last seq.
    pub last_seq: u64,
    /// What is wrong.
    pub reason: &'static str,
}

/// What [`ChainVerifier::accept`] took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// The next batch of its gateway's chain, now its head.
    New {
        /// The batch's header.
        header: BatchHeader,
        /// The records in order, each one JSON object exactly as the
        /// gateway serialised it.
        records: Vec<String>,
        /// The payload's digest, which the next batch links to.
        digest: String,
    },
    /// A batch accepted before, byte for byte: acknowledge it again, keep
    /// nothing.
    Duplicate {
        /// Its gateway.
        gateway_id: String,
        /// Its seq.
        seq: u64,
    },
}

/// Why [`ChainVerifier::accept`] refused a batch. See the module docs for
/// the order of the checks.
///
/// The text is for people; match on the variant or use
/// [`as_str`](Rejection::as_str).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The envelope holds another kind than a batch.
    #[error("expected a signed batch, got a signed {got}")]
    WrongKind {
        /// The envelope's kind.
        got: Kind,
    },
    /// Not a batch payload in the canonical encoding.
    #[error("batch is malformed: {reason}")]
    Malformed {
        /// What is wrong, without the payload's contents.
        reason: String,
    },
    /// No key is registered for the batch's gateway.
    #[error("no key is registered for gateway {gateway_id:?}")]
    UnknownGateway {
        /// The payload's gateway id.
        gateway_id: String,
    },
    /// The signature does not verify under the gateway's registered key.
    #[error("batch does not verify under the key of gateway {gateway_id:?} (envelope names key {key_id:?})")]
    BadSignature {
        /// The payload's gateway id.
        gateway_id: String,
        /// The key id the envelope names.
        key_id: String,
    },
    /// A batch between the last accepted and this one is missing.
    #[error("gateway {gateway_id:?} sent batch {got}, expected {expected}")]
    Gap {
        /// The gateway.
        gateway_id: String,
        /// The next seq the chain can take.
        expected: u64,
        /// The batch's seq.
        got: u64,
    },
    /// The batch does not link to the last accepted one.
    #[error("batch {seq} of gateway {gateway_id:?} links to {got}, not to the last accepted batch {expected}")]
    BrokenChain {
        /// The gateway.
        gateway_id: String,
        /// The batch's seq.
        seq: u64,
        /// The last accepted batch's digest.
        expected: String,
        /// The batch's `prev_digest`.
        got: String,
    },
    /// Another batch with this seq was accepted.
    #[error("gateway {gateway_id:?} already delivered a different batch {seq}")]
    ReplayedDifferent {
        /// The gateway.
        gateway_id: String,
        /// The batch's seq.
        seq: u64,
    },
    /// This seq was accepted too long ago to compare.
    #[error("batch {seq} of gateway {gateway_id:?} is older than the kept digests (oldest kept: {oldest_kept})")]
    Stale {
        /// The gateway.
        gateway_id: String,
        /// The batch's seq.
        seq: u64,
        /// The oldest seq whose digest is kept.
        oldest_kept: u64,
    },
}

impl Rejection {
    /// Every variant's stable name, in declaration order: what metrics are
    /// labelled with before the first rejection. [`as_str`](Self::as_str)
    /// indexes into it, so a new variant needs its name here (an index past
    /// the end does not compile).
    pub const REASONS: [&'static str; 8] = [
        "wrong_kind",
        "malformed",
        "unknown_gateway",
        "bad_signature",
        "gap",
        "broken_chain",
        "replayed_different",
        "stale",
    ];

    /// The stable snake_case name of the refusal.
    pub const fn as_str(&self) -> &'static str {
        Self::REASONS[match self {
            Rejection::WrongKind { .. } => 0,
            Rejection::Malformed { .. } => 1,
            Rejection::UnknownGateway { .. } => 2,
            Rejection::BadSignature { .. } => 3,
            Rejection::Gap { .. } => 4,
            Rejection::BrokenChain { .. } => 5,
            Rejection::ReplayedDifferent { .. } => 6,
            Rejection::Stale { .. } => 7,
        }]
    }
}

/// Every reason a control plane refuses a batch with (the `reason` of a
/// `REJECTED` acknowledgement): the verifier's ([`Rejection::REASONS`]),
/// and [`talos_contract::role::CERTIFICATE_MISMATCH`] for a batch whose
/// gateway id the client certificate does not name. Both sides label their
/// rejection counters with these, at 0 from the start.
pub fn ack_rejection_reasons() -> impl Iterator<Item = &'static str> {
    Rejection::REASONS
        .into_iter()
        .chain([talos_contract::role::CERTIFICATE_MISMATCH])
}

/// One registered gateway.
#[derive(Debug)]
struct Gateway {
    public_key: [u8; 32],
    state: ChainState,
}

/// The control plane's side: checks each gateway's batches against its
/// registered key and its chain (see the module docs).
///
/// Sans-IO: the caller receives envelopes, calls
/// [`accept`](ChainVerifier::accept), stores what was accepted together
/// with [`state`](ChainVerifier::state), and acknowledges.
///
/// # Memory usage
///
/// Per registered gateway: its key and at most `window` digests.
#[derive(Debug)]
pub struct ChainVerifier {
    gateways: BTreeMap<String, Gateway>,
    window: usize,
}

impl Default for ChainVerifier {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainVerifier {
    /// A verifier with no gateways, keeping [`DEFAULT_DIGEST_WINDOW`]
    /// digests per gateway.
    pub fn new() -> Self {
        Self::with_window(DEFAULT_DIGEST_WINDOW)
    }

    /// A verifier keeping `window` digests per gateway (at least 1: the
    /// chain's head).
    pub fn with_window(window: usize) -> Self {
        ChainVerifier {
            gateways: BTreeMap::new(),
            window: window.max(1),
        }
    }

    /// Registers `gateway_id`'s public key with its chain `state`
    /// ([`ChainState::genesis`] for a new gateway, or what was persisted),
    /// replacing any earlier registration of that id.
    pub fn register(
        &mut self,
        gateway_id: impl Into<String>,
        public_key: [u8; 32],
        state: ChainState,
    ) {
        let mut state = state;
        state.trim(self.window);
        self.gateways
            .insert(gateway_id.into(), Gateway { public_key, state });
    }

    /// The chain state of `gateway_id`, to persist after an acceptance.
    pub fn state(&self, gateway_id: &str) -> Option<&ChainState> {
        self.gateways.get(gateway_id).map(|g| &g.state)
    }

    /// Checks `signed` as the next batch of its gateway (see the module
    /// docs for the checks and refusals). On `New` the batch becomes the
    /// chain's head; on `Duplicate` or a refusal nothing changes.
    pub fn accept(&mut self, signed: &Signed) -> Result<Accepted, Rejection> {
        if signed.kind != Kind::Batch {
            return Err(Rejection::WrongKind { got: signed.kind });
        }
        let (header, records) =
            parse_batch(&signed.payload).map_err(|reason| Rejection::Malformed { reason })?;
        let Some(gateway) = self.gateways.get_mut(&header.gateway_id) else {
            return Err(Rejection::UnknownGateway {
                gateway_id: header.gateway_id,
            });
        };
        if verify(&gateway.public_key, signed).is_err() {
            return Err(Rejection::BadSignature {
                gateway_id: header.gateway_id,
                key_id: signed.key_id.clone(),
            });
        }

        let state = &mut gateway.state;
        let digest = sha384_hex(&signed.payload);
        let expected = state.last_seq + 1;
        if header.seq > expected {
            return Err(Rejection::Gap {
                gateway_id: header.gateway_id,
                expected,
                got: header.seq,
            });
        }
        if header.seq < expected {
            return match state.digest_of(header.seq) {
                Some(known) if known == digest => Ok(Accepted::Duplicate {
                    gateway_id: header.gateway_id,
                    seq: header.seq,
                }),
                Some(_) => Err(Rejection::ReplayedDifferent {
                    gateway_id: header.gateway_id,
                    seq: header.seq,
                }),
                None => Err(Rejection::Stale {
                    gateway_id: header.gateway_id,
                    seq: header.seq,
                    oldest_kept: expected - state.recent.len() as u64,
                }),
            };
        }
        if header.prev_digest != state.last_digest() {
            return Err(Rejection::BrokenChain {
                gateway_id: header.gateway_id,
                seq: header.seq,
                expected: state.last_digest().to_owned(),
                got: header.prev_digest,
            });
        }
        state.push(digest.clone(), self.window);
        let records = records.into_iter().map(|r| r.get().to_owned()).collect();
        Ok(Accepted::New {
            header,
            records,
            digest,
        })
    }

    /// The id of the key registered for `gateway_id`.
    pub fn key_id(&self, gateway_id: &str) -> Option<String> {
        self.gateways
            .get(gateway_id)
            .map(|g| key_id_for(&g.public_key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rejection_has_its_own_name() {
        let id = || "gw-a".to_owned();
        let every = [
            Rejection::WrongKind {
                got: Kind::Decision,
            },
            Rejection::Malformed { reason: "x".into() },
            Rejection::UnknownGateway { gateway_id: id() },
            Rejection::BadSignature {
                gateway_id: id(),
                key_id: String::new(),
            },
            Rejection::Gap {
                gateway_id: id(),
                expected: 2,
                got: 3,
            },
            Rejection::BrokenChain {
                gateway_id: id(),
                seq: 2,
                expected: String::new(),
                got: String::new(),
            },
            Rejection::ReplayedDifferent {
                gateway_id: id(),
                seq: 2,
            },
            Rejection::Stale {
                gateway_id: id(),
                seq: 1,
                oldest_kept: 5,
            },
        ];
        let names: Vec<&str> = every.iter().map(Rejection::as_str).collect();
        assert_eq!(names, Rejection::REASONS);
        let answered: Vec<&str> = ack_rejection_reasons().collect();
        assert_eq!(answered.len(), Rejection::REASONS.len() + 1);
        assert_eq!(answered.last(), Some(&"certificate_mismatch"));
    }
}
