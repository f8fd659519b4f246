//! The data plane: the data listener, the connection cap, the settings
//! new connections get ([`InForce`]), and the connections open. It
//! accepts until a shutdown signal or a handover; at the drain it closes
//! its listener, gives the open connections the grace and cuts the rest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::task::TaskTracker;

use crate::conn;
use crate::reload::Cap;
use crate::serving::{InForce, Shutdown};

/// How accepting ended.
#[derive(Debug)]
pub enum End {
    /// A shutdown signal: drain and end every authority.
    Shutdown,
    /// A successor took over: drain what this process accepted.
    HandedOver,
}

/// The data plane.
#[derive(Debug)]
pub(super) struct DataPlane {
    pub(super) listener: Arc<TcpListener>,
    /// The member link's listener (`[pair]`): connections peers forward,
    /// under the same cap, spool rule and drain as the data listener's.
    pub(super) link: Option<Arc<TcpListener>>,
    /// The connection cap.
    pub(super) cap: Arc<Cap>,
    /// The drain grace, in milliseconds (a reload changes it).
    pub(super) grace_ms: Arc<AtomicU64>,
    /// The settings new connections get.
    pub(super) current: Arc<InForce>,
    /// Open connections.
    tracker: TaskTracker,
    /// Tells open connections that the drain began, then that its grace
    /// is over.
    shutdown: Shutdown,
    /// `true` while the spool is full: accept nothing.
    spool_full: watch::Receiver<bool>,
    /// A handover asks here to stop accepting.
    stop_accepting: mpsc::Receiver<oneshot::Sender<()>>,
    /// Stops asking the peers what they hold (at the drain's end).
    stop_asking: tokio_util::sync::CancellationToken,
    /// The sessions' DNS answerer (`[dns]`): it answers the queries peers
    /// pass over the member link.
    dns: Option<Arc<crate::dns_answerer::Answerer>>,
}

impl DataPlane {
    pub(super) fn new(
        listener: Arc<TcpListener>,
        cap: Arc<Cap>,
        grace_ms: Arc<AtomicU64>,
        current: Arc<InForce>,
        shutdown: Shutdown,
        spool_full: watch::Receiver<bool>,
        stop_accepting: mpsc::Receiver<oneshot::Sender<()>>,
    ) -> DataPlane {
        conn::session_socket_options(&listener, current.get().tcp_keepalive);
        DataPlane {
            listener,
            link: None,
            cap,
            grace_ms,
            current,
            tracker: TaskTracker::new(),
            shutdown,
            spool_full,
            stop_accepting,
            stop_asking: Default::default(),
            dns: None,
        }
    }

    /// Accept the member link's connections too, on `link`.
    pub(super) fn with_link(mut self, link: Option<Arc<TcpListener>>) -> DataPlane {
        self.link = link;
        self
    }

    /// Answer the DNS queries peers pass over the link with `dns`.
    pub(super) fn with_dns(mut self, dns: Option<Arc<crate::dns_answerer::Answerer>>) -> DataPlane {
        self.dns = dns;
        self
    }

    /// The drain grace now.
    pub(super) fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms.load(Ordering::Relaxed))
    }

    /// How many connections are open.
    pub(super) fn open(&self) -> usize {
        self.tracker.len()
    }

    /// Learn who holds the sessions this member forwards, before anything
    /// is served: the DNS sockets, the data listener and the member link
    /// all judge a session only a peer holds by the forwarding table. A
    /// successor given the table with the authorities (`taken_over`) has
    /// it already; any other start asks every peer once (a peer that does
    /// not answer within [`ASK_BEFORE_ACCEPTING`] is asked again soon:
    /// queries and connections wait in the sockets meanwhile). Then every
    /// peer is asked every `[pair] holdings_interval_ms` until the drain.
    pub(super) async fn learn_holders(&self, taken_over: bool) {
        if let Some(link) = self.current.get().link.clone() {
            let sessions = Arc::clone(&self.current.get().sessions);
            if taken_over {
                link.publish(&sessions);
            } else {
                link.ask_once(ASK_BEFORE_ACCEPTING, &sessions).await;
            }
            tokio::spawn(link.ask_peers(sessions, self.stop_asking.clone()));
        }
    }

    /// Accept connections until `signal` resolves or a handover stops
    /// accepting, each on its own task, at most the cap at once.
    pub(super) async fn accept_until(
        &mut self,
        signal: impl std::future::Future<Output = ()>,
    ) -> End {
        tokio::pin!(signal);
        let mut spool_full = self.spool_full.clone();
        loop {
            // A full spool fails closed: accept nothing until it has room.
            if *spool_full.borrow() {
                tokio::select! {
                    _ = &mut signal => return End::Shutdown,
                    ack = self.stop_accepting.recv() => return stopped(ack),
                    room = spool_has_room(&mut spool_full) => if !room { return End::Shutdown },
                }
            }
            // Wait for room first: past the cap the kernel backlog holds clients.
            let permit = tokio::select! {
                _ = &mut signal => return End::Shutdown,
                ack = self.stop_accepting.recv() => return stopped(ack),
                p = Arc::clone(self.cap.permits()).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return End::Shutdown,
                },
            };
            let (stream, peer, linked) = tokio::select! {
                _ = &mut signal => return End::Shutdown,
                ack = self.stop_accepting.recv() => return stopped(ack),
                // The spool filled while waiting: back to the top, to wait there.
                () = spool_fills(&mut spool_full) => continue,
                // The socket inherits its options from the listener
                // (`conn::session_socket_options`).
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => (a.0, a.1, false),
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                accepted = accept_link(self.link.as_deref()) => match accepted {
                    Ok(a) => (a.0, a.1, true),
                    Err(e) => {
                        tracing::warn!(error = %e, "member link accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let cx = self.current.get();
            if !linked {
                // A session connection's task holds its connection alone:
                // the member link's handshake and streams (below) are
                // large, and in the same task they would size every
                // session connection's (8.3 KiB a task where the
                // connection needs 3: `benches/idle`).
                self.tracker.spawn(async move {
                    conn::serve(&cx, stream, peer).await;
                    drop(permit);
                });
                continue;
            }
            // What the link's streams are served under.
            let streams = Streams {
                tracker: self.tracker.clone(),
                permits: Arc::clone(self.cap.permits()),
                shutdown: self.shutdown.clone(),
                dns: self.dns.clone(),
            };
            self.tracker.spawn(async move {
                // The link's own checks (its peer) first; a refusal
                // there is logged and counted by the link.
                if let Some(link) = cx.link.clone() {
                    if let Some(linked) = link.accept(stream, peer, &cx.sessions).await {
                        drop(permit);
                        serve_link(cx, link, linked, streams).await;
                        return;
                    }
                }
                drop(permit);
            });
        }
    }

    /// Tell every open connection that the drain began: each finishes
    /// what it has in flight and closes (HTTP/1.1: an idle keep-alive
    /// connection at once, the request in flight answered `Connection:
    /// close`; HTTP/2: GOAWAY, its open streams answered). After a
    /// handover the successor accepts what their clients open next.
    pub(super) fn begin_drain(&self) {
        self.shutdown.drain.cancel();
    }

    /// Close the data listener (new connections are refused; after a
    /// handover the successor accepts them), give open connections until
    /// `cut_at` to finish, then cut the rest (their records say so) and
    /// wait for them (a request cut before its answer, or in its reply's
    /// body, is `cut` in its record). Returns the settings in force, for what ends after.
    pub(super) async fn stop(self, cut_at: tokio::time::Instant) -> Arc<InForce> {
        drop(self.listener);
        drop(self.link);
        self.stop_asking.cancel();
        self.tracker.close();
        if tokio::time::timeout_at(cut_at, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.tracker.len(),
                "grace over; cutting open connections"
            );
            self.shutdown.cut.cancel();
            self.tracker.wait().await;
        }
        self.shutdown.cut.cancel();
        self.current
    }
}

/// The data listener, as a reload changes it: the options the sockets it
/// accepts from then on inherit (`limits.tcp_keepalive_ms`).
#[derive(Debug)]
pub(super) struct DataListener(pub(super) Arc<TcpListener>);

impl crate::reload::Tunable for DataListener {
    fn apply(&self, tuned: &crate::reload::Tuned) {
        conn::session_socket_options(&self.0, tuned.tcp_keepalive);
    }
}

/// What a link connection's streams are served under: the data plane's
/// tracker (the drain waits for them), its cap (each stream holds a place,
/// as a direct connection does), its drain.
struct Streams {
    tracker: TaskTracker,
    permits: Arc<tokio::sync::Semaphore>,
    shutdown: Shutdown,
    dns: Option<Arc<crate::dns_answerer::Answerer>>,
}

/// Serve a peer's link connection: each of its streams is one forwarded
/// session connection, served on a task of its own under the cap, until
/// the peer closes it; at the drain no new stream is taken (GOAWAY) and
/// the open ones get the grace, as direct connections do.
async fn serve_link(
    cx: Arc<crate::serving::Context>,
    link: Arc<crate::member_link::link::Link>,
    linked: crate::member_link::link::Linked,
    streams: Streams,
) {
    let crate::member_link::link::Linked {
        peer,
        mut conn,
        slots,
    } = linked;
    let mut draining = false;
    loop {
        let next = tokio::select! {
            next = conn.accept() => next,
            () = streams.shutdown.drain.cancelled(), if !draining => {
                draining = true;
                conn.graceful_shutdown();
                continue;
            }
            () = streams.shutdown.cut.cancelled() => return,
        };
        let (request, respond) = match next {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                tracing::debug!(peer = %peer, error = %e, "member link connection ended with an error");
                return;
            }
            None => return,
        };
        // Every stream the connection carries holds a place among its
        // streams for as long as it lives, so that its window never binds
        // (`member_link::stream`): past the bound the stream is refused
        // unprocessed, and the forwarder opens it on another connection.
        let Some(slot) = slots.take() else {
            let why = crate::member_link::link::Refused::Link(
                crate::member_link::link::LinkRefusal::StreamsAtBound,
            );
            crate::member_link::link::refuse_stream(&peer, &why);
            let mut respond = respond;
            respond.send_reset(h2::Reason::REFUSED_STREAM);
            continue;
        };
        // The place under the cap is waited for on the stream's own task:
        // this loop drives the connection, whose other streams must go on.
        let permits = Arc::clone(&streams.permits);
        let (cx, link, peer) = (Arc::clone(&cx), Arc::clone(&link), Arc::clone(&peer));
        let dns = streams.dns.clone();
        streams.tracker.spawn(async move {
            let Ok(permit) = permits.acquire_owned().await else {
                return;
            };
            if let Some(arrival) = link.open_stream(peer, request, respond, slot).await {
                // A connection's header is checked against the authority
                // held for its source where it is judged (`conn`); a DNS
                // stream's here, before the answerer judges its queries.
                if arrival.header.service == crate::pair::proxy::Service::Dns
                    && !dns_for_held_authority(&cx, &arrival)
                {
                    return;
                }
                match (arrival.header.service, dns) {
                    (crate::pair::proxy::Service::Tls, _) => {
                        conn::serve_forwarded(&cx, arrival).await;
                    }
                    (crate::pair::proxy::Service::Dns, Some(dns)) => {
                        let header = arrival.header;
                        dns.serve_forwarded(arrival.stream, &header).await;
                    }
                    // No answerer here: the peer's query goes unanswered
                    // (it answers SERVFAIL), never taken for a hello.
                    (crate::pair::proxy::Service::Dns, None) => {
                        tracing::debug!(peer = %arrival.peer, "dns query over the link, and no [dns] here");
                    }
                }
            }
            drop(permit);
        });
    }
}

/// Whether a peer's DNS stream names the authority this member holds for
/// its source (the same session and attempt), if it holds one and the
/// header names one; a mismatch is logged and counted
/// (`link_session_mismatch`, `link_attempt_mismatch`) and its queries go
/// unanswered.
fn dns_for_held_authority(
    cx: &crate::serving::Context,
    arrival: &crate::member_link::link::Arrival,
) -> bool {
    use crate::member_link::link::LinkRefusal;
    let (Some((id, attempt)), Some(held)) = (
        &arrival.header.session,
        cx.sessions.by_source(arrival.header.source.ip()),
    ) else {
        return true;
    };
    let why = if **id != *held.id {
        LinkRefusal::SessionMismatch
    } else if *attempt != held.attempt {
        LinkRefusal::AttemptMismatch
    } else {
        return true;
    };
    crate::member_link::link::mismatch(
        why,
        &arrival.peer,
        (id, *attempt),
        (&held.id, held.attempt),
    );
    false
}

/// The longest a start waits for its peers to say what they hold before
/// it serves (queries and connections wait in the sockets meanwhile).
const ASK_BEFORE_ACCEPTING: Duration = Duration::from_secs(1);

/// The next connection on the member link's listener; never, without one.
async fn accept_link(
    link: Option<&TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    match link {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Resolves when the spool has room (`false`: it is gone).
async fn spool_has_room(full: &mut watch::Receiver<bool>) -> bool {
    full.wait_for(|full| !*full).await.is_ok()
}

/// Resolves when the spool becomes full.
async fn spool_fills(full: &mut watch::Receiver<bool>) {
    if full.wait_for(|full| *full).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A handover asked the accept loop to stop: say it has.
fn stopped(ack: Option<oneshot::Sender<()>>) -> End {
    match ack {
        Some(ack) => {
            let _ = ack.send(());
            End::HandedOver
        }
        None => End::Shutdown,
    }
}
