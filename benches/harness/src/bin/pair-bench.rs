//! What forwarding over the member link costs (`benches/pair/run.sh`): a
//! linked pair under `control-stub serve` (the end-to-end rig, with the
//! binaries `TALOS_GATEWAY_BIN` and `TALOS_CONTROL_STUB_BIN` name: release
//! builds, one runtime worker each by `TALOS_TEST_WORKERS`), one session
//! from 127.0.0.2 on both members, member gw-a SIGKILLed and started again
//! (it then forwards the session to gw-b). Then, side by side, rounds
//! alternating which goes first:
//!
//! - **new connections**: `--conns` connections, `--concurrency` at once
//!   (as the comparison's newconn figure, h2load -c16), each a TLS
//!   handshake with the session's bundle and one HTTP/1.1 request for
//!   1 KiB (`Connection: close`): through gw-a (forwarded to gw-b) and
//!   straight to gw-b (terminated), and through a plain TCP relay in
//!   front of gw-b (HAProxy in TCP mode connecting from the session's
//!   source: passing a new connection on with no link, record or check);
//!   each process's CPU (utime+stime from `/proc`) per connection;
//! - **the hop's latency**: `--latency-conns` such connections one after
//!   another, each way: each one's time, at p50 and p99;
//! - **bytes**: one download of `--mib` MiB over one connection, the same
//!   two ways, and through a plain TCP relay (HAProxy in TCP mode, one
//!   thread, 256 KiB buffers, as `benches/compare/run.sh`'s relay column)
//!   straight to the origin: CPU seconds per GB of each process that moves
//!   the bytes.
//!
//! Prints one Markdown table of the medians over the rounds. Every run is
//! bounded; every process is stopped by its PID (the rig's, and HAProxy's).
//!
//! With `--ab GATEWAY`, it compares two builds of the forwarder instead
//! (how a change to forwarding is judged): each round gw-a is started
//! again with one build, then the other (alternating which goes first),
//! and each forwards `--conns` new connections; between them, the same
//! connections straight to gw-b and through the plain TCP relay. Prints
//! each round's CPU per connection and the medians.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use talos_e2e::clients::{connect_from, session_tls};
use talos_e2e::rig::{Pair, SessionSpec};
use talos_e2e::wait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAME: &str = "api.test";
const SOURCE: &str = "127.0.0.2";
/// Each connection at most this long.
const CONN_LIMIT: Duration = Duration::from_secs(30);

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// utime+stime of `pid`, in seconds.
fn cpu(pid: u32) -> f64 {
    let ticks = talos_bench_harness::figures::ticks(&pid.to_string()).unwrap_or(0);
    ticks as f64 / 100.0
}

/// The CPU time of `pid`'s threads running now, in seconds, to the
/// nanosecond (`/proc/PID/task/*/schedstat`): what `--ab` compares, where
/// `/proc`'s 10 ms ticks are too coarse for a few thousand connections.
fn cpu_ns(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// One request on a new TLS connection from the session's source: the
/// time it took, and the reply's bytes.
async fn one(
    tls: &Arc<rustls::ClientConfig>,
    to: SocketAddr,
    path: &str,
    server_name: &str,
) -> (Duration, usize) {
    let started = Instant::now();
    let run = async {
        let tcp = connect_from(SOURCE, to).await;
        let _ = tcp.set_nodelay(true);
        let name = rustls::pki_types::ServerName::try_from(server_name.to_owned()).expect("name");
        let mut s = tokio_rustls::TlsConnector::from(Arc::clone(tls))
            .connect(name, tcp)
            .await
            .expect("TLS");
        let req = format!("GET {path} HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("request");
        let mut buf = vec![0u8; 256 * 1024];
        let mut n = 0;
        let mut head = Vec::new();
        loop {
            let k = s.read(&mut buf).await.unwrap_or(0);
            if k == 0 {
                break;
            }
            if head.len() < 16 {
                head.extend_from_slice(&buf[..k.min(16)]);
            }
            n += k;
        }
        assert!(
            head.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&head)
        );
        n
    };
    let n = tokio::time::timeout(CONN_LIMIT, run)
        .await
        .expect("in time");
    (started.elapsed(), n)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// HAProxy in TCP mode to `origin`, if it is installed, connecting from
/// `source` when given; its child and address.
fn relay(
    dir: &std::path::Path,
    name: &str,
    origin: SocketAddr,
    source: Option<&str>,
) -> Option<(Child, SocketAddr)> {
    let haproxy = ["haproxy", "/usr/sbin/haproxy"]
        .into_iter()
        .find(|h| Command::new(h).arg("-v").output().is_ok())?;
    let port = talos_e2e::ports::reserve().port();
    let cfg = dir.join(format!("{name}.cfg"));
    let from = source.map_or(String::new(), |s| format!(" source {s}"));
    std::fs::write(
        &cfg,
        format!(
            "global\n  nbthread 1\n  maxconn 1000\n  tune.bufsize 262144\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\nfrontend fe\n  bind 127.0.0.1:{port}\n  default_backend origin\nbackend origin\n  server o {origin}{from}\n"
        ),
    )
    .expect("relay config");
    let child = Command::new(haproxy)
        .arg("-db")
        .arg("-f")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait::until("the relay to listen", || {
        std::net::TcpStream::connect(addr).map(drop)
    });
    Some((child, addr))
}

/// New connections, as the CPU figure makes them.
struct Load {
    tls: Arc<rustls::ClientConfig>,
    conns: usize,
    concurrency: usize,
}

impl Load {
    /// `conns` connections to `to`, `concurrency` at once.
    async fn run(&self, to: SocketAddr) {
        let mut workers = tokio::task::JoinSet::new();
        for w in 0..self.concurrency {
            let tls = Arc::clone(&self.tls);
            let n = self.conns / self.concurrency + usize::from(w < self.conns % self.concurrency);
            workers.spawn(async move {
                for _ in 0..n {
                    one(&tls, to, "/bytes/1024", NAME).await;
                }
            });
        }
        while let Some(done) = workers.join_next().await {
            done.expect("a worker");
        }
    }

    /// CPU per connection (µs) of `pid` over one run to `to`.
    async fn cpu_per_conn(&self, pid: u32, to: SocketAddr) -> f64 {
        let before = cpu_ns(pid);
        self.run(to).await;
        (cpu_ns(pid) - before) / self.conns as f64 * 1e6
    }
}

/// gw-a started again with the gateway build `bin`, forwarding the
/// session again; its pid and data address.
async fn forward_with(
    rig: &mut Pair,
    bin: &str,
    tls: &Arc<rustls::ClientConfig>,
) -> (u32, SocketAddr) {
    std::env::set_var("TALOS_GATEWAY_BIN", bin);
    rig.restart(0);
    wait::until("gw-a to forward the session", || {
        wait::check(rig.members[0].metric("gateway_forwarding_sessions"), |n| {
            *n == Some(1.0)
        })
    });
    let a = rig.members[0].data;
    for _ in 0..20 {
        one(tls, a, "/bytes/1024", NAME).await;
    }
    (rig.members[0].pid(), a)
}

/// Two builds of the forwarder side by side (`--ab`): the build gw-a runs
/// now (A, `TALOS_GATEWAY_BIN`) against `other` (B), each round both in
/// turn, alternating which goes first, with gw-b terminated and the plain
/// TCP relay `front` in between.
async fn ab(
    rig: &mut Pair,
    load: &Load,
    other: &str,
    rounds: usize,
    b: SocketAddr,
    front: Option<(u32, SocketAddr)>,
) {
    let builds = [
        std::env::var("TALOS_GATEWAY_BIN").expect("TALOS_GATEWAY_BIN"),
        other.to_owned(),
    ];
    let pb = rig.members[1].pid();
    let mut fwd = [Vec::new(), Vec::new()];
    let mut term = Vec::new();
    let mut relay = Vec::new();
    println!(
        "| round | forwarder A (µs) | forwarder B (µs) | B / A | terminated (µs) | relay (µs) |"
    );
    println!("|---|---|---|---|---|---|");
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut this = [0.0; 2];
        for (k, i) in order.into_iter().enumerate() {
            let (pa, a) = forward_with(rig, &builds[i], &load.tls).await;
            this[i] = load.cpu_per_conn(pa, a).await;
            fwd[i].push(this[i]);
            if k == 0 {
                term.push(load.cpu_per_conn(pb, b).await);
                if let Some((pr, r)) = front {
                    relay.push(load.cpu_per_conn(pr, r).await);
                }
            }
        }
        println!(
            "| {round} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} |",
            this[0],
            this[1],
            this[1] / this[0],
            term.last().copied().unwrap_or(0.0),
            relay.last().copied().unwrap_or(0.0)
        );
    }
    let ratios: Vec<f64> = fwd[1].iter().zip(&fwd[0]).map(|(b, a)| b / a).collect();
    let (fa, fb) = (median(fwd[0].clone()), median(fwd[1].clone()));
    let (t, r) = (
        median(term),
        if relay.is_empty() { 0.0 } else { median(relay) },
    );
    println!(
        "| median | {fa:.0} | {fb:.0} | {:.2} | {t:.0} | {r:.0} |",
        median(ratios)
    );
    println!(
        "\nforwarder / terminated: A {:.2}, B {:.2}; forwarder / relay: A {:.2}, B {:.2}",
        fa / t,
        fb / t,
        fa / r,
        fb / r
    );
    std::env::set_var("TALOS_GATEWAY_BIN", &builds[0]);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let conns = arg("--conns", 2000) as usize;
    let concurrency = arg("--concurrency", 16) as usize;
    let latency_conns = arg("--latency-conns", 300) as usize;
    let rounds = arg("--rounds", 3) as usize;
    let mib = arg("--mib", 1024);
    let mut rig: Pair = Pair::builder()
        .lease(Duration::from_secs(60))
        // Batches as a production gateway seals them (the default), not
        // every 50 ms as in the tests.
        .control("batch_interval_ms = 1000\n")
        .renewing()
        .linked()
        .egress(&[NAME])
        .start_loopback(&[NAME])
        .await;
    let id = rig.start_session(&SessionSpec::from(SOURCE).allow(NAME).mode("agent"));
    let (bundle, _) = rig.trust(&id, "trust.pem");
    rig.members[0].kill();
    rig.restart(0);
    wait::until("gw-a to forward the session", || {
        wait::check(rig.members[0].metric("gateway_forwarding_sessions"), |n| {
            *n == Some(1.0)
        })
    });
    let tls = session_tls(&bundle, &[b"http/1.1"]);
    let (a, b) = (rig.members[0].data, rig.members[1].data);
    let (pa, pb) = (rig.members[0].pid(), rig.members[1].pid());
    // Warm both paths (the resolver's cache, the origin connection pool).
    for to in [a, b] {
        for _ in 0..20 {
            one(&tls, to, "/bytes/1024", NAME).await;
        }
    }

    // A plain TCP relay in front of gw-b, connecting from the session's
    // source: what passing a new connection on costs with no link, no
    // record and no check at all.
    let front = relay(&rig.dir, "front", b, Some(SOURCE));
    if let Some((_, r)) = &front {
        for _ in 0..20 {
            one(&tls, *r, "/bytes/1024", NAME).await;
        }
    }
    let mut targets = vec![a, b];
    targets.extend(front.as_ref().map(|(_, r)| *r));
    let pr = front.as_ref().map(|(c, _)| c.id());
    if let Some(other) = std::env::args()
        .position(|a| a == "--ab")
        .and_then(|i| std::env::args().nth(i + 1))
    {
        let load = Load {
            tls,
            conns,
            concurrency,
        };
        ab(
            &mut rig,
            &load,
            &other,
            rounds,
            b,
            front.as_ref().map(|(c, r)| (c.id(), *r)),
        )
        .await;
        if let Some((mut child, _)) = front {
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(rig);
        return;
    }

    let mut fwd_cpu = Vec::new();
    let mut holder_cpu = Vec::new();
    let mut term_cpu = Vec::new();
    let mut front_cpu = Vec::new();
    let mut fwd_lat = Vec::new();
    let mut term_lat = Vec::new();
    for round in 0..rounds {
        let mut order = targets.clone();
        order.rotate_left(round % targets.len());
        for to in order {
            let (ca, cb, cr) = (cpu(pa), cpu(pb), pr.map_or(0.0, cpu));
            let mut workers = tokio::task::JoinSet::new();
            for w in 0..concurrency {
                let tls = Arc::clone(&tls);
                let n = conns / concurrency + usize::from(w < conns % concurrency);
                workers.spawn(async move {
                    for _ in 0..n {
                        one(&tls, to, "/bytes/1024", NAME).await;
                    }
                });
            }
            while let Some(done) = workers.join_next().await {
                done.expect("a worker");
            }
            let (da, db, dr) = (cpu(pa) - ca, cpu(pb) - cb, pr.map_or(0.0, cpu) - cr);
            let per = |d: f64| d / conns as f64 * 1e6;
            if to == a {
                fwd_cpu.push(per(da));
                holder_cpu.push(per(db));
            } else if to == b {
                term_cpu.push(per(db));
            } else {
                front_cpu.push(per(dr));
            }
        }
    }

    for round in 0..rounds {
        let order = if round % 2 == 0 { [a, b] } else { [b, a] };
        for to in order {
            for _ in 0..latency_conns {
                let (took, _) = one(&tls, to, "/bytes/1024", NAME).await;
                if to == a {
                    fwd_lat.push(took);
                } else {
                    term_lat.push(took);
                }
            }
        }
    }

    let path = format!("/download/{}", mib << 20);
    let gb = (mib << 20) as f64 / 1e9;
    let mut fwd_gb = Vec::new();
    let mut holder_gb = Vec::new();
    let mut term_gb = Vec::new();
    let mut relay_gb = Vec::new();
    let origin = rig.peers.origin.addr;
    let relayed = relay(&rig.dir, "relay", origin, None);
    let origin_tls = session_tls(&rig.dir.join("origin-ca.pem"), &[b"http/1.1"]);
    for round in 0..rounds {
        let order = if round % 2 == 0 { [a, b] } else { [b, a] };
        for to in order {
            let (ca, cb) = (cpu(pa), cpu(pb));
            let (_, n) = one(&tls, to, &path, NAME).await;
            assert!(n as u64 >= mib << 20, "the whole download: {n}");
            let (da, db) = (cpu(pa) - ca, cpu(pb) - cb);
            if to == a {
                fwd_gb.push(da / gb);
                holder_gb.push(db / gb);
            } else {
                term_gb.push(db / gb);
            }
        }
        if let Some((child, addr)) = &relayed {
            let before = cpu(child.id());
            one(&origin_tls, *addr, &path, NAME).await;
            relay_gb.push((cpu(child.id()) - before) / gb);
        }
    }
    for (mut child, _) in relayed.into_iter().chain(front) {
        let _ = child.kill();
        let _ = child.wait();
    }
    let (f50, f99) = (
        percentile(&mut fwd_lat, 0.5),
        percentile(&mut fwd_lat, 0.99),
    );
    let (t50, t99) = (
        percentile(&mut term_lat, 0.5),
        percentile(&mut term_lat, 0.99),
    );
    let (fc, hc, tc) = (median(fwd_cpu), median(holder_cpu), median(term_cpu));
    let (fg, hg, tg) = (median(fwd_gb), median(holder_gb), median(term_gb));
    println!(
        "| figure (medians of {rounds} rounds: {conns} connections {concurrency} at once, {mib} MiB, {latency_conns} connections one at a time) | forwarded: forwarder gw-a | forwarded: holder gw-b | terminated: gw-b alone | forwarder / terminated |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| CPU per new connection (µs) | {fc:.0} | {hc:.0} | {tc:.0} | {:.2} |",
        fc / tc
    );
    println!(
        "| CPU per GB (s) | {fg:.3} | {hg:.3} | {tg:.3} | {:.2} |",
        fg / tg
    );
    if !front_cpu.is_empty() {
        let rc = median(front_cpu);
        println!(
            "| plain TCP relay (HAProxy, mode tcp) in front of gw-b, CPU per new connection (µs) | {rc:.0} | | | forwarder / relay {:.2} |",
            fc / rc
        );
    }
    if !relay_gb.is_empty() {
        let rg = median(relay_gb);
        println!(
            "| plain TCP relay (HAProxy, mode tcp) CPU per GB (s) | {rg:.3} | | | forwarder / relay {:.2} |",
            fg / rg
        );
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| new connection + 1 KiB request, p50 (ms) | {:.2} | | {:.2} | hop +{:.2} ms |",
        ms(f50),
        ms(t50),
        ms(f50) - ms(t50)
    );
    println!(
        "| new connection + 1 KiB request, p99 (ms) | {:.2} | | {:.2} | hop +{:.2} ms |",
        ms(f99),
        ms(t99),
        ms(f99) - ms(t99)
    );
    drop(rig);
}
