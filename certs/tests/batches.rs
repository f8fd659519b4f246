//! The control plane takes each gateway's batches once and in order, and
//! detects a lost, repeated, reordered, altered or forged batch.

use std::sync::Arc;

use proptest::prelude::*;
use talos_certs::{
    batch_payload, digest, Accepted, BatchHeader, BatchWriter, ChainState, ChainVerifier,
    DropReason, DropReport, GatewayKey, Kind, Rejection, SealError, Signed, GENESIS_DIGEST,
};

const GW: &str = "gw-a";
const AT: &str = "2026-11-29T10:00:00Z";

/// A small connection record, as the gateway would serialise it.
fn record(n: usize) -> Vec<u8> {
    format!(
        r#"{{"gateway_id":"gw-a","session_id":"sess-1","sni":"api.example.com","verdict":"allowed","n":{n}}}"#
    )
    .into_bytes()
}

fn records(range: std::ops::Range<usize>) -> Vec<Vec<u8>> {
    range.map(record).collect()
}

/// A gateway's key and writer, and a verifier that knows the key.
fn pair() -> (Arc<GatewayKey>, BatchWriter, ChainVerifier) {
    let key = Arc::new(GatewayKey::generate().unwrap());
    let writer = BatchWriter::new(Arc::clone(&key), GW);
    let mut verifier = ChainVerifier::new();
    verifier.register(GW, key.public_key(), ChainState::genesis());
    (key, writer, verifier)
}

/// The refusal's stable name, or what was accepted.
fn outcome(verifier: &mut ChainVerifier, signed: &Signed) -> String {
    match verifier.accept(signed) {
        Ok(Accepted::New { header, .. }) => format!("new {}", header.seq),
        Ok(Accepted::Duplicate { seq, .. }) => format!("duplicate {seq}"),
        Err(rejection) => rejection.as_str().to_owned(),
    }
}

/// A batch payload with any header, signed by `key`: what a gateway that
/// holds the key (but misbehaves) could send.
fn signed_batch(key: &GatewayKey, seq: u64, prev_digest: &str, recs: &[Vec<u8>]) -> Signed {
    let header = BatchHeader {
        gateway_id: GW.into(),
        seq,
        prev_digest: prev_digest.into(),
        created_at: AT.into(),
        count: recs.len() as u32,
    };
    key.sign(Kind::Batch, batch_payload(&header, recs).unwrap())
}

#[test]
fn seal_then_accept_then_duplicate() {
    let (_, mut writer, mut verifier) = pair();
    let first = writer.seal(AT, &records(0..3)).unwrap();
    let second = writer.seal(AT, &records(3..5)).unwrap();

    match verifier.accept(&first).unwrap() {
        Accepted::New {
            header,
            records: got,
            digest: d,
        } => {
            assert_eq!(
                header,
                BatchHeader {
                    gateway_id: GW.into(),
                    seq: 1,
                    prev_digest: GENESIS_DIGEST.into(),
                    created_at: AT.into(),
                    count: 3,
                }
            );
            let got: Vec<Vec<u8>> = got.into_iter().map(String::into_bytes).collect();
            assert_eq!(got, records(0..3));
            assert_eq!(d, digest(&first));
        }
        other => panic!("{other:?}"),
    }
    // Re-delivery is answered, not refused, and changes nothing.
    assert_eq!(
        verifier.accept(&first).unwrap(),
        Accepted::Duplicate {
            gateway_id: GW.into(),
            seq: 1
        }
    );
    assert_eq!(outcome(&mut verifier, &second), "new 2");
    assert_eq!(outcome(&mut verifier, &second), "duplicate 2");
    assert_eq!(outcome(&mut verifier, &first), "duplicate 1");

    let state = verifier.state(GW).unwrap();
    assert_eq!(state.last_seq(), 2);
    assert_eq!(state.last_digest(), digest(&second));
    assert_eq!(writer.last_digest(), digest(&second));
    assert_eq!(writer.next_seq(), 3);
}

#[test]
fn every_flipped_byte_is_refused() {
    let (_, mut writer, mut verifier) = pair();
    let batch = writer.seal(AT, &records(0..2)).unwrap();

    for i in 0..batch.payload.len() {
        let mut altered = batch.clone();
        altered.payload[i] ^= 0x01;
        let got = outcome(&mut verifier, &altered);
        // A flip inside the gateway id names a gateway nobody registered.
        assert!(
            ["bad_signature", "malformed", "unknown_gateway"].contains(&got.as_str()),
            "payload byte {i}: {got}"
        );
    }
    for i in 0..batch.signature.len() {
        let mut altered = batch.clone();
        altered.signature[i] ^= 0x01;
        assert_eq!(
            outcome(&mut verifier, &altered),
            "bad_signature",
            "signature byte {i}"
        );
    }
    for i in 0..batch.key_id.len() {
        let mut altered = batch.clone();
        let mut id = altered.key_id.into_bytes();
        id[i] = if id[i] == b'0' { b'1' } else { b'0' };
        altered.key_id = String::from_utf8(id).unwrap();
        assert_eq!(outcome(&mut verifier, &altered), "bad_signature");
    }
    // A truncated or lengthened signature or payload.
    let mut short = batch.clone();
    short.signature.pop();
    assert_eq!(outcome(&mut verifier, &short), "bad_signature");
    let mut long = batch.clone();
    long.payload.push(b' ');
    assert_eq!(outcome(&mut verifier, &long), "malformed");

    // The envelope as it travels: any flipped byte of its JSON text fails
    // to parse or is refused.
    let json = serde_json::to_vec(&batch).unwrap();
    for i in 0..json.len() {
        let mut altered = json.clone();
        altered[i] ^= 0x01;
        if let Ok(envelope) = serde_json::from_slice::<Signed>(&altered) {
            assert!(
                verifier.accept(&envelope).is_err() || envelope == batch,
                "envelope byte {i}"
            );
        }
    }

    // Nothing was taken meanwhile: the untouched batch is still the first.
    assert_eq!(verifier.state(GW).unwrap().last_seq(), 0);
    assert_eq!(outcome(&mut verifier, &batch), "new 1");
}

#[test]
fn another_key_is_a_bad_signature() {
    let (key, _, mut verifier) = pair();
    let other = Arc::new(GatewayKey::generate().unwrap());
    let forged = BatchWriter::new(Arc::clone(&other), GW)
        .seal(AT, &records(0..1))
        .unwrap();
    assert_eq!(outcome(&mut verifier, &forged), "bad_signature");

    // Naming the right key does not help.
    let disguised = Signed {
        key_id: key.key_id(),
        ..forged
    };
    match verifier.accept(&disguised).unwrap_err() {
        Rejection::BadSignature { gateway_id, key_id } => {
            assert_eq!(gateway_id, GW);
            assert_eq!(key_id, key.key_id());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_gateway() {
    let (_, _, mut verifier) = pair();
    let key = Arc::new(GatewayKey::generate().unwrap());
    let batch = BatchWriter::new(key, "gw-z")
        .seal(AT, &records(0..1))
        .unwrap();
    assert_eq!(
        verifier.accept(&batch).unwrap_err(),
        Rejection::UnknownGateway {
            gateway_id: "gw-z".into()
        }
    );
}

#[test]
fn lost_batch_is_a_gap() {
    let (_, mut writer, mut verifier) = pair();
    let batches: Vec<_> = (0..3)
        .map(|i| writer.seal(AT, &records(i..i + 1)).unwrap())
        .collect();
    assert_eq!(outcome(&mut verifier, &batches[0]), "new 1");
    assert_eq!(
        verifier.accept(&batches[2]).unwrap_err(),
        Rejection::Gap {
            gateway_id: GW.into(),
            expected: 2,
            got: 3
        }
    );
    // Once the lost batch arrives, the chain goes on.
    assert_eq!(outcome(&mut verifier, &batches[1]), "new 2");
    assert_eq!(outcome(&mut verifier, &batches[2]), "new 3");
}

#[test]
fn reordered_batches_are_taken_in_order() {
    let (_, mut writer, mut verifier) = pair();
    let first = writer.seal(AT, &records(0..1)).unwrap();
    let second = writer.seal(AT, &records(1..2)).unwrap();
    assert_eq!(outcome(&mut verifier, &second), "gap");
    assert_eq!(outcome(&mut verifier, &first), "new 1");
    assert_eq!(outcome(&mut verifier, &second), "new 2");
}

#[test]
fn another_batch_with_a_used_seq_is_replayed_different() {
    let (key, mut writer, mut verifier) = pair();
    let first = writer.seal(AT, &records(0..1)).unwrap();
    let second = writer.seal(AT, &records(1..2)).unwrap();
    assert_eq!(outcome(&mut verifier, &first), "new 1");
    assert_eq!(outcome(&mut verifier, &second), "new 2");

    // The same seq and link, other records: signed by the right key.
    let other = signed_batch(&key, 1, GENESIS_DIGEST, &records(7..8));
    assert_eq!(
        verifier.accept(&other).unwrap_err(),
        Rejection::ReplayedDifferent {
            gateway_id: GW.into(),
            seq: 1
        }
    );
    // A writer that forgot what it sealed (restored from stale state).
    let mut forgetful = BatchWriter::restore(key, GW, 1, digest(&first));
    let again = forgetful.seal(AT, &records(9..10)).unwrap();
    assert_eq!(outcome(&mut verifier, &again), "replayed_different");
    assert_eq!(verifier.state(GW).unwrap().last_seq(), 2);
}

#[test]
fn altered_link_is_a_broken_chain() {
    let (key, mut writer, mut verifier) = pair();
    let first = writer.seal(AT, &records(0..1)).unwrap();
    assert_eq!(outcome(&mut verifier, &first), "new 1");

    // Re-signed by the right key, so only the link is wrong.
    let mut wrong = digest(&first).into_bytes();
    wrong[0] = if wrong[0] == b'a' { b'b' } else { b'a' };
    let wrong = String::from_utf8(wrong).unwrap();
    let forked = signed_batch(&key, 2, &wrong, &records(1..2));
    assert_eq!(
        verifier.accept(&forked).unwrap_err(),
        Rejection::BrokenChain {
            gateway_id: GW.into(),
            seq: 2,
            expected: digest(&first),
            got: wrong,
        }
    );
    // The first batch must link to the genesis value.
    let (key, _, mut fresh) = pair();
    let rootless = signed_batch(&key, 1, &digest(&first), &records(0..1));
    assert_eq!(outcome(&mut fresh, &rootless), "broken_chain");
    let rooted = signed_batch(&key, 1, GENESIS_DIGEST, &records(0..1));
    assert_eq!(outcome(&mut fresh, &rooted), "new 1");
}

#[test]
fn a_drop_report_is_not_a_batch() {
    let (key, _, mut verifier) = pair();
    let report = DropReport {
        gateway_id: GW.into(),
        instance: "00112233aabbccdd".into(),
        session_id: "sess-1".into(),
        attempt: 1,
        ca_digest: "ab".repeat(48),
        secrets: vec!["github".into()],
        reason: DropReason::End,
        at: AT.into(),
    }
    .sign(&key);
    assert_eq!(
        verifier.accept(&report).unwrap_err(),
        Rejection::WrongKind {
            got: Kind::DropReport
        }
    );
    // Relabelled: a report's payload is no batch.
    let relabelled = Signed {
        kind: Kind::Batch,
        ..report
    };
    assert_eq!(outcome(&mut verifier, &relabelled), "malformed");

    // A valid batch payload, signed as a drop report, then relabelled: the
    // kind is part of what is signed.
    let header = BatchHeader {
        gateway_id: GW.into(),
        seq: 1,
        prev_digest: GENESIS_DIGEST.into(),
        created_at: AT.into(),
        count: 1,
    };
    let payload = batch_payload(&header, &records(0..1)).unwrap();
    let as_report = key.sign(Kind::DropReport, payload.clone());
    assert_eq!(outcome(&mut verifier, &as_report), "wrong_kind");
    let smuggled = Signed {
        kind: Kind::Batch,
        ..as_report
    };
    assert_eq!(outcome(&mut verifier, &smuggled), "bad_signature");
    let decision = Signed {
        kind: Kind::Batch,
        ..key.sign(Kind::Decision, payload.clone())
    };
    assert_eq!(outcome(&mut verifier, &decision), "bad_signature");
    // Signed as a batch, the same payload is taken.
    assert_eq!(
        outcome(&mut verifier, &key.sign(Kind::Batch, payload)),
        "new 1"
    );
}

/// Payloads that are signed by the right key but are not batches in the
/// canonical encoding.
#[test]
fn non_canonical_payloads_are_malformed() {
    let genesis = GENESIS_DIGEST;
    let cases: &[(&str, String)] = &[
        ("not JSON", "batch".into()),
        ("empty", String::new()),
        (
            "whitespace between fields",
            format!(r#"{{"gateway_id":"gw-a", "seq":1,"prev_digest":"{genesis}","created_at":"t","count":0,"records":[]}}"#),
        ),
        (
            "trailing newline",
            format!("{{\"gateway_id\":\"gw-a\",\"seq\":1,\"prev_digest\":\"{genesis}\",\"created_at\":\"t\",\"count\":0,\"records\":[]}}\n"),
        ),
        (
            "fields reordered",
            format!(r#"{{"seq":1,"gateway_id":"gw-a","prev_digest":"{genesis}","created_at":"t","count":0,"records":[]}}"#),
        ),
        (
            "unknown field",
            format!(r#"{{"gateway_id":"gw-a","seq":1,"prev_digest":"{genesis}","created_at":"t","count":0,"records":[],"x":1}}"#),
        ),
        (
            "missing field",
            format!(r#"{{"gateway_id":"gw-a","seq":1,"prev_digest":"{genesis}","count":0,"records":[]}}"#),
        ),
        (
            "count mismatch",
            format!(r#"{{"gateway_id":"gw-a","seq":1,"prev_digest":"{genesis}","created_at":"t","count":2,"records":[{{}}]}}"#),
        ),
        (
            "record not an object",
            format!(r#"{{"gateway_id":"gw-a","seq":1,"prev_digest":"{genesis}","created_at":"t","count":1,"records":[[1]]}}"#),
        ),
        (
            "whitespace between records",
            format!(r#"{{"gateway_id":"gw-a","seq":1,"prev_digest":"{genesis}","created_at":"t","count":2,"records":[{{}}, {{}}]}}"#),
        ),
        (
            "escaped where no escape is needed",
            format!(r#"{{"gateway_id":"gw-\u0061","seq":1,"prev_digest":"{genesis}","created_at":"t","count":0,"records":[]}}"#),
        ),
        (
            "seq 0",
            format!(r#"{{"gateway_id":"gw-a","seq":0,"prev_digest":"{genesis}","created_at":"t","count":0,"records":[]}}"#),
        ),
        (
            "duplicate field",
            format!(r#"{{"gateway_id":"gw-a","gateway_id":"gw-a","seq":1,"prev_digest":"{genesis}","created_at":"t","count":0,"records":[]}}"#),
        ),
    ];
    let (key, _, mut verifier) = pair();
    for (what, payload) in cases {
        let signed = key.sign(Kind::Batch, payload.clone().into_bytes());
        assert_eq!(outcome(&mut verifier, &signed), "malformed", "{what}");
    }
    // The control: the canonical form of the same batch is taken.
    let canonical = format!(
        r#"{{"gateway_id":"gw-a","seq":1,"prev_digest":"{genesis}","created_at":"t","count":2,"records":[{{}},{{"a":[1, 2]}}]}}"#
    );
    let signed = key.sign(Kind::Batch, canonical.into_bytes());
    assert_eq!(outcome(&mut verifier, &signed), "new 1");
}

#[test]
fn beyond_the_window_is_stale() {
    let key = Arc::new(GatewayKey::generate().unwrap());
    let mut writer = BatchWriter::new(Arc::clone(&key), GW);
    let mut verifier = ChainVerifier::with_window(2);
    verifier.register(GW, key.public_key(), ChainState::genesis());
    let batches: Vec<_> = (0..4)
        .map(|i| writer.seal(AT, &records(i..i + 1)).unwrap())
        .collect();
    for (i, batch) in batches.iter().enumerate() {
        assert_eq!(outcome(&mut verifier, batch), format!("new {}", i + 1));
    }
    assert_eq!(verifier.state(GW).unwrap().recent().len(), 2);
    assert_eq!(outcome(&mut verifier, &batches[3]), "duplicate 4");
    assert_eq!(outcome(&mut verifier, &batches[2]), "duplicate 3");
    assert_eq!(
        verifier.accept(&batches[1]).unwrap_err(),
        Rejection::Stale {
            gateway_id: GW.into(),
            seq: 2,
            oldest_kept: 3
        }
    );
    let other = signed_batch(&key, 1, GENESIS_DIGEST, &records(5..6));
    assert_eq!(outcome(&mut verifier, &other), "stale");
}

#[test]
fn state_survives_a_restart_of_either_side() {
    let (key, mut writer, mut verifier) = pair();
    let first = writer.seal(AT, &records(0..1)).unwrap();
    let second = writer.seal(AT, &records(1..2)).unwrap();
    assert_eq!(outcome(&mut verifier, &first), "new 1");
    assert_eq!(outcome(&mut verifier, &second), "new 2");

    // The control plane persists the state as JSON and loads it again.
    let saved = serde_json::to_string(verifier.state(GW).unwrap()).unwrap();
    assert_eq!(
        saved,
        format!(
            r#"{{"last_seq":2,"recent":["{}","{}"]}}"#,
            digest(&first),
            digest(&second)
        )
    );
    let mut restarted = ChainVerifier::new();
    restarted.register(GW, key.public_key(), serde_json::from_str(&saved).unwrap());
    assert_eq!(outcome(&mut restarted, &first), "duplicate 1");

    // The gateway restores its writer from the last batch it stored.
    let mut writer = BatchWriter::restore(Arc::clone(&key), GW, 2, digest(&second));
    let third = writer.seal(AT, &records(2..3)).unwrap();
    assert_eq!(outcome(&mut restarted, &third), "new 3");

    // Or from the digests it kept itself: only the head is needed.
    let mut from_parts = ChainVerifier::new();
    from_parts.register(
        GW,
        key.public_key(),
        ChainState::new(3, vec![digest(&third)]).unwrap(),
    );
    let fourth = writer.seal(AT, &records(3..4)).unwrap();
    assert_eq!(outcome(&mut from_parts, &fourth), "new 4");
    assert_eq!(outcome(&mut from_parts, &first), "stale");
}

#[test]
fn inconsistent_chain_states_are_refused() {
    let d = "0a".repeat(48);
    for (last_seq, recent, why) in [
        (0, vec![d.clone()], "digests before any batch"),
        (2, vec![], "no head"),
        (1, vec![d.clone(), d.clone()], "more digests than batches"),
        (1, vec!["0A".repeat(48)], "upper case"),
        (1, vec!["0a".repeat(47)], "short"),
    ] {
        assert!(ChainState::new(last_seq, recent).is_err(), "{why}");
    }
    assert!(serde_json::from_str::<ChainState>(r#"{"last_seq":3,"recent":[]}"#).is_err());
    assert_eq!(ChainState::new(0, vec![]).unwrap(), ChainState::genesis());
    assert_eq!(ChainState::genesis().last_digest(), GENESIS_DIGEST);
}

#[test]
fn envelope_travels_as_json() {
    let (_, mut writer, mut verifier) = pair();
    let batch = writer.seal(AT, &records(0..2)).unwrap();
    let json = serde_json::to_string(&batch).unwrap();
    let back: Signed = serde_json::from_str(&json).unwrap();
    assert_eq!(back, batch);
    assert_eq!(outcome(&mut verifier, &back), "new 1");
    // Debug names the payload by size only.
    let debug = format!("{batch:?}");
    assert!(!debug.contains("api.example.com"), "{debug}");
}

#[test]
fn seal_refuses_what_is_not_one_object() {
    let (_, mut writer, _) = pair();
    for (what, bad) in [
        ("array", &b"[1]"[..]),
        ("number", b"1"),
        ("leading space", b" {}"),
        ("trailing newline", b"{}\n"),
        ("two objects", b"{}{}"),
        ("not JSON", b"{"),
        ("not UTF-8", b"{\"a\":\"\xff\"}"),
    ] {
        let recs = vec![record(0), bad.to_vec()];
        match writer.seal(AT, &recs) {
            Err(SealError::NotAnObject { index: 1, .. }) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
    // Nothing advanced.
    assert_eq!(writer.next_seq(), 1);
    assert_eq!(writer.last_digest(), GENESIS_DIGEST);
    // An empty batch is a batch.
    let empty: &[Vec<u8>] = &[];
    let sealed = writer.seal(AT, empty).unwrap();
    assert!(String::from_utf8(sealed.payload)
        .unwrap()
        .ends_with(r#""count":0,"records":[]}"#));
}

#[test]
fn the_encoding_is_deterministic() {
    let header = BatchHeader {
        gateway_id: "gw-\"a\"".into(),
        seq: 7,
        prev_digest: GENESIS_DIGEST.into(),
        created_at: AT.into(),
        count: 2,
    };
    let recs = vec![br#"{"b":1,"a":"\u00e9"}"#.to_vec(), b"{}".to_vec()];
    let payload = batch_payload(&header, &recs).unwrap();
    assert_eq!(
        String::from_utf8(payload.clone()).unwrap(),
        format!(
            r#"{{"gateway_id":"gw-\"a\"","seq":7,"prev_digest":"{GENESIS_DIGEST}","created_at":"{AT}","count":2,"records":[{{"b":1,"a":"\u00e9"}},{{}}]}}"#
        )
    );
    assert_eq!(batch_payload(&header, &recs).unwrap(), payload);
    let mismatched = BatchHeader { count: 3, ..header };
    assert!(matches!(
        batch_payload(&mismatched, &recs),
        Err(SealError::CountMismatch {
            count: 3,
            records: 2
        })
    ));

    // Two writers with the same key and position seal identical batches,
    // signature included (Ed25519 signatures are deterministic).
    let key = Arc::new(GatewayKey::generate().unwrap());
    let mut a = BatchWriter::new(Arc::clone(&key), GW);
    let mut b = BatchWriter::new(key, GW);
    for i in 0..3 {
        assert_eq!(
            a.seal(AT, &records(i..i + 2)).unwrap(),
            b.seal(AT, &records(i..i + 2)).unwrap()
        );
    }
}

/// Any JSON object, serialised compactly as the gateway would.
fn any_record() -> impl Strategy<Value = Vec<u8>> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(serde_json::Value::from),
        any::<bool>().prop_map(serde_json::Value::from),
        ".*".prop_map(serde_json::Value::from),
        Just(serde_json::Value::Null),
    ];
    let value = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(".*", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    prop::collection::btree_map(".{0,12}", value, 0..6).prop_map(|m| {
        serde_json::to_vec(&serde_json::Value::Object(m.into_iter().collect())).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sealed_records_come_back_in_order(
        batches in prop::collection::vec(prop::collection::vec(any_record(), 0..8), 1..4),
        created_at in ".{0,40}",
    ) {
        let (_, mut writer, mut verifier) = pair();
        for (i, recs) in batches.iter().enumerate() {
            let signed = writer.seal(&created_at, recs).unwrap();
            prop_assert_eq!(batch_payload(
                &BatchHeader {
                    gateway_id: GW.into(),
                    seq: i as u64 + 1,
                    prev_digest: verifier.state(GW).unwrap().last_digest().into(),
                    created_at: created_at.clone(),
                    count: recs.len() as u32,
                },
                recs,
            ).unwrap(), signed.payload.clone());
            match verifier.accept(&signed).unwrap() {
                Accepted::New { header, records, .. } => {
                    prop_assert_eq!(header.seq, i as u64 + 1);
                    prop_assert_eq!(&header.created_at, &created_at);
                    let got: Vec<Vec<u8>> = records.into_iter().map(String::into_bytes).collect();
                    prop_assert_eq!(&got, recs);
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }
    }
}
