//! `GrpcLink` and `SignatureVerifier` against stand-in gateways: real
//! `Gateway` gRPC servers on loopback over mutual TLS with certificates
//! from `init`, which make real CA certificates and sign real drop reports
//! with their own Ed25519 keys.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use talos_certs::{DropReason, DropReport, GatewayKey};
use talos_control_stub::identity;
use talos_control_stub::pb;
use talos_control_stub::pb::gateway_server::Gateway;
use talos_control_stub::{
    GrpcLink, Lifecycle, Mode, SignatureVerifier, StartRequest, State, Store,
};
use tonic::{Request, Response, Status};

/// What a stand-in holds for a session: attempt, CA digest, secret names.
type Held = (u32, String, Vec<String>);

/// A stand-in gateway: one CA per open, a signed report per close.
#[derive(Clone)]
struct StandIn {
    id: String,
    key: Arc<GatewayKey>,
    /// Refuse every open with FAILED_PRECONDITION.
    refuse_open: bool,
    live: Arc<Mutex<BTreeMap<String, Held>>>,
    closes: Arc<Mutex<Vec<pb::CloseSessionRequest>>>,
    renewals: Arc<Mutex<Vec<pb::RenewLeasesRequest>>>,
}

#[tonic::async_trait]
impl Gateway for StandIn {
    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionReply>, Status> {
        if self.refuse_open {
            return Err(Status::failed_precondition("stand-in refuses every open"));
        }
        let req = request.into_inner();
        let ca = rcgen::generate_simple_self_signed(req.allowlist.clone()).unwrap();
        let digest = talos_certs::sha384_hex(ca.cert.der());
        let secrets = req.attachments.iter().map(|a| a.secret.clone()).collect();
        self.live
            .lock()
            .unwrap()
            .insert(req.session_id, (req.attempt, digest.clone(), secrets));
        Ok(Response::new(pb::OpenSessionReply {
            gateway_id: self.id.clone(),
            ca_pem: ca.cert.pem(),
            ca_digest: digest,
            instance: "00000000000000aa".into(),
            lease_ms: 60_000,
        }))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionReply>, Status> {
        let req = request.into_inner();
        self.closes.lock().unwrap().push(req.clone());
        let Some((attempt, digest, secrets)) = self.live.lock().unwrap().remove(&req.session_id)
        else {
            return Err(Status::failed_precondition("no authority for that session"));
        };
        let reason = match req.reason.as_str() {
            "pause" => DropReason::Pause,
            "interruption" => DropReason::Interruption,
            "revoke_all" => DropReason::RevokeAll,
            _ => DropReason::End,
        };
        let signed = DropReport {
            gateway_id: self.id.clone(),
            instance: "00000000000000aa".into(),
            session_id: req.session_id,
            attempt,
            ca_digest: digest,
            secrets,
            reason,
            at: "2026-11-29T12:00:00Z".into(),
        }
        .sign(&self.key);
        Ok(Response::new(pb::CloseSessionReply {
            drop_report: Some(pb::Signed {
                kind: signed.kind.as_str().into(),
                key_id: signed.key_id,
                payload: signed.payload,
                signature: signed.signature,
            }),
            connections_closed: 0,
            approvals_withdrawn: 0,
        }))
    }

    async fn decide(
        &self,
        _request: Request<pb::Signed>,
    ) -> Result<Response<pb::DecideReply>, Status> {
        Err(Status::failed_precondition(
            "the stand-in holds no proposal",
        ))
    }

    async fn describe(
        &self,
        _request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeReply>, Status> {
        Ok(Response::new(pb::DescribeReply {
            gateway_id: self.id.clone(),
            public_key: self.key.public_key().to_vec(),
            key_id: self.key.key_id(),
            instance: "00000000000000aa".into(),
            lease_ms: 60_000,
            key_binding: Vec::new(),
        }))
    }

    async fn renew_leases(
        &self,
        request: Request<pb::RenewLeasesRequest>,
    ) -> Result<Response<pb::RenewLeasesReply>, Status> {
        let req = request.into_inner();
        self.renewals.lock().unwrap().push(req.clone());
        // Takes the entries that name a holder other than itself.
        let taken = req
            .forwarding
            .iter()
            .filter(|f| f.holders.iter().any(|h| *h != self.id))
            .count();
        Ok(Response::new(pb::RenewLeasesReply {
            renewed: req.leases,
            not_held: Vec::new(),
            lease_ms: 60_000,
            instance: "00000000000000aa".into(),
            forwarding_taken: u32::try_from(taken).unwrap(),
        }))
    }
}

impl StandIn {
    fn new(id: &str) -> StandIn {
        StandIn {
            id: id.into(),
            key: Arc::new(GatewayKey::generate().unwrap()),
            refuse_open: false,
            live: Arc::default(),
            closes: Arc::default(),
            renewals: Arc::default(),
        }
    }

    /// Serve on 127.0.0.1:0 with the identity `id` from `dir`, on a thread
    /// of its own (the link under test blocks on its own runtime).
    fn serve(&self, dir: &std::path::Path) -> SocketAddr {
        common::serve_stand_in(dir, &self.id, self.clone())
    }
}

struct Setup {
    tmp: tempfile::TempDir,
    store: Store,
}

impl Setup {
    fn new() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        identity::init(&tmp.path().join("control"), &["gw-a".into(), "gw-b".into()]).unwrap();
        let mut store = Store::open(tmp.path().join("stub.db")).unwrap();
        store.egress_add("api.github.com").unwrap();
        store.secret_set("acme", "GH", b"gh-value-QZX").unwrap();
        Setup { tmp, store }
    }

    fn dir(&self) -> std::path::PathBuf {
        self.tmp.path().join("control")
    }

    fn link(&self, gateways: &[String]) -> GrpcLink {
        GrpcLink::new(gateways, Some(self.dir())).unwrap()
    }
}

fn request() -> StartRequest {
    StartRequest::new(
        "acme",
        vec!["10.1.0.2".into()],
        vec!["api.github.com".into()],
        vec!["GH=api.github.com:authorization:Bearer".into()],
        Mode::Commands,
    )
}

fn register(store: &mut Store, link: &GrpcLink) {
    use talos_control_stub::GatewayLink;
    for d in link.describe().into_iter().map(|r| r.result.unwrap()) {
        store
            .register_gateway(&d.gateway_id, &d.public_key_hex)
            .unwrap();
    }
}

#[test]
fn a_session_runs_through_real_channels_and_its_reset_is_confirmed() {
    let mut s = Setup::new();
    let a = StandIn::new("gw-a");
    let b = StandIn::new("gw-b");
    let gateways = vec![
        format!("gw-a={}", a.serve(&s.dir())),
        format!("gw-b={}", b.serve(&s.dir())),
    ];
    let link = s.link(&gateways);
    register(&mut s.store, &link);
    let keys = s.store.gateways().unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].public_key_hex, hex::encode(a.key.public_key()));

    let verifier = SignatureVerifier;
    let mut life = Lifecycle::new(&mut s.store, &link, &verifier);
    let started = life.start(&request()).unwrap();
    assert_eq!(started.ca.len(), 2);
    let id = started.session_id;
    let paused = life.pause(&id).unwrap();
    assert_eq!(paused.state, State::Paused);
    assert!(paused
        .reports
        .iter()
        .all(|r| r.ca_error.is_none() && r.secrets_error.is_none()));
    life.resume(&id).unwrap();
    let stopped = life.stop(&id).unwrap();
    assert_eq!(stopped.state, State::Ended, "{stopped:#?}");
    assert!(stopped.reset.iter().all(|r| r.confirmed), "{stopped:#?}");
}

#[test]
fn reports_signed_by_another_key_do_not_confirm_the_reset() {
    let mut s = Setup::new();
    let a = StandIn::new("gw-a");
    let gateways = vec![format!("gw-a={}", a.serve(&s.dir()))];
    let link = s.link(&gateways);
    // Registered under another key than the one the gateway signs with.
    let other = GatewayKey::generate().unwrap();
    s.store
        .register_gateway("gw-a", &hex::encode(other.public_key()))
        .unwrap();
    let verifier = SignatureVerifier;
    let mut life = Lifecycle::new(&mut s.store, &link, &verifier);
    let id = life.start(&request()).unwrap().session_id;
    let stopped = life.stop(&id).unwrap();
    assert_eq!(stopped.state, State::ResetIncomplete);
    let err = stopped.reports[0].ca_error.as_deref().unwrap();
    assert!(err.contains("signature"), "{err}");

    // And first contact with the changed key is a conflict: said, and the
    // command goes on (a pause, a stop, a Revoke All must reach the other
    // members), opening nothing there.
    let mut cli_out = Vec::new();
    let mut cli_err = Vec::new();
    let db = s.tmp.path().join("stub.db");
    drop(s.store);
    let status = talos_control_stub::cli::main_with(
        [
            "control-stub",
            "--db",
            db.to_str().unwrap(),
            "sandbox",
            "pause",
            &id,
        ],
        &link,
        &verifier,
        &mut std::io::empty(),
        &mut cli_out,
        &mut cli_err,
    );
    let err = String::from_utf8_lossy(&cli_err);
    assert!(
        err.contains("\"warning\":\"gateway_key_conflict\""),
        "{err}"
    );
    // The command itself went on (and fails on its own account: the
    // session is not running).
    assert!(err.contains("sandbox_not_running"), "{err}");
    assert_eq!(status, 2, "{err}");
}

#[test]
fn a_refused_open_fails_and_closes_the_gateway_that_opened() {
    let mut s = Setup::new();
    let a = StandIn::new("gw-a");
    let mut b = StandIn::new("gw-b");
    b.refuse_open = true;
    let gateways = vec![
        format!("gw-a={}", a.serve(&s.dir())),
        format!("gw-b={}", b.serve(&s.dir())),
    ];
    let link = s.link(&gateways);
    register(&mut s.store, &link);
    let verifier = SignatureVerifier;
    let mut life = Lifecycle::new(&mut s.store, &link, &verifier);
    let err = life.start(&request()).unwrap_err();
    assert_eq!(err.code(), "gateway_refused");
    assert!(err.to_string().contains("stand-in refuses"), "{err}");
    assert!(a.live.lock().unwrap().is_empty());
    let closes = a.closes.lock().unwrap();
    assert_eq!(closes.len(), 1);
    assert_eq!(closes[0].reason, "end");
}

#[test]
fn a_gateway_that_is_not_there_or_not_who_it_should_be_is_refused() {
    let s = Setup::new();
    // Nothing listens: unreachable.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let link = s.link(&[format!("gw-a={addr}")]);
    use talos_control_stub::GatewayLink;
    assert_eq!(
        link.describe()[0].result.as_ref().unwrap_err().code(),
        "gateway_unreachable"
    );

    // gw-b's certificate does not name gw-a: the TLS name check fails.
    let b = StandIn::new("gw-b");
    let link = s.link(&[format!("gw-a={}", b.serve(&s.dir()))]);
    assert_eq!(
        link.describe()[0].result.as_ref().unwrap_err().code(),
        "gateway_unreachable"
    );

    // Without an id, `localhost` is checked and the gateway's own id used.
    let link = s.link(&[b.serve(&s.dir()).to_string()]);
    let d = link.describe();
    assert_eq!(d[0].result.as_ref().unwrap().gateway_id, "gw-b");
    assert_eq!(d[0].member, "gw-b");
}

#[test]
fn a_renewal_carries_each_members_leases_and_whole_forwarding_table() {
    use talos_control_stub::link::{Forwarding, MemberRenewal};
    use talos_control_stub::GatewayLink;
    let s = Setup::new();
    let a = StandIn::new("gw-a");
    let b = StandIn::new("gw-b");
    let gateways = vec![
        format!("gw-a={}", a.serve(&s.dir())),
        format!("gw-b={}", b.serve(&s.dir())),
    ];
    let link = s.link(&gateways);
    let entry = Forwarding {
        session_id: "sbx-000000000001".into(),
        attempt: 3,
        tenant: "acme".into(),
        sources: vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
        holders: vec!["gw-b".into()],
    };
    let renewals = [
        MemberRenewal {
            gateway: "gw-a".into(),
            leases: Vec::new(),
            forwarding: vec![entry],
            read_at_unix_ms: 1_765_000_000_000,
        },
        MemberRenewal {
            gateway: "gw-b".into(),
            leases: vec![("sbx-000000000001".into(), 3)],
            forwarding: Vec::new(),
            read_at_unix_ms: 1_765_000_000_000,
        },
    ];
    let mut replies = link.renew(&renewals);
    replies.sort_by(|x, y| x.member.cmp(&y.member));
    let got: Vec<(String, u32, usize)> = replies
        .into_iter()
        .map(|r| {
            let r = r.result.unwrap();
            (r.instance, r.forwarding_taken, r.renewed.len())
        })
        .collect();
    assert_eq!(
        got,
        [
            ("00000000000000aa".to_owned(), 1, 0),
            ("00000000000000aa".to_owned(), 0, 1)
        ]
    );
    // On the wire: gw-a got its one entry, sources as text; gw-b its lease
    // and an empty table (which withdraws every entry it had).
    let on_a = a.renewals.lock().unwrap().clone();
    assert_eq!(on_a.len(), 1);
    assert!(on_a[0].leases.is_empty());
    assert_eq!(
        on_a[0].forwarding,
        [pb::Forwarding {
            session_id: "sbx-000000000001".into(),
            attempt: 3,
            tenant: "acme".into(),
            sources: vec!["10.1.0.2".into(), "fd00::2".into()],
            holders: vec!["gw-b".into()],
        }]
    );
    let on_b = b.renewals.lock().unwrap().clone();
    assert_eq!(on_b.len(), 1);
    assert_eq!(on_b[0].leases.len(), 1);
    assert!(on_b[0].forwarding.is_empty());
}
