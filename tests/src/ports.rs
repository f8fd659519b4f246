//! Ports a test names before anything listens on them.
//!
//! A listener whose address its peers must know before it starts (a
//! member's link, a member's control listener, a port where nothing
//! listens) is given a port reserved here, released at once. The port is
//! taken *outside* the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`), which is where every `connect()`
//! takes its source port and every bind to port 0 its port. Inside that
//! range, a peer dialling the port before its owner starts can be handed
//! the very port as its own source and connect to itself (TCP's
//! simultaneous open), which holds the port and makes its owner's bind
//! fail; any other test's connection can take it as well. Outside it,
//! only another explicit bind can, and the bind here checks for that.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// The kernel's ephemeral range, from procfs (Linux's default if unread).
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// The ports outside the ephemeral range and above the well-known ones
/// (1024 and up) that a test may take: both sides of the range.
fn candidates() -> Vec<(u16, u16)> {
    let (lo, hi) = ephemeral_range();
    let mut spans = Vec::new();
    // Leave the registered ports just above 1024 alone: begin at 10000.
    if lo > 10_000 {
        spans.push((10_000, lo - 1));
    }
    if hi < 65_000 {
        spans.push((hi + 1, 65_535));
    }
    spans
}

/// Where this process begins looking: spread by its PID so that test
/// binaries run side by side begin far apart; then each call the next.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A port of 127.0.0.1 free now and outside the ephemeral range. Falls
/// back to the kernel's pick for port 0 only if the machine leaves no
/// room outside the range.
pub fn reserve() -> SocketAddr {
    let spans = candidates();
    let total: u32 = spans.iter().map(|(a, b)| u32::from(b - a) + 1).sum();
    if total > 0 {
        let base = std::process::id().wrapping_mul(2_654_435_761) % total;
        for _ in 0..total.min(4096) {
            let mut i = (base + NEXT.fetch_add(7, Ordering::Relaxed)) % total;
            let port = spans
                .iter()
                .find_map(|&(a, b)| {
                    let len = u32::from(b - a) + 1;
                    if i < len {
                        Some(a + i as u16)
                    } else {
                        i -= len;
                        None
                    }
                })
                .expect("an index inside the spans");
            if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                return l.local_addr().expect("a bound address");
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
}

/// A port of 127.0.0.1 free now for both TCP and UDP, outside the
/// ephemeral range (a DNS listener, which takes both).
pub fn reserve_both() -> SocketAddr {
    for _ in 0..64 {
        let addr = reserve();
        if std::net::UdpSocket::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no port free for both TCP and UDP on 127.0.0.1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_port_is_outside_the_ephemeral_range_and_free() {
        let (lo, hi) = ephemeral_range();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let addr = reserve();
            assert!(addr.port() < lo || addr.port() > hi, "{addr} in {lo}-{hi}");
            assert!(seen.insert(addr.port()), "{addr} given twice");
            TcpListener::bind(addr).expect("the reserved port binds");
        }
    }
}
