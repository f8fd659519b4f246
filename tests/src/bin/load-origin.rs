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
//! Usage: load-origin DIR   (writes DIR/origin-ca.pem)

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use talos_e2e::dns::{Answer, DnsServer};
use talos_e2e::origin::{Origin, TestCa};

#[tokio::main]
async fn main() {
    let Some(dir) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: load-origin DIR");
        std::process::exit(2);
    };
    let ca = TestCa::new("load origin CA");
    ca.write_pem(&dir.join("origin-ca.pem"));
    // Linux hands a listener's TCP_NODELAY down to every socket it accepts,
    // so the option is set once here and the origin's accept loop is the
    // end-to-end suite's own.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_nodelay(true).expect("TCP_NODELAY");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind origin");
    let listener = socket.listen(1024).expect("listen");
    let origin = Origin::serve(listener, &ca, &["origin.demo.test"]);
    let loopback: IpAddr = [127, 0, 0, 1].into();
    let table = HashMap::from([("origin.demo.test".to_owned(), Answer::Addrs(vec![loopback]))]);
    let dns = DnsServer::start(table).await;
    println!(
        "{}",
        serde_json::json!({"event": "ready", "dns": dns.addr, "origin": origin.addr})
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
