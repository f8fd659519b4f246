//! The demo's peers on loopback: a DNS server and a TLS origin with its own
//! test CA. Prints one JSON line with their addresses, then runs until
//! SIGTERM or SIGINT.
//!
//! Usage: demo-peers DIR   (writes DIR/origin-ca.pem)

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use talos_e2e::dns::{Answer, DnsServer};
use talos_e2e::origin::{Origin, TestCa};

#[tokio::main]
async fn main() {
    let Some(dir) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: demo-peers DIR");
        std::process::exit(2);
    };
    let ca = TestCa::new("demo origin CA");
    ca.write_pem(&dir.join("origin-ca.pem"));
    let origin = Origin::start(&ca, &["origin.demo.test"]).await;
    let addr = |a: &str| a.parse::<IpAddr>().expect("address");
    let table = HashMap::from([
        (
            "origin.demo.test".to_owned(),
            Answer::Addrs(vec![addr("127.0.0.1")]),
        ),
        (
            "internal.demo.test".to_owned(),
            Answer::Addrs(vec![addr("10.0.0.1")]),
        ),
        (
            "metadata.demo.test".to_owned(),
            Answer::Addrs(vec![addr("::ffff:169.254.169.254")]),
        ),
    ]);
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
