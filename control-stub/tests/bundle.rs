//! The certificate bundle from the store, checked by the independent
//! verifier (`verifier/verify_bundle.py`, run as a reviewer runs it): a
//! synthetic session with real signatures (`synth`) on SQLite or
//! PostgreSQL (`TALOS_TEST_STORE`), its bundle verified; the bundle holds
//! nothing secret; a person's passkey assertion on a decision is checked
//! when present. The tampering of a real pair's bundle is in the
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

/// A person's passkey assertion on a decision (the people's issue puts it
/// there): a key made here signs authData || SHA-256(clientDataJSON) over
/// the challenge the card's digest and the verdict give; the verifier
/// checks it, and refuses it for another verdict, another relying party,
/// without user verification, or signed by another key.
#[test]
fn a_persons_assertion_on_a_decision_is_checked_when_present() {
    use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_ASN1_SIGNING};
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use base64::Engine as _;

    let (dir, _store, _id, path) = bundled(&Options::default());
    let items = lines(&path);
    let at = items
        .iter()
        .position(|v| v["item"] == "proposal")
        .expect("a decided card");
    let digest = items[at]["digest"].as_str().unwrap().to_owned();

    let rng = aws_lc_rs::rand::SystemRandom::new();
    let make = || {
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap()
    };
    let (alice, mallory) = (make(), make());
    // SubjectPublicKeyInfo of a P-256 point.
    let spki = |k: &EcdsaKeyPair| {
        let mut der = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
        der.extend_from_slice(k.public_key().as_ref());
        STANDARD.encode(der)
    };
    let assertion = |signer: &EcdsaKeyPair, verdict: &str, rp: &str, flags: u8| {
        let mut challenge = b"talos-webauthn-v1\0decision\0".to_vec();
        challenge.extend_from_slice(digest.as_bytes());
        challenge.push(0);
        challenge.extend_from_slice(verdict.as_bytes());
        let challenge = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &challenge);
        let client = serde_json::to_vec(&serde_json::json!({
            "type": "webauthn.get",
            "challenge": URL_SAFE_NO_PAD.encode(challenge.as_ref()),
            "origin": "https://approve.hangar.test",
            "crossOrigin": false,
        }))
        .unwrap();
        let mut auth = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, rp.as_bytes())
            .as_ref()
            .to_vec();
        auth.push(flags);
        auth.extend_from_slice(&7u32.to_be_bytes());
        let mut signed = auth.clone();
        signed.extend_from_slice(
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &client).as_ref(),
        );
        let signature = signer.sign(&rng, &signed).unwrap();
        serde_json::json!({
            "name": "alice",
            "public_key": spki(&alice),
            "rp_id": "hangar.test",
            "origin": "https://approve.hangar.test",
            "authenticator_data": STANDARD.encode(&auth),
            "client_data_json": STANDARD.encode(&client),
            "signature": STANDARD.encode(signature.as_ref()),
        })
    };
    let with = |person: Value| {
        let mut items = items.clone();
        items[at]["person"] = person;
        let p = dir.path().join("with-person.jsonl");
        write_lines(&p, &items);
        verify(&p)
    };

    let (code, out) = with(assertion(&alice, "approved", "hangar.test", 0x05));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("alice's passkey signed it (relying party hangar.test"),
        "{out}"
    );
    for (person, why) in [
        (
            assertion(&alice, "declined", "hangar.test", 0x05),
            "the assertion's challenge is not this card's digest and verdict",
        ),
        (
            assertion(&alice, "approved", "elsewhere.test", 0x05),
            "does not name the relying party hangar.test",
        ),
        (
            assertion(&alice, "approved", "hangar.test", 0x01),
            "present and verified (UP, UV)",
        ),
        (
            assertion(&mallory, "approved", "hangar.test", 0x05),
            "the person's assertion: the signature does not verify",
        ),
    ] {
        let (code, out) = with(person);
        assert_eq!(code, 1, "{out}");
        let line = out
            .lines()
            .find(|l| l.starts_with("FAIL decision "))
            .unwrap_or_else(|| panic!("no FAIL line for the decision:\n{out}"));
        assert!(line.contains(why), "{why}: {line}");
    }
}
