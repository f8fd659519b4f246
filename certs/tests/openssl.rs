//! Every kind of signed envelope verifies with `openssl` alone, from the
//! bytes docs/records.md says the signature covers: "talos-v1", NUL, the
//! kind byte, the payload; Ed25519 under the signer's public key as PEM.

use std::process::Command;

use base64::Engine as _;
use talos_certs::{GatewayKey, Kind, Signed};

/// The Ed25519 SubjectPublicKeyInfo prefix docs/records.md gives.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

fn pem(public: &[u8; 32]) -> String {
    let mut der = SPKI_PREFIX.to_vec();
    der.extend_from_slice(public);
    format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(der)
    )
}

/// The message docs/records.md says is signed.
fn message(kind_byte: u8, payload: &[u8]) -> Vec<u8> {
    let mut m = b"talos-v1\0".to_vec();
    m.push(kind_byte);
    m.extend_from_slice(payload);
    m
}

/// Whether `openssl pkeyutl -verify` accepts `sig` over `msg` under `key`.
fn openssl_verifies(dir: &std::path::Path, key_pem: &str, msg: &[u8], sig: &[u8]) -> bool {
    std::fs::write(dir.join("key.pem"), key_pem).unwrap();
    std::fs::write(dir.join("msg"), msg).unwrap();
    std::fs::write(dir.join("sig"), sig).unwrap();
    let out = Command::new("openssl")
        .args(["pkeyutl", "-verify", "-pubin", "-inkey"])
        .arg(dir.join("key.pem"))
        .arg("-rawin")
        .arg("-in")
        .arg(dir.join("msg"))
        .arg("-sigfile")
        .arg(dir.join("sig"))
        .output()
        .expect("openssl runs (scripts/install-deps.sh installs it)");
    out.status.success()
        && String::from_utf8_lossy(&out.stdout).contains("Signature Verified Successfully")
}

#[test]
fn every_kind_verifies_with_openssl_from_the_documented_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let key = GatewayKey::generate().unwrap();
    let other = GatewayKey::generate().unwrap();
    let payload = br#"{"any":"payload","n":1}"#.to_vec();
    for (kind, byte) in [
        (Kind::Batch, 0x01),
        (Kind::DropReport, 0x02),
        (Kind::Decision, 0x03),
        (Kind::StartReport, 0x04),
        (Kind::Certificate, 0x05),
    ] {
        let signed: Signed = key.sign(kind, payload.clone());
        // The envelope's JSON form, as a reviewer gets it, decoded again.
        let env: serde_json::Value = serde_json::to_value(&signed).unwrap();
        let b64 = |f: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(env[f].as_str().unwrap())
                .unwrap()
        };
        let (got_payload, sig) = (b64("payload"), b64("signature"));
        assert_eq!(got_payload, payload);
        assert_eq!(env["kind"], kind.as_str());
        let msg = message(byte, &got_payload);
        assert!(
            openssl_verifies(dir.path(), &pem(&key.public_key()), &msg, &sig),
            "{kind}"
        );
        // Another kind byte, another payload or another key: refused.
        let wrong_kind = message(byte ^ 0x07, &got_payload);
        assert!(!openssl_verifies(
            dir.path(),
            &pem(&key.public_key()),
            &wrong_kind,
            &sig
        ));
        let altered = message(byte, br#"{"any":"payload","n":2}"#);
        assert!(!openssl_verifies(
            dir.path(),
            &pem(&key.public_key()),
            &altered,
            &sig
        ));
        assert!(!openssl_verifies(
            dir.path(),
            &pem(&other.public_key()),
            &msg,
            &sig
        ));
    }
}
