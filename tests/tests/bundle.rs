//! The certificate bundle end to end: a linked pair, a session that was
//! held and decided, masked a secret, asked the gateway's DNS, was paused,
//! resumed, and forwarded by a member that restarted (SIGKILL), then
//! stopped; its bundle written by `control-stub certificate bundle` and
//! checked by the independent verifier (`verifier/verify_bundle.py`) as a
//! reviewer runs it. Then each tamper a reviewer must catch, each named by
//! the verifier's FAIL line and exit status: one flipped byte in each kind
//! of signed item, a batch removed from the middle, a batch of another
//! session's member added, a record moved between sessions, a certificate
//! edited to drop one refusal, a key swapped for another member's, and a
//! report from another attempt.
//!
//! The rig is the fault tests' pair ([`faults`]).

mod faults;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use faults::*;
use serde_json::Value;
use talos_e2e::clients::{curl_status, curl_via};
use talos_e2e::rig::Pair;
use talos_e2e::stub::verify_bundle;
use talos_e2e::wait;

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("bundle")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn write_lines(path: &Path, items: &[Value]) {
    let text: String = items
        .iter()
        .map(|v| serde_json::to_string(v).expect("json") + "\n")
        .collect();
    std::fs::write(path, text).expect("write bundle");
}

/// Wait until member `i` forwards one session.
fn wait_forwarding(rig: &Pair, i: usize) {
    wait::until(&format!("member {i} to forward the session"), || {
        wait::check(rig.members[i].metric("gateway_forwarding_sessions"), |n| {
            *n == Some(1.0)
        })
    });
}

/// Waits (bounded) for one pending card and returns its id.
fn wait_card(rig: &Pair) -> String {
    wait::until("a pending card", || {
        let cards = rig.cli(&["approvals", "list"]).json();
        let first = cards
            .as_array()
            .and_then(|c| c.first())
            .and_then(|c| c["id"].as_str())
            .map(str::to_owned);
        match first {
            Some(id) => Ok(id),
            None => Err(cards),
        }
    })
}

/// Standard base64 text with one byte of what it decodes to flipped.
fn flip_b64(text: &str, at: usize) -> String {
    let mut bytes = STANDARD.decode(text).expect("base64");
    let i = at.min(bytes.len() - 1);
    bytes[i] ^= 0x01;
    STANDARD.encode(bytes)
}

/// The payload of an envelope, decoded.
fn payload(envelope: &Value) -> Vec<u8> {
    STANDARD
        .decode(envelope["payload"].as_str().expect("payload"))
        .expect("base64")
}

/// An envelope of `kind` for `payload`, signed with `key`.
fn signed(key: &talos_certs::GatewayKey, kind: talos_certs::Kind, payload: Vec<u8>) -> Value {
    serde_json::to_value(key.sign(kind, payload)).expect("envelope")
}

/// A key file written by the product (mode 0600), loaded as the
/// control plane or a member would.
fn key_file(path: &Path) -> talos_certs::GatewayKey {
    talos_certs::GatewayKey::load_or_create(path).expect("key file")
}

/// The session's run of the pair through every thing the bundle's
/// evidence must cover: first `S1` from [`SOURCE`], then another session
/// from [`SOURCE_2`]; both ended, both certificates issued.
struct Ran {
    rig: Pair,
    s1: String,
    s2: String,
}

async fn run_sessions() -> Ran {
    let mut rig: Pair = Pair::builder()
        .lease(LEASE)
        .renewing()
        .linked()
        .dns()
        .egress(&[API])
        .secret("API_TOKEN", SECRET)
        .start_loopback(&[API])
        .await;
    rig.lock(API, "POST", "/merge", "alice");
    let s1 = rig.start_session(&session(SOURCE));
    let (trust, _) = rig.trust(&s1, "trust-1.pem");

    // Allowed on both members; the secret's echo masked; a request
    // refused; a connection refused.
    traffic(&rig, SOURCE, &trust, "one", 4);
    let masked = curl_via(rig.members[1].data, &trust, API, "/reflect?how=body", &[])
        .text()
        .to_owned();
    assert!(!masked.contains(SECRET), "masked: {masked}");
    let refused = curl_via(
        rig.members[0].data,
        &trust,
        API,
        "/x",
        &["-H", "Host: elsewhere.test"],
    );
    assert_eq!(refused.status, 421, "{}", refused.head);
    assert_eq!(
        curl_status(SOURCE, rig.members[1].data, &trust, "unlisted.test", "/"),
        0
    );

    // A held request, approved from the CLI.
    let data = rig.members[0].data;
    let held_trust = trust.clone();
    let held = std::thread::spawn(move || {
        curl_via(data, &held_trust, API, "/merge/1", &["-X", "POST"]).status
    });
    let card = wait_card(&rig);
    let decided = rig
        .cli(&["approvals", "approve", &card, "--as", "alice"])
        .json();
    assert_eq!(decided["outcome"], "released", "{decided}");
    assert_eq!(held.join().expect("held request"), 200);

    // The session's DNS, answered by each member.
    for answerer in rig.answerers.clone() {
        let (at, port) = (format!("@{}", answerer.ip()), answerer.port().to_string());
        for name in [API, "unlisted.test"] {
            talos_e2e::resolving::dig(&[&at, "-p", &port, "-b", SOURCE, name, "A"]);
        }
    }

    // Paused and resumed: a new attempt, new CAs.
    assert_eq!(
        rig.cli(&["sandbox", "pause", &s1]).json()["state"],
        "paused"
    );
    assert_eq!(
        rig.cli(&["sandbox", "resume", &s1]).json()["state"],
        "running"
    );
    let (trust, _) = rig.trust(&s1, "trust-2.pem");
    traffic(&rig, SOURCE, &trust, "two", 2);

    // gw-a killed and started again: it holds nothing now, and forwards
    // the session's connections to gw-b.
    rig.members[0].kill();
    rig.restart(0);
    wait_forwarding(&rig, 0);
    traffic(&rig, SOURCE, &trust, "fwd", 6);

    // Another session, on both members now.
    let s2 = rig.start_session(&session(SOURCE_2));
    let (trust_2, _) = rig.trust(&s2, "trust-s2.pem");
    traffic(&rig, SOURCE_2, &trust_2, "other", 4);

    assert_eq!(rig.cli(&["sandbox", "stop", &s1]).json()["state"], "ended");
    rig.wait_issued(&s1);
    // The other session goes on after the first's certificate: its later
    // batches lie past the first's run on each member.
    traffic(&rig, SOURCE_2, &trust_2, "later", 4);
    assert_eq!(rig.cli(&["sandbox", "stop", &s2]).json()["state"], "ended");
    rig.wait_issued(&s2);
    Ran { rig, s1, s2 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sessions_bundle_verifies_alone_and_every_tamper_is_named() {
    let Ran { rig, s1, s2 } = run_sessions().await;
    let path = rig.bundle(&s1, "s1.bundle");
    let (code, out) = verify_bundle(&path);
    eprintln!("{out}");
    assert_eq!(code, 0, "{out}");

    // What it checked, as the report names it.
    let cert = rig.wait_issued(&s1);
    let connections = cert["connections"].as_array().expect("connections").len();
    let forwarded = cert["forwarded"].as_array().expect("forwarded").len();
    assert!(forwarded >= 3, "gw-a handed connections on: {cert}");
    for line in [
        format!("ok   connections: {connections} connections recomputed from the signed records equal the certificate's, one by one"),
        format!("ok   forwarded: each of the {forwarded} hand-offs is matched by the holder's record of it"),
        "ok   key gateway gw-a:".into(),
        "ok   key gateway gw-b:".into(),
        "ok   chain gw-a:".into(),
        "ok   chain gw-b:".into(),
        "ok   batches:".into(),
        "ok   completeness gw-a attempt 1: its drop report (pause".into(),
        "ok   completeness gw-a attempt 2: its process ended; the next one's start report".into(),
        "ok   completeness gw-b attempt 2: its drop report (end".into(),
        "ok   refusals: 2 refusals, by reason: host_mismatch 1, not_on_allowlist 1".into(),
        "ok   secrets: API_TOKEN used by".into(),
        "ok   dns totals: queries by outcome: answered".into(),
        "ok   reset step 4:".into(),
        "ok   reset step 5:".into(),
        "ok   decision ".into(),
        "RESULT: VERIFIED".into(),
    ] {
        assert!(out.contains(&line), "{line}\n{out}");
    }
    // The decision, taken in lab mode (the CLI's --as), says so on the
    // certificate: no assertion, not verified, the relay's signed decision.
    let decided = &cert["proposals"][0]["decided"];
    assert_eq!(decided["verified"], false, "{decided}");
    assert_eq!(decided["verified_by"], "relay_only");
    assert!(decided["note"].as_str().unwrap().contains("lab mode"));
    assert!(decided.get("assertion").is_none());
    assert_eq!(decided["relay_signed"]["kind"], "decision");
    assert!(
        out.contains("the certificate's copy says so (verified false, relay_only)"),
        "{out}"
    );
    let masked = cert["secrets"][0]["masked"].as_u64().expect("masked");
    assert!(masked >= 1, "{cert}");

    // Nothing secret, in any form the masker knows.
    let mut text = std::fs::read(&path).expect("bundle");
    let set = talos_gateway::secrets::mask::MaskSet::new(&[("API_TOKEN", SECRET.as_bytes())])
        .expect("mask set");
    let found = talos_gateway::secrets::mask::Masker::new(Arc::new(set)).mask_all(&mut text);
    assert_eq!(found, 0, "the bundle holds the secret in some form");

    by_hand(&rig, &path, &cert);
    tampers(&rig, &s1, &s2, &path);
}

/// The checks by hand that docs/records.md gives ("The same checks by
/// hand"), run as written on the bundle: the member's binding under the
/// control CA, one batch's and one report's signature with openssl, and
/// the digests the certificate names them by.
fn by_hand(rig: &Pair, bundle: &Path, cert: &Value) {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/records.md"))
            .expect("docs/records.md");
    let section = docs
        .split("### The same checks by hand")
        .nth(1)
        .expect("the section");
    let script = section
        .split("```sh\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("its sh block");
    let dir = rig.dir.join("by-hand");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::copy(bundle, dir.join("session.bundle")).expect("copy");
    let out = Command::new("timeout")
        .args(["-k", "2", "60", "bash", "-euo", "pipefail", "-c", script])
        .current_dir(&dir)
        .output()
        .expect("run the commands");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("member.pem: OK"), "{text}");
    assert!(text.contains("DNS:gateway.role.talos.invalid"), "{text}");
    assert!(text.contains("Verified OK"), "the binding: {text}");
    assert_eq!(
        text.matches("Signature Verified Successfully").count(),
        2,
        "a batch and a report: {text}"
    );
    // The report's digest is one the certificate's reset steps name.
    let named: Vec<&str> = cert["reset"]
        .as_array()
        .expect("reset")
        .iter()
        .flat_map(|s| {
            ["cas", "detached"]
                .into_iter()
                .flat_map(move |k| s["response"][k].as_array().into_iter().flatten())
        })
        .filter_map(|i| i["report_digest"].as_str())
        .collect();
    let digests: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_suffix(" *stdin"))
        .collect();
    assert_eq!(digests.len(), 2, "{text}");
    assert!(named.contains(&digests[1]), "{} in {named:?}", digests[1]);
}

/// Every tamper, on a copy of `s1`'s bundle: the verifier exits 1 with a
/// FAIL line that names the item.
fn tampers(rig: &Pair, s1: &str, s2: &str, path: &Path) {
    let items = read_lines(path);
    let other = read_lines(&rig.bundle(s2, "s2.bundle"));
    let plane = key_file(&rig.stub.control_dir.join("plane.key"));
    let member_key = |id: &str| key_file(&rig.dir.join(id).join(format!("{id}-signing.key")));
    let find =
        |pred: &dyn Fn(&Value) -> bool| -> usize { items.iter().position(pred).expect("an item") };
    let batches = |gateway: &str| -> Vec<usize> {
        items
            .iter()
            .enumerate()
            .filter(|(_, v)| v["item"] == "batch" && v["gateway_id"] == gateway)
            .map(|(i, _)| i)
            .collect()
    };
    let cert_at = find(&|v| v["item"] == "certificate");
    let cert: Value = serde_json::from_slice(&payload(&items[cert_at]["envelope"])).expect("cert");
    // The certificate, edited and signed again with the control plane's
    // own key: a control plane that lies.
    let resigned = |edit: &dyn Fn(&mut Value)| -> Vec<Value> {
        let mut c = cert.clone();
        edit(&mut c);
        let mut out = items.clone();
        out[cert_at]["envelope"] = signed(
            &plane,
            talos_certs::Kind::Certificate,
            serde_json::to_vec(&c).expect("cert"),
        );
        out
    };
    // A batch whose `entry`-th entry is a report, with one byte of the
    // report's payload flipped and the batch signed again by its member.
    let report_flipped = |gateway: &str, kind: &str| -> (Vec<Value>, String) {
        let key = member_key(gateway);
        for &i in &batches(gateway) {
            let body = payload(&items[i]["envelope"]);
            let mut batch: Value = serde_json::from_slice(&body).expect("batch");
            let Some(entry) = batch["records"]
                .as_array()
                .expect("records")
                .iter()
                .position(|e| e["report"]["kind"] == kind)
            else {
                continue;
            };
            let report = &mut batch["records"][entry]["report"];
            let text = report["payload"].as_str().expect("payload").to_owned();
            report["payload"] = Value::String(flip_b64(&text, 10));
            // The records as the member wrote them, each as is, but this one.
            let raw = talos_certs::batch_records(&body).expect("records");
            let mut records: Vec<Vec<u8>> = raw;
            records[entry] = serde_json::to_vec(&batch["records"][entry]).expect("entry");
            let header: talos_certs::BatchHeader =
                serde_json::from_value(batch.clone()).expect("header");
            let header = talos_certs::BatchHeader {
                count: u32::try_from(records.len()).expect("count"),
                ..header
            };
            let body = talos_certs::batch_payload(&header, &records).expect("payload");
            let mut out = items.clone();
            out[i]["envelope"] = signed(&key, talos_certs::Kind::Batch, body);
            let seq = items[i]["seq"].as_u64().expect("seq");
            return (
                out,
                format!("FAIL report in batch {gateway}/{seq} entry {entry}:"),
            );
        }
        panic!("no {kind} in {gateway}'s batches");
    };

    let mut cases: Vec<(&str, Vec<Value>, String, String)> = Vec::new();

    // One flipped byte in each kind of signed item.
    let mut t = items.clone();
    let env = &mut t[cert_at]["envelope"];
    env["payload"] = Value::String(flip_b64(env["payload"].as_str().unwrap(), 40));
    cases.push((
        "a flipped byte in the certificate",
        t,
        "FAIL certificate:".into(),
        "does not verify".into(),
    ));

    let gw_b = batches("gw-b");
    assert!(gw_b.len() >= 3, "a run of gw-b's batches to take one from");
    let middle = gw_b[gw_b.len() / 2];
    let mut t = items.clone();
    let env = &mut t[middle]["envelope"];
    env["payload"] = Value::String(flip_b64(env["payload"].as_str().unwrap(), 30));
    cases.push((
        "a flipped byte in a batch",
        t,
        format!("FAIL batch gw-b/{}:", items[middle]["seq"]),
        "does not verify".into(),
    ));

    let reply = find(&|v| v["item"] == "report");
    let mut t = items.clone();
    let env = &mut t[reply]["envelope"];
    env["payload"] = Value::String(flip_b64(env["payload"].as_str().unwrap(), 12));
    cases.push((
        "a flipped byte in a drop report answered to a close",
        t,
        "FAIL report in ".into(),
        "does not verify".into(),
    ));

    let (t, line) = report_flipped("gw-b", "drop_report");
    cases.push((
        "a flipped byte in a drop report in a chain",
        t,
        line,
        "does not verify".into(),
    ));
    let (t, line) = report_flipped("gw-a", "start_report");
    cases.push((
        "a flipped byte in a start report",
        t,
        line,
        "does not verify".into(),
    ));

    let proposal = find(&|v| v["item"] == "proposal" && !v["decision"].is_null());
    let mut t = items.clone();
    let env = &mut t[proposal]["decision"];
    env["payload"] = Value::String(flip_b64(env["payload"].as_str().unwrap(), 20));
    cases.push((
        "a flipped byte in a decision",
        t,
        format!(
            "FAIL decision {}:",
            items[proposal]["proposal_id"].as_str().unwrap()
        ),
        "does not verify".into(),
    ));

    let key_a = find(&|v| v["item"] == "key" && v["id"] == "gw-a");
    let mut t = items.clone();
    let b = &mut t[key_a]["binding"];
    b["signature"] = Value::String(flip_b64(b["signature"].as_str().unwrap(), 20));
    cases.push((
        "a flipped byte in a key binding",
        t,
        "FAIL key gateway gw-a:".into(),
        "does not verify".into(),
    ));

    let ca = find(&|v| v["item"] == "control_ca");
    let mut t = items.clone();
    let pem = t[ca]["pem"].as_str().unwrap().to_owned();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let flipped = flip_b64(&body, 200);
    t[ca]["pem"] = Value::String(format!(
        "-----BEGIN CERTIFICATE-----\n{flipped}\n-----END CERTIFICATE-----\n"
    ));
    cases.push((
        "a flipped byte in the control CA",
        t,
        "FAIL control CA:".into(),
        "".into(),
    ));

    // A batch removed from the middle of a member's run.
    let mut t = items.clone();
    let gone = t.remove(middle);
    let seq = gone["seq"].as_u64().unwrap();
    cases.push((
        "a batch removed from the middle",
        t,
        "FAIL chain gw-b:".into(),
        format!("{seq} missing"),
    ));

    // A batch of another session's member (its records, its key) added.
    let mine: Vec<(Value, Value)> = items
        .iter()
        .filter(|v| v["item"] == "batch")
        .map(|v| (v["gateway_id"].clone(), v["seq"].clone()))
        .collect();
    let foreign = other
        .iter()
        .find(|v| {
            v["item"] == "batch" && !mine.contains(&(v["gateway_id"].clone(), v["seq"].clone()))
        })
        .expect("a batch of the other session only")
        .clone();
    let mut t = items.clone();
    t.push(foreign.clone());
    cases.push((
        "a batch of another session's member added",
        t,
        "FAIL batches:".into(),
        "holds nothing of this session and lies outside its run".into(),
    ));

    // A record moved between sessions: another session's connection on
    // this certificate (signed again by the control plane).
    let other_cert_at = other
        .iter()
        .position(|v| v["item"] == "certificate")
        .unwrap();
    let other_cert: Value =
        serde_json::from_slice(&payload(&other[other_cert_at]["envelope"])).unwrap();
    let moved = other_cert["connections"][0].clone();
    assert_eq!(moved["session_id"], s2);
    cases.push((
        "a record moved between sessions (on the certificate)",
        resigned(&|c| c["connections"].as_array_mut().unwrap().push(moved.clone())),
        "FAIL connections:".into(),
        "on the certificate but not in the signed records".into(),
    ));
    // …and in a batch, where its member's signature no longer holds.
    let with_record = *batches("gw-b")
        .iter()
        .find(|&&i| {
            String::from_utf8_lossy(&payload(&items[i]["envelope"]))
                .contains(&format!("\"session_id\":\"{s1}\""))
        })
        .unwrap();
    let mut t = items.clone();
    let body = String::from_utf8(payload(&t[with_record]["envelope"]))
        .unwrap()
        .replacen(
            &format!("\"session_id\":\"{s1}\""),
            &format!("\"session_id\":\"{s2}\""),
            1,
        );
    t[with_record]["envelope"]["payload"] = Value::String(STANDARD.encode(body));
    cases.push((
        "a record moved between sessions (in a batch)",
        t,
        format!("FAIL batch gw-b/{}:", items[with_record]["seq"]),
        "does not verify".into(),
    ));

    // A certificate edited to drop one refusal: unsigned, then signed again.
    let mut unsigned = cert.clone();
    unsigned["refusals"].as_array_mut().unwrap().pop();
    let mut t = items.clone();
    t[cert_at]["envelope"]["payload"] =
        Value::String(STANDARD.encode(serde_json::to_vec(&unsigned).unwrap()));
    cases.push((
        "a refusal dropped from the certificate",
        t,
        "FAIL certificate:".into(),
        "does not verify".into(),
    ));
    cases.push((
        "a refusal dropped from the certificate, signed again by the control plane",
        resigned(&|c| {
            c["refusals"].as_array_mut().unwrap().pop();
        }),
        "FAIL refusals:".into(),
        "in the signed records but not on the certificate".into(),
    ));

    // A key swapped for another member's (its key and binding).
    let key_b = find(&|v| v["item"] == "key" && v["id"] == "gw-b");
    let mut t = items.clone();
    for field in ["public_key", "public_key_pem", "binding"] {
        t[key_a][field] = items[key_b][field].clone();
    }
    cases.push((
        "a key swapped for another member's",
        t,
        "FAIL key gateway gw-a:".into(),
        "the binding says role 'gateway', id 'gw-b'".into(),
    ));

    // A report from another attempt: step 4 names, for attempt 1 on gw-b,
    // gw-b's report of attempt 2 (signed again by the control plane).
    let step4 = cert["reset"]
        .as_array()
        .unwrap()
        .iter()
        .position(|s| s["step"] == 4)
        .unwrap();
    let item_of = |attempt: u64| {
        cert["reset"][step4]["response"]["cas"]
            .as_array()
            .unwrap()
            .iter()
            .position(|c| c["attempt"] == attempt && c["gateway_id"] == "gw-b")
            .unwrap()
    };
    let (first, second) = (item_of(1), item_of(2));
    cases.push((
        "a report from another attempt",
        resigned(&|c| {
            let later = c["reset"][step4]["response"]["cas"][second]["report_digest"].clone();
            c["reset"][step4]["response"]["cas"][first]["report_digest"] = later;
        }),
        "FAIL reset step 4:".into(),
        "attempt 2".into(),
    ));

    for (what, tampered, line, why) in cases {
        let file = rig.dir.join("tampered.bundle");
        write_lines(&file, &tampered);
        let (code, out) = verify_bundle(&file);
        assert_eq!(code, 1, "{what}: exit {code}\n{out}");
        let fail = out
            .lines()
            .find(|l| l.starts_with(line.as_str()) && l.contains(why.as_str()))
            .unwrap_or_else(|| panic!("{what}: no line `{line}…{why}`:\n{out}"));
        eprintln!("tamper | {what} | {fail}");
    }
}
