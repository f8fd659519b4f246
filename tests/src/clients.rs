//! Clients: raw sockets from a chosen source address, and real client
//! binaries (curl, openssl, python3) run with bounded time.

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A session source address used by the tests.
pub const SESSION_SOURCE: &str = "127.0.0.2";
/// An address that is no session's.
pub const UNKNOWN_SOURCE: &str = "127.0.0.9";

/// Connect to `to` from `source` (port chosen by the kernel).
pub async fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let ip: IpAddr = source.parse().expect("source ip");
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(ip, 0)).expect("bind source");
    socket.connect(to).await.expect("connect")
}

/// Send `bytes` from `source`, then read what comes back until the gateway
/// closes (at most 10 s). Returns the bytes received.
pub async fn send_and_read(source: &str, to: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = connect_from(source, to).await;
    let _ = s.write_all(bytes).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    got
}

/// Run a client binary with a time bound; its output, whatever the exit.
pub fn run_bounded(program: &str, args: &[&str], stdin: Option<&[u8]>, secs: u64) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("-k")
        .arg("2")
        .arg(secs.to_string())
        .arg(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    if let Some(input) = stdin {
        use std::io::Write;
        let mut pipe = child.stdin.take().expect("stdin");
        let _ = pipe.write_all(input);
    }
    child.wait_with_output().expect("wait client")
}
