//! The load comparison's peers on loopback (`benches/load/quick.sh`): a DNS
//! server naming `origin.demo.test` 127.0.0.1 and the end-to-end TLS origin
//! (same routes, same kind of test CA) whose sockets have Nagle's algorithm
//! off. Prints one JSON line with their addresses, then runs until SIGTERM
//! or SIGINT.
//!
//! Why not `demo-peers`: its origin leaves Nagle on, so the last small
//! segment of a reply can wait for the peer's delayed ACK (40 ms on Linux
//! loopback). That caps a streamed 1 MiB reply near 150 MB/s and puts
//! 40 ms stalls in the latency tail, for the direct runs and the gateway's
//! upstream leg alike. Servers people run in front of real traffic set
//! TCP_NODELAY; so does this one.
//!
//! More names (`benches/capacity/run.sh`): each `NAME@ADDR` is served too,
//! on its own loopback address and the same port, and the DNS server names
//! it ADDR. A gateway keeps a pooled connection per session and
//! destination, and one source address reaches one destination address
//! and port from at most the ~28,000 ports of the kernel's ephemeral
//! range: 10,000 sessions reaching three names need three addresses, as
//! three real destinations would have.
//!
//! Usage: load-origin DIR [NAME@ADDR...]   (writes DIR/origin-ca.pem)

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use talos_e2e::dns::{Answer, DnsServer};
use talos_e2e::origin::{Origin, TestCa};

/// The name every load bench asks for, served on 127.0.0.1.
const NAME: &str = "origin.demo.test";

/// Tries at a port that is free on every address (another process may hold
/// the first address's port on another address).
const PORT_TRIES: usize = 20;

fn usage(why: &str) -> ! {
    eprintln!("load-origin: {why}\nusage: load-origin DIR [NAME@ADDR...]");
    std::process::exit(2);
}

/// A listener on `addr` with TCP_NODELAY, which Linux hands down to every
/// socket it accepts (so the origin's accept loop is the end-to-end
/// suite's own).
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Listeners on `addrs`, all on one port the kernel picks for the first.
fn listen_all(addrs: &[IpAddr]) -> Vec<tokio::net::TcpListener> {
    for _ in 0..PORT_TRIES {
        let first = listen(SocketAddr::new(addrs[0], 0)).expect("bind origin");
        let port = first.local_addr().expect("origin addr").port();
        let rest: Result<Vec<_>, _> = addrs[1..]
            .iter()
            .map(|a| listen(SocketAddr::new(*a, port)))
            .collect();
        if let Ok(rest) = rest {
            return std::iter::once(first).chain(rest).collect();
        }
    }
    usage("no port is free on every address")
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        usage("DIR is missing")
    };
    let mut served: Vec<(String, IpAddr)> = vec![(NAME.to_owned(), [127, 0, 0, 1].into())];
    for a in args {
        let Some((name, addr)) = a.split_once('@') else {
            usage(&format!("{a:?} is not NAME@ADDR"))
        };
        let ip: IpAddr = addr
            .parse()
            .unwrap_or_else(|_| usage(&format!("{addr:?} is not an address")));
        if !ip.is_loopback() {
            usage(&format!("{ip} is not a loopback address"));
        }
        if served.iter().any(|(n, a)| n == name || *a == ip) {
            usage(&format!("{a:?}: each name and each address once"));
        }
        served.push((name.to_ascii_lowercase(), ip));
    }
    let ca = TestCa::new("load origin CA");
    ca.write_pem(&dir.join("origin-ca.pem"));
    let names: Vec<&str> = served.iter().map(|(n, _)| n.as_str()).collect();
    let addrs: Vec<IpAddr> = served.iter().map(|(_, a)| *a).collect();
    let origins: Vec<Origin> = listen_all(&addrs)
        .into_iter()
        .map(|l| Origin::serve_by_server_order(l, &ca, &names))
        .collect();
    let table: HashMap<String, Answer> = served
        .iter()
        .map(|(n, a)| (n.clone(), Answer::Addrs(vec![*a])))
        .collect();
    let dns = DnsServer::start(table).await;
    let all: Vec<String> = origins.iter().map(|o| o.addr.to_string()).collect();
    println!(
        "{}",
        serde_json::json!({"event": "ready", "dns": dns.addr, "origin": origins[0].addr, "origins": all})
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
