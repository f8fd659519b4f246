//! The member link's TLS: both ends of a link connection, as the gateway
//! builds them, negotiate TLS 1.3 with AES-128-GCM, and a peer offering
//! only another suite is refused rather than met halfway.
//!
//! A control CA and two member identities made here with rcgen; the
//! connection pair runs in memory.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConnection, ServerConnection};

struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

struct Ca {
    der: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

fn ca() -> Ca {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "link test CA");
    let der = params.self_signed(&key).unwrap().der().clone();
    Ca {
        der,
        issuer: rcgen::Issuer::new(params, key),
    }
}

fn member(id: &str, ca: &Ca) -> Identity {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec![id.to_string()]).unwrap();
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    Identity {
        chain: vec![cert.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    }
}

/// Move what `from` has to send into `to`.
fn flush<A, B>(
    from: &mut rustls::ConnectionCommon<A>,
    to: &mut rustls::ConnectionCommon<B>,
) -> Result<(), rustls::Error> {
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire).unwrap();
    }
    let mut slice = &wire[..];
    while !slice.is_empty() {
        to.read_tls(&mut slice).unwrap();
        to.process_new_packets()?;
    }
    Ok(())
}

/// Run the handshake to its end or its first error.
fn handshake(
    client: &mut ClientConnection,
    server: &mut ServerConnection,
) -> Result<(), rustls::Error> {
    for _ in 0..10 {
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
        flush(client, server)?;
        flush(server, client)?;
    }
    panic!("the handshake did not end in ten flights");
}

#[test]
fn link_connections_negotiate_aes_128_gcm() {
    let ca = ca();
    let roots = vec![ca.der.clone()];
    let a = member("gw-a", &ca);
    let b = member("gw-b", &ca);
    let server = talos_gateway::tls::link_server_config(&roots, a.chain, a.key).unwrap();
    for alpn in [
        talos_gateway::tls::LINK_ALPN,
        talos_gateway::tls::HOLDINGS_ALPN,
    ] {
        let client = talos_gateway::tls::link_client_config(
            &roots,
            b.chain.clone(),
            b.key.clone_key(),
            alpn,
        )
        .unwrap();
        let mut c = ClientConnection::new(client, ServerName::try_from("gw-a").unwrap()).unwrap();
        let mut s = ServerConnection::new(Arc::clone(&server)).unwrap();
        handshake(&mut c, &mut s).unwrap();
        assert_eq!(
            c.negotiated_cipher_suite().map(|s| s.suite()),
            Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
        );
        assert_eq!(c.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_3));
        assert_eq!(s.alpn_protocol(), Some(alpn));
    }
}

#[test]
fn a_link_peer_offering_only_aes_256_is_refused() {
    let ca = ca();
    let roots = vec![ca.der.clone()];
    let a = member("gw-a", &ca);
    let b = member("gw-b", &ca);
    let server = talos_gateway::tls::link_server_config(&roots, a.chain, a.key).unwrap();
    let provider = Arc::new(rustls::crypto::CryptoProvider {
        cipher_suites: vec![rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384],
        ..rustls::crypto::aws_lc_rs::default_provider()
    });
    let mut store = rustls::RootCertStore::empty();
    store.add(roots[0].clone()).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(store)
        .with_client_auth_cert(b.chain, b.key)
        .unwrap();
    client.alpn_protocols = vec![talos_gateway::tls::LINK_ALPN.to_vec()];
    let mut c =
        ClientConnection::new(Arc::new(client), ServerName::try_from("gw-a").unwrap()).unwrap();
    let mut s = ServerConnection::new(server).unwrap();
    let err = handshake(&mut c, &mut s).unwrap_err();
    assert!(
        matches!(
            err,
            rustls::Error::PeerIncompatible(rustls::PeerIncompatible::NoCipherSuitesInCommon)
        ),
        "{err:?}"
    );
}
