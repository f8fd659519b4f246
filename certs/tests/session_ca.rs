//! What a session CA and its leaves contain, checked with OpenSSL's own
//! parser where it can read it; what `SessionCa::new` refuses; digests;
//! what `Debug` shows.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use talos_certs::{
    sha384_hex, CaParams, CertError, LeafCache, SessionCa, APPROVALS_NAME, DEFAULT_CA_LIFETIME,
    MAX_CA_LIFETIME, NOT_BEFORE_SKEW,
};

fn params(names: &[&str]) -> CaParams {
    CaParams::new("sess-7f3a", 2, "gw-a", names.iter().copied())
}

fn openssl(args: &[&str]) -> Vec<u8> {
    let output = Command::new("openssl").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

fn write(dir: &Path, file: &str, bytes: &[u8]) -> String {
    let path = dir.join(file);
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_owned()
}

/// OpenSSL's text dump, with line breaks and indentation squeezed to
/// single spaces so field and value read as one line.
fn openssl_text(dir: &Path, pem: &str) -> String {
    let file = write(dir, "cert.pem", pem.as_bytes());
    let text = String::from_utf8(openssl(&["x509", "-in", &file, "-noout", "-text"])).unwrap();
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn digest_is_sha384_of_the_certificate_der() {
    let dir = tempfile::tempdir().unwrap();
    let first = SessionCa::new(&params(&["api.example.com"])).unwrap();
    let digest = first.digest();
    assert_eq!(digest.len(), 96);
    assert!(digest
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    assert_eq!(digest, sha384_hex(first.cert_der()));
    assert_ne!(digest, sha384_hex(first.intermediate_der(0).unwrap()));

    // The same digest from OpenSSL, over the DER it reads from our PEM.
    let pem = write(dir.path(), "ca.pem", first.cert_pem().as_bytes());
    let der = openssl(&["x509", "-in", &pem, "-outform", "DER"]);
    assert_eq!(der, first.cert_der().as_ref(), "PEM does not carry the DER");
    let der_file = write(dir.path(), "ca.der", &der);
    let dgst = String::from_utf8(openssl(&["dgst", "-sha384", "-r", &der_file])).unwrap();
    assert_eq!(dgst.split(' ').next().unwrap(), digest);

    // A second CA for the same session and names has another key, so
    // another certificate and digest.
    let second = SessionCa::new(&params(&["api.example.com"])).unwrap();
    assert_ne!(second.digest(), digest);
}

fn assert_has(text: &str, expected: &[&str]) {
    for expected in expected {
        assert!(text.contains(expected), "missing {expected:?} in {text}");
    }
}

const ROOT_CN: &str = "CN = TALOS session CA sess-7f3a attempt 2 (gw-a)";

#[test]
fn root_and_intermediate_fields() {
    let dir = tempfile::tempdir().unwrap();
    let ca = SessionCa::new(&params(&["github.com", "api.example.com"])).unwrap();
    assert_eq!(ca.level_count(), 1);
    assert!(ca.intermediate_der(1).is_none());

    let root = openssl_text(dir.path(), &ca.cert_pem());
    assert_has(
        &root,
        &[
            &format!("Subject: {ROOT_CN} "),
            &format!("Issuer: {ROOT_CN} "),
            "Public Key Algorithm: id-ecPublicKey",
            "NIST CURVE: P-256",
            "Signature Algorithm: ecdsa-with-SHA256",
            "X509v3 Basic Constraints: critical CA:TRUE, pathlen:1",
            "X509v3 Key Usage: critical Certificate Sign, CRL Sign",
            "X509v3 Subject Key Identifier:",
            // No name lies under another: the root alone is exact.
            "X509v3 Name Constraints: critical \
             Permitted: DNS:api.example.com DNS:approvals.hangar.internal DNS:github.com \
             Excluded: DNS:.api.example.com DNS:.approvals.hangar.internal DNS:.github.com \
             IP:0.0.0.0/0.0.0.0 IP:0:0:0:0:0:0:0:0/0:0:0:0:0:0:0:0",
        ],
    );

    let intermediate = openssl_text(dir.path(), &ca.intermediate_pem(0).unwrap());
    assert_has(
        &intermediate,
        &[
            &format!("Subject: {ROOT_CN} level 0 "),
            &format!("Issuer: {ROOT_CN} "),
            "NIST CURVE: P-256",
            "Signature Algorithm: ecdsa-with-SHA256",
            "X509v3 Basic Constraints: critical CA:TRUE, pathlen:0",
            "X509v3 Key Usage: critical Certificate Sign, CRL Sign",
            "X509v3 Subject Key Identifier:",
            "X509v3 Authority Key Identifier:",
            "X509v3 Name Constraints: critical \
             Permitted: DNS:api.example.com DNS:approvals.hangar.internal DNS:github.com \
             Excluded: DNS:.api.example.com DNS:.approvals.hangar.internal DNS:.github.com \
             IP:0.0.0.0/0.0.0.0 IP:0:0:0:0:0:0:0:0/0:0:0:0:0:0:0:0",
        ],
    );

    // The intermediate is the root's child: openssl checks the signature.
    let root_pem = write(dir.path(), "root.pem", ca.cert_pem().as_bytes());
    let intermediate_pem = write(
        dir.path(),
        "intermediate.pem",
        ca.intermediate_pem(0).unwrap().as_bytes(),
    );
    let verified = openssl(&[
        "verify",
        "-x509_strict",
        "-CAfile",
        &root_pem,
        &intermediate_pem,
    ]);
    assert!(String::from_utf8_lossy(&verified).contains(": OK"));
}

#[test]
fn nested_names_get_one_intermediate_per_level() {
    let dir = tempfile::tempdir().unwrap();
    let ca = SessionCa::new(&params(&[
        "example.com",
        "api.example.com",
        "v2.api.example.com",
        "other.test",
    ]))
    .unwrap();
    assert_eq!(ca.level_count(), 3);
    for (name, level) in [
        ("example.com", 0),
        ("other.test", 0),
        (APPROVALS_NAME, 0),
        ("api.example.com", 1),
        ("v2.api.example.com", 2),
    ] {
        assert_eq!(ca.level_of(name), Some(level), "{name}");
        assert!(ca.permits(name));
    }
    assert_eq!(ca.level_of("x.api.example.com"), None);

    // The root permits every name, and excludes below the names that no
    // listed name lies under.
    let root = openssl_text(dir.path(), &ca.cert_pem());
    assert_has(
        &root,
        &[
            "X509v3 Basic Constraints: critical CA:TRUE, pathlen:1",
            "X509v3 Name Constraints: critical \
             Permitted: DNS:api.example.com DNS:approvals.hangar.internal DNS:example.com \
             DNS:other.test DNS:v2.api.example.com \
             Excluded: DNS:.approvals.hangar.internal DNS:.other.test DNS:.v2.api.example.com \
             IP:0.0.0.0/0.0.0.0 IP:0:0:0:0:0:0:0:0/0:0:0:0:0:0:0:0",
        ],
    );
    // Each intermediate permits exactly its level's names.
    for (level, permitted, excluded) in [
        (
            0,
            "DNS:approvals.hangar.internal DNS:example.com DNS:other.test",
            "DNS:.approvals.hangar.internal DNS:.example.com DNS:.other.test",
        ),
        (1, "DNS:api.example.com", "DNS:.api.example.com"),
        (2, "DNS:v2.api.example.com", "DNS:.v2.api.example.com"),
    ] {
        let text = openssl_text(dir.path(), &ca.intermediate_pem(level).unwrap());
        assert_has(
            &text,
            &[
                &format!("Subject: {ROOT_CN} level {level} "),
                &format!("Issuer: {ROOT_CN} "),
                "X509v3 Basic Constraints: critical CA:TRUE, pathlen:0",
                &format!(
                    "X509v3 Name Constraints: critical Permitted: {permitted} \
                     Excluded: {excluded} IP:0.0.0.0/0.0.0.0 \
                     IP:0:0:0:0:0:0:0:0/0:0:0:0:0:0:0:0 "
                ),
            ],
        );
    }

    // Each name's leaf comes from its level's intermediate.
    for name in ca.names() {
        let leaf = ca.mint_leaf(name).unwrap();
        let level = ca.level_of(name).unwrap();
        assert_eq!(
            leaf.certified_key().cert,
            [
                leaf.cert_der().clone(),
                ca.intermediate_der(level).unwrap().clone()
            ]
        );
        let text = openssl_text(dir.path(), &leaf.cert_pem());
        assert!(text.contains(&format!("Issuer: {ROOT_CN} level {level} ")));
    }
}

#[test]
fn leaf_certificate_fields() {
    let dir = tempfile::tempdir().unwrap();
    let ca = SessionCa::new(&params(&["api.example.com"])).unwrap();
    let leaf = ca.mint_leaf("api.example.com").unwrap();
    assert_eq!(leaf.name(), "api.example.com");
    // The chain is [leaf, intermediate]: the session has the root.
    assert_eq!(leaf.certified_key().cert.len(), 2);
    assert_eq!(
        &leaf.certified_key().cert[1],
        ca.intermediate_der(0).unwrap()
    );

    let text = openssl_text(dir.path(), &leaf.cert_pem());
    assert_has(
        &text,
        &[
            &format!("Issuer: {ROOT_CN} level 0 "),
            "NIST CURVE: P-256",
            "Signature Algorithm: ecdsa-with-SHA256",
            "X509v3 Subject Alternative Name: critical DNS:api.example.com",
            "X509v3 Basic Constraints: critical CA:FALSE",
            "X509v3 Key Usage: critical Digital Signature",
            "X509v3 Extended Key Usage: TLS Web Server Authentication",
            "X509v3 Authority Key Identifier:",
        ],
    );
    assert!(!text.contains("Name Constraints"), "{text}");

    // The leaf's and the intermediate's validity are the root's.
    let dates = |pem: String| {
        let file = write(dir.path(), "dates.pem", pem.as_bytes());
        String::from_utf8(openssl(&["x509", "-in", &file, "-noout", "-dates"])).unwrap()
    };
    assert_eq!(dates(leaf.cert_pem()), dates(ca.cert_pem()));
    assert_eq!(dates(ca.intermediate_pem(0).unwrap()), dates(ca.cert_pem()));
}

#[test]
fn validity_runs_from_an_hour_ago_for_the_lifetime() {
    let close = |a: SystemTime, b: SystemTime| {
        let gap = a.duration_since(b).unwrap_or_else(|e| e.duration());
        gap <= Duration::from_secs(5)
    };
    let now = SystemTime::now();
    let ca = SessionCa::new(&params(&[])).unwrap();
    assert!(close(ca.not_before(), now - NOT_BEFORE_SKEW));
    assert!(close(ca.not_after(), now + DEFAULT_CA_LIFETIME));
    assert_eq!(DEFAULT_CA_LIFETIME, Duration::from_secs(8 * 24 * 3600));

    let mut short = params(&[]);
    short.lifetime = Duration::from_secs(2 * 3600);
    let ca = SessionCa::new(&short).unwrap();
    assert!(close(ca.not_after(), now + Duration::from_secs(2 * 3600)));

    let mut longest = params(&[]);
    longest.lifetime = MAX_CA_LIFETIME;
    SessionCa::new(&longest).unwrap();
}

#[test]
fn names_are_sorted_deduplicated_and_include_approvals() {
    let ca = SessionCa::new(&params(&["github.com", "api.example.com", "github.com"])).unwrap();
    assert_eq!(
        ca.names(),
        ["api.example.com", APPROVALS_NAME, "github.com"]
    );
    assert!(ca.permits("github.com"));
    assert!(ca.permits(APPROVALS_NAME));
    assert!(!ca.permits("api.github.com"));
    assert!(!ca.permits("GitHub.com"));
}

macro_rules! refused {
    ($($params:expr => $variant:pat, $text:expr;)*) => {
        $(
            let params: CaParams = $params;
            match SessionCa::new(&params) {
                Ok(ca) => panic!("{params:?} made {ca:?}"),
                Err(error) => {
                    assert!(matches!(error, $variant), "{params:?}: {error:?}");
                    assert!(error.to_string().contains($text), "{error}");
                }
            }
        )*
    };
}

#[test]
fn bad_params_are_refused_naming_the_value() {
    let with_lifetime = |secs| CaParams {
        lifetime: Duration::from_secs(secs),
        ..params(&[])
    };
    refused! {
        params(&[""]) => CertError::NotAHostName { .. }, r#"name "" is not a host name"#;
        params(&["ok.example", "*.x.com"]) => CertError::NotAHostName { .. }, r#"name "*.x.com" is not a host name"#;
        params(&["10.0.0.1"]) => CertError::NotAHostName { .. }, r#""10.0.0.1""#;
        params(&["[::1]"]) => CertError::NotAHostName { .. }, "IP literal";
        params(&["Api.Example.com"]) => CertError::NotAHostName { .. }, r#""Api.Example.com""#;
        params(&["api.example.com."]) => CertError::NotAHostName { .. }, r#""api.example.com.""#;
        CaParams::new("", 1, "gw-a", ["a.example"]) => CertError::BadIdentifier { .. }, "session_id";
        CaParams::new("s\n1", 1, "gw-a", ["a.example"]) => CertError::BadIdentifier { .. }, r#""s\n1""#;
        CaParams::new("s1", 1, "", ["a.example"]) => CertError::BadIdentifier { .. }, "gateway_id";
        with_lifetime(0) => CertError::BadLifetime { .. }, "0ns";
        with_lifetime(MAX_CA_LIFETIME.as_secs() + 1) => CertError::BadLifetime { .. }, "2678401s";
    }
}

#[test]
fn mint_leaf_refuses_names_the_ca_does_not_permit() {
    let ca = SessionCa::new(&params(&["api.example.com"])).unwrap();
    let error = ca.mint_leaf("evil.com").unwrap_err();
    assert!(matches!(error, CertError::NotPermitted { .. }));
    assert_eq!(
        error.to_string(),
        r#""evil.com" is not permitted by this session CA"#
    );
    for name in ["sub.api.example.com", "example.com"] {
        assert!(matches!(
            ca.mint_leaf(name),
            Err(CertError::NotPermitted { .. })
        ));
    }
    for name in ["*.api.example.com", "API.example.com", "127.0.0.1", ""] {
        assert!(matches!(
            ca.mint_leaf(name),
            Err(CertError::NotAHostName { .. })
        ));
    }

    // With nested names, a name between or below them is still refused.
    let ca = SessionCa::new(&params(&["example.com", "v2.api.example.com"])).unwrap();
    for name in ["api.example.com", "x.example.com", "x.v2.api.example.com"] {
        assert!(matches!(
            ca.mint_leaf(name),
            Err(CertError::NotPermitted { .. })
        ));
    }
}

#[test]
fn debug_shows_no_key_material() {
    let ca = SessionCa::new(&params(&["example.com", "api.example.com"])).unwrap();
    let digest = ca.digest().to_owned();
    let leaf = ca.mint_leaf("api.example.com").unwrap();
    let cache = LeafCache::new(ca);
    cache.get_or_mint("api.example.com").unwrap();

    let ca_debug = format!("{:?}", cache.ca());
    assert!(ca_debug.contains(&digest), "{ca_debug}");
    assert!(ca_debug.contains("levels: 2"), "{ca_debug}");
    for debug in [
        ca_debug,
        format!("{:#?}", cache.ca()),
        format!("{leaf:?}"),
        format!("{cache:?}"),
        format!("{:?}", leaf.certified_key().key),
    ] {
        assert!(debug.len() < 400, "{debug}");
        for marker in ["BEGIN", "PRIVATE", "KEY-----", "3082", "0x30", "[48, 130"] {
            assert!(!debug.contains(marker), "{marker:?} in {debug}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever a caller passes, a leaf is minted only for a listed name.
    #[test]
    fn mint_leaf_signs_only_listed_names(name in "[a-zA-Z0-9.*_:\\[\\] -]{0,40}|((api|sub\\.api|x)\\.)?example\\.com") {
        static CA: std::sync::OnceLock<SessionCa> = std::sync::OnceLock::new();
        let ca = CA.get_or_init(|| {
            SessionCa::new(&params(&["example.com", "api.example.com"])).unwrap()
        });
        match ca.mint_leaf(&name) {
            Ok(leaf) => prop_assert!(
                ["example.com", "api.example.com", APPROVALS_NAME].contains(&name.as_str()),
                "{}",
                leaf.name()
            ),
            Err(CertError::NotPermitted { name: got } | CertError::NotAHostName { name: got, .. }) => {
                prop_assert_eq!(got, name)
            }
            Err(other) => prop_assert!(false, "{}", other),
        }
    }
}

/// A successor process that imports what its predecessor exported is the
/// same CA: the same root and digest, the same intermediates, and leaves
/// that OpenSSL verifies against the root the session already trusts.
#[test]
fn a_handed_over_ca_is_the_same_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = SessionCa::new(&params(&[
        "example.com",
        "api.example.com",
        "v2.api.example.com",
    ]))
    .unwrap();
    let exported = ca.export_for_handover().unwrap();
    let debug = format!("{exported:?}");
    assert!(!debug.contains("intermediates: ["), "{debug}");
    let successor = SessionCa::import_handover(exported).unwrap();
    assert_eq!(successor.digest(), ca.digest());
    assert_eq!(successor.cert_der(), ca.cert_der());
    assert_eq!(successor.names(), ca.names());
    assert_eq!(successor.not_after(), ca.not_after());
    assert_eq!(successor.level_count(), 3);
    let root = write(dir.path(), "root.pem", ca.cert_pem().as_bytes());
    for name in ca.names() {
        let level = ca.level_of(name).unwrap();
        assert_eq!(
            successor.intermediate_der(level),
            ca.intermediate_der(level)
        );
        let leaf = successor.mint_leaf(name).unwrap();
        let chain = write(
            dir.path(),
            "chain.pem",
            successor.intermediate_pem(level).unwrap().as_bytes(),
        );
        let leaf_file = write(dir.path(), "leaf.pem", leaf.cert_pem().as_bytes());
        openssl(&[
            "verify",
            "-x509_strict",
            "-CAfile",
            &root,
            "-untrusted",
            &chain,
            "-verify_hostname",
            name,
            &leaf_file,
        ]);
    }
    assert!(successor.mint_leaf("other.test").is_err());
}

/// What does not hold together is refused: a key that is not its
/// certificate's, an intermediate too few, a key that is not a key.
#[test]
fn a_handover_that_does_not_hold_together_is_refused() {
    let a = SessionCa::new(&params(&["api.example.com"])).unwrap();
    let b = SessionCa::new(&params(&["api.example.com"])).unwrap();
    let mut swapped = a.export_for_handover().unwrap();
    swapped.intermediates[0].1 = b.export_for_handover().unwrap().intermediates[0].1.clone();
    assert!(matches!(
        SessionCa::import_handover(swapped),
        Err(CertError::Handover { .. })
    ));

    let mut short = a.export_for_handover().unwrap();
    short.names.push("v2.api.example.com".into());
    assert!(matches!(
        SessionCa::import_handover(short),
        Err(CertError::Handover { .. })
    ));

    let mut garbage = a.export_for_handover().unwrap();
    garbage.intermediates[0].1 = zeroize::Zeroizing::new(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
    assert!(matches!(
        SessionCa::import_handover(garbage),
        Err(CertError::Handover { .. })
    ));
}
