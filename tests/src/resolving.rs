//! Clients that find names as a session's programs do: through the C
//! library's resolver (`getaddrinfo`), `/etc/resolv.conf` naming the
//! gateway's DNS answerer and nothing else, no `/etc/hosts` entry for any
//! test name.
//!
//! The C library asks port 53 only, so the answerer listens on port 53 of
//! an address of its own in 127/8 ([`answerer_address`]; binding it needs
//! root, as the test command runs). Each client runs in a mount namespace
//! of its own (`unshare --mount`), where `/etc/resolv.conf`, `/etc/hosts`
//! and `/etc/nsswitch.conf` are files the test wrote: the machine's own
//! are never touched, and no other process sees the test's. The kernel
//! sends the client's queries to a 127/8 address from 127.0.0.1, which is
//! therefore the session's source in these tests.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::clients::run_bounded;

/// The source the kernel gives a client's queries and connections to
/// loopback addresses: the session's source in these tests.
pub const LOOPBACK_SOURCE: &str = "127.0.0.1";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// An address of 127/8, port 53, free now for both UDP and TCP, for one
/// test's answerer (in 127.53.0.0/16, spread by PID).
///
/// # Panics
/// Without root (port 53 cannot be bound), saying so.
pub fn answerer_address() -> SocketAddr {
    assert!(
        is_root(),
        "the session DNS tests bind port 53 and make mount namespaces: run the test command as root (or with sudo)"
    );
    let base = std::process::id().wrapping_mul(40_503);
    for _ in 0..1024 {
        let n = base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % 65_000 + 256;
        let ip = Ipv4Addr::new(127, 53, (n >> 8) as u8, (n & 0xFF) as u8);
        let addr = SocketAddr::new(IpAddr::V4(ip), 53);
        if std::net::TcpListener::bind(addr).is_ok() && std::net::UdpSocket::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no address of 127.53.0.0/16 has port 53 free")
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The files a client's mount namespace sees in place of the machine's.
#[derive(Debug, Clone)]
pub struct Resolving {
    resolv_conf: PathBuf,
    hosts: PathBuf,
    nsswitch: PathBuf,
}

impl Resolving {
    /// Files in `dir` naming `nameserver` alone (two tries, 2 s each),
    /// `/etc/hosts` with `localhost` only, names looked up in files then
    /// DNS.
    pub fn new(dir: &Path, nameserver: IpAddr) -> Resolving {
        let r = Resolving {
            resolv_conf: dir.join("resolv.conf"),
            hosts: dir.join("hosts"),
            nsswitch: dir.join("nsswitch.conf"),
        };
        std::fs::write(
            &r.resolv_conf,
            format!("nameserver {nameserver}\noptions attempts:2 timeout:2\n"),
        )
        .expect("resolv.conf");
        std::fs::write(&r.hosts, "127.0.0.1 localhost\n::1 localhost\n").expect("hosts");
        std::fs::write(&r.nsswitch, "hosts: files dns\n").expect("nsswitch.conf");
        r
    }

    /// Run `program` with `args` in a mount namespace where the resolver's
    /// files are these, bounded by `secs`.
    pub fn run(&self, program: &str, args: &[&str], secs: u64) -> Output {
        let script = "mount --bind \"$1\" /etc/resolv.conf && mount --bind \"$2\" /etc/hosts && mount --bind \"$3\" /etc/nsswitch.conf && shift 3 && exec \"$@\"";
        let paths =
            [&self.resolv_conf, &self.hosts, &self.nsswitch].map(|p| p.display().to_string());
        let mut all = vec!["--mount", "--", "sh", "-c", script, "sh"];
        all.extend(paths.iter().map(String::as_str));
        all.push(program);
        all.extend_from_slice(args);
        run_bounded("unshare", &all, None, secs)
    }
}

/// `dig` with `args` (`@server -p port -b source name type …`), bounded;
/// its output.
pub fn dig(args: &[&str]) -> String {
    let mut all = vec!["+tries=2", "+time=3"];
    all.extend_from_slice(args);
    let out = run_bounded("dig", &all, None, 20);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The status `dig`'s output reports (`NOERROR`, `NXDOMAIN`, …), or
/// `none` when no answer came.
pub fn status(dig_output: &str) -> &str {
    dig_output
        .lines()
        .find_map(|l| l.split("status: ").nth(1))
        .and_then(|s| s.split(',').next())
        .unwrap_or("none")
}

/// The addresses in `dig +short`'s output.
pub fn short_addresses(dig_output: &str) -> Vec<IpAddr> {
    dig_output
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}
