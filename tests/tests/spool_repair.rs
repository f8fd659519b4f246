//! The runbook's spool repair ("A spool blocked by a bad batch") in the
//! case it is written for: the control plane is away, batches pile up in
//! a member's spool, one of them — not the oldest — is damaged on disk,
//! and when the control plane is back it accepts the batches before the
//! damaged one and refuses that one `bad_signature`. The operator follows
//! the runbook: stop the member, `gateway spool verify`, `gateway spool
//! set-aside`, start the member again. The spool drains, and the session's
//! certificate is issued with the gap on it.
//!
//! Real processes: one `gateway` member (`gw-a`), `control-stub serve`
//! given it, the `control-stub` CLI, a TLS origin and a DNS server on
//! loopback, curl as the session. Every wait is on an event, bounded
//! ([`wait`]); every process is stopped by its PID.

use std::path::{Path, PathBuf};

use serde_json::Value;
use talos_e2e::clients::{curl_via, run_bounded};
use talos_e2e::gateway::workspace_bin;
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::wait;

const API: &str = "origin.test";
const ID: &str = "gw-a";
/// Batches the outage piles up: each request is one connection record,
/// and with `batch_max_records = 1` one batch.
const PILED_UP: usize = 4;

/// One member shipping to `serve`, which is given the member: every
/// record its own batch, sealed within 50 ms; a stop with the spool
/// blocked waits 1 s for the shipper. The egress list holds
/// `origin.test`.
async fn member() -> Pair {
    Pair::builder()
        .ids(&[ID])
        .control("batch_max_records = 1\n")
        .limits("shutdown_grace_ms = 1000")
        .renewing()
        .egress(&[API])
        .start_loopback(&[API])
        .await
}

/// The member's spool.
fn spool(rig: &Pair) -> PathBuf {
    rig.dir.join(ID).join("spool")
}

/// `gateway spool ARGS --config <the member's config>`: exit status,
/// stdout, stderr.
fn spool_command(rig: &Pair, args: &[&str]) -> (i32, String, String) {
    let bin = workspace_bin("gateway");
    let config = rig.dir.join(ID).join("gateway.toml");
    let mut all = vec!["spool"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--config", config.to_str().expect("utf-8 path")]);
    let out = run_bounded(bin.to_str().expect("utf-8 path"), &all, None, 60);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One GET through the member, as the session; must be answered 200.
fn get(rig: &Pair, bundle: &Path, path: &str) {
    let code = curl_via(rig.members[0].data, bundle, API, path, &[]).status;
    assert_eq!(code, 200, "GET {path}");
}

/// The sequence numbers of the batch files in `spool`, oldest first.
fn spooled(spool: &Path) -> Vec<u64> {
    let mut seqs: Vec<u64> = std::fs::read_dir(spool)
        .map(|d| {
            d.filter_map(|e| {
                let name = e.ok()?.file_name();
                name.to_str()?.strip_suffix(".batch")?.parse().ok()
            })
            .collect()
        })
        .unwrap_or_default();
    seqs.sort_unstable();
    seqs
}

/// Flip one bit of one byte of batch `seq`'s payload, inside its first
/// record (the case of a key's first letter): the JSON stays a batch, so
/// the control plane's refusal is the signature's. Written through a
/// rename, as a disk would hand back a whole file. Returns the path of
/// the request the record was of.
fn flip_one_byte(spool: &Path, seq: u64) -> String {
    let path = spool.join(format!("{seq:020}.batch"));
    let mut signed: talos_certs::Signed =
        serde_json::from_slice(&std::fs::read(&path).expect("read batch")).expect("a batch");
    let payload: Value = serde_json::from_slice(&signed.payload).expect("a batch payload");
    let request = payload["records"][0]["requests"][0]["path"]
        .as_str()
        .unwrap_or_else(|| panic!("batch {seq} holds a connection record: {payload}"))
        .to_owned();
    let at = signed
        .payload
        .windows(13)
        .position(|w| w == b"\"records\":[{\"")
        .expect("a batch with a record")
        + 13;
    assert!(signed.payload[at].is_ascii_alphabetic(), "a key's letter");
    signed.payload[at] ^= 0x20;
    let tmp = spool.join("flip.part");
    std::fs::write(&tmp, serde_json::to_vec(&signed).expect("json")).expect("write");
    std::fs::rename(&tmp, &path).expect("rename");
    request
}

/// The refusals of batches of `gw-a` on a certificate, as (seq, reason).
fn rejections(cert: &Value) -> Vec<(u64, String)> {
    cert["batch_rejections"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|r| r["gateway_id"] == ID)
                .filter_map(|r| Some((r["seq"].as_u64()?, r["reason"].as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// The paths of the requests of the connection records on a certificate.
fn request_paths(cert: &Value) -> Vec<String> {
    cert["connections"]
        .as_array()
        .map(|c| {
            c.iter()
                .flat_map(|c| c["requests"].as_array().cloned().unwrap_or_default())
                .filter_map(|r| r["path"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_batch_behind_a_backlog_is_set_aside_and_the_certificate_shows_the_gap() {
    let mut rig = member().await;
    let (id, _) = rig.start(&SessionSpec::from("127.0.0.2").allow(API));
    let (bundle, _) = rig.trust(&id, "trust.pem");

    // With serve up, batches leave the spool as they are sealed.
    get(&rig, &bundle, "/before");
    let cert = rig
        .stub
        .wait_certificate(&id, wait::DEADLINE.as_secs(), |c| {
            request_paths(c).iter().any(|p| p == "/before")
        });
    assert!(
        request_paths(&cert).iter().any(|p| p == "/before"),
        "the first request's record accepted: {cert}"
    );
    wait::until("the spool to empty with serve up", || {
        wait::check(spooled(&spool(&rig)), Vec::is_empty)
    });

    // serve down: every request's record waits in the spool, a batch each.
    rig.stub.kill_serve();
    for i in 0..PILED_UP {
        get(&rig, &bundle, &format!("/outage/{i}"));
    }
    let piled = wait::until("the outage's batches in the spool", || {
        wait::check(spooled(&spool(&rig)), |s| s.len() >= PILED_UP)
    });
    // A batch behind the oldest is damaged.
    let bad = piled[1];
    let lost = flip_one_byte(&spool(&rig), bad);

    // serve back: the batch before the damaged one is accepted, the
    // damaged one refused, and the spool blocked behind it.
    rig.stub.start_serve();
    let cert = rig
        .stub
        .wait_certificate(&id, wait::DEADLINE.as_secs(), |c| {
            rejections(c).contains(&(bad, "bad_signature".to_owned()))
        });
    assert!(
        rejections(&cert).contains(&(bad, "bad_signature".to_owned())),
        "batch {bad} refused bad_signature: {cert}"
    );
    assert!(
        cert["batches"].as_array().is_some_and(|b| b
            .iter()
            .any(|b| b["gateway_id"] == ID && b["seq"] == bad - 1)),
        "batch {} accepted: {cert}",
        bad - 1
    );
    wait::until("the damaged batch at the head of the spool", || {
        wait::check(spooled(&spool(&rig)), |s| s.first() == Some(&bad))
    });

    // The runbook: stop the member, verify, set the batch aside.
    assert!(rig.members[0].stop(), "the member drains and exits 0");
    let (status, out, err) = spool_command(&rig, &["verify"]);
    assert_eq!(status, 1, "verify finds the damaged batch: {out} {err}");
    let report: Value = serde_json::from_str(&out).expect("verify prints JSON");
    assert_eq!(report["findings"][0]["seq"], bad, "{report}");
    assert_eq!(
        report["findings"][0]["problem"], "bad_signature",
        "{report}"
    );
    let reason = "one byte flipped on disk, ticket 42";
    let (status, out, err) = spool_command(
        &rig,
        &["set-aside", "--seq", &bad.to_string(), "--reason", reason],
    );
    assert_eq!(status, 0, "set-aside: {out} {err}");
    let done: Value = serde_json::from_str(&out).expect("set-aside prints JSON");
    assert_eq!(done["seq"], bad, "{done}");
    assert!(
        done["after"]["findings"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "{done}"
    );
    // verify told the truth before: the batch before the damaged one is
    // the last acknowledged, and the waiting batches start at the damaged;
    // chain.json, the acknowledged point, is the control plane's head.
    assert_eq!(report["acknowledged_through"], bad - 1, "{report}");
    assert_eq!(report["waiting"][0], bad, "{report}");
    let listed = rig.cli(&["gateway", "list"]).json();
    let head = listed
        .as_array()
        .and_then(|l| l.iter().find(|g| g["id"] == ID))
        .cloned()
        .expect("gw-a listed");
    let chain: Value =
        serde_json::from_slice(&std::fs::read(spool(&rig).join("chain.json")).expect("chain.json"))
            .expect("chain.json is JSON");
    assert_eq!(head["chain_last_seq"], bad - 1, "{head}");
    assert_eq!(chain["last_seq"], bad - 1, "{chain}");
    assert_eq!(
        chain["last_digest"], head["chain_last_digest"],
        "{chain} {head}"
    );
    let kept = done["moved_to"].as_str().expect("the bad file's new place");
    assert!(Path::new(kept).exists(), "the damaged file is kept: {kept}");
    let (status, out, err) = spool_command(&rig, &["verify"]);
    assert_eq!(status, 0, "verify after set-aside: {out} {err}");

    // Start the member again: the gap and everything behind it ship.
    rig.restart(0);
    wait::until("the spool to drain", || {
        wait::check(spooled(&spool(&rig)), Vec::is_empty)
    });

    // The session ends; its certificate is issued, with the gap on it.
    // The member's stop ended its only authority (`shutdown`), so nothing
    // served the session: serve may be recovering it as a new attempt when
    // the stop comes, and the end then waits for that open to settle.
    let stopped = rig.cli(&["sandbox", "stop", &id]).json();
    assert!(
        ["ended", "reset_incomplete"].contains(&stopped["state"].as_str().unwrap_or("")),
        "{stopped}"
    );
    let cert = rig.wait_issued(&id);
    let gaps = cert["gaps"].as_array().expect("gaps");
    assert_eq!(gaps.len(), 1, "{cert}");
    assert_eq!(gaps[0]["gateway_id"], ID);
    assert_eq!(gaps[0]["seq"], bad);
    assert_eq!(gaps[0]["found"], "bad_signature");
    assert_eq!(gaps[0]["reason"], reason);
    // The damaged batch's record is the one the certificate lacks: every
    // other request of the session is on it.
    let paths = request_paths(&cert);
    let missing: Vec<String> = ["/before".to_owned()]
        .into_iter()
        .chain((0..PILED_UP).map(|i| format!("/outage/{i}")))
        .filter(|p| !paths.contains(p))
        .collect();
    assert_eq!(missing, [lost], "{paths:?}");
}
