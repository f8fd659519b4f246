//! Shipping the spool's signed batches to the control plane's
//! `ControlPlane` service, over the control channel's mutual TLS.
//!
//! Oldest first, one at a time: a batch is deleted from the spool only when
//! the control plane answers `ACCEPTED` (verified and stored) or
//! `DUPLICATE` (stored before; the acknowledgement was lost), and
//! `chain.json` records it as the acknowledged point first. A refusal
//! (`REJECTED` with its reason) or an outage is retried with growing delays
//! and never skipped, since the next batch would only be refused as a gap;
//! the spool's bound then makes the gateway fail closed
//! ([`crate::records::spool`]). The control plane's certificate must chain to the
//! control CA and carry `plane_name`; the gateway presents its own control
//! certificate, which must name its gateway id (the control plane refuses
//! batches for any other id).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio_util::sync::CancellationToken;

use crate::pb;
use crate::records::spool::{read_batch, Spool};
use crate::refusal::causes;
use crate::session::approvals::{Delivery, Proposed};

causes! {
    /// How the control plane acknowledged a batch it took (the `status` of
    /// `gateway_batches_shipped_total`).
    pub enum Shipped {
        /// Verified and stored.
        Accepted => "accepted",
        /// Stored before: the acknowledgement of an earlier delivery was lost.
        Duplicate => "duplicate",
    }
}

/// The `reason` label values of `gateway_batches_rejected_total`: every
/// reason the control plane answers `REJECTED` with. A reason outside them
/// (another control plane's) is counted too, from its first rejection.
pub fn rejection_reasons() -> impl Iterator<Item = &'static str> {
    talos_certs::ack_rejection_reasons()
}

/// Where and how the shipper reaches the control plane.
#[derive(Clone, Debug)]
pub struct Plane {
    /// Every replica (`control.plane`), in the order given.
    pub addrs: Vec<SocketAddr>,
    pub name: String,
    /// From [`crate::tls::plane_client_config`].
    pub tls: Arc<rustls::ClientConfig>,
}

/// How long one submission may take before it counts as failed, with one
/// replica: nothing to fail over to, so a slow answer is waited for.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(30);
/// The same with several: a replica that stops answering (hung, cut off)
/// is skipped after this long, so batches and proposals fail over within
/// seconds.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(5);
/// Retry delays after a failure: from the first to the cap, doubling.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_CAP: Duration = Duration::from_secs(10);

type Client = pb::control_plane_client::ControlPlaneClient<tonic::transport::Channel>;

/// The control plane's replicas, each with its own (lazily connected)
/// client, and the one calls go to now: a call goes to it, and on a
/// failure that says nothing of the call itself (unreachable,
/// `UNAVAILABLE`, a timeout, a replica's internal error) to the next, each
/// tried once per call, the first that answers becoming the current one.
#[derive(Clone)]
struct Replicas {
    clients: Arc<Vec<(SocketAddr, Client)>>,
    current: Arc<std::sync::atomic::AtomicUsize>,
}

/// A status that another replica may answer differently: the call did
/// not reach a replica that could decide it.
fn fails_over(status: &tonic::Status) -> bool {
    use tonic::Code as C;
    matches!(
        status.code(),
        C::Unavailable
            | C::DeadlineExceeded
            | C::Unknown
            | C::Cancelled
            | C::Internal
            | C::ResourceExhausted
            | C::Aborted
    )
}

impl Replicas {
    fn new(plane: &Plane) -> Result<Replicas, String> {
        let timeout = if plane.addrs.len() > 1 {
            FAILOVER_TIMEOUT
        } else {
            SUBMIT_TIMEOUT
        };
        let clients = plane
            .addrs
            .iter()
            .map(|a| Ok((*a, client(plane, *a, timeout)?)))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Replicas {
            clients: Arc::new(clients),
            current: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        })
    }

    /// `call` with `msg` on the current replica, then on each other in
    /// turn while the answer [`fails_over`]; the first other answer (or
    /// the last failure) is returned. `msg` is copied only for a replica
    /// that may be followed by another: the last one tried takes it.
    async fn call<M, T, F, Fut>(&self, msg: M, mut call: F) -> Result<T, tonic::Status>
    where
        M: Clone,
        F: FnMut(Client, M) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        use std::sync::atomic::Ordering;
        let n = self.clients.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut last = None;
        let mut msg = Some(msg);
        for k in 0..n {
            let i = (first + k) % n;
            let (addr, client) = &self.clients[i];
            let this = if k + 1 == n { msg.take() } else { msg.clone() };
            let Some(this) = this else { break };
            match call(client.clone(), this).await {
                Err(status) if fails_over(&status) => {
                    if n > 1 {
                        let next = self.clients[(i + 1) % n].0;
                        tracing::warn!(replica = %addr, next = %next, code = ?status.code(), message = %status.message(), "control plane replica did not answer; trying the next");
                        metrics::counter!("gateway_plane_failovers_total").increment(1);
                    }
                    last = Some(status);
                }
                answered => {
                    if i != first {
                        self.current.store(i, Ordering::Relaxed);
                        tracing::info!(replica = %addr, "control plane replica answers; calls go to it");
                    }
                    return answered;
                }
            }
        }
        Err(last.unwrap_or_else(|| tonic::Status::unavailable("no control plane replica")))
    }
}

fn client(plane: &Plane, addr: SocketAddr, timeout: Duration) -> Result<Client, String> {
    let name = ServerName::try_from(plane.name.clone()).map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&plane.tls));
    let connect = tower::service_fn(move |_uri: hyper::Uri| {
        let connector = connector.clone();
        let name = name.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let _ = tcp.set_nodelay(true);
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", plane.name))
        .map_err(|e| e.to_string())?
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .timeout(timeout)
        .connect_with_connector_lazy(connect);
    Ok(pb::control_plane_client::ControlPlaneClient::new(channel)
        .max_encoding_message_size(talos_certs::MAX_PAYLOAD_LEN + 64 * 1024))
}

/// Ship the spool's batches, oldest first, until `stop` fires: each is
/// deleted once the control plane answers `ACCEPTED` or `DUPLICATE`. A
/// refusal or an outage is retried with growing delays (never skipped:
/// the next batch would only be refused as a gap).
pub async fn ship(spool: Arc<Spool>, plane: Plane, stop: CancellationToken) {
    let replicas = match Replicas::new(&plane) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot make the control plane client; batches stay spooled");
            return;
        }
    };
    let mut delay = RETRY_FIRST;
    // Log an outage once, not at every retry.
    let mut failing = false;
    loop {
        let Some(entry) = spool.oldest() else {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = spool.arrived.notified() => continue,
            }
        };
        let path = entry.path.clone();
        let read = tokio::task::spawn_blocking(move || read_batch(&path)).await;
        let signed = match read {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot read a spooled batch");
                if wait(&stop, &mut delay).await {
                    return;
                }
                continue;
            }
            Err(_) => return,
        };
        let msg = pb::Signed {
            kind: signed.kind.as_str().to_owned(),
            key_id: signed.key_id,
            payload: signed.payload,
            signature: signed.signature,
        };
        let answer = tokio::select! {
            _ = stop.cancelled() => return,
            a = replicas.call(msg, |mut c, msg| async move { c.submit_batch(msg).await }) => a,
        };
        use pb::batch_ack::Status as S;
        match answer {
            Ok(ack) => {
                let ack = ack.into_inner();
                match S::try_from(ack.status) {
                    Ok(status @ (S::Accepted | S::Duplicate)) => {
                        let label = if status == S::Accepted {
                            Shipped::Accepted
                        } else {
                            Shipped::Duplicate
                        }
                        .as_str();
                        metrics::counter!("gateway_batches_shipped_total", "status" => label)
                            .increment(1);
                        if failing {
                            tracing::warn!(
                                seq = entry.seq,
                                "control plane acknowledges batches again"
                            );
                            failing = false;
                        }
                        tracing::debug!(seq = entry.seq, status = label, "batch acknowledged");
                        let spool = Arc::clone(&spool);
                        let seq = entry.seq;
                        match tokio::task::spawn_blocking(move || spool.remove(seq)).await {
                            Ok(Ok(())) => {
                                delay = RETRY_FIRST;
                                continue;
                            }
                            Ok(Err(e)) => {
                                // The batch stays: sent again after the
                                // delay, answered DUPLICATE, tried again.
                                tracing::error!(seq, error = %e, "cannot write chain.json for an acknowledged batch; it stays spooled and is retried");
                            }
                            Err(_) => return,
                        }
                    }
                    _ => {
                        let reason: String = ack.reason.chars().take(64).collect();
                        metrics::counter!("gateway_batches_rejected_total", "reason" => reason.clone())
                            .increment(1);
                        tracing::error!(seq = entry.seq, reason = %reason, "control plane refused a batch; it stays spooled and is retried");
                        failing = true;
                    }
                }
            }
            Err(status) => {
                metrics::counter!("gateway_batch_ship_errors_total").increment(1);
                if !failing {
                    tracing::warn!(seq = entry.seq, code = ?status.code(), message = %status.message(), "cannot reach the control plane; batches stay spooled and are retried");
                    failing = true;
                }
            }
        }
        if wait(&stop, &mut delay).await {
            return;
        }
    }
}

/// Sleep `delay` (then double it up to the cap); `true` if `stop` fired.
async fn wait(stop: &CancellationToken, delay: &mut Duration) -> bool {
    let d = *delay;
    *delay = (*delay * 2).min(RETRY_CAP);
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// Proposals being delivered at once.
const PROPOSE_IN_FLIGHT: usize = 16;

/// Deliver held requests' proposals to the relay (`ControlPlane.Propose`),
/// each on its own task so one slow delivery holds up no other, and tell
/// each held request what became of its proposal
/// ([`Delivery`]): taken, or refused for good (the relay makes no card;
/// the request is declined at once). An outage or an error that may pass
/// is retried with growing delays for as long as the request waits
/// (at most [`crate::session::approvals::DELIVERY_TIMEOUT`]); a proposal
/// whose request has stopped waiting is dropped, sent or not.
pub async fn propose(
    mut proposals: tokio::sync::mpsc::UnboundedReceiver<Proposed>,
    plane: Plane,
    stop: CancellationToken,
) {
    let replicas = match Replicas::new(&plane) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot make the control plane client; held requests will be declined");
            return;
        }
    };
    // At most this many deliveries in flight: each holds a gRPC call's
    // buffers, so thousands of requests held at once must not mean
    // thousands of calls at once. The rest wait in the channel as plain
    // proposals.
    let slots = Arc::new(tokio::sync::Semaphore::new(PROPOSE_IN_FLIGHT));
    loop {
        let Proposed {
            proposal: p,
            sentence,
            digest,
            mut delivered,
        } = tokio::select! {
            _ = stop.cancelled() => return,
            next = proposals.recv() => match next {
                Some(n) => n,
                None => return,
            },
        };
        let slot = tokio::select! {
            _ = stop.cancelled() => return,
            // The request stopped waiting while its proposal queued.
            () = delivered.closed() => continue,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let replicas = replicas.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let msg = talos_certs::proposal_msg(p, sentence, digest);
            let mut delay = RETRY_FIRST;
            loop {
                let answer = tokio::select! {
                    _ = stop.cancelled() => return,
                    () = delivered.closed() => return,
                    a = replicas.call(msg.clone(), |mut c, msg| async move { c.propose(msg).await }) => a,
                };
                match answer {
                    Ok(_) => {
                        tracing::debug!(proposal = %msg.proposal_id, "proposal delivered to the relay");
                        let _ = delivered.send(Delivery::Taken);
                        return;
                    }
                    Err(status)
                        if matches!(
                            status.code(),
                            tonic::Code::InvalidArgument
                                | tonic::Code::FailedPrecondition
                                | tonic::Code::AlreadyExists
                                | tonic::Code::PermissionDenied
                        ) =>
                    {
                        tracing::error!(proposal = %msg.proposal_id, code = ?status.code(), message = %status.message(), "the relay refused a proposal; its request is declined (relay_refused)");
                        let _ = delivered.send(Delivery::Refused);
                        return;
                    }
                    Err(status) => {
                        tracing::warn!(proposal = %msg.proposal_id, code = ?status.code(), "cannot reach the relay; retrying");
                    }
                }
                let retry = tokio::select! {
                    () = delivered.closed() => false,
                    stopped = wait(&stop, &mut delay) => !stopped,
                };
                if !retry {
                    return;
                }
            }
        });
    }
}
