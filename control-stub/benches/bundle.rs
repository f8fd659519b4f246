//! What a certificate bundle costs: its size, the time `certificate
//! bundle` takes to write it from the store, and the time the independent
//! verifier (`verifier/verify_bundle.py`, a `python3` process, as a
//! reviewer runs it) takes to check it, for sessions of 1, 10,000 and
//! 100,000 connections.
//!
//! Each session is synthetic but real where it counts (talos-control-stub
//! `synth`): records of the gateway's shape in batches of 1,000 (the
//! gateway's default `batch_max_records`), signed by each member's own key
//! and accepted by the batch consumer, drop reports in the chains, a
//! decision signed by the relay, the certificate issued and signed; on a
//! SQLite store in a temporary folder. The verifier must say VERIFIED.
//!
//! `cargo bench -p talos-control-stub --bench bundle` measures 1, 10,000
//! and 100,000 (`-- --connections N` for others, repeatable; `-- --keep
//! DIR` keeps each bundle there as `bundle-N.jsonl`); one line of
//! JSON per session. Run by `cargo test` (the test command), it runs once
//! with 1 and 200 connections, as a smoke test that cannot rot; timing is
//! never judged there. `benches/bundle/README.md` has the figures.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use talos_control_stub::store::Db;
use talos_control_stub::synth::{self, Options};
use talos_control_stub::Store;

fn main() {
    let mut full = false;
    let mut counts: Vec<usize> = Vec::new();
    let mut keep: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => full = true,
            "--connections" => match args.next().map(|n| n.parse()) {
                Some(Ok(n)) => counts.push(n),
                _ => {
                    eprintln!("bundle bench: --connections needs a number");
                    std::process::exit(2);
                }
            },
            "--keep" => keep = args.next().map(Into::into),
            // What cargo passes to every bench target under `cargo test`.
            "--test" | "--nocapture" => {}
            other => {
                eprintln!("bundle bench: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    if counts.is_empty() {
        counts = if full {
            vec![1, 10_000, 100_000]
        } else {
            vec![1, 200]
        };
    }
    for n in counts {
        measure(n, keep.as_deref());
    }
}

/// One session of `n` connections: made, bundled, verified; the bundle
/// copied into `keep` (as `bundle-N.jsonl`) when given.
fn measure(n: usize, keep: Option<&Path>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(Db::File(tmp.path().join("stub.db"))).expect("store");
    let control = tmp.path().join("control");
    let made = Instant::now();
    let mut pair = synth::Pair::new(&mut store, &control).expect("pair");
    let id = pair
        .session(
            &mut store,
            &control,
            &Options {
                connections: n,
                per_batch: 1000,
                ..Options::default()
            },
        )
        .expect("session");
    let made = made.elapsed();

    let path = tmp.path().join("bundle.jsonl");
    let written = Instant::now();
    let summary =
        talos_control_stub::bundle::write_file(&store, &control, &id, &path).expect("bundle");
    let written = written.elapsed();

    let verifier = Path::new(env!("CARGO_MANIFEST_DIR")).join("../verifier/verify_bundle.py");
    // The verifier under bash's `time`, for its CPU time beside the wall
    // clock's (the figure a busy machine leaves standing).
    let checked = Instant::now();
    let out = Command::new("bash")
        .args([
            "-c",
            "TIMEFORMAT='cpu %U %S'; time python3 \"$0\" --quiet \"$1\"",
        ])
        .arg(&verifier)
        .arg(&path)
        .output()
        .expect("run the verifier");
    let checked = checked.elapsed();
    let cpu: f64 = String::from_utf8_lossy(&out.stderr)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("cpu "))
        .map(|t| t.split(' ').filter_map(|x| x.parse::<f64>().ok()).sum())
        .unwrap_or(f64::NAN);
    // What it takes to ship or store: gzip's default level.
    let gzipped = Command::new("gzip")
        .arg("-c")
        .arg(&path)
        .output()
        .map(|o| o.stdout.len())
        .unwrap_or(0);
    if let Some(dir) = keep {
        std::fs::copy(&path, dir.join(format!("bundle-{n}.jsonl"))).expect("keep the bundle");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("RESULT: VERIFIED"),
        "the bundle of {n} connections does not verify:\n{text}"
    );
    println!(
        "{}",
        serde_json::json!({
            "figure": "bundle",
            "connections": n,
            "batches": summary.batches,
            "bundle_bytes": summary.bytes,
            "bytes_per_connection": summary.bytes as f64 / n.max(1) as f64,
            "bundle_gzip_bytes": gzipped,
            "session_made_seconds": made.as_secs_f64(),
            "bundle_write_seconds": written.as_secs_f64(),
            "verify_seconds": checked.as_secs_f64(),
            "verify_cpu_seconds": cpu,
        })
    );
}
