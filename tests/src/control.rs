//! The control plane's side of the control channel, for tests: a control
//! CA with certificates for the gateway and for clients, and a tonic
//! `Gateway` client that speaks mutual TLS through its own connector (the
//! workspace keeps one TLS stack, rustls, under tonic too).

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use talos_gateway::pb::gateway_client::GatewayClient;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

use crate::gateway::TestControl;
use crate::origin::TestCa;

/// The name in the gateway's control certificate.
pub const GATEWAY_NAME: &str = "gw-test.control.test";

/// A control CA and the files of the gateway's `[control]` table.
#[derive(Debug)]
pub struct ControlPki {
    pub ca: TestCa,
    pub files: TestControl,
}

impl ControlPki {
    /// A fresh control CA; the gateway's certificate, key (mode 0600) and
    /// the CA written into `dir`. The signing key file does not exist yet:
    /// the gateway makes it.
    pub fn new(dir: &Path) -> ControlPki {
        let ca = TestCa::new("control test CA");
        let files = ControlPki::files(dir);
        ca.write_pem(&files.ca_file);
        let (cert, key) = ca.leaf_pem(&[GATEWAY_NAME, talos_contract::role::GATEWAY]);
        std::fs::write(&files.cert_file, cert).expect("write cert");
        std::fs::write(&files.key_file, key).expect("write key");
        std::fs::set_permissions(&files.key_file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod key");
        ControlPki { ca, files }
    }

    /// Where [`ControlPki::new`] writes into `dir`: the files of the
    /// gateway's `[control]` table (listening on 127.0.0.1:0, nothing more).
    pub fn files(dir: &Path) -> TestControl {
        TestControl {
            ca_file: dir.join("control-ca.pem"),
            cert_file: dir.join("control-cert.pem"),
            key_file: dir.join("control-key.pem"),
            signing_key_file: dir.join("gateway-signing.key"),
            listen: String::new(),
            extra: String::new(),
        }
    }

    /// The control plane's client identity from this CA (certificate PEM,
    /// key PEM): it carries the control plane's role.
    pub fn client_identity(&self) -> (String, String) {
        self.ca.leaf_pem(&[
            "control-plane.control.test",
            talos_contract::role::CONTROL_PLANE,
        ])
    }

    /// A peer gateway's identity from the same CA: the gateway role, not
    /// the control plane's.
    pub fn peer_gateway_identity(&self) -> (String, String) {
        self.ca
            .leaf_pem(&["gw-peer.control.test", talos_contract::role::GATEWAY])
    }
}

/// A `Gateway` client to `addr`, trusting the control CA in `ca_pem`, with
/// `identity` (certificate and key PEM) as its client certificate, or none.
///
/// The connection is made lazily; with TLS 1.3 a refused client
/// certificate shows on the first call, not at connect.
pub fn gateway_client(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<(String, String)>,
) -> GatewayClient<Channel> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("PEM")).expect("anchor");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("cert PEM");
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key PEM");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client cert")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from(GATEWAY_NAME).expect("name");
    let connect = tower::service_fn(move |_uri: hyper::Uri| {
        let connector = connector.clone();
        let name = name.clone();
        async move {
            let tcp = TcpStream::connect(addr).await?;
            // As the control plane's client sets it (control-stub's
            // grpc_link): a call's frames leave at once, not after the
            // peer's delayed ACK.
            tcp.set_nodelay(true)?;
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    let channel = Endpoint::from_shared(format!("https://{GATEWAY_NAME}"))
        .expect("endpoint uri")
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .connect_with_connector_lazy(connect);
    GatewayClient::new(channel)
}
