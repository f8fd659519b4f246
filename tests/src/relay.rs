//! A test control plane for the gateway's outbound calls: a real
//! `ControlPlane` gRPC server over mutual TLS (certificates from the
//! [`ControlPki`] CA) that acknowledges every batch and keeps every
//! proposal, and an approval relay key that signs decisions, delivered to
//! the gateway with `Gateway.Decide` as the real relay does.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use talos_certs::{Decision, GatewayKey, Verdict};
use talos_gateway::pb;
use talos_gateway::pb::control_plane_server::{ControlPlane, ControlPlaneServer};
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use crate::control::ControlPki;

/// The name in the test control plane's certificate (the gateway's
/// `plane_name` default).
pub const PLANE_NAME: &str = "control-stub";

#[derive(Clone, Default)]
struct State {
    proposals: Arc<Mutex<Vec<pb::ProposalMsg>>>,
    batches: Arc<Mutex<u64>>,
    arrived: Arc<Notify>,
}

#[tonic::async_trait]
impl ControlPlane for State {
    async fn submit_batch(
        &self,
        request: Request<pb::Signed>,
    ) -> Result<Response<pb::BatchAck>, Status> {
        let (_, seq) = talos_certs::claimed_header(&request.get_ref().payload);
        *self.batches.lock().unwrap() += 1;
        Ok(Response::new(pb::BatchAck {
            status: pb::batch_ack::Status::Accepted as i32,
            seq,
            reason: String::new(),
        }))
    }

    async fn propose(
        &self,
        request: Request<pb::ProposalMsg>,
    ) -> Result<Response<pb::ProposeAck>, Status> {
        self.proposals.lock().unwrap().push(request.into_inner());
        self.arrived.notify_waiters();
        Ok(Response::new(pb::ProposeAck {}))
    }
}

/// A running test control plane with its relay key.
pub struct Relay {
    pub addr: SocketAddr,
    pub key: GatewayKey,
    state: State,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").field("addr", &self.addr).finish()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    /// Serve on 127.0.0.1:0 with a certificate for [`PLANE_NAME`] from
    /// `pki`'s CA, requiring client certificates from it.
    pub async fn start(pki: &ControlPki) -> Relay {
        let (cert, key) = pki.ca.leaf_pem(&[PLANE_NAME]);
        let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("cert");
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pki.ca.cert_der.clone()).expect("root");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::clone(&provider),
        )
        .build()
        .expect("verifier");
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("tls13")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server cert");
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = State::default();
        let routes = tonic::service::Routes::new(ControlPlaneServer::new(state.clone()));
        let task = tokio::spawn(crate::grpc::serve_routes(
            listener,
            acceptor,
            routes,
            crate::grpc::Flavour::H2,
        ));
        Relay {
            addr,
            key: GatewayKey::generate().expect("relay key"),
            state,
            task,
        }
    }

    /// How many batches were acknowledged so far.
    pub fn batches(&self) -> u64 {
        *self.state.batches.lock().unwrap()
    }

    /// Every proposal received so far.
    pub fn proposals(&self) -> Vec<pb::ProposalMsg> {
        self.state.proposals.lock().unwrap().clone()
    }

    /// Wait (at most `secs`) until at least `n` proposals arrived.
    pub async fn wait_proposals(&self, n: usize, secs: u64) -> Vec<pb::ProposalMsg> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let got = self.proposals();
            if got.len() >= n || tokio::time::Instant::now() > deadline {
                return got;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), self.state.arrived.notified())
                .await;
        }
    }

    /// A decision on `p` signed by the relay key.
    pub fn decision(&self, p: &pb::ProposalMsg, approver: &str, verdict: Verdict) -> pb::Signed {
        sign(&self.key, &p.proposal_id, &p.digest, approver, verdict)
    }
}

/// A decision signed by `key` (a forger's, in tests of forgery).
pub fn sign(
    key: &GatewayKey,
    proposal_id: &str,
    digest: &str,
    approver: &str,
    verdict: Verdict,
) -> pb::Signed {
    let signed = Decision {
        proposal_id: proposal_id.to_owned(),
        proposal_digest: digest.to_owned(),
        approver: approver.to_owned(),
        decision: verdict,
        decided_at: talos_gateway::records::record::now(),
        card: None,
        assertion: None,
    }
    .sign(key);
    pb::Signed {
        kind: signed.kind.as_str().to_owned(),
        key_id: signed.key_id,
        payload: signed.payload,
        signature: signed.signature,
    }
}
