//! Recovery: what an earlier process left in its journal, read at start
//! before the first connection (see the module docs of
//! [`crate::records::journal`]).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{create_dir, io_err, JournalError, OpensLine, INSTANCE, OPENS};
use crate::records::record::{now, Record, Verdict};

/// What an earlier process left, read by [`recover`].
#[derive(Debug, Default)]
pub struct Recovered {
    /// Entries to seal before any new one: unsealed records and reports of
    /// the earlier process, then the records of connections its crash cut.
    pub entries: Vec<Vec<u8>>,
    /// How many of `entries` are records of connections cut by the crash.
    pub cut_by_crash: u64,
    /// The instance that wrote the journal before, if known.
    pub previous_instance: Option<String>,
    /// The files read, deleted once the entries are written again.
    pub(super) old_files: Vec<PathBuf>,
    /// Directories of later generations, removed once emptied.
    pub(super) old_dirs: Vec<PathBuf>,
    /// Crash records kept apart while the directories are read.
    pub(super) cut_entries: Vec<Vec<u8>>,
    /// The next segment number.
    pub(super) next_segment: u64,
}

impl Recovered {
    /// Nothing recovered: a successor's journal, fresh.
    pub fn fresh() -> Recovered {
        Recovered {
            next_segment: 1,
            ..Recovered::default()
        }
    }

    /// Whether nothing was left to recover.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Delete what was read (its entries are sealed): the files, then the
    /// directories of later generations.
    pub fn discard(&self) {
        for f in &self.old_files {
            let _ = std::fs::remove_file(f);
        }
        for d in &self.old_dirs {
            let _ = std::fs::remove_file(d.join(INSTANCE));
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Read what an earlier process left in `dir` (the journal directory,
/// made mode 0700 if missing): see the module docs. `sealed_through` is
/// the last batch in the spool's chain; `gateway_id` and `instance` name
/// the new process, which the cut records are written by.
pub fn recover(
    dir: &Path,
    sealed_through: u64,
    gateway_id: &Arc<str>,
    instance: &Arc<str>,
) -> Result<Recovered, JournalError> {
    let mut out = begin(dir)?;
    recover_one(dir, sealed_through, gateway_id, instance, &mut out)?;
    out.entries.append(&mut out.cut_entries);
    Ok(out)
}

/// [`recover`] for a cold start: `dir`, then the journal of every later
/// generation of the process that wrote it (`gen-<g>`, see
/// [`generation_dir`]), oldest first, as they would have been sealed.
/// Their directories go once the entries are written again.
pub fn recover_all(
    dir: &Path,
    sealed_through: u64,
    gateway_id: &Arc<str>,
    instance: &Arc<str>,
) -> Result<Recovered, JournalError> {
    let mut generations: Vec<(u64, PathBuf)> = Vec::new();
    if dir.is_dir() {
        for item in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let item = item.map_err(io_err(dir))?;
            let name = item.file_name();
            if let Some(g) = name
                .to_str()
                .and_then(|n| n.strip_prefix("gen-"))
                .and_then(|g| g.parse::<u64>().ok())
            {
                if item.path().is_dir() {
                    generations.push((g, item.path()));
                }
            }
        }
    }
    generations.sort();
    let mut out = begin(dir)?;
    recover_one(dir, sealed_through, gateway_id, instance, &mut out)?;
    let next_segment = out.next_segment;
    // Every generation's unsealed segments in turn, then every crash
    // record (kept apart in `cut_entries` until the end).
    for (_, gen_dir) in generations {
        recover_one(&gen_dir, sealed_through, gateway_id, instance, &mut out)?;
        out.old_dirs.push(gen_dir);
    }
    out.next_segment = next_segment;
    out.entries.append(&mut out.cut_entries);
    Ok(out)
}

/// Nothing recovered yet from `dir`, made (mode 0700) if missing: only
/// the instance that wrote it before, if its file says.
fn begin(dir: &Path) -> Result<Recovered, JournalError> {
    create_dir(dir)?;
    Ok(Recovered {
        previous_instance: std::fs::read_to_string(dir.join(INSTANCE))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty()),
        ..Recovered::default()
    })
}

/// Read one journal directory into `out`.
fn recover_one(
    dir: &Path,
    sealed_through: u64,
    gateway_id: &Arc<str>,
    instance: &Arc<str>,
    out: &mut Recovered,
) -> Result<(), JournalError> {
    // Segments, oldest first.
    let mut segments: Vec<(u64, PathBuf)> = Vec::new();
    for item in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let item = item.map_err(io_err(dir))?;
        let name = item.file_name();
        let name = name.to_string_lossy();
        if let Some(n) = name
            .strip_prefix("seg-")
            .and_then(|r| r.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            segments.push((n, item.path()));
        } else if name.ends_with(".tmp") {
            let _ = std::fs::remove_file(item.path());
        }
    }
    segments.sort();
    out.next_segment = segments.last().map_or(1, |(n, _)| n + 1);
    // (instance, conn) of every record found unsealed: its connection
    // needs no record cut by the crash.
    let mut recorded: HashSet<(String, u64)> = HashSet::new();
    for (_, path) in &segments {
        let lines = read_lines(path)?;
        let sealed = lines
            .last()
            .and_then(|l| serde_json::from_slice::<Trailer>(l).ok())
            .is_some_and(|t| t.sealing_as <= sealed_through);
        for line in lines {
            if serde_json::from_slice::<Trailer>(&line).is_ok() {
                continue;
            }
            if let Ok(id) = serde_json::from_slice::<ConnId>(&line) {
                recorded.insert((id.instance, id.conn));
            }
            if !sealed {
                out.entries.push(line);
            }
        }
        out.old_files.push(path.clone());
    }

    // Connections opened and never recorded.
    let opens_path = dir.join(OPENS);
    if opens_path.exists() {
        let mut owner: Option<String> = None;
        let mut open: HashMap<u64, Open> = HashMap::new();
        let mut order: Vec<u64> = Vec::new();
        for line in read_lines(&opens_path)? {
            let Ok(entry) = serde_json::from_slice::<OpensLine>(&line) else {
                continue;
            };
            match entry {
                OpensLine::Instance { instance } => owner = Some(instance),
                OpensLine::Open { conn, source, at } => {
                    order.push(conn);
                    open.insert(
                        conn,
                        Open {
                            source,
                            at,
                            passed: None,
                        },
                    );
                }
                OpensLine::Gate {
                    conn,
                    session_id,
                    attempt,
                    tenant,
                    sni,
                    via,
                    forwarded_to,
                    passthrough,
                } => {
                    if let Some(o) = open.get_mut(&conn) {
                        o.passed = Some(Passed {
                            session_id,
                            attempt,
                            tenant,
                            sni,
                            via,
                            forwarded_to,
                            passthrough,
                        });
                    }
                }
                OpensLine::Closed { conn } => {
                    open.remove(&conn);
                }
            }
        }
        let owner = owner.or_else(|| out.previous_instance.clone());
        let closed_at = now();
        for conn in order {
            let Some(o) = open.remove(&conn) else {
                continue;
            };
            if let Some(owner) = &owner {
                if recorded.contains(&(owner.clone(), conn)) {
                    continue;
                }
            }
            let record = cut_record(gateway_id, instance, owner.as_deref(), conn, o, &closed_at);
            if let Ok(bytes) = serde_json::to_vec(&record) {
                out.cut_entries.push(bytes);
                out.cut_by_crash += 1;
            }
        }
        out.old_files.push(opens_path);
    }
    Ok(())
}

/// The record of a connection a crash cut: what its opening lines say.
fn cut_record(
    gateway_id: &Arc<str>,
    instance: &Arc<str>,
    owner: Option<&str>,
    conn: u64,
    open: Open,
    closed_at: &str,
) -> Record {
    let source = open
        .source
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    // The record is the earlier process's connection: its instance, not
    // the one that writes it now.
    let owner: Arc<str> = owner.map_or_else(|| Arc::clone(instance), Arc::from);
    let mut record = Record::open(Arc::clone(gateway_id), owner, conn, source);
    record.opened_at = open.at;
    record.closed_at = closed_at.to_owned();
    record.cause = Some("cut_by_crash");
    record.cut = true;
    match open.passed {
        Some(g) => {
            record.session_id = Some(Arc::from(g.session_id.as_str()));
            record.attempt = Some(g.attempt);
            record.tenant = Some(Arc::from(g.tenant.as_str()));
            record.sni = Some(g.sni);
            // So that the certificate counts a forwarded connection the
            // crash cut once: by the holder's record, the hand-off beside.
            record.via = g.via.map(Arc::from);
            record.forwarded_to = g.forwarded_to.map(Arc::from);
            record.passthrough = g.passthrough;
            record.verdict = Verdict::Allowed;
        }
        None => record.verdict = Verdict::Undecided,
    }
    record
}

/// Every whole line of `path`; a last line the crash cut short (no
/// newline, or not JSON) is left out.
pub(super) fn read_lines(path: &Path) -> Result<Vec<Vec<u8>>, JournalError> {
    let file = File::open(path).map_err(io_err(path))?;
    let mut out = Vec::new();
    let mut reader = BufReader::new(file);
    loop {
        let mut line = Vec::new();
        let n = reader.read_until(b'\n', &mut line).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            break;
        }
        line.pop();
        if !line.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(&line).is_ok() {
            out.push(line);
        }
    }
    Ok(out)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Trailer {
    sealing_as: u64,
}

#[derive(serde::Deserialize)]
struct ConnId {
    instance: String,
    conn: u64,
}

/// A connection `opens.log` says was opened and not yet recorded.
#[derive(Debug)]
struct Open {
    source: String,
    at: String,
    /// Where the gate let it through, if it had.
    passed: Option<Passed>,
}

/// What the gate's line for a connection says: whose it was, for what name.
#[derive(Debug)]
struct Passed {
    session_id: String,
    attempt: u32,
    tenant: String,
    sni: String,
    via: Option<String>,
    forwarded_to: Option<String>,
    passthrough: bool,
}
