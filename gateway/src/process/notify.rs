//! The service manager's readiness protocol (`sd_notify`), spoken directly.
//!
//! Under systemd with `Type=notify` (`NotifyAccess=all`, since a successor
//! process started by a handover is not the unit's first process), the
//! gateway says `READY=1` once it accepts connections, `MAINPID=` when a
//! successor takes over, `RELOADING=1` around a reload and `STOPPING=1`
//! when it drains. Without `NOTIFY_SOCKET` in the environment every call
//! does nothing. A failure to notify is logged, never fatal: the gateway
//! serves the same either way.

use std::os::unix::net::UnixDatagram;

/// Send `state` (newline-separated `KEY=VALUE` assignments) to the service
/// manager, if there is one.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&path, state) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket (Linux): systemd gives it as "@name".
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        socket.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}

/// `READY=1` with this process as the main one.
pub fn ready() {
    notify(&format!("READY=1\nMAINPID={}", std::process::id()));
}

/// A reload begins (systemd's `Type=notify-reload` wants the monotonic
/// time with it).
pub fn reloading() {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let usec = (now.tv_sec as u64)
        .saturating_mul(1_000_000)
        .saturating_add(now.tv_nsec as u64 / 1000);
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
}

/// The process drains and stops.
pub fn stopping() {
    notify("STOPPING=1");
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_message_reaches_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let manager = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        super::send(path.as_os_str(), "READY=1\nMAINPID=42").unwrap();
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nMAINPID=42");
    }
}
