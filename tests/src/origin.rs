//! A real TLS origin on 127.0.0.1 with its own test CA: TLS 1.3, ALPN h2
//! and http/1.1, answering every request with a short text naming the
//! protocol and path.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A test CA that can sign origin certificates.
#[derive(Debug)]
pub struct TestCa {
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
    params: CertificateParams,
    key: KeyPair,
}

impl TestCa {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("ca key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("self-signed");
        TestCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            params,
            key,
        }
    }

    /// A leaf for `names`, signed by this CA: (chain, key).
    pub fn leaf(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let params = CertificateParams::new(names).expect("leaf params");
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign leaf");
        (
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
    }

    /// Write the CA certificate as PEM to `path`.
    pub fn write_pem(&self, path: &Path) {
        std::fs::write(path, &self.cert_pem).expect("write ca pem");
    }
}

/// A running origin; stops when dropped.
#[derive(Debug)]
pub struct Origin {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    /// Serve TLS 1.3 for `names` (certificate from `ca`) on 127.0.0.1:0.
    pub async fn start(ca: &TestCa, names: &[&str]) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
        Origin::serve(listener, ca, names)
    }

    /// Serve on an already bound listener.
    pub fn serve(listener: TcpListener, ca: &TestCa, names: &[&str]) -> Origin {
        let addr = listener.local_addr().expect("origin addr");
        let (chain, key) = ca.leaf(names);
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("tls13")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("origin cert");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        |req: Request<hyper::body::Incoming>| async move {
                            let text = format!(
                                "origin says hello: {:?} {} {}\n",
                                req.version(),
                                req.method(),
                                req.uri().path()
                            );
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                                Bytes::from(text),
                            )))
                        },
                    );
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Origin { addr, task }
    }
}
