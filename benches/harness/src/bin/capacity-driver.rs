//! The control plane's side of `benches/capacity/run.sh`: opens, renews and
//! closes sessions on one gateway member over the real control channel
//! (gRPC over mutual TLS, `talos_e2e::control`), takes the member's signed
//! batches (a `ControlPlane` service that acknowledges each, as
//! `talos_e2e::relay` does in the end-to-end tests), and makes the
//! sessions' first connections through the member's data listener, each
//! from the session's own source address and checked against the CA the
//! member returned for that session.
//!
//! The shell starts this and the gateway and reads their figures from
//! `/proc`; this does what it is told, one command per line on standard
//! input, and answers each with one JSON line on standard output (the
//! first line, before any command, says where its `ControlPlane` service
//! listens: the gateway's `[control] plane`).
//!
//! ```text
//! connect CONTROL DATA  the member's control and data listeners; Describe;
//!                       renewals start (every renew_ms, one RenewLeases
//!                       call listing every open session, as a control plane does)
//! warm                  one session opened, one request to each name, closed:
//!                       one-time costs (the control connection, the resolver's
//!                       cache, the spool's first batch) before any reading
//! open N CONC           N more sessions, CONC OpenSession calls in flight
//! touch N CONC          N of the open sessions (spread evenly over them, all if
//!                       N >= open): one TLS connection and one HTTP/1.1 request
//!                       (Connection: close) to each name, CONC connections at once
//! renew                 one RenewLeases call listing every open session, timed
//! status                renewals so far, batches taken
//! close CONC            CloseSession (reason end) for every open session
//! quit
//! ```
//!
//! Session k (0, 1, 2, ...) is `sbx-` and k in 12 hex digits (the control
//! stub's id shape), attempt 1, tenant `bench`, the names given, source
//! 127.0.0.1 for k = 0 (what h2load, which cannot choose its source, comes
//! from) and 127.0.X.Y for k >= 1 (X from 1, Y 1-250): every session its own
//! source address, as sessions are told apart by source.
//!
//! Bounded: every command at most [`COMMAND_LIMIT`], every call 30 s (the
//! client's timeout), every data connection [`REQUEST_LIMIT`], and the
//! whole process `limit_s` (default 3600).
//!
//! Usage: capacity-driver dir=DIR names=A,B,C [renew_ms=10000] [attach=0] [limit_s=3600]
//! (`attach=N`: N credentials attached to each session, over its names).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use talos_e2e::control::{gateway_client, ControlPki};
use talos_e2e::relay::Relay;
use talos_gateway::pb;
use talos_gateway::pb::gateway_client::GatewayClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tonic::transport::Channel;

/// The longest one command may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(1200);

/// The longest one data connection (connect, handshake, request, reply)
/// may take.
const REQUEST_LIMIT: Duration = Duration::from_secs(20);

/// The most bytes read of one reply (the origin's `/` is 34 bytes).
const REPLY_LIMIT: usize = 64 * 1024;

/// Sources per third octet (127.0.X.1 to 127.0.X.250).
const PER_OCTET: u64 = 250;

/// The warm-up session's source: no session k has it.
const WARM_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 200);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match Opts::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "capacity-driver: {e}\nusage: capacity-driver dir=DIR names=A,B,C [renew_ms=N] [attach=N] [limit_s=N]"
            );
            std::process::exit(2);
        }
    };
    // One thread: the gateway under test has the other core.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let limit = Duration::from_secs(opts.limit_s);
    let code = rt.block_on(async move {
        match tokio::time::timeout(limit, run(opts)).await {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                eprintln!("capacity-driver: {e}");
                1
            }
            Err(_) => {
                eprintln!("capacity-driver: over {} s; stopped", limit.as_secs());
                1
            }
        }
    });
    std::process::exit(code);
}

#[derive(Debug)]
struct Opts {
    dir: PathBuf,
    names: Vec<String>,
    renew: Duration,
    attach: usize,
    limit_s: u64,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Opts, String> {
        let mut o = Opts {
            dir: PathBuf::new(),
            names: Vec::new(),
            renew: Duration::from_secs(10),
            attach: 0,
            limit_s: 3600,
        };
        for a in args {
            let (k, v) = a
                .split_once('=')
                .ok_or_else(|| format!("{a:?} is not KEY=VALUE"))?;
            let num = || v.parse::<u64>().map_err(|_| format!("{k}={v:?}"));
            match k {
                "dir" => o.dir = PathBuf::from(v),
                "names" => o.names = v.split(',').map(str::to_owned).collect(),
                "renew_ms" => o.renew = Duration::from_millis(num()?.max(100)),
                "attach" => o.attach = usize::try_from(num()?).map_err(|e| e.to_string())?,
                "limit_s" => o.limit_s = num()?,
                _ => return Err(format!("unknown key {k:?}")),
            }
        }
        if o.dir.as_os_str().is_empty() || o.names.is_empty() {
            return Err("dir= and names= are required".into());
        }
        Ok(o)
    }
}

/// The source address of session `k`.
fn source(k: u64) -> Option<Ipv4Addr> {
    if k == 0 {
        return Some(Ipv4Addr::new(127, 0, 0, 1));
    }
    let x = 1 + (k - 1) / PER_OCTET;
    let y = 1 + (k - 1) % PER_OCTET;
    Some(Ipv4Addr::new(127, 0, u8::try_from(x).ok()?, y as u8))
}

fn session_id(k: u64) -> String {
    format!("sbx-{k:012x}")
}

/// The k of a [`session_id`].
fn session_k(id: &str) -> Option<u64> {
    u64::from_str_radix(id.strip_prefix("sbx-")?, 16).ok()
}

/// A session this driver holds open on the member.
#[derive(Debug, Clone)]
struct Open {
    id: String,
    source: Ipv4Addr,
    /// The session CA the member returned (PEM): the data connections
    /// trust it alone.
    ca_pem: String,
    /// A close has been sent: the member may have dropped it already.
    closing: bool,
}

/// Renewals done in the background, for the answers.
#[derive(Debug, Default, Clone, Copy)]
struct Renewals {
    calls: u64,
    renewed: u64,
    not_held: u64,
    errors: u64,
    last_seconds: f64,
}

struct Driver {
    opts: Opts,
    relay: Relay,
    pki: ControlPki,
    client: Option<GatewayClient<Channel>>,
    data: Option<SocketAddr>,
    /// Every open session by k; the renewal task reads it.
    open: Arc<Mutex<BTreeMap<u64, Open>>>,
    renewals: Arc<Mutex<Renewals>>,
    next: u64,
}

async fn run(opts: Opts) -> Result<(), String> {
    let pki = ControlPki::new(&opts.dir);
    let relay = Relay::start(&pki).await;
    println!("{}", json!({"event": "ready", "plane": relay.addr}));
    let mut d = Driver {
        opts,
        relay,
        pki,
        client: None,
        data: None,
        open: Arc::default(),
        renewals: Arc::default(),
        next: 0,
    };
    // Standard input is read by a thread of its own (blocking reads), line
    // by line, and handed over.
    let (tx, mut lines) = tokio::sync::mpsc::channel::<String>(1);
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"quit") {
            break;
        }
        let answer = match tokio::time::timeout(COMMAND_LIMIT, d.command(&words)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => json!({"event": "error", "error": e}),
            Err(_) => {
                json!({"event": "error", "error": format!("over {} s", COMMAND_LIMIT.as_secs())})
            }
        };
        let mut answer = answer;
        let r = *d.renewals.lock().expect("renewals");
        answer["background_renewals"] = json!({
            "calls": r.calls, "renewed": r.renewed, "not_held": r.not_held,
            "errors": r.errors, "last_seconds": r.last_seconds,
        });
        println!("{answer}");
    }
    Ok(())
}

fn count(words: &[&str], i: usize) -> Result<u64, String> {
    words
        .get(i)
        .ok_or_else(|| format!("{}: argument {i} is missing", words[0]))?
        .parse()
        .map_err(|_| format!("{}: argument {i} is not a number", words[0]))
}

/// Milliseconds at the `p`th percentile of `v` (sorted here).
fn percentile_ms(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p / 100.0).round() as usize;
    v[i].as_secs_f64() * 1e3
}

impl Driver {
    async fn command(&mut self, w: &[&str]) -> Result<Value, String> {
        match w {
            ["connect", control, data] => self.connect(control, data).await,
            ["warm"] => self.warm().await,
            ["open", ..] => self.open_more(count(w, 1)?, count(w, 2)?).await,
            ["touch", ..] => self.touch(count(w, 1)?, count(w, 2)?).await,
            ["renew"] => self.renew().await,
            ["status"] => Ok(json!({
                "event": "status",
                "open": self.open.lock().expect("open").len(),
                "batches": self.relay.batches(),
            })),
            ["close", ..] => self.close_all(count(w, 1)?).await,
            _ => Err(format!("unknown command {:?}", w.join(" "))),
        }
    }

    fn client(&self) -> Result<GatewayClient<Channel>, String> {
        self.client.clone().ok_or_else(|| "connect first".into())
    }

    async fn connect(&mut self, control: &str, data: &str) -> Result<Value, String> {
        let control: SocketAddr = control.parse().map_err(|_| "CONTROL is not ADDR:PORT")?;
        let data: SocketAddr = data.parse().map_err(|_| "DATA is not ADDR:PORT")?;
        let mut client = gateway_client(
            control,
            &self.pki.ca.cert_pem,
            Some(self.pki.client_identity()),
        );
        let me = client
            .describe(pb::DescribeRequest {})
            .await
            .map_err(|e| format!("Describe: {e}"))?
            .into_inner();
        self.client = Some(client.clone());
        self.data = Some(data);
        tokio::spawn(renew_every(
            self.opts.renew,
            client,
            Arc::clone(&self.open),
            Arc::clone(&self.renewals),
        ));
        Ok(json!({
            "event": "connected",
            "gateway_id": me.gateway_id,
            "instance": me.instance,
            "lease_ms": me.lease_ms,
            "renew_ms": self.opts.renew.as_millis() as u64,
        }))
    }

    fn request(&self, id: String, source: Ipv4Addr, k: u64) -> pb::OpenSessionRequest {
        let names = &self.opts.names;
        pb::OpenSessionRequest {
            session_id: id,
            attempt: 1,
            tenant: "bench".into(),
            sources: vec![source.to_string()],
            allowlist: names.clone(),
            attachments: (0..self.opts.attach)
                .map(|i| pb::Attachment {
                    secret: format!("KEY{i}"),
                    destination: names[i % names.len()].clone(),
                    header: format!("x-api-key-{i}"),
                    scheme: String::new(),
                    // 40 characters, one value per session and attachment.
                    value: format!(
                        "cap-{k:012x}-{i:04}-{:019x}",
                        k.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    )
                    .into_bytes(),
                })
                .collect(),
            cause: "launch".into(),
            ..Default::default()
        }
    }

    async fn warm(&mut self) -> Result<Value, String> {
        let started = Instant::now();
        let mut client = self.client()?;
        let id = "sbx-warm-up".to_owned();
        let opened = client
            .open_session(self.request(id.clone(), WARM_SOURCE, u64::MAX))
            .await
            .map_err(|e| format!("OpenSession: {e}"))?
            .into_inner();
        let session = Open {
            id: id.clone(),
            source: WARM_SOURCE,
            ca_pem: opened.ca_pem,
            closing: false,
        };
        let (ok, failed, first) = self.requests(vec![session], 3).await?;
        client
            .close_session(pb::CloseSessionRequest {
                session_id: id,
                attempt: 1,
                reason: "end".into(),
            })
            .await
            .map_err(|e| format!("CloseSession: {e}"))?;
        Ok(json!({
            "event": "warm", "ok": ok, "failed": failed, "first_error": first,
            "seconds": started.elapsed().as_secs_f64(),
        }))
    }

    async fn open_more(&mut self, n: u64, conc: u64) -> Result<Value, String> {
        let client = self.client()?;
        let sem = Arc::new(Semaphore::new(conc.max(1) as usize));
        let mut set = JoinSet::new();
        let started = Instant::now();
        for k in self.next..self.next + n {
            let source = source(k).ok_or_else(|| format!("no source address for session {k}"))?;
            let req = self.request(session_id(k), source, k);
            let permit = Arc::clone(&sem).acquire_owned().await.expect("semaphore");
            let mut c = client.clone();
            set.spawn(async move {
                let t = Instant::now();
                let r = c.open_session(req).await;
                drop(permit);
                (k, source, r.map(|r| r.into_inner().ca_pem), t.elapsed())
            });
        }
        self.next += n;
        let (mut ok, mut failed, mut first) = (0u64, 0u64, None);
        let mut took = Vec::with_capacity(n as usize);
        while let Some(done) = set.join_next().await {
            let (k, source, r, t) = done.map_err(|e| e.to_string())?;
            took.push(t);
            match r {
                Ok(ca_pem) => {
                    ok += 1;
                    let id = session_id(k);
                    self.open.lock().expect("open").insert(
                        k,
                        Open {
                            id,
                            source,
                            ca_pem,
                            closing: false,
                        },
                    );
                }
                Err(e) => {
                    failed += 1;
                    first.get_or_insert_with(|| format!("session {k}: {e}"));
                }
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        Ok(json!({
            "event": "opened", "n": n, "ok": ok, "failed": failed, "first_error": first,
            "seconds": seconds, "concurrency": conc,
            "p50_ms": percentile_ms(&mut took, 50.0), "p99_ms": percentile_ms(&mut took, 99.0),
            "open": self.open.lock().expect("open").len(),
        }))
    }

    async fn touch(&mut self, n: u64, conc: u64) -> Result<Value, String> {
        let all: Vec<Open> = self.open.lock().expect("open").values().cloned().collect();
        let n = (n as usize).min(all.len());
        // Spread evenly over the open sessions.
        let picked: Vec<Open> = (0..n).map(|i| all[i * all.len() / n].clone()).collect();
        let started = Instant::now();
        let (ok, failed, first) = self.requests(picked, conc as usize).await?;
        Ok(json!({
            "event": "touched", "sessions": n, "connections": ok + failed,
            "ok": ok, "failed": failed, "first_error": first,
            "seconds": started.elapsed().as_secs_f64(), "concurrency": conc,
        }))
    }

    /// One request to each name of each session, `conc` at once; returns
    /// (answered 200, failed, the first failure).
    async fn requests(
        &self,
        sessions: Vec<Open>,
        conc: usize,
    ) -> Result<(u64, u64, Option<String>), String> {
        let data = self.data.ok_or("connect first")?;
        let sem = Arc::new(Semaphore::new(conc.max(1)));
        let mut set = JoinSet::new();
        for s in sessions {
            let tls = client_tls(&s.ca_pem)?;
            for name in &self.opts.names {
                let permit = Arc::clone(&sem).acquire_owned().await.expect("semaphore");
                let (tls, name, source) = (Arc::clone(&tls), name.clone(), s.source);
                set.spawn(async move {
                    let r =
                        tokio::time::timeout(REQUEST_LIMIT, one_request(source, data, &name, tls))
                            .await
                            .unwrap_or_else(|_| Err(format!("over {} s", REQUEST_LIMIT.as_secs())));
                    drop(permit);
                    r.map_err(|e| format!("{name} from {source}: {e}"))
                });
            }
        }
        let (mut ok, mut failed, mut first) = (0, 0, None);
        while let Some(done) = set.join_next().await {
            match done.map_err(|e| e.to_string())? {
                Ok(()) => ok += 1,
                Err(e) => {
                    failed += 1;
                    first.get_or_insert(e);
                }
            }
        }
        Ok((ok, failed, first))
    }

    async fn renew(&mut self) -> Result<Value, String> {
        let client = self.client()?;
        let leases = lease_list(&self.open);
        let n = leases.len();
        let started = Instant::now();
        let reply = renew_once(client, leases).await?;
        Ok(json!({
            "event": "renewed", "n": n, "renewed": reply.renewed.len(),
            "not_held": reply.not_held.len(), "lease_ms": reply.lease_ms,
            "seconds": started.elapsed().as_secs_f64(),
        }))
    }

    async fn close_all(&mut self, conc: u64) -> Result<Value, String> {
        let client = self.client()?;
        // Each session stays on the renewal list until its close is
        // answered, as a control plane keeps renewing what it has not
        // seen closed: closing 10,000 can take longer than a lease.
        let all: Vec<(u64, Open)> = self
            .open
            .lock()
            .expect("open")
            .iter()
            .map(|(k, s)| (*k, s.clone()))
            .collect();
        let n = all.len();
        let sem = Arc::new(Semaphore::new(conc.max(1) as usize));
        let mut set = JoinSet::new();
        let started = Instant::now();
        for (k, s) in all {
            let permit = Arc::clone(&sem).acquire_owned().await.expect("semaphore");
            if let Some(o) = self.open.lock().expect("open").get_mut(&k) {
                o.closing = true;
            }
            let mut c = client.clone();
            set.spawn(async move {
                let t = Instant::now();
                let r = c
                    .close_session(pb::CloseSessionRequest {
                        session_id: s.id,
                        attempt: 1,
                        reason: "end".into(),
                    })
                    .await;
                drop(permit);
                (k, r, t.elapsed())
            });
        }
        let (mut ok, mut failed, mut first, mut cut) = (0u64, 0u64, None, 0u64);
        let mut took = Vec::with_capacity(n);
        while let Some(done) = set.join_next().await {
            let (k, r, t) = done.map_err(|e| e.to_string())?;
            took.push(t);
            self.open.lock().expect("open").remove(&k);
            match r.map(tonic::Response::into_inner) {
                Ok(reply)
                    if reply
                        .drop_report
                        .as_ref()
                        .is_some_and(|s| s.kind == "drop_report") =>
                {
                    ok += 1;
                    cut += u64::from(reply.connections_closed);
                }
                Ok(_) => {
                    failed += 1;
                    first.get_or_insert_with(|| format!("session {k}: no signed drop report"));
                }
                Err(e) => {
                    failed += 1;
                    first.get_or_insert_with(|| format!("session {k}: {e}"));
                }
            }
        }
        Ok(json!({
            "event": "closed", "n": n, "ok": ok, "failed": failed, "first_error": first,
            "connections_closed": cut, "seconds": started.elapsed().as_secs_f64(),
            "concurrency": conc,
            "p50_ms": percentile_ms(&mut took, 50.0), "p99_ms": percentile_ms(&mut took, 99.0),
        }))
    }
}

/// A TLS client config trusting `ca_pem` alone, TLS 1.3, HTTP/1.1.
fn client_tls(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| format!("session CA: {e}"))?)
            .map_err(|e| format!("session CA: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// From `source`: TCP to `data`, TLS for `name` checked against the
/// session's CA, `GET /`, the whole reply; Ok if it is a 200.
async fn one_request(
    source: Ipv4Addr,
    data: SocketAddr,
    name: &str,
    tls: Arc<rustls::ClientConfig>,
) -> Result<(), String> {
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket
        .bind(SocketAddr::new(source.into(), 0))
        .map_err(|e| format!("bind: {e}"))?;
    let tcp = socket
        .connect(data)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let server = ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(tls)
        .connect(server, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let request = format!("GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tls.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                reply.extend_from_slice(&buf[..n]);
                if reply.len() > REPLY_LIMIT {
                    return Err("reply too long".into());
                }
            }
            // The gateway closes after the reply; a close without
            // close_notify ends the reply as well.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    let head = String::from_utf8_lossy(&reply[..reply.len().min(200)]).into_owned();
    if head.starts_with("HTTP/1.1 200 ") && reply.windows(4).any(|w| w == b"\r\n\r\n") {
        Ok(())
    } else {
        Err(format!(
            "answered {:?}",
            head.lines().next().unwrap_or("nothing")
        ))
    }
}

fn lease_list(open: &Mutex<BTreeMap<u64, Open>>) -> Vec<pb::SessionAttempt> {
    open.lock()
        .expect("open")
        .values()
        .map(|s| pb::SessionAttempt {
            session_id: s.id.clone(),
            attempt: 1,
        })
        .collect()
}

async fn renew_once(
    mut client: GatewayClient<Channel>,
    leases: Vec<pb::SessionAttempt>,
) -> Result<pb::RenewLeasesReply, String> {
    client
        .renew_leases(pb::RenewLeasesRequest {
            leases,
            // Read "now": this driver is the control plane.
            read_at_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|e| format!("RenewLeases: {e}"))
}

/// Renew every open session's lease every `every`, as a control plane
/// does, until the process ends.
async fn renew_every(
    every: Duration,
    client: GatewayClient<Channel>,
    open: Arc<Mutex<BTreeMap<u64, Open>>>,
    renewals: Arc<Mutex<Renewals>>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let leases = lease_list(&open);
        if leases.is_empty() {
            continue;
        }
        let started = Instant::now();
        let r = renew_once(client.clone(), leases).await;
        let mut s = renewals.lock().expect("renewals");
        s.calls += 1;
        s.last_seconds = started.elapsed().as_secs_f64();
        match r {
            Ok(reply) => {
                s.renewed += reply.renewed.len() as u64;
                // A session whose close was sent is not held, rightly:
                // only one open with no close sent counts.
                let open = open.lock().expect("open");
                s.not_held += reply
                    .not_held
                    .iter()
                    .filter(|l| {
                        session_k(&l.session_id)
                            .and_then(|k| open.get(&k))
                            .is_some_and(|o| !o.closing)
                    })
                    .count() as u64;
            }
            Err(e) => {
                s.errors += 1;
                eprintln!("capacity-driver: background {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_session_has_its_own_loopback_source() {
        assert_eq!(source(0), Some(Ipv4Addr::new(127, 0, 0, 1)));
        assert_eq!(source(1), Some(Ipv4Addr::new(127, 0, 1, 1)));
        assert_eq!(source(250), Some(Ipv4Addr::new(127, 0, 1, 250)));
        assert_eq!(source(251), Some(Ipv4Addr::new(127, 0, 2, 1)));
        let mut seen = std::collections::HashSet::new();
        for k in 0..20_000 {
            let ip = source(k).unwrap();
            assert!(ip.is_loopback() && ip != WARM_SOURCE, "{ip}");
            assert!(ip.octets()[3] != 0 && ip.octets()[3] != 255, "{ip}");
            assert!(seen.insert(ip), "{ip} twice");
        }
        assert!(source(PER_OCTET * 255).is_some());
        assert!(source(PER_OCTET * 255 + 1).is_none());
        assert_eq!(session_id(10_000), "sbx-000000002710");
        assert_eq!(session_k(&session_id(10_000)), Some(10_000));
        assert_eq!(session_k("sbx-warm-up"), None);
    }

    #[test]
    fn percentiles() {
        let mut v: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&mut v, 50.0), 51.0);
        assert_eq!(percentile_ms(&mut v, 99.0), 99.0);
        assert_eq!(percentile_ms(&mut [], 50.0), 0.0);
    }
}
