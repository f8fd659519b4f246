//! The batch intake: the `ControlPlane` service, where the gateways ship
//! their signed batches of connection records, served by the control
//! listener ([`super::control`]).
//!
//! Each batch is verified ([`batches::accept`]: signature under the
//! gateway's registered key, sequence, chain) and recorded in one store
//! transaction, so an `ACCEPTED` answer means the batch is on disk.
//!
//! The relay's `Propose` is served here too ([`crate::relay::receive`]):
//! `INVALID_ARGUMENT` for a proposal that does not hold together (a
//! sentence or digest that is not its fields', approvers that are not the
//! rule's), `FAILED_PRECONDITION` for one whose session is not running at
//! that attempt or whose rule is gone, `ALREADY_EXISTS` for a known id with
//! another digest, `PERMISSION_DENIED` when the client certificate does not
//! name the proposing gateway. Each status message starts with the stable
//! code (`proposal_invalid`, …).
//!
//! A gateway may submit only its own batches: the client certificate must
//! name, as a DNS name, the gateway id the batch claims (`init` puts each
//! gateway's id in its certificate). A batch another member's certificate
//! brings is refused `certificate_mismatch` and recorded, before its
//! signature is even checked.
//!
//! # At the drain
//!
//! The store's work for a batch or a proposal runs on a blocking thread
//! the intake keeps track of: once taken, it is decided (committed or
//! rolled back) even if the gateway's connection is cut at the end of the
//! grace — its answer is then lost, the gateway sends the batch again
//! later and is answered `DUPLICATE`. [`Intake::stop`] takes no more
//! (`UNAVAILABLE`: the gateway keeps the batch and sends it again) and
//! waits for every one taken, so the store is never left with work under
//! way when `serve` exits. `stub_batches_in_intake` counts the batches
//! taken and not yet decided.
//!
//! # Limits
//!
//! - A message is at most [`MAX_MESSAGE`] bytes.

use std::sync::{Arc, Mutex};

use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};

use crate::batches::{self, BatchVerdict};
use crate::error::Error;
use crate::pb;
use crate::pb::control_plane_server::ControlPlane;
use crate::store::Store;
use talos_contract::sync::Locked;

/// The largest gRPC message accepted: a batch payload may be up to
/// talos-certs' `MAX_PAYLOAD_LEN` (32 MiB), plus the envelope.
pub const MAX_MESSAGE: usize = talos_certs::MAX_PAYLOAD_LEN + 64 * 1024;

/// The rejection reason of a batch whose gateway id the client's
/// certificate does not name.
pub use talos_contract::role::CERTIFICATE_MISMATCH;

/// What the relay calls when it stores a new card, with the store it is
/// in: the people's web app (Web Push, the live card streams).
pub type CardHook = Arc<dyn Fn(&Store, &crate::store::ProposalRecord) + Send + Sync>;

/// The batch intake: the store behind a lock (one writer at a time, as
/// SQLite has anyway), and the store work under way.
#[derive(Clone)]
pub struct Intake {
    store: Arc<Mutex<Store>>,
    /// The control channel identity, to fetch the key of a member that was
    /// added (`gateway add`) but never reached, when its first batch comes.
    control_dir: Option<std::path::PathBuf>,
    /// Every batch's and proposal's store work, on a blocking thread each.
    tasks: TaskTracker,
    /// Called for each new card the relay stores.
    on_card: Option<CardHook>,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("control_dir", &self.control_dir)
            .field("tasks", &self.tasks)
            .field("on_card", &self.on_card.is_some())
            .finish_non_exhaustive()
    }
}

impl Intake {
    pub fn new(store: Store) -> Intake {
        Intake::shared(Arc::new(Mutex::new(store)))
    }

    /// An intake on a store shared with other parts of `serve`.
    pub fn shared(store: Arc<Mutex<Store>>) -> Intake {
        Intake {
            store,
            control_dir: None,
            tasks: TaskTracker::new(),
            on_card: None,
        }
    }

    /// Call `hook` for each new card the relay stores (after it is
    /// stored; the gateway's call waits for nothing it does).
    pub fn on_card(mut self, hook: CardHook) -> Intake {
        self.on_card = Some(hook);
        self
    }

    /// Register a stored member's key at its first batch, by asking it
    /// (`Describe` over the control channel, with the identity in `dir`).
    pub fn registering(mut self, dir: std::path::PathBuf) -> Intake {
        self.control_dir = Some(dir);
        self
    }

    /// Take no more batches or proposals (each answered `UNAVAILABLE`),
    /// and wait for every one taken to be decided: committed or rolled
    /// back, whether or not its connection is still there to hear the
    /// answer. Returns how many were under way. Not bounded by the grace:
    /// a store transaction cannot be cut, only waited for (the store's own
    /// timeouts bound it).
    pub async fn stop(&self) -> usize {
        self.tasks.close();
        let under_way = self.tasks.len();
        self.tasks.wait().await;
        under_way
    }

    /// `UNAVAILABLE` once [`Intake::stop`] has begun.
    fn open(&self, what: &str) -> Result<(), Status> {
        if self.tasks.is_closed() {
            return Err(Status::unavailable(format!(
                "this control plane replica is stopping: send the {what} again"
            )));
        }
        Ok(())
    }
}

/// A batch taken and not yet decided, counted in `stub_batches_in_intake`
/// while it lives.
struct InIntake;

impl InIntake {
    fn new() -> InIntake {
        metrics::gauge!("stub_batches_in_intake").increment(1.0);
        InIntake
    }
}

impl Drop for InIntake {
    fn drop(&mut self) {
        metrics::gauge!("stub_batches_in_intake").decrement(1.0);
    }
}

/// Why a batch waits: the member is in the store (`gateway add`) with no
/// key yet, and could not be asked for it. The gateway keeps the batch and
/// sends it again (gRPC `UNAVAILABLE`), so a member's first start, with
/// its start report, is never refused `unknown_gateway`.
struct NotRegisteredYet(String);

/// If `gateway_id` is a stored member whose key is not registered, ask it
/// for its key over the control channel and register it. `Ok` when there
/// was nothing to do or it is registered now.
fn register_member(
    store: &Mutex<Store>,
    control_dir: Option<&std::path::Path>,
    gateway_id: &str,
) -> Result<(), NotRegisteredYet> {
    let member = store.locked().read(|tx| {
        Ok(match tx.gateway_key(gateway_id)? {
            Some(_) => None,
            None => tx.member(gateway_id)?,
        })
    });
    let member = match member {
        Ok(Some(m)) => m,
        // Registered, or no member of that id (refused unknown_gateway as
        // before), or the store failed (the accept below says so).
        _ => return Ok(()),
    };
    let Some(dir) = control_dir else {
        return Ok(());
    };
    let wait = |why: String| {
        Err(NotRegisteredYet(format!(
            "member {gateway_id} is added but its key is not registered yet: {why}; send the batch again"
        )))
    };
    let target = format!("{}={}", member.id, member.control);
    let link = match crate::grpc_link::GrpcLink::new(&[target], Some(dir.to_owned())) {
        Ok(l) => l,
        Err(e) => return wait(e.to_string()),
    };
    let reply = crate::link::GatewayLink::describe(&link).into_iter().next();
    let described = match reply.map(|r| r.result) {
        Some(Ok(d)) => d,
        Some(Err(e)) => return wait(format!("its Describe failed: {e}")),
        None => return wait("no Describe answer".into()),
    };
    if described.gateway_id != gateway_id || described.public_key_hex.is_empty() {
        return wait(format!(
            "its Describe answered as {:?} with no usable key",
            described.gateway_id
        ));
    }
    let mut store = store.locked();
    if let Err(e) = store.register_gateway(gateway_id, &described.public_key_hex) {
        return wait(e.to_string());
    }
    let _ = store.keep_key_binding(
        gateway_id,
        &described.public_key_hex,
        &described.key_binding,
    );
    let at = crate::store::now();
    let _ =
        store.write(|tx| tx.gateway_seen(gateway_id, &described.instance, described.lease_ms, &at));
    eprintln!(
        "{}",
        serde_json::json!({"registered": gateway_id, "via": "first batch", "control": member.control})
    );
    Ok(())
}

/// The certificates the client presented, put in each request's
/// extensions by the connection that carried it.
#[derive(Clone, Debug)]
pub struct PeerCerts(pub Arc<Vec<rustls::pki_types::CertificateDer<'static>>>);

/// Whether the client's certificate carries the gateway role and names
/// `gateway_id`, both as DNS names (talos-contract `role`).
fn certificate_names(peer: Option<&PeerCerts>, gateway_id: &str) -> bool {
    let Some(leaf) = peer.and_then(|p| p.0.first()) else {
        return false;
    };
    let names = |name: &str| {
        rustls::pki_types::ServerName::try_from(name).is_ok_and(|name| {
            webpki::EndEntityCert::try_from(leaf)
                .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
        })
    };
    names(talos_contract::role::GATEWAY) && names(gateway_id)
}

/// The envelope as talos-certs reads it, or why not.
fn signed_from(msg: pb::Signed) -> Result<talos_certs::Signed, String> {
    let kind = match msg.kind.as_str() {
        "batch" => talos_certs::Kind::Batch,
        "drop_report" => talos_certs::Kind::DropReport,
        "decision" => talos_certs::Kind::Decision,
        other => {
            return Err(format!(
                "kind {:?} is not batch, drop_report or decision",
                other.chars().take(40).collect::<String>()
            ))
        }
    };
    Ok(talos_certs::Signed {
        kind,
        key_id: msg.key_id,
        payload: msg.payload,
        signature: msg.signature,
    })
}

#[tonic::async_trait]
impl ControlPlane for Intake {
    async fn submit_batch(
        &self,
        request: Request<pb::Signed>,
    ) -> Result<Response<pb::BatchAck>, Status> {
        self.open("batch")?;
        let peer = request.extensions().get::<PeerCerts>().cloned();
        let signed = signed_from(request.into_inner()).map_err(Status::invalid_argument)?;
        let store = self.store.clone();
        let control_dir = self.control_dir.clone();
        let taken = InIntake::new();
        let verdict = TaskTracker::spawn_blocking(&self.tasks, move || {
            let _taken = taken;
            let (claimed, seq) = talos_certs::claimed_header(&signed.payload);
            let named = !claimed.is_empty() && certificate_names(peer.as_ref(), &claimed);
            if named {
                register_member(&store, control_dir.as_deref(), &claimed)?;
            }
            let mut store = store.locked();
            // A payload that names no gateway is refused `malformed` below.
            if !claimed.is_empty() && !named {
                let sessions = crate::batches::claimed_sessions(&signed.payload);
                return Ok(store
                    .record_rejection(&claimed, seq, CERTIFICATE_MISMATCH, &sessions)
                    .map(|()| BatchVerdict::Rejected {
                        gateway_id: claimed,
                        seq,
                        reason: CERTIFICATE_MISMATCH,
                        detail: "the client certificate does not name the gateway the batch claims"
                            .into(),
                    }));
            }
            Ok(batches::accept(&mut store, &signed))
        })
        .await
        .map_err(|e| Status::internal(format!("batch consumer task: {e}")))?
        .map_err(|NotRegisteredYet(why)| Status::unavailable(why))?
        .map_err(|e| {
            log_store_error(&e);
            Status::internal(format!("{}: {e}", e.code()))
        })?;
        use pb::batch_ack::Status as S;
        let ack = match verdict {
            BatchVerdict::Accepted { seq, gateway_id } => {
                metrics::counter!("stub_batches_accepted_total", "gateway" => gateway_id)
                    .increment(1);
                pb::BatchAck {
                    status: S::Accepted as i32,
                    seq,
                    reason: String::new(),
                }
            }
            BatchVerdict::Duplicate { seq, .. } => pb::BatchAck {
                status: S::Duplicate as i32,
                seq,
                reason: String::new(),
            },
            BatchVerdict::Rejected {
                seq,
                reason,
                gateway_id,
                detail,
            } => {
                eprintln!(
                    "{}",
                    serde_json::json!({"batch_rejected": reason, "gateway_id": gateway_id, "seq": seq, "detail": detail})
                );
                metrics::counter!("stub_batches_rejected_total", "gateway" => gateway_id.chars().take(64).collect::<String>(), "reason" => reason)
                    .increment(1);
                pb::BatchAck {
                    status: S::Rejected as i32,
                    seq,
                    reason: reason.to_owned(),
                }
            }
        };
        Ok(Response::new(ack))
    }

    async fn propose(
        &self,
        request: Request<pb::ProposalMsg>,
    ) -> Result<Response<pb::ProposeAck>, Status> {
        self.open("proposal")?;
        let peer = request.extensions().get::<PeerCerts>().cloned();
        let msg = request.into_inner();
        // A gateway proposes only for itself, as it submits only its own
        // batches.
        if !certificate_names(peer.as_ref(), &msg.gateway_id) {
            log_proposal(&msg, "refused", Some(CERTIFICATE_MISMATCH));
            return Err(Status::permission_denied(format!(
                "{CERTIFICATE_MISMATCH}: the client certificate does not name the gateway the proposal claims"
            )));
        }
        let store = self.store.clone();
        let on_card = self.on_card.clone();
        let result = TaskTracker::spawn_blocking(&self.tasks, move || {
            let mut store = store.locked();
            let r = crate::relay::receive(&mut store, &msg);
            if let (Ok(crate::relay::Received::New(card)), Some(hook)) = (&r, &on_card) {
                hook(&store, card);
            }
            (msg, r)
        })
        .await
        .map_err(|e| Status::internal(format!("relay task: {e}")))?;
        match result {
            (msg, Ok(crate::relay::Received::New(_))) => {
                log_proposal(&msg, "pending", None);
                Ok(Response::new(pb::ProposeAck {}))
            }
            (msg, Ok(crate::relay::Received::Joined { card, .. })) => {
                // No card of its own, no notification: the person decides
                // the first use once, on `card`.
                log_proposal(&msg, &format!("joined to card {card}"), None);
                Ok(Response::new(pb::ProposeAck {}))
            }
            (msg, Ok(crate::relay::Received::Again { .. })) => {
                log_proposal(&msg, "again", None);
                Ok(Response::new(pb::ProposeAck {}))
            }
            (msg, Err(e)) => {
                log_proposal(&msg, "refused", Some(e.code()));
                let text = format!("{}: {e}", e.code());
                Err(match e {
                    Error::ProposalInvalid { .. } => Status::invalid_argument(text),
                    Error::ProposalStale { .. } => Status::failed_precondition(text),
                    Error::ProposalConflict { .. } => Status::already_exists(text),
                    other => {
                        log_store_error(&other);
                        Status::internal(text)
                    }
                })
            }
        }
    }
}

/// One JSON line per proposal on standard error: who proposed what, and
/// what became of it. Proposals hold no secret (attachments by name).
fn log_proposal(msg: &pb::ProposalMsg, status: &str, error: Option<&str>) {
    let short = |t: &str| t.chars().take(200).collect::<String>();
    eprintln!(
        "{}",
        serde_json::json!({
            "proposal": short(&msg.proposal_id),
            "status": status,
            "error": error,
            "gateway_id": short(&msg.gateway_id),
            "session_id": short(&msg.session_id),
            "attempt": msg.attempt,
            "kind": short(&msg.kind),
            "rule": short(&msg.rule),
            "digest": short(&msg.digest),
        })
    );
}

/// A store failure while serving, on standard error (the store's messages
/// name tables, never values).
fn log_store_error(e: &Error) {
    eprintln!(
        "{}",
        serde_json::json!({"error": e.code(), "message": e.to_string()})
    );
}
