//! The answerer: the sessions' DNS on UDP and TCP (`[dns] listen`), each
//! query settled as [`crate::dns::query`] says, for the session its source
//! address names.
//!
//! - **Whose query.** The source names the session, as for TLS: a session
//!   of this member's is answered here; one only a peer holds (the
//!   forwarding table) is passed to the holder over the member link, as a
//!   stream whose header says it carries DNS
//!   ([`crate::pair::proxy::Service::Dns`]), and the holder's answer is
//!   passed back; no holder reached, `SERVFAIL`. A query that came over
//!   the link is never passed on again. Any other source: `REFUSED`.
//! - **Bounded per session.** Each session has a share of queries per
//!   second (a token bucket, `[dns] queries_per_second`, burst twice
//!   that), of queries waiting for a resolution or a holder at once
//!   ([`MAX_PENDING_PER_SESSION`]), and of TCP connections at once (`[dns]
//!   max_tcp_per_session`). Past its share a UDP query is dropped (the
//!   client asks again) and a TCP one refused. Sources that are no
//!   session's share one small bucket ([`STRANGERS_PER_SECOND`]), so the
//!   answerer is no reflector. One session's flood spends its own tokens
//!   only: another session's queries are answered as before.
//! - **Counted and recorded.** Every query is counted in
//!   `gateway_dns_queries_total{outcome}`. Each session's counts go on
//!   the record ([`Tallies`]) every `[dns] record_interval_ms` and at its
//!   end: how many queries were answered and how many refused, by
//!   outcome, and of the refused names only how many distinct ones there
//!   were and how long the longest was, never a name: a refused name may
//!   be data on its way out, and the record must not carry it.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::dns::query::{self, Outcome, Resolved, Scope, Step};
use crate::gate::resolve::Resolution;
use crate::member_link::link::Link;
use crate::pair::forwarding::Entry;
use crate::pair::proxy::{Header, Service};
use crate::serving::{Context, InForce};
use crate::session::dns::DnsCounts;
use crate::session::sessions::Session;

/// Queries of one session waiting for a resolution or a holder at once;
/// past it a query is dropped (UDP) or refused (TCP).
pub const MAX_PENDING_PER_SESSION: u32 = 64;

/// Answers per second to sources that are no session's, all of them
/// together (the burst is twice this).
pub const STRANGERS_PER_SECOND: u32 = 100;

/// TCP connections from sources that are no session's, at once.
const MAX_STRANGER_TCP: u32 = 32;

/// How long a TCP connection may be silent between queries, and how long
/// one query's bytes may take to arrive.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// How long a query passed to a holder waits for its answer.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(3);

/// The largest UDP query read: a query is a few hundred bytes; anything
/// longer is cut here and answered `FORMERR`.
const UDP_BUFFER: usize = 4096;

/// How often the tallies are looked at (each goes on the record when its
/// interval is over, or its session has ended).
const TALLY_TICK: Duration = Duration::from_secs(1);

/// A session's quota is forgotten when it has not been used for this long.
const QUOTA_IDLE: Duration = Duration::from_secs(120);

/// What `[dns]` sets.
#[derive(Debug, Clone)]
pub struct Settings {
    pub ttl: u32,
    pub approvals: Vec<IpAddr>,
    pub queries_per_second: u32,
    pub max_tcp_per_session: u32,
    pub record_interval: Duration,
}

impl Settings {
    pub fn from_config(d: &crate::config::Dns) -> Settings {
        Settings {
            ttl: *d.ttl_s.get_ref(),
            approvals: d.approvals(),
            queries_per_second: *d.queries_per_second.get_ref(),
            max_tcp_per_session: *d.max_tcp_per_session.get_ref(),
            record_interval: Duration::from_millis(*d.record_interval_ms.get_ref()),
        }
    }
}

/// A session's key: its id and attempt.
type Key = (Arc<str>, u32);

/// A token bucket: `rate` a second, at most `burst` saved.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            at: now,
        }
    }

    fn take(&mut self, rate: f64, burst: f64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One session's share, counted.
#[derive(Debug)]
struct Quota {
    bucket: Bucket,
    tcp: u32,
    pending: u32,
    seen: Instant,
}

/// Whose query it is.
enum Who {
    Session(Arc<Session>),
    Elsewhere(Arc<Entry>, Arc<Link>),
    Unknown,
}

impl Who {
    fn key(&self) -> Option<Key> {
        match self {
            Who::Session(s) => Some((Arc::clone(&s.id), s.attempt)),
            Who::Elsewhere(e, _) => Some((Arc::clone(&e.session_id), e.attempt)),
            Who::Unknown => None,
        }
    }
}

/// How a query came: on the answerer's own sockets, or over the link
/// from a peer (never passed on again).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Direct,
    Link,
}

/// How a transport sends a refusal past the share.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

/// A boxed answer to come.
type Later = Pin<Box<dyn Future<Output = Option<Vec<u8>>> + Send>>;

/// What to do with a query.
enum Handled {
    Reply(Vec<u8>),
    Later(Later),
    Nothing,
}

/// The answerer.
#[derive(Debug)]
pub struct Answerer {
    settings: Settings,
    current: Arc<InForce>,
    quotas: Mutex<HashMap<Key, Quota>>,
    strangers: Mutex<Bucket>,
    stranger_tcp: std::sync::atomic::AtomicU32,
    tallies: Tallies,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Answerer {
    pub fn new(settings: Settings, current: Arc<InForce>) -> Arc<Answerer> {
        Arc::new(Answerer {
            strangers: Mutex::new(Bucket::full(
                f64::from(2 * STRANGERS_PER_SECOND),
                Instant::now(),
            )),
            stranger_tcp: Default::default(),
            tallies: Tallies::new(settings.record_interval),
            settings,
            current,
            quotas: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
        })
    }

    /// Answer on `udp` and `tcp` until [`Answerer::stop`], and put the
    /// tallies on the record as they fall due.
    pub fn start(self: &Arc<Self>, udp: Arc<UdpSocket>, tcp: Arc<TcpListener>) {
        self.tasks.spawn(Arc::clone(self).serve_udp(udp));
        self.tasks.spawn(Arc::clone(self).serve_tcp(tcp));
        self.tasks.spawn(Arc::clone(self).record_tallies());
    }

    /// Stop answering (the sockets stay open for a successor, which
    /// answers what waits in them); wait until `until` for the queries in
    /// flight, then put every tally on the record.
    pub async fn stop(&self, until: Instant) {
        self.stop.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout_at(until, self.tasks.wait()).await;
        let cx = self.current.get();
        self.tallies.record_due(&cx, true).await;
    }

    /// Whose is a query from `ip`.
    fn who(cx: &Context, ip: IpAddr, via: Via) -> Who {
        if let Some(s) = cx.sessions.by_source(ip) {
            if s.usable() {
                return Who::Session(s);
            }
        }
        if via == Via::Direct {
            if let Some(link) = &cx.link {
                if let Some(entry) = link.forwarding.lookup(ip, std::time::Instant::now()) {
                    return Who::Elsewhere(entry, Arc::clone(link));
                }
            }
        }
        Who::Unknown
    }

    /// A token of `key`'s share (or of the strangers'), and, for a query
    /// that will wait, a place among its pending ones.
    fn admit(&self, key: Option<&Key>, now: Instant) -> bool {
        let rate = f64::from(self.settings.queries_per_second);
        match key {
            None => {
                let rate = f64::from(STRANGERS_PER_SECOND);
                self.strangers
                    .lock()
                    .expect("strangers")
                    .take(rate, 2.0 * rate, now)
            }
            Some(key) => {
                let mut quotas = self.quotas.lock().expect("quotas");
                let q = self.quota(&mut quotas, key, now);
                q.bucket.take(rate, 2.0 * rate, now)
            }
        }
    }

    /// `key`'s share, made full if it has none, marked seen at `now`.
    fn quota<'q>(
        &self,
        quotas: &'q mut HashMap<Key, Quota>,
        key: &Key,
        now: Instant,
    ) -> &'q mut Quota {
        let burst = 2.0 * f64::from(self.settings.queries_per_second);
        let q = quotas.entry(key.clone()).or_insert_with(|| Quota {
            bucket: Bucket::full(burst, now),
            tcp: 0,
            pending: 0,
            seen: now,
        });
        q.seen = now;
        q
    }

    /// A place among `key`'s pending queries, given back when dropped.
    fn pend(self: &Arc<Self>, key: &Key) -> Option<Pendings> {
        let mut quotas = self.quotas.lock().expect("quotas");
        let q = quotas.get_mut(key)?;
        if q.pending >= MAX_PENDING_PER_SESSION {
            return None;
        }
        q.pending += 1;
        Some(Pendings {
            answerer: Arc::clone(self),
            key: key.clone(),
            tcp: false,
        })
    }

    /// A place among `key`'s TCP connections, given back when dropped.
    fn connect_tcp(self: &Arc<Self>, key: &Key) -> Option<Pendings> {
        let mut quotas = self.quotas.lock().expect("quotas");
        let q = self.quota(&mut quotas, key, Instant::now());
        if q.tcp >= self.settings.max_tcp_per_session {
            return None;
        }
        q.tcp += 1;
        Some(Pendings {
            answerer: Arc::clone(self),
            key: key.clone(),
            tcp: true,
        })
    }

    /// Settle one query from `source`.
    fn handle(
        self: &Arc<Self>,
        bytes: &[u8],
        source: SocketAddr,
        local: SocketAddr,
        via: Via,
        transport: Transport,
    ) -> Handled {
        let cx = self.current.get();
        let who = Self::who(&cx, source.ip(), via);
        let key = who.key();
        let now = Instant::now();
        if !self.admit(key.as_ref(), now) {
            return self.limited(&who, source.ip(), bytes, transport);
        }
        let (ttl, approvals) = (self.settings.ttl, &self.settings.approvals[..]);
        match who {
            Who::Unknown => match query::step(bytes, Scope::Unknown, approvals, ttl) {
                Step::Reply(out, outcome) => {
                    count(outcome);
                    Handled::Reply(out)
                }
                _ => {
                    count(Outcome::Malformed);
                    Handled::Nothing
                }
            },
            Who::Session(session) => {
                let listed = |n: &crate::gate::name::Name| session.allows(n);
                match query::step(bytes, Scope::Session(&listed), approvals, ttl) {
                    Step::Reply(out, outcome) => {
                        let refused = (outcome == Outcome::Unlisted)
                            .then(|| query::question_name(bytes))
                            .flatten();
                        self.tallies
                            .count(&session, source.ip(), outcome, refused.as_deref());
                        count(outcome);
                        Handled::Reply(out)
                    }
                    Step::Drop => {
                        self.tallies
                            .count(&session, source.ip(), Outcome::Malformed, None);
                        count(Outcome::Malformed);
                        Handled::Nothing
                    }
                    Step::Resolve(pending) => {
                        let key = key.expect("a session's key");
                        let Some(place) = self.pend(&key) else {
                            return self.limited(
                                &Who::Session(session),
                                source.ip(),
                                bytes,
                                transport,
                            );
                        };
                        let answerer = Arc::clone(self);
                        Handled::Later(Box::pin(async move {
                            let resolution = cx.resolver.resolve(&pending.name).await;
                            let resolved = match &resolution {
                                Resolution::Public(addrs) => Resolved::Addresses(addrs),
                                Resolution::Internal { .. } => Resolved::Internal,
                                Resolution::Failed(_) => Resolved::Failed,
                            };
                            let (out, outcome) = pending.answer(resolved, ttl);
                            answerer.tallies.count(&session, source.ip(), outcome, None);
                            count(outcome);
                            drop(place);
                            Some(out)
                        }))
                    }
                }
            }
            Who::Elsewhere(entry, link) => {
                let key = key.expect("a session's key");
                let Some(place) = self.pend(&key) else {
                    return self.limited(
                        &Who::Elsewhere(entry, link),
                        source.ip(),
                        bytes,
                        transport,
                    );
                };
                let query = bytes.to_vec();
                let answerer = Arc::clone(self);
                Handled::Later(Box::pin(async move {
                    let answered = forward(&link, &entry, source, local, &query).await;
                    drop(place);
                    match answered {
                        Some(out) => {
                            count(Outcome::Forwarded);
                            Some(out)
                        }
                        None => match query::step(&query, Scope::Elsewhere, &[], 0) {
                            Step::Reply(out, outcome) => {
                                answerer
                                    .tallies
                                    .count_elsewhere(&entry, source.ip(), outcome);
                                count(outcome);
                                Some(out)
                            }
                            _ => {
                                count(Outcome::Malformed);
                                None
                            }
                        },
                    }
                }))
            }
        }
    }

    /// A query past its share: counted; dropped on UDP, `REFUSED` on TCP.
    fn limited(&self, who: &Who, source: IpAddr, bytes: &[u8], transport: Transport) -> Handled {
        count(Outcome::Limited);
        match who {
            Who::Session(s) => self.tallies.count(s, source, Outcome::Limited, None),
            Who::Elsewhere(e, _) => self.tallies.count_elsewhere(e, source, Outcome::Limited),
            Who::Unknown => {}
        }
        if transport == Transport::Udp {
            return Handled::Nothing;
        }
        match query::step(bytes, Scope::Unknown, &[], 0) {
            Step::Reply(out, _) => Handled::Reply(out),
            _ => Handled::Nothing,
        }
    }

    async fn serve_udp(self: Arc<Self>, socket: Arc<UdpSocket>) {
        let local = socket
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 53)));
        let mut buf = vec![0u8; UDP_BUFFER];
        loop {
            let (n, source) = tokio::select! {
                () = self.stop.cancelled() => return,
                r = socket.recv_from(&mut buf) => match r {
                    Ok(r) => r,
                    // An ICMP error from an earlier answer, and the like.
                    Err(e) => {
                        tracing::debug!(error = %e, "dns: receive failed");
                        continue;
                    }
                },
            };
            match self.handle(&buf[..n], source, local, Via::Direct, Transport::Udp) {
                Handled::Reply(out) => {
                    let _ = socket.send_to(&out, source).await;
                }
                Handled::Later(later) => {
                    let socket = Arc::clone(&socket);
                    self.tasks.spawn(async move {
                        if let Some(out) = later.await {
                            let _ = socket.send_to(&out, source).await;
                        }
                    });
                }
                Handled::Nothing => {}
            }
        }
    }

    async fn serve_tcp(self: Arc<Self>, listener: Arc<TcpListener>) {
        loop {
            let (stream, source) = tokio::select! {
                () = self.stop.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "dns: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let local = stream
                .local_addr()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 53)));
            let cx = self.current.get();
            let place = match Self::who(&cx, source.ip(), Via::Direct).key() {
                Some(key) => match self.connect_tcp(&key) {
                    Some(p) => Some(p),
                    None => {
                        count(Outcome::Limited);
                        continue;
                    }
                },
                None => {
                    use std::sync::atomic::Ordering;
                    if self.stranger_tcp.fetch_add(1, Ordering::Relaxed) >= MAX_STRANGER_TCP {
                        self.stranger_tcp.fetch_sub(1, Ordering::Relaxed);
                        count(Outcome::Limited);
                        continue;
                    }
                    None
                }
            };
            let answerer = Arc::clone(&self);
            self.tasks.spawn(async move {
                let _ = stream.set_nodelay(true);
                answerer
                    .serve_stream(stream, source, local, Via::Direct)
                    .await;
                if place.is_none() {
                    answerer
                        .stranger_tcp
                        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                }
                drop(place);
            });
        }
    }

    /// Answer the queries of one stream (a TCP connection, or a link
    /// stream a peer passed a session's queries on), in order, each framed
    /// by its two-byte length, until it ends, is silent for [`TCP_IDLE`],
    /// sends what is no query, or the answerer stops between two queries.
    ///
    /// The stop never cuts a stream before its first answer: a connection
    /// accepted here carries a query sent to this process (the drain's
    /// grace bounds the wait, with [`TCP_IDLE`]). After that, a stream
    /// waiting for its next query is closed at the stop (RFC 7766 §6.2.4:
    /// the client asks again on a new connection, which a successor
    /// accepts after an upgrade).
    async fn serve_stream<S: AsyncRead + AsyncWrite + Unpin>(
        self: &Arc<Self>,
        mut stream: S,
        source: SocketAddr,
        local: SocketAddr,
        via: Via,
    ) {
        let mut buf = Vec::new();
        let mut answered = false;
        loop {
            let next = tokio::time::timeout(TCP_IDLE, read_frame(&mut stream, &mut buf));
            let read = if answered {
                tokio::select! {
                    biased;
                    r = next => r,
                    () = self.stop.cancelled() => return,
                }
            } else {
                next.await
            };
            if !matches!(read, Ok(Ok(true))) {
                return;
            }
            let out = match self.handle(&buf, source, local, via, Transport::Tcp) {
                Handled::Reply(out) => out,
                Handled::Later(later) => match later.await {
                    Some(out) => out,
                    None => return,
                },
                Handled::Nothing => return,
            };
            if write_frame(&mut stream, &out).await.is_err() {
                return;
            }
            answered = true;
        }
    }

    /// A peer's link stream of a session's queries ([`Service::Dns`]):
    /// answered here as the session's own, never passed on again.
    pub async fn serve_forwarded(
        self: &Arc<Self>,
        stream: crate::member_link::link::Accepted,
        header: &Header,
    ) {
        self.serve_stream(stream, header.source, header.destination, Via::Link)
            .await;
    }

    /// Each tally due goes on the record, once a [`TALLY_TICK`]; quotas
    /// unused for [`QUOTA_IDLE`] are forgotten.
    async fn record_tallies(self: Arc<Self>) {
        let mut tick = tokio::time::interval(TALLY_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let cx = self.current.get();
            self.tallies.record_due(&cx, false).await;
            let now = Instant::now();
            self.quotas.lock().expect("quotas").retain(|_, q| {
                q.tcp > 0 || q.pending > 0 || now.saturating_duration_since(q.seen) < QUOTA_IDLE
            });
        }
    }
}

/// A place among a session's pending queries or TCP connections.
struct Pendings {
    answerer: Arc<Answerer>,
    key: Key,
    tcp: bool,
}

impl Drop for Pendings {
    fn drop(&mut self) {
        if let Ok(mut quotas) = self.answerer.quotas.lock() {
            if let Some(q) = quotas.get_mut(&self.key) {
                if self.tcp {
                    q.tcp = q.tcp.saturating_sub(1);
                } else {
                    q.pending = q.pending.saturating_sub(1);
                }
            }
        }
    }
}

/// Count a query in `gateway_dns_queries_total`.
fn count(outcome: Outcome) {
    metrics::counter!("gateway_dns_queries_total", "outcome" => outcome.as_str()).increment(1);
}

/// Read one frame (a two-byte length, then that many bytes) into `buf`;
/// `false` at a clean end before it.
async fn read_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> std::io::Result<bool> {
    let mut len = [0u8; 2];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    buf.clear();
    buf.resize(usize::from(u16::from_be_bytes(len)), 0);
    stream.read_exact(buf).await?;
    Ok(true)
}

async fn write_frame<S: AsyncWrite + Unpin>(stream: &mut S, msg: &[u8]) -> std::io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| std::io::Error::other("answer too long"))?;
    let mut framed = Vec::with_capacity(2 + msg.len());
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    stream.write_all(&framed).await?;
    stream.flush().await
}

/// Pass `query` from `source` to a holder of `entry`'s session over the
/// link, and bring its answer back; `None` when no holder answered.
async fn forward(
    link: &Link,
    entry: &Entry,
    source: SocketAddr,
    local: SocketAddr,
    query: &[u8],
) -> Option<Vec<u8>> {
    let destination = if local.is_ipv4() == source.is_ipv4() {
        local
    } else if source.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 53))
    } else {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 53))
    };
    let header = Header {
        source,
        destination,
        session: Some((entry.session_id.to_string(), entry.attempt)),
        service: Service::Dns,
    };
    for holder in &entry.holders {
        let asked = tokio::time::timeout(FORWARD_TIMEOUT, async {
            let mut stream = link.connect(holder, &header).await?;
            write_frame(&mut stream, query).await?;
            let mut answer = Vec::new();
            if read_frame(&mut stream, &mut answer).await? {
                Ok(answer)
            } else {
                Err(std::io::Error::other("the holder closed without an answer"))
            }
        })
        .await;
        match asked {
            Ok(Ok(answer)) => return Some(answer),
            Ok(Err(e)) => {
                tracing::debug!(holder = %holder, session = %entry.session_id, error = %e, "dns: holder did not answer");
            }
            Err(_) => {
                tracing::debug!(holder = %holder, session = %entry.session_id, "dns: holder did not answer in time");
            }
        }
    }
    None
}

/// Every session counted, each put on the record when its interval is
/// over or its session has ended here.
#[derive(Debug)]
pub struct Tallies {
    interval: Duration,
    hasher: RandomState,
    /// Each session's counts; `local`: a session of this member's (its
    /// counts are its own [`Session::dns`]).
    by_session: Mutex<HashMap<Key, (Arc<DnsCounts>, bool)>>,
}

impl Tallies {
    fn new(interval: Duration) -> Tallies {
        Tallies {
            interval,
            hasher: RandomState::new(),
            by_session: Mutex::new(HashMap::new()),
        }
    }

    fn count(&self, session: &Session, source: IpAddr, outcome: Outcome, refused: Option<&str>) {
        let key = (Arc::clone(&session.id), session.attempt);
        let cell = Arc::clone(
            &self
                .by_session
                .lock()
                .expect("tallies")
                .entry(key)
                .or_insert_with(|| (Arc::clone(&session.dns), true))
                .0,
        );
        self.add(&cell, &session.tenant, source, outcome, refused);
    }

    fn count_elsewhere(&self, entry: &Entry, source: IpAddr, outcome: Outcome) {
        let key = (Arc::clone(&entry.session_id), entry.attempt);
        let cell = Arc::clone(
            &self
                .by_session
                .lock()
                .expect("tallies")
                .entry(key)
                .or_insert_with(|| (Arc::default(), false))
                .0,
        );
        self.add(&cell, &entry.tenant, source, outcome, None);
    }

    fn add(
        &self,
        cell: &DnsCounts,
        tenant: &Arc<str>,
        source: IpAddr,
        outcome: Outcome,
        refused: Option<&str>,
    ) {
        let refused = refused.map(|name| (self.hasher.hash_one(name), name.len()));
        cell.add(tenant, source, outcome, refused);
    }

    /// Put on the record each session's counts whose interval is over,
    /// and those of sessions that ended here (every one, with `all`).
    async fn record_due(&self, cx: &Context, all: bool) {
        let now = Instant::now();
        let due: Vec<(Key, Arc<DnsCounts>)> = {
            let mut tallies = self.by_session.lock().expect("tallies");
            let mut due = Vec::new();
            tallies.retain(|(id, attempt), (cell, local)| {
                let gone = *local
                    && !cx
                        .sessions
                        .find(id)
                        .is_some_and(|s| s.attempt == *attempt && s.usable());
                if all || gone || cell.due(self.interval, now) {
                    due.push(((Arc::clone(id), *attempt), Arc::clone(cell)));
                }
                // A peer's session's counts are forgotten once recorded;
                // this member's, once the session is gone.
                !(gone || all || (!*local && cell.due(self.interval, now)))
            });
            due
        };
        for ((id, attempt), cell) in due {
            if let Some(json) =
                cell.take_record(&cx.gateway_id, cx.records.instance(), &id, attempt)
            {
                cx.records.note(json).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::full(4.0, t0);
        for _ in 0..4 {
            assert!(b.take(2.0, 4.0, t0));
        }
        assert!(!b.take(2.0, 4.0, t0), "the burst is spent");
        let later = t0 + Duration::from_millis(500);
        assert!(b.take(2.0, 4.0, later), "half a second gives one at 2/s");
        assert!(!b.take(2.0, 4.0, later));
        // Never more than the burst, however long unused.
        let much_later = t0 + Duration::from_secs(3600);
        for _ in 0..4 {
            assert!(b.take(2.0, 4.0, much_later));
        }
        assert!(!b.take(2.0, 4.0, much_later));
    }

    #[test]
    fn answered_is_the_first_outcome() {
        // tally_record reads counts[0] as the answered ones.
        assert_eq!(Outcome::ALL[0], Outcome::Answered);
    }
}
