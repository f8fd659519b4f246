//! A leaf works in a real rustls TLS 1.3 handshake, signed by this crate's
//! own `rustls::sign::SigningKey`, with a client that trusts only the
//! session's root; and that client refuses a leaf the session CA must not
//! vouch for, from whichever intermediate.
//!
//! Client and server run in memory: each side's TLS records are handed to
//! the other until both finish.

use std::io::{Read, Write};
use std::ops::DerefMut;
use std::sync::Arc;

use rustls::client::ClientConnection;
use rustls::pki_types::ServerName;
use rustls::server::{ServerConfig, ServerConnection};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{
    CertificateError, ClientConfig, ConnectionCommon, Error, RootCertStore, SignatureScheme,
};
use talos_certs::{CaParams, SessionCa};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn client_config(ca: &SessionCa) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert_der().clone()).unwrap();
    Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn server_config(leaf: Arc<CertifiedKey>) -> Arc<ServerConfig> {
    Arc::new(
        ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(SingleCertAndKey::from(leaf))),
    )
}

/// Moves every pending TLS record from `from` to `to` and lets `to`
/// process them.
fn transfer<A, B>(
    from: &mut impl DerefMut<Target = ConnectionCommon<A>>,
    to: &mut impl DerefMut<Target = ConnectionCommon<B>>,
) -> Result<(), Error> {
    let mut records = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut records).unwrap();
    }
    let mut rest = &records[..];
    while !rest.is_empty() {
        to.read_tls(&mut rest).unwrap();
        to.process_new_packets()?;
    }
    Ok(())
}

/// Runs a handshake for `name`; the error is the client's (or the
/// server's) verdict.
fn handshake(
    ca: &SessionCa,
    leaf: Arc<CertifiedKey>,
    name: &str,
) -> Result<(ClientConnection, ServerConnection), Error> {
    let mut client = ClientConnection::new(
        client_config(ca),
        ServerName::try_from(name.to_owned()).unwrap(),
    )
    .unwrap();
    let mut server = ServerConnection::new(server_config(leaf)).unwrap();
    // A TLS 1.3 handshake needs two flights each way; allow a few more.
    for _ in 0..8 {
        transfer(&mut client, &mut server)?;
        transfer(&mut server, &mut client)?;
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok((client, server));
        }
    }
    panic!("handshake did not finish");
}

#[test]
fn tls13_handshake_with_a_minted_leaf() {
    let ca = SessionCa::new(&CaParams::new("sess-1", 1, "gw-a", ["api.example.com"])).unwrap();
    let leaf = ca.mint_leaf("api.example.com").unwrap();
    assert!(leaf.certified_key().keys_match().is_ok());

    let (mut client, mut server) =
        handshake(&ca, Arc::clone(leaf.certified_key()), "api.example.com").unwrap();
    assert_eq!(
        client.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(server.server_name(), Some("api.example.com"));
    // The chain the client received is [leaf, intermediate]; the client
    // trusts only the root.
    let chain = client.peer_certificates().unwrap();
    assert_eq!(
        chain,
        [
            leaf.cert_der().clone(),
            ca.intermediate_der(0).unwrap().clone()
        ]
    );
    // rustls chose the P-256 scheme through our key.
    let signer = leaf
        .certified_key()
        .key
        .choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])
        .unwrap();
    assert_eq!(signer.scheme(), SignatureScheme::ECDSA_NISTP256_SHA256);

    // Application data flows both ways.
    client.writer().write_all(b"ping").unwrap();
    transfer(&mut client, &mut server).unwrap();
    let mut got = [0; 4];
    server.reader().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    server.writer().write_all(b"pong").unwrap();
    transfer(&mut server, &mut client).unwrap();
    client.reader().read_exact(&mut got).unwrap();
    assert_eq!(&got, b"pong");
}

#[test]
fn cached_leaf_serves_many_handshakes() {
    let ca = SessionCa::new(&CaParams::new("sess-1", 1, "gw-a", ["github.com"])).unwrap();
    let cache = talos_certs::LeafCache::new(ca);
    for _ in 0..3 {
        let leaf = cache.get_or_mint("github.com").unwrap();
        handshake(cache.ca(), leaf, "github.com").unwrap();
    }
    assert_eq!(cache.minted(), 1);
}

#[test]
fn nested_names_handshake_through_their_own_intermediates() {
    let ca = SessionCa::new(&CaParams::new(
        "sess-1",
        1,
        "gw-a",
        ["example.com", "api.example.com", "v2.api.example.com"],
    ))
    .unwrap();
    let cache = talos_certs::LeafCache::new(ca);
    for name in ["example.com", "api.example.com", "v2.api.example.com"] {
        let leaf = cache.get_or_mint(name).unwrap();
        let (client, _) = handshake(cache.ca(), Arc::clone(&leaf), name).unwrap();
        let level = cache.ca().level_of(name).unwrap();
        assert_eq!(
            client.peer_certificates().unwrap()[1],
            *cache.ca().intermediate_der(level).unwrap()
        );
    }
}

/// The client's verdict is a name-constraint violation.
fn assert_constraint_violation(what: &str, error: &Error) {
    // rustls reports a name-constraint violation as an "other" certificate
    // error carrying webpki's error.
    match error {
        Error::InvalidCertificate(CertificateError::Other(other)) => {
            assert!(
                format!("{other:?}").contains("NameConstraintViolation"),
                "{what}: {error:?}"
            );
        }
        _ => panic!("{what}: refused for another reason: {error:?}"),
    }
}

#[test]
fn rustls_client_refuses_leaves_outside_the_constraints() {
    let ca = SessionCa::new(&CaParams::new("sess-1", 1, "gw-a", ["api.example.com"])).unwrap();
    for (san, name) in [
        ("sub.api.example.com", "sub.api.example.com"),
        ("*.api.example.com", "www.api.example.com"),
        ("example.com", "example.com"),
        ("evil.com", "evil.com"),
    ] {
        let leaf = ca.sign_any_for_tests(san).unwrap();
        let error = handshake(&ca, Arc::clone(leaf.certified_key()), name)
            .err()
            .unwrap_or_else(|| panic!("{san} accepted for {name}"));
        assert_constraint_violation(san, &error);
    }
}

#[test]
fn rustls_client_refuses_nested_leaves_from_every_intermediate() {
    let ca = SessionCa::new(&CaParams::new(
        "sess-1",
        1,
        "gw-a",
        ["github.com", "api.github.com"],
    ))
    .unwrap();
    assert_eq!(ca.level_count(), 2);
    for level in 0..ca.level_count() {
        for (san, name) in [
            ("evil.github.com", "evil.github.com"),
            ("x.api.github.com", "x.api.github.com"),
            ("*.github.com", "api.github.com"),
            ("*.api.github.com", "www.api.github.com"),
        ] {
            let leaf = ca.sign_any_at_level_for_tests(level, san).unwrap();
            let error = handshake(&ca, Arc::clone(leaf.certified_key()), name)
                .err()
                .unwrap_or_else(|| panic!("{san} at level {level} accepted for {name}"));
            assert_constraint_violation(&format!("{san} at level {level}"), &error);
        }
    }
    // A listed name signed by the other level's intermediate is refused
    // too: each intermediate vouches for its own level only.
    for (name, wrong_level) in [("github.com", 1), ("api.github.com", 0)] {
        let leaf = ca.sign_any_at_level_for_tests(wrong_level, name).unwrap();
        let error = handshake(&ca, Arc::clone(leaf.certified_key()), name)
            .err()
            .unwrap_or_else(|| panic!("{name} at level {wrong_level} accepted"));
        assert_constraint_violation(name, &error);
    }
}
