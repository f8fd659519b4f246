//! Drop reports: signed by the gateway, verified as reports only, and
//! confirming reset steps 4 and 5 only when digest and names match.

use std::sync::Arc;

use talos_certs::{
    confirms, new_instance_id, verify_drop_report, verify_start_report, BatchWriter, CaParams,
    DropReason, DropReport, GatewayKey, Kind, SessionCa, Signed, StartReport, VerifyError,
};

fn report(ca_digest: &str, secrets: &[&str]) -> DropReport {
    DropReport {
        gateway_id: "gw-a".into(),
        instance: "00112233aabbccdd".into(),
        session_id: "sess-1".into(),
        attempt: 2,
        ca_digest: ca_digest.into(),
        secrets: secrets.iter().map(|s| s.to_string()).collect(),
        reason: DropReason::Pause,
        at: "2026-11-29T10:00:00Z".into(),
    }
}

#[test]
fn signed_report_round_trip() {
    let key = GatewayKey::generate().unwrap();
    let ca = SessionCa::new(&CaParams::new("sess-1", 2, "gw-a", ["api.example.com"])).unwrap();
    let sent = report(ca.digest(), &["openai", "github", "openai"]);
    let signed = sent.sign(&key);
    assert_eq!(signed.kind, Kind::DropReport);

    let got = verify_drop_report(&key.public_key(), &signed).unwrap();
    // Names come back sorted, without repeats.
    assert_eq!(
        got,
        DropReport {
            secrets: vec!["github".into(), "openai".into()],
            ..sent.clone()
        }
    );
    assert!(confirms(&got, ca.digest(), &["github", "openai"]));

    // The exact payload.
    assert_eq!(
        String::from_utf8(signed.payload.clone()).unwrap(),
        format!(
            r#"{{"gateway_id":"gw-a","instance":"00112233aabbccdd","session_id":"sess-1","attempt":2,"ca_digest":"{}","secrets":["github","openai"],"reason":"pause","at":"2026-11-29T10:00:00Z"}}"#,
            ca.digest()
        )
    );
    // Order of names does not change the payload.
    assert_eq!(
        report(ca.digest(), &["github", "openai"]).payload(),
        signed.payload
    );
}

#[test]
fn every_reason_has_its_name() {
    for (reason, name) in [
        (DropReason::Pause, "pause"),
        (DropReason::Interruption, "interruption"),
        (DropReason::End, "end"),
        (DropReason::RevokeAll, "revoke_all"),
        (DropReason::LeaseExpired, "lease_expired"),
        (DropReason::Replaced, "replaced"),
        (DropReason::Shutdown, "shutdown"),
    ] {
        assert_eq!(DropReason::from_name(name), Some(reason));
        assert_eq!(reason.as_str(), name);
        let r = DropReport {
            reason,
            ..report("d", &[])
        };
        let text = String::from_utf8(r.payload()).unwrap();
        assert!(text.contains(&format!(r#""reason":"{name}""#)), "{text}");
    }
}

#[test]
fn only_the_gateway_key_and_the_report_kind_verify() {
    let key = Arc::new(GatewayKey::generate().unwrap());
    let public = key.public_key();
    let signed = report("d", &["github"]).sign(&key);

    let other = GatewayKey::generate().unwrap();
    let err = verify_drop_report(&other.public_key(), &signed).unwrap_err();
    assert_eq!(err.as_str(), "bad_signature");
    let by_other = report("d", &["github"]).sign(&other);
    assert_eq!(
        verify_drop_report(&public, &by_other).unwrap_err().as_str(),
        "bad_signature"
    );

    let mut altered = signed.clone();
    let last = altered.payload.len() - 3;
    altered.payload[last] ^= 0x01;
    assert_eq!(
        verify_drop_report(&public, &altered).unwrap_err().as_str(),
        "bad_signature"
    );

    // A batch is no report, whether labelled as one or not.
    let batch = BatchWriter::new(Arc::clone(&key), "gw-a")
        .seal("t", &[b"{}".to_vec()])
        .unwrap();
    assert_eq!(
        verify_drop_report(&public, &batch).unwrap_err(),
        VerifyError::WrongKind {
            expected: Kind::DropReport,
            got: Kind::Batch
        }
    );
    let relabelled = Signed {
        kind: Kind::DropReport,
        ..batch
    };
    assert_eq!(
        verify_drop_report(&public, &relabelled)
            .unwrap_err()
            .as_str(),
        "bad_signature"
    );
    let as_batch = Signed {
        kind: Kind::Batch,
        ..signed
    };
    assert_eq!(
        verify_drop_report(&public, &as_batch).unwrap_err().as_str(),
        "wrong_kind"
    );
}

#[test]
fn non_canonical_reports_are_malformed() {
    let key = GatewayKey::generate().unwrap();
    let body = r#""gateway_id":"gw-a","instance":"i","session_id":"s","attempt":1,"ca_digest":"d""#;
    for (what, payload) in [
        (
            "names unsorted",
            format!(r#"{{{body},"secrets":["b","a"],"reason":"end","at":"t"}}"#),
        ),
        (
            "names repeated",
            format!(r#"{{{body},"secrets":["a","a"],"reason":"end","at":"t"}}"#),
        ),
        (
            "whitespace",
            format!(r#"{{{body}, "secrets":[],"reason":"end","at":"t"}}"#),
        ),
        (
            "unknown reason",
            format!(r#"{{{body},"secrets":[],"reason":"nap","at":"t"}}"#),
        ),
        (
            "unknown field",
            format!(r#"{{{body},"secrets":[],"reason":"end","at":"t","x":1}}"#),
        ),
        ("not JSON", "report".to_owned()),
    ] {
        let signed = key.sign(Kind::DropReport, payload.into_bytes());
        assert_eq!(
            verify_drop_report(&key.public_key(), &signed)
                .unwrap_err()
                .as_str(),
            "malformed",
            "{what}"
        );
    }
    let canonical = format!(r#"{{{body},"secrets":["a","b"],"reason":"end","at":"t"}}"#);
    let signed = key.sign(Kind::DropReport, canonical.into_bytes());
    verify_drop_report(&key.public_key(), &signed).unwrap();
}

#[test]
fn confirms_only_the_exact_digest_and_names() {
    let digest = "ab".repeat(48);
    let r = report(&digest, &["github", "openai"]);
    let cases: &[(&str, &str, &[&str], bool)] = &[
        ("same", &digest, &["github", "openai"], true),
        ("other order", &digest, &["openai", "github"], true),
        ("repeats", &digest, &["openai", "github", "github"], true),
        (
            "other digest",
            &"cd".repeat(48),
            &["github", "openai"],
            false,
        ),
        (
            "upper-case digest",
            &"AB".repeat(48),
            &["github", "openai"],
            false,
        ),
        ("empty digest", "", &["github", "openai"], false),
        (
            "a name missing from the report",
            &digest,
            &["github", "openai", "aws"],
            false,
        ),
        ("an extra name in the report", &digest, &["github"], false),
        ("no names expected", &digest, &[], false),
        ("other case", &digest, &["GitHub", "openai"], false),
    ];
    for (what, d, names, expected) in cases {
        assert_eq!(confirms(&r, d, names), *expected, "{what}");
    }
    let none = report(&digest, &[]);
    let no_names: &[&str] = &[];
    assert!(confirms(&none, &digest, no_names));
    assert!(!confirms(&none, &digest, &["github"]));
}

#[test]
fn start_reports_are_signed_as_their_own_kind() {
    let key = GatewayKey::generate().unwrap();
    let instance = new_instance_id();
    assert_eq!(instance.len(), 16);
    assert!(instance.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(instance, new_instance_id());
    let report = StartReport {
        gateway_id: "gw-a".into(),
        instance: instance.clone(),
        started_at: "2026-11-29T10:00:00Z".into(),
        key_id: key.key_id(),
        previous_instance: String::new(),
        cut_by_crash: 2,
    };
    let signed = report.sign(&key);
    assert_eq!(signed.kind, Kind::StartReport);
    assert_eq!(
        String::from_utf8(signed.payload.clone()).unwrap(),
        format!(
            r#"{{"gateway_id":"gw-a","instance":"{instance}","started_at":"2026-11-29T10:00:00Z","key_id":"{}","previous_instance":"","cut_by_crash":2}}"#,
            key.key_id()
        )
    );
    assert_eq!(
        verify_start_report(&key.public_key(), &signed).unwrap(),
        report
    );
    // A start report is no drop report, and the reverse.
    assert!(matches!(
        verify_drop_report(&key.public_key(), &signed),
        Err(VerifyError::WrongKind { .. })
    ));
    let relabelled = Signed {
        kind: Kind::DropReport,
        ..signed.clone()
    };
    assert!(verify_start_report(&key.public_key(), &relabelled).is_err());
    // Whitespace is not the canonical encoding.
    let spaced = key.sign(
        Kind::StartReport,
        String::from_utf8(signed.payload.clone())
            .unwrap()
            .replace(",", ", ")
            .into_bytes(),
    );
    assert_eq!(
        verify_start_report(&key.public_key(), &spaced)
            .unwrap_err()
            .as_str(),
        "malformed"
    );
}
