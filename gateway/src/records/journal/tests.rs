//! The journal, written and recovered as a crash leaves it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::recovery::read_lines;
use super::*;
use crate::records::record::Record;

fn setup(
    dir: &Path,
    sealed: u64,
    instance: &str,
    max_records: usize,
) -> (
    RecordSink,
    WriterThread,
    tokio::sync::mpsc::Receiver<Segment>,
    Recovered,
) {
    setup_with(dir, sealed, instance, max_records, DataSync::disk())
}

/// [`setup`], the journal's writes made durable by `sync`.
fn setup_with(
    dir: &Path,
    sealed: u64,
    instance: &str,
    max_records: usize,
    sync: DataSync,
) -> (
    RecordSink,
    WriterThread,
    tokio::sync::mpsc::Receiver<Segment>,
    Recovered,
) {
    let gateway: Arc<str> = Arc::from("gw-a");
    let instance: Arc<str> = Arc::from(instance);
    let journal = dir.join(JOURNAL_DIR);
    let recovered = recover(&journal, sealed, &gateway, &instance).unwrap();
    let summary = Recovered {
        entries: recovered.entries.clone(),
        cut_by_crash: recovered.cut_by_crash,
        previous_instance: recovered.previous_instance.clone(),
        ..Recovered::default()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let (sink, thread) = start(WriterConfig {
        records_path: dir.join("records.jsonl"),
        journal: Some(JournalSetup {
            dir: journal,
            recovered,
            sealer: tx,
            max_records,
            interval: Duration::from_secs(3600),
            sync,
        }),
        gateway_id: gateway,
        instance,
        first_conn: 1,
    })
    .unwrap();
    (sink, thread, rx, summary)
}

fn src(n: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, n], 40000))
}

#[tokio::test]
async fn records_are_sealed_in_segments_and_nothing_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, thread, mut segments, _) = setup(dir.path(), 0, "00000000000000aa", 2);
    for n in 1..=3 {
        let r = sink.open(src(n)).await;
        sink.close(r).await;
    }
    let first = segments.recv().await.unwrap();
    assert_eq!(first.entries.len(), 2);
    sink.seal().await;
    let second = segments.recv().await.unwrap();
    assert_eq!(second.entries.len(), 1);
    drop(sink);
    thread.stop().await;
    let text = std::fs::read_to_string(dir.path().join("records.jsonl")).unwrap();
    let conns: Vec<u64> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["conn"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(conns, [1, 2, 3]);
}

/// Records closing together arrive in one round of the writer; the
/// segment still goes the moment it is full, each with its entries on
/// disk, so every batch but the last is exactly `max_records`.
#[tokio::test]
async fn a_round_larger_than_a_segment_fills_segments_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, thread, mut segments, _) = setup(dir.path(), 0, "00000000000000aa", 2);
    let mut opened = Vec::new();
    for n in 1..=7 {
        opened.push(sink.open(src(n)).await);
    }
    let mut closes = tokio::task::JoinSet::new();
    for r in opened {
        let sink = sink.clone();
        closes.spawn(async move { sink.close(r).await });
    }
    while closes.join_next().await.is_some() {}
    drop(sink);
    thread.stop().await;
    let mut sizes = Vec::new();
    while let Ok(segment) = segments.try_recv() {
        let on_disk = std::fs::read_to_string(&segment.path).unwrap();
        assert_eq!(on_disk.lines().count(), segment.entries.len());
        sizes.push(segment.entries.len());
    }
    assert_eq!(sizes, [2, 2, 2, 1]);
}

#[tokio::test]
async fn a_crash_leaves_open_connections_recorded_as_cut_and_unsealed_records_sealed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (sink, thread, mut segments, recovered) = setup(dir.path(), 0, "00000000000000aa", 100);
        assert!(recovered.previous_instance.is_none());
        // One connection recorded (unsealed), one through the gate and
        // open, one open before the gate.
        let done = sink.open(src(1)).await;
        sink.close(done).await;
        let mut gated = sink.open(src(2)).await;
        gated.session_id = Some(Arc::from("sess-1"));
        gated.attempt = Some(3);
        gated.tenant = Some(Arc::from("acme"));
        gated.sni = Some("api.example.com".into());
        gated.forwarded_to = Some(Arc::from("gw-b"));
        sink.let_through(&gated).await.wait().await;
        let early = sink.open(src(3)).await;
        // The writer takes entries in order: once this gate line (for a
        // connection never opened, which recovery ignores) is written,
        // so is `early`'s opening.
        sink.let_through(&Record::open(Arc::from("x"), Arc::from("y"), 999, src(9)))
            .await
            .wait()
            .await;
        // "Kill": the thread is left running with its files as they
        // are; nothing is sealed.
        std::mem::forget(gated);
        std::mem::forget(early);
        assert!(segments.try_recv().is_err());
        std::mem::forget(sink);
        std::mem::forget(thread);
    }
    let (sink, thread, mut segments, recovered) = setup(dir.path(), 0, "00000000000000bb", 100);
    assert_eq!(
        recovered.previous_instance.as_deref(),
        Some("00000000000000aa")
    );
    assert_eq!(recovered.cut_by_crash, 2);
    let entries: Vec<serde_json::Value> = recovered
        .entries
        .iter()
        .map(|e| serde_json::from_slice(e).unwrap())
        .collect();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0]["conn"], 1);
    assert_eq!(entries[0]["verdict"], "allowed");
    assert!(entries[0].get("cause").is_none());
    assert_eq!(entries[1]["conn"], 2);
    assert_eq!(entries[1]["instance"], "00000000000000aa");
    assert_eq!(entries[1]["verdict"], "allowed");
    assert_eq!(entries[1]["cause"], "cut_by_crash");
    assert_eq!(entries[1]["cut"], true);
    assert_eq!(entries[1]["session_id"], "sess-1");
    assert_eq!(entries[1]["sni"], "api.example.com");
    assert_eq!(entries[1]["forwarded_to"], "gw-b", "a hand-off stays one");
    assert!(entries[1].get("via").is_none());
    assert_eq!(entries[2]["conn"], 3);
    assert_eq!(entries[2]["verdict"], "undecided");
    assert!(entries[2]["session_id"].is_null());
    sink.seal().await;
    let seg = segments.recv().await.unwrap();
    assert_eq!(seg.entries.len(), 3);
    drop(sink);
    thread.stop().await;
    // A third start finds nothing: the segment is still there
    // (unsealed), but every connection is recorded.
    let gateway: Arc<str> = Arc::from("gw-a");
    let again = recover(
        &dir.path().join(JOURNAL_DIR),
        0,
        &gateway,
        &Arc::from("00000000000000cc"),
    )
    .unwrap();
    assert_eq!(again.cut_by_crash, 0);
    assert_eq!(
        again.entries.len(),
        3,
        "the unsealed segment is sealed again"
    );
}

#[tokio::test]
async fn a_segment_already_in_the_chain_is_not_sealed_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, thread, mut segments, _) = setup(dir.path(), 0, "00000000000000aa", 100);
    let r = sink.open(src(1)).await;
    sink.close(r).await;
    sink.seal().await;
    let seg = segments.recv().await.unwrap();
    // The sealer marked it and then died before deleting it.
    mark_sealing(&seg.path, 7).unwrap();
    drop(sink);
    thread.stop().await;
    let gateway: Arc<str> = Arc::from("gw-a");
    let instance: Arc<str> = Arc::from("00000000000000bb");
    let journal = dir.path().join(JOURNAL_DIR);
    let sealed = recover(&journal, 7, &gateway, &instance).unwrap();
    assert!(sealed.entries.is_empty());
    let not_yet = recover(&journal, 6, &gateway, &instance).unwrap();
    assert_eq!(not_yet.entries.len(), 1);
}

/// A writer of generation `g` of instance `aa` in `journal`'s
/// generation directory.
fn generation(
    dir: &Path,
    g: u64,
) -> (
    RecordSink,
    WriterThread,
    tokio::sync::mpsc::Receiver<Segment>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let (sink, thread) = start(WriterConfig {
        records_path: dir.join("records.jsonl"),
        journal: Some(JournalSetup {
            dir: generation_dir(&dir.join(JOURNAL_DIR), g),
            recovered: Recovered::fresh(),
            sealer: tx,
            max_records: 100,
            interval: Duration::from_secs(3600),
            sync: DataSync::disk(),
        }),
        gateway_id: Arc::from("gw-a"),
        instance: Arc::from("00000000000000aa"),
        first_conn: first_conn(g),
    })
    .unwrap();
    (sink, thread, rx)
}

/// Two generations of one instance (a process and its successor)
/// killed with records unsealed and connections open: a cold start
/// recovers both journals, the older's records first, every crash
/// record after them, each connection numbered in its generation; and
/// the successor's journal goes once it is written again.
#[tokio::test]
async fn a_cold_start_recovers_every_generations_journal_in_order() {
    let dir = tempfile::tempdir().unwrap();
    for g in [0, 1] {
        let (sink, thread, segments) = generation(dir.path(), g);
        let done = sink.open(src(1)).await;
        sink.close(done).await;
        let open = sink.open(src(2)).await;
        sink.let_through(&Record::open(
            Arc::from("x"),
            Arc::from("y"),
            u64::MAX,
            src(9),
        ))
        .await
        .wait()
        .await;
        std::mem::forget(open);
        std::mem::forget(sink);
        std::mem::forget(thread);
        std::mem::forget(segments);
    }
    let journal = dir.path().join(JOURNAL_DIR);
    assert!(journal.join("gen-1").is_dir());
    let gateway: Arc<str> = Arc::from("gw-a");
    let found = recover_all(&journal, 0, &gateway, &Arc::from("00000000000000bb")).unwrap();
    let entries: Vec<serde_json::Value> = found
        .entries
        .iter()
        .map(|e| serde_json::from_slice(e).unwrap())
        .collect();
    let conns: Vec<(u64, Option<&str>)> = entries
        .iter()
        .map(|e| (e["conn"].as_u64().unwrap(), e["cause"].as_str()))
        .collect();
    let g1 = first_conn(1);
    assert_eq!(
        conns,
        [
            (1, None),
            (g1, None),
            (2, Some("cut_by_crash")),
            (g1 + 1, Some("cut_by_crash")),
        ]
    );
    assert!(entries.iter().all(|e| e["instance"] == "00000000000000aa"));
    assert_eq!(found.cut_by_crash, 2);
    // Written again by the next writer: the successor's journal goes.
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let (sink, thread) = start(WriterConfig {
        records_path: dir.path().join("records.jsonl"),
        journal: Some(JournalSetup {
            dir: journal.clone(),
            recovered: found,
            sealer: tx,
            max_records: 100,
            interval: Duration::from_secs(3600),
            sync: DataSync::disk(),
        }),
        gateway_id: gateway,
        instance: Arc::from("00000000000000bb"),
        first_conn: 1,
    })
    .unwrap();
    drop(sink);
    thread.stop().await;
    assert!(!journal.join("gen-1").exists());
}

/// How long a test waits for what the writer thread does.
const DEADLINE: Duration = Duration::from_secs(30);

/// A sync that can be held: while `hold` is set, each sync says so on
/// `started` and waits until `release`.
struct Held {
    hold: Arc<std::sync::atomic::AtomicBool>,
    started: std::sync::mpsc::Receiver<std::path::PathBuf>,
    release: Option<std::sync::mpsc::Sender<()>>,
}

fn held_sync() -> (DataSync, Held) {
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (started_tx, started) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (started_tx, released) = (
        std::sync::Mutex::new(started_tx),
        std::sync::Mutex::new(released),
    );
    let held = Arc::clone(&hold);
    let sync = DataSync::watched(move |file, path| {
        if held.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = started_tx.lock().unwrap().send(path.to_owned());
            // Returns once the sender is dropped: released.
            let _ = released.lock().unwrap().recv();
        }
        file.sync_data()
    });
    (
        sync,
        Held {
            hold,
            started,
            release: Some(release),
        },
    )
}

/// A forwarder's hand-off record is the holder's to count: its close
/// hands it to the writer and returns, waiting for no sync (nor even the
/// write), while any other record's close returns only once its record is
/// synced. Here the writer is held in a sync: the hand-off's close
/// returns meanwhile; the other one's only after the sync is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_record_waits_for_no_sync_and_any_other_record_for_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (sync, mut held) = held_sync();
    let (sink, thread, _segments, _) = setup_with(dir.path(), 0, "00000000000000aa", 100, sync);
    let direct = sink.open(src(1)).await;
    let mut handed = sink.open(src(2)).await;
    handed.forwarded_to = Some(Arc::from("gw-b"));
    held.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let closing = tokio::spawn({
        let sink = sink.clone();
        async move { sink.close(direct).await }
    });
    // The writer is in a sync now (the record's, or the openings' before
    // it), and stays there.
    let started = held.started;
    let (started, in_sync) = tokio::task::spawn_blocking(move || {
        let got = started.recv_timeout(DEADLINE);
        (started, got)
    })
    .await
    .unwrap();
    in_sync.expect("the writer syncs");
    tokio::time::timeout(DEADLINE, sink.close(handed))
        .await
        .expect("a hand-off record's close waited for the writer's sync");
    assert!(
        !closing.is_finished(),
        "the other record's close waits for its sync"
    );
    held.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    drop(held.release.take());
    closing.await.unwrap();
    drop(started);
    drop(sink);
    thread.stop().await;
    let text = std::fs::read_to_string(dir.path().join("records.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let handed_over: Vec<(u64, bool)> = records
        .iter()
        .map(|r| (r["conn"].as_u64().unwrap(), r["forwarded_to"] == "gw-b"))
        .collect();
    let mut handed_over = handed_over;
    handed_over.sort_unstable();
    assert_eq!(handed_over, [(1, false), (2, true)], "both on the record");
}

/// A sync that notes, for each file, how much of it is durable: its
/// length at its last sync.
fn watched_sync() -> (
    DataSync,
    Arc<std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, u64>>>,
) {
    let durable = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let noted = Arc::clone(&durable);
    let sync = DataSync::watched(move |file, path| {
        let len = file.metadata()?.len();
        file.sync_data()?;
        noted.lock().unwrap().insert(path.to_owned(), len);
        Ok(())
    });
    (sync, durable)
}

/// A crash of the whole machine at any instant keeps of each journal
/// file what its last sync made durable. Hand-off records are synced in
/// groups: such a crash loses at most the last group of them (at most
/// [`HANDOFF_GROUP`], the latest), and no other record whose close has
/// returned; a hand-off lost may come back as cut by the crash (its gate
/// line was durable, its closing was not), never as anything else.
#[tokio::test]
async fn a_crash_of_the_machine_loses_at_most_the_last_group_of_hand_off_records() {
    let dir = tempfile::tempdir().unwrap();
    let (sync, durable) = watched_sync();
    let (sink, thread, _segments, _) = setup_with(dir.path(), 0, "00000000000000aa", 10_000, sync);
    let journal = dir.path().join(JOURNAL_DIR);
    // opens.log's first line was synced at the start (not through `sync`).
    let opens_at_start = std::fs::metadata(journal.join(OPENS)).unwrap().len();
    durable
        .lock()
        .unwrap()
        .insert(journal.join(OPENS), opens_at_start);
    let handed_count = 2 * HANDOFF_GROUP + 7;
    let mut handed = Vec::new();
    let mut direct = None;
    for n in 0..handed_count {
        let mut r = sink.open(src(2)).await;
        r.session_id = Some(Arc::from("sess-1"));
        r.attempt = Some(1);
        r.tenant = Some(Arc::from("acme"));
        r.sni = Some("api.example.com".into());
        r.forwarded_to = Some(Arc::from("gw-b"));
        sink.let_through(&r).await.wait().await;
        handed.push(r.conn);
        sink.close(r).await;
        if n == HANDOFF_GROUP / 2 {
            // A record that waits for its sync: every hand-off before it
            // is synced with it.
            let d = sink.open(src(1)).await;
            direct = Some(d.conn);
            sink.close(d).await;
        }
    }
    // Once this gate line is written, so is every record before it.
    sink.let_through(&Record::open(
        Arc::from("x"),
        Arc::from("y"),
        u64::MAX,
        src(9),
    ))
    .await
    .wait()
    .await;
    // The crash: each file as far as it was synced.
    let crashed = dir.path().join("crashed");
    std::fs::create_dir_all(&crashed).unwrap();
    let durable = durable.lock().unwrap().clone();
    for item in std::fs::read_dir(&journal).unwrap() {
        let path = item.unwrap().path();
        if !path.is_file() {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap();
        if name != INSTANCE {
            let kept = durable.get(&path).copied().unwrap_or(0);
            bytes.truncate(usize::try_from(kept).unwrap());
        }
        std::fs::write(crashed.join(name), bytes).unwrap();
    }
    drop(sink);
    thread.stop().await;

    let found = recover(
        &crashed,
        0,
        &Arc::from("gw-a"),
        &Arc::from("00000000000000bb"),
    )
    .unwrap();
    let entries: Vec<serde_json::Value> = found
        .entries
        .iter()
        .map(|e| serde_json::from_slice(e).unwrap())
        .collect();
    let whole: Vec<u64> = entries
        .iter()
        .filter(|e| e.get("cause").is_none())
        .map(|e| e["conn"].as_u64().unwrap())
        .collect();
    let direct = direct.unwrap();
    assert!(whole.contains(&direct), "the synced record is whole");
    let whole_handed: Vec<u64> = whole.iter().copied().filter(|c| *c != direct).collect();
    assert_eq!(
        whole_handed[..],
        handed[..whole_handed.len()],
        "the hand-offs kept are the earliest, in order"
    );
    assert!(
        whole_handed.len() > HANDOFF_GROUP / 2,
        "every hand-off before the synced record is kept"
    );
    let lost = handed.len() - whole_handed.len();
    assert!(
        lost <= HANDOFF_GROUP,
        "{lost} hand-off records lost: more than the last group"
    );
    for e in entries.iter().filter(|e| e.get("cause").is_some()) {
        assert_eq!(e["cause"], "cut_by_crash", "{e}");
        let conn = e["conn"].as_u64().unwrap();
        assert!(
            handed.contains(&conn) && !whole_handed.contains(&conn),
            "a lost hand-off, never twice: {e}"
        );
        // Its gate line durable: a hand-off, as the certificate lists it
        // (beside the holder's record, counted nowhere); its opening only:
        // `undecided`, as any connection whose gate line a crash of the
        // machine took.
        if e["verdict"] == "allowed" {
            assert_eq!(e["forwarded_to"], "gw-b", "{e}");
        } else {
            assert_eq!(e["verdict"], "undecided", "{e}");
        }
    }
}

#[test]
fn a_line_cut_short_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.log");
    std::fs::write(&path, b"{\"a\":1}\n{\"b\":2}\n{\"c\":").unwrap();
    assert_eq!(read_lines(&path).unwrap().len(), 2);
    std::fs::write(&path, b"{\"a\":1}\n{\"b\":2}").unwrap();
    assert_eq!(read_lines(&path).unwrap().len(), 1);
}
