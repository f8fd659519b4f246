//! New TLS connections, one HTTP/1.1 request each, from a client that
//! resumes TLS 1.3 sessions as reconnecting clients do (curl, Python, Node,
//! Go and Java keep tickets within a process), or, with `fresh`, one that
//! never does: the same client both ways, so the two figures differ only
//! in the handshake. `benches/compare/run.sh` runs it for its resumed
//! new-connection figure (wrk, which never resumes, gives the other).
//!
//! `CONNS` connections at a time on one thread (as `wrk -t1`), each: TCP
//! connect, a TLS 1.3 handshake (offering a ticket from earlier
//! connections to the same name when there is one), `GET PATH` with
//! `Connection: close`, the reply read to the end of its `Content-Length`,
//! close_notify, close; then the next, until `SECONDS` have passed. Each
//! of the `CONNS` keeps its own tickets, as `CONNS` client processes that
//! each reconnect would (rustls keeps at most 8 tickets per name in one
//! store: shared by 16 connections that finish together, the last of them
//! would find none and shake hands in full).
//!
//! Prints the line `benches/compare`'s figures read, wrk's `RESULT` line,
//! with the count of resumed handshakes added:
//! `RESULT requests=N bytes=N duration_us=N errors=N non2xx=N p50_us=N p99_us=N resumed=N`.
//!
//! Usage: resume-load ADDR NAME CA_PEM PATH CONNS SECONDS [resume|fresh]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::Resumption;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The longest one connection may take, handshake to last byte.
const PER_CONNECTION: Duration = Duration::from_secs(10);

/// Tickets each of the connections keeps: one name's worth (rustls keeps
/// up to 8 per name).
const TICKET_CACHE: usize = 8;

struct Args {
    addr: SocketAddr,
    name: ServerName<'static>,
    host: String,
    ca: std::path::PathBuf,
    path: String,
    conns: usize,
    seconds: u64,
    resume: bool,
}

fn args() -> Result<Args, String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if !(6..=7).contains(&a.len()) {
        return Err("usage: resume-load ADDR NAME CA_PEM PATH CONNS SECONDS [resume|fresh]".into());
    }
    let resume = match a.get(6).map(String::as_str) {
        None | Some("resume") => true,
        Some("fresh") => false,
        Some(o) => return Err(format!("resume-load: {o}: expected resume or fresh")),
    };
    Ok(Args {
        addr: a[0]
            .parse()
            .map_err(|e| format!("resume-load: ADDR {}: {e}", a[0]))?,
        name: ServerName::try_from(a[1].clone())
            .map_err(|e| format!("resume-load: NAME {}: {e}", a[1]))?,
        host: a[1].clone(),
        ca: a[2].clone().into(),
        path: a[3].clone(),
        conns: a[4]
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("resume-load: CONNS {}: a count", a[4]))?,
        seconds: a[5]
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("resume-load: SECONDS {}: a count", a[5]))?,
        resume,
    })
}

fn client_config(a: &Args) -> Result<Arc<rustls::ClientConfig>, String> {
    let pem = std::fs::read(&a.ca).map_err(|e| format!("resume-load: {}: {e}", a.ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut &pem[..]) {
        let c = c.map_err(|e| format!("resume-load: {}: {e}", a.ca.display()))?;
        roots
            .add(c)
            .map_err(|e| format!("resume-load: {}: {e}", a.ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("resume-load: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// `config` with a ticket store of its own (for one of the `CONNS`), or
/// as it is (no resumption).
fn own_tickets(config: &Arc<rustls::ClientConfig>, resume: bool) -> Arc<rustls::ClientConfig> {
    if !resume {
        return Arc::clone(config);
    }
    let mut c = (**config).clone();
    c.resumption = Resumption::in_memory_sessions(TICKET_CACHE);
    Arc::new(c)
}

/// What one connection that got a reply gave.
struct Reply {
    /// The status was 2xx.
    ok: bool,
    bytes: u64,
    /// The handshake resumed a TLS session.
    resumed: bool,
}

/// One connection's request; `None` if it failed or took too long.
async fn one(a: &Args, tls: &TlsConnector, request: &[u8]) -> Option<Reply> {
    let run = async {
        let tcp = TcpStream::connect(a.addr).await.ok()?;
        let _ = tcp.set_nodelay(true);
        let mut s = tls.connect(a.name.clone(), tcp).await.ok()?;
        s.write_all(request).await.ok()?;
        let mut buf = Vec::with_capacity(4096);
        let mut chunk = [0u8; 16 * 1024];
        let (head, body_len) = loop {
            let n = s.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..end]).ok()?.to_owned();
                let len = head
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.trim().parse::<usize>().ok())?;
                break (head, end + 4 + len);
            }
        };
        while buf.len() < body_len {
            let n = s.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let resumed = s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        let _ = s.shutdown().await;
        let ok = head
            .split(' ')
            .nth(1)
            .is_some_and(|code| code.starts_with('2'));
        Some(Reply {
            ok,
            bytes: buf.len() as u64,
            resumed,
        })
    };
    tokio::time::timeout(PER_CONNECTION, run)
        .await
        .ok()
        .flatten()
}

#[derive(Default)]
struct Tally {
    requests: u64,
    non2xx: u64,
    errors: u64,
    bytes: u64,
    resumed: u64,
    latencies_us: Vec<u64>,
}

impl Tally {
    /// Count one connection, which took `took`.
    fn count(&mut self, reply: Option<Reply>, took: Duration) {
        let Some(r) = reply else {
            self.errors += 1;
            return;
        };
        self.requests += 1;
        self.bytes += r.bytes;
        self.resumed += u64::from(r.resumed);
        if r.ok {
            self.latencies_us.push(took.as_micros() as u64);
        } else {
            self.non2xx += 1;
        }
    }

    /// Add another connection's tally.
    fn add(&mut self, t: Tally) {
        self.requests += t.requests;
        self.non2xx += t.non2xx;
        self.errors += t.errors;
        self.bytes += t.bytes;
        self.resumed += t.resumed;
        self.latencies_us.extend(t.latencies_us);
    }
}

fn main() {
    let (a, config) = match args().and_then(|a| client_config(&a).map(|c| (a, c))) {
        Ok(both) => both,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let a = Arc::new(a);
    let request: Arc<[u8]> = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        a.path, a.host
    )
    .into_bytes()
    .into();
    let tally = rt.block_on(async {
        let start = Instant::now();
        let end = start + Duration::from_secs(a.seconds);
        let mut tasks = Vec::new();
        for _ in 0..a.conns {
            let tls = TlsConnector::from(own_tickets(&config, a.resume));
            let (a, request) = (Arc::clone(&a), Arc::clone(&request));
            tasks.push(tokio::spawn(async move {
                let mut t = Tally::default();
                while Instant::now() < end {
                    let t0 = Instant::now();
                    let reply = one(&a, &tls, &request).await;
                    t.count(reply, t0.elapsed());
                }
                t
            }));
        }
        let mut all = Tally::default();
        for task in tasks {
            if let Ok(t) = task.await {
                all.add(t);
            }
        }
        (all, start.elapsed())
    });
    let (mut t, took) = tally;
    t.latencies_us.sort_unstable();
    let pct = |p: usize| {
        if t.latencies_us.is_empty() {
            0
        } else {
            t.latencies_us[(t.latencies_us.len() - 1) * p / 100]
        }
    };
    println!(
        "RESULT requests={} bytes={} duration_us={} errors={} non2xx={} p50_us={} p99_us={} resumed={}",
        t.requests,
        t.bytes,
        took.as_micros(),
        t.errors,
        t.non2xx,
        pct(50),
        pct(99),
        t.resumed
    );
}
