//! Signing keys, end to end: every kind of signature in the system
//! verifies with openssl alone under the key the operator is shown, and a
//! member that lost its signing key (restarted with a fresh one) does not
//! block `stop` or `revoke-all`, while its word is not trusted.
//!
//! The rig and what the fault tests share: [`faults`].

mod faults;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use faults::*;
use serde_json::Value;
use talos_e2e::clients::{curl_status, run_bounded};
use talos_e2e::rig::pair::{matrix, IDS};
use talos_e2e::stub::closes_of;
use talos_e2e::wait;

/// Every kind of signature in the system — a batch from a spool, a drop
/// report and a start report from a batch, a decision, the certificate —
/// verifies with openssl alone, over the bytes docs/records.md states,
/// under the key the operator is shown (`gateway list`, `plane-key`, the
/// relay's key file).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_signature_verifies_with_openssl_alone() {
    let mut rig = pair().await;
    rig.lock(API, "POST", "/merge", "alice");
    let id = rig.start_session(&session(SOURCE));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    // A decision: a held POST, approved.
    let data = rig.members[0].data;
    let held = {
        let bundle = bundle.clone();
        tokio::task::spawn_blocking(move || {
            talos_e2e::clients::curl_via(data, &bundle, API, "/merge/1", &["-X", "POST"]).status
        })
    };
    let card = wait::until("a card to approve", || {
        let cards = rig.cli(&["approvals", "list"]).json();
        cards
            .as_array()
            .and_then(|c| c.first().cloned())
            .ok_or(cards)
    });
    let decided = rig
        .cli(&[
            "approvals",
            "approve",
            card["id"].as_str().unwrap(),
            "--as",
            "alice",
        ])
        .json();
    assert_eq!(held.await.unwrap(), 200);
    let decision = decided["signed"].clone();
    assert_eq!(decision["kind"], "decision", "{decided}");

    // With serve down, batches stay in the spools: a pause's drop reports,
    // and a restarted member's start report.
    rig.stub.kill_serve();
    rig.cli(&["sandbox", "pause", &id]).json();
    rig.members[1].kill();
    rig.restart(1);
    let mut envelopes: Vec<(usize, Value)> = Vec::new();
    for (i, id_) in IDS.iter().enumerate() {
        let spool = rig.dir.join(id_).join("spool");
        let mut kinds = BTreeSet::new();
        wait::until(&format!("{id_}'s spool to hold its batches"), || {
            let mut found = Vec::new();
            for e in std::fs::read_dir(&spool).unwrap().flatten() {
                if !e.file_name().to_string_lossy().ends_with(".batch") {
                    continue;
                }
                let Ok(batch) = serde_json::from_slice::<Value>(&std::fs::read(e.path()).unwrap())
                else {
                    continue;
                };
                found.push(batch);
            }
            let mut inner = Vec::new();
            for batch in &found {
                use base64::Engine as _;
                let payload = base64::engine::general_purpose::STANDARD
                    .decode(batch["payload"].as_str().unwrap())
                    .unwrap();
                let payload: Value = serde_json::from_slice(&payload).unwrap();
                for entry in payload["records"].as_array().into_iter().flatten() {
                    if entry.get("report").is_some() {
                        inner.push(entry["report"].clone());
                    }
                }
            }
            let kinds_now: BTreeSet<String> = found
                .iter()
                .chain(&inner)
                .filter_map(|e| e["kind"].as_str().map(str::to_owned))
                .collect();
            let want = if i == 0 {
                ["batch", "drop_report"].as_slice()
            } else {
                ["batch", "drop_report", "start_report"].as_slice()
            };
            if want.iter().all(|k| kinds_now.contains(*k)) {
                kinds = kinds_now;
                envelopes.extend(found.into_iter().chain(inner).map(|e| (i, e)));
                Ok(())
            } else {
                Err(kinds_now)
            }
        });
        eprintln!("{id_}: envelopes of kinds {kinds:?} in the spool");
    }
    rig.stub.start_serve();
    rig.cli(&["sandbox", "stop", &id]).json();
    rig.wait_issued(&id);
    let certificate: Value = serde_json::from_str(&rig.signed_certificate(&id)).unwrap();
    assert_eq!(certificate["kind"], "certificate");

    // The keys, as an operator gets them.
    let keydir = rig.dir.join("keys");
    std::fs::create_dir_all(&keydir).unwrap();
    let listed = rig.cli(&["gateway", "list"]).json();
    let gateway_keys: Vec<PathBuf> = IDS
        .iter()
        .map(|id_| {
            let g = listed
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["id"] == *id_)
                .expect("registered")
                .clone();
            let pem = keydir.join(format!("{id_}.pem"));
            std::fs::write(&pem, g["public_key_pem"].as_str().expect("its PEM")).unwrap();
            // The PEM is the raw key the list also gives, as openssl reads it.
            let raw = raw_key_pem(
                &keydir,
                &format!("{id_}-raw"),
                g["public_key_hex"].as_str().unwrap(),
            );
            assert_eq!(std::fs::read(&raw).unwrap(), std::fs::read(&pem).unwrap());
            pem
        })
        .collect();
    let plane = rig.stub.run(&[], &["plane-key"], b"").json();
    let plane_pem = keydir.join("plane.pem");
    std::fs::write(&plane_pem, plane["public_key_pem"].as_str().unwrap()).unwrap();
    // The relay's public key, as the attempt recorded it (the key file
    // itself is PKCS#8 v2, which OpenSSL 3.0 does not read).
    let status = rig.status(&id);
    let relay_hex = status["attempts"][0]["relay_public_key"]
        .as_str()
        .expect("the relay key the attempt opened with")
        .to_owned();
    let relay_pem = raw_key_pem(&keydir, "relay", &relay_hex);
    let mut checked = BTreeMap::<String, usize>::new();
    for (i, e) in &envelopes {
        check_envelope(&keydir, &gateway_keys[*i], e);
        *checked
            .entry(e["kind"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    check_envelope(&keydir, &relay_pem, &decision);
    check_envelope(&keydir, &plane_pem, &certificate);
    // A member's signature does not verify under the other's key.
    let (i, batch) = envelopes
        .iter()
        .find(|(_, e)| e["kind"] == "batch")
        .unwrap();
    {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut message = DOMAIN.to_vec();
        message.push(0x01);
        message.extend(b64.decode(batch["payload"].as_str().unwrap()).unwrap());
        let sig = b64.decode(batch["signature"].as_str().unwrap()).unwrap();
        assert!(!openssl_verifies(
            &keydir,
            &gateway_keys[1 - i],
            &message,
            &sig
        ));
    }
    eprintln!("verified with openssl: {checked:?}, 1 decision, 1 certificate");

    // The commands docs/records.md gives a reviewer, run as given (with
    // this rig's store and directory), on the certificate and on a batch
    // from gw-a's spool.
    let (_, batch) = envelopes
        .iter()
        .find(|(i, e)| *i == 0 && e["kind"] == "batch")
        .expect("a batch of gw-a");
    std::fs::write(keydir.join("batch.json"), batch.to_string()).unwrap();
    let script = r#"set -eu
cd "$KEYDIR"
"$STUB" --db "$DB" --control-dir "$CONTROL" plane-key | jq -r .public_key_pem > key.pem
"$STUB" --db "$DB" --control-dir "$CONTROL" certificate "$ID" --signed > env.json
printf 'talos-v1\000' > msg
printf '\005' >> msg
jq -r .payload env.json | base64 -d >> msg
jq -r .signature env.json | base64 -d > sig
openssl pkeyutl -verify -pubin -inkey key.pem -rawin -in msg -sigfile sig
"$STUB" --db "$DB" gateway list | jq -r '.[] | select(.id == "gw-a") | .public_key_pem' > key.pem
printf 'talos-v1\000' > msg
printf '\001' >> msg
jq -r .payload batch.json | base64 -d >> msg
jq -r .signature batch.json | base64 -d > sig
openssl pkeyutl -verify -pubin -inkey key.pem -rawin -in msg -sigfile sig
"#;
    let out = std::process::Command::new("timeout")
        .args(["60", "sh", "-c", script])
        .env("KEYDIR", &keydir)
        .env("STUB", talos_e2e::gateway::workspace_bin("control-stub"))
        .env("DB", &rig.stub.db)
        .env("CONTROL", &rig.stub.control_dir)
        .env("ID", &id)
        .output()
        .expect("sh");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.matches("Signature Verified Successfully").count() == 2,
        "the documented commands: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The signed-message prefix docs/records.md states.
const DOMAIN: &[u8] = b"talos-v1\0";

/// The kind byte docs/records.md states for each envelope kind.
fn kind_tag(kind: &str) -> u8 {
    match kind {
        "batch" => 0x01,
        "drop_report" => 0x02,
        "decision" => 0x03,
        "start_report" => 0x04,
        "certificate" => 0x05,
        other => panic!("no such kind {other:?}"),
    }
}

/// `openssl pkeyutl -verify` of `message` and `signature` under the PEM
/// public key `key`, with openssl alone: whether it verified.
fn openssl_verifies(dir: &Path, key: &Path, message: &[u8], signature: &[u8]) -> bool {
    let msg = dir.join("msg.bin");
    let sig = dir.join("sig.bin");
    std::fs::write(&msg, message).unwrap();
    std::fs::write(&sig, signature).unwrap();
    let out = run_bounded(
        "openssl",
        &[
            "pkeyutl",
            "-verify",
            "-pubin",
            "-inkey",
            key.to_str().unwrap(),
            "-rawin",
            "-in",
            msg.to_str().unwrap(),
            "-sigfile",
            sig.to_str().unwrap(),
        ],
        None,
        20,
    );
    let said = String::from_utf8_lossy(&out.stdout);
    let ok = out.status.success() && said.contains("Signature Verified Successfully");
    assert!(
        ok || said.contains("Signature Verification Failure"),
        "openssl neither verified nor refused: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok
}

/// Check one envelope (`{"kind","key_id","payload","signature"}`, bytes
/// in base64) under `key` with openssl, as docs/records.md says to: the
/// message is the prefix, the kind byte and the payload. An altered
/// payload, and the same bytes under another kind byte, must not verify.
fn check_envelope(dir: &Path, key: &Path, envelope: &Value) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let kind = envelope["kind"].as_str().expect("kind");
    let payload = b64.decode(envelope["payload"].as_str().unwrap()).unwrap();
    let signature = b64.decode(envelope["signature"].as_str().unwrap()).unwrap();
    let mut message = DOMAIN.to_vec();
    message.push(kind_tag(kind));
    message.extend_from_slice(&payload);
    assert!(
        openssl_verifies(dir, key, &message, &signature),
        "openssl does not verify the {kind}"
    );
    let mut altered = message.clone();
    *altered.last_mut().unwrap() ^= 1;
    assert!(
        !openssl_verifies(dir, key, &altered, &signature),
        "an altered {kind} verified"
    );
    let mut other_kind = message;
    other_kind[DOMAIN.len()] = if kind == "batch" { 0x02 } else { 0x01 };
    assert!(
        !openssl_verifies(dir, key, &other_kind, &signature),
        "a {kind} verified as another kind"
    );
}

/// A raw 32-byte Ed25519 public key (hex) as a PEM file, made by openssl
/// from its SubjectPublicKeyInfo DER (the fixed 12-byte Ed25519 prefix and
/// the key).
fn raw_key_pem(dir: &Path, name: &str, hex_key: &str) -> PathBuf {
    let mut der = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    der.extend(hex::decode(hex_key).expect("hex key"));
    let der_path = dir.join(format!("{name}.der"));
    std::fs::write(&der_path, der).unwrap();
    let pem = dir.join(format!("{name}.pem"));
    let out = run_bounded(
        "openssl",
        &[
            "pkey",
            "-pubin",
            "-inform",
            "DER",
            "-in",
            der_path.to_str().unwrap(),
            "-out",
            pem.to_str().unwrap(),
        ],
        None,
        20,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pem
}

/// A member that crashed and lost its signing key (started again with a
/// fresh one, which the stub has never registered): `stop` and
/// `revoke-all` still commit the end and close it on the other member;
/// the re-keyed member's word is not trusted, so its close stays owed,
/// saying why, and no certificate is issued on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_that_lost_its_signing_key_does_not_block_stop_or_revoke_all() {
    let mut rig = pair().await;
    let stopped = rig.start_session(&session(SOURCE));
    let revoked = rig.start_session(&session(SOURCE_2));
    let (bundle_1, _) = rig.trust(&stopped, "trust-1.pem");
    let (bundle_2, _) = rig.trust(&revoked, "trust-2.pem");
    rig.members[0].kill();
    std::fs::remove_file(rig.dir.join("gw-a").join("gw-a-signing.key")).expect("the key file");
    rig.restart(0);
    let b = rig.members[1].data;
    for (id, command, source, bundle) in [
        (&stopped, "stop", SOURCE, &bundle_1),
        (&revoked, "revoke-all", SOURCE_2, &bundle_2),
    ] {
        let (ran, took) = rig.timed(&["sandbox", command, id]);
        matrix(
            "gw-a SIGKILLed, restarted with a new signing key",
            &format!("sandbox {command}"),
            &if ran.status == 0 {
                ran.json()["state"].as_str().unwrap_or("?").to_owned()
            } else {
                format!("refused: {}", ran.stderr.trim())
            },
            took,
        );
        let t = ran.json();
        assert!(
            ["stopping", "reset_incomplete"].contains(&t["state"].as_str().unwrap_or("")),
            "{t}"
        );
        assert_eq!(curl_status(source, b, bundle, API, "/after-end"), 0);
        let status = rig.status(id);
        let owed = closes_of(&status, "gw-a");
        assert!(owed[0]["confirmed_at"].is_null(), "{status}");
    }
    assert_eq!(
        rig.peers.origin.paths_starting("/after-end"),
        Vec::<String>::new()
    );
    // A new session opens on gw-b alone: no authority on a member whose
    // word cannot be trusted.
    let t = rig
        .cli(&[
            "sandbox",
            "start",
            "--tenant",
            "acme",
            "--source",
            "127.0.0.4",
            "--allow",
            API,
            "--mode",
            "commands",
        ])
        .json();
    assert_eq!(t["state"], "running", "{t}");
    let cas: Vec<&str> = t["ca"]
        .as_array()
        .expect("cas")
        .iter()
        .filter_map(|c| c["gateway_id"].as_str())
        .collect();
    assert_eq!(cas, ["gw-b"], "{t}");
}
