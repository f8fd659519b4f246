//! A session CA vouches for exactly its names, whoever checks.
//!
//! Each case is a leaf signed by the session CA and a name a client asks
//! for. Three independent verifiers check every case: OpenSSL's command
//! line (`openssl verify`), Python's `ssl` module in a real TLS 1.3
//! handshake against a rustls server on loopback, and rustls-webpki. A
//! listed name (and `approvals.hangar.internal`) verifies; an unlisted name,
//! a subdomain of a listed name, its parent, a wildcard under it and an IP
//! address are refused, and refused *for the name constraints*: the leaf
//! matches the name asked for, so nothing else explains the refusal.
//!
//! `SessionCa::mint_leaf` will not sign the bad leaves, so they come from
//! the test-only `sign_any_for_tests`.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use rustls::pki_types::{ServerName, UnixTime};
use rustls::server::{ServerConfig, ServerConnection};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use talos_certs::{CaParams, Leaf, SessionCa, APPROVALS_NAME};

const LISTED: [&str; 2] = ["api.example.com", "github.com"];

/// What a verifier must conclude.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Verifies,
    /// Outside every permitted subtree.
    NotPermitted,
    /// Inside an excluded subtree.
    Excluded,
}

struct Case {
    /// The leaf's subject alternative name (an iPAddress SAN if it parses
    /// as an address).
    san: &'static str,
    /// The name (or address) the client asks for.
    host: &'static str,
    expect: Expect,
}

macro_rules! cases {
    ($($san:expr, $host:expr => $expect:ident;)*) => {
        &[$(Case { san: $san, host: $host, expect: Expect::$expect },)*]
    };
}

const CASES: &[Case] = cases! {
    "api.example.com", "api.example.com" => Verifies;
    "github.com", "github.com" => Verifies;
    APPROVALS_NAME, APPROVALS_NAME => Verifies;
    // unlisted
    "evil.com", "evil.com" => NotPermitted;
    // a subdomain of a listed name
    "sub.api.example.com", "sub.api.example.com" => Excluded;
    "a.b.github.com", "a.b.github.com" => Excluded;
    // the parent of a listed name
    "example.com", "example.com" => NotPermitted;
    // a wildcard under a listed name, used for a name it covers
    "*.api.example.com", "www.api.example.com" => Excluded;
    // a listed name as a suffix without a dot, and as a prefix
    "xapi.example.com", "xapi.example.com" => NotPermitted;
    "api.example.com.evil.com", "api.example.com.evil.com" => NotPermitted;
    // an IP address: dNSName constraints alone would not cover it
    "127.0.0.1", "127.0.0.1" => Excluded;
    "::1", "::1" => Excluded;
};

fn session_ca(names: &[&str]) -> SessionCa {
    SessionCa::new(&CaParams::new(
        "sess-7f3a",
        2,
        "gw-a",
        names.iter().copied(),
    ))
    .unwrap()
}

/// The leaf for a case: minted the normal way when the CA permits the
/// name, else (after checking that minting refuses it) signed by the
/// test-only path.
fn leaf_for(ca: &SessionCa, case: &Case) -> Leaf {
    if case.expect == Expect::Verifies {
        ca.mint_leaf(case.san).unwrap()
    } else {
        assert!(
            ca.mint_leaf(case.san).is_err(),
            "mint_leaf signed {}",
            case.san
        );
        ca.sign_any_for_tests(case.san).unwrap()
    }
}

/// Checks one verifier's outcome against a case. `refusal_text` maps an
/// expected refusal to the text that verifier gives for it.
fn check(
    verifier: &str,
    case: &Case,
    outcome: Result<(), String>,
    refusal_text: impl Fn(Expect) -> &'static str,
) {
    match (case.expect, outcome) {
        (Expect::Verifies, Ok(())) => {}
        (Expect::Verifies, Err(error)) => {
            panic!(
                "{verifier}: leaf {:?} for {:?} refused: {error}",
                case.san, case.host
            )
        }
        (expect, Ok(())) => panic!(
            "{verifier}: leaf {:?} for {:?} verified, expected {expect:?}",
            case.san, case.host
        ),
        (expect, Err(error)) => assert!(
            error.contains(refusal_text(expect)),
            "{verifier}: leaf {:?} for {:?} refused for another reason than {expect:?}: {error}",
            case.san,
            case.host
        ),
    }
}

fn openssl_refusal(expect: Expect) -> &'static str {
    match expect {
        Expect::NotPermitted => "permitted subtree violation",
        Expect::Excluded => "excluded subtree violation",
        Expect::Verifies => unreachable!(),
    }
}

fn write(dir: &Path, file: &str, text: &str) -> String {
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

fn is_ip(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_ok()
}

// ---- OpenSSL ----------------------------------------------------------

fn openssl_verify(ca_pem: &str, leaf_pem: &str, host: &str, strict: bool) -> Result<(), String> {
    let mut command = Command::new("openssl");
    command.args(["verify", "-CAfile", ca_pem]);
    if strict {
        command.arg("-x509_strict");
    }
    command.args([
        if is_ip(host) {
            "-verify_ip"
        } else {
            "-verify_hostname"
        },
        host,
        leaf_pem,
    ]);
    let output = command.output().expect("run openssl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() && text.contains(": OK") {
        Ok(())
    } else {
        Err(text)
    }
}

#[test]
fn openssl_verify_enforces_the_name_constraints() {
    let ca = session_ca(&LISTED);
    let dir = tempfile::tempdir().unwrap();
    let ca_pem = write(dir.path(), "ca.pem", &ca.cert_pem());
    for case in CASES {
        let leaf = leaf_for(&ca, case);
        let leaf_pem = write(dir.path(), "leaf.pem", &leaf.cert_pem());
        check(
            "openssl verify",
            case,
            openssl_verify(&ca_pem, &leaf_pem, case.host, false),
            openssl_refusal,
        );
        if case.expect == Expect::Verifies {
            // Also under RFC 5280 strict checks (key identifiers, critical
            // basic constraints, ...).
            check(
                "openssl verify -x509_strict",
                case,
                openssl_verify(&ca_pem, &leaf_pem, case.host, true),
                openssl_refusal,
            );
        }
    }
}

// ---- Python's ssl, over a real handshake ------------------------------

/// A TLS 1.3 client: trusts only `cafile`, checks `host`, and with OpenSSL's
/// strict mode on (Python 3.13's default) whatever Python version runs it.
const PYTHON_CLIENT: &str = r#"
import socket, ssl, sys
port, host, cafile = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ctx = ssl.create_default_context(cafile=cafile)
ctx.verify_flags |= ssl.VERIFY_X509_STRICT
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
try:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as tls:
            print("verified", tls.version())
except ssl.SSLCertVerificationError as e:
    print("refused:", e.verify_message)
    sys.exit(3)
"#;

/// Serves one TLS 1.3 handshake with `leaf` on 127.0.0.1, whatever name the
/// client asks for.
fn serve_once(leaf: Arc<CertifiedKey>) -> (u16, JoinHandle<()>) {
    let config = ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_no_client_auth()
    .with_cert_resolver(Arc::new(SingleCertAndKey::from(leaf)));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut tls = ServerConnection::new(Arc::new(config)).unwrap();
        // A client that refuses the certificate ends the handshake with an
        // alert, which surfaces here as an error: expected for bad leaves.
        while tls.is_handshaking() {
            if tls.complete_io(&mut socket).is_err() {
                return;
            }
        }
        // Wait for the client to close.
        let _ = rustls::Stream::new(&mut tls, &mut socket).read(&mut [0; 1]);
    });
    (port, server)
}

fn python_handshake(ca_pem: &str, leaf: &Leaf, host: &str) -> Result<(), String> {
    let (port, server) = serve_once(Arc::clone(leaf.certified_key()));
    let output = Command::new("python3")
        .args(["-c", PYTHON_CLIENT, &port.to_string(), host, ca_pem])
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    match output.status.code() {
        Some(0) => {
            server.join().unwrap();
            assert_eq!(stdout.trim(), "verified TLSv1.3");
            Ok(())
        }
        Some(3) => {
            server.join().unwrap();
            Err(stdout)
        }
        _ => panic!(
            "python3 failed for {host}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

#[test]
fn python_ssl_enforces_the_name_constraints() {
    let ca = session_ca(&LISTED);
    let dir = tempfile::tempdir().unwrap();
    let ca_pem = write(dir.path(), "ca.pem", &ca.cert_pem());
    for case in CASES {
        let leaf = leaf_for(&ca, case);
        check(
            "python ssl",
            case,
            python_handshake(&ca_pem, &leaf, case.host),
            openssl_refusal,
        );
    }
}

// ---- rustls-webpki ----------------------------------------------------

fn webpki_verify(ca: &SessionCa, leaf: &Leaf, host: &str) -> Result<(), String> {
    let anchor = webpki::anchor_from_trusted_cert(ca.cert_der()).unwrap();
    let end_entity = webpki::EndEntityCert::try_from(leaf.cert_der()).unwrap();
    let name = ServerName::try_from(host).unwrap();
    // The leaf itself names `host`: any refusal below is the chain's.
    end_entity
        .verify_is_valid_for_subject_name(&name)
        .map_err(|e| format!("subject name: {e:?}"))?;
    end_entity
        .verify_for_usage(
            rustls::crypto::aws_lc_rs::default_provider()
                .signature_verification_algorithms
                .all,
            &[anchor],
            &[],
            UnixTime::now(),
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

#[test]
fn rustls_webpki_enforces_the_name_constraints() {
    let ca = session_ca(&LISTED);
    for case in CASES {
        let leaf = leaf_for(&ca, case);
        check(
            "rustls-webpki",
            case,
            webpki_verify(&ca, &leaf, case.host),
            |_| "NameConstraintViolation",
        );
    }
}

// ---- the approvals name -----------------------------------------------

#[test]
fn approvals_name_verifies_for_every_session_ca() {
    let dir = tempfile::tempdir().unwrap();
    let allowlists: [&[&str]; 3] = [&[], &LISTED, &[APPROVALS_NAME, "hangar.example"]];
    for names in allowlists {
        let ca = session_ca(names);
        assert!(ca.names().iter().any(|n| n == APPROVALS_NAME));
        let leaf = ca.mint_leaf(APPROVALS_NAME).unwrap();
        webpki_verify(&ca, &leaf, APPROVALS_NAME).unwrap();
        let ca_pem = write(dir.path(), "ca.pem", &ca.cert_pem());
        let leaf_pem = write(dir.path(), "leaf.pem", &leaf.cert_pem());
        openssl_verify(&ca_pem, &leaf_pem, APPROVALS_NAME, true).unwrap();
    }
    // A name above the approvals name would exclude it, so the CA is
    // refused rather than made without a working approvals name.
    for parent in ["hangar.internal", "internal"] {
        let refused = SessionCa::new(&CaParams::new("sess-7f3a", 2, "gw-a", [parent]));
        assert!(matches!(
            refused,
            Err(talos_certs::CertError::NestedNames { .. })
        ));
    }
    // With an empty allowlist nothing else is permitted.
    let ca = session_ca(&[]);
    assert_eq!(ca.names(), [APPROVALS_NAME]);
    let leaf = ca.sign_any_for_tests("github.com").unwrap();
    assert!(webpki_verify(&ca, &leaf, "github.com")
        .unwrap_err()
        .contains("NameConstraintViolation"));
}
