//! The certificate bundle from the store, checked by the independent
//! verifier (`verifier/verify_bundle.py`, run as a reviewer runs it): a
//! synthetic session with real signatures (`synth`) on SQLite or
//! PostgreSQL (`TALOS_TEST_STORE`), its bundle verified; the bundle holds
//! nothing secret; a person's decision is checked from her passkey's
//! assertion inside the relay's signed decision, under her listed key. The tampering of a real pair's bundle is in the
//! end-to-end tests (`tests/tests/bundle.rs`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use talos_control_stub::synth::{self, Options};
use talos_control_stub::Store;

/// The verifier, beside the workspace's crates.
fn verifier() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../verifier/verify_bundle.py")
}

/// What the verifier printed, and its exit status.
fn verify(bundle: &Path) -> (i32, String) {
    let out = Command::new("timeout")
        .args(["-k", "2", "120", "python3"])
        .arg(verifier())
        .arg(bundle)
        .output()
        .expect("run the verifier");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// A synthetic session's bundle: the store, its directory, the session
/// id, the bundle's path.
fn bundled(options: &Options) -> (tempfile::TempDir, Store, String, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(common::test_db(dir.path())).unwrap();
    let control = dir.path().join("control");
    let mut pair = synth::Pair::new(&mut store, &control).unwrap();
    let id = pair.session(&mut store, &control, options).unwrap();
    let path = dir.path().join("bundle.jsonl");
    let summary = talos_control_stub::bundle::write_file(&store, &control, &id, &path).unwrap();
    assert_eq!(summary.session_id, id);
    (dir, store, id, path)
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn write_lines(path: &Path, items: &[Value]) {
    let text: String = items
        .iter()
        .map(|v| serde_json::to_string(v).unwrap() + "\n")
        .collect();
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_synthetic_sessions_bundle_verifies_and_holds_no_secret() {
    let (_dir, _store, id, path) = bundled(&Options {
        connections: 120,
        per_batch: 25,
        ..Options::default()
    });
    let (code, out) = verify(&path);
    assert_eq!(code, 0, "{out}");
    for item in [
        "ok   certificate:",
        "ok   chain gw-a:",
        "ok   chain gw-b:",
        "ok   key gateway gw-a:",
        "ok   key relay control-stub:",
        "ok   key plane control-stub:",
        "ok   connections: 121 connections",
        "ok   refusals:",
        "ok   secrets: API_TOKEN used by",
        "ok   dns totals: queries by outcome: answered 8, unlisted 2",
        "ok   reset step 4:",
        "ok   reset step 5:",
        "ok   completeness gw-a attempt 1:",
        &format!("ok   decision gw-a-1-{}:", &id[4..]),
    ] {
        assert!(out.contains(item), "{item}:\n{out}");
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains("synth-S3CRET"),
        "no secret value in a bundle"
    );
    // The header, then the items.
    let items = lines(&path);
    assert_eq!(items[0]["format"], "talos-certificate-bundle");
    assert_eq!(items[0]["version"], 1);
    assert_eq!(items[0]["session_id"], id.as_str());
}

/// The decision as the relay signed it: its payload, parsed.
fn decision_of(item: &Value) -> talos_certs::Decision {
    let signed: talos_certs::Signed = serde_json::from_value(item["decision"].clone()).unwrap();
    serde_json::from_slice(&signed.payload).unwrap()
}

/// `decision` signed again by the relay's key, as the item's decision.
fn resign(item: &mut Value, decision: &talos_certs::Decision, control: &Path) {
    let relay = talos_control_stub::identity::relay_key(control).unwrap();
    item["decision"] = serde_json::to_value(decision.sign(&relay)).unwrap();
}

/// The verifier on `items` (written beside the bundle): its status and the
/// FAIL line of the decision, which must be the only decision failing.
fn fails_on_decision(dir: &Path, items: &[Value]) -> String {
    let p = dir.join("tampered.jsonl");
    write_lines(&p, items);
    let (code, out) = verify(&p);
    assert_eq!(code, 1, "{out}");
    out.lines()
        .find(|l| l.starts_with("FAIL decision gw-a-1-"))
        .unwrap_or_else(|| panic!("no FAIL line for the decision:\n{out}"))
        .to_owned()
}

/// A person's decision, checked by the verifier alone: the relay's signed
/// decision carries the card alice saw and her passkey's WebAuthn
/// assertion, the bundle her listed key and the relying party; the
/// verifier names her. Each tamper the relay's signature does not catch
/// (the relay signs again) is caught by the person's check, named: a
/// flipped byte of her signature, her assertion over the other verdict,
/// another person's key in her name, and no assertion on an attempt not
/// in lab mode (which passes, resting on the stub, once the certificate
/// says the attempt was in lab mode).
#[test]
fn a_persons_decision_is_checked_under_her_listed_key_and_each_tamper_is_named() {
    use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_ASN1_SIGNING};
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use base64::Engine as _;

    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(common::test_db(dir.path())).unwrap();
    let control = dir.path().join("control");
    let mut pair = synth::Pair::new(&mut store, &control).unwrap();
    let id = pair
        .session(&mut store, &control, &Options::default())
        .unwrap();
    let path = dir.path().join("bundle.jsonl");
    let summary = talos_control_stub::bundle::write_file(&store, &control, &id, &path).unwrap();
    assert_eq!(summary.approver_keys, 1);
    let items = lines(&path);
    let at = items
        .iter()
        .position(|v| v["item"] == "proposal")
        .expect("a decided card");
    let digest = items[at]["digest"].as_str().unwrap().to_owned();

    // The decision exactly as the relay signed it: the card and alice's
    // assertion inside the signed payload.
    let signed = decision_of(&items[at]);
    let card: talos_certs::Proposal = serde_json::from_value(items[at]["fields"].clone()).unwrap();
    assert_eq!(signed.card.as_ref(), Some(&card));
    assert!(signed.assertion.is_some());
    let key = items
        .iter()
        .find(|v| v["item"] == "approver_key")
        .expect("alice's listed key");
    assert_eq!(key["owner"], "alice");
    assert_eq!(key["rp_id"], synth::RP_ID);
    assert_eq!(key["origin"], synth::ORIGIN);

    let (code, out) = verify(&path);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("approved by alice, signed by the relay's key")
            && out.contains("alice's own passkey signed this verdict on this card")
            && out.contains("the certificate's copy verifies alone"),
        "{out}"
    );
    // The certificate itself shows the decision: alice, verified by her
    // passkey, the assertion the relay signed, her listed key, the
    // relay's signed decision and key.
    let cert = talos_control_stub::certificate::certificate(&store, &id).unwrap();
    let copy = &cert["proposals"][0]["decided"];
    assert_eq!(copy["approver"], "alice");
    assert_eq!(copy["verified"], true);
    assert_eq!(copy["verified_by"], "passkey");
    assert_eq!(copy["public_key_cose"], key["public_key_cose"]);
    assert_eq!(copy["alg"], "ES256");
    assert_eq!(copy["rp_id"], synth::RP_ID);
    assert_eq!(copy["origin"], synth::ORIGIN);
    assert_eq!(copy["relay_signed"], items[at]["decision"]);
    assert_eq!(
        copy["assertion"],
        serde_json::to_value(signed.assertion.as_ref().unwrap()).unwrap()
    );
    assert_eq!(copy["relay_public_key"].as_str().map(str::len), Some(64));

    // A flipped byte of alice's signature (the relay signs again).
    let mut flipped = items.clone();
    let mut d = signed.clone();
    let a = d.assertion.as_mut().unwrap();
    let mut sig = URL_SAFE_NO_PAD.decode(&a.signature).unwrap();
    let last = sig.len() - 1;
    sig[last] ^= 0x01;
    a.signature = URL_SAFE_NO_PAD.encode(&sig);
    resign(&mut flipped[at], &d, &control);
    let line = fails_on_decision(dir.path(), &flipped);
    assert!(
        line.contains("bad_signature: alice's passkey signature"),
        "{line}"
    );
    // Unsigned again, the relay's own signature fails first.
    let mut raw = items.clone();
    let mut envelope: talos_certs::Signed =
        serde_json::from_value(raw[at]["decision"].clone()).unwrap();
    let n = envelope.payload.len() - 3;
    envelope.payload[n] ^= 0x01;
    raw[at]["decision"] = serde_json::to_value(&envelope).unwrap();
    let line = fails_on_decision(dir.path(), &raw);
    assert!(line.contains("the signature does not verify"), "{line}");

    // alice's assertion over the other verdict, in an approval.
    let mut other = items.clone();
    let mut d = signed.clone();
    d.assertion = pair.alice_signs(&digest, talos_certs::Verdict::Declined);
    resign(&mut other[at], &d, &control);
    let line = fails_on_decision(dir.path(), &other);
    assert!(
        line.contains("challenge_mismatch: the assertion's challenge is not this card's digest and the verdict approved"),
        "{line}"
    );

    // bob's passkey (listed, as bob's) signs the card, in alice's name.
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let bob = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_ASN1_SIGNING).unwrap();
    let point = bob.public_key().as_ref();
    let mut cose = vec![0xa5, 0x01, 0x02, 0x03, 0x26, 0x20, 0x01, 0x21, 0x58, 0x20];
    cose.extend_from_slice(&point[1..33]);
    cose.extend_from_slice(&[0x22, 0x58, 0x20]);
    cose.extend_from_slice(&point[33..65]);
    let bob_id = b"bob's credential".to_vec();
    let mut impostor = items.clone();
    let mut bob_key = key.clone();
    bob_key["owner"] = "bob".into();
    bob_key["credential_id"] = STANDARD.encode(&bob_id).into();
    bob_key["public_key_cose"] = STANDARD.encode(&cose).into();
    impostor.push(bob_key);
    let mut d = signed.clone();
    let a = d.assertion.as_mut().unwrap();
    let mut message = URL_SAFE_NO_PAD.decode(&a.authenticator_data).unwrap();
    let client = URL_SAFE_NO_PAD.decode(&a.client_data_json).unwrap();
    message
        .extend_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &client).as_ref());
    a.credential_id = URL_SAFE_NO_PAD.encode(&bob_id);
    a.signature = URL_SAFE_NO_PAD.encode(bob.sign(&rng, &message).unwrap().as_ref());
    resign(&mut impostor[at], &d, &control);
    let line = fails_on_decision(dir.path(), &impostor);
    assert!(
        line.contains("unknown_credential: the key is bob's"),
        "{line}"
    );
    // And a key not listed at all.
    impostor.retain(|v| v["owner"] != "bob");
    let line = fails_on_decision(dir.path(), &impostor);
    assert!(
        line.contains("unknown_credential: the credential 626f622773206372... is not one of the listed approvers' keys"),
        "{line}"
    );

    // No assertion, on an attempt the certificate does not say was in lab
    // mode.
    let mut bare = items.clone();
    let mut d = signed.clone();
    d.card = None;
    d.assertion = None;
    resign(&mut bare[at], &d, &control);
    let line = fails_on_decision(dir.path(), &bare);
    assert!(
        line.contains("no person's assertion")
            && line.contains("does not say attempt 1 was in lab mode"),
        "{line}"
    );
    // The certificate says it was (signed again by the control plane):
    // the decision passes, resting on the stub.
    let c = bare
        .iter()
        .position(|v| v["item"] == "certificate")
        .unwrap();
    let envelope: talos_certs::Signed =
        serde_json::from_value(bare[c]["envelope"].clone()).unwrap();
    let mut cert: Value = serde_json::from_slice(&envelope.payload).unwrap();
    cert["attempts"][0]["lab_approvals"] = true.into();
    // Its copy of the decision first still names the first signed
    // decision: named.
    let p = dir.path().join("lab-stale.jsonl");
    let plane = talos_control_stub::identity::plane_key(&control).unwrap();
    let mut stale = bare.clone();
    stale[c]["envelope"] = serde_json::to_value(plane.sign(
        talos_certs::Kind::Certificate,
        serde_json::to_vec(&cert).unwrap(),
    ))
    .unwrap();
    write_lines(&p, &stale);
    let (code, out) = verify(&p);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("the certificate's relay_signed is not the signed decision the bundle holds"),
        "{out}"
    );
    // Then the copy as a lab decision shows it.
    let copy = &mut cert["proposals"][0]["decided"];
    *copy = serde_json::json!({
        "approver": "alice", "verified": false, "verified_by": "relay_only",
        "note": talos_control_stub::certificate::LAB_DECISION_NOTE,
        "relay_signed": bare[at]["decision"], "relay_public_key": copy["relay_public_key"],
    });
    bare[c]["envelope"] = serde_json::to_value(plane.sign(
        talos_certs::Kind::Certificate,
        serde_json::to_vec(&cert).unwrap(),
    ))
    .unwrap();
    let p = dir.path().join("lab.jsonl");
    write_lines(&p, &bare);
    let (code, out) = verify(&p);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("no person's assertion: that alice decided rests on the relay's and the control stub's word (attempt 1 was in lab mode)"),
        "{out}"
    );
}

/// The Python docs/records.md gives ("Verifying a decision by hand"), run
/// as written on a certificate issued here: alice's decision verifies
/// from the certificate alone; a flipped byte of her signature, or of the
/// relay's, stops it.
#[test]
fn a_decision_verifies_by_hand_as_records_md_says() {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/records.md"))
            .unwrap();
    let script = docs
        .split("### Verifying a decision by hand")
        .nth(1)
        .and_then(|s| s.split("```python\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("the section's python block");
    let (dir, store, id, _) = bundled(&Options::default());
    let script_path = dir.path().join("check_decision.py");
    std::fs::write(&script_path, script).unwrap();
    let cert = talos_control_stub::certificate::certificate(&store, &id).unwrap();
    assert_eq!(cert["issued"], true, "{cert}");
    let run = |cert: &Value| {
        let path = dir.path().join("certificate.json");
        std::fs::write(&path, serde_json::to_vec_pretty(cert).unwrap()).unwrap();
        let out = Command::new("timeout")
            .args(["-k", "2", "60", "python3"])
            .arg(&script_path)
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, out) = run(&cert);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("approved by alice, signed by the relay and by alice's own passkey"),
        "{out}"
    );

    let flip = |text: &str, url: bool| {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        use base64::Engine as _;
        let engine = if url { &URL_SAFE_NO_PAD } else { &STANDARD };
        let mut bytes = engine.decode(text).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        engine.encode(bytes)
    };
    let mut bad = cert.clone();
    let a = &mut bad["proposals"][0]["decided"]["assertion"]["signature"];
    *a = flip(a.as_str().unwrap(), true).into();
    let (code, out) = run(&bad);
    assert_ne!(code, Some(0), "alice's signature flipped: {out}");
    let mut bad = cert.clone();
    let s = &mut bad["proposals"][0]["decided"]["relay_signed"]["signature"];
    *s = flip(s.as_str().unwrap(), false).into();
    let (code, out) = run(&bad);
    assert_ne!(code, Some(0), "the relay's signature flipped: {out}");
    assert!(out.contains("InvalidSignature"), "{out}");
}
