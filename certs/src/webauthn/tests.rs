//! Known answers: the W3C WebAuthn Level 3 test vectors
//! (`certs/testdata/webauthn_w3c_vectors.txt`), made by the specification's
//! own generator, read by this module's parsers and checked by its
//! signature checks; and the challenges' bytes.
//!
//! Most vectors' flags lack UV, which this module requires, so the public
//! functions refuse them with exactly `user_not_verified` (every earlier
//! check passed); the signature of every assertion is checked here through
//! the key parser and the signature check directly.

use std::collections::BTreeMap;

use super::*;

const VECTORS: &str = include_str!("../../testdata/webauthn_w3c_vectors.txt");
const RP_ID: &str = "example.org";
const ORIGIN: &str = "https://example.org";

/// The vectors: section name to field name to bytes.
fn vectors() -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    let mut section = None;
    for line in VECTORS.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.split(']').next().unwrap().to_owned();
            out.insert(name.clone(), BTreeMap::new());
            section = Some(name);
            continue;
        }
        let (field, value) = line.split_once(" = ").expect("field = hex");
        let section = section.as_ref().expect("a field inside a section");
        out.get_mut(section)
            .unwrap()
            .insert(field.to_owned(), hex::decode(value).expect("hex"));
    }
    out
}

/// The COSE key of a vector's registration, found without this module's
/// parsers: the attestation object ends with the authenticator data (its
/// last entry, no extensions), whose key follows the credential id.
fn cose_key_of(v: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let object = &v["registration.attestationObject"];
    let id = &v["registration.credential_id"];
    let at = object
        .windows(id.len())
        .position(|w| w == &id[..])
        .expect("the credential id is in the attestation object");
    object[at + id.len()..].to_vec()
}

fn registration(v: &BTreeMap<String, Vec<u8>>) -> Result<Credential, RegistrationError> {
    let expected = Expected {
        challenge: &v["registration.challenge"],
        rp_id: RP_ID,
        origin: ORIGIN,
    };
    verify_registration(
        &expected,
        &v["registration.attestationObject"],
        &v["registration.clientDataJSON"],
    )
}

fn assertion(v: &BTreeMap<String, Vec<u8>>, key: &[u8]) -> Result<Verified, AssertionError> {
    let expected = Expected {
        challenge: &v["authentication.challenge"],
        rp_id: RP_ID,
        origin: ORIGIN,
    };
    let stored = StoredCredential {
        id: &v["registration.credential_id"],
        public_key_cose: key,
        sign_count: 0,
    };
    verify_assertion(
        &expected,
        &stored,
        &Assertion {
            credential_id: &v["registration.credential_id"],
            authenticator_data: &v["authentication.authenticatorData"],
            client_data_json: &v["authentication.clientDataJSON"],
            signature: &v["authentication.signature"],
            user_handle: None,
        },
    )
}

#[test]
fn the_vectors_are_all_there() {
    let v = vectors();
    assert_eq!(v.len(), 8);
    for (name, fields) in &v {
        assert_eq!(fields.len(), 8, "{name}");
    }
}

#[test]
fn w3c_registrations() {
    let v = vectors();
    // (vector, flags of its registration, the result)
    let cases: [(&str, u8, Result<(), &str>); 8] = [
        // UP BE BS AT, no UV
        ("none.ES256", 0x59, Err("user_not_verified")),
        // UP UV BE BS AT: accepted, packed self-attestation checked
        ("packed-self.ES256", 0x5d, Ok(())),
        ("none.ES256.crossOrigin", 0x45, Err("origin_mismatch")),
        // a 1,023-byte credential id read whole; no UV
        (
            "none.ES256.long-credential-id",
            0x49,
            Err("user_not_verified"),
        ),
        // a certificate chain: refused, whatever it says
        ("packed.ES256", 0x4d, Err("unsupported_attestation")),
        // the key is read before the statement
        ("packed.ES384", 0x59, Err("unsupported_algorithm")),
        ("packed.RS256", 0x5d, Err("unsupported_attestation")),
        ("packed.EdDSA", 0x41, Err("user_not_verified")),
    ];
    for (name, flags, want) in cases {
        let vector = &v[name];
        let object = AttestationObject::parse(&vector["registration.attestationObject"])
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(object.auth_data[32], flags, "{name}");
        let got = registration(vector);
        match want {
            Ok(()) => {
                let credential = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(credential.id, vector["registration.credential_id"]);
                assert_eq!(credential.public_key_cose, cose_key_of(vector));
                assert_eq!(credential.alg, CoseAlgorithm::Es256);
                assert_eq!(credential.sign_count, 0);
                assert!(credential.backup_eligible && credential.backed_up);
                assert_eq!(
                    credential.aaguid.to_vec(),
                    hex::decode("df850e09db6afbdfab51697791506cfc").unwrap()
                );
                assert_eq!(credential.attestation, Attestation::PackedSelf);
            }
            Err(reason) => {
                let e = got.expect_err(name);
                assert_eq!(e.as_str(), reason, "{name}: {e}");
            }
        }
    }
}

#[test]
fn w3c_registrations_parse_whole_whatever_their_verdict() {
    // Each vector's authenticator data, read by this module, gives the
    // credential id and the key bytes found independently above.
    for (name, vector) in vectors() {
        let object = AttestationObject::parse(&vector["registration.attestationObject"]).unwrap();
        match AuthenticatorData::parse(object.auth_data) {
            Ok(auth) => {
                let attested = auth.attested.expect("AT is set");
                assert_eq!(
                    attested.id,
                    &vector["registration.credential_id"][..],
                    "{name}"
                );
                assert_eq!(attested.key_bytes, &cose_key_of(&vector)[..], "{name}");
                assert_eq!(auth.rp_id_hash, digest(&SHA256, RP_ID.as_bytes()).as_ref());
            }
            Err(fault) => {
                assert_eq!(name, "packed.ES384", "{fault:?}");
                assert_eq!(fault, Fault::Key(KeyError::UnsupportedAlgorithm(-35)));
            }
        }
    }
    let long = &vectors()["none.ES256.long-credential-id"];
    assert_eq!(
        long["registration.credential_id"].len(),
        MAX_CREDENTIAL_ID_LEN
    );
}

#[test]
fn w3c_assertions() {
    let v = vectors();
    let cases: [(&str, u8, Result<(), &str>); 8] = [
        ("none.ES256", 0x19, Err("user_not_verified")),
        ("packed-self.ES256", 0x09, Err("user_not_verified")),
        ("none.ES256.crossOrigin", 0x05, Err("origin_mismatch")),
        // UP UV BE: accepted
        ("none.ES256.long-credential-id", 0x0d, Ok(())),
        ("packed.ES256", 0x0d, Ok(())),
        // an ES384 key is no key of this module's
        ("packed.ES384", 0x0d, Err("unknown_credential")),
        ("packed.RS256", 0x19, Err("user_not_verified")),
        ("packed.EdDSA", 0x01, Err("user_not_verified")),
    ];
    for (name, flags, want) in cases {
        let vector = &v[name];
        assert_eq!(
            vector["authentication.authenticatorData"][32], flags,
            "{name}"
        );
        let got = assertion(vector, &cose_key_of(vector));
        match want {
            Ok(()) => {
                let verified = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(verified.sign_count, 0);
                assert_eq!(verified.flags.bits(), flags);
            }
            Err(reason) => {
                let e = got.expect_err(name);
                assert_eq!(e.as_str(), reason, "{name}: {e}");
            }
        }
    }
}

#[test]
fn w3c_signatures_verify_under_their_keys_and_only_so() {
    // ES256 (ASN.1 DER), RS256 (PKCS#1 v1.5, a 3,482-bit modulus) and
    // Ed25519 (raw) signatures from an independent generator.
    let mut seen = Vec::new();
    for (name, vector) in vectors() {
        let key = match PublicKey::parse(&cose_key_of(&vector)) {
            Ok(key) => key,
            Err(e) => {
                assert_eq!(name, "packed.ES384", "{e}");
                continue;
            }
        };
        seen.push(key.alg());
        let message = signed_message(
            &vector["authentication.authenticatorData"],
            &vector["authentication.clientDataJSON"],
        );
        let signature = &vector["authentication.signature"];
        assert!(key.verify(&message, signature), "{name}");
        let mut bad = signature.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(!key.verify(&message, &bad), "{name}");
        let mut other = message.clone();
        other[33] ^= 1;
        assert!(!key.verify(&other, signature), "{name}");
    }
    for alg in CoseAlgorithm::ALL {
        assert!(seen.contains(&alg), "{alg:?}");
    }
}

#[test]
fn w3c_client_data_with_extra_members_is_read() {
    // The registration vectors with client_data_gen_flags bit 0 carry an
    // `extraData` member: allowed, as the spec says.
    let v = vectors();
    let vector = &v["packed-self.ES256"];
    let json = &vector["registration.clientDataJSON"];
    assert!(std::str::from_utf8(json).unwrap().contains("\"extraData\""));
    let expected = Expected {
        challenge: &vector["registration.challenge"],
        rp_id: RP_ID,
        origin: ORIGIN,
    };
    assert_eq!(check_client_data(json, TYPE_CREATE, &expected), Ok(()));
}

#[test]
fn challenges_known_answers() {
    // Computed with Python's hashlib from the module's documented layout.
    let digest = "ab".repeat(48);
    assert_eq!(
        lower_hex(&decision_challenge(&digest, Verdict::Approved)),
        "281079b6aa411655579893b844cc64606f9a4584371118fb65859987b564a919"
    );
    assert_eq!(
        lower_hex(&decision_challenge(&digest, Verdict::Declined)),
        "232df670daa0d5de0ce1dc0738af4bab6c5c92afaccd84e85e60d5867336e6eb"
    );
    assert_eq!(
        lower_hex(&command_challenge("revoke_all", "sbx-1", &"0f".repeat(16))),
        "7f6c60484d390667a90cc88fbaa4a7972ba0bc694351db2288e28a09fb1612dc"
    );
}

#[test]
fn key_parser_refusals() {
    let good_x = "afefa16f97ca9b2d23eb86ccb64098d20db90856062eb249c33a9b672f26df61";
    let good_y = "930a56b87a2fca66334b03458abf879717c12cc68ed73290af2e2664796b9220";
    // hex, spaces allowed between items
    let key = |text: String| hex::decode(text.replace(' ', "")).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        // the none.ES256 vector's key, as given
        (key(format!("a5010203262001215820{good_x}225820{good_y}")), "ok"),
        // labels in another order read the same
        (key(format!("a5225820{good_y}215820{good_x}2001032601 02")), "ok"),
        // y of another point: off the curve
        (key(format!("a5010203262001215820{good_x}225820{good_x}")), "bad_key"),
        // compressed point
        (key(format!("a5010203262001215820{good_x}22f5")), "bad_key"),
        // P-384 named with ES256
        (key(format!("a5010203262002215820{good_x}225820{good_y}")), "bad_key"),
        // OKP named with ES256
        (key(format!("a5010103262001215820{good_x}225820{good_y}")), "bad_key"),
        // x of 31 bytes
        (key(format!("a501020326200121581f{}225820{good_y}", &good_x[2..])), "bad_key"),
        // ES384, ES512, PS256, ES256K
        (key(format!("a50102033822200221 5820{good_x}225820{good_y}")), "unsupported_algorithm"),
        (key(format!("a5010203382320032158 20{good_x}225820{good_y}")), "unsupported_algorithm"),
        (key(format!("a501030338242001215820{good_x}225820{good_y}")), "unsupported_algorithm"),
        (key(format!("a5010203382e2001215820{good_x}225820{good_y}")), "unsupported_algorithm"),
        // no alg, no kty, a label twice, kty as text
        (key(format!("a40102200121 5820{good_x}225820{good_y}")), "malformed"),
        (key(format!("a4032620012158 20{good_x}225820{good_y}")), "malformed"),
        (key(format!("a6010203260326200121 5820{good_x}225820{good_y}")), "malformed"),
        (key(format!("a5016345433203262001215820{good_x}225820{good_y}")), "malformed"),
        // not a map; empty; bytes after the key
        (key("8101".into()), "malformed"),
        (Vec::new(), "malformed"),
        (key(format!("a5010203262001215820{good_x}225820{good_y}00")), "malformed"),
        // Ed25519: the packed.EdDSA vector's key; Ed448 (crv 7); 31 bytes
        (
            key("a4010103272006215820 44e06ddd331c36a8dc667bab52bcae63486c916aa5e339e6acebaa84934bf832".into()),
            "ok",
        ),
        (
            key("a4010103272007215820 44e06ddd331c36a8dc667bab52bcae63486c916aa5e339e6acebaa84934bf832".into()),
            "bad_key",
        ),
        (
            key("a401010327200621581f e06ddd331c36a8dc667bab52bcae63486c916aa5e339e6acebaa84934bf832".into()),
            "bad_key",
        ),
        // RSA: 1,024 bits; 2,048 bits but even; e = 1; e of 5 bytes; n as an integer
        (key(format!("a401030339010020588 0{}2143010001", "ff".repeat(128))), "bad_key"),
        (key(format!("a40103033901002059010 0{}fe2143010001", "ff".repeat(255))), "bad_key"),
        (key(format!("a40103033901002059010 0{}214101", "ff".repeat(256))), "bad_key"),
        (key(format!("a40103033901002059010 0{}21450100000001", "ff".repeat(256))), "bad_key"),
        (key("a4010303390100200121 43010001".into()), "bad_key"),
    ];
    for (i, (bytes, want)) in cases.iter().enumerate() {
        let got = check_public_key(bytes);
        let name = match &got {
            Ok(_) => "ok",
            Err(e) => e.as_str(),
        };
        assert_eq!(name, *want, "case {i}: {got:?}");
    }
}
