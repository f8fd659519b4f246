//! A session's DNS counts and their tally: what its queries came to since
//! they last went on the record, kept with the session
//! ([`super::sessions::Session::dns`]) so that its end puts them on the
//! record before its drop report, and counted by the DNS answerer, which
//! puts them there at each interval.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::dns::query::Outcome;

/// Distinct refused names a session's tally tells apart in one interval;
/// past it the count says "at least".
const MAX_DISTINCT_REFUSED: usize = 4096;

/// One session's counts over one interval.
#[derive(Debug)]
struct Tally {
    tenant: Arc<str>,
    source: Option<IpAddr>,
    opened_at: String,
    since: Instant,
    counts: [u64; Outcome::ALL.len()],
    refused_names: HashSet<u64>,
    refused_names_more: bool,
    longest_refused_name: usize,
}

/// A session's DNS counts since they last went on the record: kept with
/// the session ([`super::sessions::Session::dns`]), so that its end puts them on the record
/// before its drop report ([`DnsCounts::take_record`]), and with the
/// answerer, which puts them there at each interval.
#[derive(Debug, Default)]
pub struct DnsCounts(Mutex<Option<Tally>>);

impl DnsCounts {
    /// The counts as their record (see [`tally_record`]), taken: `None`
    /// when there were none.
    pub fn take_record(
        &self,
        gateway_id: &str,
        instance: &str,
        session_id: &str,
        attempt: u32,
    ) -> Option<Vec<u8>> {
        let t = self.0.lock().ok()?.take()?;
        Some(tally_record(gateway_id, instance, session_id, attempt, &t))
    }

    /// Whether the counts began at least `interval` before `now`.
    pub fn due(&self, interval: Duration, now: Instant) -> bool {
        self.0
            .lock()
            .map(|t| {
                t.as_ref()
                    .is_some_and(|t| now.saturating_duration_since(t.since) >= interval)
            })
            .unwrap_or(false)
    }

    /// Count one query of a session of `tenant`'s from `source`;
    /// `refused`: the refused name's hash (under the answerer's hasher)
    /// and its length, never the name.
    pub fn add(
        &self,
        tenant: &Arc<str>,
        source: IpAddr,
        outcome: Outcome,
        refused: Option<(u64, usize)>,
    ) {
        let mut t = self.0.lock().expect("dns counts");
        let t = t.get_or_insert_with(|| Tally {
            tenant: Arc::clone(tenant),
            source: None,
            opened_at: now(),
            since: Instant::now(),
            counts: [0; Outcome::ALL.len()],
            refused_names: HashSet::new(),
            refused_names_more: false,
            longest_refused_name: 0,
        });
        t.source = Some(source);
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == outcome) {
            t.counts[i] += 1;
        }
        if let Some((h, len)) = refused {
            t.longest_refused_name = t.longest_refused_name.max(len);
            if t.refused_names.len() < MAX_DISTINCT_REFUSED {
                t.refused_names.insert(h);
            } else if !t.refused_names.contains(&h) {
                t.refused_names_more = true;
            }
        }
    }
}

/// A tally as its record: the session, the interval, the counts by
/// outcome (those not zero), and of the refused names only how many
/// distinct ones there were and the length of the longest.
fn tally_record(gateway_id: &str, instance: &str, id: &str, attempt: u32, t: &Tally) -> Vec<u8> {
    let mut queries = serde_json::Map::new();
    for (o, n) in Outcome::ALL.iter().zip(t.counts) {
        if n > 0 {
            queries.insert(o.as_str().to_owned(), n.into());
        }
    }
    let answered = t.counts[0];
    let total: u64 = t.counts.iter().sum();
    let record = serde_json::json!({
        "kind": "dns",
        "gateway_id": gateway_id,
        "instance": instance,
        "session_id": id,
        "attempt": attempt,
        "tenant": &*t.tenant,
        "source": t.source.map(|s| s.to_string()),
        "opened_at": t.opened_at,
        "closed_at": now(),
        "queries": queries,
        "answered": answered,
        "refused": total - answered,
        "refused_names": t.refused_names.len(),
        "refused_names_at_least": t.refused_names_more,
        "longest_refused_name": t.longest_refused_name,
    });
    serde_json::to_vec(&record).unwrap_or_default()
}

/// The time as the records write it (`crate::records::record::now`, a
/// module declared after this one): RFC 3339, in milliseconds.
fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}
