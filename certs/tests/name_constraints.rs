//! A session CA vouches for exactly its names, whoever checks.
//!
//! Each case is a leaf signed by one of the session's intermediates (sent
//! as `[leaf, intermediate]`) and a name a client asks for; the client
//! trusts only the session's root. Three independent verifiers check every
//! case: OpenSSL's command line (`openssl verify`), Python's `ssl` module in
//! a real TLS 1.3 handshake against a rustls server on loopback, and
//! rustls-webpki. A listed name (and `approvals.hangar.internal`) verifies,
//! through the intermediate of its nesting level; an unlisted name, a
//! subdomain of a listed name, its parent, a wildcard under it and an IP
//! address are refused by every intermediate, and refused *for the name
//! constraints*: the leaf matches the name asked for, so nothing else
//! explains the refusal. A leaf for a listed name that none of the
//! session's intermediates signed is refused as well.
//!
//! `SessionCa::mint_leaf` will not sign the bad leaves, so they come from
//! the test-only `sign_any_at_level_for_tests`.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ServerConfig, ServerConnection};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use talos_certs::{CaParams, SessionCa, APPROVALS_NAME};

/// An allowlist without nesting: one intermediate.
const LISTED: [&str; 2] = ["api.example.com", "github.com"];

/// An allowlist nested three deep beside an unrelated name: levels 0
/// (`example.com`, `other.test`, the approvals name), 1
/// (`api.example.com`) and 2 (`v2.api.example.com`).
const NESTED: [&str; 4] = [
    "example.com",
    "api.example.com",
    "v2.api.example.com",
    "other.test",
];

/// What a verifier must conclude.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Verifies,
    /// Outside every permitted subtree.
    NotPermitted,
    /// Inside an excluded subtree.
    Excluded,
    /// Refused by the name constraints, one way or the other (which one
    /// depends on the CA that refuses first).
    Constrained,
    /// No path to the session's root: the chain was not signed by it.
    NotOurs,
}

#[derive(Clone, Copy, Debug)]
struct Case<'a> {
    /// The leaf's subject alternative name (an iPAddress SAN if it parses
    /// as an address).
    san: &'a str,
    /// The name (or address) the client asks for.
    host: &'a str,
    expect: Expect,
}

/// A case, what signed its leaf, and the chain a server sends for it.
type Checked<'a> = (String, Case<'a>, Arc<CertifiedKey>);

macro_rules! cases {
    ($($san:expr, $host:expr => $expect:ident;)*) => {
        &[$(Case { san: $san, host: $host, expect: Expect::$expect },)*]
    };
}

/// Cases for a CA for [`LISTED`], whose one intermediate signs every leaf.
const CASES: &[Case<'static>] = cases! {
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

/// Leaves no intermediate of a CA for [`NESTED`] may sign.
const NESTED_REFUSED: &[Case<'static>] = cases! {
    // a subdomain of a name at level 0 (that is also a parent)
    "evil.example.com", "evil.example.com" => Constrained;
    // a subdomain of a name at level 1, and at level 2 (the deepest)
    "x.api.example.com", "x.api.example.com" => Constrained;
    "x.v2.api.example.com", "x.v2.api.example.com" => Constrained;
    // wildcards under a parent, for an unlisted and for a listed name
    "*.example.com", "www.example.com" => Constrained;
    "*.example.com", "api.example.com" => Constrained;
    "*.api.example.com", "www.api.example.com" => Constrained;
    "*.api.example.com", "v2.api.example.com" => Constrained;
    // a subdomain of a name with nothing under it
    "sub.other.test", "sub.other.test" => Constrained;
    // unlisted, also next to a listed name
    "unlisted.test", "unlisted.test" => Constrained;
    "test", "test" => Constrained;
    "xexample.com", "xexample.com" => Constrained;
    // IP addresses
    "10.0.0.1", "10.0.0.1" => Constrained;
    "::1", "::1" => Constrained;
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

/// The chain for a case with a one-level CA: minted the normal way when
/// the CA permits the name, else (after checking that minting refuses it)
/// signed by the test-only path.
fn chain_for(ca: &SessionCa, case: &Case<'static>) -> Checked<'static> {
    let leaf = if case.expect == Expect::Verifies {
        ca.mint_leaf(case.san).unwrap()
    } else {
        assert!(
            ca.mint_leaf(case.san).is_err(),
            "mint_leaf signed {}",
            case.san
        );
        ca.sign_any_for_tests(case.san).unwrap()
    };
    (
        "level 0".to_owned(),
        *case,
        Arc::clone(leaf.certified_key()),
    )
}

/// Every case a CA for [`NESTED`] must get right, with the chain for it:
/// each listed name minted through its own level's intermediate; and, from
/// each intermediate in turn, the leaves of [`NESTED_REFUSED`] and of every
/// listed name of another level.
fn nested_cases(ca: &SessionCa) -> Vec<Checked<'_>> {
    let mut cases = Vec::new();
    for name in ca.names() {
        let leaf = ca.mint_leaf(name).unwrap();
        let level = ca.level_of(name).unwrap();
        assert_eq!(
            &leaf.certified_key().cert[1],
            ca.intermediate_der(level).unwrap()
        );
        cases.push((
            format!("minted at level {level}"),
            Case {
                san: name,
                host: name,
                expect: Expect::Verifies,
            },
            Arc::clone(leaf.certified_key()),
        ));
    }
    for level in 0..ca.level_count() {
        let wrong_level = ca
            .names()
            .iter()
            .filter(|name| ca.level_of(name) != Some(level))
            .map(|name| Case {
                san: name,
                host: name,
                expect: Expect::Constrained,
            });
        let refused = NESTED_REFUSED.iter().copied();
        for case in refused.chain(wrong_level) {
            assert!(ca.mint_leaf(case.san).is_err() || ca.level_of(case.san) != Some(level));
            let leaf = ca.sign_any_at_level_for_tests(level, case.san).unwrap();
            cases.push((
                format!("signed at level {level}"),
                case,
                Arc::clone(leaf.certified_key()),
            ));
        }
    }
    cases
}

/// Chains for listed names of a CA for [`NESTED`] that none of its
/// intermediates signed, each with what it imitates.
fn foreign_chains(ca: &SessionCa) -> Vec<Checked<'static>> {
    let case = |name: &'static str| Case {
        san: name,
        host: name,
        expect: Expect::NotOurs,
    };
    let mut chains = Vec::new();

    // A twin: another CA made from the same parameters, so its root and
    // intermediates carry exactly the names (subjects and constraints) of
    // the session's, under other keys.
    let twin = session_ca(&NESTED);
    assert_eq!(twin.names(), ca.names());
    for name in ["example.com", "api.example.com", "v2.api.example.com"] {
        let leaf = twin.mint_leaf(name).unwrap();
        chains.push((
            "a twin CA's intermediate".to_owned(),
            case(name),
            Arc::clone(leaf.certified_key()),
        ));
    }

    // A CA with the root's very subject signing a leaf directly, as the
    // root itself could if its key still existed.
    let root_name = "TALOS session CA sess-7f3a attempt 2 (gw-a)";
    for name in ["example.com", "v2.api.example.com"] {
        chains.push((
            "a look-alike of the root".to_owned(),
            case(name),
            signed_by_look_alike(root_name, name),
        ));
    }
    chains
}

/// A leaf for `name` signed directly by a fresh self-signed CA whose
/// subject is `ca_name`, with its key (a test key, PKCS#8 in memory).
fn signed_by_look_alike(ca_name: &str, name: &str) -> Arc<CertifiedKey> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::default();
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(1));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().unwrap();
    ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);

    let mut leaf = CertificateParams::new(vec![name.to_owned()]).unwrap();
    leaf.distinguished_name = DistinguishedName::new();
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    let leaf_key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    let key = rustls::crypto::aws_lc_rs::sign::any_supported_type(&PrivateKeyDer::Pkcs8(
        leaf_key.serialize_der().into(),
    ))
    .unwrap();
    Arc::new(CertifiedKey::new(vec![cert.der().clone()], key))
}

/// Checks one verifier's outcome against a case. `refusal_text` maps an
/// expected refusal to the texts that verifier may give for it (any one).
fn check(
    verifier: &str,
    what: &str,
    case: &Case<'_>,
    outcome: Result<(), String>,
    refusal_text: impl Fn(Expect) -> &'static [&'static str],
) {
    match (case.expect, outcome) {
        (Expect::Verifies, Ok(())) => {}
        (Expect::Verifies, Err(error)) => {
            panic!(
                "{verifier}: leaf {:?} ({what}) for {:?} refused: {error}",
                case.san, case.host
            )
        }
        (expect, Ok(())) => panic!(
            "{verifier}: leaf {:?} ({what}) for {:?} verified, expected {expect:?}",
            case.san, case.host
        ),
        (expect, Err(error)) => assert!(
            refusal_text(expect).iter().any(|text| error.contains(text)),
            "{verifier}: leaf {:?} ({what}) for {:?} refused for another reason than \
             {expect:?}: {error}",
            case.san,
            case.host
        ),
    }
}

fn openssl_refusal(expect: Expect) -> &'static [&'static str] {
    match expect {
        Expect::NotPermitted => &["permitted subtree violation"],
        Expect::Excluded => &["excluded subtree violation"],
        Expect::Constrained => &["permitted subtree violation", "excluded subtree violation"],
        // OpenSSL finds an issuer by subject and key identifier, so a
        // look-alike is no issuer at all.
        Expect::NotOurs => &["unable to get local issuer certificate"],
        Expect::Verifies => unreachable!(),
    }
}

fn webpki_refusal(expect: Expect) -> &'static [&'static str] {
    match expect {
        // webpki finds an issuer by subject alone, so a look-alike of the
        // session's root or intermediate fails on the signature.
        Expect::NotOurs => &["UnknownIssuer", "InvalidSignatureForPublicKey"],
        _ => &["NameConstraintViolation"],
    }
}

fn write(dir: &Path, file: &str, text: &str) -> String {
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// PEM text of certificates (RFC 7468, 64-character lines).
fn pem(certs: &[CertificateDer<'_>]) -> String {
    const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for der in certs {
        let mut text = String::new();
        for chunk in der.chunks(3) {
            let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
            let group = (byte(0) << 16) | (byte(1) << 8) | byte(2);
            for i in 0..4 {
                text.push(if i <= chunk.len() {
                    char::from(BASE64[((group >> (18 - 6 * i)) & 0x3f) as usize])
                } else {
                    '='
                });
            }
        }
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in text.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).unwrap());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

fn is_ip(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_ok()
}

// ---- OpenSSL ----------------------------------------------------------

/// `openssl verify` of the chain's leaf, trusting only `root_pem` and
/// given the rest of the chain as untrusted intermediates.
fn openssl_verify(
    dir: &Path,
    root_pem: &str,
    chain: &CertifiedKey,
    host: &str,
    strict: bool,
) -> Result<(), String> {
    let leaf_pem = write(dir, "leaf.pem", &pem(&chain.cert[..1]));
    let mut command = Command::new("openssl");
    command.args(["verify", "-CAfile", root_pem]);
    if chain.cert.len() > 1 {
        let untrusted = write(dir, "untrusted.pem", &pem(&chain.cert[1..]));
        command.args(["-untrusted", &untrusted]);
    }
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
        &leaf_pem,
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

/// Runs `cases` through `openssl verify`, and the ones that must verify
/// also under RFC 5280 strict checks (key identifiers, critical basic
/// constraints, ...).
fn openssl_cases(ca: &SessionCa, cases: &[Checked<'_>]) {
    let dir = tempfile::tempdir().unwrap();
    let root_pem = write(dir.path(), "root.pem", &ca.cert_pem());
    for (what, case, chain) in cases {
        for strict in [false, true] {
            if strict && case.expect != Expect::Verifies {
                continue;
            }
            check(
                if strict {
                    "openssl verify -x509_strict"
                } else {
                    "openssl verify"
                },
                what,
                case,
                openssl_verify(dir.path(), &root_pem, chain, case.host, strict),
                openssl_refusal,
            );
        }
    }
}

#[test]
fn openssl_verify_enforces_the_name_constraints() {
    let ca = session_ca(&LISTED);
    assert_eq!(ca.level_count(), 1);
    openssl_cases(
        &ca,
        &CASES
            .iter()
            .map(|case| chain_for(&ca, case))
            .collect::<Vec<_>>(),
    );
}

#[test]
fn openssl_verify_enforces_nested_names_through_each_intermediate() {
    let ca = session_ca(&NESTED);
    assert_eq!(ca.level_count(), 3);
    openssl_cases(&ca, &nested_cases(&ca));
    openssl_cases(&ca, &foreign_chains(&ca));
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

/// Serves one TLS 1.3 handshake with `chain` on 127.0.0.1, whatever name
/// the client asks for.
fn serve_once(chain: Arc<CertifiedKey>) -> (u16, JoinHandle<()>) {
    let config = ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_no_client_auth()
    .with_cert_resolver(Arc::new(SingleCertAndKey::from(chain)));
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

fn python_handshake(root_pem: &str, chain: Arc<CertifiedKey>, host: &str) -> Result<(), String> {
    let (port, server) = serve_once(chain);
    let output = Command::new("python3")
        .args(["-c", PYTHON_CLIENT, &port.to_string(), host, root_pem])
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

fn python_cases(ca: &SessionCa, cases: &[Checked<'_>]) {
    let dir = tempfile::tempdir().unwrap();
    let root_pem = write(dir.path(), "root.pem", &ca.cert_pem());
    for (what, case, chain) in cases {
        check(
            "python ssl",
            what,
            case,
            python_handshake(&root_pem, Arc::clone(chain), case.host),
            openssl_refusal,
        );
    }
}

#[test]
fn python_ssl_enforces_the_name_constraints() {
    let ca = session_ca(&LISTED);
    python_cases(
        &ca,
        &CASES
            .iter()
            .map(|case| chain_for(&ca, case))
            .collect::<Vec<_>>(),
    );
}

#[test]
fn python_ssl_enforces_nested_names_through_each_intermediate() {
    let ca = session_ca(&NESTED);
    python_cases(&ca, &nested_cases(&ca));
    python_cases(&ca, &foreign_chains(&ca));
}

// ---- rustls-webpki ----------------------------------------------------

/// Verifies `chain` as rustls would: the first certificate is the leaf,
/// the rest are intermediates, and only `ca`'s root is trusted.
fn webpki_verify(ca: &SessionCa, chain: &CertifiedKey, host: &str) -> Result<(), String> {
    let anchor = webpki::anchor_from_trusted_cert(ca.cert_der()).unwrap();
    let end_entity = webpki::EndEntityCert::try_from(&chain.cert[0]).unwrap();
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
            &chain.cert[1..],
            UnixTime::now(),
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

fn webpki_cases(ca: &SessionCa, cases: &[Checked<'_>]) {
    for (what, case, chain) in cases {
        check(
            "rustls-webpki",
            what,
            case,
            webpki_verify(ca, chain, case.host),
            webpki_refusal,
        );
    }
}

#[test]
fn rustls_webpki_enforces_the_name_constraints() {
    let ca = session_ca(&LISTED);
    webpki_cases(
        &ca,
        &CASES
            .iter()
            .map(|case| chain_for(&ca, case))
            .collect::<Vec<_>>(),
    );
}

#[test]
fn rustls_webpki_enforces_nested_names_through_each_intermediate() {
    let ca = session_ca(&NESTED);
    webpki_cases(&ca, &nested_cases(&ca));
    webpki_cases(&ca, &foreign_chains(&ca));
}

// ---- the approvals name -----------------------------------------------

#[test]
fn approvals_name_verifies_for_every_session_ca() {
    let dir = tempfile::tempdir().unwrap();
    let allowlists: [&[&str]; 6] = [
        &[],
        &LISTED,
        &[APPROVALS_NAME, "hangar.example"],
        // names above the approvals name put it at a deeper level
        &["hangar.internal"],
        &["internal", "hangar.internal"],
        &["internal", "other.internal"],
    ];
    for names in allowlists {
        let ca = session_ca(names);
        assert!(ca.names().iter().any(|n| n == APPROVALS_NAME));
        let root_pem = write(dir.path(), "root.pem", &ca.cert_pem());
        for name in ca.names() {
            let leaf = ca.mint_leaf(name).unwrap();
            webpki_verify(&ca, leaf.certified_key(), name).unwrap();
            openssl_verify(dir.path(), &root_pem, leaf.certified_key(), name, true).unwrap();
            python_handshake(&root_pem, Arc::clone(leaf.certified_key()), name).unwrap();
        }
    }
    let ca = session_ca(&["internal", "hangar.internal"]);
    assert_eq!(ca.level_of("internal"), Some(0));
    assert_eq!(ca.level_of("hangar.internal"), Some(1));
    assert_eq!(ca.level_of(APPROVALS_NAME), Some(2));

    // With an empty allowlist nothing else is permitted.
    let ca = session_ca(&[]);
    assert_eq!(ca.names(), [APPROVALS_NAME]);
    let leaf = ca.sign_any_for_tests("github.com").unwrap();
    assert!(webpki_verify(&ca, leaf.certified_key(), "github.com")
        .unwrap_err()
        .contains("NameConstraintViolation"));
    // And with the parents listed, their subdomains stay refused.
    let ca = session_ca(&["hangar.internal"]);
    for level in 0..ca.level_count() {
        let leaf = ca
            .sign_any_at_level_for_tests(level, "evil.hangar.internal")
            .unwrap();
        assert!(
            webpki_verify(&ca, leaf.certified_key(), "evil.hangar.internal")
                .unwrap_err()
                .contains("NameConstraintViolation")
        );
    }
}
