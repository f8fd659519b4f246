//! People's passkeys (`talos_certs::webauthn`), end to end through the
//! software authenticator: every refusal reached by exactly the fault it
//! names, every prefix and every bit flip of valid inputs refused, and
//! the encodings checked against Python's `cryptography` in both
//! directions.

use std::collections::BTreeSet;
use std::process::Command;

use aws_lc_rs::digest::{digest, SHA256};
use talos_certs::webauthn::soft::{Authenticator, Ceremony, SignedAssertion, SoftAttestation};
use talos_certs::webauthn::{
    check_public_key, command_challenge, decision_challenge, find_credential, verify_assertion,
    verify_registration, Assertion, AssertionError, Attestation, CoseAlgorithm, Credential,
    Expected, Flags, RegistrationError, StoredCredential, Verified,
};
use talos_certs::{proposal_digest, sentence, Proposal, ProposalKind, Verdict};

const RP_ID: &str = "people.talos.test";
const ORIGIN: &str = "https://people.talos.test:8443";
const UP_UV: u8 = Flags::UP | Flags::UV;

/// A card the way the gateway makes one.
fn card(path: &str) -> String {
    let p = Proposal {
        proposal_id: "gw-a-1-7f3a".into(),
        gateway_id: "gw-a".into(),
        session_id: "sbx-1".into(),
        attempt: 1,
        tenant: "acme".into(),
        kind: ProposalKind::Request,
        destination: "api.github.com".into(),
        method: "POST".into(),
        path: path.into(),
        attachments: vec!["GITHUB_TOKEN".into()],
        rule: "lock-1".into(),
        tool: String::new(),
        call_digest: String::new(),
        approvers: vec!["alice".into()],
        created_at: "2026-11-29T10:00:00.000Z".into(),
        expires_at: "2026-11-29T10:05:00.000Z".into(),
    };
    proposal_digest(&p, &sentence(&p))
}

fn expected(challenge: &[u8]) -> Expected<'_> {
    Expected {
        challenge,
        rp_id: RP_ID,
        origin: ORIGIN,
    }
}

fn name<T>(result: &Result<T, impl AsName>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.name(),
    }
}

trait AsName {
    fn name(&self) -> &'static str;
}

impl AsName for AssertionError {
    fn name(&self) -> &'static str {
        self.as_str()
    }
}

impl AsName for RegistrationError {
    fn name(&self) -> &'static str {
        self.as_str()
    }
}

/// `authenticatorData || SHA-256(clientDataJSON)`, for re-signing a
/// hand-made `clientDataJSON`.
fn message(authenticator_data: &[u8], client_data_json: &[u8]) -> Vec<u8> {
    let mut m = authenticator_data.to_vec();
    m.extend_from_slice(digest(&SHA256, client_data_json).as_ref());
    m
}

/// `signed` with another `clientDataJSON`, signed again by `by`: a fault
/// in the client data alone.
fn with_client_data(by: &Authenticator, signed: &SignedAssertion, json: &[u8]) -> SignedAssertion {
    SignedAssertion {
        client_data_json: json.to_vec(),
        signature: by.sign(&message(&signed.authenticator_data, json)),
        ..signed.clone()
    }
}

/// Alice's passkey, Mallory's, and the decision on one card.
struct Decision {
    alice: Authenticator,
    mallory: Authenticator,
    card: String,
    approved: [u8; 32],
}

impl Decision {
    fn new(alg: CoseAlgorithm) -> Decision {
        let card = card("/repos/acme/widgets/merges");
        Decision {
            alice: Authenticator::new(alg),
            mallory: Authenticator::new(CoseAlgorithm::Es256),
            approved: decision_challenge(&card, Verdict::Approved),
            card,
        }
    }

    /// Alice approving the card, right in every field.
    fn get(&self) -> Ceremony {
        Ceremony::get(&expected(&self.approved)).sign_count(1)
    }

    /// The gateway's check of an approval, Alice's count so far `highest`.
    fn check(&self, highest: u32, signed: &SignedAssertion) -> Result<Verified, AssertionError> {
        verify_assertion(
            &expected(&self.approved),
            &self.alice.stored(highest),
            &signed.as_assertion(),
        )
    }
}

macro_rules! table {
    ($($what:literal => $want:literal: $result:expr;)*) => {{
        let mut seen = BTreeSet::new();
        $(
            let result = $result;
            assert_eq!(name(&result), $want, "{}: {:?}", $what, result);
            seen.insert($want);
        )*
        seen
    }};
}

#[test]
fn every_assertion_refusal_is_reached_by_exactly_its_fault() {
    let d = Decision::new(CoseAlgorithm::Es256);
    let alice = &d.alice;
    let right = alice.assert(&d.get());
    let declined = decision_challenge(&d.card, Verdict::Declined);
    let other_card = decision_challenge(&card("/repos/acme/widgets"), Verdict::Approved);
    let revoke = command_challenge("revoke_all", "sbx-1", &"0f".repeat(16));
    let json = |text: &str| with_client_data(alice, &right, text.as_bytes());
    let b64 = |c: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(c)
    };
    let challenge = b64(&d.approved);
    let credprotect = hex::decode("a16b6372656450726f7465637402").unwrap();

    let seen = table! {
        "right" => "ok": d.check(0, &right);
        "both counts 0: the authenticator keeps none" => "ok": d.check(0, &alice.assert(&d.get().sign_count(0)));
        "the count goes up" => "ok": d.check(41, &alice.assert(&d.get().sign_count(42)));
        "the count at its maximum" => "ok": d.check(u32::MAX - 1, &alice.assert(&d.get().sign_count(u32::MAX)));
        "a synced passkey (BE, BS)" => "ok": d.check(0, &alice.assert(&d.get().flags(UP_UV | Flags::BE | Flags::BS)));
        "extensions (ED)" => "ok": d.check(0, &alice.assert(&Ceremony { extensions: Some(credprotect.clone()), ..d.get().flags(UP_UV | Flags::ED) }));
        "members the spec may add" => "ok": d.check(0, &alice.assert(&Ceremony {
            extra_client_data: vec![
                r#""topOrigin":"https://elsewhere.example""#.into(),
                r#""tokenBinding":{"status":"present","id":"AAEC"}"#.into(),
                r#""other_keys_can_be_added_here":"do not compare clientDataJSON against a template. See https://goo.gl/yabPex""#.into(),
            ],
            ..d.get()
        }));
        "no crossOrigin member" => "ok": d.check(0, &alice.assert(&Ceremony { cross_origin: None, ..d.get() }));
        "a user handle" => "ok": d.check(0, &alice.assert(&Ceremony { user_handle: Some(vec![1; 64]), ..d.get() }));
        "escapes in clientDataJSON" => "ok": d.check(0, &json(&format!(r#"{{"type":"webauthn\u002eget","challenge":"{challenge}","origin":"https:\/\/people.talos.test:8443"}}"#)));

        "another person's passkey" => "unknown_credential": d.check(0, &d.mallory.assert(&d.get()));
        "Alice's credential id, key unusable" => "unknown_credential": verify_assertion(
            &expected(&d.approved),
            &StoredCredential { public_key_cose: &[0xa0], ..alice.stored(0) },
            &right.as_assertion(),
        );

        "another key under Alice's credential id" => "bad_signature": d.check(0, &Authenticator::new(CoseAlgorithm::Es256).with_credential_id(alice.credential_id()).assert(&d.get()));
        "an Ed25519 signature for Alice's ES256 key" => "bad_signature": d.check(0, &Authenticator::new(CoseAlgorithm::EdDsa).with_credential_id(alice.credential_id()).assert(&d.get()));
        "a signature of the authenticator data alone" => "bad_signature": d.check(0, &SignedAssertion { signature: alice.sign(&right.authenticator_data), ..right.clone() });
        "no signature" => "bad_signature": d.check(0, &SignedAssertion { signature: Vec::new(), ..right.clone() });

        "another rp id" => "rp_id_mismatch": d.check(0, &alice.assert(&d.get().rp_id("talos.test")));
        "the rp id with a dot" => "rp_id_mismatch": d.check(0, &alice.assert(&d.get().rp_id("people.talos.test.")));

        "another origin" => "origin_mismatch": d.check(0, &alice.assert(&d.get().origin("https://evil.example")));
        "the origin without its port" => "origin_mismatch": d.check(0, &alice.assert(&d.get().origin("https://people.talos.test")));
        "the origin over http" => "origin_mismatch": d.check(0, &alice.assert(&d.get().origin("http://people.talos.test:8443")));
        "the origin with a slash" => "origin_mismatch": d.check(0, &alice.assert(&d.get().origin("https://people.talos.test:8443/")));
        "the origin in upper case" => "origin_mismatch": d.check(0, &alice.assert(&d.get().origin("https://PEOPLE.talos.test:8443")));
        "a cross-origin frame" => "origin_mismatch": d.check(0, &alice.assert(&Ceremony { cross_origin: Some(true), ..d.get() }));

        "a registration's client data" => "wrong_type": d.check(0, &alice.assert(&d.get().client_type("webauthn.create")));
        "a payment's client data" => "wrong_type": d.check(0, &alice.assert(&d.get().client_type("payment.get")));

        "another card" => "challenge_mismatch": d.check(0, &alice.assert(&d.get().challenge(&other_card)));
        "a decline presented as an approval" => "challenge_mismatch": d.check(0, &alice.assert(&d.get().challenge(&declined)));
        "an approval presented as a decline" => "challenge_mismatch": verify_assertion(&expected(&declined), &alice.stored(0), &right.as_assertion());
        "a Revoke All presented as a decision" => "challenge_mismatch": d.check(0, &alice.assert(&d.get().challenge(&revoke)));
        "the challenge padded" => "challenge_mismatch": d.check(0, &json(&format!(r#"{{"type":"webauthn.get","challenge":"{challenge}=","origin":"{ORIGIN}"}}"#)));
        "the challenge in standard base64" => "challenge_mismatch": {
            let c = [0xfb; 32];
            let signed = alice.assert(&d.get().challenge(&c));
            let text = std::str::from_utf8(&signed.client_data_json).unwrap().replace(&b64(&c), &b64(&c).replace('-', "+").replace('_', "/"));
            verify_assertion(&expected(&c), &alice.stored(0), &with_client_data(alice, &signed, text.as_bytes()).as_assertion())
        };

        "UV without UP" => "user_not_present": d.check(0, &alice.assert(&d.get().flags(Flags::UV)));
        "no flags" => "user_not_present": d.check(0, &alice.assert(&d.get().flags(0)));
        "UP without UV" => "user_not_verified": d.check(0, &alice.assert(&d.get().flags(Flags::UP)));
        "UP and BE without UV" => "user_not_verified": d.check(0, &alice.assert(&d.get().flags(Flags::UP | Flags::BE)));

        "the same count again" => "sign_count_replayed": d.check(5, &alice.assert(&d.get().sign_count(5)));
        "a lower count" => "sign_count_replayed": d.check(5, &alice.assert(&d.get().sign_count(4)));
        "the count back at 0" => "sign_count_replayed": d.check(5, &alice.assert(&d.get().sign_count(0)));
        "the maximum again" => "sign_count_replayed": d.check(u32::MAX, &alice.assert(&d.get().sign_count(u32::MAX)));

        "a credential in an assertion (AT)" => "malformed": d.check(0, &alice.assert(&d.get().flags(UP_UV | Flags::AT)));
        "BS without BE" => "malformed": d.check(0, &alice.assert(&d.get().flags(UP_UV | Flags::BS)));
        "ED without extensions" => "malformed": d.check(0, &alice.assert(&d.get().flags(UP_UV | Flags::ED)));
        "extensions without ED" => "malformed": d.check(0, &alice.assert(&Ceremony { extensions: Some(credprotect.clone()), ..d.get() }));
        "extensions that are not a map" => "malformed": d.check(0, &alice.assert(&Ceremony { extensions: Some(vec![0x01]), ..d.get().flags(UP_UV | Flags::ED) }));
        "extensions of indefinite length" => "malformed": d.check(0, &alice.assert(&Ceremony { extensions: Some(vec![0xbf, 0xff]), ..d.get().flags(UP_UV | Flags::ED) }));
        "a byte after the authenticator data" => "malformed": d.check(0, &alice.assert(&Ceremony { extensions: Some(vec![0x00]), ..d.get() }));
        "authenticator data of 36 bytes" => "malformed": d.check(0, &SignedAssertion { authenticator_data: right.authenticator_data[..36].to_vec(), ..right.clone() });
        "clientDataJSON not JSON" => "malformed": d.check(0, &json("webauthn.get"));
        "clientDataJSON an array" => "malformed": d.check(0, &json(&format!(r#"["webauthn.get","{challenge}","{ORIGIN}"]"#)));
        "clientDataJSON without an origin" => "malformed": d.check(0, &json(&format!(r#"{{"type":"webauthn.get","challenge":"{challenge}"}}"#)));
        "type twice" => "malformed": d.check(0, &json(&format!(r#"{{"type":"webauthn.get","type":"webauthn.get","challenge":"{challenge}","origin":"{ORIGIN}"}}"#)));
        "type a number" => "malformed": d.check(0, &json(&format!(r#"{{"type":7,"challenge":"{challenge}","origin":"{ORIGIN}"}}"#)));
        "crossOrigin a string" => "malformed": d.check(0, &json(&format!(r#"{{"type":"webauthn.get","challenge":"{challenge}","origin":"{ORIGIN}","crossOrigin":"false"}}"#)));
        "clientDataJSON not UTF-8" => "malformed": d.check(0, &with_client_data(alice, &right, b"{\"type\":\"webauthn.get\xff\"}"));
        "clientDataJSON with a byte after it" => "malformed": d.check(0, &with_client_data(alice, &right, &[&right.client_data_json[..], b"x"].concat()));
        "clientDataJSON over 4 KiB" => "malformed": d.check(0, &alice.assert(&Ceremony { extra_client_data: vec![format!(r#""pad":"{}""#, "x".repeat(4096))], ..d.get() }));
        "a signature over 1,024 bytes" => "malformed": d.check(0, &SignedAssertion { signature: vec![0x30; 1025], ..right.clone() });
        "a user handle over 64 bytes" => "malformed": d.check(0, &alice.assert(&Ceremony { user_handle: Some(vec![1; 65]), ..d.get() }));
        "a credential id over 1,023 bytes" => "malformed": d.check(0, &SignedAssertion { credential_id: vec![1; 1024], ..right.clone() });
    };
    let all: BTreeSet<_> = AssertionError::NAMES.into_iter().collect();
    let never = BTreeSet::from(["no_assertion"]);
    assert_eq!(
        all.difference(&seen).copied().collect::<BTreeSet<_>>(),
        never,
        "every name but the callers' own is reached"
    );
}

#[test]
fn names_are_issue_42s() {
    assert_eq!(
        AssertionError::NAMES,
        [
            "no_assertion",
            "unknown_credential",
            "rp_id_mismatch",
            "origin_mismatch",
            "wrong_type",
            "challenge_mismatch",
            "user_not_present",
            "user_not_verified",
            "bad_signature",
            "sign_count_replayed",
            "malformed",
        ]
    );
    assert_eq!(AssertionError::NoAssertion.as_str(), "no_assertion");
    let unique: BTreeSet<_> = RegistrationError::NAMES.into_iter().collect();
    assert_eq!(unique.len(), RegistrationError::NAMES.len());
}

#[test]
fn every_algorithm_verifies_and_refuses_a_foreign_signature() {
    for alg in CoseAlgorithm::ALL {
        let d = Decision::new(alg);
        let signed = d.alice.assert(&d.get());
        assert_eq!(
            d.check(0, &signed),
            Ok(Verified {
                sign_count: 1,
                flags: Flags::from_bits(UP_UV)
            }),
            "{alg:?}"
        );
        assert_eq!(check_public_key(d.alice.public_key_cose()), Ok(alg));
        for other in CoseAlgorithm::ALL {
            let forger = Authenticator::new(other).with_credential_id(d.alice.credential_id());
            assert_eq!(
                name(&d.check(0, &forger.assert(&d.get()))),
                "bad_signature",
                "{alg:?} key, {other:?} forger"
            );
        }
    }
}

/// Every proper prefix of each part of a right assertion, and every single
/// bit flipped in each part: all refused, none panics.
#[test]
fn every_prefix_and_every_bit_flip_of_an_assertion_is_refused() {
    for alg in CoseAlgorithm::ALL {
        let d = Decision::new(alg);
        let right = d.alice.assert(&d.get().flags(UP_UV | Flags::BE));
        assert!(d.check(0, &right).is_ok());
        type Part = fn(&mut SignedAssertion) -> &mut Vec<u8>;
        let parts: [(&str, Part); 4] = [
            ("credential id", |s| &mut s.credential_id),
            ("authenticator data", |s| &mut s.authenticator_data),
            ("clientDataJSON", |s| &mut s.client_data_json),
            ("signature", |s| &mut s.signature),
        ];
        let mut checked = 0;
        for (part, field) in parts {
            let len = field(&mut right.clone()).len();
            for cut in 0..len {
                let mut bad = right.clone();
                field(&mut bad).truncate(cut);
                assert!(d.check(0, &bad).is_err(), "{alg:?}: {part} cut at {cut}");
                checked += 1;
            }
            for at in 0..len {
                for bit in 0..8 {
                    let mut bad = right.clone();
                    field(&mut bad)[at] ^= 1 << bit;
                    assert!(
                        d.check(0, &bad).is_err(),
                        "{alg:?}: {part} byte {at} bit {bit}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 1000, "{alg:?}: {checked}");
    }
}

/// A CBOR head with the shortest argument (for hand-made objects).
fn head(out: &mut Vec<u8>, major: u8, arg: usize) {
    let major = major << 5;
    if arg < 24 {
        out.push(major | arg as u8);
    } else if arg < 0x100 {
        out.extend_from_slice(&[major | 24, arg as u8]);
    } else {
        out.push(major | 25);
        out.extend_from_slice(&(arg as u16).to_be_bytes());
    }
}

fn text(out: &mut Vec<u8>, s: &str) {
    head(out, 3, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    head(out, 2, b.len());
    out.extend_from_slice(b);
}

/// An attestation object of `fmt`, the statement given as CBOR, and
/// `auth_data`.
fn object(fmt: &str, statement: &[u8], auth_data: &[u8]) -> Vec<u8> {
    let mut out = vec![0xa3];
    text(&mut out, "fmt");
    text(&mut out, fmt);
    text(&mut out, "attStmt");
    out.extend_from_slice(statement);
    text(&mut out, "authData");
    bytes(&mut out, auth_data);
    out
}

/// A packed statement: `alg`, `sig`, and a one-certificate `x5c` if given.
fn packed(alg: i64, sig: &[u8], x5c: Option<&[u8]>) -> Vec<u8> {
    let mut out = vec![if x5c.is_some() { 0xa3 } else { 0xa2 }];
    text(&mut out, "alg");
    if alg < 0 {
        head(&mut out, 1, (-1 - alg) as usize);
    } else {
        head(&mut out, 0, alg as usize);
    }
    text(&mut out, "sig");
    bytes(&mut out, sig);
    if let Some(cert) = x5c {
        text(&mut out, "x5c");
        out.push(0x81);
        bytes(&mut out, cert);
    }
    out
}

/// Alice's registration authenticator data with its COSE key replaced.
fn with_key(alice: &Authenticator, ceremony: &Ceremony, key: &[u8]) -> Vec<u8> {
    let data = alice.authenticator_data(ceremony);
    let key_at = 37 + 18 + alice.credential_id().len();
    [&data[..key_at], key].concat()
}

#[test]
fn every_registration_refusal_is_reached_by_exactly_its_fault() {
    let challenge = [0x5a; 32];
    let e = expected(&challenge);
    let alice = Authenticator::new(CoseAlgorithm::Es256);
    let mallory = Authenticator::new(CoseAlgorithm::Es256);
    let create = Ceremony::create(&e);
    let right = alice.register(&create);
    let reg = |object: &[u8], json: &[u8]| verify_registration(&e, object, json);
    let made = |c: &Ceremony| {
        let r = alice.register(c);
        verify_registration(&e, &r.attestation_object, &r.client_data_json)
    };
    let cd = &right.client_data_json;
    let ad = &right.authenticator_data;
    let packed_sig = |by: &Authenticator, data: &[u8]| by.sign(&message(data, cd));
    // the W3C packed.ES384 vector's key
    let es384 = hex::decode("a5010203382220022158304866bd8b01da789e9eb806e5eab05ae5a638542296ab057a2f1bbce9b58f8a08b9171390b58a37ac7fffc2c5f45857da2258302a0b024c7f4b72072a1f96bd30a7261aae9571dd39870eb29e55c0941c6b08e89629a1ea1216aa64ce57c2807bf3901a").unwrap();
    let off_curve = hex::decode(format!(
        "a5010203262001215820{}225820{}",
        "11".repeat(32),
        "22".repeat(32)
    ))
    .unwrap();
    let credprotect = hex::decode("a16b6372656450726f7465637402").unwrap();
    let tagged = {
        // the right object with authData's bytes under a tag
        let mut o = right.attestation_object.clone();
        let at = o.len() - ad.len() - 2;
        o.insert(at, 0xd8);
        o.insert(at + 1, 0x40);
        o
    };

    let seen = table! {
        "right (none)" => "ok": reg(&right.attestation_object, cd);
        "packed self-attestation" => "ok": made(&create.clone().attestation(SoftAttestation::PackedSelf));
        "a synced passkey (BE, BS)" => "ok": made(&create.clone().flags(create.flags | Flags::BE | Flags::BS));
        "extensions (ED)" => "ok": made(&Ceremony { extensions: Some(credprotect.clone()), ..create.clone().flags(create.flags | Flags::ED) });
        "an unknown key in the attestation object" => "ok": reg(&[&[0xa4][..], &right.attestation_object[1..], &[0x65], b"epAtt", &[0xf5]].concat(), cd);
        "a longer length head than needed" => "ok": reg(&{
            let mut o = right.attestation_object.clone();
            let at = o.len() - ad.len() - 2;
            assert_eq!(o[at], 0x58);
            o[at] = 0x59;
            o.insert(at + 1, 0);
            o
        }, cd);

        "a get's client data" => "wrong_type": made(&create.clone().client_type("webauthn.get"));
        "another challenge" => "challenge_mismatch": made(&create.clone().challenge(&[0x5b; 32]));
        "another origin" => "origin_mismatch": made(&create.clone().origin("https://people.talos.test"));
        "a cross-origin frame" => "origin_mismatch": made(&Ceremony { cross_origin: Some(true), ..create.clone() });
        "another rp id" => "rp_id_mismatch": made(&create.clone().rp_id("talos.test"));
        "UP clear" => "user_not_present": made(&create.clone().flags(Flags::UV | Flags::AT));
        "UV clear" => "user_not_verified": made(&create.clone().flags(Flags::UP | Flags::AT));

        "an ES384 key" => "unsupported_algorithm": reg(&object("none", &[0xa0], &with_key(&alice, &create, &es384)), cd);
        "a point off the curve" => "bad_key": reg(&object("none", &[0xa0], &with_key(&alice, &create, &off_curve)), cd);

        "tpm" => "unsupported_attestation": reg(&object("tpm", &[0xa0], ad), cd);
        "fido-u2f" => "unsupported_attestation": reg(&object("fido-u2f", &[0xa0], ad), cd);
        "a format of nobody's" => "unsupported_attestation": reg(&object("x-mine", &[0xa0], ad), cd);
        "packed with a certificate chain" => "unsupported_attestation": reg(&object("packed", &packed(-7, &packed_sig(&alice, ad), Some(b"\x30\x00")), ad), cd);

        "none with a statement" => "bad_attestation": reg(&object("none", &packed(-7, &packed_sig(&alice, ad), None), ad), cd);
        "packed naming another alg" => "bad_attestation": reg(&object("packed", &packed(-8, &packed_sig(&alice, ad), None), ad), cd);
        "packed signed by another key" => "bad_attestation": reg(&object("packed", &packed(-7, &packed_sig(&mallory, ad), None), ad), cd);
        "packed signed over other data" => "bad_attestation": reg(&object("packed", &packed(-7, &alice.sign(ad), None), ad), cd);

        "no credential (AT clear)" => "malformed": made(&create.clone().flags(UP_UV));
        "a credential id of 1,024 bytes" => "malformed": {
            let long = Authenticator::new(CoseAlgorithm::Es256).with_credential_id(&[7; 1024]);
            let r = long.register(&create);
            reg(&r.attestation_object, &r.client_data_json)
        };
        "an empty credential id" => "malformed": {
            let empty = Authenticator::new(CoseAlgorithm::Es256).with_credential_id(&[]);
            let r = empty.register(&create);
            reg(&r.attestation_object, &r.client_data_json)
        };
        "a packed statement without sig" => "malformed": reg(&object("packed", &[&[0xa1, 0x63][..], b"alg", &[0x26]].concat(), ad), cd);
        "a packed statement with another key" => "malformed": reg(&object("packed", &{
            let mut s = packed(-7, &packed_sig(&alice, ad), None);
            s[0] = 0xa3;
            s.extend_from_slice(&[0x61, b'x', 0x01]);
            s
        }, ad), cd);
        "an array, not a map" => "malformed": reg(&[&[0x83][..], &right.attestation_object[1..]].concat(), cd);
        "fmt twice" => "malformed": reg(&[&[0xa4, 0x63][..], b"fmt", &[0x64], b"none", &right.attestation_object[1..]].concat(), cd);
        "no authData" => "malformed": reg(&[&[0xa2][..], &right.attestation_object[1..right.attestation_object.len() - ad.len() - 11]].concat(), cd);
        "authData under a tag" => "malformed": reg(&tagged, cd);
        "a byte after the object" => "malformed": reg(&[&right.attestation_object[..], &[0]].concat(), cd);
        "an object over 16 KiB" => "malformed": reg(&[&right.attestation_object[..], &vec![0; 16 * 1024]].concat(), cd);
        "clientDataJSON not JSON" => "malformed": reg(&right.attestation_object, b"{");
    };
    let all: BTreeSet<_> = RegistrationError::NAMES.into_iter().chain(["ok"]).collect();
    assert_eq!(all, seen, "every name is reached");
}

#[test]
fn registration_reports_the_credential() {
    for alg in CoseAlgorithm::ALL {
        for attestation in [SoftAttestation::None, SoftAttestation::PackedSelf] {
            let challenge = [9; 32];
            let e = expected(&challenge);
            let phone = Authenticator::new(alg);
            let ceremony = Ceremony::create(&e)
                .attestation(attestation)
                .flags(Flags::UP | Flags::UV | Flags::AT | Flags::BE)
                .sign_count(3);
            let made = phone.register(&ceremony);
            let credential =
                verify_registration(&e, &made.attestation_object, &made.client_data_json)
                    .unwrap_or_else(|e| panic!("{alg:?} {attestation:?}: {e}"));
            assert_eq!(
                credential,
                Credential {
                    id: phone.credential_id().to_vec(),
                    public_key_cose: phone.public_key_cose().to_vec(),
                    alg,
                    sign_count: 3,
                    backup_eligible: true,
                    backed_up: false,
                    aaguid: phone.aaguid(),
                    attestation: match attestation {
                        SoftAttestation::None => Attestation::None,
                        SoftAttestation::PackedSelf => Attestation::PackedSelf,
                    },
                }
            );
            // The stored credential verifies the next sign-in.
            let signed = phone.assert(&Ceremony::get(&e).sign_count(4));
            assert_eq!(
                verify_assertion(&e, &credential.stored(), &signed.as_assertion())
                    .map(|v| v.sign_count),
                Ok(4)
            );
        }
    }
}

/// Every proper prefix of a registration's inputs is refused; every bit
/// flip of a self-attested one is refused (its signature covers them all);
/// a bit flip of a `none` one, which nothing signs, is refused or at most
/// changes what no check covers, never the key.
#[test]
fn every_prefix_and_every_bit_flip_of_a_registration() {
    let challenge = [0x42; 32];
    let e = expected(&challenge);
    let phone = Authenticator::new(CoseAlgorithm::Es256);
    for attestation in [SoftAttestation::None, SoftAttestation::PackedSelf] {
        let made = phone.register(&Ceremony::create(&e).attestation(attestation));
        let right =
            verify_registration(&e, &made.attestation_object, &made.client_data_json).unwrap();
        for cut in 0..made.attestation_object.len() {
            let r =
                verify_registration(&e, &made.attestation_object[..cut], &made.client_data_json);
            assert_eq!(name(&r), "malformed", "{attestation:?} object cut at {cut}");
        }
        for cut in 0..made.client_data_json.len() {
            let r =
                verify_registration(&e, &made.attestation_object, &made.client_data_json[..cut]);
            assert_eq!(
                name(&r),
                "malformed",
                "{attestation:?} clientDataJSON cut at {cut}"
            );
        }
        let auth_at = made.attestation_object.len() - made.authenticator_data.len();
        let mut accepted = 0;
        for (part, len) in [
            ("object", made.attestation_object.len()),
            ("clientDataJSON", made.client_data_json.len()),
        ] {
            for at in 0..len {
                for bit in 0..8 {
                    let (mut object, mut json) = (
                        made.attestation_object.clone(),
                        made.client_data_json.clone(),
                    );
                    let target = if part == "object" {
                        &mut object
                    } else {
                        &mut json
                    };
                    target[at] ^= 1 << bit;
                    let what = format!("{attestation:?} {part} byte {at} bit {bit}");
                    let Ok(credential) = verify_registration(&e, &object, &json) else {
                        continue;
                    };
                    accepted += 1;
                    assert_eq!(
                        attestation,
                        SoftAttestation::None,
                        "{what}: signed, yet accepted"
                    );
                    assert_eq!(credential.public_key_cose, right.public_key_cose, "{what}");
                    if part == "object" {
                        // never the rp id hash, UP, UV, AT or ED
                        let in_auth = at.checked_sub(auth_at);
                        assert!(!matches!(in_auth, Some(0..=31)), "{what}: the rp id hash");
                        if in_auth == Some(32) {
                            assert!(![0, 2, 6, 7].contains(&bit), "{what}: a flag checked");
                        }
                    }
                }
            }
        }
        if attestation == SoftAttestation::None {
            // the AAGUID, count, credential id and BE/RFU bits are unsigned
            assert!(accepted > 0);
        }
    }
}

#[test]
fn find_credential_picks_one_or_none() {
    let keys = [
        ("alice", Authenticator::new(CoseAlgorithm::Es256)),
        ("alice", Authenticator::new(CoseAlgorithm::EdDsa)),
        ("bob", Authenticator::new(CoseAlgorithm::Es256)),
    ];
    fn id_of<'k>(k: &'k (&str, Authenticator)) -> &'k [u8] {
        k.1.credential_id()
    }
    for (owner, key) in &keys {
        let found = find_credential(&keys, key.credential_id(), id_of).unwrap();
        assert_eq!(found.0, *owner);
        assert_eq!(found.1.credential_id(), key.credential_id());
    }
    let stranger = Authenticator::new(CoseAlgorithm::Es256);
    assert_eq!(
        find_credential(&keys, stranger.credential_id(), id_of)
            .unwrap_err()
            .as_str(),
        "unknown_credential"
    );
    // Mallory listed with Alice's credential id: whose would it be?
    let mallory =
        Authenticator::new(CoseAlgorithm::Es256).with_credential_id(keys[0].1.credential_id());
    let twice = [keys[0].1.stored(0), mallory.stored(0)];
    fn stored_id<'k>(s: &'k StoredCredential<'_>) -> &'k [u8] {
        s.id
    }
    let found = find_credential(&twice, keys[0].1.credential_id(), stored_id);
    assert_eq!(
        found.map(|_| ()).unwrap_err().as_str(),
        "unknown_credential"
    );
}

#[test]
fn debug_prints_no_blobs() {
    let challenge = [1; 32];
    let e = expected(&challenge);
    let phone = Authenticator::new(CoseAlgorithm::Rs256);
    let made = phone.register(&Ceremony::create(&e));
    let credential =
        verify_registration(&e, &made.attestation_object, &made.client_data_json).unwrap();
    let signed = phone.assert(&Ceremony::get(&e).sign_count(1));
    let key_hex = hex::encode(phone.public_key_cose());
    let signature_hex = hex::encode(&signed.signature);
    for text in [
        format!("{credential:?}"),
        format!("{:?}", credential.stored()),
        format!("{:?}", signed.as_assertion()),
        format!("{phone:?}"),
    ] {
        assert!(text.contains(&hex::encode(phone.credential_id())), "{text}");
        assert!(!text.contains(&key_hex[..64]), "{text}");
        assert!(!text.contains(&signature_hex[..64]), "{text}");
        assert!(!text.contains("webauthn.get"), "{text}");
        assert!(text.len() < 600, "{text}");
    }
    assert_eq!(
        format!("{:?}", Flags::from_bits(0x1d)),
        "Flags(0x1d UP UV BE BS)"
    );
}

/// The module's documented Python, run as written.
fn documented_python() -> String {
    let source = include_str!("../src/webauthn.rs");
    let start = source.find("//! ```python\n").expect("the python block") + "//! ```python\n".len();
    let end = start + source[start..].find("//! ```\n").expect("its end");
    source[start..end]
        .lines()
        .map(|l| {
            l.strip_prefix("//! ")
                .unwrap_or(l.strip_prefix("//!").unwrap_or(l))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn python(program: &str, args: &[&str]) -> String {
    let output = Command::new("python3")
        .arg("-c")
        .arg(program)
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        output.status.success(),
        "python3 failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_documented_python_computes_the_same_challenges() {
    let program = format!(
        "{}\nimport sys\n\
         d, c, s, n = sys.argv[1:5]\n\
         print(decision_challenge(d, 'approved').hex())\n\
         print(decision_challenge(d, 'declined').hex())\n\
         print(command_challenge(c, s, n).hex())\n\
         print(client_data_challenge(decision_challenge(d, 'approved')))\n",
        documented_python()
    );
    let digest = card("/repos/acme/widgets/merges");
    let nonce = "9f".repeat(16);
    let out = python(&program, &[&digest, "revoke_all", "sbx-1.a_b", &nonce]);
    let approved = decision_challenge(&digest, Verdict::Approved);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], hex::encode(approved));
    assert_eq!(
        lines[1],
        hex::encode(decision_challenge(&digest, Verdict::Declined))
    );
    assert_eq!(
        lines[2],
        hex::encode(command_challenge("revoke_all", "sbx-1.a_b", &nonce))
    );
    // what a browser puts in clientDataJSON for that challenge
    let phone = Authenticator::new(CoseAlgorithm::Es256);
    let signed = phone.assert(&Ceremony::get(&expected(&approved)));
    let json: serde_json::Value = serde_json::from_slice(&signed.client_data_json).unwrap();
    assert_eq!(json["challenge"], lines[3]);
}

/// A tiny CBOR reader in Python for the COSE keys, so the key encoding too
/// is read by code that shares nothing with the crate's.
const PYTHON_COSE: &str = r#"
import hashlib, json, sys
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

def cbor(b, i=0):
    major, info = b[i] >> 5, b[i] & 31
    i += 1
    if info < 24: arg = info
    else:
        n = {24: 1, 25: 2, 26: 4, 27: 8}[info]
        arg = int.from_bytes(b[i:i + n], "big"); i += n
    if major == 0: return arg, i
    if major == 1: return -1 - arg, i
    if major == 2: return b[i:i + arg], i + arg
    if major == 5:
        out = {}
        for _ in range(arg):
            k, i = cbor(b, i); v, i = cbor(b, i); out[k] = v
        return out, i
    raise ValueError("not in a COSE key")

def public_key(cose):
    key, end = cbor(cose)
    assert end == len(cose)
    if key[3] == -7:
        assert key[1] == 2 and key[-1] == 1
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + key[-2] + key[-3])
    if key[3] == -8:
        assert key[1] == 1 and key[-1] == 6
        return ed25519.Ed25519PublicKey.from_public_bytes(key[-2])
    if key[3] == -257:
        assert key[1] == 3
        return rsa.RSAPublicNumbers(int.from_bytes(key[-2], "big"), int.from_bytes(key[-1], "big")).public_key()

def verify(key, signature, message):
    if isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    elif isinstance(key, ed25519.Ed25519PublicKey):
        key.verify(signature, message)
    else:
        key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
"#;

#[test]
fn python_verifies_what_the_soft_authenticator_signs() {
    let program = format!(
        "{PYTHON_COSE}\n\
         cose, auth, client, sig, rp = [bytes.fromhex(a) for a in sys.argv[1:5]] + [sys.argv[5]]\n\
         assert auth[:32] == hashlib.sha256(rp.encode()).digest()\n\
         assert auth[32] & 0x05 == 0x05\n\
         message = auth + hashlib.sha256(client).digest()\n\
         key = public_key(cose)\n\
         verify(key, sig, message)\n\
         try:\n    verify(key, sig, message + b'x'); print('forged')\n\
         except InvalidSignature:\n    print('verified')\n"
    );
    for alg in CoseAlgorithm::ALL {
        let d = Decision::new(alg);
        let signed = d.alice.assert(&d.get());
        let out = python(
            &program,
            &[
                &hex::encode(d.alice.public_key_cose()),
                &hex::encode(&signed.authenticator_data),
                &hex::encode(&signed.client_data_json),
                &hex::encode(&signed.signature),
                RP_ID,
            ],
        );
        assert_eq!(out.trim(), "verified", "{alg:?}");
    }
}

/// The SubjectPublicKeyInfo the bundle carries for an auditor is, byte for
/// byte, what Python's `cryptography` makes of the same COSE key read by
/// its own CBOR reader, and `openssl` reads it.
#[test]
fn the_spki_form_of_each_key_is_pythons_and_openssls() {
    let program = format!(
        "{PYTHON_COSE}\n\
         from cryptography.hazmat.primitives import serialization\n\
         key = public_key(bytes.fromhex(sys.argv[1]))\n\
         print(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo).hex())\n"
    );
    for alg in CoseAlgorithm::ALL {
        let phone = Authenticator::new(alg);
        let spki = talos_certs::webauthn::public_key_spki_der(phone.public_key_cose()).unwrap();
        let out = python(&program, &[&hex::encode(phone.public_key_cose())]);
        assert_eq!(out.trim(), hex::encode(&spki), "{alg:?}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key.der");
        std::fs::write(&file, &spki).unwrap();
        let openssl = Command::new("openssl")
            .args(["pkey", "-pubin", "-inform", "DER", "-noout", "-in"])
            .arg(&file)
            .output()
            .expect("run openssl");
        assert!(openssl.status.success(), "{alg:?}: {openssl:?}");
    }
    assert!(talos_certs::webauthn::public_key_spki_der(&[0xa0]).is_err());
}

/// Python's `cryptography` as an independent authenticator: its own keys,
/// its own COSE and authenticator data, its own DER; the crate verifies.
#[test]
fn the_crate_verifies_what_python_signs() {
    let program = r#"
import hashlib, json, sys, base64
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

alg, challenge, rp, origin, count = sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def bstr(b):
    return (bytes([0x58, len(b)]) if len(b) < 256 else bytes([0x59]) + len(b).to_bytes(2, "big")) + b
if alg == "ES256":
    priv = ec.generate_private_key(ec.SECP256R1())
    n = priv.public_key().public_numbers()
    cose = bytes.fromhex("a5010203262001") + b"\x21" + bstr(n.x.to_bytes(32, "big")) + b"\x22" + bstr(n.y.to_bytes(32, "big"))
    sign = lambda m: priv.sign(m, ec.ECDSA(hashes.SHA256()))
elif alg == "EdDSA":
    priv = ed25519.Ed25519PrivateKey.generate()
    raw = priv.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    cose = bytes.fromhex("a4010103272006") + b"\x21" + bstr(raw)
    sign = lambda m: priv.sign(m)
else:
    priv = rsa.generate_private_key(65537, 2048)
    n = priv.public_key().public_numbers()
    cose = bytes.fromhex("a401030339010020") + bstr(n.n.to_bytes(256, "big")) + b"\x21" + bstr(n.e.to_bytes(3, "big"))
    sign = lambda m: priv.sign(m, padding.PKCS1v15(), hashes.SHA256())
auth = hashlib.sha256(rp.encode()).digest() + bytes([0x05]) + count.to_bytes(4, "big")
client = json.dumps({"type": "webauthn.get", "challenge": base64.urlsafe_b64encode(challenge).rstrip(b"=").decode(),
                     "origin": origin, "crossOrigin": False}).encode()
sig = sign(auth + hashlib.sha256(client).digest())
print(json.dumps({k: v.hex() for k, v in dict(cose=cose, auth=auth, client=client, sig=sig).items()}))
"#;
    let challenge = decision_challenge(&card("/repos/acme/widgets/merges"), Verdict::Approved);
    for alg in CoseAlgorithm::ALL {
        let out = python(
            program,
            &[alg.as_str(), &hex::encode(challenge), RP_ID, ORIGIN, "7"],
        );
        let made: serde_json::Value = serde_json::from_str(&out).unwrap();
        let field = |k: &str| hex::decode(made[k].as_str().unwrap()).unwrap();
        let (cose, auth, client, sig) =
            (field("cose"), field("auth"), field("client"), field("sig"));
        assert_eq!(check_public_key(&cose), Ok(alg));
        let id = [0xc0; 16];
        let stored = StoredCredential {
            id: &id,
            public_key_cose: &cose,
            sign_count: 6,
        };
        let assertion = Assertion {
            credential_id: &id,
            authenticator_data: &auth,
            client_data_json: &client,
            signature: &sig,
            user_handle: None,
        };
        assert_eq!(
            verify_assertion(&expected(&challenge), &stored, &assertion),
            Ok(Verified {
                sign_count: 7,
                flags: Flags::from_bits(UP_UV)
            }),
            "{alg:?}"
        );
        let declined = decision_challenge(&card("/repos/acme/widgets/merges"), Verdict::Declined);
        assert_eq!(
            name(&verify_assertion(&expected(&declined), &stored, &assertion)),
            "challenge_mismatch"
        );
    }
}
