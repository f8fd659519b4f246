//! The listeners: each taken over from the process this one succeeds
//! (its descriptors handed over on the process socket), or bound as the
//! config says; how each is configured, as a successor checks it; the
//! sessions' DNS pair, UDP and TCP on one port.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};

use super::error::StartError;
use crate::config::Config;
use crate::handover::state::ListenerState;

/// The listeners handed over in `fds` (a successor), or bound as the
/// config says: data, admin, the process socket, and the control
/// listener's descriptor if handed over (bound with the control side).
pub(super) async fn take_or_bind(
    config: &Config,
    fds: &mut HashMap<String, std::os::fd::OwnedFd>,
) -> Result<
    (
        TcpListener,
        TcpListener,
        Option<Arc<UnixListener>>,
        Option<TcpListener>,
    ),
    StartError,
> {
    let data_fd = fds.remove("data").map(std::net::TcpListener::from);
    let admin_fd = fds.remove("admin").map(std::net::TcpListener::from);
    let control_fd = fds
        .remove("control")
        .map(std::net::TcpListener::from)
        .map(from_std)
        .transpose()?;
    let data = listener(data_fd, "data", config.listen.data).await?;
    let admin = listener(admin_fd, "admin", config.listen.admin).await?;
    let process = match (&config.process.socket, fds.remove("process")) {
        (Some(_), Some(fd)) => {
            let l = std::os::unix::net::UnixListener::from(fd);
            l.set_nonblocking(true)
                .map_err(|source| StartError::Socket {
                    path: PathBuf::from("(handed over)"),
                    source,
                })?;
            Some(Arc::new(UnixListener::from_std(l).map_err(|source| {
                StartError::Socket {
                    path: PathBuf::from("(handed over)"),
                    source,
                }
            })?))
        }
        (Some(path), None) => Some(Arc::new(crate::handover::bind(path.get_ref()).map_err(
            |source| StartError::Socket {
                path: path.get_ref().clone(),
                source,
            },
        )?)),
        (None, _) => None,
    };
    Ok((data, admin, process, control_fd))
}

/// How each listener is configured, as a successor checks it.
pub(super) fn configured_listeners(config: &Config) -> Vec<ListenerState> {
    let mut configured = vec![
        ListenerState {
            role: "data".into(),
            configured: config.listen.data.to_string(),
        },
        ListenerState {
            role: "admin".into(),
            configured: config.listen.admin.to_string(),
        },
    ];
    if let Some(c) = &config.control {
        configured.push(ListenerState {
            role: "control".into(),
            configured: c.listen.get_ref().to_string(),
        });
    }
    if let Some(p) = &config.pair {
        configured.push(ListenerState {
            role: "pair".into(),
            configured: p.listen.get_ref().to_string(),
        });
    }
    if config.dns.is_some() {
        for role in ["dns_udp", "dns_tcp"] {
            configured.push(ListenerState {
                role: role.into(),
                configured: config
                    .dns
                    .as_ref()
                    .map(|d| d.listen.get_ref().to_string())
                    .unwrap_or_default(),
            });
        }
    }
    if let Some(s) = &config.process.socket {
        configured.push(ListenerState {
            role: "process".into(),
            configured: s.get_ref().display().to_string(),
        });
    }
    configured
}

/// Take a listener handed over, or bind one.
async fn listener(
    adopted: Option<std::net::TcpListener>,
    which: &'static str,
    addr: SocketAddr,
) -> Result<TcpListener, StartError> {
    match adopted {
        Some(l) => from_std(l),
        None => bind(which, addr).await,
    }
}

/// A listener handed over, made a tokio one.
pub(super) fn from_std(l: std::net::TcpListener) -> Result<TcpListener, StartError> {
    let addr = l
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    l.set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(l))
        .map_err(|source| StartError::Bind {
            which: "handed-over",
            addr,
            source,
        })
}

pub(super) async fn bind(which: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind {
            which,
            addr,
            source,
        })
}

/// The sessions' DNS sockets: UDP and TCP on `[dns] listen`.
#[derive(Debug)]
pub struct DnsSockets {
    pub udp: Arc<tokio::net::UdpSocket>,
    pub tcp: Arc<TcpListener>,
}

impl DnsSockets {
    /// Both sockets, shared (as the upgrader hands them over).
    pub fn both(&self) -> (Arc<tokio::net::UdpSocket>, Arc<TcpListener>) {
        (Arc::clone(&self.udp), Arc::clone(&self.tcp))
    }
}

/// The DNS sockets handed over in `fds` (a successor), or bound as
/// `[dns]` says; none without it.
pub(super) async fn dns_sockets(
    config: &Config,
    fds: &mut HashMap<String, std::os::fd::OwnedFd>,
) -> Result<Option<DnsSockets>, StartError> {
    let Some(dns) = &config.dns else {
        return Ok(None);
    };
    let addr = *dns.listen.get_ref();
    let (udp, tcp) = match (fds.remove("dns_udp"), fds.remove("dns_tcp")) {
        (Some(u), Some(t)) => (std::net::UdpSocket::from(u), from_std(t.into())?),
        (u, t) => {
            let udp = u.map(std::net::UdpSocket::from);
            let tcp = t.map(std::net::TcpListener::from);
            dns_pair(addr, udp, tcp).await?
        }
    };
    let udp = udp
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UdpSocket::from_std(udp))
        .map_err(|source| StartError::Bind {
            which: "dns (UDP)",
            addr,
            source,
        })?;
    Ok(Some(DnsSockets {
        udp: Arc::new(udp),
        tcp: Arc::new(tcp),
    }))
}

/// How many times a port 0 in `[dns] listen` is picked again when the
/// kernel's UDP port is taken on TCP.
const DNS_PORT_PICKS: usize = 64;

/// Bind whichever of the DNS pair was not handed over. The TCP listener
/// goes on the UDP socket's port; with port 0 in the config the kernel
/// picks the UDP port, and that port may already be someone's on TCP, so
/// the pick is made again (bounded) rather than start-up failing on a
/// collision the operator never asked for.
async fn dns_pair(
    addr: SocketAddr,
    udp: Option<std::net::UdpSocket>,
    tcp: Option<std::net::TcpListener>,
) -> Result<(std::net::UdpSocket, TcpListener), StartError> {
    if let Some(t) = tcp {
        // Only the TCP listener handed over: UDP goes on its port.
        let tcp = from_std(t)?;
        let at = tcp.local_addr().unwrap_or(addr);
        return Ok((bind_udp(at)?, tcp));
    }
    let picked_by_kernel = udp.is_none() && addr.port() == 0;
    let udp = match udp {
        Some(u) => u,
        None => bind_udp(addr)?,
    };
    tcp_beside(udp, addr, picked_by_kernel).await
}

/// The DNS listener's UDP socket on `addr`.
fn bind_udp(addr: SocketAddr) -> Result<std::net::UdpSocket, StartError> {
    std::net::UdpSocket::bind(addr).map_err(|source| StartError::Bind {
        which: "dns (UDP)",
        addr,
        source,
    })
}

/// The TCP listener on `udp`'s port; when `repick`, a port taken on TCP
/// has `udp` bound again on `addr` (port 0), at most [`DNS_PORT_PICKS`]
/// times in all.
async fn tcp_beside(
    mut udp: std::net::UdpSocket,
    addr: SocketAddr,
    repick: bool,
) -> Result<(std::net::UdpSocket, TcpListener), StartError> {
    let mut picks = 1;
    loop {
        let tcp_addr = udp.local_addr().unwrap_or(addr);
        match bind("dns (TCP)", tcp_addr).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(StartError::Bind { source, .. })
                if repick
                    && source.kind() == std::io::ErrorKind::AddrInUse
                    && picks < DNS_PORT_PICKS =>
            {
                picks += 1;
                udp = bind_udp(addr)?;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's UDP pick taken on TCP by someone else: a port 0 in
    /// the config picks again, a port the operator named does not.
    #[tokio::test]
    async fn a_dns_port_taken_on_tcp_is_picked_again_only_when_the_kernel_picked_it() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let taken = std::net::TcpListener::bind(any).unwrap();
        let port = taken.local_addr().unwrap().port();
        let at: SocketAddr = SocketAddr::from(([127, 0, 0, 1], port));

        // UDP on the TCP-taken port, as the kernel may pick it.
        let udp = std::net::UdpSocket::bind(at).unwrap();
        let (udp, tcp) = tcp_beside(udp, any, true).await.expect("picked again");
        let u = udp.local_addr().unwrap().port();
        assert_ne!(u, port);
        assert_eq!(tcp.local_addr().unwrap().port(), u);

        let udp = std::net::UdpSocket::bind(at).unwrap();
        match tcp_beside(udp, at, false).await {
            Err(StartError::Bind { which, source, .. }) => {
                assert_eq!(which, "dns (TCP)");
                assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
            }
            other => panic!("a named port must not move: {other:?}"),
        }
        drop(taken);
    }
}
